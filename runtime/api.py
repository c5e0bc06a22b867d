"""The public API of a runtime, declared once: :class:`~runtime.host.Runtime` (one process) and
:class:`~runtime.cluster.ClusterRuntime` (Ray shards) both implement :class:`RuntimeAPI` (design §1.5).

Both classes derive from it, so mypy checks every signature of theirs against the one here, and these
docstrings are theirs (``help(Runtime.usage)`` shows them). ``tests/test_runtime_api.py`` checks the
signatures at run time too, and the README's method table against this list.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

if TYPE_CHECKING:
    from runtime import events as ev
    from runtime.bus import Subscription
    from runtime.context.estimate import ContextStats
    from runtime.gateway import PoolSnapshot
    from runtime.handles import CompactionResult, Handle, PromptHandle, UsageReport
    from runtime.messages import Message, Usage
    from runtime.observability.metrics import RuntimeMetrics
    from runtime.store.sessions import SessionInfo

__all__ = ["RuntimeAPI", "ToolsArg"]

ToolsArg = Any  # a ToolRegistry, an iterable of functions/Tools, "builtin", or None


class RuntimeAPI(Protocol):
    """What a runtime offers its users. Every method is safe to call from any thread; operations that
    complete later return a handle (``handle.result(timeout)`` or ``await handle``); each blocking query has
    an ``a``-prefixed twin for asyncio that runs it off the event loop."""

    def start(self) -> Self:
        """Start the shared machinery. Idempotent; returns ``self``."""
        ...

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every session (agents first, stores last), flush the logs, stop the machinery."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued for the disk so far is written: every session started before is
        durable (its header is in the sessions index, fsynced unless ``persistence.fsync = "never"``), and
        so is every acknowledged entry and event line."""
        ...

    def __enter__(self) -> Self: ...

    def capacity(self) -> list[PoolSnapshot]:
        """The capacity pools of the runtime's provider keys (design §3.11): each one's limits in force
        (configured or learned), the calls waiting and running, 429s, admissions; one
        :class:`~runtime.gateway.PoolSnapshot` a pool, in the order they were first used. On a cluster, every
        shard's pools, each naming its shard: a pool's limits there are the shard's lease (design §10.5)."""
        ...

    def metrics(self) -> RuntimeMetrics:
        """The runtime's Prometheus metrics (a :class:`~runtime.observability.metrics.RuntimeMetrics`): a
        collector with its own ``registry``, counting from the first call (``agentcell serve`` makes it at
        start). Needs the ``prometheus-client`` package."""
        ...

    def __exit__(self, *exc: object) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    @property
    def running(self) -> bool: ...

    def start_session(
        self,
        session_id: str | None = None,
        *,
        model: str | None = None,
        system_prompt: str = "",
        tools: ToolsArg = None,
        workspace: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        approval: Callable[[str, Any], bool | str] | None = None,
        require_approval: bool = False,
        agents: Mapping[str, Any] | None = None,
        mcp_servers: Any = None,
    ) -> str:
        """Create a session and return its id.

        ``config`` holds per-session overrides (``{"compaction.mode": "truncate"}``). ``tools`` is a
        ``ToolRegistry``, functions, ``"builtin"`` (the file tools; shell only when
        ``agent.shell_enabled``), or None for no tools. ``api_key`` is kept in memory only. ``agents``
        adds sub-agent profiles to the runtime's (name → :class:`~runtime.config.AgentProfile` or a
        mapping of its fields): the session gets the ``agent`` delegation tool. ``mcp_servers`` adds MCP
        servers to the runtime's ``[mcp.servers]`` (design §3.9): name → :class:`~runtime.config.McpServerConfig`
        or a mapping of its fields, or command lines / URLs as ``agentcell chat --mcp`` takes them; their
        tools reach the model as ``NAME__tool``. They are kept in the session's log (values that look like
        secrets withheld) and come back with :meth:`resume_session`.
        """
        ...

    async def astart_session(self, session_id: str | None = None, **kwargs: Any) -> str:
        """:meth:`start_session` from asyncio (the same arguments), run off the event loop."""
        ...

    def resume_session(
        self,
        session_id: str,
        *,
        tools: ToolsArg = None,
        workspace: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        api_base: str | None = None,
        approval: Callable[[str, Any], bool | str] | None = None,
        require_approval: bool = False,
        repair: Literal["truncate"] | None = None,
        mcp_servers: Any = None,
    ) -> str:
        """Continue a stored session: its actors rebuild the tree from the log.

        A log with a line that is not a valid entry (not a torn last line, which is always repaired) raises
        :class:`~runtime.store.log.CorruptLogError` naming the file and the line, and nothing is hosted.
        ``repair="truncate"`` opens such a session up to its last good entry instead: the log is cut before
        the bad line, everything from it on is kept in ``<id>.artifacts/log-cut-<time>.jsonl``, and a
        ``log_recovered`` event says where. The session's own MCP servers come back from its log;
        ``mcp_servers`` adds or replaces some (e.g. to give again a value the log withheld as a secret).

        A turn the process stopped in is taken up from its log and finishes (design §3.12), unless the
        config's ``agent.resume_turns`` is off (then the log records it as interrupted):
        :meth:`resumed_turn` hands out its handle.
        """
        ...

    def resumed_turn(self, session_id: str, timeout: float = 30.0) -> PromptHandle | None:
        """The turn :meth:`resume_session` took up from the log (design §3.12): a handle that resolves with
        the turn's real result, its id the prompt id the turn was sent with; None when no turn was cut off
        (or ``agent.resume_turns`` is off). Waits up to ``timeout`` for the session to have read its log
        (``TimeoutError`` past it)."""
        ...

    def interrupted_sessions(self) -> list[str]:
        """Ids of the stored sessions whose newest turn a runtime cut off when it stopped without ending it
        (kill -9, a crash, a lost machine) and that no running runtime hosts, sorted: :meth:`resume_session`
        takes each one's turn up (design §3.12; ``agentcell serve`` does so as it starts). Read from the
        journals of open turns the runtimes sharing the sessions directory keep (``<sessions>/turns/``),
        not from the logs: a million idle sessions cost nothing. A journal of a runtime that is gone becomes
        this runtime's, so a session stays listed here until it is resumed, its turn ends, or another
        running runtime holds it."""
        ...

    async def aresume_session(self, session_id: str, **kwargs: Any) -> str:
        """:meth:`resume_session` from asyncio (the same arguments), run off the event loop."""
        ...

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session (running or not), newest first."""
        ...

    async def alist_sessions(self) -> list[SessionInfo]:
        """:meth:`list_sessions` from asyncio: the directory is read off the event loop."""
        ...

    def hosted_sessions(self) -> list[str]:
        """Ids of the sessions this runtime currently hosts."""
        ...

    def stop_session(self, session_id: str) -> None:
        """Stop a hosted session (its log stays): its sub-agents hosted here are stopped first."""
        ...

    async def astop_session(self, session_id: str) -> None:
        """:meth:`stop_session` from asyncio: waits for the actors to stop off the event loop."""
        ...

    def delete_session(self, session_id: str) -> None:
        """Stop the session if hosted and delete its log, transcript and artifacts, and those of its
        sub-agents (they exist to serve it; their answers stay in its record until then)."""
        ...

    async def adelete_session(self, session_id: str) -> None:
        """:meth:`delete_session` from asyncio, run off the event loop."""
        ...

    def hibernate(self, session_id: str) -> bool:
        """Park an idle session's actors (design §8); its next use restarts them from the log. Its idle
        sub-agents are parked with it.

        Returns False when the session was not running or is busy with a turn."""
        ...

    async def ahibernate(self, session_id: str) -> bool:
        """:meth:`hibernate` from asyncio, run off the event loop."""
        ...

    def children(self, session_id: str) -> list[str]:
        """The sub-agent sessions ``session_id`` delegated to (started or resumed in this runtime, or
        found in the logs), oldest first."""
        ...

    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        images: Sequence[str] = (),
        steer: bool = False,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        """Send a user message. Returns at once; the handle resolves when the run ends.

        While the session is busy the prompt is queued (``message_queued``) and runs next. With ``steer``
        it joins the running turn instead, at its next step boundary (after the running tools' results),
        and its handle resolves with that turn; when the turn ends first, it runs next like a queued one.
        ``prompt_id`` is the handle's id (default: a new one; a cluster front passes the id of its own
        handle, so that both and the session's events agree).
        """
        ...

    def send(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        options: Any = None,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        """Run a turn on ``messages``, recorded in order: what a client that keeps its own side of the
        conversation sends (the Responses API front door). The last is a user message, or a tool result.

        ``messages`` may hold history (user and assistant messages, tool calls and their results) and the
        results of the client tool calls the previous run stopped for (``tool`` messages answering the calls
        of :attr:`TurnResult.awaiting`). ``options`` is an :class:`actors.protocol.TurnOptions`: client-side
        tools, this run's instructions, compaction on or off. Queued like :meth:`prompt` while busy.
        """
        ...

    def abort(self, session_id: str) -> Handle[bool]:
        """Stop the running turn, repair unanswered tool calls, emit ``agent_abort``. Resolves to whether
        a turn was running."""
        ...

    def compact(
        self, session_id: str, keep_recent_tokens: int | None = None, instructions: str | None = None
    ) -> Handle[CompactionResult]:
        """Compact now (design §5.12). A manual compaction is always allowed, even after a failed one."""
        ...

    def approve(
        self, session_id: str, call_id: str, approved: bool = True, reason: str | None = None
    ) -> bool:
        """Answer an ``approval_request`` event. Returns False when no such request is waiting."""
        ...

    def context_stats(self, session_id: str, timeout: float = 30.0) -> ContextStats:
        """The context breakdown of design §4.6 (the same estimate the compaction trigger uses)."""
        ...

    async def acontext_stats(self, session_id: str) -> ContextStats:
        """:meth:`context_stats` from asyncio, run off the event loop."""
        ...

    def messages(
        self,
        session_id: str,
        *,
        view: str = "user",
        offset: int = 0,
        limit: int | None = None,
        timeout: float = 30.0,
    ) -> list[Message]:
        """The conversation: ``"user"`` (everything on the path, nothing hidden) or ``"model"``.

        Paged from the newest: ``offset`` newest messages skipped, at most ``limit`` taken before them
        (all without a limit), in conversation order; ``messages(sid, limit=50)`` is the last 50. The
        user's view of old history is read back from the log (design §2.2): see the README for the cost.
        """
        ...

    def message_count(self, session_id: str, *, view: str = "user", timeout: float = 30.0) -> int:
        """How many messages :meth:`messages` returns without paging (nothing is read from the log)."""
        ...

    async def amessages(
        self, session_id: str, *, view: str = "user", offset: int = 0, limit: int | None = None
    ) -> list[Message]:
        """:meth:`messages` from asyncio, run off the event loop."""
        ...

    def usage(
        self, session_id: str, timeout: float = 30.0, *, include_children: bool = False
    ) -> Usage | UsageReport:
        """Session totals (input, output, reasoning, cache read/write, cost). With ``include_children``,
        a :class:`~runtime.handles.UsageReport`: the session's own, each sub-agent's (theirs rolled up),
        and the total."""
        ...

    async def ausage(self, session_id: str) -> Usage | UsageReport:
        """:meth:`usage` from asyncio, run off the event loop."""
        ...

    def set_model(self, session_id: str, model: str, timeout: float = 30.0) -> int:
        """Switch the session's model; returns the new context window. A smaller window compacts on the
        next turn if the context no longer fits."""
        ...

    async def aset_model(self, session_id: str, model: str) -> int:
        """:meth:`set_model` from asyncio (the new model's tokenizer loads off the event loop)."""
        ...

    def branch(self, session_id: str, leaf_id: str | None, timeout: float = 30.0) -> None:
        """Move the session's leaf to ``leaf_id`` (any message id of the session; None = the start)."""
        ...

    async def abranch(self, session_id: str, leaf_id: str | None) -> None:
        """:meth:`branch` from asyncio: waits for the branch to be logged off the event loop."""
        ...

    def subscribe(
        self,
        sessions: str | Iterable[str] = "*",
        types: Iterable[str] | None = None,
        *,
        callback: Callable[[ev.Event], Any] | None = None,
        queue_size: int | None = None,
        include_children: bool = False,
        bulk: bool = True,
    ) -> Subscription:
        """Subscribe to one session, several, or all (``"*"``), optionally to some event types.

        With ``callback`` events are pushed to it; otherwise iterate the subscription (``for`` or
        ``async for``). Close it (or use ``with``) when done. ``include_children`` adds the events of
        the sessions' sub-agents (and theirs), each with ``parent_session_id`` and ``parent_call_id``.

        ``bulk=False`` (all sessions only): no ``session_stopped`` for each hosted session when the runtime
        stops; the subscription's end says it stopped. A session stopped on its own still says so. For a
        subscriber that keeps state for the few sessions in a turn: with it, a million idle sessions stop
        without a million events.
        """
        ...
