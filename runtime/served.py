"""What a front such as the HTTP server needs of a runtime beyond its public API.

The server (``runtime.apps.server``) serves a :class:`~runtime.host.Runtime` or a
:class:`~runtime.cluster.ClusterRuntime` alike. Besides the public API (start, prompt, subscribe, ...) it
asks a few questions about sessions: is one hosted, is one stored, what was it stored with, what is its
model and window, how far has its event numbering gone, and what did its transcript record after a
cursor. :class:`Served` names those questions; :func:`served` answers them for either runtime. A cluster
runtime answers them itself (each shard answers for its own sessions with a :class:`LocalServed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec

from runtime.events import Event

if TYPE_CHECKING:
    from runtime.host import Runtime
    from runtime.store.entries import Header

__all__ = ["LocalServed", "Served", "SessionSummary", "served"]


class SessionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A hosted session at a glance: its model and window now, and whether its actors run (not parked)."""

    id: str
    model: str
    context_window: int
    running: bool


@runtime_checkable
class Served(Protocol):
    """The questions a front asks a runtime about sessions, beyond the public API."""

    def is_hosted(self, session_id: str) -> bool:
        """Whether the runtime hosts the session now (started or resumed, not stopped)."""
        ...

    def is_stored(self, session_id: str) -> bool:
        """Whether the sessions directory holds a log of the session."""
        ...

    def stored_header(self, session_id: str) -> Header | None:
        """The header the session was stored with (None: no such log)."""
        ...

    def session_summary(self, session_id: str) -> SessionSummary:
        """Model, window and state of a hosted session (``SessionNotFound`` if it is not hosted)."""
        ...

    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's latest event (0: none yet, or not hosted)."""
        ...

    def replay(self, session_id: str, after_seq: int, types: Iterable[str] | None = None) -> list[Event]:
        """The session's events after ``after_seq`` from its transcript (every event published before the
        call is on disk first), optionally of some types only."""
        ...


class LocalServed:
    """:class:`Served` for one in-process :class:`~runtime.host.Runtime`."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def is_hosted(self, session_id: str) -> bool:
        sessions = (
            self.runtime._hosting.sessions
        )  # O(1), unlike `in runtime.hosted_sessions()` (a list of them all)
        return sessions is not None and sessions.get(session_id) is not None

    def is_stored(self, session_id: str) -> bool:
        return bool(self.runtime.services.directory.exists(session_id))

    def stored_header(self, session_id: str) -> Header | None:
        header: Header | None = self.runtime.services.directory.read_header(session_id)
        return header

    def session_summary(self, session_id: str) -> SessionSummary:
        session = self.runtime._hosted(session_id)  # (a parked session stays parked)
        return SessionSummary(
            id=session_id,
            model=session.model,
            context_window=session.context_window,
            running=bool(session.running),
        )

    def last_seq(self, session_id: str) -> int:
        return self.runtime.bus.last_seq(session_id)

    def replay(self, session_id: str, after_seq: int, types: Iterable[str] | None = None) -> list[Event]:
        from runtime.store.transcript import read_transcript

        wanted = set(types) if types is not None else None
        self.runtime.services.writer.flush(timeout=10)  # what was published before now reaches the disk
        path = self.runtime.services.directory.transcript_path(session_id)
        return [e for e in read_transcript(path, after_seq) if wanted is None or e.type in wanted]


def served(runtime: Any) -> Served:
    """The :class:`Served` answers for ``runtime``: a cluster runtime's own, or a local runtime's."""
    if isinstance(runtime, Served):
        return runtime
    return LocalServed(runtime)
