"""bench_real's reading of refusals: a request the server refused, not every emergency compaction.

An emergency (``overflow``) compaction comes either after a provider's overflow error (the request was
refused) or before a request, when a turn sees its request would not fit the session's limit (issue 40: a
benchmark run counted one of those as a refusal, though llama.cpp's log had no error at all).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks._llama import server_counts
from benchmarks.bench_real import agents_refused
from runtime import events as ev
from runtime.messages import Usage

SID = "s1"


def start(turn: str) -> ev.Event:
    return ev.RequestStart(
        session_id=SID, turn_id=turn, attempt=1, model="m", messages=3, estimated_tokens=900
    )


def compaction(trigger: str) -> ev.Event:
    return ev.CompactionStart(session_id=SID, trigger=trigger, messages_before=9, tokens_before=969)  # type: ignore[arg-type]


def answered(turn: str) -> ev.Event:
    return ev.TurnEnd(session_id=SID, turn_id=turn, stop_reason="stop", usage=Usage())


def ended(turn: str, status: str) -> ev.Event:
    return ev.AgentEnd(session_id=SID, turn_id=turn, status=status)  # type: ignore[arg-type]


def test_a_request_followed_by_the_recovery_of_an_overflow_error_is_a_refusal() -> None:
    refused = start("t2")
    events = [start("t1"), answered("t1"), ended("t1", "ok"), refused, compaction("overflow"), start("t2")]
    assert agents_refused(events) == [refused]


def test_an_emergency_compaction_before_a_request_is_no_refusal() -> None:
    # what issue 40's run saw: a threshold compaction that could not make progress, then the turn's own
    # emergency compaction, then its request, answered
    events = [
        start("t1"),
        answered("t1"),
        ended("t1", "ok"),
        compaction("threshold"),
        compaction("overflow"),
        start("t2"),
        answered("t2"),
    ]
    assert agents_refused(events) == []


def test_an_aborted_request_then_a_compaction_is_no_refusal() -> None:
    events = [start("t1"), ended("t1", "aborted"), compaction("overflow"), start("t2"), answered("t2")]
    assert agents_refused(events) == []


def test_llama_cpps_log_gives_its_requests_and_refusals(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.write_text(
        "0.01 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0\n"
        "0.02 I slot launch_slot_: id  1 | task 4 | processing task, is_child = 0\n"
        "0.03 E srv    send_error: task id = 4, error: request (1431 tokens) exceeds the available context "
        "size (1024 tokens), try increasing it\n"
        "0.04 E srv    send_error: task id = 9, error: input (3000 tokens) is larger than the max context "
        "size (2048 tokens). skipping\n"
        "0.05 E srv    send_error: task id = 11, error: context shift is disabled\n"
    )
    counts = server_counts(log)
    assert counts.requests == 2
    assert counts.refused == (
        "request (1431 tokens) exceeds the available context size (1024 tokens), try increasing it",
        "input (3000 tokens) is larger than the max context size (2048 tokens). skipping",
    )
