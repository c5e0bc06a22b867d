"""Reading old history back from a session's log (design §2.2): the pages a trimmed store does not hold.

A running session keeps in memory only what its model view needs (``SessionTree.trim``); the user's view
of everything before it is in the log. :func:`page_bounds` turns a request (``offset`` messages skipped
from the newest, at most ``limit``) into positions on the path; :class:`HistoryPages` serves the part
before the store's memory from a small LRU of fixed pages, and on a miss reads the log once, replays it,
takes the user's view at the store's leaf and keeps the pages around what was asked.

What a miss costs: one read and replay of the whole log (its size; about a millisecond per 200 turns on
the reference machine, see the README), on the caller's thread, never an actor's. What a hit costs: a
slice of a cached page. The cache is bounded by messages (``max_messages``), not by sessions.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from runtime.errors import StoreError
from runtime.messages import Message
from runtime.store.log import read_log, replay

__all__ = ["PAGE_SIZE", "HistoryPages", "page_bounds"]

PAGE_SIZE = 256  # messages a cached page holds
MAX_MESSAGES = 8 * PAGE_SIZE  # messages the cache holds in all (every session)
READ_AHEAD = 4  # older pages kept from a read besides the ones asked for (paging goes newest to oldest)

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

    def __init__(self, *, max_messages: int = MAX_MESSAGES, page_size: int = PAGE_SIZE) -> None:
        self.page_size = page_size
        self.max_messages = max_messages
        self._pages: OrderedDict[_Key, tuple[Message, ...]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.reads = 0  # logs read back (misses), for tests and the benchmark

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
        """Drop every page of ``session_id`` (it was deleted)."""
        with self._lock:
            for key in [k for k in self._pages if k[0] == session_id]:
                self._held -= len(self._pages.pop(key))

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
        entries, _ = read_log(path, repair=False)
        tree = replay(path, entries)
        if leaf_id is not None and leaf_id not in tree:
            raise StoreError(f"the log {path} does not hold the session's leaf {leaf_id!r}")
        tree.branch(leaf_id)  # the path the store answered for (the log may have moved on since)
        view = tree.messages()
        if len(view) < before:
            raise StoreError(f"the log {path} holds {len(view)} messages on the path, not {before}")
        self.reads += 1
        size = self.page_size
        wanted = range(max(0, first - READ_AHEAD), last + 1)
        pages = {n: tuple(view[n * size : min((n + 1) * size, before)]) for n in wanted}
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
