"""runtime.supervisor: OTP strategies, restart types, intensity and escalation, orderly shutdown."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest

from runtime.actor import Dispatcher, PooledActor
from runtime.supervisor import (
    ChildInfo,
    ChildSpec,
    RestartIntensityExceeded,
    RestartType,
    Strategy,
    Supervisor,
    SupervisorActor,
)

WAIT = 10.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(threads=2, name="test-supervisor")
    yield d
    d.shutdown(timeout=WAIT)


class Journal:
    """What the workers did, in order, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, str]] = []

    def add(self, what: str, name: str) -> None:
        with self.lock:
            self.entries.append((what, name))

    def take(self) -> list[tuple[str, str]]:
        with self.lock:
            entries, self.entries = self.entries, []
            return entries


class Worker(PooledActor):
    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__()
        self.name = name
        self.journal = journal

    def on_start(self) -> None:
        self.journal.add("start", self.name)

    def on_stop(self) -> None:
        self.journal.add("stop", self.name)

    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError(f"{self.name} crashed")
        if message == "exit":
            raise SystemExit(f"{self.name} exits")
        if message == "finish":
            self.stop()
        if isinstance(message, threading.Event):
            message.wait(WAIT)
        return self.name


class Tree:
    """A supervisor of workers ``names``, with everything it reports recorded."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        names: str = "abc",
        *,
        strategy: Strategy = "one_for_one",
        restart: RestartType | dict[str, RestartType] = "permanent",
        **options: Any,
    ) -> None:
        self.journal = Journal()
        self.restarts: list[tuple[str, BaseException | None, int]] = []
        self.escalations: list[BaseException] = []
        self.dispatcher = dispatcher
        specs = [self.spec(n, restart if isinstance(restart, str) else restart[n]) for n in names]
        self.sup = Supervisor.start_tree(
            specs,
            strategy=strategy,
            dispatcher=dispatcher,
            on_restart=lambda *args: self.restarts.append(args),
            on_escalate=self.escalations.append,
            **options,
        )
        wait_until(lambda: len(self.journal.entries) == len(names))
        self.journal.take()  # the initial starts

    def spec(self, name: str, restart: RestartType = "permanent", **kw: Any) -> ChildSpec:
        return ChildSpec(
            id=name,
            start=lambda: Worker.start(name, self.journal, dispatcher=self.dispatcher),
            restart=restart,
            **kw,
        )

    def children(self) -> dict[str, ChildInfo]:
        return {c.id: c for c in self.sup.which_children(timeout=WAIT)}

    def refs(self) -> dict[str, pykka.ActorRef[Any] | None]:
        return {c.id: c.ref for c in self.sup.which_children(timeout=WAIT)}

    def ref(self, name: str) -> pykka.ActorRef[Any]:
        """The running child ``name``."""
        ref = self.refs()[name]
        assert ref is not None, f"{name} is not running"
        return ref

    def wait_restarts(self, n: int) -> None:
        wait_until(lambda: len(self.restarts) >= n)
        self.sup.which_children(timeout=WAIT)  # the supervisor has finished that work


def test_start_tree_starts_children_in_order_before_returning(dispatcher: Dispatcher) -> None:
    journal = Journal()
    refs: dict[str, pykka.ActorRef[Any]] = {}

    def starter(name: str) -> Callable[[], pykka.ActorRef[Any]]:
        def start() -> pykka.ActorRef[Any]:
            refs[name] = Worker.start(name, journal, dispatcher=dispatcher)
            return refs[name]

        return start

    sup = Supervisor.start_tree([ChildSpec(id=n, start=starter(n)) for n in "abc"], dispatcher=dispatcher)
    assert list(refs) == ["a", "b", "c"]  # every start() ran before start_tree returned
    assert [(c.id, c.ref, c.restarts) for c in sup.which_children(timeout=WAIT)] == [
        ("a", refs["a"], 0),
        ("b", refs["b"], 0),
        ("c", refs["c"], 0),
    ]
    wait_until(lambda: len(journal.entries) == 3)
    assert journal.take() == [("start", "a"), ("start", "b"), ("start", "c")]


def test_one_for_one_restarts_only_the_failed_child(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, strategy="one_for_one")
    before = tree.refs()
    assert before["b"] is not None
    before["b"].tell("crash")
    tree.wait_restarts(1)
    after = tree.refs()
    assert after["a"] is before["a"] and after["c"] is before["c"]
    assert after["b"] is not before["b"] and after["b"] is not None and after["b"].is_alive()
    name, error, count = tree.restarts[0]
    assert (name, str(error), count) == ("b", "b crashed", 1)
    assert tree.journal.take() == [("start", "b")]
    assert tree.children()["b"].restarts == 1


def test_one_for_all_restarts_everyone_stopping_the_others_newest_first(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "abcd", strategy="one_for_all")
    before = tree.refs()
    assert before["b"] is not None
    before["b"].tell("crash")
    tree.wait_restarts(4)
    assert tree.journal.take() == [
        ("stop", "d"),
        ("stop", "c"),
        ("stop", "a"),
        ("start", "a"),
        ("start", "b"),
        ("start", "c"),
        ("start", "d"),
    ]
    after = tree.refs()
    assert all(after[n] is not before[n] and tree.ref(n).is_alive() for n in "abcd")
    assert [(n, e is not None) for n, e, _ in tree.restarts] == [
        ("a", False),
        ("b", True),
        ("c", False),
        ("d", False),
    ]


def test_rest_for_one_restarts_the_child_and_those_started_after_it(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "abcd", strategy="rest_for_one")
    before = tree.refs()
    assert before["b"] is not None
    before["b"].tell("crash")
    tree.wait_restarts(3)
    assert tree.journal.take() == [
        ("stop", "d"),
        ("stop", "c"),
        ("start", "b"),
        ("start", "c"),
        ("start", "d"),
    ]
    after = tree.refs()
    assert after["a"] is before["a"]
    assert all(after[n] is not before[n] for n in "bcd")


def test_restart_types(dispatcher: Dispatcher) -> None:
    tree = Tree(
        dispatcher, "ptxy", restart={"p": "permanent", "t": "transient", "x": "transient", "y": "temporary"}
    )
    refs = tree.refs()
    tree.ref("p").tell("finish")  # permanent: restarted even after a normal stop
    tree.ref("t").tell("finish")  # transient, normal exit: left stopped
    tree.ref("x").tell("crash")  # transient, abnormal exit: restarted
    tree.ref("y").tell("crash")  # temporary: never restarted, and forgotten
    tree.wait_restarts(2)
    wait_until(lambda: "y" not in tree.children())
    children = tree.children()
    assert sorted(name for name, _, _ in tree.restarts) == ["p", "x"]
    assert children["p"].ref is not None and children["p"].ref is not refs["p"]
    assert children["t"].ref is None and children["t"].restarts == 0
    assert children["x"].ref is not None and children["x"].restarts == 1


def test_a_temporary_sibling_is_not_restarted_with_its_group(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "ab", strategy="one_for_all", restart={"a": "permanent", "b": "temporary"})
    tree.ref("a").tell("crash")
    tree.wait_restarts(1)
    assert list(tree.children()) == ["a"]
    assert tree.journal.take() == [("stop", "b"), ("start", "a")]


def test_too_many_restarts_escalate(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, strategy="one_for_one", max_restarts=2, max_seconds=60)
    for n in range(2):
        tree.ref("b").tell("crash")
        tree.wait_restarts(n + 1)
    last = tree.refs()
    tree.ref("b").tell("crash")  # the third restart in the window is one too many
    wait_until(lambda: bool(tree.escalations))
    wait_until(lambda: not tree.sup.is_alive())
    error = tree.escalations[0]
    assert isinstance(error, RestartIntensityExceeded) and error.child_id == "b"
    assert isinstance(error.__cause__, RuntimeError) and str(error.__cause__) == "b crashed"
    assert not any(ref.is_alive() for ref in last.values() if ref is not None)
    assert tree.journal.take()[-2:] == [("stop", "c"), ("stop", "a")]  # the others, newest first


def test_restarts_spread_beyond_the_window_do_not_escalate(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "a", max_restarts=1, max_seconds=0.2)
    for n in range(3):
        tree.ref("a").tell("crash")
        tree.wait_restarts(n + 1)
        time.sleep(0.25)  # the previous restart leaves the window
    assert tree.escalations == [] and tree.sup.is_alive()


def test_zero_max_restarts_escalates_on_the_first_failure(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "a", max_restarts=0)
    tree.ref("a").tell("crash")
    wait_until(lambda: bool(tree.escalations))
    assert tree.restarts == []


def test_escalation_reaches_the_parent_which_restarts_the_subtree(dispatcher: Dispatcher) -> None:
    parent_restarts: list[tuple[str, BaseException | None, int]] = []
    root = Supervisor.start_tree(
        name="root", dispatcher=dispatcher, on_restart=lambda *a: parent_restarts.append(a)
    )
    journal = Journal()
    child = Supervisor.start_tree(
        [ChildSpec(id="w", start=lambda: Worker.start("w", journal, dispatcher=dispatcher))],
        name="session",
        parent=root,
        restart="permanent",
        max_restarts=0,
    )
    assert [c.id for c in root.which_children(timeout=WAIT)] == ["session"]
    first = child.ref
    worker = child.which_children(timeout=WAIT)[0].ref
    assert worker is not None
    worker.tell("crash")
    wait_until(lambda: bool(parent_restarts))
    name, error, count = parent_restarts[0]
    assert (name, count) == ("session", 1) and isinstance(error, RestartIntensityExceeded)
    assert child.ref is not first and child.is_alive()  # the handle follows the new incarnation
    new_worker = child.which_children(timeout=WAIT)[0].ref
    assert new_worker is not None and new_worker is not worker and new_worker.is_alive()
    assert child.stop(timeout=WAIT) is True
    assert not new_worker.is_alive()
    assert root.which_children(timeout=WAIT) == []  # stopped through the parent: forgotten, not restarted
    root.stop(timeout=WAIT)


def test_a_crash_in_one_session_leaves_other_sessions_alone(dispatcher: Dispatcher) -> None:
    root = Supervisor.start_tree(name="root", dispatcher=dispatcher)
    sessions = {
        sid: Tree(dispatcher, strategy="rest_for_one", name=f"session:{sid}", parent=root, max_restarts=0)
        for sid in ("s1", "s2")
    }
    s2_before = sessions["s2"].refs()
    sessions["s1"].ref("a").tell("exit")  # SystemExit, and s1 gives up
    wait_until(lambda: bool(sessions["s1"].escalations))
    wait_until(lambda: not sessions["s1"].sup.is_alive())
    assert sessions["s2"].refs() == s2_before
    assert all(ref is not None and ref.is_alive() for ref in s2_before.values())
    assert [c.id for c in root.which_children(timeout=WAIT)] == ["session:s2"]  # temporary under root
    root.stop(timeout=WAIT)
    assert not any(ref.is_alive() for ref in s2_before.values() if ref is not None)


def test_stop_shuts_children_down_newest_first(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "abcd")
    refs = tree.refs()
    assert tree.sup.stop(timeout=WAIT) is True
    assert tree.journal.take() == [("stop", "d"), ("stop", "c"), ("stop", "b"), ("stop", "a")]
    assert not tree.sup.is_alive()
    assert not any(ref.is_alive() for ref in refs.values() if ref is not None)
    assert tree.restarts == []  # stopping is not failing


def test_a_child_that_does_not_stop_in_time_is_killed(dispatcher: Dispatcher) -> None:
    journal = Journal()
    stuck = ChildSpec(
        id="stuck", start=lambda: Worker.start("stuck", journal, dispatcher=dispatcher), shutdown_timeout=0.1
    )
    sup = Supervisor.start_tree([stuck], dispatcher=dispatcher)
    ref = sup.which_children(timeout=WAIT)[0].ref
    assert ref is not None
    gate = threading.Event()
    ref.tell(gate)  # it is busy until the gate opens; its stop message waits behind
    began = time.monotonic()
    assert sup.stop(timeout=WAIT) is True
    assert time.monotonic() - began < WAIT / 2
    assert not ref.is_alive()
    gate.set()
    assert ("stop", "stuck") not in journal.take()  # killed: no on_stop


def test_start_child_terminate_child_and_which_children(dispatcher: Dispatcher) -> None:
    tree = Tree(dispatcher, "a")
    added = tree.sup.start_child(tree.spec("b"), timeout=WAIT)
    assert added.ask("hello", timeout=WAIT) == "b"
    assert list(tree.children()) == ["a", "b"]
    with pytest.raises(ValueError, match="already has a child 'b'"):
        tree.sup.start_child(tree.spec("b"), timeout=WAIT)
    assert tree.sup.terminate_child("b", timeout=WAIT) is True
    assert not added.is_alive() and list(tree.children()) == ["a"]
    assert tree.sup.terminate_child("nobody", timeout=WAIT) is False
    assert tree.restarts == []


def test_a_failing_start_in_start_tree_stops_what_was_started(dispatcher: Dispatcher) -> None:
    journal = Journal()
    started: list[pykka.ActorRef[Any]] = []

    def good() -> pykka.ActorRef[Any]:
        started.append(Worker.start("good", journal, dispatcher=dispatcher))
        return started[-1]

    def bad() -> pykka.ActorRef[Any]:
        raise OSError("no such store")

    with pytest.raises(OSError, match="no such store"):
        Supervisor.start_tree(
            [ChildSpec(id="good", start=good), ChildSpec(id="bad", start=bad)], dispatcher=dispatcher
        )
    wait_until(lambda: not started[0].is_alive())
    wait_until(lambda: len(dispatcher) == 0)  # the supervisor too


def test_a_restart_that_cannot_start_counts_towards_intensity(dispatcher: Dispatcher) -> None:
    journal = Journal()
    attempts: list[int] = []

    def flaky() -> pykka.ActorRef[Any]:
        attempts.append(1)
        if len(attempts) > 1:
            raise OSError("store unavailable")
        return Worker.start("w", journal, dispatcher=dispatcher)

    escalations: list[BaseException] = []
    sup = Supervisor.start_tree(
        [ChildSpec(id="w", start=flaky)],
        dispatcher=dispatcher,
        max_restarts=3,
        on_escalate=escalations.append,
    )
    first = sup.which_children(timeout=WAIT)[0].ref
    assert first is not None
    first.tell("crash")
    wait_until(lambda: bool(escalations))
    assert len(attempts) == 1 + 3  # the first start, then three failed restarts, then it gave up
    assert isinstance(escalations[0].__cause__, OSError)


def test_supervision_never_blocks_a_dispatcher_thread() -> None:
    single = Dispatcher(threads=1)  # any blocking wait inside the supervisor would deadlock here
    try:
        tree = Tree(single, "abc", strategy="rest_for_one")
        tree.ref("a").tell("crash")
        tree.wait_restarts(3)
        assert tree.sup.stop(timeout=WAIT) is True
    finally:
        single.shutdown(timeout=WAIT)


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="restart"):
        ChildSpec(id="x", start=PooledActor.start, restart="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strategy"):
        SupervisorActor(strategy="all_for_none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicate"):
        SupervisorActor([ChildSpec(id="x", start=PooledActor.start)] * 2)
    with pytest.raises(ValueError, match="max_restarts"):
        SupervisorActor(max_restarts=-1)


def test_a_supervisor_actor_can_be_used_directly_through_a_proxy(dispatcher: Dispatcher) -> None:
    journal = Journal()
    spec = ChildSpec(id="w", start=lambda: Worker.start("w", journal, dispatcher=dispatcher))
    proxy = SupervisorActor.start([spec], name="direct", dispatcher=dispatcher).proxy()
    assert [c.id for c in proxy.which_children().get(timeout=WAIT)] == ["w"]
    extra = proxy.start_child(
        ChildSpec(id="x", start=lambda: Worker.start("x", journal, dispatcher=dispatcher))
    )
    assert extra.get(timeout=WAIT).is_alive()
    assert proxy.terminate_child("x").get(timeout=WAIT) is True
    assert proxy.actor_ref.stop(timeout=WAIT) is True
