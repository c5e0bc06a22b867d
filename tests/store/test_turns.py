"""The journal of open turns (``runtime/store/turns.py``, design §3.12): a runtime lists a turn while it runs
and drops it once its end is in the log; ``interrupted_sessions`` finds the turns runtimes that are gone
left open, from their journals alone."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
