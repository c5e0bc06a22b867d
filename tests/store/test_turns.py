"""The journal of open turns (``runtime/store/turns.py``, design §3.12): a runtime lists a turn while it runs
and drops it once its end is in the log; ``interrupted_sessions`` finds the turns runtimes that are gone
left open, from their journals alone."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.provider import Turn
from runtime.store.sessions import SessionDirectory
from runtime.store.turns import COMPACT_LINES, TURNS_DIR, TurnJournal, read_journal
from runtime.store.writer import LogWriter
from tests.conftest import wait_until


def journals(sessions: Path) -> dict[str, list[str]]:
    folder = sessions / TURNS_DIR
    if not folder.exists():  # (made by a runtime's first turn)
        return {}
    return {p.name: read_journal(p.read_bytes()) for p in folder.iterdir() if not p.name.startswith(".")}


def test_read_journal_keeps_what_its_last_line_of_each_session_says() -> None:
    data = b"+a\n+b\n-b\n+c\n-a\n+a\nxyz\n+../bad\n+d"  # (the last line is torn: no newline)
    assert read_journal(data) == ["c", "a"]


def test_a_turn_is_listed_open_while_it_runs_and_the_journal_goes_with_a_clean_stop(
    sessions_dir: Path, provider: Any, script: Callable[..., str]
) -> None:
    model = script(Turn(text="slow answer", latency=1.0))
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
        handle = rt.prompt(sid, "take your time")
        wait_until(lambda: sid in [s for open_ in journals(sessions_dir).values() for s in open_])
        assert handle.result(timeout=30).status == "ok"
        rt.flush()  # (the end's line goes with the writer's next round)
        rt.flush()
        assert [s for open_ in journals(sessions_dir).values() for s in open_] == []
        assert rt.interrupted_sessions() == []  # its own running turns are not "interrupted"
    assert journals(sessions_dir) == {}  # nothing open: no journal left


def test_interrupted_sessions_are_the_open_turns_of_runtimes_that_are_gone(sessions_dir: Path) -> None:
    with Runtime(sessions_dir=sessions_dir) as rt:
        for sid in ("gone-a", "held"):  # (stored; "deleted" is not)
            rt.start_session(sid, model="openai/none")
    folder = sessions_dir / TURNS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    dead = folder / "1-dead.jsonl"
    dead.write_bytes(b"+gone-a\n+gone-b\n-gone-b\n+hosted\n+held\n+deleted\n+torn")
    live = folder / "2-live.jsonl"
    live.write_bytes(b"+running-elsewhere\n")
    holder = os.open(live, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a runtime that still runs holds its journal
    other = SessionDirectory(sessions_dir)
    held = other.lock("held")  # another runtime has the session open
    try:
        with Runtime(sessions_dir=sessions_dir) as rt:
            rt.start_session("hosted", model="openai/none")
            assert rt.interrupted_sessions() == ["gone-a"]
            assert not dead.exists() and live.exists()  # the dead one is read once: it is this one's now
            assert rt.interrupted_sessions() == ["gone-a"]  # still listed until resumed
        left = journals(sessions_dir)
        assert left.pop(live.name) == ["running-elsewhere"]
        assert list(left.values()) == [["gone-a", "hosted"]]  # kept for a runtime started later
        with Runtime(sessions_dir=sessions_dir) as rt:
            assert rt.interrupted_sessions() == ["gone-a", "hosted"]
    finally:
        held.release()
        other.close()
        os.close(holder)


def test_a_listed_session_whose_log_shows_no_open_turn_is_dropped_once_resumed(
    sessions_dir: Path, provider: Any, script: Callable[..., str]
) -> None:
    """A journal may say a turn is open when its log says it ended (the end's line was lost with the
    process): resuming the session finds nothing to take up, and the session is no longer listed."""
    model = script(Turn(text="done"))
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
        assert rt.prompt(sid, "hello").result(timeout=30).status == "ok"
    (sessions_dir / TURNS_DIR / "9-dead.jsonl").write_bytes(f"+{sid}\n".encode())
    with Runtime(sessions_dir=sessions_dir) as rt:
        assert rt.interrupted_sessions() == [sid]
        rt.resume_session(sid, api_key="sk-local")
        assert rt.resumed_turn(sid) is None
        rt.stop_session(sid)
        assert rt.interrupted_sessions() == []
    assert journals(sessions_dir) == {}


def test_the_journal_is_rewritten_with_the_open_turns_only_as_it_grows(tmp_path: Path) -> None:
    writer = LogWriter()
    journal = TurnJournal(tmp_path, writer, fsync="turn")
    path = Path(journal.claim())
    try:
        journal.opened("stays")
        for n in range(COMPACT_LINES):  # two lines each: the journal is rewritten at least once
            sid = f"s{n}"
            journal.closed(sid, journal.opened(sid))
            if n % 512 == 0:
                writer.flush()
        writer.flush()
        writer.flush()
        assert read_journal(path.read_bytes()) == ["stays"]
        assert path.read_bytes().count(b"\n") < COMPACT_LINES  # (2 x 4,096 lines written in all)
        fd = os.open(path, os.O_RDONLY)
        try:  # the rewritten file is flocked too: no other runtime takes it for a dead one's
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the rewritten journal is not flocked")
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    finally:
        writer.close()
        journal.close()
    assert read_journal(path.read_bytes()) == ["stays"]  # stopped with a turn open: kept for the next


class _Fsyncs:
    """The files the log writer fsyncs (by name), in order: ``runtime.store.writer._fdatasync`` wrapped."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from runtime.store import writer

        self.names: list[str] = []
        real = writer._fdatasync

        def fdatasync(fd: int) -> None:
            self.names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            real(fd)

        monkeypatch.setattr(writer, "_fdatasync", fdatasync)

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


@contextmanager
def _one_round(writer: LogWriter, tmp_path: Path) -> Iterator[None]:
    """What is queued inside goes to the writer in one round (the writer waits on a call meanwhile)."""
    gate, waiting = threading.Event(), threading.Event()

    def hold(_path: str) -> None:
        waiting.set()
        gate.wait(10)

    writer.call(tmp_path / "gate", hold)
    assert waiting.wait(10)
    try:
        yield
    finally:
        gate.set()
        writer.flush()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fd through /proc")
def test_under_fsync_turn_the_journal_is_fsynced_with_the_next_log_the_writer_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """design §3.12: a turn's ``+`` line is as durable as its log under ``persistence.fsync = "turn"``: in
    the round that fsyncs a log (a turn's end), the journal first, once, when a ``+`` line of a turn that
    fsync does not end waits (on main it was never fsynced: after a machine crash a turn's start could be
    in its log and not in the journal); a turn whose end is fsynced needs no fsync of its line."""
    fsyncs = _Fsyncs(monkeypatch)
    writer = LogWriter("turn")
    journal = TurnJournal(tmp_path, writer, fsync="turn")
    name = os.path.basename(journal.path)
    log_a, log_b, log_c = (tmp_path / f"{s}.jsonl" for s in "abc")

    def turn_ends(log: Path) -> None:
        writer.append(log, b"answer\n")
        writer.sync(log, ends_turn=True)

    try:
        mark = journal.opened("a", log=str(log_a))  # a's turn starts: its line, then its start record
        writer.append(log_a, b"turn a\n")
        writer.flush()
        assert fsyncs.take() == []  # (neither fsynced yet)
        turn_ends(log_b)  # b's turn ends: its log is fsynced, and the journal before it (a's line)
        writer.flush()
        assert fsyncs.take() == [name, "b.jsonl"]
        journal.closed("a", mark)  # a '-' line waits for no fsync
        writer.flush()
        turn_ends(log_b)
        writer.flush()
        assert fsyncs.take() == ["b.jsonl"]
        mark = journal.opened("b", log=str(log_b))  # one session's turn, start to end: one fsync, its log's
        writer.append(log_b, b"turn b\n")
        turn_ends(log_b)
        writer.flush()
        journal.closed("b", mark)
        assert fsyncs.take() == ["b.jsonl"]
        with _one_round(writer, tmp_path):  # two turns start and end in one round
            for sid, log in (("b", log_b), ("c", log_c)):
                journal.opened(sid, log=str(log))
                writer.append(log, f"turn {sid}\n".encode())
            turn_ends(log_b)
            turn_ends(log_c)
        assert fsyncs.take() == [name, "b.jsonl", "c.jsonl"]  # the journal once, first (c's line)
    finally:
        writer.close()
        journal.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fd through /proc")
def test_a_session_that_fsyncs_always_gets_its_line_fsynced_before_its_record_in_any_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's own ``always`` in a runtime that never fsyncs: its ``+`` line is fsynced before its start
    record, also when it was queued behind a session's line that needs no fsync (taken, and written, by the
    append queued first: the one queued for it fsyncs all the same); ``never`` fsyncs nothing."""
    fsyncs = _Fsyncs(monkeypatch)
    writer = LogWriter("never")
    journal = TurnJournal(tmp_path, writer, fsync="never")
    name = os.path.basename(journal.path)
    try:
        journal.opened("lazy")
        writer.append(tmp_path / "lazy.jsonl", b"turn\n")
        writer.sync(tmp_path / "lazy.jsonl")
        writer.flush()
        assert fsyncs.take() == []
        with _one_round(writer, tmp_path):
            journal.opened("other")
            journal.opened("careful", "always")
            writer.append(tmp_path / "careful.jsonl", b"turn\n", fsync="always")
        assert fsyncs.take() == [name, "careful.jsonl"]
        assert read_journal(Path(journal.path).read_bytes()) == ["lazy", "other", "careful"]
    finally:
        writer.close()
        journal.close()
