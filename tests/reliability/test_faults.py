"""Faults (design §9): crashes, provider faults, a failing summarizer, SIGKILL, a full disk.

After each fault the session recovers, nothing acknowledged is lost, its events go on in order, every tool
call has exactly one result, and it answers the next prompt.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors import protocol as st
from runtime import Runtime
from runtime.config import Config
from runtime.context.integrity import check_integrity
from runtime.provider.script import FAULT_KINDS, Fault, FaultKind, ToolCallSpec, Turn
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript
from tests.conftest import RPM
from tests.reliability.support import EventLog, Gate, check_log, message_ids, order_problems

ROOT = Path(__file__).resolve().parents[2]
ACTORS = ("store", "usage", "overflow", "compactor", "agent")
STATES = ("idle", "streaming", "executing_tools", "compacting")
LONG_ANSWER = "Here are the notes. " + " ".join(f"note{i}" for i in range(1_500))
SUMMARY = "## Goal\nKeep notes.\n\n## Progress\n### Done\n- Took notes."
_names = iter(range(1, 1_000_000))


def fast_config(**overrides: Any) -> Config:
    return Config().with_overrides(
        {"retry.base_delay": 0.01, "retry.max_delay": 0.05, "bus.subscriber_queue": 100_000, **overrides}
    )


@pytest.fixture
def runtime_with_events(sessions_dir: Path) -> Iterator[tuple[Runtime, EventLog]]:
    events = EventLog()
    with Runtime(fast_config(), sessions_dir=sessions_dir) as rt:
        rt.subscribe("*", callback=events)
        yield rt, events


def add_script(provider: Any, *turns: Turn, loop: bool = False) -> str:
    name = f"faults-{next(_names)}"
    provider.add_script(name, list(turns), loop=loop)
    return name


def crash(rt: Runtime, sid: str, actor: str) -> None:
    """Make ``actor``'s handler raise: an unexpected message, or for the store a command that does not fit."""
    ref = getattr(rt._session(sid).refs, actor)  # the running actor (ActorDeadError if it is not)
    ref.tell(st.Append(()) if actor == "store" else object())


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def assert_recovered(rt: Runtime, sid: str, acknowledged: set[str]) -> None:
    """The session's state after a fault: nothing acknowledged lost, every tool call answered."""
    stored = {m.id for m in rt.messages(sid)}
    assert acknowledged <= stored, f"acknowledged messages lost: {acknowledged - stored}"
    assert check_integrity(rt.messages(sid, view="model")).ok


# -- a crash of each actor in each state of a turn --------------------------------------------------------


def hold_in_state(rt: Runtime, events: EventLog, provider: Any, state: str, gate: Gate) -> tuple[str, Any]:
    """Start a session and bring a turn to ``state``; returns the session and the turn's handle (None
    when idle)."""
    summarizer = add_script(provider, Turn(text=SUMMARY, latency=1.0), loop=True)
    after = Turn(text="after the crash")
    first = {
        "idle": Turn(text="before the crash"),
        "streaming": Turn(text="a slow answer", latency=5.0),
        "executing_tools": Turn(tool_calls=(ToolCallSpec(name="wait_here"),)),
        "compacting": Turn(text=LONG_ANSWER),
    }[state]
    main = add_script(provider, first, after, after)
    config = {
        "models.context_windows": {f"openai/{main}": 4_000, f"openai/{summarizer}": 32_000},
        "compaction.reserve_tokens": 500,
        "compaction.summarizer_model": f"openai/{summarizer}",
    }
    sid = rt.start_session(
        model=f"openai/{main}",
        api_base=provider.url,
        api_key="sk-local",
        tools=gate.registry(),
        config=config,
    )
    if state in ("idle", "compacting"):
        assert rt.prompt(sid, "First, take notes.").result(timeout=30).status == "ok"
        if state == "idle":
            return sid, None
        handle = rt.prompt(sid, "Now go on.")  # over the threshold: compacts first, with a slow summarizer
        events.wait_for(sid, "compaction_start")
        return sid, handle
    handle = rt.prompt(sid, "Go.")
    if state == "streaming":
        wait_until(lambda: provider.remaining_turns(main) == 2)  # the provider is answering, slowly
    else:
        assert gate.entered.wait(20)
    return sid, handle


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("actor", ACTORS)
def test_a_crash_of_any_actor_in_any_state_recovers(
    sessions_dir: Path, provider: Any, actor: str, state: str
) -> None:
    gate = Gate()
    events = EventLog()
    try:
        with Runtime(fast_config(), sessions_dir=sessions_dir) as rt:
            rt.subscribe("*", callback=events)
            sid, handle = hold_in_state(rt, events, provider, state, gate)
            recovered_before = len(events.of(sid, "agent_recovered"))
            acknowledged = {e.message_id for e in events.of(sid, "message_appended")}
            used = rt.usage(sid)  # queries go through proxies the runtime keeps: they must follow restarts
            crash(rt, sid, actor)

            events.wait_for(sid, "agent_recovered", recovered_before + 1)
            restarted = [e.actor for e in events.of(sid, "actor_restarted")]
            # rest_for_one: the crashed actor and every actor started after it, the agent last
            assert restarted[0] == actor and restarted[-1] == "agent"
            if handle is not None and actor == "agent":  # its successor takes the turn up from the log
                resumed = handle.result(timeout=10)
                assert resumed.status == "ok" and resumed.text == "after the crash", resumed.error
                assert events.of(sid, "agent_recovered")[-1].continued
            elif (
                handle is not None
            ):  # the store restarts under the agent: the interrupted turn ends, and says why
                interrupted = handle.result(timeout=10)
                assert interrupted.status in ("error", "aborted") and interrupted.error
            gate.release.set()
            assert_recovered(rt, sid, acknowledged)
            assert rt.usage(sid).input_tokens >= used.input_tokens
            assert rt.context_stats(sid).window > 0
            after = rt.prompt(sid, "Carry on.").result(timeout=30)
            assert after.status == "ok", after.error
            assert after.text == "after the crash"
            events.wait_for(sid, "agent_end", 1 + (state in ("idle", "compacting")) + (handle is not None))
            assert check_integrity(rt.messages(sid, view="model")).ok
            assert not order_problems(events.events(sid))
    finally:
        gate.release.set()
    check = check_log(SessionDirectory(sessions_dir), sid)
    assert not check.problems
    assert acknowledged <= message_ids(check.tree)


def test_a_manual_compaction_cut_short_by_a_crash_still_answers(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any
) -> None:
    rt, events = runtime_with_events
    summarizer = add_script(provider, Turn(text=SUMMARY, latency=5.0), Turn(text=SUMMARY))
    main = add_script(provider, Turn(text="answer " * 100), loop=True)
    config = {"compaction.summarizer_model": f"openai/{summarizer}"}
    sid = rt.start_session(model=f"openai/{main}", api_base=provider.url, api_key="sk-local", config=config)
    for i in range(3):
        assert rt.prompt(sid, f"question {i}").result(timeout=30).status == "ok"
    handle = rt.compact(sid)
    events.wait_for(sid, "compaction_start")
    # the slow summary is asked (crashed before it arrived, the retry would get the slow turn)
    wait_until(lambda: provider.remaining_turns(summarizer) == 1)
    crash(rt, sid, "compactor")
    result = handle.result(timeout=10)  # not after the slow summarizer, and never forever
    assert not result.compacted and "crashed" in (result.reason or "")
    (failed,) = events.wait_for(sid, "compaction_failed")
    assert failed.reason == "interrupted" and failed.trigger == "manual"
    events.wait_for(sid, "agent_recovered")
    assert rt.compact(sid).result(timeout=30).compacted  # a manual retry is always allowed


def test_a_crash_loop_escalates_and_the_next_request_restarts_the_session(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any
) -> None:
    rt, events = runtime_with_events
    main = add_script(provider, Turn(text="one"), Turn(text="two"))
    sid = rt.start_session(model=f"openai/{main}", api_base=provider.url, api_key="sk-local")
    assert rt.prompt(sid, "first").result(timeout=30).status == "ok"
    limit = rt.config.runtime.max_restarts
    for i in range(limit + 1):  # one more crash than the supervisor's intensity allows
        wait_until(lambda: rt._session(sid).refs.agent_ref is not None or not rt._session(sid).running)
        if not rt._session(sid).running:
            break
        crash(rt, sid, "agent")
        if i < limit:
            events.wait_for(sid, "agent_recovered", i + 1)
    (escalated,) = events.wait_for(sid, "error")
    assert escalated.code == "session_crashed"
    wait_until(lambda: not rt._session(sid).running)
    assert rt.prompt(sid, "second").result(timeout=30).text == "two"
    assert [m.text for m in rt.messages(sid)] == ["first", "one", "second", "two"]


# -- provider faults ------------------------------------------------------------------------------------

TRANSIENT: tuple[FaultKind, ...] = (
    "rate_limit",
    "server_error",
    "overloaded",
    "hang",
    "stall",
    "keepalive",
    "reset",
    "stream_error",
)


def fault_session(rt: Runtime, provider: Any, *turns: Turn, **config: Any) -> tuple[str, str]:
    main = add_script(provider, *turns)
    config.setdefault("retry.request_timeout", 0.5)  # a hung provider is a timeout, retried
    sid = rt.start_session(model=f"openai/{main}", api_base=provider.url, api_key="sk-local", config=config)
    return sid, main


def requests_to(provider: Any, name: str) -> list[Any]:
    return [r for r in provider.request_log if r.model == name]


def test_every_fault_kind_of_the_provider_is_covered() -> None:
    assert set(FAULT_KINDS) == {*TRANSIENT, "auth", "overflow"}


@pytest.mark.parametrize("kind", TRANSIENT)
def test_a_transient_provider_fault_is_retried_and_the_turn_succeeds(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any, kind: FaultKind
) -> None:
    rt, events = runtime_with_events
    fault = Fault(kind=kind, retry_after=0.01, after_chunks=2, rpm=RPM)
    sid, _ = fault_session(rt, provider, Turn(fault=fault), Turn(text="after the retry"))
    result = rt.prompt(sid, "hello").result(timeout=30)
    assert result.status == "ok", result.error
    assert result.text == "after the retry"
    events.wait_for(sid, "agent_end")
    (retry,) = events.of(sid, "provider_retry")
    assert retry.attempt == 1 and retry.error
    assert [m.text for m in rt.messages(sid)] == ["hello", "after the retry"]  # the cut reply left nothing


@pytest.mark.parametrize("kind", TRANSIENT)
def test_a_provider_that_keeps_failing_ends_the_turn_without_a_loop(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any, kind: FaultKind
) -> None:
    rt, events = runtime_with_events
    # a 429 puts the call back in its pool's queue and uses no retry attempt: capacity.max_refusals bounds
    # those (design §3.11)
    attempts = rt.config.capacity.max_refusals + 1 if kind == "rate_limit" else rt.config.retry.max_attempts
    fault = Turn(fault=Fault(kind=kind, retry_after=0.01, after_chunks=2, rpm=RPM))
    sid, main = fault_session(rt, provider, *[fault] * attempts, Turn(text="back again"))
    result = rt.prompt(sid, "hello").result(timeout=60)
    assert result.status == "error" and result.error
    assert len(requests_to(provider, main)) == attempts
    (error,) = events.wait_for(sid, "error")
    assert error.retryable and error.code.startswith("provider_")
    assert rt.prompt(sid, "again").result(timeout=30).text == "back again"
    assert [m.text for m in rt.messages(sid)] == ["hello", "again", "back again"]


def test_an_auth_fault_is_not_retried(runtime_with_events: tuple[Runtime, EventLog], provider: Any) -> None:
    rt, _ = runtime_with_events
    sid, main = fault_session(rt, provider, Turn(fault=Fault(kind="auth")), Turn(text="with a new key"))
    result = rt.prompt(sid, "hello").result(timeout=30)
    assert result.status == "error" and "401" in (result.error or "")
    assert len(requests_to(provider, main)) == 1
    assert rt.prompt(sid, "again").result(timeout=30).text == "with a new key"


def test_an_overflow_fault_compacts_once_and_retries(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any
) -> None:
    rt, events = runtime_with_events
    summarizer = add_script(provider, Turn(text=SUMMARY), loop=True)
    sid, main = fault_session(
        rt,
        provider,
        Turn(text="first answer " * 50),
        Turn(text="second answer " * 50),
        Turn(fault=Fault(kind="overflow")),
        Turn(text="after compacting"),
        **{"compaction.summarizer_model": f"openai/{summarizer}"},
    )
    for text in ("one", "two"):
        assert rt.prompt(sid, text).result(timeout=30).status == "ok"
    result = rt.prompt(sid, "three").result(timeout=30)
    assert result.status == "ok" and result.text == "after compacting"
    (end,) = events.wait_for(sid, "compaction_end")
    assert end.trigger == "overflow"
    assert [r.outcome for r in requests_to(provider, main)][-2:] == ["overflow", "ok"]


def test_overflow_on_every_retry_is_an_error_not_a_loop(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any
) -> None:
    rt, events = runtime_with_events
    summarizer = add_script(provider, Turn(text=SUMMARY), loop=True)
    overflow = Turn(fault=Fault(kind="overflow"))
    sid, main = fault_session(
        rt,
        provider,
        Turn(text="first answer " * 50),
        Turn(text="second answer " * 50),
        overflow,
        overflow,
        overflow,
        Turn(text="fine again"),
        **{"compaction.summarizer_model": f"openai/{summarizer}"},
    )
    for text in ("one", "two"):
        assert rt.prompt(sid, text).result(timeout=30).status == "ok"
    result = rt.prompt(sid, "three").result(timeout=30)
    assert result.status == "error" and result.error
    assert [r.outcome for r in requests_to(provider, main)][2:] == ["overflow", "overflow"]
    (error,) = events.wait_for(sid, "error")
    assert error.code == "context_overflow_after_compaction"
    # The next turn recovers on its own: the third overflow, one compaction, one retry.
    assert rt.prompt(sid, "four").result(timeout=30).text == "fine again"
    assert [r.outcome for r in requests_to(provider, main)][4:] == ["overflow", "ok"]


# -- the summarizer fails, hangs, or answers with nothing or far too much ------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param([Turn(fault=Fault(kind="auth"))], id="fails"),
        pytest.param([Turn(fault=Fault(kind="server_error"))] * 3, id="keeps-failing"),
        pytest.param([Turn(fault=Fault(kind="hang"))] * 3, id="hangs"),
        pytest.param([Turn(text="")], id="empty"),
        pytest.param([Turn(text="   \n\n  ")], id="blank"),
    ],
)
def test_a_summarizer_without_a_summary_falls_back(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any, answer: list[Turn]
) -> None:
    rt, events = runtime_with_events
    summarizer = add_script(provider, *answer)
    sid, _ = fault_session(
        rt,
        provider,
        *[Turn(text=f"answer {i} " * 40) for i in range(4)],
        **{"compaction.summarizer_model": f"openai/{summarizer}", "compaction.summarizer_timeout": 0.5},
    )
    for i in range(3):
        assert rt.prompt(sid, f"question {i}").result(timeout=30).status == "ok"
    result = rt.compact(sid).result(timeout=30)
    assert result.compacted, result.reason
    (end,) = events.wait_for(sid, "compaction_end")
    assert end.fallback and end.tokens_after < end.tokens_before
    (summary,) = [m for m in rt.messages(sid, view="model") if m.kind == "compaction_summary"]
    assert "[Compacted" in summary.text
    assert rt.prompt(sid, "go on").result(timeout=30).status == "ok"


def test_a_huge_summary_is_clipped(runtime_with_events: tuple[Runtime, EventLog], provider: Any) -> None:
    rt, _ = runtime_with_events
    huge = "## Goal\n" + "Remember everything. " * 20_000  # 400 kB of "summary"
    summarizer = add_script(provider, Turn(text=huge))
    sid, _ = fault_session(
        rt,
        provider,
        *[Turn(text=f"answer {i} " * 300) for i in range(4)],
        **{
            "compaction.summarizer_model": f"openai/{summarizer}",
            "compaction.summary_max_output_tokens": 256,  # the summary may have ~1,000 characters
        },
    )
    for i in range(3):
        assert rt.prompt(sid, f"question {i}").result(timeout=30).status == "ok"
    result = rt.compact(sid).result(timeout=60)
    assert result.compacted, result.reason
    (summary,) = [m for m in rt.messages(sid, view="model") if m.kind == "compaction_summary"]
    assert len(summary.text) < 3_000 and "Remember everything." in summary.text
    assert "characters of the summary (cut to fit the context; all of it is in" in summary.text  # says so
    assert rt.prompt(sid, "go on").result(timeout=30).status == "ok"


def test_a_summarizer_failure_with_fallback_off_is_reported_and_changes_nothing(
    runtime_with_events: tuple[Runtime, EventLog], provider: Any
) -> None:
    rt, events = runtime_with_events
    summarizer = add_script(provider, Turn(fault=Fault(kind="auth")))
    sid, _ = fault_session(
        rt,
        provider,
        *[Turn(text=f"answer {i} " * 40) for i in range(4)],
        **{"compaction.summarizer_model": f"openai/{summarizer}", "compaction.fallback": False},
    )
    for i in range(3):
        assert rt.prompt(sid, f"question {i}").result(timeout=30).status == "ok"
    before = rt.messages(sid, view="model")
    result = rt.compact(sid).result(timeout=30)
    assert not result.compacted and result.reason
    (failed,) = events.wait_for(sid, "compaction_failed")
    assert failed.reason == "summarizer_failed"
    assert rt.messages(sid, view="model") == before
    assert rt.prompt(sid, "go on").result(timeout=30).status == "ok"


# -- SIGKILL of the whole runtime mid-turn, then resume ----------------------------------------------------

CHILD = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from runtime import Runtime
from runtime.config import Config
from runtime.tools.registry import ToolRegistry

sessions_dir, url, tool_model, stream_model = sys.argv[2:6]
registry = ToolRegistry()

@registry.tool
def wait_here() -> str:
    \"\"\"Blocks forever.\"\"\"
    threading.Event().wait()
    return "never"

rt = Runtime(Config(), sessions_dir=sessions_dir).start()
mid_tool = threading.Event()
mid_stream = threading.Event()

def watch(event):
    if event.session_id == "mid-tool" and event.type == "tool_execution_start":
        mid_tool.set()
    if event.session_id == "mid-stream" and event.type == "request_start" and event.attempt == 1:
        mid_stream.set()

rt.subscribe("*", callback=watch)
for sid, model in (("mid-tool", tool_model), ("mid-stream", stream_model)):
    rt.start_session(sid, model=model, api_base=url, api_key="sk-local", tools=registry)
    assert rt.prompt(sid, "first").result(timeout=120).status == "ok"
    rt.prompt(sid, "second")
assert mid_tool.wait(60) and mid_stream.wait(60)
print("mid-turn", flush=True)
threading.Event().wait()
"""


@pytest.mark.slow  # child processes killed and resumed: seconds even on an idle machine
def test_sigkill_of_the_runtime_mid_turn_then_resume(sessions_dir: Path, provider: Any) -> None:
    resumed, later = Turn(text="resumed after the kill"), Turn(text="the next turn")
    tool_model = add_script(
        provider,
        Turn(text="first answer"),
        Turn(tool_calls=(ToolCallSpec(name="wait_here"),)),
        resumed,
        later,
    )
    stream_model = add_script(
        provider, Turn(text="first answer"), Turn(text="slow", latency=30.0), resumed, later
    )
    models = (f"openai/{tool_model}", f"openai/{stream_model}")
    child = subprocess.Popen(
        [*(sys.executable, "-c", CHILD, str(ROOT), str(sessions_dir)), provider.url, *models],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == b"mid-turn", child.stderr.read() if child.stderr else line
        wait_until(lambda: provider.remaining_turns(stream_model) == 2)  # the slow request is in flight
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        child.kill()
        child.communicate()

    directory = SessionDirectory(sessions_dir)
    assert directory.lock_path("mid-tool").exists()  # the dead runtime's locks are stale now
    events = EventLog()
    with Runtime(fast_config(), sessions_dir=sessions_dir) as rt:
        rt.subscribe("*", callback=events)
        for sid in ("mid-tool", "mid-stream"):
            rt.resume_session(sid, api_key="sk-local")  # takes the stale lock over
            taken_up = rt.resumed_turn(sid)  # the turn cut off goes on (design §3.12)
            assert taken_up is not None
            result = taken_up.result(timeout=30)
            assert result.status == "ok" and result.text == "resumed after the kill"
            texts = [m.text for m in rt.messages(sid)]
            assert texts[:3] == ["first", "first answer", "second"]  # everything acknowledged is there
            assert check_integrity(rt.messages(sid, view="model")).ok
            assert rt.prompt(sid, "third").result(timeout=30).text == "the next turn"
        # the call that was running is not run again: its outcome is unknown, and the model is told so
        (repaired,) = [m for m in rt.messages("mid-tool") if m.role == "tool"]
        assert repaired.is_error and repaired.metadata.get("outcome_unknown")
        assert events.wait_for("mid-tool", "agent_recovered")[0].repaired_calls == 1
    for sid in ("mid-tool", "mid-stream"):
        check = check_log(directory, sid, allow_torn=True)
        assert not check.problems
        assert not directory.lock_path(sid).exists()


# -- a full disk ------------------------------------------------------------------------------------------


class FullDisk:
    """Makes the log writer's writes fail with ENOSPC, after writing part of the data (as a real full
    disk can), while ``full`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from runtime.store import writer

        self.full = False
        self.failures = 0
        real = writer._write_all

        def write_all(fd: int, data: bytes) -> None:
            if not self.full:
                real(fd, data)
                return
            self.failures += 1
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(writer, "_write_all", write_all)


def test_a_full_disk_surfaces_as_events_and_loses_nothing_acknowledged(
    sessions_dir: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch)
    events = EventLog()
    main = add_script(provider, Turn(text="written"), Turn(text="written again"))
    with Runtime(fast_config(), sessions_dir=sessions_dir) as rt:
        sub = rt.subscribe("*", callback=events)
        sid = rt.start_session(model=f"openai/{main}", api_base=provider.url, api_key="sk-local")
        assert rt.prompt(sid, "before").result(timeout=30).status == "ok"
        events.wait_for(sid, "agent_end")
        acknowledged = {e.message_id for e in events.of(sid, "message_appended")}

        disk.full = True
        failed = rt.prompt(sid, "while the disk is full").result(timeout=30)
        assert failed.status == "error" and failed.error
        problems = events.wait_for(sid, "persistence_error", 2)
        assert all("No space left" in p.error for p in problems)
        failed_paths = {Path(p.path).name for p in problems}
        assert {f"{sid}.jsonl", f"{sid}.events.jsonl"} <= failed_paths  # the log and the transcript
        transcript_errors = [
            p for p in events.of(sid, "persistence_error") if p.path.endswith(".events.jsonl")
        ]
        assert len(transcript_errors) == 1  # once, not once per event
        events.wait_for(sid, "agent_recovered")
        disk.full = False

        result = rt.prompt(sid, "after").result(timeout=30)
        assert result.status == "ok", result.error
        assert sub.flush(timeout=10)  # the callback's thread has had the last turn's events
        assert [m.text for m in rt.messages(sid)] == ["before", "written", "after", "written again"]
        acknowledged |= {e.message_id for e in events.of(sid, "message_appended")}
    assert disk.failures
    check = check_log(SessionDirectory(sessions_dir), sid)
    assert not check.problems  # a half-written line was cut back: the log has no torn or broken line
    assert acknowledged <= message_ids(check.tree)
    assert "while the disk is full" not in [m.text for m in check.tree.messages()]
    transcript = read_transcript(SessionDirectory(sessions_dir).transcript_path(sid))
    seqs = [e.seq for e in transcript]  # events of the full-disk moment are missing, the rest in order
    assert seqs == sorted(set(seqs))
    last_run = events.of(sid, "agent_end")[-1]
    assert last_run in transcript  # ... and the transcript goes on after it


def test_a_compaction_on_a_full_disk_fails_cleanly_and_works_once_there_is_room(
    sessions_dir: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch)
    events = EventLog()
    summarizer = add_script(provider, Turn(text=SUMMARY), loop=True)
    main = add_script(provider, Turn(text="answer " * 100), loop=True)
    config = {"compaction.summarizer_model": f"openai/{summarizer}"}
    with Runtime(fast_config(), sessions_dir=sessions_dir) as rt:
        rt.subscribe("*", callback=events)
        sid = rt.start_session(
            model=f"openai/{main}", api_base=provider.url, api_key="sk-local", config=config
        )
        for i in range(3):
            assert rt.prompt(sid, f"question {i}").result(timeout=30).status == "ok"
        before = rt.messages(sid, view="model")

        disk.full = True
        result = rt.compact(sid).result(timeout=30)
        assert not result.compacted and result.reason
        expected = {"compaction-1-input.md", "compaction-1-summary.md", f"{sid}.jsonl"}
        failed: set[str] = set()
        for count in range(3, 6):  # the transcript's failed write may be reported among them, in any order
            failed = {Path(p.path).name for p in events.wait_for(sid, "persistence_error", count)}
            if expected <= failed:
                break
        assert expected <= failed
        events.wait_for(sid, "agent_recovered")  # the store rebuilt itself from what is on disk
        assert rt.messages(sid, view="model") == before  # nothing half-compacted
        disk.full = False

        assert rt.compact(sid).result(timeout=30).compacted
        assert rt.prompt(sid, "after").result(timeout=30).status == "ok"
    check = check_log(SessionDirectory(sessions_dir), sid)
    assert not check.problems and check.tree.compaction_count == 1
