"""Sub-agents (design §3.10): a session delegates a task to a child session started from a named profile.

A session that has profiles gets one more tool, ``agent(profile, task)``. Calling it starts a **child
session** from the profile (its own log, window, usage, compaction and overflow recovery), sends it the task
as a prompt, waits for its turn to end, and returns the child's final answer as the tool result, so the
parent's context grows by the answer, not by the child's work. The call runs on a tool worker like any
tool: several delegations in one step run in parallel, approval and output limits apply, and aborting the
parent's turn aborts the child's (the tool's cancellation reaches it).

The link is kept everywhere a user looks: the child's log header names its parent and the delegating call,
its events carry ``parent_session_id`` and ``parent_call_id``, ``subscribe(parent, include_children=True)``
delivers them, the tool result records ``child_session_id`` and the child's usage, and ``list_sessions()``
shows the tree. Limits (``[subagents]``): depth; children running at once per session and per runtime;
children one turn may start and one session may start in all (counted in this process: started here, or
resumed with their parent); a time limit for one delegation. A limit reached is an error result to the
model naming the limit, never a crash. The child's input
tokens count against the parent turn's spend guard.

A delegation survives its process (design §3.12): the tool is idempotent in the sense that matters, so a
parent's turn taken up after a crash runs the cut-off call again, and running it again finds the child the
call started (the stored session whose header names the parent and the call) instead of starting another:
it resumes the child, whose agent takes its own cut-off turn up, and waits for that turn; a child whose turn
had ended gives its final answer from its log; one that never got its task gets it now.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from runtime.config import AgentProfile, Config, ConfigError
from runtime.errors import AlreadyRegistered
from runtime.handles import PromptHandle, TurnResult
from runtime.handles import UsageReport as UsageReport  # (the report usage() gives; its home before)
from runtime.tools.registry import Tool, ToolContext, ToolError, ToolRegistry

if TYPE_CHECKING:
    from actors.session import Session
    from actors.wiring import Services
    from runtime.api import RuntimeAPI
    from runtime.bus import EventBus

    class _Runtime(RuntimeAPI, Protocol):
        """What the delegations use of the :class:`~runtime.host.Runtime` that owns them."""

        @property
        def config(self) -> Config: ...

        @property
        def bus(self) -> EventBus: ...

        def _session(self, session_id: str) -> Session: ...

        @property
        def services(self) -> Services: ...

        def start_session(self, *args: Any, **kwargs: Any) -> str: ...  # (and its private _parent=)


__all__ = ["DELEGATION_TOOL", "AgentProfile", "Delegations", "UsageReport", "parse_profiles"]

DELEGATION_TOOL: Final = "agent"
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_POLL: Final = 0.05  # seconds between looks at a delegation's cancellation while its child works


def parse_profiles(raw: Mapping[str, AgentProfile | Mapping[str, Any]] | None) -> dict[str, AgentProfile]:
    """Profiles by name, from :class:`AgentProfile` objects or plain mappings; a clear error for a bad one."""
    profiles: dict[str, AgentProfile] = {}
    for name, value in (raw or {}).items():
        if not isinstance(name, str) or not _PROFILE_NAME.match(name):
            raise ConfigError(f"agents: invalid profile name {name!r} (use 1-64 letters, digits, '_' or '-')")
        try:
            profile = value if isinstance(value, AgentProfile) else msgspec.convert(value, AgentProfile)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"agents.{name}: {exc}") from None
        profiles[name] = profile
    return profiles


def _description(profiles: Mapping[str, AgentProfile]) -> str:
    lines = [
        "Delegate a self-contained task to a sub-agent: it works in its own context (reading, searching, "
        "running tools as its profile allows) and returns only its final answer. Give it everything it "
        "needs in `task`: it does not see this conversation. Several calls in one step run in parallel.",
        "Profiles:",
    ]
    lines += [f"- {name}: {profile.description}" for name, profile in sorted(profiles.items())]
    return "\n".join(lines)


class Delegations:
    """The runtime's book of delegations: which children each session has, how many run, and the limits."""

    def __init__(self, runtime: _Runtime) -> None:
        self._rt = runtime
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}  # parent -> children running now
        self._total = 0
        self._children: dict[str, list[str]] = {}  # parent -> children started or resumed in this process
        self._started: dict[str, int] = {}  # parent -> delegations it started in this process
        self._turns: dict[str, tuple[str, int]] = {}  # parent -> its latest delegating turn, and its count
        self._calls: dict[str, str | None] = {}  # child -> the call that started it (as far as read)

    # -- equipping a session ------------------------------------------------------------------------
    def tool(self, parent_id: str, profiles: Mapping[str, AgentProfile], depth: int, config: Config) -> Tool:
        """The delegation tool of session ``parent_id`` (at ``depth``: 0 for a top-level session)."""
        names = sorted(profiles)
        parameters = {
            "type": "object",
            "properties": {
                "profile": {"type": "string", "enum": names, "description": "Which sub-agent to use."},
                "task": {
                    "type": "string",
                    "description": "The task, complete and self-contained: the sub-agent sees nothing else.",
                },
            },
            "required": ["profile", "task"],
            "additionalProperties": False,
        }

        def delegate(profile: str, task: str, ctx: ToolContext) -> str:
            return self.run(parent_id, dict(profiles), depth, profile, task, ctx)

        return Tool(
            name=DELEGATION_TOOL,
            description=_description(profiles),
            parameters=parameters,
            fn=delegate,
            timeout=config.subagents.timeout,
            context_param="ctx",
            idempotent=True,  # run again, a call goes on with the child it started (see the module docstring)
        )

    def equip(
        self,
        registry: ToolRegistry,
        parent_id: str,
        profiles: Mapping[str, AgentProfile],
        depth: int,
        config: Config,
    ) -> ToolRegistry:
        """``registry`` plus the delegation tool, when the session has profiles and may still delegate."""
        if not profiles or depth >= config.subagents.max_depth:
            return registry
        equipped = ToolRegistry([t for t in registry.tools() if t.name != DELEGATION_TOOL])
        equipped.register(self.tool(parent_id, profiles, depth, config))
        return equipped

    # -- running one delegation -----------------------------------------------------------------------
    def run(
        self,
        parent_id: str,
        profiles: dict[str, AgentProfile],
        depth: int,
        name: str,
        task: str,
        ctx: ToolContext,
    ) -> str:
        profile = profiles.get(name)
        if profile is None:
            raise ToolError(f"no sub-agent profile {name!r}; the profiles are: {', '.join(sorted(profiles))}")
        if not task.strip():
            raise ToolError("the task is empty: say what the sub-agent should do")
        result: TurnResult | None = None
        child = self._child_of(parent_id, ctx.call_id)  # the call run again after a crash: its child
        if child is not None:
            self._reserve(parent_id, ctx.turn_id, again=True)
            try:
                result = self._go_on(child, name, profile, task, ctx)
            finally:
                self._release(parent_id)
        if result is None:  # (a new delegation)
            self._reserve(parent_id, ctx.turn_id)
            try:
                child = self._start_child(parent_id, profiles, depth, name, profile, ctx.call_id)
                ctx.metadata["child_session_id"] = child
                ctx.metadata["profile"] = name
                result = self._await(child, self._rt.prompt(child, task), ctx)
            finally:
                self._release(parent_id)
        usage = result.usage
        ctx.metadata["child_usage"] = {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": usage.cost,
        }
        if result.status != "ok":
            why = result.error or result.status
            raise ToolError(f"the sub-agent {name!r} (session {child}) did not finish its task: {why}")
        return result.text or "(the sub-agent finished without a text answer)"

    def _reserve(self, parent_id: str, turn_id: str, *, again: bool = False) -> None:
        """Count a delegation of ``parent_id`` as running, or raise the limit it would pass (``again``: a
        child started before, gone on with: only the children running at once count)."""
        limits = self._rt.config.subagents
        with self._lock:
            if again:
                self._running[parent_id] = self._running.get(parent_id, 0) + 1
                self._total += 1
                return
            turn, in_turn = self._turns.get(parent_id, ("", 0))
            if turn != turn_id:
                in_turn = 0
            started = max(self._started.get(parent_id, 0), len(self._children.get(parent_id, ())))
            if started >= limits.max_total_children_per_session:
                raise ToolError(
                    f"limit reached: this session has started {started} sub-agents "
                    f"(subagents.max_total_children_per_session = {limits.max_total_children_per_session}); "
                    "do the task yourself"
                )
            if in_turn >= limits.max_children_per_turn:
                raise ToolError(
                    f"limit reached: this turn has started {in_turn} sub-agents "
                    f"(subagents.max_children_per_turn = {limits.max_children_per_turn}); "
                    "use their answers, or do the rest of the task yourself"
                )
            running = self._running.get(parent_id, 0)
            if running >= limits.max_children_per_session:
                raise ToolError(
                    f"limit reached: this session already has {running} sub-agents running "
                    f"(subagents.max_children_per_session = {limits.max_children_per_session}); "
                    "wait for their answers, or do the task yourself"
                )
            if self._total >= limits.max_children:
                raise ToolError(
                    f"limit reached: {self._total} sub-agents are running in this runtime "
                    f"(subagents.max_children = {limits.max_children}); try again later"
                )
            self._running[parent_id] = running + 1
            self._total += 1
            self._started[parent_id] = started + 1
            self._turns[parent_id] = (turn_id, in_turn + 1)

    def _release(self, parent_id: str) -> None:
        with self._lock:
            left = self._running.get(parent_id, 1) - 1
            if left:
                self._running[parent_id] = left
            else:
                self._running.pop(parent_id, None)
            self._total -= 1

    def _start_child(
        self,
        parent_id: str,
        profiles: dict[str, AgentProfile],
        depth: int,
        name: str,
        profile: AgentProfile,
        call_id: str,
    ) -> str:
        rt = self._rt
        parent = rt._session(parent_id).spec
        config = {**parent.overrides, **profile.config}
        child = rt.start_session(
            model=profile.model or parent.model,
            system_prompt=profile.system_prompt,
            tools=self._child_tools(parent_id, name, profile),
            workspace=parent.workspace,
            config=config,
            api_base=parent.api_base,
            api_key=parent.api_key,
            approval=parent.approval,
            require_approval=parent.require_approval,
            agents=profiles if profile.delegate else {},
            _parent=(parent_id, call_id, depth + 1),
        )
        with self._lock:
            self._calls[child] = call_id
        return child

    def _child_tools(self, parent_id: str, name: str, profile: AgentProfile) -> Any:
        """The tools a child of ``parent_id`` gets from ``profile`` (``name``)."""
        parent = self._rt._session(parent_id).spec
        tools: Any
        if profile.tools == "inherit":
            tools = ToolRegistry([t for t in parent.tools.tools() if t.name != DELEGATION_TOOL])
        elif profile.tools == "none":
            tools = None
        elif profile.tools == "builtin":
            tools = "builtin"
        else:
            missing = [t for t in profile.tools if parent.tools.get(t) is None]
            if missing:
                raise ToolError(f"the profile {name!r} names tools this session does not have: {missing}")
            tools = ToolRegistry([parent.tools[t] for t in profile.tools])
        return tools

    def _child_of(self, parent_id: str, call_id: str) -> str | None:
        """The stored child session the call ``call_id`` of ``parent_id`` started, or None: from the index
        and the children's headers, each read once in a process (a child started here is known)."""
        for child in self._rt.children(parent_id):
            with self._lock:
                known = child in self._calls
                of = self._calls.get(child)
            if not known:
                header = self._rt.services.directory.read_header(child)
                of = header.parent_call_id if header is not None else None
                with self._lock:
                    self._calls[child] = of
            if of == call_id:
                return child
        return None

    def _go_on(
        self, child: str, name: str, profile: AgentProfile, task: str, ctx: ToolContext
    ) -> TurnResult | None:
        """The result of a delegation whose child was started before its process stopped: the child's
        turn taken up (resumed here with the parent's endpoint and tools, unless hosted already), its final
        answer when its turn had ended, or its turn now when it never got the task. None when ``child`` was
        given another task (a call id used again): it is not this call's."""
        rt = self._rt
        parent = rt._session(ctx.session_id).spec
        try:
            rt.resume_session(  # (a no-op when it is hosted already)
                child,
                tools=self._child_tools(ctx.session_id, name, profile),
                workspace=parent.workspace,
                api_base=parent.api_base,
                api_key=parent.api_key,
                approval=parent.approval,
                require_approval=parent.require_approval,
            )
        except AlreadyRegistered:  # resumed meanwhile by another (a server taking its turns up)
            pass
        first = rt.messages(child)[:1]  # (all of them: its taken-up turn may be appending meanwhile)
        if first and (first[0].role != "user" or first[0].text != task):
            return None
        ctx.metadata["child_session_id"] = child
        ctx.metadata["profile"] = name
        if not first:  # it never got the task
            return self._await(child, rt.prompt(child, task), ctx)
        handle = rt.resumed_turn(child)
        if handle is not None:
            return self._await(child, handle, ctx)
        newest = rt.messages(child, view="model", limit=1)
        last = newest[-1] if newest else None
        if last is not None and last.role == "assistant" and not last.tool_calls:  # its turn had ended
            ok = last.stop_reason != "error" and last.kind is None
            return TurnResult(
                prompt_id=child, status="ok" if ok else "error", message=last, error=None if ok else last.text
            )
        return self._await(child, rt.prompt(child, task), ctx)  # (its turn was ended without an answer)

    def _await(self, child: str, handle: PromptHandle, ctx: ToolContext) -> TurnResult:
        """Wait for ``child``'s turn (``handle``); a cancelled delegation aborts it."""
        rt = self._rt
        while True:
            try:
                return handle.result(timeout=_POLL)
            except TimeoutError:
                if ctx.cancelled.is_set():  # the parent's turn was aborted, or this call timed out
                    rt.abort(child)
                    return handle.result(timeout=60)

    # -- the tree -------------------------------------------------------------------------------------
    def adopt(self, child: str, parent: str, call_id: str) -> None:
        """Record ``child`` as a sub-agent of ``parent`` (started, or resumed, in this process)."""
        with self._lock:
            children = self._children.setdefault(parent, [])
            if child not in children:
                children.append(child)
        self._rt.bus.link_child(child, parent, call_id)

    def children(self, parent: str) -> list[str]:
        """The sub-agent sessions of ``parent`` known in this process, oldest first."""
        with self._lock:
            return list(self._children.get(parent, ()))

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._calls.pop(session_id, None)
            self._children.pop(session_id, None)
            self._started.pop(session_id, None)
            self._turns.pop(session_id, None)
            for children in self._children.values():
                if session_id in children:
                    children.remove(session_id)
