"""The agent actor: one session's turn loop as an explicit state machine (design §3).

    idle ──Prompt──▶ running ──request──▶ streaming ──tool calls──▶ executing_tools ──results──▶ running
      ▲                 │                      │                                                  │
      └──── agent_end ◀─┴──── final answer ◀───┘◀──────────────── next request ◀──────────────────┘

Every hop to another actor is an asynchronous call whose answer comes back as a message; provider calls
run on the runtime's I/O loop and tools on its worker pool, and their results come back as messages too.
Each run carries a token, so a late answer from an aborted run is recognised and dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import msgspec
import pykka

from actors import compactor as cp
from actors import protocol as p
from actors._base import CallFailed, Reply, SessionActor, retry_reporter
from actors.protocol import Abort, AgentStatus, GetState, Prompt, SetModel, TurnOptions
from actors.wiring import Services, SessionRefs, SessionSpec
from runtime import events as ev
from runtime.context import working_set as ws
from runtime.context.caching import CacheWatch, min_cacheable_tokens, request_shape
from runtime.context.estimate import answer_cap, effective_limit
from runtime.context.integrity import (
    CLIENT_CALLS_KEY,
    awaiting_client,
    interrupted_turn_note,
    repair_tool_calls,
    request_view,
    unfinished_turn,
)
from runtime.context.recovery import (
    PROMPT_HIDDEN_NOTE,
    compaction_did_not_help,
    prompt_caused_overflow,
)
from runtime.durable import MAX_RESUMES, TurnRecovery, process_name, recover_turn, step_record, turn_prompt
from runtime.errors import RuntimeStateError
from runtime.events import CompactionTrigger
from runtime.handles import Handle, PromptHandle, TurnResult
from runtime.messages import KIND_STEER, Message, ToolCallPart, Usage, new_id
from runtime.tokens import TokenCounter
from runtime.tools.saved import READ_SAVED

if TYPE_CHECKING:
    from runtime.gateway import CallHandle, CompletionResult, Delta, RetryInfo
    from runtime.observability.tracing import Tracing
    from runtime.store.entries import StepKind
    from runtime.tools.executor import ContextFactory, ToolBatchHandle, ToolRunResult
    from runtime.tools.registry import Tool, ToolRegistry

log = logging.getLogger("agentcell.agent")

R = TypeVar("R")

# No tokenizer packs more characters than this into one token of real text: a prompt longer than this
# many characters per token of the window is refused without counting it.
_CHARS_PER_TOKEN_CEILING = 16
_RECORD_TIMEOUT = 30.0  # seconds a tool's worker waits for the tool's start to be in the log (design §3.12)


class AgentState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    STREAMING = "streaming"
    QUEUED = "queued"  # the step's call waits for capacity of its provider key (design §3.11)
    EXECUTING_TOOLS = "executing_tools"


# The legal moves of the state machine (see the module docstring). Any other is a bug: it raises, the
# actor crashes, and its supervisor restarts it from the log.
TRANSITIONS: Final[dict[AgentState, frozenset[AgentState]]] = {
    AgentState.IDLE: frozenset({AgentState.RUNNING}),
    AgentState.RUNNING: frozenset({AgentState.STREAMING, AgentState.EXECUTING_TOOLS, AgentState.IDLE}),
    AgentState.STREAMING: frozenset({AgentState.RUNNING, AgentState.IDLE, AgentState.QUEUED}),
    AgentState.QUEUED: frozenset({AgentState.STREAMING, AgentState.RUNNING, AgentState.IDLE}),
    AgentState.EXECUTING_TOOLS: frozenset({AgentState.RUNNING, AgentState.IDLE}),
}


class IllegalTransition(RuntimeStateError):
    """The agent was asked to move between two states the state machine does not link."""


CLIENT_TOOL_CLASH: Final = "client_tool_clash"
"""The error code of a run whose client tools have the names of the session's own."""


# -- the messages it sends itself (the session's protocol is in actors.protocol) ------------------------


class _ProviderDone(msgspec.Struct, frozen=True):
    run: int
    result: CompletionResult


class _Queued(msgspec.Struct, frozen=True):
    """The run's provider call waits for capacity (``waited`` None) or got it after ``waited`` seconds."""

    run: int
    pool: str
    position: int = 0
    estimated_wait: float = 0.0
    waited: float | None = None


class _ToolsDone(msgspec.Struct, frozen=True):
    run: int
    results: list[ToolRunResult]


class _McpTools(msgspec.Struct, frozen=True):
    run: int
    registry: ToolRegistry | None  # None: unchanged


@dataclass
class _Run:
    """The bookkeeping of one prompt's run (one or more provider calls with tools between them)."""

    token: int
    prompt: Prompt
    turn_id: str = field(default_factory=new_id)
    step: int = 0
    usage: Usage = field(default_factory=Usage)
    overflow_recoveries: int = 0  # emergency compactions of this turn: after an overflow, or to prevent one
    compacted: bool = False  # the turn had its automatic (threshold) compaction: no second one (design §5.13)
    step_results: tuple[Message, ...] = ()  # the newest step's tool results, as the tools returned them
    saved: dict[str, tuple[str, str]] = field(default_factory=dict)  # result id -> full text's path, SHA-256
    reclipped: bool = False  # the newest step's results were clipped again to fit after compaction
    continued: bool = False  # the run was cut off by a crash of the agent and taken up by its successor
    joined: list[Prompt] = field(default_factory=list)  # steering messages applied to this run
    child_input_tokens: int = 0  # what its sub-agents sent, counted against its spend guard (design §3.10)
    synced: bool = False  # the last message was appended with end_turn: the log is made durable already
    awaiting: tuple[ToolCallPart, ...] = ()  # the client tool calls the run stops for (TurnOptions)
    message_id: str | None = None  # the id the current step's answer gets (announced by request_start)
    estimated_tokens: int = 0
    waited: float = 0.0  # seconds its calls waited for capacity (against capacity.queue_timeout)
    queued_pool: str = ""  # the pool its current call waits for
    last_message: Message | None = None
    call: CallHandle | None = None
    tools: ToolBatchHandle | None = None
    after_mcp: Any = None  # what goes on once the session's MCP tools are ready
    started: float = field(default_factory=time.monotonic)
    span: Any = None  # the turn's invoke_agent span, when the runtime traces (design §7.5)

    @property
    def options(self) -> TurnOptions:
        return self.prompt.options or _DEFAULT_OPTIONS


_DEFAULT_OPTIONS: Final = TurnOptions()


@dataclass
class Handover:
    """What a crashed agent leaves its successor (in :attr:`SessionRefs.handover`): the run it was in
    and the prompts queued behind it, so the turn goes on from the log instead of failing."""

    run: _Run | None
    queue: list[Prompt]


class Agent(SessionActor):
    """Drives turns for one session; holds no history of its own (the store does)."""

    def __init__(
        self,
        spec: SessionSpec,
        services: Services,
        refs: SessionRefs,
        counter: TokenCounter,
        context_window: int,
        *,
        model: str,
        recovering: bool = False,
    ) -> None:
        super().__init__(spec.session_id, services.bus.publish)
        self.spec = spec
        self.services = services
        self.refs = refs
        self.counter = counter
        self.estimate = cp.SessionEstimate(spec, counter)
        self.cache_watch = CacheWatch()  # design §4.7: a response that broke the cached prefix
        self.model = model  # the session's current model (its spec holds the one it started with)
        self.context_window = context_window
        self.state = AgentState.IDLE
        self.queue: list[Prompt] = []
        self.steering: list[Prompt] = []  # steering messages for the running turn's next step boundary
        self.run: _Run | None = None
        self._runs = 0
        self._recovering = recovering
        self._busy_with_recovery = recovering
        self._context_tokens = 0
        # A pending reason to compact before the next request (e.g. usage_overflow), across runs.
        self._pending_trigger: CompactionTrigger | None = None
        self._incoming: Prompt | None = None  # the prompt being handled: answered even if handling crashes

    # -- lifecycle --------------------------------------------------------------------------------------
    def on_start(self) -> None:
        if self._recovering:
            self.call(self.refs.store, p.GetContext(), self._recover)
        else:
            self.refs.resumed.set_result(None)  # a new session: no turn to take up

    def _recover(self, view: p.ContextView | CallFailed) -> None:
        handover, self.refs.handover = self.refs.handover, None
        if isinstance(view, CallFailed):
            self.emit(
                ev.ErrorOccurred,
                message=f"agent recovery could not read the session: {view}",
                code="recovery",
            )
            if handover is not None:
                abandon(
                    handover,
                    f"the session could not be read after an agent crash: {view}",
                    self.services.tracing,
                    self.session_id,
                )
            self.refs.resumed.set_result(None)
            self._dequeue()
            return
        self.refs.usage.tell(p.Restore(tuple(view.messages)))
        awaited = awaiting_client(view.messages)  # a run that stopped for the client's tools still waits
        interrupted = unfinished_turn(view.messages, view.turn_ended_at)
        run = handover.run if handover is not None else None
        if run is None and interrupted and not awaited:  # the process stopped mid-turn (design §3.12)
            run = self._taken_up_run(view)
        if run is not None and interrupted:
            self._runs += 1
            run.token, run.call, run.tools, run.continued = self._runs, None, None, True
            self.run = run  # (prompts wait meanwhile: _busy_with_recovery)
            taken_up = handover is None
            if taken_up:  # its caller is gone with the process: the runtime hands its handle out
                tracing = self.services.tracing
                if tracing is not None:
                    run.span = tracing.start_turn(
                        self.session_id, run.turn_id, model=self.model, inputs=run.prompt.inputs
                    )
                self.emit(ev.AgentStart, turn_id=run.turn_id, prompt_id=run.prompt.handle.id)
            self.refs.resumed.set_result(run.prompt.handle if taken_up else None)
            self._with_mcp_tools(run, lambda: self._take_up(run, view, awaited, handover))
            return
        repairs = [r for r in repair_tool_calls(view.messages) if r.tool_call_id not in awaited]
        # A turn cut off and not taken up is said to be so in the log, which ends it.
        notes = [*repairs, interrupted_turn_note()] if interrupted else repairs

        def done(_: object) -> None:
            self.emit(
                ev.AgentRecovered,
                messages=len(view.messages),
                repaired_calls=len(repairs),
                interrupted_turn=interrupted,
                continued=False,
            )
            self.refs.resumed.set_result(None)
            if handover is not None:
                self.queue = [*handover.queue, *self.queue]
            if run is not None:  # it crashed after its answer was recorded: the turn is over
                answer = view.messages[-1] if view.messages else None
                run.prompt.handle.set_result(
                    TurnResult(prompt_id=run.prompt.handle.id, status="ok", message=answer, usage=run.usage)
                )
            self._dequeue()

        if notes:
            self.call(self.refs.store, p.Append(tuple(notes), end_turn=True), done)
        else:
            done(None)

    # -- durable turns: taking up a turn a crash cut off (design §3.12, runtime/durable.py) -------------
    def _taken_up_run(self, view: p.ContextView) -> _Run | None:
        """The run of a turn the process stopped in, to take up from the log; None when it is not to be
        (the host said not to, it was taken up too often already, or the log names no prompt)."""
        recovery = recover_turn(view.messages, view.steps, idempotent=self._idempotent)
        prompt = turn_prompt(view.messages)
        if not self.spec.config.agent.resume_turns or recovery.resumed >= MAX_RESUMES or prompt is None:
            return None
        handle = PromptHandle(recovery.prompt_id or new_id())
        run = _Run(token=0, prompt=Prompt(message=prompt, handle=handle), step=recovery.steps)
        if recovery.turn_id is not None:
            run.turn_id = recovery.turn_id
        return run

    def _take_up(
        self,
        run: _Run,
        view: p.ContextView,
        awaited: frozenset[str],
        handover: Handover | None,
    ) -> None:
        """Go on with ``run`` from the log: the results of calls that may not run again first, then the
        calls to run (again), or the next request."""
        recovery = recover_turn(view.messages, view.steps, idempotent=self._idempotent, awaited=awaited)
        handled = {c.id for c in recovery.rerun} | {m.tool_call_id for m in recovery.unknown}
        repairs = [
            r
            for r in repair_tool_calls(view.messages)
            if r.tool_call_id not in awaited and r.tool_call_id not in handled
        ]
        notes = (*recovery.unknown, *repairs)

        def go_on(_: object) -> None:
            self.emit(
                ev.AgentRecovered,
                messages=len(view.messages),
                repaired_calls=len(notes),
                interrupted_turn=True,
                continued=True,
            )
            if handover is not None:
                self.queue = [*handover.queue, *self.queue]
            self._announce_resume(run, recovery)
            answer = next((m for m in reversed(view.messages) if m.role == "assistant"), None)
            self._continue(run, recovery.rerun, answer)

        if notes:
            self.call(self.refs.store, p.Append(notes), self._guard(run, go_on))
        else:
            go_on(None)

    def _announce_resume(self, run: _Run, recovery: TurnRecovery) -> None:
        """Say that ``run`` is taken up (``turn_resumed``), in the log and to subscribers."""
        self._record(run, "resumed", step=recovery.steps)
        self.emit(
            ev.TurnResumed,
            turn_id=run.turn_id,
            prompt_id=run.prompt.handle.id,
            resume_from=recovery.resume_from,
            step=recovery.steps,
            process=process_name(),
            rerun_calls=len(recovery.rerun),
            unknown_calls=len(recovery.unknown),
        )

    def _idempotent(self, name: str) -> bool:
        tool = self.spec.tools.get(name)
        return tool is not None and tool.idempotent

    def _record(self, run: _Run, kind: StepKind, **fields: str | int) -> None:
        """Record a step of ``run`` in the log before its effect (design §3.12). Told, not waited for:
        a request or a compaction the log does not show is made again, which does no harm."""
        store = self.refs.store_ref
        if store is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                store.tell(p.RecordStep(step_record(run.turn_id, kind, **fields)))

    def _tool_start_recorder(self, run: _Run) -> Callable[[ToolCallPart, Tool], None]:
        """What a tool's worker calls right before the tool: the call's start recorded in the log. A tool
        that is not idempotent runs only once that record is written (a crash after it: the outcome is
        unknown, and the call is not run again); an idempotent one does not wait."""
        refs, turn, step = self.refs, run.turn_id, run.step

        def record(call: ToolCallPart, tool: Tool) -> None:  # on the call's worker thread
            message = p.RecordStep(
                step_record(turn, "tool_started", step=step, call_id=call.id, name=call.name)
            )
            try:
                store = refs.store
                if tool.idempotent:
                    store.tell(message)
                    return
                stored = store.ask(message, block=False).get(timeout=_RECORD_TIMEOUT)
            except Exception as exc:
                raise RuntimeError(f"its start could not be recorded in the session's log ({exc})") from exc
            if stored.error is not None:
                raise RuntimeError(f"its start could not be recorded in the session's log ({stored.error})")

        return record

    def _continue(
        self, run: _Run, rerun: tuple[ToolCallPart, ...] = (), answer: Message | None = None
    ) -> None:
        """Take up a run cut off by a crash: its calls to run (again), or the next step, from the log
        (design §1.2, 3.12)."""
        self._busy_with_recovery = False
        self._enter(AgentState.RUNNING)
        if rerun and answer is not None:
            run.last_message = answer
            self._run_tools(rerun)
            return
        self._before_request(None)

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        # The supervisor restarts us. A run cut off for the first time is handed to the successor, which
        # goes on from the log; otherwise whoever waits on a prompt must not wait forever.
        crash = f"the agent crashed ({exception_type.__name__}: {exception_value}); the session recovers from its log"
        run = self.run
        if run is not None and not run.continued:
            self._cancel_io(run)
            self.refs.handover = Handover(run, [*self.steering, *self.queue])
            self.run, self.queue, self.steering = None, [], []
        if self._incoming is not None:
            self._incoming.handle.set_result(
                TurnResult(prompt_id=self._incoming.handle.id, status="error", error=crash)
            )
        run = self.run
        if run is not None:
            self._cancel_io(run)
            self._record_ended()
            self._end_interrupted(run, "error", crash)
            run.prompt.handle.set_result(
                TurnResult(
                    prompt_id=run.prompt.handle.id,
                    status="error",
                    usage=run.usage,
                    steps=run.step,
                    error=crash,
                )
            )
        for queued in self.queue:
            self.services.bus.publish(
                ev.ErrorOccurred(
                    session_id=self.session_id, message="queued prompt lost to an agent crash; resend it"
                )
            )
            queued.handle.set_exception(RuntimeError("the agent crashed before this queued prompt ran"))

    def on_stop(self) -> None:
        if self.run is not None:
            self._cancel_io(self.run)
            self._record_ended()
            self._end_interrupted(self.run, "aborted", "session stopped")
            self.run.prompt.handle.set_result(
                TurnResult(prompt_id=self.run.prompt.handle.id, status="aborted", error="session stopped")
            )
        for queued in [*self.steering, *self.queue]:
            queued.handle.set_result(
                TurnResult(prompt_id=queued.handle.id, status="aborted", error="session stopped")
            )

    def _record_ended(self) -> None:
        """Its caller is told the turn ended (an error, an abort): the log says so too, so that no resume
        takes it for a turn the process stopped in (design §3.12)."""
        store = self.refs.store_ref
        if store is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                store.tell(p.SyncTurn(ended=True))

    def _end_interrupted(self, run: _Run, status: Literal["aborted", "error"], reason: str) -> None:
        """Close a run cut short by a crash or a stop for subscribers: every agent_start gets its agent_end."""
        self._end_span(run, status, reason, code="agent_crashed" if status == "error" else None)
        try:
            if status == "error":
                self.emit(ev.ErrorOccurred, message=reason, code="agent_crashed", turn_id=run.turn_id)
            self.emit(
                ev.AgentEnd,
                turn_id=run.turn_id,
                status=status,
                usage=run.usage,
                context_window=self.context_window,
                context_tokens=self._context_tokens,
            )
        except Exception:  # the bus may be gone at shutdown; the handle is answered regardless
            log.debug("could not announce the end of run %s", run.turn_id, exc_info=True)

    # -- mailbox ----------------------------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        match message:
            case Reply():
                self.handle_reply(message)
            case Prompt():
                self._incoming = message  # if handling it crashes, on_failure still answers its handle
                self._on_prompt(message)
                self._incoming = None
            case _ProviderDone(run=token) if self._current(token):
                self._on_provider_done(message.result)
            case _ToolsDone(run=token) if self._current(token):
                self._on_tools_done(message.results)
            case _McpTools(run=token, registry=registry):
                self._on_mcp_tools(token, registry)
            case _Queued(run=token) if self._current(token):
                self._on_queued(message)
            case _ProviderDone() | _ToolsDone() | _Queued():
                pass  # a late answer for a run that was aborted
            case p.UsageOverflowed():
                # a silent overflow (design §6.2): compact before the next request, even in a later turn
                self._pending_trigger = "usage_overflow"
            case Abort():
                self._on_abort(message)
            case SetModel(model=model, context_window=window, counter=counter):
                self.model = model
                if window is not None:
                    self.context_window = window
                if counter is not None:
                    self.counter, self.estimate = counter, cp.SessionEstimate(self.spec, counter)
            case GetState():
                return AgentStatus(state=str(self.state), queued=len(self.queue), model=self.model)
            case _:
                raise TypeError(f"agent: unexpected message {type(message).__name__}")
        return None

    def _current(self, token: int) -> bool:
        return self.run is not None and self.run.token == token

    # -- idle → running -------------------------------------------------------------------------------
    def _on_prompt(self, prompt: Prompt) -> None:
        if prompt.steer and self.run is not None:
            self.steering.append(prompt)
            self.emit(ev.MessageQueued, prompt_id=prompt.handle.id, position=len(self.steering), steer=True)
            return
        if self.state is not AgentState.IDLE or self._busy_with_recovery:
            self.queue.append(prompt)
            if self.state is not AgentState.IDLE:  # (while recovering, the prompt just waits a moment)
                self.emit(ev.MessageQueued, prompt_id=prompt.handle.id, position=len(self.queue))
            return
        self._start(prompt)

    def _dequeue(self) -> None:
        self._busy_with_recovery = False
        if self.state is AgentState.IDLE and self.queue:
            self._start(self.queue.pop(0))

    def _start(self, prompt: Prompt) -> None:
        self._runs += 1
        run = self.run = _Run(token=self._runs, prompt=prompt)
        tracing = self.services.tracing
        if tracing is not None:
            run.span = tracing.start_turn(
                self.session_id, run.turn_id, model=self.model, inputs=prompt.inputs
            )
        self.emit(ev.AgentStart, turn_id=run.turn_id, prompt_id=prompt.handle.id)
        self._enter(AgentState.RUNNING)
        clash = sorted(run.options.client_tool_names & set(self.spec.tools.names)) if prompt.options else []
        if clash:  # the model could not tell which one it calls: refused before anything is recorded
            message = f"client tools {clash} have the names of tools this session runs itself; rename them"
            self._finish("error", message, code=CLIENT_TOOL_CLASH)
            return
        begun = (step_record(run.turn_id, "turn", prompt_id=prompt.handle.id),)  # written with the prompt
        inputs = prompt.inputs
        results = tuple(m for m in inputs if m.role == "tool")
        refusal = None if results else self._prompt_refusal(inputs)
        if refusal is not None:
            # Kept on record for the user, hidden from the model, never summarized, never sent (design §5.13).
            hidden = tuple(msgspec.structs.replace(m, agent_visible=False) for m in inputs)
            self.call(
                self.refs.store,
                p.Append(hidden, steps=begun),
                self._guard(run, lambda _: self._finish("error", refusal, code=ws.PROMPT_TOO_LARGE)),
            )
            return
        if results:
            # The results of the client's tool calls: a step's results like any other, clipped to fit the
            # working set, and the thread goes on from them (see TurnOptions).
            run.step_results = results
            clipped = {m.id: m for m in self._clip_results(self._working_set_budget(None))}
            inputs = tuple(clipped.get(m.id, m) for m in inputs)
            self.call(
                self.refs.store,
                p.Append(inputs, steps=begun),
                self._guard(
                    run, lambda stored: self._with_mcp_tools(run, lambda: self._after_tool_results(stored))
                ),
            )
            return
        self.call(
            self.refs.store,
            p.Append(inputs, with_view=True, steps=begun),
            self._guard(
                run,
                lambda stored: self._with_mcp_tools(
                    run, lambda: self._before_request(stored.view if stored.ok else None)
                ),
            ),
        )

    def _with_mcp_tools(self, run: _Run, then: Callable[[], None]) -> None:
        """Before a turn's first request: the session's MCP servers started and their tools listed (design
        §3.9), off this thread (the I/O loop answers with :class:`_McpTools`). A server that fails is an
        event, and the turn goes on without its tools."""
        mcp = self.spec.mcp
        if mcp is None or not mcp.needs_refresh():
            then()
            return
        run.after_mcp = then
        me, token = self.actor_ref, run.token
        mcp.refresh(lambda registry: me.tell(_McpTools(token, registry)))

    def _on_mcp_tools(self, token: int, registry: ToolRegistry | None) -> None:
        if registry is not None:  # (the registry is replaced whole: other threads see the old or the new)
            self.spec.tools = registry
        run = self.run
        if run is not None and run.token == token and run.after_mcp is not None:
            then, run.after_mcp = run.after_mcp, None
            then()

    def _prompt_refusal(self, messages: tuple[Message, ...]) -> str | None:
        """Why a prompt cannot be sent at all, or None. A prompt many times the window is refused on its
        length alone: counting 100 MB of text would hold the dispatcher for seconds."""
        limit = effective_limit(self.context_window, self.spec.config.compaction) or self.context_window
        fixed = self.estimate.fixed_tokens
        chars = sum(len(m.text) for m in messages)
        if chars > _CHARS_PER_TOKEN_CEILING * (limit + 1):
            tokens = chars // 4
        else:
            tokens = sum(self.counter.count_message(m) for m in messages)
        return ws.prompt_too_large(
            prompt_tokens=tokens, fixed_tokens=fixed, window=self.context_window, limit=limit
        )

    def _guard(self, run: _Run, step: Callable[[R], None]) -> Callable[[R | CallFailed], None]:
        """Wrap a continuation so it runs only while ``run`` is current, and store failures end it."""

        def cont(value: R | CallFailed) -> None:
            if self.run is not run:
                return
            if isinstance(value, CallFailed):
                cause = value.__cause__
                if isinstance(cause, OSError):  # the store could not write the log (a full disk, say)
                    self._finish(
                        "error",
                        f"persistence_failed: the session's log could not be written ({cause}); the turn "
                        "ends here, and what was acknowledged before is kept",
                        code="persistence_failed",
                    )
                    return
                self._finish("error", f"session actor unavailable: {value}", code="internal")
                return
            step(value)

        return cont

    # -- running: the rules of the next request, then the provider call ---------------------------------
    def _before_request(self, view: p.ContextView | None = None) -> None:
        """Make the next provider call once the context passes the rules of design §5.13 (:func:`decide_step`).

        ``view`` is the session's context as of the write this follows, when the store (or the compactor)
        handed it over; without one it is read first.
        """
        run = self.run
        assert run is not None
        if view is None:
            self.call(self.refs.store, p.GetContext(), self._guard(run, self._before_request))
            return
        if view.dead is not None:  # no turn runs in a dead session; a manual compaction may revive it
            self.emit(ev.SessionDead, message=view.dead)
            self._finish("error", view.dead, code="session_dead")
            return
        self._decide(view.messages, self.estimate(view).tokens)

    def _decide(self, context: tuple[Message, ...], estimate: int) -> None:
        run = self.run
        assert run is not None
        cfg = self.spec.config
        compaction = cfg.compaction
        if not run.options.compaction and compaction.auto:
            compaction = msgspec.structs.replace(compaction, auto=False)
        decision = ws.decide_step(
            estimate=estimate,
            message_count=len(context),
            window=self.context_window,
            config=compaction,
            pending=self._pending_trigger,
            threshold_used=run.compacted,
            overflow_used=run.overflow_recoveries > 0,
            turn_input_tokens=run.usage.input_tokens + run.child_input_tokens,
            turn_budget=ws.turn_input_budget(cfg.agent.max_turn_input_tokens, self.context_window),
            tool_results_in_view=self._working_set_has_results(context),
            compactable=lambda: ws.compactable_tokens(context, self.counter.count_message),
        )
        if decision.action == "send":
            self._request(context, estimate)
            return
        if decision.action == "fail":
            code, message = decision.code or "error", decision.message or "the request cannot be sent"
            if code == ws.WORKING_SET_TOO_LARGE and self._clip_again(context, estimate):
                return
            if code == ws.CONTEXT_OVERFLOW and self._prompt_caused_overflow(estimate):
                self._fail_hiding_prompt(message, code)
                return
            self._finish("error", message, code=code)
            return
        request: p.MaybeCompact | p.Compact
        if decision.trigger == "overflow":  # the request would overflow: the turn's emergency compaction
            run.overflow_recoveries += 1
            request = p.Compact(trigger="overflow", emergency=True)
        else:
            request = p.MaybeCompact(trigger=decision.trigger or "threshold")
        run.compacted = True  # one automatic compaction before any emergency one, and only one
        self._pending_trigger = None
        self._record(run, "compaction", step=run.step)
        self.call(self.refs.compactor, request, self._guard(run, self._after_compaction))

    def _after_compaction(self, outcome: p.Outcome) -> None:
        if outcome.dead:  # hard_reset could not get under the window: the log marks the session dead
            message = outcome.message or "context limit exceeded"
            self.emit(ev.SessionDead, message=message)
            self._finish("error", message, code="session_dead")
            return
        self._decide(outcome.messages, outcome.estimate)

    def _request(self, context: tuple[Message, ...], estimate: int) -> None:
        run = self.run
        assert run is not None
        repairs, view = request_view(context)
        if repairs:  # every tool call gets exactly one result before the next provider call (design §3.6)
            extra = sum(self.counter.count_message(m) for m in repairs)
            self.call(
                self.refs.store,
                p.Append(tuple(repairs)),
                self._guard(run, lambda _: self._request((*context, *repairs), estimate + extra)),
            )
            return
        from runtime.capacity import Priority
        from runtime.gateway import Admission, CompletionRequest, cache_hints

        spec, cfg = self.spec, self.spec.config
        options = run.options
        system_prompt = spec.system_prompt if options.instructions is None else options.instructions
        messages: list[Message] = []
        if system_prompt:
            from runtime.messages import system

            messages.append(system(system_prompt))
        messages.extend(view)  # each result right after its call, duplicates dropped
        tools = spec.tools.schemas() if len(spec.tools) else []
        if options.client_tools:
            tools = [*tools, *options.client_tools]
        first = run.step == 0 or run.last_message is None
        admission = Admission(
            flow=self.session_id,
            priority=Priority.NEW_TURN if first else Priority.NEXT_STEP,
            weight=cfg.capacity.weight,
            input_tokens=estimate,
            wait_budget=max(0.0, cfg.capacity.queue_timeout - run.waited),
        )
        request = CompletionRequest(
            admission=admission,
            model=self.model,
            messages=messages,
            tools=tools,
            api_base=spec.api_base,
            api_key=spec.api_key,
            max_tokens=options.answer_cap(self._answer_cap(estimate)),
            extra=options.extra(tools=bool(tools)),
            timeout=cfg.retry.request_timeout,
            include_reasoning=cfg.agent.send_reasoning,
            mock_response=cfg.agent.mock_response,
            transport=cfg.gateway.transport,
            cache=cache_hints(
                self.model, messages, tools, self.counter, key=self.session_id, ttl=cfg.gateway.cache_ttl
            )
            if cfg.gateway.prompt_cache
            else None,
        )
        self.cache_watch.sent(request_shape(self.model, system_prompt or "", tools, messages))
        run.step += 1
        self._record(run, "request", step=run.step)
        run.estimated_tokens = estimate
        route = self.services.gateway.route(request)
        run.message_id = new_id()
        self.emit(
            ev.RequestStart,
            turn_id=run.turn_id,
            attempt=run.step,
            model=self.model,
            messages=len(messages),
            estimated_tokens=estimate,
            transport=route.transport,
            message_id=run.message_id,
        )
        self._enter(AgentState.STREAMING)
        me, token, publish, sid, turn = self.actor_ref, run.token, self.publish, self.session_id, run.turn_id
        streamed = [False]  # (the gateway's loop thread runs on_delta and on_retry, one after the other)

        def on_delta(delta: Delta) -> None:
            streamed[0] = True
            if delta.kind == "text":
                publish(ev.TextDelta(session_id=sid, turn_id=turn, delta=delta.text))
            elif delta.kind == "reasoning":
                publish(ev.ReasoningDelta(session_id=sid, turn_id=turn, delta=delta.text))
            else:
                publish(
                    ev.ToolCallDelta(
                        session_id=sid,
                        turn_id=turn,
                        index=delta.index or 0,
                        call_id=delta.call_id,
                        name=delta.name,
                        arguments_delta=delta.text,
                    )
                )

        def on_stall(seconds: float) -> None:
            publish(ev.StreamStalled(session_id=sid, turn_id=turn, seconds=seconds))

        def deliver(result: CompletionResult) -> None:
            me.tell(_ProviderDone(token, result))

        report_retry = retry_reporter(publish, sid, turn)

        def reset_then_report(info: RetryInfo) -> None:
            if streamed[0]:  # what the failed attempt streamed is void: subscribers drop it
                streamed[0] = False
                run.message_id = new_id()  # (read on this actor's thread only after the result, told later)
                publish(
                    ev.StreamReset(
                        session_id=sid, turn_id=turn, attempt=info.attempt, message_id=run.message_id
                    )
                )
            report_retry(info)

        on_result: Callable[[CompletionResult], None] = deliver
        on_retry: Callable[[RetryInfo], None] = reset_then_report
        tracing = self.services.tracing
        if tracing is not None:
            chat = tracing.start_chat(run.span, sid, request, turn_id=turn, provider=route.provider)
            on_result, on_retry = tracing.watch_chat(chat, on_result, on_retry)

        def on_queued(pool: str, position: int, estimated_wait: float) -> None:
            me.tell(_Queued(token, pool, position, estimated_wait))

        def on_admitted(waited: float) -> None:
            me.tell(_Queued(token, "", waited=waited))

        run.call = self.services.gateway.complete(
            request,
            on_result,
            on_delta=on_delta,
            on_retry=on_retry,
            on_stall=on_stall,
            stall_after=cfg.agent.stream_stall_seconds,
            on_queued=on_queued,
            on_admitted=on_admitted,
        )

    def _on_queued(self, queued: _Queued) -> None:
        """The step's call waits for capacity (state ``queued``) or goes now (``streaming`` again)."""
        run = self.run
        assert run is not None
        if queued.waited is None:
            run.queued_pool = queued.pool
            self.emit(
                ev.RequestQueued,
                turn_id=run.turn_id,
                pool=queued.pool,
                position=queued.position,
                estimated_wait=queued.estimated_wait,
            )
            if self.state is AgentState.STREAMING:
                self._enter(AgentState.QUEUED)
            return
        self.emit(ev.RequestAdmitted, turn_id=run.turn_id, pool=run.queued_pool, waited=queued.waited)
        if self.state is AgentState.QUEUED:
            self._enter(AgentState.STREAMING)

    # -- streaming: the provider answered -----------------------------------------------------------------
    def _on_provider_done(self, result: CompletionResult) -> None:
        run = self.run
        assert run is not None
        run.call = None
        run.waited += result.waited
        self._enter(AgentState.RUNNING)
        if result.error is not None:
            if result.error.kind == "cancelled":
                return
            request = p.ClassifyError(
                error=result.error,
                recoveries_this_turn=run.overflow_recoveries,
                estimated_tokens=run.estimated_tokens,
            )
            self.call(self.refs.overflow, request, self._guard(run, self._on_error_verdict))
            return
        message = result.message
        assert message is not None  # a result without an error carries the answer
        if run.message_id is not None:  # the id RequestStart announced (a stream's client names it early)
            message = msgspec.structs.replace(message, id=run.message_id)
        client_names = run.options.client_tool_names if run.options.client_tools else frozenset()
        client_calls = [c.id for c in message.tool_calls if c.name in client_names]
        if client_calls:  # recorded, so that a restart knows these calls wait for the client's results
            message = msgspec.structs.replace(
                message, metadata={**message.metadata, CLIENT_CALLS_KEY: client_calls}
            )
        run.last_message = message
        if message.usage is not None:
            usage = message.usage
            broke = self.cache_watch.answered(
                usage.input_tokens, usage.cache_read_tokens, minimum=min_cacheable_tokens(self.model)
            )
            if broke is not None:
                self.emit(
                    ev.CacheBreak,
                    turn_id=run.turn_id,
                    cause=broke.cause,
                    expected_tokens=broke.expected_tokens,
                    cached_tokens=broke.cached_tokens,
                    model=self.model,
                )
            run.usage = run.usage + message.usage
            self._context_tokens = message.usage.input_tokens + message.usage.output_tokens
        # The usage tracker and the store both answer before the run goes on: the usage_update of this
        # response is published before the turn's end (subscribers see agent_end last), and the append is
        # written. They work meanwhile, each on its own.
        waiting = [2]

        def answered(_: object) -> None:
            waiting[0] -= 1
            if not waiting[0]:
                self._after_response(message)

        self.call(
            self.refs.usage,
            p.RecordResponse(message=message, estimated_input=run.estimated_tokens),
            self._guard(run, answered),
        )
        if message.usage is not None:  # a silent overflow is told back (UsageOverflowed); "no" is not
            self.refs.overflow.tell(
                p.CheckUsage(input_tokens=message.usage.input_tokens, notify=self.actor_ref)
            )
        # A final answer ends the run: its append also makes the log durable (no SyncTurn after it).
        run.synced = not message.tool_calls
        self.call(self.refs.store, p.Append((message,), end_turn=run.synced), self._guard(run, answered))

    def _after_response(self, message: Message) -> None:
        run = self.run
        assert run is not None
        stop = message.stop_reason or ("tool_calls" if message.tool_calls else "stop")
        self.emit(ev.TurnEnd, turn_id=run.turn_id, stop_reason=stop, usage=message.usage or Usage())
        calls = message.tool_calls
        if not calls:
            self._finish("ok")
            return
        if run.step >= self.spec.config.agent.max_steps_per_turn:
            self._finish(
                "error",
                f"the run reached max_steps_per_turn ({run.step}) with tool calls still pending",
                code="max_steps",
                repair=True,
            )
            return
        client_ids = message.metadata.get(CLIENT_CALLS_KEY)
        if client_ids:  # the client runs these: the session's own calls run first, then the run stops
            run.awaiting = tuple(c for c in calls if c.id in client_ids)
            calls = tuple(c for c in calls if c.id not in client_ids)
            if not calls:
                self._finish("ok")
                return
        self._run_tools(calls)

    def _answer_cap(self, estimate: int) -> int | None:
        """The request's ``max_tokens``: the room the window leaves (when the window is known: the model's,
        a configured one, or one learned from the provider), within the output limits (design §4.5)."""
        from runtime.models import model_info

        models = self.spec.config.models
        info = model_info(self.model, models)
        known = info.source != "fallback" or self.context_window != models.fallback_context_window
        return answer_cap(
            window=self.context_window if known else None,
            prompt_tokens=estimate,
            configured=self.spec.config.agent.max_output_tokens,
            model_max=info.max_output_tokens,
        )

    def _learn_window(self, window: int, source: str) -> None:
        """Take the window the provider stated, for this session (its actors, and their restarts) and for
        its endpoint (sessions started later on it), and say so (``window_learned``)."""
        old = self.context_window
        if window == old:
            return
        self.context_window = window
        self.refs.learned_window = window
        update = SetModel(self.model, window)
        for ref in (self.refs.overflow_ref, self.refs.usage_ref, self.refs.compactor_ref):
            if ref is not None:
                ref.tell(update)
        from runtime.gateway import endpoint_of

        self.services.gateway.windows.learn(endpoint_of(self.model, self.spec.api_base), self.model, window)
        self.emit(ev.WindowLearned, old=old, new=window, source=source, model=self.model)

    def _on_error_verdict(self, verdict: p.Verdict) -> None:
        run = self.run
        assert run is not None
        if verdict.learned_window is not None:
            self._learn_window(verdict.learned_window, "overflow")
        if verdict.action == "compact_and_retry" and run.options.compaction:
            run.overflow_recoveries += 1
            self._record(run, "compaction", step=run.step)
            self.call(
                self.refs.compactor,
                p.Compact(trigger="overflow", emergency=True),
                self._guard(run, self._after_emergency_compaction),
            )
            return
        if verdict.overflow and self._prompt_caused_overflow(run.estimated_tokens):
            self._fail_hiding_prompt(verdict.message, verdict.code)
            return
        self._finish("error", verdict.message, code=verdict.code, retryable=verdict.retryable)

    def _after_emergency_compaction(self, outcome: p.Outcome) -> None:
        if outcome.dead or not outcome.compacted:
            failure = compaction_did_not_help(
                context_window=self.context_window, reason=outcome.message or "nothing could be summarized"
            )
            run = self.run
            assert run is not None
            if self._prompt_caused_overflow(max(run.estimated_tokens, outcome.estimate)):
                self._fail_hiding_prompt(failure.message, failure.code)
                return
            self._finish("error", failure.message, code=failure.code)
            return
        run = self.run
        assert run is not None
        run.compacted = True
        self._decide(outcome.messages, outcome.estimate)

    def _prompt_caused_overflow(self, request_tokens: int) -> bool:
        run = self.run
        assert run is not None
        return prompt_caused_overflow(
            prompt_tokens=sum(self.counter.count_message(m) for m in run.prompt.inputs),
            request_tokens=request_tokens,
            answered=run.last_message is not None,
        )

    def _fail_hiding_prompt(self, message: str, code: str) -> None:
        """End the run; hide its prompt from the model (it stays on record) so later turns can fit."""
        run = self.run
        assert run is not None
        hide = p.SetVisibility(message_ids=tuple(m.id for m in run.prompt.inputs), agent_visible=False)
        self.call(
            self.refs.store,
            hide,
            self._guard(run, lambda _: self._finish("error", message + PROMPT_HIDDEN_NOTE, code=code)),
        )

    # -- executing_tools ------------------------------------------------------------------------------
    def _run_tools(self, calls: tuple[ToolCallPart, ...]) -> None:
        run = self.run
        assert run is not None
        self._enter(AgentState.EXECUTING_TOOLS)
        me, token, sid, turn, publish = self.actor_ref, run.token, self.session_id, run.turn_id, self.publish
        spec, services = self.spec, self.services
        cfg = spec.config

        def on_start(call: ToolCallPart) -> None:
            publish(
                ev.ToolExecutionStart(
                    session_id=sid, turn_id=turn, call_id=call.id, name=call.name, arguments=call.arguments
                )
            )

        def on_output(call: ToolCallPart, chunk: str) -> None:
            publish(ev.ToolOutput(session_id=sid, turn_id=turn, call_id=call.id, chunk=chunk))

        def on_done(res: ToolRunResult) -> None:
            publish(
                ev.ToolExecutionEnd(
                    session_id=sid,
                    turn_id=turn,
                    call_id=res.call.id,
                    name=res.call.name,
                    is_error=res.message.is_error,
                    duration=res.duration,
                    output_chars=len(res.message.text),
                    truncated=res.truncated,
                )
            )

        callbacks: tuple[Callable[[ToolCallPart], None], Callable[[ToolRunResult], None]] = (
            on_start,
            on_done,
        )
        if services.tracing is not None:
            callbacks = services.tracing.watch_tools(run.span, sid, turn, on_start, on_done)

        approve = None
        if spec.approval is not None or spec.require_approval:

            def approve(call: ToolCallPart) -> bool | str:
                approved, reason = services.approvals.request(sid, turn, call, spec.approval)
                return True if approved else (reason or "denied by the approval hook")

        run.tools = services.executor.run(
            list(calls),
            spec.tools,
            self._tool_context_factory(turn),
            timeout=cfg.agent.tool_timeout,
            limits=cfg.tool_output,
            spill_dir=services.directory.spill_dir(sid),
            approve=approve,
            on_start=callbacks[0],
            on_output=on_output,
            on_done=callbacks[1],
            on_all_done=lambda results: me.tell(_ToolsDone(token, list(results))),
            before_run=self._tool_start_recorder(run),
        )

    def _tool_context_factory(self, turn_id: str) -> ContextFactory:
        from runtime.tools.executor import context_factory

        return context_factory(
            session_id=self.session_id,
            workspace=self.spec.workspace,
            config=self.spec.config,
            logs_dir=self.services.directory.spill_dir(self.session_id),
            turn_id=turn_id,
            saved_dirs=(
                self.services.directory.spill_dir(self.session_id),
                self.services.directory.artifacts_dir(self.session_id),
            ),
        )

    def _on_tools_done(self, results: list[ToolRunResult]) -> None:
        run = self.run
        assert run is not None
        run.tools = None
        self._enter(AgentState.RUNNING)
        run.step_results, run.reclipped = tuple(r.message for r in results), False
        run.child_input_tokens += sum(_child_input_tokens(m) for m in run.step_results)
        messages = self._clip_results(self._working_set_budget(run.last_message))
        steering: list[Prompt] = []
        if not run.awaiting:  # (a run that stops for the client's tools leaves steering to the next turn)
            steering, self.steering = self.steering, []
        if steering:  # the step boundary: the user's steering joins the turn right after the results
            run.joined.extend(steering)
            messages += tuple(msgspec.structs.replace(p.message, kind=KIND_STEER) for p in steering)
        self.call(self.refs.store, p.Append(messages), self._guard(run, self._after_tool_results))

    # -- the working set: a step's results clipped to fit (design §5.13) --------------------------------
    def _working_set_budget(self, call: Message | None) -> int:
        """The tokens a step's results may take, after the assistant message ``call`` that asked for them."""
        compaction = self.spec.config.compaction
        return ws.working_set_budget(
            limit=effective_limit(self.context_window, compaction) or self.context_window,
            fixed_tokens=self.estimate.fixed_tokens,
            call_tokens=self.counter.count_message(call) if call is not None else 0,
            config=compaction,
        )

    def _clip_results(self, budget: int) -> tuple[Message, ...]:
        """The newest step's results, the largest clipped head and tail (from the tools' own text) so that
        together they take at most ``budget`` tokens. A clipped result's full text is saved beside the
        session (or already is, in its spill file) and named in its notice with its SHA-256."""
        run = self.run
        assert run is not None
        results = run.step_results
        clips = ws.plan_clips([(self.counter.count_message(m), len(m.text)) for m in results], budget)
        fitted = list(results)
        reader = READ_SAVED if READ_SAVED in self.spec.tools else None
        for clip in clips:
            message = results[clip.index]
            path, sha = run.saved.get(message.id) or self._save_full_output(message)
            run.saved[message.id] = (path, sha)
            fitted[clip.index] = ws.clip_result(
                message, clip.max_chars, saved_path=path, sha256=sha, reader=reader
            )
        return tuple(fitted)

    def _clip_again(self, context: tuple[Message, ...], estimate: int) -> bool:
        """Once a step: when the request is still over the limit after compaction (the summary took more
        room than the first clipping left for it), clip the step's results harder and decide again.
        False when that cannot help."""
        run = self.run
        assert run is not None
        ids = {m.id for m in run.step_results}
        if run.reclipped or not ids:
            return False
        run.reclipped = True
        count = self.counter.count_message
        current = {m.id: m for m in context if m.id in ids}
        now = sum(count(m) for m in current.values())
        limit = effective_limit(self.context_window, self.spec.config.compaction) or self.context_window
        margin = 16 + limit // 50
        fitted = [m for m in self._clip_results(now - (estimate - limit) - margin) if m.id in current]
        changed = tuple(m for m in fitted if m.text != current[m.id].text)
        saved = now - sum(count(m) for m in fitted)
        if not changed or saved <= 0:
            return False
        replaced = {m.id: m for m in changed}
        clipped = tuple(replaced.get(m.id, m) for m in context)
        self.call(
            self.refs.store,
            p.Overlay(changed),
            self._guard(run, lambda _: self._decide(clipped, estimate - saved)),
        )
        return True

    @staticmethod
    def _working_set_has_results(context: tuple[Message, ...]) -> bool:
        start = ws.working_set_start(context)
        return start is not None and context[start].role == "assistant"

    def _save_full_output(self, message: Message) -> tuple[str, str]:
        """Queue the full text of a tool result for the writer thread; its path and SHA-256."""
        spilled = message.metadata.get("spill_path"), message.metadata.get("spill_sha256")
        if isinstance(spilled[0], str) and isinstance(spilled[1], str):
            return spilled[0], spilled[1]  # a spilled output's notice: the spill file holds the whole
        data = message.text.encode("utf-8", errors="replace")
        sha = hashlib.sha256(data).hexdigest()
        name = f"{message.name or 'tool'}-{sha[:16]}.txt".replace("/", "_")
        path = self.services.directory.spill_dir(self.session_id) / name
        publish, sid = self.publish, self.session_id

        def written(error: Exception | None) -> None:  # on the writer thread
            if error is not None:
                publish(ev.PersistenceFailed(session_id=sid, path=str(path), error=str(error)))

        self.services.writer.write_file(path, data, written)
        return str(path), sha

    def _after_tool_results(self, _: p.Stored) -> None:
        run = self.run
        assert run is not None
        if run.awaiting:  # the step's own calls are answered; the client's are the client's to answer
            self._finish("ok")
            return
        self.call(self.refs.compactor, p.MaybeArchiveTools(), self._guard(run, self._before_request))

    # -- abort ----------------------------------------------------------------------------------------
    def _on_abort(self, abort: Abort) -> None:
        run = self.run
        if run is None:
            if abort.handle is not None:
                abort.handle.set_result(False)
            return
        self._cancel_io(run)
        self.services.approvals.cancel_session(self.session_id, "the turn was aborted")
        self._finish("aborted", "aborted by the user", code="aborted", repair=True, abort_handle=abort.handle)

    def _cancel_io(self, run: _Run) -> None:
        if run.call is not None:
            run.call.cancel()
            run.call = None
        if run.tools is not None:
            run.tools.cancel()
            run.tools = None

    # -- end of a run ---------------------------------------------------------------------------------
    def _finish(
        self,
        status: str,
        error: str | None = None,
        *,
        code: str = "error",
        retryable: bool = False,
        repair: bool = False,
        abort_handle: Handle[bool] | None = None,
    ) -> None:
        run = self.run
        assert run is not None
        self.run = None  # late answers of this run are dropped from here on
        store = self.refs.store_ref  # None while the store restarts: the run still ends and is answered

        def complete(repaired: int) -> None:
            self._end_span(run, status, error, code=code)
            if status == "aborted":
                self.emit(ev.AgentAbort, turn_id=run.turn_id, repaired_calls=repaired)
            elif status == "error":
                self.emit(
                    ev.ErrorOccurred,
                    message=error or "error",
                    code=code,
                    turn_id=run.turn_id,
                    retryable=retryable,
                )
            if store is not None and not (status == "ok" and run.synced):
                with contextlib.suppress(pykka.ActorDeadError):  # (a run that waits for the client ends
                    store.tell(p.SyncTurn(ended=status != "ok" or bool(run.awaiting)))  # there too)
            self._enter(AgentState.IDLE, run.turn_id)  # the turn's last event is its agent_end
            self.emit(
                ev.AgentEnd,
                turn_id=run.turn_id,
                status=status,
                usage=run.usage,
                context_window=self.context_window,
                context_tokens=self._context_tokens,
            )
            run.prompt.handle.set_result(
                TurnResult(
                    prompt_id=run.prompt.handle.id,
                    status=status,  # type: ignore[arg-type]
                    message=run.last_message,
                    usage=run.usage,
                    steps=run.step,
                    error=error if status != "ok" else None,
                    awaiting=run.awaiting if status == "ok" else (),
                )
            )
            for joined in run.joined:  # steering messages share the turn they joined
                joined.handle.set_result(
                    TurnResult(
                        prompt_id=joined.handle.id,
                        status=status,  # type: ignore[arg-type]
                        message=run.last_message,
                        usage=run.usage,
                        steps=run.step,
                        error=error if status != "ok" else None,
                    )
                )
            if abort_handle is not None:
                abort_handle.set_result(True)
            # steering that found no step boundary (the turn answered, or ended) runs as the next turn
            self.queue[:0], self.steering = self.steering, []
            self._dequeue()

        if not repair or store is None:
            complete(0)
            return

        def with_view(view: p.ContextView | CallFailed) -> None:
            if isinstance(view, CallFailed):
                complete(0)
                return
            repairs = repair_tool_calls(view.messages)
            if repairs:
                self.call(store, p.Append(tuple(repairs)), lambda _: complete(len(repairs)))
            else:
                complete(0)

        self.call(store, p.GetContext(), with_view)

    def _end_span(self, run: _Run, status: str, error: str | None, *, code: str | None) -> None:
        """End the turn's span, if it has one open."""
        span, run.span = run.span, None
        tracing = self.services.tracing
        if span is not None and tracing is not None:
            tracing.end_turn(
                span,
                self.session_id,
                status=status,
                usage=run.usage,
                steps=run.step,
                error=error,
                code=code,
                answer=run.last_message,
            )

    def _enter(self, state: AgentState, turn_id: str | None = None) -> None:
        previous = self.state
        if state is previous:
            return
        if state not in TRANSITIONS[previous]:
            raise IllegalTransition(f"agent: {previous} → {state} is not a transition of the state machine")
        self.state = state
        turn = turn_id or (self.run.turn_id if self.run is not None else None)
        self.emit(ev.StatusUpdate, state=str(state), previous=str(previous), turn_id=turn)


def _child_input_tokens(result: Message) -> int:
    """The input tokens a sub-agent spent on a delegation, as its tool result records them."""
    usage = result.metadata.get("child_usage")
    tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0


def abandon(handover: Handover, reason: str, tracing: Tracing | None = None, session_id: str = "") -> None:
    """Answer every prompt of a handover nobody will take up (the session stopped, or could not recover);
    with ``tracing``, end the span of its run."""
    run = handover.run
    if run is not None and run.span is not None and tracing is not None:
        span, run.span = run.span, None
        tracing.end_turn(
            span,
            session_id,
            status="error",
            usage=run.usage,
            steps=run.step,
            error=reason,
            code="agent_crashed",
        )
    if run is not None:
        run.prompt.handle.set_result(
            TurnResult(
                prompt_id=run.prompt.handle.id, status="error", usage=run.usage, steps=run.step, error=reason
            )
        )
    for queued in handover.queue:
        queued.handle.set_result(TurnResult(prompt_id=queued.handle.id, status="error", error=reason))
