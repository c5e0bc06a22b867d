"""Subscriptions across shards (design §10.2): each one a private event bus fed by one feed per shard.

A cluster subscription is an ordinary :class:`~runtime.bus.Subscription` of a bus of its own, so it
reads, filters, bounds its queue and reports lag exactly as the local bus does (callback, iterator, async
iterator, ``flush``, ``close``). Each shard queues the events the subscription asked for in a subscription
of its own runtime's bus; the front polls each shard (:meth:`Shard.poll`) and hands what arrives to
:meth:`Relay.deliver`, which puts the events on the private bus with the ``seq`` and ``ts`` their session's
shard gave them.

Order: a session lives on one shard at a time, and one feed delivers that shard's events in the order they
were published, so each session's events arrive in order. When a session moves between shards in an
orderly way, the front waits until every relay has seen the session's ``session_stopped`` from the old
shard (:meth:`Relay.wait_seen`) before it resumes the session on the new one; shards therefore always send
``session_stopped``, and the relay drops it again when the subscriber did not ask for it. When a shard
dies, it sends nothing more, and the session's numbering on its new shard jumps above every number it had.

Lag: a subscriber that falls behind loses the oldest events of its private queue and reads
``subscriber_lagged{dropped}``; a feed whose shard-side queue overflowed (the front could not poll fast
enough) reports its loss with the same event, which the relay passes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from runtime.bus import ALL, EventBus, Subscription
from runtime.events import EVENT_TYPES, Event, SubscriberLagged

__all__ = ["Relay", "shard_types"]

BARRIER_TYPE = "session_stopped"


def shard_types(types: frozenset[str] | None) -> list[str] | None:
    """The types a shard-side feed asks for: the subscriber's, and always ``session_stopped``."""
    return None if types is None else sorted(types | {BARRIER_TYPE})


class _RelayBus(EventBus):
    """A bus that also takes lag notices from elsewhere (a shard's feed that overflowed)."""

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
        feed_id: str,
        sessions: str | Iterable[str],
        types: Iterable[str] | None,
        *,
        queue_size: int,
        callback: Callable[[Event], Any] | None = None,
        include_children: bool = False,
    ) -> None:
        self.id = feed_id
        self.bus = _RelayBus(queue_size=queue_size)
        self.include_children = include_children
        # With the sessions' sub-agents, the shards choose the sessions: the private bus takes what comes.
        self.subscription: Subscription = self.bus.subscribe(
            ALL if include_children else sessions, types, callback=callback, queue_size=queue_size
        )
        self.types = self.subscription.types
        self.sessions = _session_set(sessions)
        self._seen: dict[str, int] = {}  # session -> the highest seq delivered (or dropped by the filter)
        self._feeds: set[str] = set()  # the shards whose feed is open
        self._received: dict[str, int] = {}  # shard -> items (events and notices) its feed delivered
        self._waiters: list[tuple[str, int, Callable[[], None]]] = []
        self._cond = threading.Condition()

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
        self._fire(lambda waiter: waiter[0] == shard)

    def when_received(self, shard: str, count: int, fn: Callable[[], None]) -> None:
        """Call ``fn`` once ``shard``'s feed has delivered ``count`` items (now, if it has or has ended)."""
        with self._cond:
            if self._received.get(shard, 0) < count and shard in self._feeds and not self.closed:
                self._waiters.append((shard, count, fn))
                return
        fn()

    def _fire(self, ready: Callable[[tuple[str, int, Callable[[], None]]], bool]) -> None:
        with self._cond:
            due = [w for w in self._waiters if ready(w)]
            if not due:
                return
            self._waiters = [w for w in self._waiters if not ready(w)]
        for _, _, fn in due:
            fn()

    def wait_feeds_ended(self, timeout: float) -> bool:
        """Wait until no shard's feed is open (each has passed on what its shard queued)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._feeds, timeout)

    def deliver(self, shard: str, events: list[Event]) -> None:
        """Publish a feed's events on the private bus with the numbers their shard gave them."""
        bus, types = self.bus, self.types
        with self._cond:
            received = self._received[shard] = self._received.get(shard, 0) + len(events)
            for event in events:
                sid = event.session_id
                if isinstance(event, SubscriberLagged):  # the shard-side queue overflowed
                    bus.notify_lag(event)
                    continue
                self._seen[sid] = event.seq
                if types is not None and event.type not in types:
                    continue  # session_stopped that only the move barrier wanted
                bus.set_last_seq(sid, event.seq - 1)  # publish() numbers it seq - 1 + 1: the shard's number
                bus.publish(event)
            self._cond.notify_all()
        if self._waiters:
            self._fire(lambda waiter: waiter[0] == shard and waiter[1] <= received)

    def wait_seen(self, session_id: str, seq: int, shard: str, timeout: float) -> bool:
        """Wait until the session's event ``seq`` has come through (or ``shard``'s feed has ended)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._seen.get(session_id, 0) >= seq or shard not in self._feeds or self.closed,
                timeout,
            )

    def close(self) -> None:
        """End the subscription once its reader has what is queued (as :meth:`EventBus.close` does)."""
        self.bus.close()
        with self._cond:
            self._cond.notify_all()
        self._fire(lambda waiter: True)


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
