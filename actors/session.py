"""One session: its spec and the supervisor of its five actors (design §1.2).

The supervisor runs ``rest_for_one`` in the order store → usage tracker → overflow detector → compactor →
agent: when an actor crashes, it and every actor started after it are restarted, each recovering its
state from the store. A session starts its actors on first use and can park them again when idle
(hibernation, design §8): a parked session costs one small object, and its state lives in the log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar, cast

import msgspec
from pykka import Actor, ActorDeadError, ActorRef

from actors.agent import Agent, abandon
from actors.compactor import Compactor
from actors.overflow_detector import OverflowDetector
from actors.protocol import (
    Abort,
    AgentStatus,
    Asking,
    Branch,
    Compact,
    GetCalibration,
    GetContext,
    GetContextStats,
    GetMessages,
    GetState,
    GetTotals,
    Prompt,
    SetModel,
)
from actors.session_store import SessionStore
from actors.store_locks import wait_lock_released
from actors.usage_tracker import UsageTracker
from actors.wiring import Services, SessionRefs, SessionSpec
from runtime import events as ev
from runtime.context.estimate import ContextStats, context_stats
from runtime.gateway import endpoint_of
from runtime.store.entries import Header, decode_entry, new_header
from runtime.supervisor import ChildSpec, Supervisor
from runtime.tokens import TokenCounter
from runtime.tools.mcp.servers import stored

CHILD_ORDER = ("store", "usage", "overflow", "compactor", "agent")
"""The children's ids, in start order (``rest_for_one`` restarts a child and those after it)."""

SessionCommand: TypeAlias = Prompt | Abort | Compact | SetModel
"""What :meth:`Session.tell` takes."""
SessionQuery: TypeAlias = (
    GetContext | GetMessages | Branch | GetTotals | GetCalibration | GetState | GetContextStats
)
"""What :meth:`Session.ask` takes."""

A = TypeVar("A", bound=Actor)
R = TypeVar("R")


_LOCKS = tuple(threading.RLock() for _ in range(64))  # shared by sessions: a lock each would cost 1M locks
_NO_REFS = SessionRefs()  # the refs of every session whose actors are not running (never written to)


class ParkedSession(msgspec.Struct, frozen=True, gc=False):
    """A plain session never used yet: its header line (``recipe``) and what its :class:`Session` is made
    from on first use (the runtime swaps one for the other then).

    The cyclic garbage collector never tracks it (``gc=False``: it holds bytes, a flag and a model state
    shared by many sessions, so it is in no reference cycle). A million idle sessions then add nothing to
    the collector's full passes, each of which used to walk a million Session objects (and their ``wake``
    methods), a cost per start that grew with the number of sessions hosted (issue 32).
    """

    recipe: bytes
    state: SetModel  # the model, window and counter it starts with
    builtin_tools: bool = False

    running = False  # (what a Session answers too, for code that reads either)
    fresh = True
    _spec = None

    @property
    def model(self) -> str:
        return self.state.model

    @property
    def context_window(self) -> int:
        window = self.state.context_window
        assert window is not None  # the runtime's model states always carry the window
        return window


class Session:
    """A session's handle inside the runtime: lazily started, supervised, able to hibernate.

    While its actors are not running (hibernated, or never used yet unless it is still a
    :class:`ParkedSession`) a session is this object and its header line (``recipe``): the spec is rebuilt
    from the header by ``wake`` when the session is used, unless it holds what a header cannot (an API key,
    an approval callback, tools of the caller's own, MCP servers): then ``plain`` is False and the spec
    stays in memory.
    """

    __slots__ = (
        "_model",
        "_spec",
        "_starts",
        "_wake",
        "builtin_tools",
        "fresh",
        "last_used",
        "parent",
        "plain",
        "recipe",
        "refs",
        "services",
        "session_id",
        "supervisor",
    )

    def __init__(
        self,
        spec: SessionSpec | None,
        services: Services,
        model: SetModel,
        parent: Supervisor | None = None,
        *,
        recipe: bytes,
        wake: Callable[[Session], SessionSpec] | None = None,
        session_id: str | None = None,
        plain: bool = False,
        builtin_tools: bool = False,
        fresh: bool | None = None,
    ) -> None:
        sid = spec.session_id if spec is not None else session_id
        if (
            sid is None
            or (spec is None and wake is None)
            or model.context_window is None
            or model.counter is None
        ):
            raise ValueError(
                "a session needs its id, a spec or a wake function, and its model's window and counter"
            )
        self._spec = spec if not (plain and wake is not None) else None  # a plain one: rebuilt on first use
        self.session_id: str = sid
        self.services = services
        # The model in use: one immutable value, replaced whole by SetModel, read by every (re)start.
        self._model = model
        self.parent = parent
        self.recipe = recipe
        self._wake = wake
        self.plain = plain and wake is not None
        self.builtin_tools = builtin_tools
        self.refs = _NO_REFS
        self.supervisor: Supervisor | None = None
        self._starts: dict[str, int] | None = None
        self.last_used = 0.0
        # created by this runtime and not yet started: nothing to recover
        self.fresh = (spec is None or not spec.resume) if fresh is None else fresh

    @property
    def _lock(self) -> threading.RLock:
        return _LOCKS[hash(self.session_id) & 63]

    @property
    def spec(self) -> SessionSpec:
        """The session's spec (rebuilt from its header when the session was parked without it)."""
        spec = self._spec
        if spec is None:
            with self._lock:
                spec = self._spec
                if spec is None:
                    assert self._wake is not None
                    spec = self._spec = self._wake(self)
        return spec

    @property
    def mcp(self) -> Any:
        """The session's MCP servers, or None (a session parked without its spec has none)."""
        return self._spec.mcp if self._spec is not None else None

    def header(self) -> Header:
        """The session's header, as started (or as its log or the index holds it, when resumed)."""
        entry = decode_entry(self.recipe)
        assert isinstance(entry, Header)
        return entry

    @property
    def running(self) -> bool:
        return self.supervisor is not None

    @property
    def model(self) -> str:
        """The model the session uses now (:class:`SetModel` switches it; ``spec.model`` is its first)."""
        return self._model.model

    @property
    def context_window(self) -> int:
        """The model's window, or the one its provider stated since (:attr:`SessionRefs.learned_window`)."""
        learned = self.refs.learned_window
        if learned is not None:
            return learned
        window = self._model.context_window
        assert window is not None  # the session's own SetModel always carries the window
        return window

    @property
    def counter(self) -> TokenCounter:
        counter = self._model.counter
        assert counter is not None  # the session's own SetModel always carries the counter
        return counter

    # -- the session's messages -------------------------------------------------------------------------
    def tell(self, message: SessionCommand) -> None:
        """Send ``message`` to the session, which hands it to the actors it is for (starting them if they
        are parked): a prompt or an abort to the agent, a compaction to the compactor, a model switch to
        every actor (the agent, compactor, usage tracker and overflow detector use the new model, the store
        records it) and to those that start later.

        Raises:
            pykka.ActorDeadError: the actor it is for is not running (it is being restarted).
        """
        refs = self.ensure_running()
        match message:
            case Prompt() | Abort():
                refs.agent.tell(message)
            case Compact():
                refs.compactor.tell(message)
            case SetModel():
                self._model = message  # first: an actor (re)starting from now on starts with it
                refs.learned_window = None  # what the old model's provider stated is not the new one's
                for ref in refs.running():
                    try:
                        ref.tell(message)
                    except ActorDeadError:  # restarting: its successor starts with the new model
                        pass
            case _:
                raise TypeError(f"a session is not told {type(message).__name__}")

    def ask(self, message: Asking[R, SessionQuery], timeout: float) -> R:
        """Ask the session and wait up to ``timeout`` seconds for the answer (from a plain thread, never
        from an actor): the store answers for the session's history, the usage tracker for its usage, the
        agent for its state; :class:`GetContextStats` is answered from the store's view and the usage
        tracker's calibration together.

        Raises:
            pykka.Timeout: no answer in time.
            pykka.ActorDeadError: the actor it is for is not running.
        """
        refs = self.ensure_running()
        match message:
            case GetContext() | GetMessages() | Branch():
                return cast(R, refs.store.ask(message, timeout=timeout))
            case GetTotals() | GetCalibration():
                return cast(R, refs.usage.ask(message, timeout=timeout))
            case GetState():
                return cast(R, refs.agent.ask(message, timeout=timeout))
            case GetContextStats():
                return cast(R, self._context_stats(timeout))
            case _:
                raise TypeError(f"a session is not asked {type(message).__name__}")

    def _context_stats(self, timeout: float) -> ContextStats:
        view = self.ask(GetContext(), timeout)
        calibration = self.ask(GetCalibration(), timeout)
        spec, counter = self.spec, self.counter
        return context_stats(
            view.messages,
            count=counter.count_message,
            system_tokens=counter.count_system(spec.system_prompt) if spec.system_prompt else 0,
            tools_tokens=counter.count_tools(spec.tools.schemas()) if len(spec.tools) else 0,
            usage_floor=view.usage_floor,
            window=self.context_window,
            config=spec.config.compaction,
            last_error=calibration.last_error,
            calibration_ratio=calibration.ratio,
        )

    def ensure_running(self) -> SessionRefs:
        """Start the actors if they are not running (first use, or after hibernation)."""
        with self._lock:
            self.last_used = time.monotonic()
            if self.supervisor is None:
                # a window an overflow at this endpoint stated (design §6.3) wins over the one it started with
                gateway = self.services.gateway
                learned = gateway.windows.get(endpoint_of(self.model, self.spec.api_base), self.model)
                told = learned.window if learned is not None and learned.source == "overflow" else None
                self.refs = SessionRefs(learned_window=told)
                self.supervisor = self._start_supervisor()
                self.fresh = False
                self.services.awake.add(self)
            return self.refs

    def hibernate_if_idle(self, timeout: float = 10.0) -> bool:
        """Hibernate unless a turn is running or queued (asks the agent; call from a plain thread)."""
        agent = self.refs.agent_ref
        if self.supervisor is None or agent is None:
            return False
        try:
            status = cast(AgentStatus, agent.ask(GetState(), timeout=timeout))
        except Exception:
            return False
        if status.state != "idle" or status.queued:
            return False
        return self.hibernate(timeout)

    def hibernate(self, timeout: float = 10.0) -> bool:
        """Stop the actors (state stays in the log); the next use starts them again. A plain session keeps
        only its header from here on."""
        with self._lock:
            supervisor, self.supervisor = self.supervisor, None
            self.services.awake.discard(self)
        if supervisor is None:
            return False
        supervisor.stop(timeout=timeout)
        if self.mcp is not None:  # its MCP servers stop too, and start again when it wakes
            self.mcp.stop()
        with self._lock:
            if self.supervisor is None:
                self.refs = _NO_REFS
                if self._spec is not None:
                    self._spec.resume = True
                    if self.plain:
                        self._spec = None
        self.services.bus.publish(ev.SessionHibernated(session_id=self.session_id))
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the actors, then the session's MCP servers (without waiting for them: see
        :meth:`McpServers.wait_stopped`)."""
        with self._lock:
            supervisor, self.supervisor = self.supervisor, None
            self.services.awake.discard(self)
        if supervisor is not None:
            supervisor.stop(timeout=timeout)
            # Its store lets go of the session's lock from the writer thread, after its last writes: wait
            # for that, so that another process may open the session as soon as this returns.
            wait_lock_released(str(self.services.directory.lock_path(self.session_id)), timeout)
        if self.mcp is not None:
            self.mcp.stop()

    # -- the supervision tree -----------------------------------------------------------------------
    def _start_supervisor(self) -> Supervisor:
        starts: tuple[Callable[[bool], ActorRef[Any]], ...] = (
            self._start_store,
            self._start_usage,
            self._start_overflow,
            self._start_compactor,
            self._start_agent,
        )
        children = [
            ChildSpec(id=name, start=self._starter(name, start), restart="permanent")
            for name, start in zip(CHILD_ORDER, starts, strict=True)
        ]
        return Supervisor.start_tree(
            children,
            strategy="rest_for_one",
            max_restarts=self.spec.config.runtime.max_restarts,
            max_seconds=self.spec.config.runtime.max_restart_seconds,
            name=f"session:{self.session_id}",
            parent=self.parent,
            on_restart=self._on_restart,
            on_escalate=self._on_escalate,
            dispatcher=self.services.dispatcher,
        )

    def _starter(self, name: str, start: Callable[[bool], ActorRef[A]]) -> Callable[[], ActorRef[A]]:
        """The supervisor's start function for child ``name``: its first start, then its restarts."""

        def start_child() -> ActorRef[A]:
            starts = self._starts
            if starts is None:
                starts = self._starts = {}
            count = starts.get(name, 0)
            starts[name] = count + 1
            model = self._model
            ref = start(count > 0)
            if self._model is not model:  # the model switched while it started: it missed the SetModel
                ref.tell(self._model)
            return ref

        return start_child

    def _start_store(self, restarted: bool) -> ActorRef[SessionStore]:
        spec, services = self.spec, self.services
        ref = self.refs.store_ref = SessionStore.start(
            session_id=spec.session_id,
            directory=services.directory,
            writer=services.writer,
            header=self.header(),  # a log on disk wins; without one (never used) this starts it
            publish=services.bus.publish,
            fsync=spec.config.persistence.fsync,
            turns=services.turns,
            dispatcher=services.dispatcher,
        )
        return ref

    def _start_usage(self, restarted: bool) -> ActorRef[UsageTracker]:
        spec, model = self.spec, self._model
        ref = self.refs.usage_ref = UsageTracker.start(
            spec.session_id,
            model.model,
            spec.config,
            self.services.bus.publish,
            counter=model.counter,
            context_window=self.context_window,
            restoring=restarted or not self.fresh,  # as the agent recovers: it sends the totals (Restore)
            dispatcher=self.services.dispatcher,
        )
        return ref

    def _start_overflow(self, restarted: bool) -> ActorRef[OverflowDetector]:
        spec = self.spec
        ref = self.refs.overflow_ref = OverflowDetector.start(
            spec.session_id,
            self.services.bus.publish,
            context_window=self.context_window,
            auto_compact=spec.config.compaction.auto,
            dispatcher=self.services.dispatcher,
        )
        return ref

    def _start_compactor(self, restarted: bool) -> ActorRef[Compactor]:
        ref = self.refs.compactor_ref = Compactor.start(
            self.spec,
            self.services,
            self.refs,
            self.counter,
            self.context_window,
            model=self.model,
            dispatcher=self.services.dispatcher,
        )
        return ref

    def _start_agent(self, restarted: bool) -> ActorRef[Agent]:
        ref = self.refs.agent_ref = Agent.start(
            self.spec,
            self.services,
            self.refs,
            self.counter,
            self.context_window,
            model=self.model,
            recovering=restarted or not self.fresh,
            dispatcher=self.services.dispatcher,
        )
        return ref

    def _on_restart(self, child_id: str, error: BaseException | None, restarts: int) -> None:
        self.services.bus.publish(
            ev.ActorRestarted(
                session_id=self.session_id,
                actor=child_id,
                error=f"{type(error).__name__}: {error}" if error else "stopped",
                restarts=restarts,
            )
        )

    def _on_escalate(self, error: BaseException | None) -> None:
        with self._lock:
            self.supervisor = None
            self.services.awake.discard(self)
        if self.refs.handover is not None:  # a crashed agent's run that no successor will take up
            abandon(
                self.refs.handover,
                f"the session's actors kept crashing and were stopped ({error})",
                self.services.bus,
                self.session_id,
            )
        self.refs = _NO_REFS
        self.spec.resume = True
        self.services.bus.publish(
            ev.ErrorOccurred(
                session_id=self.session_id,
                message=f"session actors kept crashing and were stopped ({error}); the next request restarts them",
                code="session_crashed",
            )
        )


def header_for(spec: SessionSpec) -> Header:
    """The first line of a new session's log."""
    return new_header(
        spec.session_id,
        model=spec.model,
        system_prompt=spec.system_prompt,
        workspace=str(spec.workspace) if spec.workspace else None,
        api_base=spec.api_base,
        tools=spec.tools.names,
        config=spec.overrides,
        agents={name: msgspec.to_builtins(profile) for name, profile in spec.agents.items()},
        parent=spec.parent,
        mcp_servers=stored(spec.mcp_servers),
    )
