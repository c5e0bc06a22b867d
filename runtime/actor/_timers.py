"""Timers: one thread and a heap per dispatcher, for cheap actor timeouts."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from runtime.affinity import place_thread
from runtime.errors import DispatcherClosed

__all__ = ["TimerHandle", "Timers"]

logger = logging.getLogger("agentcell.actor")


def _nothing() -> None:
    pass


class TimerHandle:
    """A scheduled call from :meth:`Dispatcher.call_later`; :meth:`cancel` it if it is no longer needed."""

    __slots__ = ("_fn", "_timers", "cancelled", "when")

    def __init__(self, when: float, fn: Callable[[], None], timers: Timers) -> None:
        self.when = when
        self._fn = fn
        self._timers = timers
        self.cancelled = False

    def cancel(self) -> None:
        self._timers.cancel(self)

    def __lt__(self, other: TimerHandle) -> bool:
        return self.when < other.when


class Timers:
    """One thread and a heap: cheap timeouts for actors (callbacks should only ``tell``)."""

    def __init__(self, name: str, cpus: frozenset[int] | None = None) -> None:
        self._name = name
        self._cpus = cpus
        self._heap: list[TimerHandle] = []
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cancelled = 0  # cancelled handles still in the heap

    def call_later(self, delay: float, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(time.monotonic() + max(0.0, delay), fn, self)
        with self._cond:
            if self._closed:
                raise DispatcherClosed("the dispatcher's timers are shut down")
            self._sweep()
            heapq.heappush(self._heap, handle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self._name}-timers", daemon=True)
                self._thread.start()
            elif self._heap[0] is handle:
                self._cond.notify()
        return handle

    def cancel(self, handle: TimerHandle) -> None:
        with self._cond:
            if not handle.cancelled:
                handle.cancelled = True
                # what it would have called (an actor's ref) is let go now, not when it falls due
                handle._fn = _nothing
                self._cancelled += 1
                self._sweep()

    def _sweep(self) -> None:
        """Drop the cancelled handles once they are most of the heap (under the lock): amortized O(1) a
        handle, and a stopped actor's timers (its shutdown timeouts) do not outlive it by their delay."""
        if self._cancelled > 64 and 2 * self._cancelled > len(self._heap):
            self._heap = [h for h in self._heap if not h.cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify()

    def _run(self) -> None:
        place_thread(self._cpus)
        while True:
            with self._cond:
                due: list[TimerHandle] = []
                while not due:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0].when - time.monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    while self._heap and self._heap[0].when <= time.monotonic():
                        handle = heapq.heappop(self._heap)
                        if handle.cancelled:
                            self._cancelled -= 1
                        else:
                            due.append(handle)
            for handle in due:
                if handle.cancelled:
                    continue
                try:
                    handle._fn()
                except Exception:
                    logger.exception("timer callback %r failed", handle._fn)
