"""Hostile and damaged storage: corrupt logs, torn transcripts, huge messages.

A damaged log is a clear error naming the file and line, never a session that reports success and dies;
it can be opened up to its last good entry without losing the rest; event numbers never repeat; and a
message is stored once however it is hidden.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runtime import CorruptLogError, Runtime
from runtime.provider.script import Turn
from runtime.store.log import read_log, replay
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript
from tests.conftest import Recorder

_names = iter(range(1, 1_000_000))


def script(provider: Any, *turns: Turn) -> str:
    name = f"hostile-store-{next(_names)}"
    provider.add_script(name, list(turns))
    return f"openai/{name}"


def stored_session(sessions_dir: Path, provider: Any, prompts: int = 3) -> str:
    """A session with ``prompts`` answered prompts, written by a runtime that then stopped cleanly."""
    model = script(provider, *[Turn(text=f"answer {i}") for i in range(prompts + 5)])
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session("stored", model=model, api_base=provider.url, api_key="sk-local")
        for i in range(prompts):
            assert rt.prompt(sid, f"prompt {i}").result(timeout=30).status == "ok"
    return sid


def corrupt_line(path: Path, number: int) -> bytes:
    """Replace line ``number`` (1-based) of ``path`` with garbage; returns the bytes from it on, as they were."""
    lines = path.read_bytes().split(b"\n")
    after = b"\n".join(lines[number - 1 :])
    lines[number - 1] = b'{"type": "message", "garbage'
    path.write_bytes(b"\n".join(lines))
    return after


# -- a corrupt log ----------------------------------------------------------------------------------------


def test_resuming_a_log_with_a_corrupt_line_is_a_clear_error(sessions_dir: Path, provider: Any) -> None:
    """resume_session on a log with a corrupt line raises CorruptLogError naming the file and line."""
    sid = stored_session(sessions_dir, provider)
    log = SessionDirectory(sessions_dir).log_path(sid)
    corrupt_line(log, 3)
    with Runtime(sessions_dir=sessions_dir) as rt:
        with pytest.raises(CorruptLogError, match="repair='truncate'") as caught:
            rt.resume_session(sid, api_key="sk-local")
        assert caught.value.path == str(log) and caught.value.line == 3
        assert f"{log}, line 3" in str(caught.value)
        assert rt.hosted_sessions() == []  # nothing half-open is left behind


def test_a_corrupt_log_opens_up_to_its_last_good_entry_on_request(sessions_dir: Path, provider: Any) -> None:
    """resume_session(repair="truncate") opens the session up to the bad line and keeps the rest aside."""
    sid = stored_session(sessions_dir, provider)
    log = SessionDirectory(sessions_dir).log_path(sid)
    entries, _ = read_log(log)
    kept = replay(log, entries[:4]).messages()  # lines 1-4: the header, prompt 0, answer 0, prompt 1
    after = corrupt_line(log, 5)
    with Runtime(sessions_dir=sessions_dir) as rt:
        recorder = Recorder()
        rt.subscribe(sid, callback=recorder)
        rt.resume_session(sid, api_key="sk-local", repair="truncate")
        assert [m.text for m in rt.messages(sid)] == [m.text for m in kept]
        [recovered] = recorder.of("log_recovered")
        assert recovered.path == str(log) and recovered.line == 5
        assert Path(recovered.kept_in).read_bytes().startswith(b'{"type": "message", "garbage')
        assert Path(recovered.kept_in).read_bytes().split(b"\n")[1:] == after.split(b"\n")[1:]
        assert Path(recovered.kept_in).stat().st_mode & 0o077 == 0
        assert rt.prompt(sid, "after the repair").result(timeout=30).status == "ok"
    replay(log, read_log(log)[0])  # the repaired log replays


def test_a_corrupt_header_cannot_be_repaired(sessions_dir: Path, provider: Any) -> None:
    """A log whose header is corrupt is an error even with repair: there would be nothing to keep."""
    sid = stored_session(sessions_dir, provider, prompts=1)
    corrupt_line(SessionDirectory(sessions_dir).log_path(sid), 1)
    with Runtime(sessions_dir=sessions_dir) as rt, pytest.raises(CorruptLogError, match="line 1"):
        rt.resume_session(sid, repair="truncate")


# -- event numbers ----------------------------------------------------------------------------------------


def crash_transcript(path: Path, keep: int) -> int:
    """Make ``path`` look like a crash hit it: its first ``keep`` events, then a torn line. Returns the
    highest seq it ever held (what subscribers may have seen)."""
    lines = path.read_bytes().split(b"\n")[:-1]
    highest = max(json.loads(line)["seq"] for line in lines)
    torn = lines[keep][: len(lines[keep]) // 2]
    path.write_bytes(b"\n".join(lines[:keep]) + b"\n" + torn)
    return highest


def test_event_numbers_never_repeat_after_a_crash(sessions_dir: Path, provider: Any) -> None:
    """After a crash, a resumed session's events are numbered after every event it ever published."""
    sid = stored_session(sessions_dir, provider)
    transcript = SessionDirectory(sessions_dir).transcript_path(sid)
    highest = crash_transcript(transcript, keep=10)
    with Runtime(sessions_dir=sessions_dir) as rt:
        recorder = Recorder()
        rt.subscribe(sid, callback=recorder)
        rt.resume_session(sid, api_key="sk-local")
        assert rt.prompt(sid, "go on").result(timeout=30).status == "ok"
        recorder.wait_type("agent_end")
        seqs = [e.seq for e in recorder.events]
        assert min(seqs) > highest, f"seq {min(seqs)} reused (events up to {highest} were published)"
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_torn_transcript_line_is_reported(sessions_dir: Path, provider: Any) -> None:
    """A torn last line of the event transcript is cut and reported with log_recovered, like the log's."""
    sid = stored_session(sessions_dir, provider, prompts=1)
    transcript = SessionDirectory(sessions_dir).transcript_path(sid)
    size = transcript.stat().st_size
    crash_transcript(transcript, keep=5)
    torn = transcript.stat().st_size - len(b"\n".join(transcript.read_bytes().split(b"\n")[:5])) - 1
    with Runtime(sessions_dir=sessions_dir) as rt:
        recorder = Recorder()
        rt.subscribe(sid, callback=recorder)
        rt.resume_session(sid, api_key="sk-local")
        rt.services.writer.flush()  # the transcript is opened, and its tail cut, on the writer's thread
        recorder.wait_for(lambda events: any(e.type == "log_recovered" for e in events))
        reports = [e for e in recorder.of("log_recovered") if e.path == str(transcript)]
        assert [e.torn_bytes for e in reports] == [torn]
    assert transcript.stat().st_size < size
    read_transcript(transcript)  # whole lines only


def test_numbering_goes_on_without_a_gap_after_a_clean_stop(sessions_dir: Path, provider: Any) -> None:
    """After an orderly stop, a resumed session's numbering goes on from the transcript's last event."""
    sid = stored_session(sessions_dir, provider, prompts=1)
    last = read_transcript(SessionDirectory(sessions_dir).transcript_path(sid))[-1]
    assert last.type == "session_stopped"
    with Runtime(sessions_dir=sessions_dir) as rt:
        recorder = Recorder()
        rt.subscribe(sid, callback=recorder)
        rt.resume_session(sid, api_key="sk-local")
        recorder.wait_type("session_started")
        assert recorder.events[0].seq == last.seq + 1


# -- huge messages ----------------------------------------------------------------------------------------


def test_hiding_a_huge_message_stores_its_id_not_a_copy(sessions_dir: Path, provider: Any) -> None:
    """Hiding a message from the model records its id: a huge prompt is stored once, not twice."""
    from actors.session_store import SetVisibility

    huge = "word " * 50_000
    model = script(provider, Turn(text="read it"), Turn(text="next"))
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
        assert rt.prompt(sid, huge).result(timeout=60).status == "ok"
        log = SessionDirectory(sessions_dir).log_path(sid)
        rt.services.writer.flush()
        before = log.stat().st_size
        prompt = rt.messages(sid)[0]
        store = rt._session(sid).refs.store
        stored = store.ask(SetVisibility(message_ids=(prompt.id,), agent_visible=False), timeout=30)
        assert stored.ok
        rt.services.writer.flush()
        assert log.stat().st_size - before < 1_000
        assert [m.text for m in rt.messages(sid, view="model")] == ["read it"]
        assert rt.messages(sid)[0].text == huge and not rt.messages(sid)[0].agent_visible
    with Runtime(sessions_dir=sessions_dir) as rt:  # and so it replays
        rt.resume_session(sid, api_key="sk-local")
        assert [m.text for m in rt.messages(sid, view="model")] == ["read it"]
        assert rt.messages(sid)[0].text == huge
    assert os.path.getsize(log) < len(huge) * 1.1
