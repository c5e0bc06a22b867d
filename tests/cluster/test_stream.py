"""A shard's stream of events to a front (runtime.cluster._stream), without Ray: what a front misses while it
cannot take the events is reported as ``subscriber_lagged``, and a reconnection resends what it did not
acknowledge."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import pytest

from runtime import events as ev
from runtime.bus import EventBus
from runtime.cluster import _stream
from runtime.cluster._events import Inbound, Relay
from runtime.cluster._stream import Router


def delta(n: int) -> ev.TextDelta:
    return ev.TextDelta(session_id="s", turn_id="t", delta=f"{n:04d}" * 50)


async def connected() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose far end this test reads itself: (that end's reader, the shard's writer)."""
    near, far = socket.socketpair()
    reader, _ = await asyncio.open_connection(sock=far)
    _kept.append(_)
    kept, writer = await asyncio.open_connection(sock=near)
    _kept.append(kept)
    return reader, writer


_kept: list[Any] = []


async def read_batches(reader: asyncio.StreamReader, inbound: Inbound, until: int) -> None:
    while inbound.received < until:
        size = int.from_bytes(await reader.readexactly(4), "big")
        inbound.push(await reader.readexactly(size))


def test_events_a_front_cannot_take_are_dropped_and_reported_as_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stream, "BUDGET", 20_000)  # a few batches' worth

    async def main() -> tuple[list[Any], int]:
        bus = EventBus()
        router = Router(bus, asyncio.get_running_loop())
        bus.add_sink(router)
        router.subscribe("front", 1, ["s"], ["text_delta"], False)
        relay = Relay(1, "s", ["text_delta"], queue_size=10_000)
        inbound = Inbound("shard", {1: relay})
        stream = router.streams["front"]
        for n in range(300):  # no connection: everything waits, the oldest past the budget are dropped
            bus.publish(delta(n))
            if n % 10 == 9:
                stream.seal()
        reader, writer = await connected()
        stream.attach(writer, 0)
        bus.publish(delta(300))
        await asyncio.sleep(0.05)
        await read_batches(reader, inbound, stream.no)
        writer.close()
        return relay.subscription.drain(), relay.subscription.dropped

    events, dropped = asyncio.run(main())
    lagged = [e for e in events if isinstance(e, ev.SubscriberLagged)]
    kept = [e for e in events if isinstance(e, ev.TextDelta)]
    assert lagged and dropped == sum(e.dropped for e in lagged) > 0
    assert dropped + len(kept) == 301  # every event delivered or counted as lost
    assert [e.seq for e in kept] == list(range(302 - len(kept), 302))  # the newest kept, in order


def test_a_reconnected_front_gets_what_it_did_not_acknowledge_once() -> None:
    async def main() -> list[int]:
        bus = EventBus()
        router = Router(bus, asyncio.get_running_loop())
        bus.add_sink(router)
        router.subscribe("front", 7, "*", None, False)
        relay = Relay(7, "*", None, queue_size=10_000)
        inbound = Inbound("shard", {7: relay})
        stream = router.streams["front"]
        reader, writer = await connected()
        stream.attach(writer, 0)
        for n in range(5):
            bus.publish(delta(n))
            stream.seal()
        await read_batches(reader, inbound, 2)  # the front read two batches; three are in the socket
        stream.ack(1)  # and acknowledged one
        stream.detach(writer)  # the connection broke
        writer.close()
        bus.publish(delta(5))  # (while it is down)
        stream.seal()
        again, writer2 = await connected()
        stream.attach(writer2, inbound.received)
        await read_batches(again, inbound, stream.no)
        writer2.close()
        return [e.seq for e in relay.subscription.drain()]

    assert asyncio.run(main()) == [1, 2, 3, 4, 5, 6]


def test_events_published_during_a_long_turn_of_the_shards_loop_go_out_before_it_ends() -> None:
    """A shard runs through hundreds of sessions' chunks in one turn of its loop (100 ms and more on a
    loaded machine): its subscribers get what was published early in that turn without waiting for its end,
    each event once, in order."""

    async def main() -> tuple[int, list[int]]:
        bus = EventBus()
        router = Router(bus, asyncio.get_running_loop())
        bus.add_sink(router)
        router.subscribe("front", 1, ["s"], ["text_delta"], False)
        relay = Relay(1, "s", ["text_delta"], queue_size=10_000)
        inbound = Inbound("shard", {1: relay})
        near, far = socket.socketpair()
        _, writer = await asyncio.open_connection(sock=near)
        router.streams["front"].attach(writer, 0)
        bus.publish(delta(0))
        await asyncio.sleep(0.01)  # the first batch goes out once the loop turns
        received = bytearray()

        def take() -> None:
            with contextlib.suppress(BlockingIOError):
                while True:
                    received.extend(far.recv(1 << 20, socket.MSG_DONTWAIT))

        take()
        for n in range(1, 100):  # one long turn of the loop: 0.2 s without yielding to it
            bus.publish(delta(n))
            time.sleep(0.002)
        take()
        early = _frames(received, inbound, relay)
        await asyncio.sleep(0.01)
        take()
        _frames(received, inbound, relay)
        writer.close()
        far.close()
        return early, [e.seq for e in relay.subscription.drain()]

    early, seqs = asyncio.run(main())
    assert early >= 90  # all but those of the last 10 ms were written during the turn
    assert seqs == list(range(1, 101))  # every event once, in order


def _frames(data: bytearray, inbound: Inbound, relay: Relay) -> int:
    """Push the whole frames in ``data`` (removed from it); how many events the relay holds then."""
    while len(data) >= 4 and len(data) >= 4 + (size := int.from_bytes(data[:4], "big")):
        inbound.push(bytes(data[4 : 4 + size]))
        del data[: 4 + size]
    inbound.wake()
    return relay.subscription.pending


def test_a_shards_stop_makes_session_stopped_only_for_relays_that_take_it_in_bulk() -> None:
    """A shard's stop publishes ``session_stopped`` to many sessions at once: a feed of every session takes
    those (and ships them to its front) only if its subscriber asked for ``session_stopped`` and did not
    subscribe with ``bulk=False`` (the front's spans); the feeds' barrier for moves does not count."""

    async def main() -> tuple[int, int]:
        bus = EventBus()
        router = Router(bus, asyncio.get_running_loop())
        bus.add_sink(router)
        sessions = [f"s{i}" for i in range(500)]
        drain = Relay(1, "*", ["agent_start", "agent_end"], queue_size=100)
        spans = Relay(2, "*", ["agent_start", "session_stopped"], queue_size=100, bulk=False)
        for relay in (drain, spans):
            router.subscribe("front", relay.key, "*", relay.shard_types(), False, relay.bulk)

        def stopped(sid: str) -> ev.Event:
            return ev.SessionStopped(session_id=sid)

        quiet = bus.publish_each(sessions, "session_stopped", stopped)
        everyone = Relay(3, "*", None, queue_size=1_000)
        router.subscribe("front", everyone.key, "*", everyone.shard_types(), False, everyone.bulk)
        return quiet, bus.publish_each(sessions, "session_stopped", stopped)

    assert asyncio.run(main()) == (0, 500)
