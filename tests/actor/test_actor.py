"""runtime.actor: pykka's contract on a shared dispatcher (behaviours ported from pykka's own suite), plus
what pooling adds: few threads, fairness, containment, monitors, kill, deferred replies, asyncio."""

from __future__ import annotations

import ast
import asyncio
import logging
import queue
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from pykka import ActorDeadError, ActorRegistry, Timeout

from runtime.actor import (
    ActorExit,
    Dispatcher,
    DispatcherClosed,
    PooledActor,
    PooledFuture,
    default_dispatcher,
    kill,
    monitor,
    set_default_dispatcher,
)

WAIT = 10.0  # generous: the suite may share two cores with other work


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(threads=2, batch_size=8, name="test-dispatcher")
    yield d
    d.shutdown(timeout=WAIT)


class Events:
    def __init__(self) -> None:
        self.on_start = threading.Event()
        self.on_stop = threading.Event()
        self.on_failure = threading.Event()
        self.greetings = threading.Event()
        self.failure: tuple[Any, ...] | None = None


class AnActor(PooledActor):
    def __init__(self, events: Events, *, fail_on_start: bool = False, fail_on_stop: bool = False) -> None:
        super().__init__()
        self.events = events
        self.fail_on_start = fail_on_start
        self.fail_on_stop = fail_on_stop
        self.started_before_first_message: bool | None = None
        self.value = 1

    def on_start(self) -> None:
        self.events.on_start.set()
        if self.fail_on_start:
            raise RuntimeError("on_start failure")

    def on_stop(self) -> None:
        self.events.on_stop.set()
        if self.fail_on_stop:
            raise RuntimeError("on_stop failure")

    def on_failure(self, *exc_info: Any) -> None:
        self.events.failure = exc_info
        self.events.on_failure.set()

    def on_receive(self, message: Any) -> Any:
        if self.started_before_first_message is None:
            self.started_before_first_message = self.events.on_start.is_set()
        match message:
            case {"command": "raise exception"}:
                raise ValueError("foo")
            case {"command": "raise base exception"}:
                raise SystemExit(7)
            case {"command": "stop twice"}:
                self.stop()
                self.stop()
            case {"command": "message self then stop"}:
                self.actor_ref.tell({"command": "greetings"})
                self.stop()
            case {"command": "greetings"}:
                self.events.greetings.set()
            case {"command": "callback", "callback": callback}:
                callback()
            case {"command": "first?"}:
                return self.started_before_first_message
            case "ping":
                return "pong"
            case _:
                return message
        return None

    def add(self, x: int) -> int:
        self.value += x
        return self.value

    def boom(self) -> None:
        raise ValueError("method failed")


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def actor_ref(dispatcher: Dispatcher, events: Events) -> Iterator[pykka.ActorRef[AnActor]]:
    ref = AnActor.start(events, dispatcher=dispatcher)
    yield ref
    ref.stop()


# --- pykka's actor behaviours ------------------------------------------------------------------------


def test_messages_left_in_queue_after_actor_stops_receive_an_error(actor_ref: pykka.ActorRef[Any]) -> None:
    gate = threading.Event()
    actor_ref.tell({"command": "callback", "callback": gate.wait})
    actor_ref.stop(block=False)
    response = actor_ref.ask({"command": "irrelevant"}, block=False)
    gate.set()
    with pytest.raises(ActorDeadError):
        response.get(timeout=WAIT)


def test_stop_requests_left_in_queue_after_actor_stops_are_handled(actor_ref: pykka.ActorRef[Any]) -> None:
    gate = threading.Event()
    actor_ref.tell({"command": "callback", "callback": gate.wait})
    actor_ref.stop(block=False)
    second = actor_ref.stop(block=False)
    gate.set()
    assert second.get(timeout=WAIT) is True


def test_actors_have_unique_uuid4_urns(dispatcher: Dispatcher, events: Events) -> None:
    refs = [AnActor.start(events, dispatcher=dispatcher) for _ in range(3)]
    assert all(uuid.UUID(ref.actor_urn).version == 4 for ref in refs)
    assert len({ref.actor_urn for ref in refs}) == 3


def test_str_and_repr_name_the_class_and_urn(actor_ref: pykka.ActorRef[Any], events: Events) -> None:
    unstarted = AnActor(events)
    assert "AnActor" in str(unstarted) and unstarted.actor_urn in str(unstarted)
    assert repr(actor_ref).startswith("<ActorRef for AnActor") and actor_ref.actor_urn in repr(actor_ref)


def test_init_accepts_arbitrary_arguments() -> None:
    PooledActor(1, 2, 3, foo="bar")


def test_on_start_runs_before_the_first_message(actor_ref: pykka.ActorRef[Any]) -> None:
    assert actor_ref.ask({"command": "first?"}, timeout=WAIT) is True


def test_on_start_can_stop_the_actor_before_any_message(dispatcher: Dispatcher, events: Events) -> None:
    class EarlyStopper(AnActor):
        def on_start(self) -> None:
            self.stop()

    ref = EarlyStopper.start(events, dispatcher=dispatcher)
    assert events.on_stop.wait(WAIT)
    wait_until(lambda: not ref.is_alive())


def test_on_start_failure_stops_the_actor(dispatcher: Dispatcher, events: Events) -> None:
    ref = AnActor.start(events, fail_on_start=True, dispatcher=dispatcher)
    assert ref.actor_stopped.wait(WAIT)
    assert not ref.is_alive()
    with pytest.raises(ActorDeadError):
        ref.ask("ping", timeout=WAIT)


def test_on_stop_runs_when_the_actor_is_stopped(actor_ref: pykka.ActorRef[Any], events: Events) -> None:
    assert not events.on_stop.is_set()
    assert actor_ref.stop(timeout=WAIT) is True
    assert events.on_stop.is_set()  # before stop() returned


def test_on_stop_failure_still_stops_the_actor(dispatcher: Dispatcher, events: Events) -> None:
    ref = AnActor.start(events, fail_on_stop=True, dispatcher=dispatcher)
    exits: list[ActorExit] = []
    monitor(ref, exits.append)
    ref.stop(timeout=WAIT)
    wait_until(lambda: bool(exits))
    assert not ref.is_alive()
    assert exits[0].reason == "failure" and str(exits[0].exception) == "on_stop failure"


def test_on_failure_runs_when_a_told_message_raises(actor_ref: pykka.ActorRef[Any], events: Events) -> None:
    actor_ref.tell({"command": "raise exception"})
    assert events.on_failure.wait(WAIT)
    assert events.failure is not None and isinstance(events.failure[1], ValueError)
    wait_until(lambda: not actor_ref.is_alive())
    assert not events.on_stop.is_set()


def test_on_failure_failure_still_stops_the_actor(dispatcher: Dispatcher, events: Events) -> None:
    class FailingOnFailure(AnActor):
        def on_failure(self, *exc_info: Any) -> None:
            self.events.on_failure.set()
            raise RuntimeError("on_failure failure")

    ref = FailingOnFailure.start(events, dispatcher=dispatcher)
    ref.tell({"command": "raise exception"})
    assert events.on_failure.wait(WAIT)
    wait_until(lambda: not ref.is_alive())


def test_an_asked_message_that_raises_goes_back_to_the_asker(actor_ref: pykka.ActorRef[Any]) -> None:
    with pytest.raises(ValueError, match="foo"):
        actor_ref.ask({"command": "raise exception"}, timeout=WAIT)
    assert actor_ref.ask("ping", timeout=WAIT) == "pong"  # and the actor lives on


def test_actor_can_call_stop_on_itself_several_times(actor_ref: pykka.ActorRef[Any]) -> None:
    actor_ref.ask({"command": "stop twice"}, timeout=WAIT)
    wait_until(lambda: not actor_ref.is_alive())


def test_messages_sent_before_stop_on_self_are_processed(
    actor_ref: pykka.ActorRef[Any], events: Events
) -> None:
    actor_ref.ask({"command": "message self then stop"}, timeout=WAIT)
    assert events.greetings.wait(WAIT)
    assert events.on_stop.wait(WAIT)


# --- pykka's ref behaviours --------------------------------------------------------------------------


def test_is_alive_and_stop_results(actor_ref: pykka.ActorRef[Any]) -> None:
    assert actor_ref.is_alive()
    assert actor_ref.stop(timeout=WAIT) is True
    assert not actor_ref.is_alive()
    assert actor_ref.stop(timeout=WAIT) is False  # already dead


@pytest.mark.parametrize("message", [123, 123.456, {"a": "dict"}, ("a", "tuple"), ["a", "list"]])
def test_tell_delivers_any_object(dispatcher: Dispatcher, message: Any) -> None:
    got: PooledFuture[Any] = PooledFuture()

    class Receiver(PooledActor):
        def on_receive(self, m: Any) -> None:
            got.set(m)

    ref = Receiver.start(dispatcher=dispatcher)
    ref.tell(message)
    assert got.get(timeout=WAIT) == message


def test_tell_and_ask_fail_once_the_actor_is_stopped(actor_ref: pykka.ActorRef[Any]) -> None:
    actor_ref.stop(timeout=WAIT)
    with pytest.raises(ActorDeadError, match="not found"):
        actor_ref.tell("a custom message")
    with pytest.raises(ActorDeadError, match="not found"):
        actor_ref.ask("ping", timeout=WAIT)
    future = actor_ref.ask("ping", block=False)
    with pytest.raises(ActorDeadError):
        future.get(timeout=WAIT)


def test_ask_blocks_for_the_answer_or_times_out(actor_ref: pykka.ActorRef[Any]) -> None:
    assert actor_ref.ask("ping", timeout=WAIT) == "pong"
    assert actor_ref.ask("ping", block=False).get(timeout=WAIT) == "pong"
    gate = threading.Event()
    actor_ref.tell({"command": "callback", "callback": gate.wait})
    with pytest.raises(Timeout):
        actor_ref.ask("ping", timeout=0.05)
    gate.set()


# --- pykka's future behaviours on PooledFuture ---------------------------------------------------------


def test_future_set_twice_fails_and_get_can_repeat() -> None:
    future: PooledFuture[int] = PooledFuture()
    future.set(1)
    with pytest.raises(queue.Full):
        future.set(2)
    assert future.get() == 1 and future.get(timeout=0) == 1


def test_get_all_waits_for_every_future_or_times_out() -> None:
    futures: list[PooledFuture[int]] = [PooledFuture() for _ in range(3)]
    futures[0].set(0)
    futures[1].set(1)
    with pytest.raises(Timeout):
        pykka.get_all(futures, timeout=0)
    threading.Timer(0.02, futures[2].set, args=(2,)).start()
    assert pykka.get_all(futures, timeout=WAIT) == [0, 1, 2]


def test_future_in_future() -> None:
    inner: PooledFuture[str] = PooledFuture()
    inner.set("foo")
    outer: PooledFuture[PooledFuture[str]] = PooledFuture()
    outer.set(inner)
    assert outer.get().get() == "foo"


def test_get_reraises_with_the_full_traceback() -> None:
    future: PooledFuture[int] = PooledFuture()
    try:
        raise NameError("foo")
    except NameError:
        set_tb = sys.exc_info()[2]
        future.set_exception()
    with pytest.raises(NameError) as caught:
        future.get()
    set_frames = traceback.extract_tb(set_tb)
    get_frames = traceback.extract_tb(caught.value.__traceback__)
    assert len(get_frames) > len(set_frames)
    assert list(reversed(get_frames))[: len(set_frames)] == list(reversed(set_frames))


def test_get_hook_semantics() -> None:
    calls: list[float | None] = []
    future: PooledFuture[int] = PooledFuture()
    future.set_get_hook(lambda timeout: calls.append(timeout) or 123)  # type: ignore[func-returns-value]
    with pytest.raises(queue.Full):
        future.set(456)
    with pytest.raises(queue.Full):
        future.set_exception((ValueError, ValueError(), None))
    assert future.get(timeout=0) == 123 and future.get() == 123
    assert calls == [0]
    done: PooledFuture[int] = PooledFuture()
    done.set(1)
    with pytest.raises(queue.Full):
        done.set_get_hook(lambda timeout: 2)


def test_map_filter_join_and_reduce() -> None:
    a: PooledFuture[Iterable[int]] = PooledFuture()
    b: PooledFuture[int] = PooledFuture()
    mapped = a.map(lambda xs: len(list(xs)))
    filtered = a.filter(lambda x: x > 1)
    reduced = a.reduce(lambda x, y: x + y, 10)
    joined = b.join(a)
    a.set([1, 2, 3])
    b.set(7)
    assert mapped.get(timeout=WAIT) == 3
    assert filtered.get(timeout=WAIT) == [2, 3]
    assert reduced.get(timeout=WAIT) == 16
    assert joined.get(timeout=WAIT) == [7, [1, 2, 3]]


def test_done_callbacks_run_once_set_or_at_once_if_already_set(caplog: pytest.LogCaptureFixture) -> None:
    future: PooledFuture[int] = PooledFuture()
    seen: list[int] = []
    future.add_done_callback(lambda f: seen.append(f.get()))
    future.add_done_callback(lambda f: 1 / 0)  # logged, never raised into set()
    assert not future.done() and seen == []
    future.set(5)
    assert future.done() and seen == [5]
    future.add_done_callback(lambda f: seen.append(f.get() + 1))
    assert seen == [5, 6]
    assert "future callback" in caplog.text


def test_future_supports_await_and_yield_from() -> None:
    future: PooledFuture[int] = PooledFuture()
    future.set(1)

    async def awaited() -> int:
        return await future

    assert asyncio.run(awaited()) == 1


def test_awaiting_a_pending_future_does_not_block_the_event_loop() -> None:
    future: PooledFuture[str] = PooledFuture()
    ticks: list[int] = []

    async def ticker() -> None:
        for i in range(5):
            ticks.append(i)
            await asyncio.sleep(0.005)
        threading.Thread(target=future.set, args=("done",)).start()

    async def main() -> str:
        ticking = asyncio.create_task(ticker())
        value = await future  # the ticker runs while we wait
        await ticking
        return value

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == "done"
    assert ticks == [0, 1, 2, 3, 4]


def test_awaiting_asks_and_proxy_calls_and_derived_futures(actor_ref: pykka.ActorRef[AnActor]) -> None:
    async def main() -> tuple[Any, Any, Any, Any]:
        pong = await actor_ref.ask("ping", block=False)
        added = await actor_ref.proxy().add(5)
        doubled = await actor_ref.ask(21, block=False).map(lambda x: x * 2)
        stopped = await actor_ref.stop(block=False)
        return pong, added, doubled, stopped

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == ("pong", 6, 42, True)


def test_an_awaited_failure_raises_in_the_coroutine(actor_ref: pykka.ActorRef[AnActor]) -> None:
    async def main() -> None:
        await actor_ref.proxy().boom()

    with pytest.raises(ValueError, match="method failed"):
        asyncio.run(asyncio.wait_for(main(), WAIT))


# --- proxies -------------------------------------------------------------------------------------------


class Playback:
    pykka_traversable = True

    def __init__(self) -> None:
        self.playing = False

    def play(self) -> bool:
        self.playing = True
        return True


class ProxyActor(PooledActor):
    playback = pykka.traversable(Playback())

    def __init__(self) -> None:
        super().__init__()
        self.name = "proxied"
        self.calls: list[str] = []
        self._in_future = self.actor_ref.proxy()

    def work(self, part: int) -> None:
        self.calls.append(f"part {part}")
        if part < 3:
            self._in_future.work(part + 1)  # offload the rest of the work to later messages

    def fail(self) -> None:
        raise ValueError("deferred failure")


def test_proxy_attribute_access_method_calls_and_traversables(dispatcher: Dispatcher) -> None:
    proxy = ProxyActor.start(dispatcher=dispatcher).proxy()
    assert proxy.name.get(timeout=WAIT) == "proxied"
    proxy.name = "renamed"
    assert proxy.name.get(timeout=WAIT) == "renamed"
    assert proxy.playback.play().get(timeout=WAIT) is True
    assert proxy.playback.playing.get(timeout=WAIT) is True
    with pytest.raises(AttributeError):
        proxy.no_such_attribute  # noqa: B018
    proxy.work(1).get(timeout=WAIT)
    wait_until(lambda: proxy.calls.get(timeout=WAIT) == ["part 1", "part 2", "part 3"])


def test_deferred_proxy_call_failure_triggers_on_failure(dispatcher: Dispatcher, events: Events) -> None:
    ref = AnActor.start(events, dispatcher=dispatcher)
    ref.proxy().boom.defer()
    assert events.on_failure.wait(WAIT)
    wait_until(lambda: not ref.is_alive())
    with pytest.raises(ActorDeadError):
        ref.proxy()


# --- pooling -------------------------------------------------------------------------------------------


def test_many_actors_share_the_dispatchers_threads(dispatcher: Dispatcher) -> None:
    threads_before = threading.active_count()
    seen: set[str] = set()

    class Recorder(PooledActor):
        def on_receive(self, message: Any) -> None:
            seen.add(threading.current_thread().name)

    refs = [Recorder.start(dispatcher=dispatcher) for _ in range(2_000)]
    for ref in refs:
        ref.tell("hi")
    for ref in refs[-10:]:
        ref.ask("sync", timeout=WAIT)
    assert threading.active_count() == threads_before
    assert seen and seen <= {t.name for t in dispatcher._workers}
    assert len(dispatcher) == 2_000
    assert all(ActorRegistry.get_by_urn(ref.actor_urn) is None for ref in refs[:5])  # not in pykka's list
    assert dispatcher.get_by_urn(refs[0].actor_urn) is refs[0]


def test_one_message_at_a_time_even_with_many_senders(dispatcher: Dispatcher) -> None:
    class Guarded(PooledActor):
        def __init__(self) -> None:
            super().__init__()
            self.inside = 0
            self.overlaps = 0
            self.count = 0

        def on_receive(self, message: Any) -> int:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1
            time.sleep(0)  # invite another thread in
            self.count += 1
            self.inside -= 1
            return self.count

    ref = Guarded.start(dispatcher=dispatcher)

    def send() -> None:
        for i in range(500):
            ref.tell(i)

    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    proxy = ref.proxy()
    wait_until(lambda: proxy.count.get(timeout=WAIT) == 2_000)
    assert proxy.overlaps.get(timeout=WAIT) == 0


def test_messages_from_one_sender_arrive_in_order(dispatcher: Dispatcher) -> None:
    class Log(PooledActor):
        def __init__(self) -> None:
            super().__init__()
            self.by_sender: dict[int, list[int]] = {}

        def on_receive(self, message: tuple[int, int]) -> None:
            sender, n = message
            self.by_sender.setdefault(sender, []).append(n)

    ref = Log.start(dispatcher=dispatcher)

    def send(sender: int) -> None:
        for n in range(1_000):
            ref.tell((sender, n))

    senders = [threading.Thread(target=send, args=(s,)) for s in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    by_sender = ref.proxy().by_sender.get(timeout=WAIT)
    assert by_sender == {s: list(range(1_000)) for s in range(4)}


def test_a_busy_actor_yields_its_thread_after_a_batch() -> None:
    single = Dispatcher(threads=1, batch_size=10)
    try:
        gate = threading.Event()

        class Busy(PooledActor):
            def __init__(self) -> None:
                super().__init__()
                self.count = 0

            def on_receive(self, message: Any) -> None:
                if message == "hold":
                    gate.wait(WAIT)
                self.count += 1

        busy = Busy.start(dispatcher=single)
        busy_proxy = busy.proxy()
        seen_by_other: PooledFuture[int] = PooledFuture()

        class Other(PooledActor):
            def on_receive(self, message: Any) -> None:
                assert busy_actor is not None
                seen_by_other.set(busy_actor.count)

        busy.tell("hold")  # occupies the only thread until the backlog below is queued
        for _ in range(1_000):
            busy.tell("work")
        busy_actor = busy._actor_weakref()
        Other.start(dispatcher=single).tell("go")
        gate.set()
        assert seen_by_other.get(timeout=WAIT) <= 10  # one batch, then the other actor's turn
        wait_until(lambda: busy_proxy.count.get(timeout=WAIT) == 1_001)
    finally:
        single.shutdown(timeout=WAIT)


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt(), ValueError("plain")])
def test_a_failure_stops_only_that_actor(
    dispatcher: Dispatcher, events: Events, error: BaseException
) -> None:
    class Crasher(PooledActor):
        def on_receive(self, message: Any) -> None:
            raise error

    class Other(pykka.ThreadingActor):  # pykka would stop this one too on a BaseException
        def on_receive(self, message: Any) -> str:
            return "still here"

    bystander = AnActor.start(events, dispatcher=dispatcher)
    threaded = Other.start()
    try:
        crasher = Crasher.start(dispatcher=dispatcher)
        exits: list[ActorExit] = []
        monitor(crasher, exits.append)
        crasher.tell("crash")
        wait_until(lambda: bool(exits))
        assert exits[0].reason == "failure" and exits[0].exception is error
        assert not crasher.is_alive()
        assert bystander.ask("ping", timeout=WAIT) == "pong"
        assert threaded.ask("?", timeout=WAIT) == "still here"
        assert all(t.is_alive() for t in dispatcher._workers)
    finally:
        threaded.stop()


def test_a_base_exception_while_asked_fails_the_actor_and_the_asker(
    dispatcher: Dispatcher, events: Events
) -> None:
    ref = AnActor.start(events, dispatcher=dispatcher)
    with pytest.raises(ActorDeadError, match="SystemExit"):
        ref.ask({"command": "raise base exception"}, timeout=WAIT)
    assert events.on_failure.wait(WAIT)
    wait_until(lambda: not ref.is_alive())


# --- monitors, kill, deferred replies ------------------------------------------------------------------


class Watcher(PooledActor):
    def __init__(self) -> None:
        super().__init__()
        self.exits: list[ActorExit] = []

    def on_receive(self, message: Any) -> None:
        if isinstance(message, ActorExit):
            self.exits.append(message)


def test_a_monitoring_actor_is_told_how_the_other_ended(dispatcher: Dispatcher, events: Events) -> None:
    watcher = Watcher.start(dispatcher=dispatcher)
    normal = AnActor.start(events, dispatcher=dispatcher)
    failing = AnActor.start(Events(), dispatcher=dispatcher)
    monitor(normal, watcher)
    monitor(failing, watcher)
    normal.stop(timeout=WAIT)
    failing.tell({"command": "raise exception"})
    exits = watcher.proxy().exits
    wait_until(lambda: len(exits.get(timeout=WAIT)) == 2)
    by_ref = {e.ref.actor_urn: e for e in exits.get(timeout=WAIT)}
    assert by_ref[normal.actor_urn].reason == "normal" and not by_ref[normal.actor_urn].abnormal
    assert by_ref[failing.actor_urn].reason == "failure" and by_ref[failing.actor_urn].abnormal


def test_monitoring_a_dead_actor_reports_its_exit_at_once_and_cancel_stops_reports(
    dispatcher: Dispatcher, events: Events
) -> None:
    ref = AnActor.start(events, dispatcher=dispatcher)
    cancelled: list[ActorExit] = []
    monitor(ref, cancelled.append).cancel()
    ref.tell({"command": "raise exception"})
    wait_until(lambda: not ref.is_alive())
    late: list[ActorExit] = []
    monitor(ref, late.append)
    wait_until(lambda: bool(late))
    assert late[0].reason == "failure" and isinstance(late[0].exception, ValueError)
    assert cancelled == []
    with pytest.raises(TypeError):
        monitor(pykka.ThreadingActor.start(), late.append).cancel()
    ActorRegistry.stop_all()


def test_kill_stops_at_once_without_on_stop_and_fails_pending_asks(
    dispatcher: Dispatcher, events: Events
) -> None:
    ref = AnActor.start(events, dispatcher=dispatcher)
    exits: list[ActorExit] = []
    monitor(ref, exits.append)
    gate = threading.Event()
    ref.tell({"command": "callback", "callback": gate.wait})  # a handler that cannot be interrupted
    pending = ref.ask("ping", block=False)
    assert kill(ref) is True
    assert [e.reason for e in exits] == ["killed"]  # told at once, while the handler still runs
    assert not ref.is_alive()
    gate.set()
    with pytest.raises(ActorDeadError):
        pending.get(timeout=WAIT)
    wait_until(lambda: len(dispatcher) == 0)
    assert not events.on_stop.is_set()
    assert kill(pykka.ThreadingActor.start()) is False
    ActorRegistry.stop_all()


def test_an_idle_actor_can_be_killed(dispatcher: Dispatcher, events: Events) -> None:
    ref = AnActor.start(events, dispatcher=dispatcher)
    ref.ask("ping", timeout=WAIT)
    kill(ref)
    assert not ref.is_alive() and len(dispatcher) == 0


def test_defer_reply_answers_an_ask_later_without_blocking_the_thread() -> None:
    single = Dispatcher(threads=1)  # a blocking ask between the two actors would deadlock here
    try:

        class Backend(PooledActor):
            def on_receive(self, message: int) -> int:
                return message * 10

        class Frontend(PooledActor):
            def __init__(self, backend: pykka.ActorRef[Backend]) -> None:
                super().__init__()
                self.backend = backend

            def on_receive(self, message: int) -> None:
                reply = self.defer_reply()
                assert reply is not None
                answer = self.backend.ask(message, block=False)
                answer.add_done_callback(lambda f: reply.set(f.get() + 1))  # type: ignore[attr-defined]

        front = Frontend.start(Backend.start(dispatcher=single), dispatcher=single)
        assert [front.ask(n, timeout=WAIT) for n in range(3)] == [1, 11, 21]
        front.tell(5)  # a tell has no reply to defer
    finally:
        single.shutdown(timeout=WAIT)


def test_blocking_on_a_future_inside_a_handler_is_warned_about(
    dispatcher: Dispatcher, caplog: pytest.LogCaptureFixture
) -> None:
    import runtime.actor._future as actor_module

    class Blocker(PooledActor):
        def on_receive(self, message: Any) -> Any:
            future: PooledFuture[int] = PooledFuture()
            threading.Timer(0.01, future.set, args=(1,)).start()
            return future.get(timeout=WAIT)

    actor_module._warned_blocking = False
    with caplog.at_level(logging.WARNING, logger="agentcell.actor"):
        assert Blocker.start(dispatcher=dispatcher).ask("x", timeout=WAIT) == 1
    assert "blocking on Future.get()" in caplog.text


# --- the dispatcher ------------------------------------------------------------------------------------


def test_shutdown_stops_actors_newest_first_and_refuses_new_ones() -> None:
    d = Dispatcher(threads=2)
    order: list[int] = []

    class Numbered(PooledActor):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n

        def on_stop(self) -> None:
            order.append(self.n)

    single = Dispatcher(threads=1)  # one thread: the stops run in the order they were sent
    refs = [Numbered.start(n, dispatcher=single) for n in range(5)]
    assert single.shutdown(timeout=WAIT) is True
    assert order == [4, 3, 2, 1, 0]
    assert not any(ref.is_alive() for ref in refs)
    with pytest.raises(DispatcherClosed):
        Numbered.start(9, dispatcher=single)
    assert d.shutdown(timeout=WAIT) is True


def test_shutdown_cannot_run_on_its_own_thread(dispatcher: Dispatcher) -> None:
    class Suicidal(PooledActor):
        def on_receive(self, message: Any) -> Any:
            return dispatcher.shutdown()

    with pytest.raises(RuntimeError, match="own threads"):
        Suicidal.start(dispatcher=dispatcher).ask("go", timeout=WAIT)


def test_stopping_many_actors(dispatcher: Dispatcher) -> None:
    refs = [PooledActor.start(dispatcher=dispatcher) for _ in range(20_000)]
    assert len(dispatcher) == 20_000
    assert dispatcher.shutdown(timeout=60) is True
    assert len(dispatcher) == 0 and not refs[0].is_alive()


def test_call_later_runs_unless_cancelled(dispatcher: Dispatcher) -> None:
    fired = threading.Event()
    skipped = threading.Event()
    dispatcher.call_later(0.2, skipped.set).cancel()
    dispatcher.call_later(0.01, fired.set)
    assert fired.wait(WAIT)
    time.sleep(0.3)
    assert not skipped.is_set()


def test_cancelled_timers_do_not_pile_up(dispatcher: Dispatcher) -> None:
    for _ in range(5_000):  # e.g. shutdown timeouts of children that stopped in time
        dispatcher.call_later(3_600, lambda: None).cancel()
    fired = threading.Event()
    dispatcher.call_later(0.01, fired.set)
    assert fired.wait(WAIT)
    assert len(dispatcher._timers._heap) < 2_048


def test_an_actor_killed_before_it_starts_never_runs(dispatcher: Dispatcher, events: Events) -> None:
    class Doomed(AnActor):
        def __init__(self, events: Events) -> None:
            super().__init__(events)
            kill(self.actor_ref)  # e.g. a supervisor gave up on it between creation and start

    ref = Doomed.start(events, dispatcher=dispatcher)
    assert not ref.is_alive() and len(dispatcher) == 0
    time.sleep(0.05)
    assert not events.on_start.is_set()


def test_the_default_dispatcher_is_made_on_demand_and_replaceable() -> None:
    mine = Dispatcher(threads=1)
    try:
        set_default_dispatcher(mine)
        ref = PooledActor.start()
        assert mine.get_by_urn(ref.actor_urn) is ref
        ref.stop(timeout=WAIT)
    finally:
        set_default_dispatcher(None)
        mine.shutdown(timeout=WAIT)
    made = default_dispatcher()
    assert made is not mine and made is default_dispatcher()


class Gated(PooledActor):
    """Stashes everything until it gets "open"; then handles what it stashed, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.open = False
        self.seen: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        if message == "open":
            self.open = True
            self.unstash_all()
            return "opened"
        if not self.open:
            self.stash(message)
            return None
        if message == "boom":
            raise ValueError("boom")
        self.seen.append(message)
        return f"got {message}"


def test_stashed_messages_are_handled_in_order_with_their_replies(dispatcher: Dispatcher) -> None:
    ref = Gated.start(dispatcher=dispatcher)
    first = ref.ask("a", block=False)
    ref.tell("b")
    failing = ref.ask("boom", block=False)
    last = ref.ask("c", block=False)
    assert ref.ask("open", timeout=WAIT) == "opened"  # the unstashing handler keeps its own reply
    assert first.get(timeout=WAIT) == "got a" and last.get(timeout=WAIT) == "got c"
    with pytest.raises(ValueError, match="boom"):
        failing.get(timeout=WAIT)
    assert ref.proxy().seen.get(timeout=WAIT) == ["a", "b", "c"]
    ref.stop()


def test_stashed_asks_fail_when_the_actor_stops(dispatcher: Dispatcher) -> None:
    ref = Gated.start(dispatcher=dispatcher)
    pending = ref.ask("a", block=False)
    ref.stop()
    with pytest.raises(ActorDeadError):
        pending.get(timeout=WAIT)


# --- the package's surface and its one door into pykka's internals ------------------------------------


def _private_pykka_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pykka"):
            module = node.module
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            module, names = "", [alias.name for alias in node.names if alias.name.startswith("pykka")]
        else:
            continue
        dotted = [f"{module}.{name}" if module else name for name in names]
        found += [d for d in dotted if any(part.startswith("_") for part in d.split("."))]
    return found


def test_pykka_private_names_are_imported_by_the_compatibility_module_only() -> None:
    root = Path(__file__).resolve().parents[2]
    files = [p for package in ("runtime", "actors", "benchmarks") for p in (root / package).rglob("*.py")]
    offenders = {
        str(p.relative_to(root)): names
        for p in files
        if (names := _private_pykka_imports(p)) and p != root / "runtime" / "actor" / "_pykka.py"
    }
    assert offenders == {}
    assert _private_pykka_imports(root / "runtime" / "actor" / "_pykka.py")  # the check does see them


def test_the_actor_package_is_used_through_its_public_surface_from_outside() -> None:
    """A private module of ``runtime.actor`` (``_pykka``, ``_mailbox``, ...) is its own business: what the
    rest needs (e.g. :class:`ActorStop`) is re-exported by the package."""
    root = Path(__file__).resolve().parents[2]
    inside = root / "runtime" / "actor"
    offenders = {}
    for package in ("runtime", "actors", "benchmarks"):
        for path in (root / package).rglob("*.py"):
            if inside in path.parents:
                continue
            tree = ast.parse(path.read_text(), str(path))
            modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            private = [m for m in modules if m.startswith("runtime.actor._")]
            if private:
                offenders[str(path.relative_to(root))] = private
    assert offenders == {}


def test_the_package_exports_its_public_names() -> None:
    import runtime.actor as package

    public = {name for name in vars(package) if not name.startswith("_")}
    assert sorted(package.__all__) == sorted(public)


def test_a_told_message_carrying_its_answer_is_told_when_its_actor_stops_before_handling_it(
    dispatcher: Dispatcher,
) -> None:
    """Mail left in the inbox of an actor that stops (a crash, a restart) is dropped, and a told message has
    nobody to hear of it: a prompt's handle never resolved. A message with ``undelivered`` is told why."""
    gate = threading.Event()

    class Carrier:
        def __init__(self) -> None:
            self.why: str | None = None
            self.told = threading.Event()

        def undelivered(self, why: str) -> None:
            self.why = why
            self.told.set()

    class Crashing(PooledActor):
        def on_receive(self, message: Any) -> Any:
            if message == "crash":
                gate.wait(WAIT)
                raise RuntimeError("boom")
            return None

    ref = Crashing.start(dispatcher=dispatcher)
    ref.tell("crash")
    carrier = Carrier()
    ref.tell(carrier)  # queued behind the crash
    gate.set()
    assert carrier.told.wait(WAIT), "the carried answer was dropped with the mail"
    assert carrier.why is not None and "stopped before handling the message" in carrier.why
