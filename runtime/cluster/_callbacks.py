"""The callbacks of a front's subscriptions, run by a shared pool of threads (design §10.2).

On one ``Runtime`` a callback subscription has a thread of its own. A front relays the events of every shard
in batches: waking a thousand subscribers' threads for each batch costs each of them a thread switch and a
turn at the GIL, the thread that reads the shards' connections waits for the GIL behind all of them, and what
the shards write meanwhile waits on the connections (tens to hundreds of milliseconds at a thousand sessions
streaming). Here a subscription with events to read is queued for a pool (one thread, more while callbacks are
slow), which runs its callback for what it has and goes on to the next.

A slow callback still only makes its own subscriber lag: while a callback has run for :data:`SLOW_AFTER`
seconds the pool has a thread more (it ends once idle), and a callback that has run for :data:`OWN_AFTER`
seconds keeps its thread from then on (its subscription read by that thread alone, as on one ``Runtime``).
The other subscriptions wait at most about :data:`SLOW_AFTER` seconds for a free thread, while up to
:data:`MOST` callbacks block at once.

A :class:`~runtime.bus.Subscription` is driven through its waiter, as the bus's own readers are: when it has
nothing left to read, its waiter is set to queue it again, and the bus calls the waiter (under its lock) once
events or a lag notice arrive, or once it ends.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from itertools import count

from runtime.bus import Subscription
from runtime.events import Event

__all__ = ["Callbacks"]

log = logging.getLogger("agentcell.cluster")

WORKERS = 1
"""Threads that run callbacks (more would only take turns at the GIL with the thread that reads the shards;
while a callback is slow the pool has more)."""
SLOW_AFTER = 0.05
"""Seconds a callback may run before the pool starts another thread (a busy machine alone can take that
long to run one: the thread ends again once idle)."""
OWN_AFTER = 1.0
"""Seconds a callback may run before its subscription gets a thread of its own (it blocks: on I/O, a lock)."""
MOST = 64
"""Threads the pool starts at most beside its :data:`WORKERS` while callbacks are slow."""
TURN = 256
"""Events a subscription's callback is given in a row before the next subscription's turn."""
IDLE = 1.0
"""Seconds a thread waits for work before it checks whether any subscription is left (else it ends)."""

_names = count(1)


class _Driven:
    """A subscription and its callback, queued whenever it has events to read."""

    __slots__ = ("arm", "callback", "pool", "sub")

    def __init__(self, pool: Callbacks, sub: Subscription, callback: Callable[[Event], object]) -> None:
        self.pool = pool
        self.sub = sub
        self.callback = callback
        self.arm = self._queue  # (one bound method, set as the waiter every time)

    def _queue(self) -> None:
        self.pool._ready.put(self)


class _Worker:
    __slots__ = ("detached", "helped", "since", "thread")

    def __init__(self) -> None:
        self.since = 0.0  # when the callback running now began (0: none is running)
        self.helped = 0.0  # the ``since`` of the callback for which another thread was started
        self.detached = False  # replaced in the pool: it keeps the subscription whose callback is slow
        self.thread: threading.Thread | None = None


class Callbacks:
    """Runs the callbacks of subscriptions on a few threads, started with the first and ended when idle."""

    def __init__(self, workers: int = WORKERS, slow_after: float = SLOW_AFTER) -> None:
        self.workers = workers
        self.slow_after = slow_after
        self._ready: queue.SimpleQueue[_Driven] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pool: list[_Worker] = []
        self._watching = False
        self._live = 0  # subscriptions driven and not ended
        self.detached = 0
        """Subscriptions given a thread of their own (their callbacks ran :data:`OWN_AFTER` seconds)."""

    def drive(self, sub: Subscription, callback: Callable[[Event], object]) -> None:
        """Call ``callback(event)`` for each of ``sub``'s events, in order, on the pool's threads."""
        driven = _Driven(self, sub, callback)
        sub._driven = True
        with self._lock:
            self._live += 1
            while len(self._pool) < self.workers:
                self._spawn()
        with sub._lock:
            if sub._queue or sub._notices or sub._lost is not None or sub.closed:
                queued = True
            else:
                sub._waiter = driven.arm
                queued = False
        if queued:
            self._ready.put(driven)

    # -- the pool's threads -----------------------------------------------------------------------------
    def _spawn(self) -> None:
        """Start a thread (lock held)."""
        worker = _Worker()
        worker.thread = threading.Thread(
            target=self._work, args=(worker,), name=f"cluster-callbacks-{next(_names)}", daemon=True
        )
        self._pool.append(worker)
        worker.thread.start()
        if not self._watching:
            self._watching = True
            threading.Thread(target=self._watch, name="cluster-callbacks-watch", daemon=True).start()

    def _work(self, worker: _Worker) -> None:
        ready = self._ready
        while True:
            try:
                driven = ready.get(timeout=IDLE)
            except queue.Empty:
                with self._lock:
                    if self._live and len(self._pool) <= self.workers:
                        continue
                    self._pool.remove(worker)  # (idle: no subscription is left, or it was an extra)
                    return
            try:
                kept = self._run(worker, driven)
            except BaseException:  # (past the callback's own Exception: its subscription is read no more,
                with self._lock:  # as a bus callback thread's would not be; another thread takes this place)
                    self._live -= 1
                    if worker in self._pool:
                        self._pool.remove(worker)
                        self._spawn()
                raise
            if kept:
                self._own(driven)
            if worker.detached:
                return  # (another thread has taken its place in the pool)

    def _run(self, worker: _Worker, driven: _Driven) -> bool:
        """Run ``driven``'s callback for what it has (up to :data:`TURN` events), then arm it or queue it
        again; True if, its callback slow, this thread keeps it instead."""
        sub, callback = driven.sub, driven.callback
        clock = time.monotonic
        for _ in range(TURN):
            if sub._lost is None and not sub._notices:  # (the fast path of Subscription.get)
                try:
                    event: Event | None = sub._queue.popleft()
                except IndexError:
                    event = None
            else:
                event = sub._take_notice()
                if event is None:
                    continue
            if event is None:
                with sub._lock:  # publishers append under it: nothing slips in unseen
                    if sub._queue or sub._lost is not None or sub._notices:
                        continue
                    if not sub.closed:
                        sub._waiter = driven.arm
                        return False
                self._ended()
                return False
            worker.since = clock()
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber callback %r failed on %s", callback, event.type)
            worker.since = 0.0
            if worker.detached:
                return True
        self._ready.put(driven)  # (more to read: after the others' turns)
        return False

    def _own(self, driven: _Driven) -> None:
        """This thread keeps ``driven``'s subscription (its callback was slow): read it as the bus's callback
        threads read theirs, until it ends."""
        sub, callback = driven.sub, driven.callback
        for event in sub:
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber callback %r failed on %s", callback, event.type)
        self._ended()

    def _ended(self) -> None:
        with self._lock:
            self._live -= 1

    def _watch(self) -> None:
        """For a callback running :data:`SLOW_AFTER` seconds start another thread; one running
        :data:`OWN_AFTER` seconds keeps its thread, out of the pool."""
        while True:
            time.sleep(self.slow_after / 2)
            with self._lock:
                if not self._pool:
                    self._watching = False
                    return
                now = time.monotonic()
                for worker in list(self._pool):
                    since = worker.since
                    if not since or worker.detached:
                        continue
                    if now - since >= OWN_AFTER:
                        worker.detached = True
                        self.detached += 1
                        self._pool.remove(worker)
                        if len(self._pool) < self.workers:
                            self._spawn()
                    elif now - since >= self.slow_after and worker.helped != since:
                        worker.helped = since
                        if len(self._pool) < self.workers + MOST:
                            self._spawn()
