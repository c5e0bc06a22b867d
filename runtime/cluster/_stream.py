"""A shard's events, pushed to each front that subscribed (design §10.2): the shard's side.

A :class:`Router` is a sink of the shard's event bus. Each front's subscription is a :class:`Feed` of it
(its sessions, its types, with or without sub-agents), so a shard sends only what some subscriber wants,
and it decides so once per event, under the bus lock, in publish order. What a front's feeds want goes to
that front's :class:`Stream`, which seals what came before the shard's event loop woke up for it into one
numbered batch and writes it on the front's turn channel (one frame: :data:`PUSH`, then msgpack ``[number, events, routes]``,
``routes[i]`` the key of the feed ``events[i]`` is for, or a list of keys when it is for several). An event wanted by several feeds of a front
crosses once; the front decodes each batch once and hands each event to its subscriptions.

A turn's answer is written after the batch holding its events, and carries that batch's number (see
:meth:`Router.seal_all`): a front resolves the turn's handle once it has received that batch, as the local
bus queues a turn's events to every subscriber before the handle resolves.

Nothing is lost silently. The front acknowledges the batches it received every few tens of milliseconds;
a batch stays with its stream until then. When the connection breaks, the front reconnects and says the
last batch it received: everything after it is written again (the front drops what it had). Batches that
cannot be written (no connection; a front too slow to read, :data:`HIGH_WATER` bytes already waiting on the
connection) wait, up to :data:`BUDGET` bytes; past that the oldest are dropped and each feed receives one
``subscriber_lagged{dropped}`` per session that lost events, before its next event.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec

from runtime.events import AnyEvent, Event, SubscriberLagged

__all__ = ["BATCH_DELAY", "PUSH", "Feed", "Push", "Router", "Stream", "decode_push"]

PUSH = 0xC1
"""The first byte of a frame of events: a byte msgpack never uses, so no answer starts with it."""
BATCH_DELAY = 0.0
"""Seconds an event waits for others to cross in the same batch, beyond the time the shard's event loop
takes to wake up for it (what comes meanwhile crosses with it: under load, a few milliseconds' worth)."""
SEAL_AFTER = 0.010
"""Seconds after which events added on the shard's loop are sealed and written at once, without waiting
for the loop to finish what it is doing. A shard busy with hundreds of streaming sessions runs through
all their chunks in one turn of its loop; on a loaded machine that turn takes 100 ms and more, which its
subscribers would otherwise wait for (the local bus hands each event to its subscribers as it is
published)."""
HIGH_WATER = 4 << 20
"""Bytes waiting on a front's connection beyond which batches wait for it to drain."""
BUDGET = 64 << 20
"""Bytes of batches a stream keeps unwritten for a front (disconnected, or reading too slowly); past
that the oldest are dropped and reported as ``subscriber_lagged``."""
ABANDONED_AFTER = 120.0
"""Seconds a stream is kept without a connection or a pull (its front died), then dropped."""


class Push(msgspec.Struct, array_like=True):
    """A batch of events on the wire."""

    no: int
    events: list[AnyEvent]
    routes: list[int | list[int]]
    """Each event's feed, or its feeds (a number each, not a list each: a front decodes them without
    allocating the objects its garbage collector would count and, at times, walk through)."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Push)


def decode_push(data: bytes | memoryview) -> Push:
    """A batch from a frame (its first byte is :data:`PUSH`)."""
    return _decoder.decode(memoryview(data)[1:])


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # (a thread without a loop)
        return None


class Feed:
    """One subscription of a front on this shard."""

    __slots__ = ("bulk", "children", "key", "sessions", "stream", "types")

    def __init__(
        self,
        key: int,
        stream: Stream,
        sessions: frozenset[str] | None,
        types: frozenset[str] | None,
        children: bool,
        bulk: bool = True,
    ) -> None:
        self.key = key
        self.stream = stream
        self.sessions = sessions
        self.types = types
        self.children = children and sessions is not None
        self.bulk = bulk


class _Batch:
    __slots__ = ("data", "events", "no", "routes")

    def __init__(self, no: int, data: bytes, events: list[Event], routes: list[int | list[int]]) -> None:
        self.no = no
        self.data = data
        self.events = events
        self.routes = routes


class Stream:
    """What one front's feeds receive from this shard, and the connection it goes out on.

    :meth:`add` runs on publishing threads (bus lock held); everything else on the shard's event loop.
    """

    def __init__(self, front_id: str, lock: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.front_id = front_id
        self._lock = lock  # the bus lock: add() runs under it, seal() takes it to swap the lists
        self._loop = loop
        self._events: list[Event] = []
        self._routes: list[int | list[int]] = []
        self._armed = False
        self._since = 0.0  # when the first event of the batch being made was added
        self.no = 0  # the last batch sealed
        self._unwritten: deque[_Batch] = deque()
        self._unwritten_bytes = 0
        self._unacked: deque[_Batch] = deque()  # written, not yet acknowledged
        self._lost: dict[tuple[int, str], int] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._draining: asyncio.Future[None] | None = None
        self._sealed = asyncio.Event()
        self.seen = time.monotonic()  # when it last had a connection or a pull
        self.closed = False

    # -- publishing threads ---------------------------------------------------------------------------
    def add(self, event: Event, key: int) -> None:
        """Queue ``event`` for the feed ``key`` (bus lock held)."""
        events = self._events
        if events and events[-1] is event:
            route = self._routes[-1]
            if isinstance(route, int):
                self._routes[-1] = [route, key]
            else:
                route.append(key)
            return
        events.append(event)
        self._routes.append(key)
        if not self._armed:
            self._armed = True
            self._since = time.monotonic()
            with contextlib.suppress(RuntimeError):  # the loop closed: the shard is going away
                if BATCH_DELAY:
                    self._loop.call_soon_threadsafe(self._loop.call_later, BATCH_DELAY, self.seal)
                else:
                    self._loop.call_soon_threadsafe(self.seal)

    def hurry(self) -> None:
        """After an event was added to every feed that wants it (bus lock held): on the shard's loop, if
        the batch being made is :data:`SEAL_AFTER` old, seal and write it now."""
        if self._armed and time.monotonic() - self._since >= SEAL_AFTER and _running_loop() is self._loop:
            self.seal()  # (mid-turn of the loop: what came so far goes out now, in publish order)

    # -- the shard's loop -----------------------------------------------------------------------------
    def seal(self) -> int:
        """Make what was added into a batch and write it; the number of the last batch sealed."""
        with self._lock:
            events, routes = self._events, self._routes
            self._events, self._routes, self._armed = [], [], False
        if self._lost:
            now = time.time()
            notices: list[Event] = [
                SubscriberLagged(session_id=sid, dropped=n, ts=now) for (_, sid), n in self._lost.items()
            ]
            events[:0] = notices
            routes[:0] = [key for key, _ in self._lost]
            self._lost = {}
        if not events or self.closed:
            return self.no
        self.no += 1
        wire = Push(self.no, events, routes)
        body = _encoder.encode(wire)
        head = (len(body) + 1).to_bytes(4, "big") + bytes((PUSH,))  # (the turn channel's framing)
        batch = _Batch(self.no, head + body, events, routes)
        self._unwritten.append(batch)
        self._unwritten_bytes += len(batch.data)
        self._write()
        if self._unwritten_bytes > BUDGET:
            self._trim()
        self._sealed.set()
        return self.no

    def _write(self) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        while self._unwritten:
            if writer.transport.get_write_buffer_size() > HIGH_WATER:
                if self._draining is None:
                    self._draining = asyncio.ensure_future(self._drain(writer))
                return
            batch = self._unwritten.popleft()
            self._unwritten_bytes -= len(batch.data)
            writer.write(batch.data)
            self._unacked.append(batch)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(Exception):
                await writer.drain()
        finally:
            self._draining = None
        if writer is self._writer:
            self._write()

    def _trim(self) -> None:
        """Drop the oldest unwritten batches down to the budget; their events become lag notices."""
        lost = self._lost
        while self._unwritten_bytes > BUDGET and self._unwritten:
            batch = self._unwritten.popleft()
            self._unwritten_bytes -= len(batch.data)
            for event, route in zip(batch.events, batch.routes):
                n = event.dropped if isinstance(event, SubscriberLagged) else 1
                for key in (route,) if isinstance(route, int) else route:
                    lost[key, event.session_id] = lost.get((key, event.session_id), 0) + n
        if lost and not self._armed:  # the notices go out at once, not with the next event
            self._armed = True
            self._loop.call_later(BATCH_DELAY, self.seal)

    def ack(self, no: int) -> None:
        """The front has received every batch up to ``no``."""
        unacked = self._unacked
        while unacked and unacked[0].no <= no:
            unacked.popleft()

    def attach(self, writer: asyncio.StreamWriter, last: int) -> None:
        """A (new) connection from the front, which has received every batch up to ``last``: what came
        after it, written before or not, goes out on it."""
        self.ack(last)
        self._requeue()
        self._writer = writer
        self.seen = time.monotonic()
        self._write()

    def detach(self, writer: asyncio.StreamWriter) -> None:
        if self._writer is writer:
            self._writer = None
            self.seen = time.monotonic()
            self._requeue()

    def _requeue(self) -> None:
        """What was written on a connection and not acknowledged (perhaps never read) waits to be written
        again, first."""
        if self._unacked:
            self._unwritten.extendleft(reversed(self._unacked))
            self._unwritten_bytes += sum(len(b.data) for b in self._unacked)
            self._unacked.clear()

    async def pull(self, after: int, timeout: float) -> list[bytes]:
        """For a front that reaches this shard only by Ray calls: the batches after ``after`` (those it
        has received), waiting up to ``timeout`` seconds for one; each a frame without its length."""
        self.seen = time.monotonic()
        self.ack(after)
        self._requeue()
        if not self._unwritten:
            self._sealed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._sealed.wait()
        batches = [b for b in self._unwritten if b.no > after]
        self._unwritten.clear()
        self._unwritten_bytes = 0
        self._unacked.extend(batches)
        self.seen = time.monotonic()
        return [b.data[4:] for b in batches]

    @property
    def idle_since(self) -> float | None:
        """When it lost its connection (None while it has one)."""
        return None if self._writer is not None else self.seen


class Router:
    """The shard's event-bus sink that hands each event to the streams of the fronts that want it.

    ``bus`` is the shard runtime's :class:`~runtime.bus.EventBus`; feeds change under its lock, so an event
    is routed by the feeds as they were when it was published, and a feed added before an event is
    published never misses it.
    """

    def __init__(self, bus: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._bus = bus
        self._lock: threading.RLock = bus._lock
        self._loop = loop
        self.streams: dict[str, Stream] = {}
        self._feeds: dict[tuple[str, int], Feed] = {}
        self._everything: tuple[Feed, ...] = ()
        self._by_session: dict[str, tuple[Feed, ...]] = {}
        self._children: tuple[Feed, ...] = ()

    # -- the sink (publishing threads, bus lock held) -------------------------------------------------
    def __call__(self, event: Event) -> None:
        sid = event.session_id
        subs = self._by_session.get(sid)
        feeds = self._everything if subs is None else self._everything + subs
        if self._children and event.parent_session_id is not None:
            feeds += self._ancestors_feeds(sid)
        if not feeds:
            return
        tag = event.type
        added = False
        for feed in feeds:
            types = feed.types
            if types is None or tag in types:
                feed.stream.add(event, feed.key)
                added = True
        if added:
            for feed in feeds:
                feed.stream.hurry()

    def wants(self, session_id: str, kind: str) -> bool:
        """Whether a feed wants this event, published to many sessions at once (``EventBus.publish_each``
        skips the sessions none does; a feed of every session takes such events only in ``bulk``)."""
        feeds = self._everything + self._by_session.get(session_id, ())
        return any(
            (f.bulk or f.sessions is not None) and (f.types is None or kind in f.types) for f in feeds
        ) or bool(self._children and self._ancestors_feeds(session_id))

    def _ancestors_feeds(self, sid: str) -> tuple[Feed, ...]:
        """The feeds with sub-agents that take ``sid`` as a descendant of one of their sessions."""
        found: list[Feed] = []
        for feed in self._children:
            assert feed.sessions is not None
            if sid in feed.sessions:
                continue  # (matched by session already)
            parent = self._bus.parent_of(sid)
            for _ in range(64):
                if parent is None:
                    break
                if parent[0] in feed.sessions:
                    found.append(feed)
                    break
                parent = self._bus.parent_of(parent[0])
        return tuple(found)

    # -- fronts (the shard's loop) --------------------------------------------------------------------
    def stream(self, front_id: str) -> Stream:
        stream = self.streams.get(front_id)
        if stream is None:
            self._sweep()
            stream = self.streams[front_id] = Stream(front_id, self._lock, self._loop)
        return stream

    def subscribe(
        self,
        front_id: str,
        key: int,
        sessions: str | Iterable[str],
        types: Iterable[str] | None,
        children: bool,
        bulk: bool = True,
    ) -> None:
        """Add (or replace) the feed ``key`` of a front (``bulk``: as ``Relay.bulk``)."""
        stream = self.stream(front_id)
        if isinstance(sessions, str):
            wanted = None if sessions == "*" else frozenset((sessions,))
        else:
            wanted = frozenset(sessions)
            wanted = None if "*" in wanted else wanted
        feed = Feed(key, stream, wanted, frozenset(types) if types is not None else None, children, bulk)
        with self._lock:
            self._remove((front_id, key))
            self._feeds[front_id, key] = feed
            self._place(feed)

    def unsubscribe(self, front_id: str, key: int) -> None:
        with self._lock:
            self._remove((front_id, key))

    def _place(self, feed: Feed) -> None:
        if feed.sessions is None:
            self._everything = (*self._everything, feed)
            return
        for sid in feed.sessions:
            self._by_session[sid] = (*self._by_session.get(sid, ()), feed)
        if feed.children:
            self._children = (*self._children, feed)

    def _remove(self, which: tuple[str, int]) -> None:
        feed = self._feeds.pop(which, None)
        if feed is None:
            return
        if feed.sessions is None:
            self._everything = tuple(f for f in self._everything if f is not feed)
            return
        for sid in feed.sessions:
            left = tuple(f for f in self._by_session.get(sid, ()) if f is not feed)
            if left:
                self._by_session[sid] = left
            else:
                self._by_session.pop(sid, None)
        self._children = tuple(f for f in self._children if f is not feed)

    def seal_all(self) -> dict[str, int]:
        """Seal every stream's pending events now; for each front, the number of its last batch (a turn's
        answer carries it: its events are in that batch or an earlier one)."""
        return {front_id: stream.seal() for front_id, stream in self.streams.items()}

    def _sweep(self) -> None:
        """Drop the streams of fronts gone for :data:`ABANDONED_AFTER` seconds, and their feeds."""
        now = time.monotonic()
        for front_id, stream in list(self.streams.items()):
            since = stream.idle_since
            if since is not None and now - since > ABANDONED_AFTER:
                self.drop(front_id)

    def drop(self, front_id: str) -> None:
        stream = self.streams.pop(front_id, None)
        if stream is not None:
            stream.closed = True
        with self._lock:
            for which in [w for w in self._feeds if w[0] == front_id]:
                self._remove(which)
