"""The session lock (design §2.3): a file beside a session's log, held while a runtime has it open.

The lock is a file created with ``O_EXCL`` that names its owner: pid, host, the process's start time
and a random token. It holds no descriptor open, so 100,000 open sessions cost no file handles. A lock
whose process is gone (checked on this host: the pid is dead, a zombie, or now belongs to a process that
started at another time) is stale and taken over; a live one raises :class:`SessionLockedError` saying
who holds it. Creating, taking over and releasing locks happen under a short ``flock`` on
``<root>/.agentcell.lock``, so two processes can never both take over the same stale lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from runtime.errors import SessionLockedError

__all__ = ["LockGuard", "LockOwner", "SessionLock", "lock_held", "locked_message", "read_owner", "take_lock"]

_identity: list[Any] = [0, "", ""]  # pid, host, start time of this process


class LockOwner(msgspec.Struct, frozen=True):
    """Who holds a session lock, as its lock file says."""

    pid: int
    host: str
    started: str  # the process's start time (ticks since boot on Linux), "" where unknown
    token: str  # tells this lock apart from a later one of the same process

    @classmethod
    def me(cls) -> LockOwner:
        pid = os.getpid()
        if _identity[0] != pid:  # computed once per process (a fork gets its own)
            _identity[:] = [pid, socket.gethostname(), _process_start(pid)]
        return cls(pid, _identity[1], _identity[2], os.urandom(8).hex())

    def encode(self) -> bytes:
        return f"{self.pid}\n{self.host}\n{self.started}\n{self.token}\n".encode()

    @classmethod
    def decode(cls, data: bytes) -> LockOwner | None:
        fields = data.decode("utf-8", "replace").split("\n")
        try:
            return cls(
                int(fields[0]),
                fields[1],
                fields[2] if len(fields) > 2 else "",
                fields[3] if len(fields) > 3 else "",
            )
        except (ValueError, IndexError):
            return None

    @property
    def here(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether the owner's process still runs (only meaningful for a lock of this host)."""
        state = _process_state(self.pid)
        if state is None or state == "Z":
            return False
        return not self.started or _process_start(self.pid) in ("", self.started)


class SessionLock:
    """A held session lock. Release it with :meth:`release` (or use it as a context manager)."""

    def __init__(self, path: Path, owner: LockOwner, guard: LockGuard) -> None:
        self.path = path
        self.owner = owner
        self._guard = guard
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        """Remove the lock file if it is still this lock's. Idempotent."""
        if not self._held:
            return
        self._held = False
        with self._guard.held():
            if read_owner(self.path) == self.owner:
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"SessionLock({str(self.path)!r}, held={self.held})"


def take_lock(path: Path, session_id: str, guard: LockGuard) -> SessionLock:
    """Take the lock at ``path`` (of session ``session_id``) under ``guard``, or raise
    :class:`SessionLockedError` naming its live owner; a stale or unreadable lock is taken over."""
    me = LockOwner.me()
    with guard.held():
        created = True
        try:
            fd = _create(path)
        except FileExistsError:
            owner = read_owner(path)
            if owner is not None and (not owner.here or owner.alive()):
                raise SessionLockedError(locked_message(session_id, path, owner), owner) from None
            # Stale (its process is gone) or unreadable: take it over.
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            created = False
        try:
            _write_owner(fd, me.encode())
        except BaseException:
            if created:  # (e.g. a full disk: no empty lock file left behind)
                path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
    return SessionLock(path, me, guard)


def lock_held(path: Path) -> bool:
    """Whether a running process holds the lock at ``path`` (this one included)."""
    owner = read_owner(path)
    return owner is not None and (not owner.here or owner.alive())


def _create(path: Path) -> int:
    """Create ``path`` exclusively (and its shard folder if needed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)


def _write_owner(fd: int, data: bytes) -> None:
    """Write a lock's owner whole (a short write, as a full disk may make, is ENOSPC)."""
    if os.write(fd, data) != len(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class LockGuard:
    """Serializes lock changes in a root: a thread lock here, an ``flock`` on a file across processes.

    The guard file's descriptor stays open (one per sessions directory, not one per session); a forked
    child opens its own, since a descriptor shared with the parent would not exclude it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._threads = threading.Lock()
        self._fd = -1
        self._pid = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._threads:
            if self._pid != os.getpid():
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._pid = os.getpid()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the guard file's descriptor (the next :meth:`held` opens it again)."""
        with self._threads:
            fd, self._fd, pid, self._pid = self._fd, -1, self._pid, 0
            if fd >= 0 and pid == os.getpid():
                os.close(fd)


def read_owner(path: Path) -> LockOwner | None:
    try:
        return LockOwner.decode(path.read_bytes()[:1024])
    except FileNotFoundError:
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _process_state(pid: int) -> str | None:
    """The process's state letter ("R", "S", "Z", ...), "?" if it exists but /proc says nothing, else None."""
    fields = _proc_stat(pid)
    if fields:
        return fields[0]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "?"
    return "?"


def _process_start(pid: int) -> str:
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else ""


def locked_message(session_id: str, path: Path, owner: LockOwner | None) -> str:
    if owner is None:
        who = "another process"
    elif owner.pid == os.getpid() and owner.here:
        who = f"this process (pid {owner.pid})"
    else:
        who = f"pid {owner.pid} on {owner.host or 'an unknown host'}"
    return (
        f"session {session_id!r} is open in {who}: two runtimes must not write one session. "
        f"Stop it there first; if that process is gone, delete {path}."
    )
