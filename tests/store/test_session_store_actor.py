"""The session store actor: acknowledged writes, views, restart from the log, the lock (design §2.2, 2.3)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

from actors.session_store import (
    Append,
    Branch,
    ContextView,
    GetContext,
    GetMessages,
    GetTree,
    Overlay,
    RecordCompaction,
    SessionStore,
    SetMetadata,
    Stored,
    SyncTurn,
)
from actors.store_locks import LockHolders, lock_holders
from runtime import events as ev
from runtime.actor import Dispatcher
from runtime.messages import KIND_COMPACTION_SUMMARY, KIND_TOOL_RESULT_ARCHIVED, assistant, tool_result, user
from runtime.store.entries import MessageEntry, new_header
from runtime.store.log import read_log
from runtime.store.sessions import SessionDirectory
from runtime.store.tree import SessionTree
from runtime.store.writer import LogWriter


class Events:
    """A thread-safe publish callback that remembers what it was given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[ev.Event] = []

    def __call__(self, event: ev.Event) -> None:
        with self._lock:
            self.items.append(event)

    def of(self, kind: type[ev.Event]) -> list[Any]:
        with self._lock:
            return [e for e in self.items if isinstance(e, kind)]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def writer() -> Iterator[LogWriter]:
    w = LogWriter("turn")
    yield w
    w.close()


@pytest.fixture
def directory(tmp_path: Path) -> SessionDirectory:
    return SessionDirectory(tmp_path / "sessions")


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def start(directory: SessionDirectory, writer: LogWriter, events: Events) -> Iterator[Callable[..., Any]]:
    refs: list[pykka.ActorRef[Any]] = []

    def start(session_id: str = "s1", *, header: bool = True, **kw: Any) -> pykka.ActorRef[Any]:
        h = new_header(
            session_id, model="m", config={"api_key": "sk-secret", "agent": {"max_steps_per_turn": 3}}
        )
        ref = SessionStore.start(session_id, directory, writer, h if header else None, events, **kw)
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        if ref.is_alive():
            ref.stop()


def stored(ref: pykka.ActorRef[Any], command: Any) -> Stored:
    """Send a write through ``ask``: the answer comes once the write is acknowledged."""
    result = ref.ask(command, timeout=5)
    assert isinstance(result, Stored)
    return result


def test_an_append_is_acknowledged_only_once_it_is_in_the_log(
    start: Callable[..., Any], directory: SessionDirectory, events: Events
) -> None:
    ref = start()
    on_disk_at_ack: list[bool] = []

    def reply(answer: Stored) -> None:
        entries, _ = read_log(directory.log_path("s1"), repair=False)
        on_disk_at_ack.append(all(e in entries for e in answer.entries))

    messages = [user("hello"), assistant("hi there"), user("again")]
    ref.tell(Append(tuple(messages[:2]), reply_to=reply))
    ref.tell(Append(messages[2], reply_to=reply))
    wait_until(lambda: len(on_disk_at_ack) == 2)
    assert on_disk_at_ack == [True, True]
    assert [e.message_id for e in events.of(ev.MessageAppended)] == [m.id for m in messages]
    header = directory.read_header("s1")
    assert header is not None and header.config == {"agent": {"max_steps_per_turn": 3}}  # no API key on disk


def test_an_ask_is_answered_once_the_write_is_acknowledged(
    start: Callable[..., Any], directory: SessionDirectory
) -> None:
    ref = start()
    message = user("a")
    answer = stored(ref, Append((message,)))
    assert answer.ok and isinstance(answer.entries[0], MessageEntry)
    assert answer.entries[0] in read_log(directory.log_path("s1"), repair=False)[0]
    assert stored(ref, SyncTurn()).ok


def test_replies_can_go_to_an_actor(start: Callable[..., Any]) -> None:
    class Collector(pykka.ThreadingActor):
        def __init__(self) -> None:
            super().__init__()
            self.got: list[Any] = []

        def on_receive(self, message: Any) -> None:
            self.got.append(message)

    collector = Collector.start()
    try:
        ref = start()
        ref.tell(Append((user("a"),), reply_to=collector))
        ref.tell(GetContext(reply_to=collector))
        wait_until(lambda: len(collector.proxy().got.get()) == 2)
        kinds = sorted(type(m).__name__ for m in collector.proxy().got.get())
        assert kinds == ["ContextView", "Stored"]
    finally:
        collector.stop()


def test_views_follow_compaction_overlay_and_branch(start: Callable[..., Any]) -> None:
    ref = start(estimator=lambda messages: 10 * len(messages))
    first, second, third = user("one"), assistant("two"), user("three")
    stored(ref, Append((first, second, third)))
    summary = user("sum", kind=KIND_COMPACTION_SUMMARY)
    stored(ref, RecordCompaction(summary=summary, first_kept_id=third.id, tokens_before=90, tokens_after=30))
    result = tool_result("c1", "grep", "lots")
    stored(ref, Append((result,)))
    view: ContextView = ref.ask(GetContext())
    assert [m.text for m in view.messages] == ["sum", "three", "lots"]
    assert view.usage_floor == 2 and view.estimated_tokens == 30
    assert view.latest_compaction is not None and view.latest_compaction.tokens_before == 90

    archived = msgspec.structs.replace(result, agent_visible=False, kind=KIND_TOOL_RESULT_ARCHIVED)
    stored(ref, Overlay((archived,)))
    assert [m.text for m in ref.proxy().context().get()] == ["sum", "three"]
    # memory follows the context: what the compaction summarized is in the log, counted as ``before``
    shown = ref.ask(GetMessages())
    assert [m.text for m in shown.messages] == ["three", "sum", "lots"] and shown.before == 2

    stored(ref, Branch(second.id))  # a dropped node: the store reads its log back and branches there
    assert [m.text for m in ref.ask(GetContext()).messages] == ["one", "two"]
    shown = ref.ask(GetMessages())
    assert [m.text for m in shown.messages] == ["one", "two"] and shown.before == 0
    tree: SessionTree = ref.ask(GetTree())
    assert len(tree) == 4 and tree.leaf_id == second.id


def test_an_append_can_answer_with_the_view_after_it(start: Callable[..., Any]) -> None:
    """An agent appends its prompt and gets the context to send in the same reply (no second ask)."""
    ref = start(estimator=lambda messages: 10 * len(messages))
    first = user("one")
    plain = stored(ref, Append((first,)))
    assert plain.view is None
    second = user("two")
    reply = stored(ref, Append((second,), with_view=True))
    assert reply.view is not None
    assert [m.id for m in reply.view.messages] == [first.id, second.id]
    assert reply.view == ref.ask(GetContext())  # the same view GetContext answers right after
    assert reply.view.leaf_id == second.id and reply.view.estimated_tokens == 20


def test_an_inconsistent_command_fails_its_caller_and_the_store_carries_on(start: Callable[..., Any]) -> None:
    ref = start()
    a = user("a")
    stored(ref, Append((a,)))
    with pytest.raises(ValueError, match="no such node"):
        ref.ask(Branch("nowhere"))
    with pytest.raises(ValueError, match="already in the session"):
        ref.ask(Append((user("b"), a)))  # all or nothing: "b" is not added either
    assert [m.text for m in ref.ask(GetContext()).messages] == ["a"]


def test_a_restarted_store_rebuilds_exactly_from_the_log(
    start: Callable[..., Any], writer: LogWriter
) -> None:
    ref = start()
    root = user("root")
    stored(ref, Append((root, assistant("left"))))
    stored(ref, Branch(root.id))
    stored(ref, Append((assistant("right"),)))
    stored(ref, SetMetadata("model", "other"))
    before = ref.ask(GetTree())
    ref.stop()
    for header in (False, True):  # resume, and a supervisor restart that still has the header: the log wins
        again = start(header=header)
        after = again.ask(GetTree())
        assert after.entries() == before.entries()
        assert [m.text for m in again.ask(GetContext()).messages] == ["root", "right"]
        assert again.ask(GetContext()).model == "other"
        again.stop()


def test_a_torn_log_is_recovered_and_reported(
    start: Callable[..., Any], directory: SessionDirectory, events: Events
) -> None:
    ref = start()
    stored(ref, Append((user("kept"),)))
    ref.stop()
    with open(directory.log_path("s1"), "ab") as f:
        f.write(b'{"type":"message","id":"torn"')
    again = start(header=False)
    assert [m.text for m in again.ask(GetContext()).messages] == ["kept"]
    recovered = events.of(ev.LogRecovered)
    assert len(recovered) == 1 and recovered[0].torn_bytes == 29
    stored(again, Append((user("after"),)))
    entries, info = read_log(directory.log_path("s1"))
    assert not info.torn and len(entries) == 3


def test_resuming_a_missing_session_fails_clearly(start: Callable[..., Any], events: Events) -> None:
    ref = start("ghost", header=False)
    wait_until(lambda: not ref.is_alive())
    errors = events.of(ev.ErrorOccurred)
    assert errors and "no stored session 'ghost'" in errors[0].message


def test_two_stores_must_not_write_one_session(
    start: Callable[..., Any], events: Events, directory: SessionDirectory
) -> None:
    first = start()
    stored(first, Append((user("a"),)))
    second = start(header=False)
    wait_until(lambda: not second.is_alive(), timeout=10)
    assert any("is open in this process" in e.message for e in events.of(ev.ErrorOccurred))
    first.stop()
    third = start(header=False)  # the lock was released when the first stopped
    assert [m.text for m in third.ask(GetContext()).messages] == ["a"]
    third.stop()
    wait_until(lambda: not directory.lock_path("s1").exists())


def test_a_failed_write_is_reported_not_acknowledged_and_stops_the_store(
    start: Callable[..., Any], directory: SessionDirectory, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_holders, "release_wait", 0.2)  # (its lock is parked for a successor none starts)
    ref = start()
    kept = user("kept")
    stored(ref, Append((kept,)))
    path = directory.log_path("s1")
    path.unlink()
    path.symlink_to("/dev/full")  # the writer reopens the path, and its next write fails with ENOSPC
    replies: list[Stored] = []
    ref.tell(Append((user("lost"),), reply_to=replies.append))
    wait_until(lambda: not ref.is_alive())
    assert len(replies) == 1 and not replies[0].ok and "No space left" in (replies[0].error or "")
    assert [e.path for e in events.of(ev.PersistenceFailed)] == [str(path)]
    assert [e.message_id for e in events.of(ev.MessageAppended)] == [kept.id]  # "lost" was never announced
    wait_until(lambda: not directory.lock_path("s1").exists())  # a crashed store lets go of its lock too


def test_a_log_that_is_not_a_regular_file_is_refused(
    start: Callable[..., Any], directory: SessionDirectory, events: Events
) -> None:
    directory.ensure()
    directory.log_path("s1").parent.mkdir(parents=True)
    directory.log_path("s1").symlink_to("/dev/zero")  # reading it would never end
    ref = start()
    wait_until(lambda: not ref.is_alive())
    assert any("not a regular file" in e.message for e in events.of(ev.ErrorOccurred))


def test_sync_turn_makes_the_log_durable_under_the_turn_policy(
    start: Callable[..., Any], writer: LogWriter
) -> None:
    ref = start()
    stored(ref, Append((user("a"),)))
    before = writer.stats.fsyncs
    assert stored(ref, SyncTurn()).ok
    assert writer.stats.fsyncs == before + 1
    # A turn's last message can ask for the same in its append: durable once the writer has done both.
    before = writer.stats.fsyncs
    assert stored(ref, Append((assistant("done"),), end_turn=True)).ok
    writer.flush()
    assert writer.stats.fsyncs == before + 1
    before = writer.stats.fsyncs
    stored(ref, Append((user("c"),)))  # an ordinary append leaves the sync to the turn's end
    writer.flush()
    assert writer.stats.fsyncs == before
    ref_always = start("s2", fsync="always")
    before = writer.stats.fsyncs
    stored(ref_always, Append((user("b"),)))
    assert writer.stats.fsyncs >= before + 1  # acknowledged only after its fsync


def test_a_store_waiting_for_its_lock_does_not_hold_a_dispatcher_thread(
    directory: SessionDirectory, writer: LogWriter, events: Events
) -> None:
    """design §1.1: the lock wait and the log read happen off the dispatcher; queries wait for the opening."""
    dispatcher = Dispatcher(threads=1, name="one-thread")  # one thread: a store holding it stops everything
    try:
        other = SessionStore.start(
            "other", directory, writer, new_header("other", model="m"), events, dispatcher=dispatcher
        )
        first = SessionStore.start(
            "s1", directory, writer, new_header("s1", model="m"), events, dispatcher=dispatcher
        )
        stored(first, Append((user("kept"),)))
        first.stop()
        wait_until(lambda: not directory.lock_path("s1").exists())
        held = directory.lock("s1")  # held in this process by no live store: a predecessor letting go of it
        waiting = SessionStore.start("s1", directory, writer, None, events, dispatcher=dispatcher)
        asked = waiting.ask(GetContext(), block=False)  # arrives while the store waits: answered once open
        proxied = waiting.proxy().leaf_id()
        for text in ("a", "b", "c"):  # the other session's store answers meanwhile, on the same one thread
            assert stored(other, Append((user(text),))).ok
            assert [m.text for m in other.ask(GetContext(), timeout=1).messages][-1] == text
        assert not asked.done() and waiting.is_alive()
        held.release()
        view = asked.get(timeout=5)
        assert [m.text for m in view.messages] == ["kept"]
        assert proxied.get(timeout=5) == view.leaf_id
        assert not events.of(ev.ErrorOccurred)
        waiting.stop()
        wait_until(lambda: not directory.lock_path("s1").exists())
    finally:
        dispatcher.shutdown()


def test_a_store_stopped_while_it_opens_lets_go_of_everything(
    start: Callable[..., Any], directory: SessionDirectory
) -> None:
    first = start()
    stored(first, Append((user("kept"),)))
    first.stop()
    wait_until(lambda: not directory.lock_path("s1").exists())
    held = directory.lock("s1")
    waiting = start(header=False)
    asked = waiting.ask(GetContext(), block=False)
    waiting.stop()
    with pytest.raises(pykka.ActorDeadError):
        asked.get(timeout=5)
    held.release()
    again = start(header=False)  # nothing of the stopped store holds the lock
    assert [m.text for m in again.ask(GetContext(), timeout=5).messages] == ["kept"]
    again.stop()
    wait_until(lambda: not directory.lock_path("s1").exists())


def test_a_parked_lock_is_kept_for_a_successor_released_after_its_wait_and_at_once_by_a_stop(
    tmp_path: Path,
) -> None:
    """A store that fails parks its session's lock for the store restarted in its place (design §9, a full
    disk): the lock file stays, owned by this process, while parked; nobody taking it within the wait
    releases it (the supervisor gave up); a successor that takes it keeps it past the wait; a stop of the
    session's stores releases a parked lock at once."""
    directory = SessionDirectory(tmp_path)
    path = directory.lock_path("parked")
    key = str(path)
    successor: Any = object()  # (the store that takes the lock over: only compared by identity here)

    holders = LockHolders(release_wait=0.2)
    holders.park(key, directory.lock("parked"))
    assert directory.held("parked")  # still this process's: no other process may take the session
    wait_until(lambda: not path.exists())  # released by its timer

    holders.park(key, directory.lock("parked"))
    kept = holders.take(key, successor)
    assert kept is not None and kept.held
    time.sleep(0.4)  # past the wait: the successor's lock stays
    assert path.exists() and kept.held
    kept.release()
    holders.remove(key, successor)

    holders = LockHolders(release_wait=60.0)
    holders.park(key, directory.lock("parked"))
    started = time.monotonic()
    assert holders.wait_released(key, timeout=5.0)  # the session stopped: no successor comes
    assert not path.exists() and time.monotonic() - started < 5.0
    directory.close()
