"""A runtime's sessions on disk (issue 32): files only once a session has something to keep, durable
starts, kill -9 before and after the first message, concurrent starts, and hostile shapes (many sessions
started and deleted at once, a crash in the middle of an index append).

A started session is durable once the log writer has appended its header to the sessions index (and, under
``fsync = turn`` or ``always``, fsynced it): ``Runtime.flush()`` waits for that.
"""

from __future__ import annotations

import collections
import gc
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.store.entries import encode_entry, new_header
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript

ROOT = Path(__file__).resolve().parents[2]
REPLY = "Noted."


def mock_config() -> Config:
    return Config().with_overrides({"agent.mock_response": REPLY})


def files(root: Path) -> list[str]:
    """Every file under ``root`` but the runtime's own (the index's segments, the journal of open turns, the
    lock guard), relative to ``root``."""
    out = []
    for path in root.rglob("*"):
        if path.is_file() and path.parent.name not in ("index", "turns") and path.name != ".agentcell.lock":
            out.append(str(path.relative_to(root)))
    return sorted(out)


def test_a_session_has_files_only_once_it_has_something_to_keep(sessions_dir: Path) -> None:
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        idle = [rt.start_session(model="openai/m") for _ in range(50)]
        used = rt.start_session(model="openai/m")
        rt.flush()
        assert files(sessions_dir) == []  # 51 sessions: one index line each, no file of their own
        assert [p.name for p in (sessions_dir / "index").iterdir()] == ["0.jsonl"]
        assert len(rt.list_sessions()) == 51
        rt.messages(idle[0])  # used, but nothing written: still no file
        rt.hibernate(idle[0])
        rt.flush()  # (its store lets go of its lock file once its last writes are done)
        assert files(sessions_dir) == []
        assert rt.prompt(used, "hello").result(timeout=60).text == REPLY
        rt.flush()
        directory = rt.services.directory
        log, transcript = directory.log_path(used), directory.transcript_path(used)
        assert log.exists() and transcript.exists()
        assert {str(p.relative_to(sessions_dir)) for p in (log, transcript)} <= set(files(sessions_dir))
    assert all(not p.endswith(".lock") for p in files(sessions_dir))  # stopping let go of every lock
    assert (
        len([p for p in files(sessions_dir) if p.endswith(".jsonl")]) == 2
    )  # idle ones: none at stop either
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        assert {i.id: i.messages for i in rt.list_sessions()} == {**{s: 0 for s in idle}, used: 2}
        rt.resume_session(idle[1])  # a session never used, from the index: it wakes like any other
        assert rt.prompt(idle[1], "first words").result(timeout=60).text == REPLY
        assert [m.text for m in rt.messages(idle[1])] == ["first words", REPLY]


CHILD = """
import os, sys
sys.path.insert(0, sys.argv[1])
from runtime import Runtime
from runtime.config import Config
rt = Runtime(Config().with_overrides({"agent.mock_response": "Noted."}), sessions_dir=sys.argv[2]).start()
durable = [rt.start_session(model="openai/m", system_prompt="be brief") for _ in range(200)]
rt.flush()
print(" ".join(durable), flush=True)
if sys.argv[3] == "message":
    sid = durable[0]
    print(rt.prompt(sid, "remember me").result(timeout=60).text, flush=True)
for _ in range(100_000):  # starts go on until the kill: the last ones may not be written yet
    rt.start_session(model="openai/m")
"""


@pytest.mark.slow  # a child process per case: seconds even on an idle machine
@pytest.mark.parametrize("when", ["start", "message"])
def test_kill_9_keeps_every_durable_start_and_every_answered_message(sessions_dir: Path, when: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ROOT), str(sessions_dir), when], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        durable = child.stdout.readline().split()
        assert len(durable) == 200
        if when == "message":
            assert child.stdout.readline().strip() == REPLY
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        stored = {i.id: i for i in rt.list_sessions()}
        assert set(durable) <= set(stored)
        assert all(stored[s].error is None for s in stored)
        rt.resume_session(durable[-1])  # never used: its header comes from the index
        header = rt.services.directory.read_header(durable[-1])
        assert header is not None and header.system_prompt == "be brief"
        assert rt.prompt(durable[-1], "hello").result(timeout=60).text == REPLY
        rt.resume_session(durable[0])
        texts = [m.text for m in rt.messages(durable[0])]
        assert texts == (["remember me", REPLY] if when == "message" else [])


@pytest.mark.slow  # a second runtime in a child process: seconds even on an idle machine
def test_concurrent_starts_in_two_processes_share_one_directory(sessions_dir: Path) -> None:
    script = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from runtime import Runtime\n"
        f"with Runtime(sessions_dir={str(sessions_dir)!r}) as rt:\n"
        "    ids = [rt.start_session(model='openai/m') for _ in range(500)]\n"
        "print(' '.join(ids))\n"
    )
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        mine: list[str] = []
        lock = threading.Lock()

        def start() -> None:
            ids = [rt.start_session(model="openai/m") for _ in range(150)]
            with lock:
                mine.extend(ids)

        threads = [threading.Thread(target=start) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out, _ = other.communicate(timeout=300)
        theirs = out.split()
        assert other.returncode == 0 and len(theirs) == 500 and len(mine) == 1_200
        rt.flush()
        assert {i.id for i in rt.list_sessions()} == set(mine) | set(theirs)
        assert sorted(p.name for p in (sessions_dir / "index").iterdir()) == ["0.jsonl", "1.jsonl"]
        rt.resume_session(theirs[7])
        assert rt.prompt(theirs[7], "hi").result(timeout=60).text == REPLY
    for segment in (sessions_dir / "index").iterdir():  # whole lines only, none interleaved
        assert all(line.startswith(b'{"type":"header"') for line in segment.read_bytes().splitlines())


def test_many_sessions_started_and_deleted_quickly(sessions_dir: Path) -> None:
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        sids = [rt.start_session(model="openai/m") for _ in range(300)]
        gone = sids[::2]
        for sid in gone:  # deleted right after the start: the header may not be written yet
            rt.delete_session(sid)
        named = [rt.start_session(f"named-{i}", model="openai/m") for i in range(20)]
        for sid in named[:10]:
            rt.delete_session(sid)
        again = [rt.start_session(f"named-{i}", model="openai/other") for i in range(5)]  # the same ids again
        kept = set(sids[1::2]) | set(named[10:]) | set(again)
        assert {i.id for i in rt.list_sessions()} == kept
        assert rt.prompt(sids[1], "still here?").result(timeout=60).text == REPLY
        rt.delete_session(sids[1])  # used: its log and transcript go, and its index line is removed
        kept.discard(sids[1])
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        stored = {i.id: i for i in rt.list_sessions()}
        assert set(stored) == kept
        assert stored["named-0"].model == "openai/other"
    assert files(sessions_dir) == []  # nothing left of the deleted sessions


def test_idle_sessions_give_the_garbage_collector_nothing_to_walk(sessions_dir: Path) -> None:
    """Each full collection walks every object the cyclic collector tracks: were idle sessions among them,
    each start would pay for walks over all the sessions started before it (issue 32)."""
    from runtime.gateway import load_litellm

    load_litellm()  # (its import, which the runtime starts in the background, would be counted)
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        rt.start_session(model="openai/m")
        gc.collect()
        before = len(gc.get_objects())
        sids = [
            rt.start_session(model="openai/m", system_prompt=f"You are number {i}.") for i in range(2_000)
        ]
        gc.collect()
        assert len(gc.get_objects()) - before < 200  # none per session (the runtime's own come and go)
        # A first use from many threads at once still makes one session of it: every prompt is answered.
        barrier = threading.Barrier(8)
        answers: list[str] = []

        def use() -> None:
            barrier.wait()
            answers.append(rt.prompt(sids[7], "Still there?").result(timeout=60).text)

        threads = [threading.Thread(target=use) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [REPLY] * 8
        assert [m.text for m in rt.messages(sids[7])] == ["Still there?", REPLY] * 8
        assert rt.usage(sids[8]).input_tokens == 0  # another one, used from one thread
        assert len(rt.hosted_sessions()) == 2_001


def test_a_transcript_holds_every_event_from_the_session_started_on(sessions_dir: Path) -> None:
    """A new session's transcript is opened by its first event worth keeping; its ``session_started``
    (seq 1), left out while the session had nothing to keep, is written first, as subscribers got it."""
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        sub = rt.subscribe()
        sids = [rt.start_session(model="openai/m") for _ in range(3)]
        windowed = rt.start_session(model="openai/m", config={"models.context_windows": {"openai/m": 50_000}})
        rt.start_session("named", model="openai/m")
        for sid in (sids[1], windowed, "named"):
            assert rt.prompt(sid, "hello").result(timeout=60).text == REPLY
        rt.delete_session("named")
        rt.start_session("named", model="openai/other")  # the same id again: a new session, a new record
        assert rt.prompt("named", "again").result(timeout=60).text == REPLY
        rt.flush()
        live = sub.drain()
        directory = rt.services.directory
        for sid in (sids[1], windowed, "named"):
            written = read_transcript(directory.transcript_path(sid))
            assert [e.seq for e in written] == list(range(1, len(written) + 1))
            theirs = [e for e in live if e.session_id == sid]
            last_start = max(i for i, e in enumerate(theirs) if e.type == "session_started")
            assert written == theirs[last_start:][: len(written)]
            assert written[0].type == "session_started" and written[-1].type == "agent_end"
        started = {sid: read_transcript(directory.transcript_path(sid))[0] for sid in (windowed, "named")}
        assert started[windowed].context_window == 50_000 and started["named"].model == "openai/other"
        assert not directory.transcript_path(sids[0]).exists()  # an idle one: still nothing


def test_stop_tells_every_follower_and_makes_no_event_for_sessions_nobody_follows(sessions_dir: Path) -> None:
    """``stop`` ends every session; its ``session_stopped`` reaches each subscriber and transcript (a clean
    end: numbering goes on after it), and a sink that declines a session's events is not called for it."""
    got: list[tuple[str, str]] = []

    class Sink:
        def __call__(self, event: object) -> None:
            got.append((getattr(event, "type", ""), getattr(event, "session_id", "")))

        def wants(self, session_id: str, kind: str) -> bool:
            return session_id == sids[7]

    rt = Runtime(mock_config(), sessions_dir=sessions_dir).start()
    sids = [rt.start_session(model="openai/m") for _ in range(300)]
    one = rt.subscribe(sids[3])
    assert rt.prompt(sids[5], "hello").result(timeout=60).text == REPLY  # it has a transcript
    rt.flush()
    rt.bus.add_sink(Sink())
    everyone = Runtime(mock_config(), sessions_dir=sessions_dir.parent / "other").start()
    theirs = [everyone.start_session(model="openai/m") for _ in range(50)]
    every = everyone.subscribe()
    rt.stop()
    everyone.stop()
    assert [e.type for e in one.drain()] == ["session_stopped"]
    ended = read_transcript(rt.services.directory.transcript_path(sids[5]))[-1]
    assert ended.type == "session_stopped"
    assert sorted(sid for kind, sid in got if kind == "session_stopped") == sorted(
        [sids[3], sids[5], sids[7]]
    )
    assert sorted(e.session_id for e in every.drain() if e.type == "session_stopped") == sorted(theirs)


def test_a_crash_during_an_index_append_loses_only_that_line(
    sessions_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        sids = [rt.start_session(model="openai/m") for _ in range(20)]
    segment = sessions_dir / "index" / "0.jsonl"
    torn = encode_entry(new_header("torn-one", model="openai/m"))
    with segment.open("ab") as f:
        f.write(torn[: len(torn) // 2])  # the process died in the middle of this write
    assert {i.id for i in SessionDirectory(sessions_dir).list()} == set(sids)  # (agentcell sessions list)
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        later = rt.start_session(model="openai/m")  # claims the segment: the torn line is cut, and reported
        rt.flush()
        assert "torn last line" in caplog.text
        assert {i.id for i in rt.list_sessions()} == {*sids, later}
    assert segment.read_bytes().count(b"\n") == 21 and segment.read_bytes().endswith(b"\n")


def test_flat_directories_of_earlier_versions_still_open(sessions_dir: Path, tmp_path: Path) -> None:
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        sid = rt.start_session("old-one", model="openai/m")
        assert rt.prompt(sid, "before the upgrade").result(timeout=60).text == REPLY
        directory = rt.services.directory
        log, transcript = directory.log_path(sid), directory.transcript_path(sid)
    os.rename(log, sessions_dir / log.name)  # the layout of earlier versions: every file in the root
    os.rename(transcript, sessions_dir / transcript.name)
    assert [line.split()[0] for line in _sessions_list(sessions_dir)] == ["old-one"]
    assert (sessions_dir / log.name).exists()  # listing moves nothing
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        assert not (sessions_dir / log.name).exists() and log.exists()  # moved into its shard folder
        rt.resume_session(sid)
        assert [m.text for m in rt.messages(sid)] == ["before the upgrade", REPLY]
        rt.delete_session(sid)
    assert files(sessions_dir) == []


def _sessions_list(root: Path) -> list[str]:
    import io

    from runtime.apps.sessions_cli import run_sessions

    out = io.StringIO()
    assert run_sessions("list", None, sessions_dir=str(root), out=out) == 0
    return out.getvalue().splitlines()[1:-1]


def test_listing_flags_a_corrupt_line_in_the_middle_of_a_log(tmp_path: Path) -> None:
    """Issue 47: a garbled line between two good ones was listed as a healthy session."""
    from runtime.messages import assistant, user
    from runtime.store.tree import SessionTree

    directory = SessionDirectory(tmp_path / "sessions")
    tree = SessionTree(new_header("s1", model="m"))
    tree.append(user("a"))
    tree.append(assistant("b"))
    header, first, second = (encode_entry(e) for e in tree.entries())
    path = directory.log_path("s1")
    path.parent.mkdir(parents=True)
    path.write_bytes(header + first + b'{"type":"message","id":"x\n' + second)
    (info,) = directory.list()
    assert info.error is not None and "line 3" in info.error
    # a torn last line is not corruption: opening the session cuts it off
    path.write_bytes(header + first + second + b'{"type":"mess\n')
    (info,) = directory.list()
    assert info.error is None and info.messages == 2


def test_a_session_used_once_then_hibernated_leaves_at_most_its_handle_to_the_collector(
    sessions_dir: Path,
) -> None:
    """Issue 47: each such session kept two more objects the cycle collector tracks (a bound method per
    session, its transcript's callback), and a stopped actor's cancelled timers kept it for 5 s more."""
    from runtime.gateway import load_litellm

    load_litellm()
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:

        def use_and_park(count: int) -> None:
            sids = [rt.start_session(model="openai/m") for _ in range(count)]
            for sid in sids:
                assert rt.prompt(sid, "Once.").result(timeout=60).text == REPLY
            for sid in sids:
                assert rt.hibernate(sid)

        use_and_park(20)  # what the first ones make once (caches, threads)
        rt.flush()
        gc.collect()
        before = {id(o) for o in gc.get_objects()}
        use_and_park(100)
        use_and_park(1)  # (its count drops the cached counts of the messages gone)
        rt.flush()
        gc.collect()
        kept = [o for o in gc.get_objects() if id(o) not in before]
        assert len(kept) <= 100 + 100, collections.Counter(
            type(o).__name__ for o in kept
        ).most_common()  # one Session each (and a few of the last)


def test_resuming_reads_the_log_once(sessions_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47: resume_session read a log twice, its check and then its store; now the store takes the
    tree the check replayed (the log being as it was)."""
    import runtime.store.log as log_module

    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model="openai/m")
        assert rt.prompt(sid, "Hello").result(timeout=60).text == REPLY
    reads: list[str] = []
    real = log_module.read_file

    def counting(path: Any) -> bytes:
        reads.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(log_module, "read_file", counting)
    with Runtime(mock_config(), sessions_dir=sessions_dir) as rt:
        rt.resume_session(sid)
        assert [m.text for m in rt.messages(sid)] == ["Hello", REPLY]
        assert reads.count(os.fspath(rt.services.directory.log_path(sid))) == 1
        assert rt.prompt(sid, "Again").result(timeout=60).text == REPLY
