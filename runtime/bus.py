"""The event bus (design §1.4): typed events fanned out to subscribers that can never slow the runtime down.

:meth:`EventBus.publish` stamps an event with its session's next ``seq`` and the time, hands it to the
sinks (synchronously, in publish order — the transcript writer is one), and appends it to the bounded
queue of every matching subscriber. It never waits for a subscriber: a subscriber that falls
``queue_size`` events behind loses its oldest events, and before the next event it reads it receives one
:class:`~runtime.events.SubscriberLagged` per session that lost events, saying how many.

Publishers append under the bus lock; a reader takes events off its queue without it (a deque's appends
and pops are thread-safe) and takes the lock only to go to sleep on an empty queue or to collect lag
notices. A reader thread woken for new events therefore never queues behind a publisher for the lock.

A subscriber is a :class:`Subscription` read as a blocking iterator (``for ev in sub``, or
``sub.get(timeout)``), as an async iterator (``async for ev in sub``), or driven by a callback that runs
on the subscription's own thread. Each subscriber sees each session's events in publish order.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TypeVar

from msgspec.structs import replace

from runtime.config import BusConfig
from runtime.events import EVENT_TYPES, Event, SubscriberLagged

__all__ = ["ALL", "EventBus", "Subscription"]

logger = logging.getLogger("agentcell.bus")

ALL = "*"
"""Subscribe to every session."""

E = TypeVar("E", bound=Event)
Sink = Callable[[Event], object]

_OPEN, _ENDING, _CLOSED = range(3)  # ENDING: the bus closed; readers drain what is queued, then stop
_callback_threads = itertools.count(1)
_get_ident = threading.get_ident


class Subscription:
    """One subscriber's view of the bus: a bounded queue of the events it asked for.

    Read it from one consumer only — a thread (``for ev in sub``, :meth:`get`, :meth:`drain`) or a
    coroutine (``async for ev in sub``). :meth:`close` (or leaving a ``with`` block) unsubscribes and
    ends iteration at once; :meth:`EventBus.close` ends it after what is already queued.
    """

    def __init__(
        self,
        bus: EventBus,
        sessions: frozenset[str] | None,
        types: frozenset[str] | None,
        queue_size: int,
        include_children: bool = False,
        bulk: bool = True,
    ) -> None:
        self.sessions = sessions
        """The session ids it receives, or None for all sessions."""
        self.types = types
        """The event types it receives, or None for all (lag notices always come through)."""
        self.queue_size = queue_size
        self.include_children = include_children
        """Whether the sub-agent sessions of its sessions (and theirs) come through too."""
        self.bulk = bulk
        """Whether, subscribed to all sessions, it takes what the bus publishes to many sessions at once
        (:meth:`EventBus.publish_each`)."""
        self.dropped = 0
        """How many events it has lost so far by falling behind."""
        self._bus = bus
        self._lock = bus._lock  # the bus lock: publishers hold it; the reader takes it only to wait
        self._queue: deque[Event] = deque()  # appended by publishers, popped by the reader
        self._notices: deque[Event] = deque()  # lag notices collected for the reader, read first
        self._lost: dict[str, int] | None = None  # session id -> events dropped since the last read
        self._waiter: Callable[[], None] | None = None  # wakes a reader blocked on an empty queue
        self._state = _OPEN
        self._thread: threading.Thread | None = None
        self._driven = False  # a callback reads it (on a thread of its own, or a pool's: runtime.cluster)
        self._linger = 0.0  # seconds its callback's thread waits, its queue empty, before it sleeps on it
        self._hurry = threading.Event()  # ends that wait (a flush)
        self._reader = 0  # the thread that last read it as an iterator (get or drain)

    def __repr__(self) -> str:
        sessions = "*" if self.sessions is None else sorted(self.sessions)
        return f"<Subscription sessions={sessions} types={self.types and sorted(self.types)} state={self._state}>"

    @property
    def closed(self) -> bool:
        """True once it receives no more events (after the bus closes, what is queued can still be read)."""
        return self._state != _OPEN

    @property
    def pending(self) -> int:
        """Events queued and not yet read."""
        return len(self._notices) + len(self._queue)

    # --- publisher side: EventBus.publish appends to _queue itself (bus lock held) and calls these ---

    def _drop_oldest(self) -> None:
        try:
            old = self._queue.popleft()
        except IndexError:  # the reader took the last one meanwhile: there is room again
            return
        lost = self._lost
        if lost is None:
            lost = self._lost = {}
        lost[old.session_id] = lost.get(old.session_id, 0) + 1
        self.dropped += 1
        self._bus.dropped += 1

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter()

    # --- reader side ---------------------------------------------------------------------------------

    def _collect_notices(self) -> None:
        """Turn the losses counted so far into lag notices for the reader; bus lock held."""
        lost, self._lost = self._lost, None
        if lost:
            now = time.time()
            self._notices.extend(
                SubscriberLagged(session_id=sid, dropped=n, ts=now) for sid, n in lost.items()
            )

    def _take_notice(self) -> Event | None:
        """The next lag notice, if any (reader side).

        While nothing is lost, readers take events straight off the queue (the fast path of :meth:`get`
        and :meth:`__anext__`); a loss that races with such a read may be noticed one event late.
        """
        with self._lock:
            self._collect_notices()
            return self._notices.popleft() if self._notices else None

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event, waiting up to ``timeout`` seconds (None: as long as it takes).

        Returns None if the timeout expires, or once the subscription is closed and drained.
        """
        self._reader = _get_ident()
        deadline: float | None = None
        while self._state != _CLOSED:
            # The fast path, repeated in __anext__ rather than called: a call per event costs asyncio
            # readers about a tenth of their delivery rate.
            if self._lost is None and not self._notices:
                try:
                    return self._queue.popleft()
                except IndexError:
                    pass
            else:
                notice = self._take_notice()
                if notice is not None:
                    return notice
                continue
            if timeout is not None and deadline is None:
                deadline = time.monotonic() + timeout
            with self._lock:  # publishers append under this lock: nothing can slip in unseen
                if self._queue or self._lost is not None:
                    continue
                if self._state != _OPEN:
                    return None
                remaining = -1.0 if deadline is None else deadline - time.monotonic()
                if deadline is not None and remaining <= 0:
                    return None
                gate = threading.Lock()
                gate.acquire()
                wake = self._waiter = gate.release
            if not gate.acquire(timeout=remaining):
                with self._lock:
                    if self._waiter is wake:
                        self._waiter = None
        return None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until this subscriber has caught up: nothing queued, and its reader (the callback's thread,
        for a callback subscriber) waiting for more. False if ``timeout`` passed first.

        Every event of a turn is queued to every subscriber before the turn's handle resolves, so after
        ``handle.result()`` an iterator finds the turn's ``agent_end`` in its queue; a callback runs on the
        subscription's own thread, and ``flush()`` is how to know it has seen it.

        Called from the thread that reads an iterator, it returns True at once: that reader cannot catch up
        while it waits here, and every event published before the call is in its queue already.
        """
        if not self._driven and self._reader == threading.get_ident():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while True:
            self._hurry.set()  # (a lingering callback reads what is queued now)
            with self._lock:
                reader_waiting = not self._driven or self._waiter is not None  # a callback is done
                if self._state != _OPEN or (not self._queue and not self._notices and reader_waiting):
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def drain(self) -> list[Event]:
        """Everything available right now, without waiting (possibly an empty list)."""
        self._reader = _get_ident()
        with self._lock:
            if self._state == _CLOSED:
                return []
            self._collect_notices()
            events = [*self._notices, *self._queue]
            self._notices.clear()
            self._queue.clear()
            return events

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Event:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while self._state != _CLOSED:
            if self._lost is None and not self._notices:
                try:
                    return self._queue.popleft()
                except IndexError:
                    pass
            else:
                notice = self._take_notice()
                if notice is not None:
                    return notice
                continue
            with self._lock:
                if self._queue or self._lost is not None:
                    continue
                if self._state != _OPEN:
                    raise StopAsyncIteration
                loop = asyncio.get_running_loop()
                ready = loop.create_future()
                wake = self._waiter = functools.partial(_wake_soon, loop, ready)
            try:
                await ready
            finally:
                with self._lock:
                    if self._waiter is wake:
                        self._waiter = None
        raise StopAsyncIteration

    def close(self) -> None:
        """Unsubscribe now; queued events are discarded and iteration stops."""
        self._bus._unsubscribe(self, _CLOSED)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _end(self, state: int) -> None:
        """Lock held: stop receiving; CLOSED also drops what is queued."""
        self._state = max(self._state, state)
        if state == _CLOSED:
            self._queue.clear()
            self._notices.clear()
            self._lost = None
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter()

    def _run_callback(self, callback: Callable[[Event], object]) -> None:
        linger, hurry = self._linger, self._hurry
        for event in self:
            try:
                callback(event)
            except Exception:
                logger.exception("event subscriber callback %r failed on %s", callback, event.type)
            if linger and not self._queue and not self._notices:
                # Read what comes meanwhile in one go: no waiter is set, so no publisher wakes this thread.
                hurry.wait(linger)
                hurry.clear()


_woken: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}  # loop -> readers to wake on it
_woken_lock = threading.Lock()


def _wake_soon(loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
    """Wake an async reader waiting on ``loop`` (from any thread). The readers woken before the loop gets
    round to it are woken by one call: each ``call_soon_threadsafe`` writes to the loop's wake-up socket,
    and a thread that wakes a thousand readers (a cluster front's fan-out) would otherwise make a thousand
    system calls, each handing the GIL to whichever thread wants it."""
    with _woken_lock:
        waiting = _woken.get(loop)
        if waiting is not None:
            waiting.append(ready)
            return
        _woken[loop] = [ready]
    try:
        loop.call_soon_threadsafe(_wake_all, loop)
    except RuntimeError:  # the loop is closed; nobody is waiting
        with _woken_lock:
            _woken.pop(loop, None)


def _wake_all(loop: asyncio.AbstractEventLoop) -> None:
    with _woken_lock:
        waiting = _woken.pop(loop, ())
    for ready in waiting:
        if not ready.done():
            ready.set_result(None)


class EventBus:
    """Publish events; subscribe to one session, several, or all, optionally filtered by event type.

    ``queue_size`` is each subscriber's default bound (``Config.bus.subscriber_queue``, 10,000).
    Publishing is thread-safe, never blocks on a subscriber, and costs O(matching subscribers).
    """

    def __init__(self, queue_size: int | None = None) -> None:
        self.queue_size = queue_size if queue_size is not None else BusConfig().subscriber_queue
        if self.queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self._lock = threading.RLock()  # RLock: a sink that publishes must not deadlock the bus
        self._seqs: dict[str, int] = {}
        self._sinks: tuple[Sink, ...] = ()
        self._everything: tuple[Subscription, ...] = ()
        self._by_session: dict[str, tuple[Subscription, ...]] = {}
        self._tags: dict[type, str] = {}
        self._parents: dict[str, tuple[str, str]] = {}  # sub-agent session -> (parent, call id)
        self.dropped = 0
        """Events lost by subscribers that fell behind, all of them together, since the bus was made."""

    def publish(self, event: E) -> E:
        """Stamp ``event`` with its session's next ``seq`` (from 1) and ``ts`` (now, unless already set),
        give it to the sinks and the matching subscribers, and return the stamped event."""
        with self._lock:
            return self._publish(event, self._everything)

    def _publish(self, event: E, everything: tuple[Subscription, ...]) -> E:
        """:meth:`publish` to ``everything`` (the all-sessions subscribers it goes to); lock held."""
        cls = type(event)
        tag = self._tags.get(cls)
        if tag is None:
            tag = self._tags[cls] = event.type
        sid = event.session_id
        seq = self._seqs.get(sid, 0) + 1
        self._seqs[sid] = seq
        parent = self._parents.get(sid) if self._parents else None
        if parent is None:
            event = replace(event, seq=seq, ts=event.ts or time.time())
        else:
            event = replace(
                event,
                seq=seq,
                ts=event.ts or time.time(),
                parent_session_id=parent[0],
                parent_call_id=parent[1],
            )
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                logger.exception("event sink %r failed on %s", sink, tag)
        subs = self._by_session.get(sid)
        targets = everything if subs is None else everything + subs
        for sub in targets:  # Subscription._offer, inlined: this loop is the bus's hot path
            types = sub.types
            if types is not None and tag not in types:
                continue
            queue = sub._queue
            if len(queue) >= sub.queue_size:
                sub._drop_oldest()
            queue.append(event)
            if sub._waiter is not None:
                sub._wake()
        return event

    def publish_each(self, session_ids: Iterable[str], kind: str, make: Callable[[str], Event]) -> int:
        """Publish ``make(sid)``, an event of type ``kind``, for each of ``session_ids``, holding the lock
        once, and only where someone gets it: a session is skipped, its event never made nor numbered, when
        no subscriber of its own, no all-sessions subscriber that takes ``kind`` in bulk (one subscribed with
        ``bulk=False`` takes none of these events, whoever they are published for) and no sink that wants it
        (a sink with a ``wants(session_id, kind)`` method may decline; one without gets every event) would
        get its event. A million idle sessions stopping cost a loop, not a million events. Returns how many
        events were published."""
        with self._lock:
            everything = tuple(sub for sub in self._everything if sub.bulk)
            asks = [getattr(sink, "wants", None) for sink in self._sinks]
            if None in asks or any(sub.types is None or kind in sub.types for sub in everything):
                wanted: Iterable[str] = session_ids  # someone takes every session's
            else:
                by_session = self._by_session
                wanted = [
                    sid
                    for sid in session_ids
                    if sid in by_session or any(ask(sid, kind) for ask in asks if ask is not None)
                ]
            published = 0
            for sid in wanted:
                self._publish(make(sid), everything)
                published += 1
            return published

    def subscribe(
        self,
        sessions: str | Iterable[str] = ALL,
        types: Iterable[str] | None = None,
        *,
        callback: Callable[[Event], object] | None = None,
        queue_size: int | None = None,
        include_children: bool = False,
        bulk: bool = True,
        linger: float = 0.0,
    ) -> Subscription:
        """Subscribe to ``sessions`` (one id, several, or ``"*"``) and ``types`` (event type names; None for all).

        With ``callback``, a thread of its own calls ``callback(event)`` for each event (a slow callback
        only makes that subscriber lag). Otherwise read the returned :class:`Subscription`.

        ``bulk=False`` (all sessions only; one of given sessions gets what is published for them): it takes
        none of the events published to many sessions at once (:meth:`publish_each`: the ``session_stopped``
        of every hosted session at the runtime's stop), so an all-sessions subscriber that holds state for a
        few sessions only does not make the runtime's stop publish an event for each of a million idle ones.
        The end of its subscription tells it the runtime stopped; a session stopped on its own still
        publishes its ``session_stopped`` to it.

        ``linger`` (seconds; with ``callback``): once it has read everything queued, its thread waits that
        long before it sleeps until the next event, and reads what came meanwhile in one go. Waking a thread
        is a thread switch (tens of microseconds of CPU on a VM), and a callback woken for each event pays it
        several times a turn. For a subscriber that may run late (its events keep their times);
        :meth:`Subscription.flush` ends the wait.

        Raises:
            ValueError: an unknown event type, an empty set of sessions, or a queue size below 1.
        """
        wanted: frozenset[str] | None
        if isinstance(sessions, str):
            wanted = None if sessions == ALL else frozenset((sessions,))
        else:
            wanted = frozenset(sessions)
            if not wanted:
                raise ValueError("subscribe to at least one session, or to '*'")
            if ALL in wanted:
                wanted = None
        type_set = None if types is None else frozenset(types)
        if type_set is not None and not type_set <= EVENT_TYPES:
            raise ValueError(f"unknown event types: {sorted(type_set - EVENT_TYPES)}")
        size = queue_size if queue_size is not None else self.queue_size
        if size < 1:
            raise ValueError("queue_size must be at least 1")
        sub = Subscription(self, wanted, type_set, size, include_children and wanted is not None, bulk)
        with self._lock:
            if wanted is None:
                self._everything = (*self._everything, sub)
            else:
                if sub.include_children:  # the sub-agents its sessions have already
                    wanted = sub.sessions = wanted | self._descendants(wanted)
                for sid in wanted:
                    self._by_session[sid] = (*self._by_session.get(sid, ()), sub)
        if callback is not None:
            sub._driven = True
            sub._linger = linger
            sub._thread = threading.Thread(
                target=sub._run_callback,
                args=(callback,),
                name=f"bus-callback-{next(_callback_threads)}",
                daemon=True,
            )
            sub._thread.start()
        return sub

    def link_child(self, child: str, parent: str, call_id: str) -> None:
        """``child`` is a sub-agent session of ``parent``, started by its tool call ``call_id``: its events
        carry both, and subscribers of ``parent`` with ``include_children`` receive them."""
        with self._lock:
            self._parents[child] = (parent, call_id)
            for sub in self._by_session.get(parent, ()):
                if sub.include_children and sub.sessions is not None and child not in sub.sessions:
                    sub.sessions = sub.sessions | {child}
                    self._by_session[child] = (*self._by_session.get(child, ()), sub)

    def parent_of(self, session_id: str) -> tuple[str, str] | None:
        """The (parent session, call id) of a sub-agent session, or None."""
        return self._parents.get(session_id)

    def _descendants(self, sessions: frozenset[str]) -> frozenset[str]:
        found: set[str] = set()
        frontier = set(sessions)
        while frontier:
            frontier = {c for c, (p, _) in self._parents.items() if p in frontier and c not in found}
            found |= frontier
        return frozenset(found)

    def add_sink(self, sink: Sink) -> None:
        """Call ``sink(event)`` synchronously for every published event, in publish order.

        Sinks run under the bus lock: they must be quick. Exceptions they raise are logged, never
        passed to the publisher.
        """
        with self._lock:
            self._sinks = (*self._sinks, sink)

    def remove_sink(self, sink: Sink) -> None:
        with self._lock:
            self._sinks = tuple(s for s in self._sinks if s is not sink)

    def last_seq(self, session_id: str) -> int:
        """The ``seq`` of the session's latest event (0 if none)."""
        return self._seqs.get(session_id, 0)

    def set_last_seq(self, session_id: str, seq: int) -> None:
        """Continue a session's numbering from ``seq`` (e.g. when a stored session resumes)."""
        with self._lock:
            self._seqs[session_id] = seq

    def forget_session(self, session_id: str) -> None:
        """Drop the session's sequence counter (its next event gets ``seq`` 1)."""
        with self._lock:
            self._seqs.pop(session_id, None)

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._everything) + len({id(s) for subs in self._by_session.values() for s in subs})

    def close(self) -> None:
        """End every subscription: readers get what is already queued, then the end of the stream.

        The bus stays usable: later events still reach the sinks and later subscribers.
        """
        with self._lock:
            subs = {id(s): s for s in self._everything}
            for group in self._by_session.values():
                subs.update((id(s), s) for s in group)
            for sub in subs.values():
                self._unsubscribe(sub, _ENDING)

    def _unsubscribe(self, sub: Subscription, state: int) -> None:
        with self._lock:
            if sub.sessions is None:
                self._everything = tuple(s for s in self._everything if s is not sub)
            else:
                for sid in sub.sessions:
                    remaining = tuple(s for s in self._by_session.get(sid, ()) if s is not sub)
                    if remaining:
                        self._by_session[sid] = remaining
                    else:
                        self._by_session.pop(sid, None)
            sub._end(state)
