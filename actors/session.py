"""One session: its spec and the supervisor of its five actors (SPEC 1.2).

The supervisor runs ``rest_for_one`` in the order store → usage tracker → overflow detector → compactor →
agent: when an actor crashes, it and every actor started after it are restarted, each recovering its
state from the store. A session starts its actors on first use and can park them again when idle
(hibernation, SPEC 8): a parked session costs one small object, and its state lives in the log.
"""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import msgspec
import pykka

from actors.agent import Agent, abandon
from actors.compactor import Compactor
from actors.overflow_detector import OverflowDetector
from actors.session_store import SessionStore
from actors.usage_tracker import UsageTracker
from actors.wiring import Services, SessionRefs, SessionSpec
from runtime import events as ev
from runtime.supervisor import ChildSpec, Supervisor
from runtime.tokens import TokenCounter

CHILD_ORDER = ("store", "usage", "overflow", "compactor", "agent")


class Session:
    """A session's handle inside the runtime: lazily started, supervised, able to hibernate."""

    __slots__ = (
        "_lock",
        "_starts",
        "context_window",
        "counter",
        "fresh",
        "last_used",
        "parent",
        "refs",
        "services",
        "spec",
        "supervisor",
    )

    def __init__(
        self,
        spec: SessionSpec,
        services: Services,
        counter: TokenCounter,
        context_window: int,
        parent: Supervisor | None = None,
    ) -> None:
        self.spec = spec
        self.services = services
        self.counter = counter
        self.context_window = context_window
        self.parent = parent
        self.refs = SessionRefs()
        self.supervisor: Supervisor | None = None
        self._lock = threading.Lock()
        self._starts: dict[str, int] = {}
        self.last_used = time.monotonic()
        self.fresh = not spec.resume  # created by this runtime and not yet started: nothing to recover

    @property
    def session_id(self) -> str:
        return self.spec.session_id

    @property
    def running(self) -> bool:
        return self.supervisor is not None

    def ensure_running(self) -> SessionRefs:
        """Start the actors if they are not running (first use, or after hibernation)."""
        with self._lock:
            self.last_used = time.monotonic()
            if self.supervisor is None:
                self.supervisor = self._start_supervisor()
                self.fresh = False
            return self.refs

    def hibernate_if_idle(self, timeout: float = 10.0) -> bool:
        """Hibernate unless a turn is running or queued (asks the agent; call from a plain thread)."""
        from actors.agent import GetState

        refs = self.refs
        if self.supervisor is None or refs.agent is None:
            return False
        try:
            state = cast(dict[str, Any], refs.agent.ask(GetState(), timeout=timeout))
        except Exception:
            return False
        if state["state"] != "idle" or state["queued"]:
            return False
        return self.hibernate(timeout)

    def hibernate(self, timeout: float = 10.0) -> bool:
        """Stop the actors (state stays in the log); the next use starts them again."""
        with self._lock:
            supervisor, self.supervisor = self.supervisor, None
        if supervisor is None:
            return False
        supervisor.stop(timeout=timeout)
        if self.spec.mcp is not None:  # its MCP servers stop too, and start again when it wakes
            self.spec.mcp.stop()
        self.refs = SessionRefs()
        self.spec.resume = True
        self.services.bus.publish(ev.SessionHibernated(session_id=self.session_id))
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the actors, then the session's MCP servers (without waiting for them: see
        :meth:`McpServers.wait_stopped`)."""
        with self._lock:
            supervisor, self.supervisor = self.supervisor, None
        if supervisor is not None:
            supervisor.stop(timeout=timeout)
        if self.spec.mcp is not None:
            self.spec.mcp.stop()

    # -- the supervision tree -----------------------------------------------------------------------
    def _start_supervisor(self) -> Supervisor:
        children = [
            ChildSpec(id=name, start=self._starter(name), restart="permanent") for name in CHILD_ORDER
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

    def _starter(self, name: str) -> Any:
        def start() -> pykka.ActorRef[Any]:
            count = self._starts.get(name, 0)
            self._starts[name] = count + 1
            ref = self._start_child(name, restarted=count > 0)
            setattr(self.refs, name, ref)
            return ref

        return start

    def _start_child(self, name: str, *, restarted: bool) -> pykka.ActorRef[Any]:
        spec, services = self.spec, self.services
        publish = services.bus.publish
        dispatcher = services.dispatcher
        if name == "store":
            return SessionStore.start(
                session_id=spec.session_id,
                directory=services.directory,
                writer=services.writer,
                header=None if (spec.resume or restarted) else header_for(spec),
                publish=publish,
                fsync=spec.config.persistence.fsync,
                dispatcher=dispatcher,
            )
        if name == "usage":
            return UsageTracker.start(
                spec.session_id,
                spec.model,
                spec.config,
                publish,
                counter=self.counter,
                context_window=self.context_window,
                dispatcher=dispatcher,
            )
        if name == "overflow":
            return OverflowDetector.start(
                spec.session_id,
                publish,
                context_window=self.context_window,
                auto_compact=spec.config.compaction.auto,
                dispatcher=dispatcher,
            )
        if name == "compactor":
            return Compactor.start(
                spec, services, self.refs, self.counter, self.context_window, dispatcher=dispatcher
            )
        return Agent.start(
            spec,
            services,
            self.refs,
            self.counter,
            self.context_window,
            recovering=restarted or not self.fresh,
            dispatcher=dispatcher,
        )

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
        if self.refs.handover is not None:  # a crashed agent's run that no successor will take up
            abandon(
                self.refs.handover,
                f"the session's actors kept crashing and were stopped ({error})",
                self.services.tracing,
                self.session_id,
            )
        self.refs = SessionRefs()
        self.spec.resume = True
        self.services.bus.publish(
            ev.ErrorOccurred(
                session_id=self.session_id,
                message=f"session actors kept crashing and were stopped ({error}); the next request restarts them",
                code="session_crashed",
            )
        )


def header_for(spec: SessionSpec) -> Any:
    """The first line of a new session's log."""
    from runtime.store.entries import new_header
    from runtime.tools.mcp.servers import stored

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
