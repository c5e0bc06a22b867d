"""What a caller of the public API gets when a session cannot take its call (design §9).

Two things stand between a call and a session's actors:

- **A log that cannot be written** (a full disk, a read-only or vanished folder). The write that fails ends
  its turn (``persistence_failed``), and the store restarts from what the log really holds. From then on
  :class:`WriteHealth` (a bus sink that sees every ``persistence_error``) refuses new prompts of that
  session with a :class:`~runtime.errors.SessionError` naming the file and the error, until a probe write
  beside the log succeeds again (space is back): then the session takes prompts again, with no restart. A
  successful write of the session (``message_appended``) clears the mark too.
- **Actors being restarted** by their supervisor: a message told to an actor that is gone raises pykka's
  ``ActorDeadError``, and an ask may time out with ``pykka.Timeout``. :func:`tell` and :func:`ask` wait a
  moment for the restart and try again, then raise a :class:`~runtime.errors.SessionError` (or
  ``TimeoutError``) naming the cause: no pykka exception reaches a caller.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import pykka

from runtime.errors import SessionError
from runtime.events import Event, MessageAppended, PersistenceFailed

if TYPE_CHECKING:
    from actors.protocol import Asking
    from actors.session import Session, SessionCommand, SessionQuery

__all__ = ["WriteHealth", "ask", "tell"]

R = TypeVar("R")

_RESTART_WAIT: Final = 1.0
"""Seconds a call waits for a restarting session's actors before it gives up."""
_PROBE_MIN: Final = 256 * 1024
_PROBE_MAX: Final = 16 * 1024 * 1024


class WriteHealth:
    """The sessions whose log (or transcript) could not be written, and why. A bus sink; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: dict[str, tuple[str, str]] = {}  # session id -> (path, error)

    def __call__(self, event: Event) -> None:
        if isinstance(event, PersistenceFailed):
            with self._lock:
                self._failed[event.session_id] = (event.path, event.error)
        elif self._failed and isinstance(event, MessageAppended):
            with self._lock:
                self._failed.pop(event.session_id, None)

    def wants(self, session_id: str, kind: str) -> bool:
        """What it reads (the bus makes no event of another kind for it: see ``EventBus.publish_each``)."""
        return kind in ("persistence_error", "message_appended")

    def failure(self, session_id: str) -> tuple[str, str] | None:
        """The file and error of the session's last failed write, while it stands."""
        with self._lock:
            return self._failed.get(session_id)

    def check(self, session_id: str, size: int = 0) -> None:
        """Raise :class:`SessionError` if the session's log could not be written and still cannot (a probe
        of about ``size`` bytes written beside it fails); clear the mark once it can."""
        failed = self.failure(session_id)
        if failed is None:
            return
        path, error = failed
        if _writable(Path(path).parent, min(_PROBE_MAX, max(_PROBE_MIN, 4 * size))):
            with self._lock:
                if self._failed.get(session_id) == failed:
                    del self._failed[session_id]
            return
        raise SessionError(
            f"session {session_id!r} cannot write its log ({path}): {error}. Nothing it acknowledged is "
            "lost; it takes prompts again as soon as the log can be written (e.g. once there is free space)"
        )


def _writable(folder: Path, size: int) -> bool:
    """Whether ``size`` bytes can be written (and synced) in ``folder`` now."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".agentcell-probe-")
    except OSError:
        return False
    try:
        block = b"\0" * min(size, 1024 * 1024)
        left = size
        while left > 0:
            left -= os.write(fd, block[:left])
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


def _unavailable(session: Session, health: WriteHealth | None) -> SessionError:
    failed = health.failure(session.session_id) if health is not None else None
    why = f" after its log could not be written ({failed[0]}: {failed[1]})" if failed else " after a failure"
    return SessionError(
        f"session {session.session_id!r} is not running: its actors are being restarted{why}; try again"
    )


def tell(session: Session, message: SessionCommand, health: WriteHealth | None = None) -> None:
    """``session.tell(message)``, waiting up to a second for actors being restarted; SessionError after."""
    deadline = time.monotonic() + _RESTART_WAIT
    while True:
        try:
            session.tell(message)
            return
        except pykka.ActorDeadError:
            if time.monotonic() >= deadline:
                raise _unavailable(session, health) from None
        time.sleep(0.02)


def ask(
    session: Session, message: Asking[R, SessionQuery], timeout: float, health: WriteHealth | None = None
) -> R:
    """``session.ask(message, timeout)`` with pykka's errors turned into ours: ``TimeoutError`` when no
    answer came in time, :class:`SessionError` when the actor stays gone (after up to a second's wait)."""
    deadline = time.monotonic() + _RESTART_WAIT
    while True:
        try:
            return session.ask(message, timeout)
        except pykka.Timeout:
            raise TimeoutError(
                f"session {session.session_id!r} did not answer within {timeout:g} s"
            ) from None
        except pykka.ActorDeadError:
            if time.monotonic() >= deadline:
                raise _unavailable(session, health) from None
        time.sleep(0.02)
