"""The sessions directory: where each session's files live, listing, deleting, and the session lock.

Layout under the root (default ``~/.agentcell/sessions``, see ``persistence.sessions_dir``)::

    <id>.jsonl                              the session log (runtime.store.log)
    <id>.events.jsonl                       the event transcript (runtime.store.transcript)
    <id>.artifacts/compaction-<n>-*.md      summarizer input and output per compaction
    <id>.spill/                             tool output too large to keep inline
    <id>.lock                               held while a runtime has the session open

Every id goes through :func:`runtime.ids.validate_session_id`, so an id can never name a path.

The lock is a file created with ``O_EXCL`` that names its owner: pid, host, the process's start time
and a random token. It holds no descriptor open, so 100,000 open sessions cost no file handles. A lock
whose process is gone (checked on this host: the pid is dead, a zombie, or now belongs to a process that
started at another time) is stale and taken over; a live one raises :class:`SessionLockedError` saying
who holds it. Creating, taking over and releasing locks happen under a short ``flock`` on
``<root>/.agentcell.lock``, so two processes can never both take over the same stale lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import msgspec

from runtime.errors import SessionLockedError, SessionNotFound
from runtime.ids import validate_session_id
from runtime.store.entries import Header, MetadataEntry, decode_entry
from runtime.store.log import CorruptLogError, read_file, read_header
from runtime.store.writer import StrPath

__all__ = [
    "ARTIFACTS_SUFFIX",
    "GUARD_NAME",
    "LOCK_SUFFIX",
    "LOG_SUFFIX",
    "SPILL_SUFFIX",
    "TRANSCRIPT_SUFFIX",
    "LockOwner",
    "SessionDirectory",
    "SessionInfo",
    "SessionLock",
    "SessionLockedError",
    "SessionNotFound",
    "SessionNotFoundError",
]


LOG_SUFFIX: Final = ".jsonl"
TRANSCRIPT_SUFFIX: Final = ".events.jsonl"
ARTIFACTS_SUFFIX: Final = ".artifacts"
SPILL_SUFFIX: Final = ".spill"
LOCK_SUFFIX: Final = ".lock"
GUARD_NAME: Final = ".agentcell.lock"

_MESSAGE_LINE: Final = b'{"type":"message"'
_METADATA_LINE: Final = b'{"type":"metadata"'

SessionNotFoundError = SessionNotFound
"""The name this module gave :class:`~runtime.errors.SessionNotFound` before the two were one class."""


class SessionInfo(msgspec.Struct, frozen=True):
    """A stored session at a glance. ``error`` says why the log could not be read, if it could not."""

    id: str
    created_at: float
    updated_at: float
    messages: int
    model: str | None
    size: int
    error: str | None = None
    parent_id: str | None = None  # a sub-agent: the session that delegated to it (list_sessions's tree)


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

    def __init__(self, path: Path, owner: LockOwner, guard: _Guard) -> None:
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
            if _read_owner(self.path) == self.owner:
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"SessionLock({str(self.path)!r}, held={self.held})"


class SessionDirectory:
    """The folder holding every session's files."""

    def __init__(self, root: StrPath) -> None:
        self.root = Path(os.path.expanduser(os.fspath(root)))
        # What ``self.root / name`` puts before ``name``: the str paths below equal their Path twins exactly.
        self._prefix = os.fspath(self.root / "_")[:-1]
        self._ensured = False
        self._guard = _Guard(self.root / GUARD_NAME)

    def close(self) -> None:
        """Release the one descriptor the directory keeps open (its lock guard); using it again reopens it."""
        self._guard.close()

    def ensure(self) -> Path:
        """Create the root folder if needed (checked once; call again after removing it)."""
        if not self._ensured:
            self.root.mkdir(parents=True, exist_ok=True)
            self._ensured = True
        return self.root

    # -- paths ----------------------------------------------------------------------------------------

    def log_path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{LOG_SUFFIX}"

    def transcript_path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{TRANSCRIPT_SUFFIX}"

    def log_file(self, session_id: str) -> str:
        """:meth:`log_path` as a ``str``: no ``Path`` is built (a few microseconds saved per session start)."""
        return self._prefix + validate_session_id(session_id) + LOG_SUFFIX

    def transcript_file(self, session_id: str) -> str:
        """:meth:`transcript_path` as a ``str``."""
        return self._prefix + validate_session_id(session_id) + TRANSCRIPT_SUFFIX

    def artifacts_dir(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{ARTIFACTS_SUFFIX}"

    def artifact_path(self, session_id: str, name: str) -> Path:
        """``<root>/<id>.artifacts/<name>``; ``name`` must be a plain file name."""
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise ValueError(f"artifact name {name!r} must be a plain file name")
        return self.artifacts_dir(session_id) / name

    def compaction_artifacts(self, session_id: str, number: int) -> tuple[Path, Path]:
        """The summarizer input and summary paths of a session's ``number``-th compaction (from 1)."""
        return (
            self.artifact_path(session_id, f"compaction-{number}-input.md"),
            self.artifact_path(session_id, f"compaction-{number}-summary.md"),
        )

    def last_compaction_number(self, session_id: str) -> int:
        """The highest ``n`` of the session's ``compaction-<n>-*.md`` artifacts; 0 when there are none."""
        try:
            names = os.listdir(self.artifacts_dir(session_id))
        except (FileNotFoundError, NotADirectoryError):
            return 0
        numbers = (name.split("-", 2)[1] for name in names if name.startswith("compaction-"))
        return max((int(n) for n in numbers if n.isdigit()), default=0)

    def spill_dir(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{SPILL_SUFFIX}"

    def lock_path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{LOCK_SUFFIX}"

    # -- queries --------------------------------------------------------------------------------------

    def exists(self, session_id: str) -> bool:
        """Whether a log for ``session_id`` exists."""
        return os.path.isfile(self.log_file(session_id))

    def read_header(self, session_id: str) -> Header | None:
        """The session's header, or ``None`` when there is no log (or it has no complete first line)."""
        try:
            return read_header(self.log_path(session_id))
        except FileNotFoundError:
            return None

    def ids(self) -> list[str]:
        """Ids of the stored sessions, sorted."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.endswith(LOG_SUFFIX) and not name.endswith(TRANSCRIPT_SUFFIX):
                out.append(name[: -len(LOG_SUFFIX)])
        return sorted(out)

    def info(self, session_id: str) -> SessionInfo:
        """A summary of one stored session; raises :class:`~runtime.errors.SessionNotFound` if there is none."""
        path = self.log_path(session_id)
        try:
            stat = path.stat()
            data = read_file(path)
        except FileNotFoundError:
            raise SessionNotFound(f"no stored session {session_id!r} in {self.root}") from None
        except OSError as exc:
            return SessionInfo(session_id, 0.0, 0.0, 0, None, 0, error=str(exc))
        return _summarize(session_id, path, data, stat.st_mtime, stat.st_size)

    def list(self) -> list[SessionInfo]:
        """Every stored session, sorted by id. A log that cannot be read is listed with its ``error``."""
        infos = []
        for session_id in self.ids():
            try:
                infos.append(self.info(session_id))
            except SessionNotFound:
                continue  # deleted meanwhile
        return infos

    # -- changes --------------------------------------------------------------------------------------

    def lock(self, session_id: str) -> SessionLock:
        """Take the session's lock, or raise :class:`SessionLockedError` naming its live owner."""
        path = self.lock_path(session_id)
        self.ensure()
        me = LockOwner.me()
        with self._guard.held():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                owner = _read_owner(path)
                if owner is not None and (not owner.here or owner.alive()):
                    raise SessionLockedError(_locked_message(session_id, path, owner), owner) from None
                # Stale (its process is gone) or unreadable: take it over.
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, me.encode())
            finally:
                os.close(fd)
        return SessionLock(path, me, self._guard)

    def delete(self, session_id: str) -> None:
        """Delete the session's log, transcript, artifacts and spill files.

        Raises :class:`~runtime.errors.SessionNotFound` when there is nothing to delete and
        :class:`SessionLockedError` while the session is open somewhere.
        """
        paths = [self.log_path(session_id), self.transcript_path(session_id)]
        folders = [self.artifacts_dir(session_id), self.spill_dir(session_id)]
        if not any(p.exists() for p in (*paths, *folders)):
            raise SessionNotFound(f"no stored session {session_id!r} in {self.root}")
        with self.lock(session_id):
            for path in paths:
                path.unlink(missing_ok=True)
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)


def _summarize(session_id: str, path: Path, data: bytes, mtime: float, size: int) -> SessionInfo:
    lines = data.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is empty or a torn line
    try:
        header = _header(path, complete[0]) if complete else None
        messages = 0
        model = header.model if header is not None else None
        for line in complete:
            if line.startswith(_MESSAGE_LINE):
                messages += 1
            elif line.startswith(_METADATA_LINE):
                entry = decode_entry(line)
                if isinstance(entry, MetadataEntry) and entry.key == "model" and isinstance(entry.value, str):
                    model = entry.value
    except (CorruptLogError, msgspec.DecodeError) as exc:
        return SessionInfo(session_id, mtime, mtime, 0, None, size, error=str(exc))
    if header is None:
        return SessionInfo(session_id, mtime, mtime, 0, None, size, error="the log has no header yet")
    return SessionInfo(
        session_id, header.created_at, mtime, messages, model, size, parent_id=header.parent_session_id
    )


def _header(path: Path, line: bytes) -> Header:
    entry = decode_entry(line)
    if not isinstance(entry, Header):
        raise CorruptLogError(path, 1, f"the first entry must be a header, not {type(entry).__name__}")
    return entry


class _Guard:
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


def _read_owner(path: Path) -> LockOwner | None:
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


def _locked_message(session_id: str, path: Path, owner: LockOwner | None) -> str:
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
