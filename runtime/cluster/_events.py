"""Subscriptions across shards (design §10.2), the front's side: each one a private event bus fed by every
shard's stream of events.

A cluster subscription is an ordinary :class:`~runtime.bus.Subscription` of a bus of its own, so it
reads, filters, bounds its queue and reports lag exactly as the local bus does (callback, iterator, async
iterator, ``flush``, ``close``). Each shard routes the events a subscription asked for to this front's
stream (:mod:`runtime.cluster._stream`); each batch that arrives is decoded once, by the shard's
:class:`Inbound`, and its events handed to the :class:`Relay` of each subscription they are for, which puts
them on its private bus with the ``seq`` and ``ts`` their session's shard gave them.

Order: a session lives on one shard at a time, and one stream delivers that shard's events in the order
they were published, so each session's events arrive in order. When a session moves between shards in an
orderly way, the front waits until every relay has seen the session's ``session_stopped`` from the old
shard (:meth:`Relay.wait_seen`) before it resumes the session on the new one; shards therefore always send
``session_stopped``, and the relay drops it again when the subscriber did not ask for it. When a shard
dies, the relays hold what the session's new shard sends (:meth:`Relay.hold`) until the dead shard's
connection has been read to its end and what its transcript holds beyond the last event delivered has been
replayed (:meth:`Relay.release`): a subscriber gets every event the dead shard sent or wrote down, once, in
order, then the session's events on its new shard, numbered above every number it had.

Lag: a subscriber that falls behind loses the oldest events of its private queue and reads
``subscriber_lagged{dropped}``; a stream that dropped events on the shard (the front could not take them
fast enough) reports its loss with the same event, which the relay passes on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from runtime.bus import ALL, EventBus, Subscription
from runtime.cluster._callbacks import Callbacks
from runtime.cluster._stream import decode_push
from runtime.events import EVENT_TYPES, Event, SubscriberLagged

__all__ = ["Inbound", "Relay", "shard_types"]

BARRIER_TYPE = "session_stopped"
WAKE_AFTER = 0.005
REPLAY_OVERLAP = 60.0
"""Seconds after a release during which the session's new shard's feed may still bring events the replay
passed on (they are in flight as the replay reads them): the relay remembers a replay that long at most, or
until the feed passes it, so a front with many sessions and shard deaths does not keep one for each."""
"""Seconds of reading a connection after which the subscribers that received events are woken before the
read ends (a front reads what a busy shard wrote in one go, a few MB at most)."""


def shard_types(types: frozenset[str] | None) -> list[str] | None:
    """The types a shard-side feed asks for: the subscriber's, and always ``session_stopped``."""
    return None if types is None else sorted(types | {BARRIER_TYPE})


class _RelayBus(EventBus):
    """A bus with one subscriber, that takes events numbered and stamped already (by their shards), and lag
    notices from elsewhere (a shard's stream that dropped events)."""

    def offer(self, sub: Subscription, events: list[Event], wake: bool = True) -> None:
        """Queue ``events`` for ``sub`` as :meth:`EventBus.publish` would, but as they are (their shard
        numbered them), waking its reader once for them all (or not yet: :meth:`wake`)."""
        if not events:
            return
        with self._lock:
            if sub.closed:
                return
            queue, size = sub._queue, sub.queue_size
            for event in events:
                if len(queue) >= size:
                    sub._drop_oldest()
                queue.append(event)
            if wake and sub._waiter is not None:
                sub._wake()

    def wake(self, sub: Subscription) -> None:
        with self._lock:
            if sub._waiter is not None:
                sub._wake()

    def notify_lag(self, notice: SubscriberLagged) -> None:
        """Queue ``notice`` for every subscriber of its session, read before their next event."""
        with self._lock:
            targets = self._everything + self._by_session.get(notice.session_id, ())
            for sub in targets:
                sub.dropped += notice.dropped
                sub._notices.append(notice)
                if sub._waiter is not None:
                    sub._wake()


class Relay:
    """One cluster subscription: its private bus and subscriber, and what each session has delivered."""

    def __init__(
        self,
        key: int,
        sessions: str | Iterable[str],
        types: Iterable[str] | None,
        *,
        queue_size: int,
        callback: Callable[[Event], Any] | None = None,
        include_children: bool = False,
        callbacks: Callbacks | None = None,
        clock: Callable[[], float] = time.monotonic,
        bulk: bool = True,
    ) -> None:
        self.key = key
        self.bus = _RelayBus(queue_size=queue_size)
        self.include_children = include_children
        # With the sessions' sub-agents, the shards choose the sessions: the private bus takes what comes.
        self.subscription: Subscription = self.bus.subscribe(
            ALL if include_children else sessions,
            types,
            callback=callback if callbacks is None else None,
            queue_size=queue_size,
        )
        if callback is not None and callbacks is not None:
            callbacks.drive(self.subscription, callback)
        self.types = self.subscription.types
        self.sessions = _session_set(sessions)
        self.bulk = bulk and (self.types is None or BARRIER_TYPE in self.types)
        """Whether its shard-side feeds take what a shard publishes to many sessions at once (its stop's
        ``session_stopped`` of every session, ``EventBus.publish_each``): not for a subscriber that did not
        ask for ``session_stopped`` (the barrier the feeds always take is for moves, one session at a time),
        nor for one subscribed with ``bulk=False``."""
        self._seen: dict[str, int] = {}  # session -> the highest seq delivered (or dropped by the filter)
        self._feeds: set[str] = set()  # the shards whose feed is open
        self._held: dict[str, tuple[str, list[Event]]] = {}  # session -> (its dead shard, what came since)
        # session -> the last seq a replay passed on (its new shard's feed may still bring those events) and
        # when, oldest first: kept until the feed passes it, REPLAY_OVERLAP seconds at most
        self._replayed: dict[str, tuple[int, float]] = {}
        self._clock = clock
        self._waiting = 0  # threads in wait_seen
        self.since = time.time()
        """When it was made: a replay after a shard's death passes on nothing older."""
        self._cond = threading.Condition(self.bus._lock)  # (one lock a batch: offer() takes it again)

    @property
    def closed(self) -> bool:
        return self.subscription.closed

    def covers(self, session_id: str) -> bool:
        return self.sessions is None or session_id in self.sessions

    def shard_sessions(self) -> str | list[str]:
        """The ``sessions`` argument of the shard-side feeds."""
        return ALL if self.sessions is None else sorted(self.sessions)

    def shard_types(self) -> list[str] | None:
        return shard_types(self.types)

    def feed_opened(self, shard: str) -> None:
        with self._cond:
            self._feeds.add(shard)

    def feed_ended(self, shard: str) -> None:
        with self._cond:
            self._feeds.discard(shard)
            self._cond.notify_all()

    def wait_feeds_ended(self, timeout: float) -> bool:
        """Wait until no shard's feed is open (each has passed on what its shard queued)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._feeds, timeout)

    def deliver(self, shard: str, events: Event | list[Event], wake: bool = True) -> None:
        """Queue a stream's events (or one event) for the subscriber with the numbers their shard gave them
        (as :meth:`_RelayBus.offer`, one lock for them all); with ``wake`` False, the subscriber's reader
        is woken only by :meth:`wake`."""
        with self._cond:  # (the private bus's lock)
            held, seen, types, replayed = self._held, self._seen, self.types, self._replayed
            if replayed:
                self._forget_replays()
            sub = self.subscription
            queue, size, open_ = sub._queue, sub.queue_size, not sub.closed
            for event in events if isinstance(events, list) else (events,):
                if isinstance(event, SubscriberLagged):  # the shard dropped events it could not send
                    self.bus.notify_lag(event)
                    continue
                if held:
                    waiting = held.get(event.session_id)
                    if waiting is not None and waiting[0] != shard:
                        waiting[1].append(event)
                        continue
                if replayed:
                    passed = replayed.get(event.session_id)
                    if passed is not None:
                        if event.seq <= passed[0]:  # the transcript's replay passed it on already
                            continue
                        del replayed[event.session_id]  # the feed has caught up with the replay
                seen[event.session_id] = event.seq
                # (a type not asked for: the session_stopped the move barrier wanted)
                if open_ and (types is None or event.type in types):
                    if len(queue) >= size:
                        sub._drop_oldest()
                    queue.append(event)
            if wake and sub._waiter is not None:
                sub._wake()
            if self._waiting:
                self._cond.notify_all()

    def _publish(self, event: Event) -> None:
        self._seen[event.session_id] = event.seq
        if self.types is None or event.type in self.types:
            self.bus.offer(self.subscription, [event])

    def hold(self, session_id: str, dead: str) -> None:
        """The session's shard ``dead`` died: hold what other shards send for it until :meth:`release`."""
        with self._cond:
            self._held.setdefault(session_id, (dead, []))

    def wake(self) -> None:
        """Wake the subscriber's reader for what :meth:`deliver` queued without waking it."""
        self.bus.wake(self.subscription)

    def holds(self, session_id: str) -> bool:
        with self._cond:
            return session_id in self._held

    def seen(self, session_id: str) -> int:
        """The ``seq`` of the session's last event this relay passed on (or dropped by its filter)."""
        with self._cond:
            return self._seen.get(session_id, 0)

    def release(self, session_id: str, replayed: list[Event]) -> None:
        """Pass on ``replayed`` (the session's transcript after :meth:`seen`), then what was held, each
        event once and in order. The new shard's feed may still bring events the replay read from its
        transcript (the replay and the feed are two channels): :meth:`deliver` drops those."""
        with self._cond:
            _, waiting = self._held.pop(session_id, ("", []))
            for event in sorted(replayed, key=lambda e: e.seq):
                if event.seq > self._seen.get(session_id, 0):
                    self._publish(event)
            for event in waiting:
                if event.seq > self._seen.get(session_id, 0):
                    self._publish(event)
            if replayed:
                self._replayed.pop(session_id, None)  # (newest last)
                self._replayed[session_id] = (self._seen.get(session_id, 0), self._clock())
            self._forget_replays()
            self._cond.notify_all()

    def _forget_replays(self) -> None:
        """Forget the replays older than :data:`REPLAY_OVERLAP`: their feeds' copies have come (or never
        will: the session had no event since). Under the lock."""
        replayed = self._replayed
        before = self._clock() - REPLAY_OVERLAP
        while replayed:
            oldest = next(iter(replayed))
            if replayed[oldest][1] > before:
                return
            del replayed[oldest]

    def wait_seen(self, session_id: str, seq: int, shard: str, timeout: float) -> bool:
        """Wait until the session's event ``seq`` has come through (or ``shard``'s feed has ended)."""
        with self._cond:
            self._waiting += 1
            try:
                return self._cond.wait_for(
                    lambda: self._seen.get(session_id, 0) >= seq or shard not in self._feeds or self.closed,
                    timeout,
                )
            finally:
                self._waiting -= 1

    def close(self) -> None:
        """End the subscription once its reader has what is queued (as :meth:`EventBus.close` does)."""
        self.bus.close()
        with self._cond:
            self._cond.notify_all()


def _session_set(sessions: str | Iterable[str]) -> frozenset[str] | None:
    if isinstance(sessions, str):
        return None if sessions == ALL else frozenset((sessions,))
    wanted = frozenset(sessions)
    return None if ALL in wanted else wanted


def check_types(types: Iterable[str] | None) -> frozenset[str] | None:
    """The event types a subscription asks for; ValueError naming any unknown one."""
    if types is None:
        return None
    wanted = frozenset(types)
    unknown = wanted - EVENT_TYPES
    if unknown:
        raise ValueError(f"unknown event types: {', '.join(sorted(unknown))}")
    return wanted


class Inbound:
    """One shard's stream of events to this front: each batch decoded once, its events handed to the relays
    of the subscriptions they are for, and who waits for a batch (a turn's answer waits for its events)."""

    def __init__(
        self, shard: str, relays: Mapping[int, Relay], unknown: Callable[[str, int], None] | None = None
    ) -> None:
        self.shard = shard
        self.received = 0
        """The number of the last batch received."""
        self.ended = False
        self._relays = relays
        self._unknown = unknown
        self._waiters: list[tuple[int, Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._to_wake: dict[int, Relay] = {}
        self._wake_since = 0.0

    def push(self, data: bytes) -> bool:
        """Take a frame of events (on the front's loop); False for a batch received before."""
        batch = decode_push(data)
        if batch.no <= self.received:
            return False  # written again after a reconnection
        # Each feed's events, a lone event as it is: a batch holds one event or two for most of a thousand
        # subscriptions, and a list each would be objects enough to set the garbage collector going.
        groups: dict[int, Event | list[Event]] = {}
        for event, route in zip(batch.events, batch.routes):
            for key in (route,) if type(route) is int else route:  # type: ignore[union-attr]
                group = groups.get(key)
                if group is None:
                    groups[key] = event
                elif type(group) is list:
                    group.append(event)
                else:
                    groups[key] = [group, event]  # type: ignore[list-item]
        relays, to_wake = self._relays, self._to_wake
        first = not to_wake
        for key, events in groups.items():
            relay = relays.get(key)
            if relay is None or relay.closed:
                if self._unknown is not None:
                    self._unknown(self.shard, key)
                continue
            relay.deliver(self.shard, events, wake=False)
            to_wake[key] = relay
        if to_wake and not first and time.monotonic() - self._wake_since >= WAKE_AFTER:
            self.wake()  # (a long read: who has waited this long is woken now, the rest at its end)
        elif first and to_wake:
            self._wake_since = time.monotonic()
            # The readers are woken once the connection has nothing more to read for now: each then takes
            # all that came meanwhile in one go. Woken for every batch, a thousand subscribers' threads
            # would each want the GIL for every few events, and the thread that reads here would wait for
            # it behind them.
            try:
                asyncio.get_running_loop().call_soon(self.wake)
            except RuntimeError:  # (no loop: a test's)
                self.wake()
        with self._lock:
            self.received = batch.no
            due = [w for w in self._waiters if w[0] <= batch.no] if self._waiters else []
            if due:
                self._waiters = [w for w in self._waiters if w[0] > batch.no]
        if due:
            self.wake()  # (a turn's handle resolves with its subscribers' readers woken)
        for _, fn in due:
            fn()
        return True

    def wake(self) -> None:
        """Wake the readers of the subscriptions that received events since the last time."""
        to_wake, self._to_wake = self._to_wake, {}
        for relay in to_wake.values():
            relay.wake()

    def when(self, no: int, fn: Callable[[], None]) -> None:
        """Call ``fn`` once batch ``no`` has been received (now, if it has, or the stream has ended)."""
        with self._lock:
            if no > self.received and not self.ended:
                self._waiters.append((no, fn))
                return
        fn()

    def end(self) -> None:
        """The shard is gone (or stopped): nothing more will come; whoever waits stops waiting."""
        with self._lock:
            self.ended = True
            due, self._waiters = self._waiters, []
        for _, fn in due:
            fn()
