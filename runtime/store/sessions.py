"""The sessions directory: where each session's files live, listing, deleting, and the session lock.

Layout under the root (default ``~/.agentcell/sessions``, see ``persistence.sessions_dir``)::

    <id>.jsonl                              the session log (runtime.store.log)
    <id>.events.jsonl                       the event transcript (runtime.store.transcript)
    <id>.artifacts/compaction-<n>-*.md      summarizer input and output per compaction
    <id>.spill/                             tool output too large to keep inline
    <id>.lock                               held while a runtime has the session open

Every id goes through :func:`runtime.ids.validate_session_id`, so an id can never name a path.

The lock is a file created with ``O_EXCL`` that holds the owner's pid and host name, and the owner
keeps an ``flock`` on it. The kernel drops the ``flock`` when its process dies, however it dies, so a
lock left behind by a crash (``kill -9`` included) is recognised as stale and taken over; a lock whose
owner is alive raises :class:`SessionLockedError` saying who holds it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path
from typing import Final

import msgspec

from runtime.ids import validate_session_id
from runtime.store.entries import Header, MetadataEntry, decode_entry
from runtime.store.log import CorruptLogError, read_file, read_header
from runtime.store.writer import StrPath

LOG_SUFFIX: Final = ".jsonl"
TRANSCRIPT_SUFFIX: Final = ".events.jsonl"
ARTIFACTS_SUFFIX: Final = ".artifacts"
SPILL_SUFFIX: Final = ".spill"
LOCK_SUFFIX: Final = ".lock"

_MESSAGE_LINE: Final = b'{"type":"message"'
_METADATA_LINE: Final = b'{"type":"metadata"'


class SessionLockedError(RuntimeError):
    """The session is open in another runtime (or another store of this one).

    ``owner_pid`` and ``owner_host`` name the holder when its lock file says who it is.
    """

    def __init__(self, message: str, owner: tuple[int, str] | None = None) -> None:
        super().__init__(message)
        self.owner_pid = owner[0] if owner else None
        self.owner_host = owner[1] if owner else None

    @property
    def held_by_this_process(self) -> bool:
        return self.owner_pid == os.getpid() and self.owner_host == socket.gethostname()


class SessionNotFoundError(LookupError):
    """No stored session has this id."""


class SessionInfo(msgspec.Struct, frozen=True):
    """A stored session at a glance. ``error`` says why the log could not be read, if it could not."""

    id: str
    created_at: float
    updated_at: float
    messages: int
    model: str | None
    size: int
    error: str | None = None


class SessionLock:
    """A held session lock. Release it with :meth:`release` (or use it as a context manager)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and drop the ``flock``. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(self.path, fd):
                self.path.unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)  # drops the flock

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

    def ensure(self) -> Path:
        """Create the root folder if needed."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    # -- paths ----------------------------------------------------------------------------------------

    def log_path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{LOG_SUFFIX}"

    def transcript_path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{TRANSCRIPT_SUFFIX}"

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

    def spill_dir(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{SPILL_SUFFIX}"

    def lock_path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}{LOCK_SUFFIX}"

    # -- queries --------------------------------------------------------------------------------------

    def exists(self, session_id: str) -> bool:
        """Whether a log for ``session_id`` exists."""
        return self.log_path(session_id).is_file()

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
        """A summary of one stored session; raises :class:`SessionNotFoundError` if there is none."""
        path = self.log_path(session_id)
        try:
            stat = path.stat()
            data = read_file(path)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no stored session {session_id!r} in {self.root}") from None
        except OSError as exc:
            return SessionInfo(session_id, 0.0, 0.0, 0, None, 0, error=str(exc))
        return _summarize(session_id, path, data, stat.st_mtime, stat.st_size)

    def list(self) -> list[SessionInfo]:
        """Every stored session, sorted by id. A log that cannot be read is listed with its ``error``."""
        infos = []
        for session_id in self.ids():
            try:
                infos.append(self.info(session_id))
            except SessionNotFoundError:
                continue  # deleted meanwhile
        return infos

    # -- changes --------------------------------------------------------------------------------------

    def lock(self, session_id: str) -> SessionLock:
        """Take the session's lock, or raise :class:`SessionLockedError` naming its live owner."""
        path = self.lock_path(session_id)
        self.ensure()
        for _ in range(10):  # retried only when a concurrent release or takeover swaps the file
            created = True
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                created = False
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise SessionLockedError(_locked_message(session_id, path, owner), owner) from None
            if not _same_file(path, fd):
                os.close(fd)  # released or taken over between open and flock
                continue
            if not created:
                owner = _read_owner(fd)
                host = owner[1] if owner else None
                if host and host != socket.gethostname():
                    # Another machine's lock (a shared folder): its process cannot be checked from here.
                    os.close(fd)
                    raise SessionLockedError(_locked_message(session_id, path, owner), owner)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{socket.gethostname()}\n".encode(), 0)
            return SessionLock(path, fd)
        raise SessionLockedError(f"session {session_id!r}: could not take {path}, it keeps changing")

    def delete(self, session_id: str) -> None:
        """Delete the session's log, transcript, artifacts and spill files.

        Raises :class:`SessionNotFoundError` when there is nothing to delete and
        :class:`SessionLockedError` while the session is open somewhere.
        """
        paths = [self.log_path(session_id), self.transcript_path(session_id)]
        folders = [self.artifacts_dir(session_id), self.spill_dir(session_id)]
        if not any(p.exists() for p in (*paths, *folders)):
            raise SessionNotFoundError(f"no stored session {session_id!r} in {self.root}")
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
    return SessionInfo(session_id, header.created_at, mtime, messages, model, size)


def _header(path: Path, line: bytes) -> Header:
    entry = decode_entry(line)
    if not isinstance(entry, Header):
        raise CorruptLogError(path, 1, f"the first entry must be a header, not {type(entry).__name__}")
    return entry


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _read_owner(fd: int) -> tuple[int, str] | None:
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
        return int(text[0]), text[1] if len(text) > 1 else ""
    except (OSError, ValueError, IndexError):
        return None


def _locked_message(session_id: str, path: Path, owner: tuple[int, str] | None) -> str:
    if owner is None:
        who = "another process"
    elif owner[0] == os.getpid() and owner[1] == socket.gethostname():
        who = f"this process (pid {owner[0]})"
    else:
        who = f"pid {owner[0]} on {owner[1] or 'an unknown host'}"
    return (
        f"session {session_id!r} is open in {who}: two runtimes must not write one session. "
        f"Stop it there first; if that process is gone, delete {path}."
    )
