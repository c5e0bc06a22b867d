"""The sessions index: the header of every started session, in a few append-only files (issue 32).

A new session costs no file of its own: its header is one line appended to the index, and its log file is
created when it first has an entry to keep (its first message). Lookups check the session's log first and
the index after, so a session is found the same way before and after its first message.

Layout, under ``<sessions>/index/``::

    0.jsonl, 1.jsonl, ...       segments: header lines (the log's own first-line format) and removals

Each runtime appends to one segment of its own, claimed with an exclusive ``flock`` held as long as it
runs: two processes sharing a sessions directory (the shards of a cluster) never write the same file, so a
crash can only tear the last line of its own segment. The next runtime to claim that segment cuts the torn
line off (and logs it); readers skip a last line without its newline, whoever owns the segment.

Deleting a session appends a :class:`Removed` line naming the header it removes (its id and creation
time), so an id started again later is not removed with it. A line that does not decode, other than a torn
last line, raises :class:`~runtime.store.log.CorruptLogError` naming the segment and the line.

Readers keep, per process, a map of id to the line's place, built on the first lookup and brought up to
date from where each segment was last read: an index of a million sessions is read once, not per lookup.
Beside it, a map of parent to sub-agent sessions (the headers that name a parent), so the children of a
session are found without reading any log.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import msgspec

from runtime.store.entries import FORMAT_VERSION, Header, decode_entry
from runtime.store.log import CorruptLogError, truncate_torn_tail
from runtime.store.writer import FsyncPolicy, LogWriter

__all__ = ["INDEX_DIR", "SEGMENT_SUFFIX", "IndexAppender", "Removed", "SessionIndex", "encode_removed"]

log = logging.getLogger("agentcell.store")

INDEX_DIR: Final = "index"
SEGMENT_SUFFIX: Final = ".jsonl"
_CHUNK: Final = 4 * 1024 * 1024  # bytes read at a time when scanning a segment
_OFFSET_BITS: Final = 40  # a place in the index: segment number << 40 | byte offset (segments < 1 TB)


class Removed(msgspec.Struct, frozen=True, kw_only=True, tag="removed", tag_field="type"):
    """An index line: the session's header of ``created_at`` no longer stands (the session was deleted)."""

    v: int = FORMAT_VERSION
    session_id: str
    created_at: float


class _Key(msgspec.Struct, frozen=True, kw_only=True, tag="header", tag_field="type"):
    """What a scan needs of a header line (the rest of it is not decoded)."""

    v: int = FORMAT_VERSION
    session_id: str
    created_at: float = 0.0
    parent_session_id: str | None = None


_key_decoder = msgspec.json.Decoder(_Key | Removed)
_encoder = msgspec.json.Encoder()


def encode_removed(session_id: str, created_at: float) -> bytes:
    """The index line that removes the header of ``session_id`` created at ``created_at``."""
    return _encoder.encode(Removed(session_id=session_id, created_at=created_at)) + b"\n"


class SessionIndex:
    """The index of one sessions directory (see the module docstring). Thread-safe."""

    def __init__(self, root: Path) -> None:
        self.folder = root / INDEX_DIR
        self._lock = threading.Lock()
        self._claim_fd = -1
        self._claim_pid = 0
        self._claimed: str | None = None
        self._places: dict[str, int] = {}  # session id -> segment << 40 | offset of its standing header
        self._removals: dict[str, set[float]] = {}  # removals met before the header they remove
        self._read_to: dict[int, int] = {}  # segment number -> bytes read so far
        self._lines: dict[int, int] = {}  # segment number -> complete lines read so far
        self._children: dict[str, dict[str, None]] = {}  # parent id -> its sub-agents' ids, oldest first
        self._parents: dict[str, str] = {}  # sub-agent id -> its parent's id

    # -- the segment this process appends to -------------------------------------------------------------

    def claim(self) -> str:
        """The path of this process's own segment, claimed on first use (a torn last line is cut off)."""
        claimed = self._claimed
        if claimed is not None and self._claim_pid == os.getpid():
            return claimed
        with self._lock:
            if self._claimed is not None and self._claim_pid == os.getpid():
                return self._claimed
            self.folder.mkdir(parents=True, exist_ok=True)
            for number in itertools.count():
                path = os.fspath(self.folder / f"{number}{SEGMENT_SUFFIX}")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                except BaseException:
                    os.close(fd)
                    raise
                break
            torn = truncate_torn_tail(path)  # its last owner is gone (the lock says so): repair is safe
            if torn:
                log.warning(
                    "sessions index %s: cut a torn last line of %d bytes (a crash mid-append)", path, torn
                )
                self._read_to.pop(number, None)
                self._lines.pop(number, None)
            self._claim_fd, self._claim_pid, self._claimed = fd, os.getpid(), path
            return path

    def release(self) -> None:
        """Let another process claim this process's segment (after its last append is written)."""
        with self._lock:
            fd, pid = self._claim_fd, self._claim_pid
            self._claim_fd, self._claim_pid, self._claimed = -1, 0, None
            if fd >= 0 and pid == os.getpid():
                os.close(fd)

    def append_now(self, data: bytes) -> None:
        """Append ``data`` (whole lines) to this process's segment and fsync it, on the caller's thread.

        For processes without a log writer (``agentcell sessions delete``); a runtime appends through its
        writer, in order with the headers it queued. The claim is released again if it was taken here.
        """
        taken = self._claimed is None
        path = self.claim()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            if taken:
                self.release()

    # -- reading ---------------------------------------------------------------------------------------------

    def lookup(self, session_id: str) -> tuple[Header, bytes] | None:
        """The standing header of ``session_id`` and its line, or None when the index has none."""
        with self._lock:
            self._refresh()
            place = self._places.get(session_id)
        if place is None:
            return None
        line = self._line_at(place)
        entry = decode_entry(line)
        if not isinstance(entry, Header) or entry.session_id != session_id:  # pragma: no cover - a bug
            raise CorruptLogError(
                self._segment_path(place >> _OFFSET_BITS), 0, f"no header of {session_id} here"
            )
        return entry, line

    def __contains__(self, session_id: object) -> bool:
        with self._lock:
            self._refresh()
            return session_id in self._places

    def ids(self) -> list[str]:
        """The ids with a standing header, in no particular order."""
        with self._lock:
            self._refresh()
            return list(self._places)

    def headers(self) -> Iterator[Header]:
        """Every standing header (read from the disk again; for listing)."""
        with self._lock:
            self._refresh()
            places = sorted(self._places.values())
        for segment, group in itertools.groupby(places, key=lambda p: p >> _OFFSET_BITS):
            path = self._segment_path(segment)
            try:
                with open(path, "rb") as f:
                    for place in group:
                        f.seek(place & ((1 << _OFFSET_BITS) - 1))
                        entry = decode_entry(f.readline())
                        if isinstance(entry, Header):
                            yield entry
            except FileNotFoundError:
                continue

    def children(self, parent_id: str) -> list[str]:
        """Ids of the sessions whose header names ``parent_id`` as their parent, oldest first."""
        with self._lock:
            self._refresh()
            return list(self._children.get(parent_id, ()))

    def forget(self, session_id: str) -> None:
        """Drop the id from this process's map (its removal is being appended)."""
        with self._lock:
            self._places.pop(session_id, None)
            self._unparent(session_id)

    def _unparent(self, session_id: str) -> None:
        parent = self._parents.pop(session_id, None)
        if parent is not None:
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.pop(session_id, None)
                if not siblings:
                    del self._children[parent]

    def _segment_path(self, number: int) -> str:
        return os.fspath(self.folder / f"{number}{SEGMENT_SUFFIX}")

    def _line_at(self, place: int) -> bytes:
        path = self._segment_path(place >> _OFFSET_BITS)
        with open(path, "rb") as f:
            f.seek(place & ((1 << _OFFSET_BITS) - 1))
            return f.readline()

    def _segments(self) -> list[int]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        numbers = (name[: -len(SEGMENT_SUFFIX)] for name in names if name.endswith(SEGMENT_SUFFIX))
        return sorted(int(n) for n in numbers if n.isdigit())

    def _refresh(self) -> None:
        """Read what was appended to every segment since the last look (under ``self._lock``)."""
        for number in self._segments():
            self._scan(number)

    def _scan(self, number: int) -> None:
        path = self._segment_path(number)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            start = self._read_to.get(number, 0)
            if size < start:  # cut since (a torn line its new owner removed): read the cut part again
                start = 0
                self._lines[number] = 0
            line_no = self._lines.get(number, 0)
            position = start
            rest = b""
            while position + len(rest) < size:
                chunk = os.pread(fd, min(_CHUNK, size - position - len(rest)), position + len(rest))
                if not chunk:
                    break
                data = rest + chunk
                end = data.rfind(b"\n") + 1
                if end == 0:
                    rest = data
                    continue
                line_no = self._take(number, path, data[:end], position, line_no)
                position += end
                rest = data[end:]
            self._read_to[number] = position  # a last line without its newline is read again next time
            self._lines[number] = line_no
        finally:
            os.close(fd)

    def _take(self, number: int, path: str, body: bytes, offset: int, line_no: int) -> int:
        base = number << _OFFSET_BITS
        start = 0
        places, removals = self._places, self._removals
        while start < len(body):
            end = body.index(b"\n", start)
            line_no += 1
            try:
                key = _key_decoder.decode(body[start:end])
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                raise CorruptLogError(path, line_no, f"not a valid index entry ({exc})") from None
            sid = key.session_id
            if isinstance(key, Removed):
                place = places.get(sid)
                if place is not None and self._created_at(place) == key.created_at:
                    del places[sid]
                    self._unparent(sid)
                else:
                    removals.setdefault(sid, set()).add(key.created_at)
            else:
                gone = removals.get(sid)
                if gone is not None and key.created_at in gone:
                    gone.discard(key.created_at)
                    if not gone:
                        del removals[sid]
                else:
                    places[sid] = base | (offset + start)
                    self._unparent(sid)  # (a header of an id started again replaces the earlier one)
                    if key.parent_session_id is not None:
                        self._parents[sid] = key.parent_session_id
                        self._children.setdefault(key.parent_session_id, {})[sid] = None
            start = end + 1
        return line_no

    def _created_at(self, place: int) -> float:
        key = _key_decoder.decode(self._line_at(place))
        return float(key.created_at)


class IndexAppender:
    """Queues the header lines of new sessions for the log writer: one writer operation takes every line
    queued since the last one, so a million starts cost a few hundred writes, not a million.

    ``fsync`` is the writer policy for the index (``"always"`` under the runtime's ``turn``: a round of
    starts is made durable as it is written, the way a turn's end is). ``on_error(ids, error)`` is told the
    sessions whose headers a failed write lost (on the writer thread).
    """

    def __init__(
        self,
        index: SessionIndex,
        writer: LogWriter,
        *,
        fsync: FsyncPolicy,
        on_error: Callable[[list[str], Exception], None],
    ) -> None:
        self.index = index
        self.writer = writer
        self.fsync = fsync
        self.on_error = on_error
        self._lock = threading.Lock()
        self._pending: list[bytes] | None = None
        self._ids: list[str] = []
        self._taken: list[list[str]] = []  # ids of each taken batch, oldest first, until its write is done

    def add(self, session_id: str, line: bytes) -> None:
        """Queue one header line (the writer appends it within ``persistence.transcript_delay``)."""
        with self._lock:
            if self._pending is not None:
                self._pending.append(line)
                self._ids.append(session_id)
                return
            self._pending, self._ids = [line], [session_id]
        path = self.index.claim()
        self.writer.append_from(path, self._take, self._done, fsync=self.fsync, lazy=True)

    def _take(self, _path: str) -> bytes:
        with self._lock:
            lines, self._pending = self._pending or [], None
            ids, self._ids = self._ids, []
            self._taken.append(ids)
        return b"".join(lines)

    def _done(self, error: Exception | None) -> None:
        with self._lock:
            ids = self._taken.pop(0) if self._taken else []
        if error is not None and ids:
            self.on_error(ids, error)
