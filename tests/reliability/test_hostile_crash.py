"""Crashes in the middle of a turn: the log says a turn was cut off, and an agent crash loses no turn.

A child process runs a session against the local provider (with ``agent.resume_turns`` off: by default a
resumed session takes the turn up, tests/reliability/test_durable_turns.py) and is killed with SIGKILL
while the model is streaming its answer. Resumed in this process, the session says in its log (and in
``agent_recovered``) that the turn was interrupted, and takes the next prompt. Inside one process, an agent that crashes
mid-turn is restarted and its successor takes the turn up (tests/session/test_agent.py covers that path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.context.integrity import INTERRUPTED_TURN_TEXT, check_integrity
from runtime.messages import KIND_TURN_INTERRUPTED
from runtime.provider.script import Turn
from tests.conftest import Recorder

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from runtime import Runtime
with Runtime(sessions_dir=sys.argv[2]) as rt:
    sid = rt.start_session("victim", model="openai/" + sys.argv[4], api_base=sys.argv[3], api_key="sk-local",
                           config={"agent": {"resume_turns": False}})
    assert rt.prompt(sid, "first question").result(timeout=60).status == "ok"
    streaming = []
    rt.subscribe(sid, types={"text_delta"}, callback=lambda event: streaming.append(event))
    rt.prompt(sid, "second question")
    while not streaming:
        time.sleep(0.01)
    print("streaming", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow  # a child process killed mid-turn: seconds even on an idle machine
def test_a_turn_cut_off_by_kill_9_is_recorded_when_the_session_resumes(
    provider: Any, sessions_dir: Path, rt: Any, recorder: Recorder
) -> None:
    """kill -9 while the model streams, with ``agent.resume_turns`` off: after a resume the log ends the
    cut-off turn with a note saying so, ``agent_recovered`` reports it, ``resumed_turn`` is None, and the
    session answers the next prompt."""
    name = f"kill9-{os.getpid()}-{time.monotonic_ns()}"
    slow = " ".join(f"word{i}" for i in range(400))
    answers = [Turn(text="first answer"), Turn(text=slow), Turn(text="after the kill"), Turn(text="fourth")]
    provider.add_script(name, answers)
    chunk_delay, provider.chunk_delay = provider.chunk_delay, 0.05  # the second answer streams slowly
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(ROOT), str(sessions_dir), provider.url, name],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "streaming"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        provider.chunk_delay = chunk_delay

    sid = rt.resume_session("victim", api_base=provider.url, api_key="sk-local")
    assert rt.resumed_turn(sid) is None
    after = rt.prompt(sid, "third question").result(timeout=60)
    assert after.status == "ok" and after.text == "after the kill"
    recorder.wait_type("agent_end")
    (recovered,) = recorder.of("agent_recovered", sid)
    assert recovered.interrupted_turn and not recovered.continued
    history = rt.messages(sid)
    assert [m.text for m in history if m.role == "user"] == [
        "first question",
        "second question",
        "third question",
    ]
    note = next(m for m in history if m.kind == KIND_TURN_INTERRUPTED)
    assert note.text == INTERRUPTED_TURN_TEXT and history.index(note) == 3  # right after the cut-off prompt
    assert check_integrity(rt.messages(sid, view="model")).ok
    # resumed again, nothing is interrupted any more
    rt.stop_session(sid)
    rt.resume_session(sid, api_base=provider.url, api_key="sk-local")
    assert rt.prompt(sid, "fourth question").result(timeout=60).text == "fourth"
    recorder.wait_type("agent_end", 2)  # the callback's thread has both turns' events
    recovered_again = recorder.of("agent_recovered", sid)[-1]
    assert not recovered_again.interrupted_turn


def test_a_turn_that_ended_in_an_error_is_not_taken_for_an_interrupted_one(
    provider: Any, rt: Any, recorder: Recorder, session: Any, script: Any
) -> None:
    """A turn that ended with an error (no final answer) is recorded as ended: a resume adds no note."""
    model = script(Turn(text="ok"))
    sid = session(model, tools=None)
    provider.inject_fault("auth")
    assert rt.prompt(sid, "fails").result(timeout=30).status == "error"
    recorder.wait_type("agent_end")
    rt.stop_session(sid)
    rt.resume_session(sid, api_base=provider.url, api_key="sk-local")
    assert rt.prompt(sid, "works").result(timeout=30).text == "ok"
    recorder.wait_type("agent_end", 2)  # the callback's thread has the second turn's events
    (recovered,) = recorder.of("agent_recovered", sid)
    assert not recovered.interrupted_turn
    assert not [m for m in rt.messages(sid) if m.kind == KIND_TURN_INTERRUPTED]
