"""Reading old history back from a session's log (design §2.2): the pages a trimmed store does not hold.

A running session keeps in memory only what its model view needs (``SessionTree.trim``); the user's view
of everything before it is in the log. :func:`page_bounds` turns a request (``offset`` messages skipped
from the newest, at most ``limit``) into positions on the path; :class:`HistoryPages` serves the part
before the store's memory from a small LRU of fixed pages, and on a miss reads only the lines of the
messages asked for, found through the session's offsets.

The offsets (:class:`_Offsets`, issue 46): for one history (a path to the store's leaf), the byte offset of
every user-view message's line (8 bytes a message) and, for the messages an overlay or a visibility change
touches, the offsets of those lines. They are built by one pass over the log that decodes only each
line's type, id and parent (a message's body is skipped, not built), then brought up to date from where
that pass stopped as the session goes on; a branch is another history and gets offsets of its own. They
are kept in an LRU bounded by offsets held (:data:`MAX_OFFSETS`, 8 MiB), shared by the sessions.

What a miss costs: the first read of a history's old pages scans its log once (a fraction of a full
replay; see the README); after that, a page costs reading its own lines (one read from its first line to
its last) and its overlays' lines, whatever its depth. A hit costs a slice of a cached page. The page
cache is bounded by messages (``max_messages``), not by sessions.
"""

from __future__ import annotations

import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

import msgspec

from runtime.errors import StoreError
from runtime.messages import Message
from runtime.store.entries import (
    FORMAT_VERSION,
    CompactionEntry,
    MessageEntry,
    OverlayEntry,
    VisibilityEntry,
    decode_entry,
)
from runtime.store.log import CorruptLogError

__all__ = ["MAX_OFFSETS", "PAGE_SIZE", "HistoryPages", "page_bounds"]

PAGE_SIZE = 256  # messages a cached page holds
MAX_MESSAGES = 8 * PAGE_SIZE  # messages the cache holds in all (every session)
READ_AHEAD = 1  # older pages read besides the ones asked for (paging goes newest to oldest)
MAX_OFFSETS: Final = 1 << 20  # offsets the histories' indexes hold in all (8 bytes each)
_CHUNK: Final = 4 * 1024 * 1024  # bytes read at a time when scanning a log

_Key = tuple[str, str, int]  # (session id, history, page number from the oldest)


def page_bounds(total: int, offset: int, limit: int | None) -> tuple[int, int]:
    """Positions ``[lo, hi)`` on a path of ``total`` messages: skip the ``offset`` newest, take at most
    ``limit`` before them (all with ``None``). Raises ``ValueError`` on a negative offset or limit."""
    if offset < 0:
        raise ValueError("offset must be >= 0")
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    hi = max(0, total - offset)
    lo = 0 if limit is None else max(0, hi - limit)
    return lo, hi


class HistoryPages:
    """Old pages of sessions' user views, read back from their logs; safe to share between threads."""

    def __init__(
        self, *, max_messages: int = MAX_MESSAGES, page_size: int = PAGE_SIZE, max_offsets: int = MAX_OFFSETS
    ) -> None:
        self.page_size = page_size
        self.max_messages = max_messages
        self._pages: OrderedDict[_Key, tuple[Message, ...]] = OrderedDict()
        self._held = 0
        self.max_offsets = max_offsets
        self._offsets: OrderedDict[tuple[str, str], _Offsets] = OrderedDict()
        self._offsets_held = 0
        self._lock = threading.Lock()
        self.reads = 0  # misses: pages read back from a log, for tests and the benchmark
        self.scans = 0  # logs scanned whole to build a history's offsets
        self.extensions = 0  # offsets brought up to date from where their scan stopped
        self.bytes_read = 0  # bytes of logs read for pages (scans not counted)

    def read(
        self,
        session_id: str,
        path: Path,
        *,
        history: str,
        leaf_id: str | None,
        before: int,
        lo: int,
        hi: int,
        settle: Callable[[], None] | None = None,
    ) -> list[Message]:
        """Messages ``[lo, hi)`` of the first ``before`` of the path (the part the store dropped), from
        the cache or the log at ``path``. ``settle`` is called before the log is read: it waits for the
        writes queued for it, so what the store dropped is on disk."""
        hi = min(hi, before)
        if lo >= hi:
            return []
        size = self.page_size
        first, last = lo // size, (hi - 1) // size
        pages: dict[int, tuple[Message, ...]] = {}
        with self._lock:
            for number in range(first, last + 1):
                page = self._pages.get((session_id, history, number))
                if page is not None and len(page) == self._page_length(number, before):
                    self._pages.move_to_end((session_id, history, number))
                    pages[number] = page
        if len(pages) < last - first + 1:
            pages.update(self._read(session_id, path, history, leaf_id, before, first, last, settle))
        out: list[Message] = []
        for number in range(first, last + 1):
            start = number * size
            out.extend(pages[number][max(lo - start, 0) : hi - start])
        return out

    def forget(self, session_id: str) -> None:
        """Drop every page and offset of ``session_id`` (it was deleted)."""
        with self._lock:
            for key in [k for k in self._pages if k[0] == session_id]:
                self._held -= len(self._pages.pop(key))
            for okey in [k for k in self._offsets if k[0] == session_id]:
                self._offsets_held -= self._offsets.pop(okey).size

    def clear_pages(self) -> None:
        """Drop every cached page (the offsets stay): for the benchmark's reads from the log."""
        with self._lock:
            self._pages.clear()
            self._held = 0

    def __len__(self) -> int:
        """Messages held."""
        return self._held

    def _page_length(self, number: int, before: int) -> int:
        return min(self.page_size, before - number * self.page_size)

    def _read(
        self,
        session_id: str,
        path: Path,
        history: str,
        leaf_id: str | None,
        before: int,
        first: int,
        last: int,
        settle: Callable[[], None] | None,
    ) -> dict[int, tuple[Message, ...]]:
        if settle is not None:
            settle()
        offsets = self._offsets_for(session_id, path, history, leaf_id, before)
        size = self.page_size
        wanted = range(max(0, first - READ_AHEAD), last + 1)
        lo, hi = wanted[0] * size, min((last + 1) * size, before)
        view, read = offsets.read(path, lo, hi)
        self.reads += 1
        self.bytes_read += read
        pages = {n: tuple(view[n * size - lo : min((n + 1) * size, before) - lo]) for n in wanted}
        with self._lock:
            for number, page in pages.items():
                key = (session_id, history, number)
                old = self._pages.pop(key, None)
                if old is not None:
                    self._held -= len(old)
                self._pages[key] = page
                self._held += len(page)
            while self._held > self.max_messages and len(self._pages) > 1:
                _, dropped = self._pages.popitem(last=False)
                self._held -= len(dropped)
        return pages

    def _offsets_for(
        self, session_id: str, path: Path, history: str, leaf_id: str | None, before: int
    ) -> _Offsets:
        """The offsets of ``history`` at ``leaf_id``: from the LRU, brought up to date, or built."""
        key = (session_id, history)
        with self._lock:
            found = self._offsets.pop(key, None)
            if found is not None:
                self._offsets_held -= found.size
        offsets = found.moved_to(path, leaf_id) if found is not None else None
        if offsets is None:
            offsets = _Offsets.build(path, leaf_id)
            self.scans += 1
        else:
            self.extensions += offsets is not found
        if len(offsets.positions) < before:
            raise StoreError(
                f"the log {path} holds {len(offsets.positions)} messages on the path, not {before}"
            )
        with self._lock:
            self._offsets[key] = offsets
            self._offsets_held += offsets.size
            while self._offsets_held > self.max_offsets and len(self._offsets) > 1:
                _, dropped = self._offsets.popitem(last=False)
                self._offsets_held -= dropped.size
        return offsets


class _Skeleton(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """What the offsets need of a log line: its node's id and parent (the rest is skipped unbuilt)."""

    v: int = FORMAT_VERSION


class _Id(msgspec.Struct, frozen=True):
    id: str


class _HeaderLine(_Skeleton, frozen=True, tag="header"):
    pass


class _MessageLine(_Skeleton, frozen=True, tag="message"):
    id: str
    parent_id: str | None


class _CompactionLine(_Skeleton, frozen=True, tag="compaction"):
    id: str
    parent_id: str | None


class _OverlayLine(_Skeleton, frozen=True, tag="overlay"):
    id: str
    parent_id: str | None = None
    replacements: list[_Id] = []


class _VisibilityLine(_Skeleton, frozen=True, tag="visibility"):
    id: str
    parent_id: str | None = None
    message_ids: list[str] = []


class _BranchLine(_Skeleton, frozen=True, tag="branch"):
    pass


class _MetadataLine(_Skeleton, frozen=True, tag="metadata"):
    pass


class _StepLine(_Skeleton, frozen=True, tag="step"):
    pass


_Line = (
    _HeaderLine
    | _MessageLine
    | _CompactionLine
    | _OverlayLine
    | _VisibilityLine
    | _BranchLine
    | _MetadataLine
    | _StepLine
)
_skeleton_decoder = msgspec.json.Decoder(_Line)
_MESSAGE: Final = 0
_SUMMARY: Final = 1
_CHANGE: Final = 2  # an overlay or a visibility change


class _Offsets:
    """Where each user-view message of one path lies in the log, and what overlays it (see the module
    docstring). Immutable once built: bringing it up to date makes a new one."""

    __slots__ = ("changes", "inode", "leaf_id", "positions", "scanned_to", "size")

    def __init__(
        self,
        positions: array[int],
        changes: dict[str, array[int]],
        leaf_id: str | None,
        scanned_to: int,
        inode: int,
    ) -> None:
        self.positions = positions  # offset of the line of each user-view message of the path, in order
        self.changes = changes  # message id -> offsets of the overlays/visibility changes of it, in order
        self.leaf_id = leaf_id
        self.scanned_to = scanned_to
        self.inode = inode
        self.size = len(positions) + sum(len(c) + 8 for c in changes.values())  # in offsets (8 bytes)

    @classmethod
    def build(cls, path: Path, leaf_id: str | None) -> _Offsets:
        nodes, end, inode = _scan(path, 0)
        if leaf_id is not None and leaf_id not in nodes:
            raise StoreError(f"the log {path} does not hold the session's leaf {leaf_id!r}")
        built = cls._extended(array("q"), {}, nodes, leaf_id, None, end, inode)
        if built is None:
            raise StoreError(f"the log {path} does not hold the path to the session's leaf {leaf_id!r}")
        return built

    def moved_to(self, path: Path, leaf_id: str | None) -> _Offsets | None:
        """These offsets for the same history at ``leaf_id`` (self if it is still the leaf; None when the
        path does not go on from this one's leaf: build anew)."""
        if leaf_id == self.leaf_id:
            return self
        nodes, end, inode = _scan(path, self.scanned_to)
        if inode != self.inode or leaf_id is None or leaf_id not in nodes:
            return None
        changes = {k: array("q", v) for k, v in self.changes.items()}
        return self._extended(array("q", self.positions), changes, nodes, leaf_id, self.leaf_id, end, inode)

    @classmethod
    def _extended(
        cls,
        positions: array[int],
        changes: dict[str, array[int]],
        nodes: dict[str, tuple[str | None, int, int, tuple[str, ...]]],
        leaf_id: str | None,
        stop: str | None,
        end: int,
        inode: int,
    ) -> _Offsets | None:
        """``positions`` and ``changes`` followed by the path from ``stop`` (exclusive) to ``leaf_id``
        through ``nodes``; None when that path does not reach ``stop``."""
        tail: list[tuple[int, int, tuple[str, ...]]] = []
        node_id = leaf_id
        while node_id is not None and node_id != stop:
            found = nodes.get(node_id)
            if found is None:
                return None  # the path leaves the lines scanned before reaching ``stop``
            parent, offset, kind, targets = found
            tail.append((offset, kind, targets))
            node_id = parent
        if node_id != stop:
            return None
        for offset, kind, targets in reversed(tail):
            if kind == _CHANGE:
                for target in targets:
                    changes.setdefault(target, array("q")).append(offset)
            else:
                positions.append(offset)
        return cls(positions, changes, leaf_id, end, inode)

    def read(self, path: Path, lo: int, hi: int) -> tuple[list[Message], int]:
        """The user-view messages ``[lo, hi)`` of the path, and the bytes read for them."""
        if lo >= hi:
            return [], 0
        wanted = self.positions[lo:hi]
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_ino != self.inode:
                raise StoreError(f"the log {path} was replaced while its history was read")
            base = wanted[0]
            data = _read_through_line(f, base, wanted[-1])
            read = len(data)
            out: list[Message] = []
            summaries: set[int] = set()  # positions in ``out`` of compaction markers (never overlaid)
            for offset in wanted:
                start = offset - base
                entry = _decode_at(path, data[start : data.index(b"\n", start)])
                if isinstance(entry, CompactionEntry):
                    summaries.add(len(out))
                    out.append(entry.summary)
                elif isinstance(entry, MessageEntry):
                    out.append(entry.message)
                else:  # pragma: no cover - the offsets are of message and compaction lines only
                    raise CorruptLogError(path, 0, f"no message at byte {offset}")
            if self.changes:
                decoded: dict[int, Any] = {}
                for i, message in enumerate(out):
                    lines = self.changes.get(message.id)
                    if lines is None or i in summaries:
                        continue
                    for offset in lines:
                        change = decoded.get(offset)
                        if change is None:
                            f.seek(offset)
                            line = f.readline()
                            read += len(line)
                            change = decoded[offset] = _decode_at(path, line)
                        message = _changed(message, change)
                    out[i] = message
        return out, read


def _changed(message: Message, change: Any) -> Message:
    """``message`` as an overlay or a visibility change leaves it (the tree's rule, design §2.2)."""
    if isinstance(change, OverlayEntry):
        for replacement in change.replacements:
            if replacement.id == message.id:
                return replacement
        return message
    if isinstance(change, VisibilityEntry):
        flags: dict[str, bool] = {}
        if change.agent_visible is not None:
            flags["agent_visible"] = change.agent_visible
        if change.user_visible is not None:
            flags["user_visible"] = change.user_visible
        return msgspec.structs.replace(message, **flags) if flags else message
    return message


def _decode_at(path: Path, line: bytes) -> Any:
    try:
        return decode_entry(line)
    except msgspec.DecodeError as exc:
        raise CorruptLogError(
            path, 0, f"a line the history's offsets point to does not decode ({exc})"
        ) from None


def _read_through_line(f: BinaryIO, start: int, last: int) -> bytes:
    """The bytes from ``start`` to the end of the line at ``last``."""
    f.seek(start)
    data = f.read(last - start)
    return data + f.readline()


def _scan(path: Path, start: int) -> tuple[dict[str, tuple[str | None, int, int, tuple[str, ...]]], int, int]:
    """The nodes of the log's complete lines from byte ``start``: id -> (parent, offset, kind, targets),
    the offset where the scan stopped, and the log's inode."""
    nodes: dict[str, tuple[str | None, int, int, tuple[str, ...]]] = {}
    with open(path, "rb") as f:
        inode = os.fstat(f.fileno()).st_ino
        position = start
        f.seek(start)
        rest = b""
        line_no = 0
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            data = rest + chunk
            end = data.rfind(b"\n") + 1
            rest = data[end:]
            at = 0
            while at < end:
                stop = data.index(b"\n", at)
                line_no += 1
                try:
                    line = _skeleton_decoder.decode(data[at:stop])
                except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                    raise CorruptLogError(
                        path, 0, f"not a log entry at byte {position + at} ({exc})"
                    ) from None
                if line.v != FORMAT_VERSION:
                    raise CorruptLogError(path, 0, f"format version {line.v} at byte {position + at}")
                if isinstance(line, _MessageLine):
                    nodes[line.id] = (line.parent_id, position + at, _MESSAGE, ())
                elif isinstance(line, _CompactionLine):
                    nodes[line.id] = (line.parent_id, position + at, _SUMMARY, ())
                elif isinstance(line, _OverlayLine):
                    targets = tuple(r.id for r in line.replacements)
                    nodes[line.id] = (line.parent_id, position + at, _CHANGE, targets)
                elif isinstance(line, _VisibilityLine):
                    nodes[line.id] = (line.parent_id, position + at, _CHANGE, tuple(line.message_ids))
                at = stop + 1
            position += end
    return nodes, position, inode
