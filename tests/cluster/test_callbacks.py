"""A front's callback subscriptions run on a few shared threads (runtime.cluster._callbacks), without Ray: a
thousand subscriptions cost a few threads, not a thousand; each callback still sees its events once and in
order, lag notices before the next event, and a slow callback only makes its own subscriber wait."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from runtime import events as ev
from runtime.bus import EventBus
from runtime.cluster import _callbacks
from runtime.cluster._callbacks import Callbacks
from runtime.cluster._events import Inbound, Relay
from runtime.cluster._stream import PUSH, Push, _encoder


def delta(sid: str, n: int) -> ev.TextDelta:
    return ev.TextDelta(session_id=sid, turn_id="t", delta=f"{n} ")


def frame(no: int, events: list[ev.Event], keys: list[int]) -> bytes:
    return bytes((PUSH,)) + _encoder.encode(Push(no, events, keys))  # type: ignore[arg-type]


def wait_for(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return bool(check())


def test_a_thousand_callback_subscriptions_of_a_front_run_on_a_few_threads_each_in_order() -> None:
    before = threading.active_count()
    pool = Callbacks()
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    def record(event: ev.Event) -> None:
        assert isinstance(event, ev.TextDelta)
        with lock:
            seen.setdefault(event.session_id, []).append(int(event.delta))

    sids = [f"s{n:04d}" for n in range(1000)]
    relays = {
        n + 1: Relay(n + 1, sid, None, queue_size=10_000, callback=record, callbacks=pool)
        for n, sid in enumerate(sids)
    }
    assert threading.active_count() - before <= pool.workers + 1  # (+ the thread that watches for slow ones)
    inbound = Inbound("shard", relays)
    bus = EventBus()  # numbers the events as a shard's bus does
    no = 0
    for n in range(20):
        events = [bus.publish(delta(sid, n)) for sid in sids]
        for start in range(0, len(events), 64):
            no += 1
            chunk = events[start : start + 64]
            inbound.push(frame(no, chunk, [sids.index(e.session_id) + 1 for e in chunk]))
    assert all(relay.subscription.flush(timeout=30) for relay in relays.values())
    assert seen == {sid: list(range(20)) for sid in sids}
    for relay in relays.values():
        relay.close()


def test_slow_callbacks_hold_back_no_other_subscriber_and_one_that_blocks_gets_its_own_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_callbacks, "OWN_AFTER", 2.0)
    pool = Callbacks(workers=1, slow_after=0.05)
    bus = EventBus()
    release = threading.Event()
    blocked: dict[str, list[int]] = {"a": [], "b": []}
    quick_seen: list[int] = []

    def blocking(event: ev.Event) -> None:
        assert isinstance(event, ev.TextDelta)
        if int(event.delta) == 0:
            release.wait(30)
        blocked[event.session_id].append(int(event.delta))

    def quick(event: ev.Event) -> None:
        assert isinstance(event, ev.TextDelta)
        quick_seen.append(int(event.delta))

    subs = {sid: bus.subscribe(sid) for sid in ("a", "b", "c")}
    pool.drive(subs["a"], blocking)
    pool.drive(subs["b"], blocking)
    pool.drive(subs["c"], quick)
    bus.publish(delta("a", 0))  # the pool's one thread blocks in it, then the next one started meanwhile
    bus.publish(delta("b", 0))
    for n in range(50):
        bus.publish(delta("c", n))
        bus.publish(delta("a", n + 1))
    assert wait_for(lambda: len(quick_seen) == 50, 1.5)  # on threads started meanwhile
    assert pool.detached == 0
    assert wait_for(lambda: pool.detached == 2, 5)  # blocked for 2 s: their subscriptions keep them
    assert blocked == {"a": [], "b": []}
    release.set()
    assert subs["a"].flush(timeout=10) and subs["b"].flush(timeout=10)
    assert blocked == {"a": list(range(51)), "b": [0]}  # their own threads read on, in order
    assert quick_seen == list(range(50))
    for sub in subs.values():
        sub.close()


def test_a_callback_behind_its_queue_bound_reads_the_loss_before_its_next_event() -> None:
    pool = Callbacks(workers=1, slow_after=60.0)  # (no thread of its own: it waits on the pool's)
    bus = EventBus()
    gate = threading.Event()
    got: list[ev.Event] = []

    def read(event: ev.Event) -> None:
        if not got:
            gate.wait(30)
        got.append(event)

    sub = bus.subscribe("s", queue_size=10)
    pool.drive(sub, read)
    bus.publish(delta("s", 0))
    assert wait_for(lambda: not sub._queue, 5)  # the callback is stuck on event 0
    for n in range(1, 31):
        bus.publish(delta("s", n))
    gate.set()
    assert sub.flush(timeout=10)
    lagged = [e for e in got if isinstance(e, ev.SubscriberLagged)]
    deltas = [int(e.delta) for e in got if isinstance(e, ev.TextDelta)]
    assert [e.dropped for e in lagged] == [20]
    assert isinstance(got[1], ev.SubscriberLagged)  # before the next event
    assert deltas == [0, *range(21, 31)]
    sub.close()


def test_a_failing_callback_is_logged_and_its_subscription_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    pool = Callbacks()
    bus = EventBus()
    got: list[int] = []

    def read(event: ev.Event) -> None:
        assert isinstance(event, ev.TextDelta)
        if event.delta == "1 ":
            raise RuntimeError("boom")
        got.append(int(event.delta))

    sub = bus.subscribe("s")
    pool.drive(sub, read)
    for n in range(3):
        bus.publish(delta("s", n))
    assert sub.flush(timeout=10)
    assert got == [0, 2]
    assert "boom" in caplog.text
    sub.close()


def test_the_pools_threads_end_once_their_subscriptions_have(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_callbacks, "IDLE", 0.05)
    pool = Callbacks()
    bus = EventBus()
    got: list[ev.Event] = []
    sub = bus.subscribe("s")
    pool.drive(sub, got.append)
    bus.publish(delta("s", 0))
    assert sub.flush(timeout=10)
    bus.close()  # the subscription ends once what is queued has been read
    assert wait_for(lambda: not pool._pool, 5)
    assert len(got) == 1
    bus.publish(delta("s", 1))
    sub2 = bus.subscribe("s")
    pool.drive(sub2, got.append)  # a new subscription starts threads again
    bus.publish(delta("s", 2))
    assert sub2.flush(timeout=10)
    assert [e.delta for e in got if isinstance(e, ev.TextDelta)] == ["0 ", "2 "]
    sub2.close()
