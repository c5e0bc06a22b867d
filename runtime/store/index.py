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

Compaction (:meth:`SessionIndex.compact`): a segment's dead lines (headers a removal cancels, removals of
headers no segment holds any more) are dropped by writing its standing lines to a new file, flocked
before it is renamed over the segment, then fsynced with its folder: a kill at any point leaves either the
old segment or the new one, whole. Only the segment's owner (its flock) compacts it, on the thread that
appends to it. Readers in other processes hold byte offsets into segments: each remembers the inode it
read a segment from, and when a segment's inode changes it forgets everything and reads the index again
from the start; a line read at a remembered offset is only trusted from the inode it was found in. A
process that opened a segment before it was renamed over and then wins its flock sees that its descriptor
is no longer the segment's and tries again. A runtime compacts its own segment when its dead lines
outnumber its standing ones (and at least :data:`COMPACT_MIN_DEAD`), after a removal, and then the
segments no process holds by the same rule (:meth:`SessionIndex.compact_idle`).
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

from runtime.errors import StoreError
from runtime.store.entries import FORMAT_VERSION, Header, decode_entry
from runtime.store.log import CorruptLogError, truncate_torn_tail
from runtime.store.writer import FsyncPolicy, LogWriter, fsync_dir

__all__ = [
    "COMPACT_MIN_DEAD",
    "INDEX_DIR",
    "SEGMENT_SUFFIX",
    "IndexAppender",
    "IndexCompaction",
    "Removed",
    "SessionIndex",
    "encode_removed",
]

log = logging.getLogger("agentcell.store")

INDEX_DIR: Final = "index"
SEGMENT_SUFFIX: Final = ".jsonl"
_CHUNK: Final = 4 * 1024 * 1024  # bytes read at a time when scanning a segment
_OFFSET_BITS: Final = 40  # a place in the index: segment number << 40 | byte offset (segments < 1 TB)
_OFFSET_MASK: Final = (1 << _OFFSET_BITS) - 1
COMPACT_MIN_DEAD: Final = 1024  # dead lines a segment gathers before a runtime compacts it
_COMPACTING: Final = ".compacting"  # ``.<n>.jsonl.compacting``: a compaction's new segment before its rename
_RETRIES: Final = 64  # full re-reads a reader tries while segments keep being compacted under it


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


class IndexCompaction(msgspec.Struct, frozen=True):
    """What :meth:`SessionIndex.compact` did to one segment: its lines before and after, its bytes after."""

    segment: int
    lines_before: int
    lines_after: int
    bytes_after: int
    removals_kept: int  # removal lines kept: the header each cancels is still in another segment


class _Moved(Exception):
    """A segment was renamed over (compacted) since this reader last read it: read everything again."""


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
        self._inodes: dict[int, int] = {}  # segment number -> the inode its offsets above refer to
        self._standing: dict[int, int] = {}  # segment number -> its headers that stand
        self._floor = 0  # dead lines the last compaction of this process's segment had to keep
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
                fd = _lock_segment(path)
                if fd >= 0:
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
        writer, in order with the headers it queued. The claim is released again if it was taken here,
        after compacting the segment if its dead lines outnumber its live ones.
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
            if taken:
                try:
                    if self.worth_compacting():
                        self.compact()
                except Exception:  # the segment stands whole: nothing is lost, a later append tries again
                    log.exception("sessions index %s: compaction failed", path)
        finally:
            if taken:
                self.release()

    # -- reading ---------------------------------------------------------------------------------------------

    def lookup(self, session_id: str) -> tuple[Header, bytes] | None:
        """The standing header of ``session_id`` and its line, or None when the index has none."""
        for _ in range(_RETRIES):
            with self._lock:
                self._refresh()
                place = self._places.get(session_id)
                inode = self._inodes.get(place >> _OFFSET_BITS) if place is not None else None
            if place is None:
                return None
            line = self._line_at(place, inode)
            if line is None:  # compacted since: the next refresh sees it and reads the index again
                continue
            entry = decode_entry(line)
            if not isinstance(entry, Header) or entry.session_id != session_id:  # pragma: no cover - a bug
                raise CorruptLogError(
                    self._segment_path(place >> _OFFSET_BITS), 0, f"no header of {session_id} here"
                )
            return entry, line
        raise StoreError(f"sessions index {self.folder}: its segments kept being compacted while read")

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
        for _ in range(_RETRIES):
            with self._lock:
                self._refresh()
                places = sorted(self._places.values())
                inodes = dict(self._inodes)
            found = self._headers_at(places, inodes)
            if found is not None:
                yield from found
                return
        raise StoreError(f"sessions index {self.folder}: its segments kept being compacted while read")

    def _headers_at(self, places: list[int], inodes: dict[int, int]) -> list[Header] | None:
        """The headers at ``places``, or None when a segment is no longer the inode they were read from."""
        found: list[Header] = []
        for segment, group in itertools.groupby(places, key=lambda p: p >> _OFFSET_BITS):
            path = self._segment_path(segment)
            try:
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_ino != inodes.get(segment):
                        return None
                    for place in group:
                        f.seek(place & _OFFSET_MASK)
                        entry = decode_entry(f.readline())
                        if isinstance(entry, Header):
                            found.append(entry)
            except FileNotFoundError:
                continue
        return found

    def children(self, parent_id: str) -> list[str]:
        """Ids of the sessions whose header names ``parent_id`` as their parent, oldest first."""
        with self._lock:
            self._refresh()
            return list(self._children.get(parent_id, ()))

    def forget(self, session_id: str) -> None:
        """Drop the id from this process's map (its removal is being appended)."""
        with self._lock:
            place = self._places.pop(session_id, None)
            if place is not None:
                self._stand(place, -1)
            self._unparent(session_id)

    def _stand(self, place: int, change: int) -> None:
        segment = place >> _OFFSET_BITS
        self._standing[segment] = self._standing.get(segment, 0) + change

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

    def _line_at(self, place: int, inode: int | None) -> bytes | None:
        """The line at ``place`` if its segment is still the file of ``inode`` (else None: compacted)."""
        path = self._segment_path(place >> _OFFSET_BITS)
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_ino != inode:
                    return None
                f.seek(place & _OFFSET_MASK)
                return f.readline()
        except FileNotFoundError:
            return None

    def _segments(self) -> list[int]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        numbers = (name[: -len(SEGMENT_SUFFIX)] for name in names if name.endswith(SEGMENT_SUFFIX))
        return sorted(int(n) for n in numbers if n.isdigit())

    def _refresh(self) -> None:
        """Read what was appended to every segment since the last look (under ``self._lock``); everything
        again from the start when a segment was compacted since."""
        for _ in range(_RETRIES):
            try:
                for number in self._segments():
                    self._scan(number)
                return
            except _Moved:
                self._reset()
        raise StoreError(f"sessions index {self.folder}: its segments kept being compacted while read")

    def _reset(self) -> None:
        """Forget everything read (under ``self._lock``): the next refresh reads every segment again."""
        self._places.clear()
        self._removals.clear()
        self._read_to.clear()
        self._lines.clear()
        self._inodes.clear()
        self._standing.clear()
        self._children.clear()
        self._parents.clear()

    def _scan(self, number: int) -> None:
        path = self._segment_path(number)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            stat = os.fstat(fd)
            known = self._inodes.get(number)
            if known is not None and known != stat.st_ino:
                raise _Moved
            self._inodes[number] = stat.st_ino
            size = stat.st_size
            start = self._read_to.get(number, 0)
            if size < start:  # cut since (a torn line its new owner removed): read everything again
                raise _Moved
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
                    self._stand(place, -1)
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
                    old = places.get(sid)
                    if old is not None:
                        self._stand(old, -1)
                    places[sid] = base | (offset + start)
                    self._standing[number] = self._standing.get(number, 0) + 1
                    self._unparent(sid)  # (a header of an id started again replaces the earlier one)
                    if key.parent_session_id is not None:
                        self._parents[sid] = key.parent_session_id
                        self._children.setdefault(key.parent_session_id, {})[sid] = None
            start = end + 1
        return line_no

    def _created_at(self, place: int) -> float:
        line = self._line_at(place, self._inodes.get(place >> _OFFSET_BITS))
        if line is None:
            raise _Moved
        key = _key_decoder.decode(line)
        return float(key.created_at)

    # -- compaction ------------------------------------------------------------------------------------------

    def worth_compacting(self) -> bool:
        """Whether this process's segment holds more dead lines than standing headers (and at least
        :data:`COMPACT_MIN_DEAD` more than its last compaction had to keep)."""
        claimed = self._claimed
        if claimed is None:
            return False
        number = int(os.path.basename(claimed)[: -len(SEGMENT_SUFFIX)])
        with self._lock:
            self._refresh()
            standing = self._standing.get(number, 0)
            dead = self._lines.get(number, 0) - standing - self._floor
        return dead >= max(COMPACT_MIN_DEAD, standing)

    def compact_idle(self) -> list[IndexCompaction]:
        """Compact the segments no process holds (a runtime's that is gone, a command's) whose dead lines
        outnumber their standing headers, and are at least :data:`COMPACT_MIN_DEAD`: what was done."""
        own = self._claimed if self._claim_pid == os.getpid() else None
        with self._lock:
            self._refresh()
            candidates = [
                number
                for number, lines in self._lines.items()
                if self._segment_path(number) != own
                and lines - self._standing.get(number, 0)
                >= max(COMPACT_MIN_DEAD, self._standing.get(number, 0))
            ]
        done = [self.compact(number) for number in sorted(candidates)]  # (None: held by a live process)
        return [d for d in done if d is not None]

    def compact(self, number: int | None = None) -> IndexCompaction | None:
        """Drop the dead lines of a segment: this process's own (``None``, claimed if need be) or segment
        ``number``, if no process holds it. Returns what was done, or None when there was nothing to drop or
        another process holds the segment.

        Call it where this process appends to its segment (a runtime: on its log writer's thread, through
        ``LogWriter.call`` on the segment's path), so no append goes to the file being replaced.
        """
        if number is None:
            path = self.claim()
            fd = self._claim_fd
            own = True
            number = int(os.path.basename(path)[: -len(SEGMENT_SUFFIX)])
        else:
            path = self._segment_path(number)
            own = path == self._claimed and self._claim_pid == os.getpid()
            if own:
                fd = self._claim_fd
            else:
                if not os.path.exists(path):
                    return None
                fd = _lock_segment(path)
                if fd < 0:
                    return None
                if truncate_torn_tail(path):  # its last owner is gone (the lock says so)
                    log.warning("sessions index %s: cut a torn last line (a crash mid-append)", path)
        try:
            done, new_fd = _compact_segment(self.folder, number, fd, self._segments())
        except BaseException:
            if not own:
                os.close(fd)
            raise
        if own:
            if new_fd >= 0:
                with self._lock:
                    self._claim_fd = new_fd  # the lock now held is the new file's
                    if done is not None:
                        self._floor = done.removals_kept
                os.close(fd)
        else:
            if new_fd >= 0:
                os.close(new_fd)
            os.close(fd)
        if done is not None:
            log.info(
                "sessions index %s: compacted, %d lines -> %d", path, done.lines_before, done.lines_after
            )
        return done


def _lock_segment(path: str) -> int:
    """Open segment ``path`` (created if missing) and take its ``flock``; -1 when another process holds it.

    A descriptor opened before a compaction renamed a new file over the path holds the old file: its lock
    means nothing, so the path is opened again until the lock taken is the segment's own.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except BlockingIOError:
            os.close(fd)
            return -1
        except FileNotFoundError:
            pass  # (renamed over between the two stats: open it again)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _complete_lines(fd: int) -> bytes:
    """A segment's complete lines (a last line without its newline is still being appended: left out)."""
    size = os.fstat(fd).st_size
    parts = []
    position = 0
    while position < size:
        chunk = os.pread(fd, min(_CHUNK, size - position), position)
        if not chunk:
            break
        parts.append(chunk)
        position += len(chunk)
    data = b"".join(parts)
    return data[: data.rfind(b"\n") + 1]


def _keys(path: str, data: bytes) -> Iterator[tuple[_Key | Removed, bytes]]:
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            yield _key_decoder.decode(line), line
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise CorruptLogError(path, number, f"not a valid index entry ({exc})") from None


def _compact_segment(
    folder: Path, number: int, fd: int, segments: list[int]
) -> tuple[IndexCompaction | None, int]:
    """Rewrite segment ``number`` (its flock held through ``fd``) without its dead lines.

    A header is dead when a removal of it (its id and creation time) is in any segment; a removal is dead
    unless its header is still in another segment (the one here goes with it). Returns what was done and a
    descriptor of the new segment holding its flock (None and -1: nothing to drop).
    """
    path = os.fspath(folder / f"{number}{SEGMENT_SUFFIX}")
    own = _complete_lines(fd)
    lines = list(_keys(path, own))
    removals: set[tuple[str, float]] = set()
    own_removals: set[tuple[str, float]] = set()
    for key, _ in lines:
        if isinstance(key, Removed):
            own_removals.add((key.session_id, key.created_at))
    removals |= own_removals
    elsewhere: set[tuple[str, float]] = set()  # headers of other segments an own removal cancels
    for other in segments:
        if other == number:
            continue
        other_path = os.fspath(folder / f"{other}{SEGMENT_SUFFIX}")
        try:
            other_fd = os.open(other_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            data = _complete_lines(other_fd)
        finally:
            os.close(other_fd)
        for key, _ in _keys(other_path, data):
            pair = (key.session_id, key.created_at)
            if isinstance(key, Removed):
                removals.add(pair)
            elif pair in own_removals:
                elsewhere.add(pair)
    kept: list[bytes] = []
    removals_kept = 0
    for key, line in lines:
        pair = (key.session_id, key.created_at)
        if isinstance(key, Removed):
            if pair in elsewhere:
                kept.append(line)
                removals_kept += 1
        elif pair not in removals:
            kept.append(line)
    if len(kept) == len(lines):
        return None, -1
    body = b"".join(kept)
    tmp = os.fspath(folder / f".{number}{SEGMENT_SUFFIX}{_COMPACTING}")
    new_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (a file nobody else knows yet)
        view = memoryview(body)
        while view:
            view = view[os.write(new_fd, view) :]
        os.fsync(new_fd)
        _replace(tmp, path)
        fsync_dir(os.fspath(folder))
    except BaseException:
        os.close(new_fd)
        raise
    done = IndexCompaction(
        segment=number,
        lines_before=len(lines),
        lines_after=len(kept),
        bytes_after=len(body),
        removals_kept=removals_kept,
    )
    return done, new_fd


def _replace(source: str, target: str) -> None:
    """``os.replace`` (a seam for the tests that kill a compaction at this point)."""
    os.replace(source, target)


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
