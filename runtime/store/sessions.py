"""The sessions directory: where each session's files live, listing, deleting, taking the session lock.

Layout under the root (default ``~/.agentcell/sessions``, see ``persistence.sessions_dir``)::

    index/<n>.jsonl                         headers of started sessions (runtime.store.index), one
                                            segment per runtime appending
    ab/cd/<id>.jsonl                        the session log (runtime.store.log), from its first entry
    ab/cd/<id>.events.jsonl                 the event transcript (runtime.store.transcript)
    ab/cd/<id>.artifacts/compaction-<n>-*.md  summarizer input and output per compaction
    ab/cd/<id>.spill/                       tool output too large to keep inline
    ab/cd/<id>.lock                         held while a runtime has the session open

``ab/cd`` is :func:`shard_of` the id: two levels of 256 folders by a hash of the id, so a million sessions
put about 15 in a folder. A session that was started and never used has no file of its own: its header is
a line of the index. Earlier versions kept every file in the root itself (the flat layout): such sessions
are still found there, and a runtime moves them into their shard folders when it opens the directory.

Every id goes through :func:`runtime.ids.validate_session_id`, so an id can never name a path.

The session lock, a file beside the log, is :mod:`runtime.store.session_lock`'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import msgspec

from runtime.errors import SessionLockedError, SessionNotFound
from runtime.ids import InvalidSessionId, validate_session_id
from runtime.store.entries import Header, MetadataEntry, decode_entry
from runtime.store.index import SessionIndex, encode_removed
from runtime.store.log import CorruptLogError, read_file, read_header_line
from runtime.store.session_lock import LockGuard, SessionLock, lock_held, take_lock
from runtime.store.writer import StrPath, fsync_dir

log = logging.getLogger("agentcell.store")

__all__ = [
    "ARTIFACTS_SUFFIX",
    "GUARD_NAME",
    "LOCK_SUFFIX",
    "LOG_SUFFIX",
    "SPILL_SUFFIX",
    "TRANSCRIPT_SUFFIX",
    "SessionDirectory",
    "SessionInfo",
    "SessionLockedError",
    "SessionNotFound",
    "SessionNotFoundError",
    "shard_of",
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


class SessionDirectory:
    """The folder holding every session's files (see the module docstring for the layout).

    ``migrate`` moves sessions of the old flat layout into their shard folders when the directory is first
    used (a runtime does; ``agentcell sessions`` only reads, and finds them where they are). A flat session
    whose lock a live process holds is left where it is, and still found there.
    """

    def __init__(self, root: StrPath, *, migrate: bool = False) -> None:
        self.root = Path(os.path.expanduser(os.fspath(root)))
        self.migrate = migrate
        self.index = SessionIndex(self.root)
        # What ``self.root / name`` puts before ``name``: the str paths below equal their Path twins exactly.
        self._prefix = os.fspath(self.root / "_")[:-1]
        self._ensured = False
        self._guard = LockGuard(self.root / GUARD_NAME)
        self._layout_lock = threading.Lock()
        self._flat: frozenset[str] | None = None  # sessions still in the flat layout (found on first use)
        self._legacy: dict[str, str] | None = None  # sub-agents with a log and no index line (found once)
        self._handed: dict[str, tuple[Any, tuple[int, int, int]]] = {}  # see hand_over
        self._handed_lock = threading.Lock()

    def close(self) -> None:
        """Release the descriptors the directory keeps open (its lock guard, its index claim); using it
        again reopens them."""
        self._guard.close()
        self.index.release()

    def ensure(self) -> Path:
        """Create the root folder if needed and look for flat-layout sessions (checked once; call again
        after removing it)."""
        if not self._ensured:
            self.root.mkdir(parents=True, exist_ok=True)
            self._ensured = True
            self._flat = None
        self._flat_ids()
        return self.root

    # -- paths ----------------------------------------------------------------------------------------

    def base(self, session_id: str) -> str:
        """What goes before a session's file names: ``<root>/ab/cd/`` (``<root>/`` for a flat session)."""
        flat = self._flat if self._flat is not None else self._flat_ids()
        sid = validate_session_id(session_id)
        if sid in flat:
            return self._prefix
        return self._prefix + shard_of(sid) + os.sep

    def log_path(self, session_id: str) -> Path:
        return Path(self.log_file(session_id))

    def transcript_path(self, session_id: str) -> Path:
        return Path(self.transcript_file(session_id))

    def log_file(self, session_id: str) -> str:
        """:meth:`log_path` as a ``str``."""
        return self.base(session_id) + session_id + LOG_SUFFIX

    def transcript_file(self, session_id: str) -> str:
        """:meth:`transcript_path` as a ``str``."""
        return self.base(session_id) + session_id + TRANSCRIPT_SUFFIX

    def artifacts_dir(self, session_id: str) -> Path:
        return Path(self.base(session_id) + session_id + ARTIFACTS_SUFFIX)

    def artifact_path(self, session_id: str, name: str) -> Path:
        """``<id>.artifacts/<name>`` beside the log; ``name`` must be a plain file name."""
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
        return Path(self.base(session_id) + session_id + SPILL_SUFFIX)

    def lock_path(self, session_id: str) -> Path:
        return Path(self.base(session_id) + session_id + LOCK_SUFFIX)

    # -- queries --------------------------------------------------------------------------------------

    def has_log(self, session_id: str) -> bool:
        """Whether the session has a log file (it has had something to keep)."""
        return os.path.isfile(self.log_file(session_id))

    def exists(self, session_id: str) -> bool:
        """Whether a session ``session_id`` is stored: it has a log, or a header in the index."""
        return self.has_log(session_id) or session_id in self.index

    def read_header(self, session_id: str) -> Header | None:
        """The session's header, or ``None`` when it is not stored (or its log has no complete first line)."""
        found = self.stored_header(session_id)
        return found[0] if found is not None else None

    def stored_header(self, session_id: str) -> tuple[Header, bytes] | None:
        """The session's header and its line as stored: the first line of its log, else (no log, or one a
        crash cut before its first line was whole) its line in the index."""
        try:
            found = read_header_line(self.log_file(session_id))
        except FileNotFoundError:
            found = None
        return found if found is not None else self.index.lookup(session_id)

    def children(self, parent_id: str) -> list[str]:
        """Ids of the stored sessions whose header names ``parent_id`` as their parent, oldest first: from
        the index, without reading any log (and, once per directory, the headers of logs the index does
        not have: sessions stored before it existed)."""
        found = self.index.children(parent_id)
        legacy = self._legacy_parents()
        if legacy:
            found += [
                sid
                for sid, parent in legacy.items()
                if parent == parent_id and sid not in found and self.has_log(sid)  # (not deleted since)
            ]
        return found

    def _legacy_parents(self) -> dict[str, str]:
        """Sub-agent sessions with a log and no index line, by id, with their parents (found once)."""
        if self._legacy is None:
            indexed = set(self.index.ids())
            legacy: dict[str, str] = {}
            for sid in self._logs():
                if sid in indexed:
                    continue
                try:
                    found = read_header_line(self.log_file(sid))
                except (OSError, CorruptLogError, msgspec.DecodeError):
                    continue
                if found is not None and found[0].parent_session_id is not None:
                    legacy[sid] = found[0].parent_session_id
            self._legacy = legacy
        return self._legacy

    def hand_over(self, session_id: str, tree: Any, signature: tuple[int, int, int]) -> None:
        """Leave a session's tree, replayed from its log as it was (``signature``), for its store to take
        instead of reading the log again (a resume checks the log first: it is read once, not twice)."""
        with self._handed_lock:
            self._handed[session_id] = (tree, signature)

    def take_over(self, session_id: str) -> tuple[Any, tuple[int, int, int]] | None:
        """What :meth:`hand_over` left for ``session_id`` (once), or None."""
        with self._handed_lock:
            return self._handed.pop(session_id, None)

    def ids(self) -> list[str]:
        """Ids of the stored sessions, sorted."""
        return sorted({*self._logs(), *self.index.ids()})

    def info(self, session_id: str) -> SessionInfo:
        """A summary of one stored session; raises :class:`~runtime.errors.SessionNotFound` if there is none."""
        path = self.log_path(session_id)
        try:
            stat = path.stat()
            data: bytes | None = read_file(path)
        except FileNotFoundError:
            data = None
        except OSError as exc:
            return SessionInfo(session_id, 0.0, 0.0, 0, None, 0, error=str(exc))
        if data is None or b"\n" not in data:  # no log yet, or its first line still on its way
            found = self.index.lookup(session_id)
            if found is not None:
                return _unused(found[0])
            if data is None:
                raise SessionNotFound(f"no stored session {session_id!r} in {self.root}")
        return _summarize(session_id, path, data, stat.st_mtime, stat.st_size)

    def list(self) -> list[SessionInfo]:
        """Every stored session, sorted by id. A log that cannot be read is listed with its ``error``."""
        infos = {}
        for session_id in self._logs():
            try:
                infos[session_id] = self.info(session_id)
            except SessionNotFound:
                continue  # deleted meanwhile
        for header in self.index.headers():  # (a session whose log appeared since the walk is listed unused)
            if header.session_id not in infos:
                infos[header.session_id] = _unused(header)
        return [infos[sid] for sid in sorted(infos)]

    def _logs(self) -> Iterator[str]:
        """Ids of the sessions with a log: in the shard folders, and in the root (flat layout)."""
        yield from _logs_in(self.root)
        for first in _shard_names(self.root):
            for second in _shard_names(self.root / first):
                yield from _logs_in(self.root / first / second)

    # -- changes --------------------------------------------------------------------------------------

    def lock(self, session_id: str) -> SessionLock:
        """Take the session's lock, or raise :class:`SessionLockedError` naming its live owner."""
        self.ensure()
        return take_lock(self.lock_path(session_id), session_id, self._guard)

    def held(self, session_id: str) -> bool:
        """Whether a running process holds the session's lock (this one included): a runtime has it open."""
        return lock_held(self.lock_path(session_id))

    def delete(self, session_id: str, *, append_index: Callable[[bytes], None] | None = None) -> None:
        """Delete the session's log, transcript, artifacts and spill files, and remove it from the index.

        ``append_index`` appends the removal line (a runtime passes its log writer's way, so the line goes
        in order with the headers it queued); by default it is appended and fsynced here. Raises
        :class:`~runtime.errors.SessionNotFound` when there is nothing to delete and
        :class:`SessionLockedError` while the session is open somewhere.
        """
        paths = [self.log_path(session_id), self.transcript_path(session_id)]
        folders = [self.artifacts_dir(session_id), self.spill_dir(session_id)]
        indexed = self.index.lookup(session_id)
        if indexed is None and not any(p.exists() for p in (*paths, *folders)):
            raise SessionNotFound(f"no stored session {session_id!r} in {self.root}")
        with self.lock(session_id):
            if indexed is not None:
                line = encode_removed(session_id, indexed[0].created_at)
                (append_index or self.index.append_now)(line)
                self.index.forget(session_id)
            for path in paths:
                path.unlink(missing_ok=True)
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)

    # -- the flat layout ------------------------------------------------------------------------------

    def _flat_ids(self) -> frozenset[str]:
        """Sessions whose files are in the root (the layout before issue 32), moved into their shard
        folders first when ``migrate`` is set; found once, on first use."""
        with self._layout_lock:
            if self._flat is not None:
                return self._flat
            found = _flat_sessions(self.root)
            if found and self.migrate:
                found = self._migrate(found)
            self._flat = frozenset(found)
            return self._flat

    def _migrate(self, flat: set[str]) -> set[str]:
        """Move flat sessions into their shard folders; returns the ones left where they are."""
        left: set[str] = set()
        moved_to: set[str] = set()
        with self._guard.held():
            for sid in sorted(flat):
                lock = self._prefix + sid + LOCK_SUFFIX
                if os.path.lexists(lock) and lock_held(Path(lock)):
                    left.add(sid)  # open in a live process (an older agentcell): leave it be
                    continue
                base = self._prefix + shard_of(sid) + os.sep
                clash = False
                for suffix in (TRANSCRIPT_SUFFIX, ARTIFACTS_SUFFIX, SPILL_SUFFIX, LOG_SUFFIX):
                    source, target = self._prefix + sid + suffix, base + sid + suffix
                    if not os.path.lexists(source):
                        continue
                    if os.path.lexists(target):
                        clash = True
                        continue
                    os.makedirs(base, exist_ok=True)
                    os.rename(source, target)
                    moved_to.add(base)
                if clash:
                    log.warning(
                        "session %s has files in both layouts under %s: the flat ones are used",
                        sid,
                        self.root,
                    )
                    left.add(sid)
                    continue
                try:
                    os.unlink(lock)  # a stale lock of a dead process
                except FileNotFoundError:
                    pass
        for folder in (self._prefix, *moved_to):
            fsync_dir(folder)
        if flat - left:
            log.info("moved %d sessions of %s into shard folders", len(flat - left), self.root)
        return left


def shard_of(session_id: str) -> str:
    """The folder of a session's files under the root, ``ab/cd``: two levels of 256 by a hash of the id, so
    no folder holds more than a few thousand entries with tens of millions of sessions stored."""
    h = zlib.crc32(session_id.encode())
    return f"{h >> 8 & 0xFF:02x}{os.sep}{h & 0xFF:02x}"


def _shard_names(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return [e.name for e in entries if len(e.name) == 2 and _is_hex(e.name) and e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_hex(name: str) -> bool:
    return all(c in "0123456789abcdef" for c in name)


def _logs_in(folder: Path) -> Iterator[str]:
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        if name.endswith(LOG_SUFFIX) and not name.endswith(TRANSCRIPT_SUFFIX):
            yield name[: -len(LOG_SUFFIX)]


def _flat_sessions(root: Path) -> set[str]:
    """Ids with a file of their own in the root itself."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    found = set()
    for name in names:
        for suffix in (TRANSCRIPT_SUFFIX, LOG_SUFFIX, ARTIFACTS_SUFFIX, SPILL_SUFFIX, LOCK_SUFFIX):
            if name.endswith(suffix):
                sid = name[: -len(suffix)]
                try:
                    found.add(validate_session_id(sid))
                except InvalidSessionId:
                    pass
                break
    return found


def _unused(header: Header) -> SessionInfo:
    """A session started and never used: its header is in the index, and it has no log yet."""
    return SessionInfo(
        header.session_id,
        header.created_at,
        header.created_at,
        0,
        header.model or None,
        0,
        parent_id=header.parent_session_id,
    )


class _Line(msgspec.Struct):
    """What listing checks of a log line: that it is JSON with a ``type`` (the rest is skipped unbuilt)."""

    type: str


_line_decoder = msgspec.json.Decoder(_Line)


def _bad_line(data: bytes) -> tuple[int, str] | None:
    """The first line of a log that is not an entry, as ``(number, reason)`` — but a torn last line, which
    opening the session cuts off (design §2.3): the same rule :func:`runtime.store.log.read_log` keeps."""
    body_end = data.rfind(b"\n") + 1
    try:
        _line_decoder.decode_lines(data[:body_end])
        return None
    except (msgspec.DecodeError, UnicodeDecodeError):
        pass
    lines = data[:body_end].split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        try:
            _line_decoder.decode(line)
        except msgspec.ValidationError as exc:
            return number, f"not a valid entry ({exc})"
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            if number == len(lines) and body_end == len(data):
                return None  # a last line that is not even JSON: torn
            return number, "empty line" if not line.strip() else f"not a valid entry ({exc})"
    return None


def _summarize(session_id: str, path: Path, data: bytes, mtime: float, size: int) -> SessionInfo:
    lines = data.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is empty or a torn line
    try:
        bad = _bad_line(data)
        if bad is not None:
            raise CorruptLogError(path, bad[0], bad[1])
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
