"""runtime.bus: stamping, routing, filtering, the three kinds of subscriber, bounded queues and lag notices,
per-session order under concurrent publishers, and a publisher that never waits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from runtime.bus import EventBus, Subscription
from runtime.events import AgentStart, Event, SessionStopped, SubscriberLagged, TextDelta

WAIT = 10.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


def delta(session: str, text: str = "x") -> TextDelta:
    return TextDelta(session_id=session, turn_id="t1", delta=text)


def test_publish_stamps_seq_per_session_and_the_time() -> None:
    bus = EventBus()
    before = time.time()
    stamped = [bus.publish(delta(sid)) for sid in ("a", "b", "a", "a", "b")]
    assert [(e.session_id, e.seq) for e in stamped] == [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)]
    assert all(before <= e.ts <= time.time() for e in stamped)
    original = delta("a")
    assert bus.publish(original) is not original and original.seq == 0  # events are immutable
    assert bus.publish(TextDelta(session_id="c", turn_id="t", delta="", ts=12.5)).ts == 12.5
    assert bus.last_seq("a") == 4
    bus.set_last_seq("a", 100)
    assert bus.publish(delta("a")).seq == 101
    bus.forget_session("a")
    assert bus.publish(delta("a")).seq == 1


def test_subscriptions_by_session_set_all_and_type() -> None:
    bus = EventBus()
    one = bus.subscribe("a")
    several = bus.subscribe(["a", "b"])
    everything = bus.subscribe("*")
    only_starts = bus.subscribe("*", types=["agent_start"])
    bus.publish(delta("a"))
    bus.publish(delta("b"))
    bus.publish(delta("c"))
    bus.publish(AgentStart(session_id="c", turn_id="t9"))

    def seen(sub: Subscription) -> list[tuple[str, str]]:
        return [(e.session_id, e.type) for e in sub.drain()]

    assert seen(one) == [("a", "text_delta")]
    assert seen(several) == [("a", "text_delta"), ("b", "text_delta")]
    assert seen(everything) == [
        ("a", "text_delta"),
        ("b", "text_delta"),
        ("c", "text_delta"),
        ("c", "agent_start"),
    ]
    assert seen(only_starts) == [("c", "agent_start")]
    assert bus.subscribe(["a", "*"]).sessions is None  # '*' anywhere means all


def test_bad_subscriptions_are_refused() -> None:
    bus = EventBus()
    with pytest.raises(ValueError, match="unknown event types"):
        bus.subscribe("*", types=["text_delta", "txt_delta"])
    with pytest.raises(ValueError, match="at least one session"):
        bus.subscribe([])
    with pytest.raises(ValueError, match="queue_size"):
        bus.subscribe("*", queue_size=0)


def test_blocking_iterator_get_timeout_and_close() -> None:
    bus = EventBus()
    sub = bus.subscribe("a")
    received: list[int] = []

    def read() -> None:
        for event in sub:
            received.append(event.seq)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(100):
        bus.publish(delta("a"))
    wait_until(lambda: len(received) == 100)
    sub.close()
    reader.join(WAIT)
    assert not reader.is_alive() and received == list(range(1, 101))
    bus.publish(delta("a"))
    assert sub.get(timeout=0) is None and sub.closed

    with bus.subscribe("b") as waiting:
        began = time.monotonic()
        assert waiting.get(timeout=0.05) is None
        assert time.monotonic() - began >= 0.04
        threading.Timer(0.02, bus.publish, args=(delta("b"),)).start()
        event = waiting.get(timeout=WAIT)
        assert event is not None and event.session_id == "b"
    assert waiting.closed


def test_flush_from_the_thread_reading_an_iterator_returns_at_once() -> None:
    """The reader cannot catch up while it waits in flush(): it returned only at its timeout (False, after
    every second of it; with no timeout, never). Called from another thread it still waits for the reader."""
    bus = EventBus()
    sub = bus.subscribe("a")
    for _ in range(3):
        bus.publish(delta("a"))
    first = next(iter(sub))
    began = time.monotonic()
    assert sub.flush(timeout=5)
    assert time.monotonic() - began < 1
    assert [e.seq for e in sub.drain()] == [2, 3] and first.seq == 1  # nothing was taken from the queue
    bus.publish(delta("a"))
    waited: list[bool] = []
    other = threading.Thread(target=lambda: waited.append(sub.flush(timeout=0.05)))
    other.start()
    other.join(WAIT)
    assert waited == [False]  # another thread: the reader has not read its event yet
    assert sub.get(timeout=0) is not None and sub.flush(timeout=0)
    sub.close()


def test_async_iterator_waits_without_blocking_the_loop() -> None:
    bus = EventBus()
    sub = bus.subscribe("a")
    ticks: list[int] = []

    async def ticker() -> None:
        for i in range(5):
            ticks.append(i)
            await asyncio.sleep(0.002)
        publisher = threading.Thread(target=lambda: [bus.publish(delta("a", str(n))) for n in range(50)])
        publisher.start()

    async def main() -> list[str]:
        texts: list[str] = []
        task = asyncio.create_task(ticker())
        async for event in sub:
            assert isinstance(event, TextDelta)
            texts.append(event.delta)
            if len(texts) == 50:
                break
        await task
        return texts

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == [str(n) for n in range(50)]
    assert ticks == [0, 1, 2, 3, 4]  # the loop ran while the subscriber waited


def test_async_readers_woken_together_from_another_thread_cost_their_loop_one_wake_up() -> None:
    """A thread that wakes many async readers of one loop (a cluster front fanning out a batch) writes to
    the loop's wake-up socket once, not once a reader: each write is a system call handing the GIL away."""
    bus = EventBus()
    subs = [bus.subscribe(f"s{n}") for n in range(100)]
    calls: list[object] = []

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counted(callback: Callable[..., object], *args: object, **kwargs: object) -> asyncio.Handle:
            calls.append(callback)
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

        async def read(sub: Subscription) -> int:
            async for event in sub:
                return event.seq
            return 0

        readers = [asyncio.create_task(read(sub)) for sub in subs]
        await asyncio.sleep(0.05)  # every reader waits
        publishing = threading.Thread(target=lambda: [bus.publish(delta(f"s{n}")) for n in range(100)])
        publishing.start()
        publishing.join()  # (the loop is held here: every reader is woken before it runs again)
        return await asyncio.gather(*readers)

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == [1] * 100
    assert len(calls) == 1


def test_async_iteration_ends_when_the_bus_closes() -> None:
    bus = EventBus()
    sub = bus.subscribe("*")
    bus.publish(delta("a"))
    bus.publish(delta("a"))

    async def main() -> list[int]:
        seqs = []
        async for event in sub:
            seqs.append(event.seq)
            if len(seqs) == 2:
                threading.Timer(0.02, bus.close).start()
        return seqs

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == [1, 2]


def test_callback_subscribers_get_events_in_order_on_their_own_thread() -> None:
    bus = EventBus()
    received: list[tuple[int, str]] = []
    sub = bus.subscribe("a", callback=lambda e: received.append((e.seq, threading.current_thread().name)))
    for _ in range(200):
        bus.publish(delta("a"))
    wait_until(lambda: len(received) == 200)
    assert [seq for seq, _ in received] == list(range(1, 201))
    assert {name for _, name in received} != {threading.current_thread().name}
    sub.close()


def test_a_callback_that_raises_keeps_receiving(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus()
    received: list[int] = []

    def callback(event: Event) -> None:
        received.append(event.seq)
        if event.seq == 1:
            raise RuntimeError("subscriber bug")

    bus.subscribe("a", callback=callback)
    bus.publish(delta("a"))
    bus.publish(delta("a"))
    wait_until(lambda: received == [1, 2])
    assert "subscriber bug" in caplog.text


def test_a_slow_subscriber_loses_its_oldest_events_and_is_told() -> None:
    bus = EventBus()
    sub = bus.subscribe("*", types=["text_delta"], queue_size=5)
    for n in range(12):
        bus.publish(delta("a", str(n)))
    first = sub.get(timeout=0)
    assert isinstance(first, SubscriberLagged)  # not filtered out by types: lag notices always arrive
    assert (first.session_id, first.dropped) == ("a", 7)
    rest = sub.drain()
    assert [e.delta for e in rest if isinstance(e, TextDelta)] == ["7", "8", "9", "10", "11"]
    assert len(rest) == 5
    assert sub.dropped == 7


def test_lag_notices_name_each_session_that_lost_events() -> None:
    bus = EventBus()
    sub = bus.subscribe("*", queue_size=4)
    bus.publish(delta("a"))  # read before the flood
    assert sub.get(timeout=0) is not None
    for sid in ["a", "b", "a", "b", "c", "c", "c", "c"]:
        bus.publish(delta(sid))
    events = sub.drain()
    notices = [(e.session_id, e.dropped) for e in events if isinstance(e, SubscriberLagged)]
    assert notices == [("a", 2), ("b", 2)]
    assert events[: len(notices)] == [e for e in events if isinstance(e, SubscriberLagged)]  # notices first
    assert [(e.session_id, e.seq) for e in events[2:]] == [("c", 1), ("c", 2), ("c", 3), ("c", 4)]


def test_a_reader_keeps_at_most_queue_size_unread_events() -> None:
    bus = EventBus()
    sub = bus.subscribe("a", queue_size=3)
    for _ in range(3):
        bus.publish(delta("a"))
    first = sub.get(timeout=0)
    assert first is not None and first.seq == 1 and sub.pending == 2  # seqs 2 and 3 unread
    for _ in range(5):
        bus.publish(delta("a"))  # seqs 4..8 into a queue of 3: the oldest unread, 2 to 5, are dropped
    assert sub.pending == 3
    events = sub.drain()
    assert [e.seq if not isinstance(e, SubscriberLagged) else f"lag {e.dropped}" for e in events] == [
        "lag 4",
        6,
        7,
        8,
    ]


@pytest.mark.parametrize("queue_size", [100_000, 50])
def test_thread_readers_racing_publishers_get_every_event_or_a_count_of_it(queue_size: int) -> None:
    """Readers take events off their queues while publishers on other threads fill them: each reader sees
    each session's events in order, and every event is either read or counted in a lag notice."""
    bus = EventBus()
    sessions, per_session = ("s0", "s1", "s2"), 3_000
    subs = [bus.subscribe("*", queue_size=queue_size) for _ in range(4)]
    seen: list[dict[str, list[int]]] = [{sid: [] for sid in sessions} for _ in subs]
    notified: list[dict[str, int]] = [dict.fromkeys(sessions, 0) for _ in subs]

    def read(i: int) -> None:
        for event in subs[i]:  # blocks without a timeout: a missed wake-up hangs the reader
            if isinstance(event, SubscriberLagged):
                notified[i][event.session_id] += event.dropped
            else:
                seen[i][event.session_id].append(event.seq)

    def publish(sid: str) -> None:
        for n in range(1, per_session + 1):
            bus.publish(delta(sid))
            if n % 500 == 0:
                time.sleep(0.001)  # let the readers catch up and go back to sleep now and then

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(subs))]
    publishers = [threading.Thread(target=publish, args=(sid,)) for sid in sessions]
    for thread in (*readers, *publishers):
        thread.start()
    for thread in publishers:
        thread.join(WAIT)
    bus.close()  # the readers read what is queued, then their iteration ends
    for thread in (*publishers, *readers):
        thread.join(WAIT)
        assert not thread.is_alive()
    for i, sub in enumerate(subs):
        for sid in sessions:
            seqs = seen[i][sid]
            assert seqs == sorted(set(seqs))  # in order, none twice
            assert len(seqs) + notified[i][sid] == per_session  # read, or counted as lost
        assert sub.dropped == sum(notified[i].values())
        if queue_size > 3 * per_session:
            assert sub.dropped == 0


def test_publishing_never_waits_for_subscribers() -> None:
    bus = EventBus()
    never_read = bus.subscribe("*", queue_size=10)
    stuck = threading.Event()
    bus.subscribe("*", queue_size=10, callback=lambda e: stuck.wait(WAIT))
    began = time.monotonic()
    for _ in range(10_000):
        bus.publish(delta("a"))
    assert time.monotonic() - began < WAIT / 2  # a blocked callback held nothing up
    stuck.set()
    assert never_read.dropped == 9_990 and never_read.pending == 10


def test_per_session_order_with_publishers_on_several_threads() -> None:
    bus = EventBus()
    everything = bus.subscribe("*", queue_size=100_000)
    shared = bus.subscribe("shared", queue_size=100_000)
    barrier = threading.Barrier(4)

    def publish(own: str) -> None:
        barrier.wait()
        for n in range(2_000):
            bus.publish(delta(own, str(n)))
            bus.publish(delta("shared", f"{own}:{n}"))

    threads = [threading.Thread(target=publish, args=(f"s{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = everything.drain()
    assert len(events) == 16_000 and everything.dropped == 0
    by_session: dict[str, list[TextDelta]] = {}
    for event in events:
        assert isinstance(event, TextDelta)
        by_session.setdefault(event.session_id, []).append(event)
    for sid in ("s0", "s1", "s2", "s3"):
        assert [e.seq for e in by_session[sid]] == list(range(1, 2_001))
        assert [e.delta for e in by_session[sid]] == [str(n) for n in range(2_000)]
    assert [e.seq for e in by_session["shared"]] == list(range(1, 8_001))
    assert [e.seq for e in shared.drain()] == list(range(1, 8_001))
    for sid in ("s0", "s1", "s2", "s3"):  # each publisher's own order survives in the shared session too
        mine = [e.delta for e in by_session["shared"] if e.delta.startswith(f"{sid}:")]
        assert mine == [f"{sid}:{n}" for n in range(2_000)]


def test_sinks_see_every_event_in_publish_order_before_publish_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    seen: list[tuple[str, int]] = []

    def broken(event: Event) -> None:
        raise OSError("disk full")

    bus.add_sink(broken)
    bus.add_sink(lambda e: seen.append((e.session_id, e.seq)))
    stamped = bus.publish(delta("a"))
    assert seen == [("a", 1)] and stamped.seq == 1  # already there when publish returned
    for sid in "babc":
        bus.publish(delta(sid))
    assert seen == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("c", 1)]

    def sink_failures() -> int:
        return sum("event sink" in r.getMessage() and r.exc_info is not None for r in caplog.records)

    assert sink_failures() == 5
    bus.remove_sink(broken)
    bus.publish(delta("a"))
    assert sink_failures() == 5 and len(seen) == 6


def test_a_sink_may_publish_without_deadlocking() -> None:
    bus = EventBus()
    sub = bus.subscribe("*")
    bus.add_sink(
        lambda e: bus.publish(AgentStart(session_id="echo", turn_id="t")) if e.session_id == "a" else None
    )
    bus.publish(delta("a"))
    assert sorted(e.session_id for e in sub.drain()) == ["a", "echo"]


def test_closing_the_bus_lets_readers_drain_then_stop() -> None:
    bus = EventBus()
    sub = bus.subscribe("a")
    for _ in range(3):
        bus.publish(delta("a"))
    bus.close()
    bus.publish(delta("a"))  # after close: not delivered to the ended subscription
    assert [e.seq for e in sub] == [1, 2, 3]
    assert sub.closed and bus.subscriber_count == 0
    late = bus.subscribe("a")
    bus.publish(delta("a"))
    assert [e.seq for e in late.drain()] == [5]


def test_publish_each_makes_events_only_for_subscribers_that_take_them_in_bulk() -> None:
    """An event published to many sessions at once (the runtime's stop: ``session_stopped`` of each hosted
    session) is made for every session only if an all-sessions subscriber takes its type in bulk. One that
    reads other types (a drain counting turns) or subscribed with ``bulk=False`` (the spans: they end what
    they hold when the bus closes) forces none and gets none; one of its own session still gets it."""
    bus = EventBus()
    sessions = [f"s{i}" for i in range(1_000)]
    turns = bus.subscribe("*", ["agent_start", "agent_end"])
    spans = bus.subscribe("*", ["agent_start", "session_stopped"], bulk=False)
    one = bus.subscribe("s7", ["session_stopped"], bulk=False)

    def stopped(sid: str) -> Event:
        return SessionStopped(session_id=sid)

    assert bus.publish_each(sessions, "session_stopped", stopped) == 1
    assert [e.session_id for e in one.drain()] == ["s7"]
    assert turns.drain() == [] and spans.drain() == []
    assert bus.last_seq("s1") == 0  # never made nor numbered

    everyone = bus.subscribe("*")  # a user's all-sessions subscriber asked for every event: it gets them
    assert bus.publish_each(sessions, "session_stopped", stopped) == 1_000
    assert [e.session_id for e in everyone.drain()] == sessions
    assert spans.drain() == []  # not even those published for another subscriber
    bus.publish(SessionStopped(session_id="s3"))  # a session stopped on its own: to every subscriber
    assert [e.session_id for e in spans.drain()] == ["s3"]


def test_a_lingering_callback_reads_a_burst_in_one_go_and_a_flush_ends_its_wait() -> None:
    """With ``linger``, a callback that has read everything waits before it sleeps on its queue: what is
    published meanwhile wakes nobody (each wake is a thread switch) and is read in one go when the wait ends;
    ``flush`` ends the wait at once and returns once the callback has seen every event."""
    bus = EventBus()
    seen: list[int] = []
    sub = bus.subscribe("s", callback=lambda e: seen.append(e.seq), linger=5.0)
    bus.publish(delta("s"))
    wait_until(lambda: seen == [1])
    for _ in range(50):
        bus.publish(delta("s"))
    time.sleep(0.1)
    assert seen == [1]  # lingering: none of the 50 woke it
    began = time.monotonic()
    assert sub.flush(timeout=WAIT)
    assert seen == list(range(1, 52)) and time.monotonic() - began < 2.5
    sub.close()
