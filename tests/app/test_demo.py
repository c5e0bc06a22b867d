"""``agentcell demo``: offline sessions that really compact at the threshold and recover from an overflow."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime import events as ev
from runtime.apps import demo
from runtime.apps.demo import DemoMonitor, SessionView, run_demo


def test_demo_shows_threshold_compaction_and_overflow_recovery(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the demo's temporary folder goes here
    out = io.StringIO()  # not a terminal: the demo prints plain lines even without plain=True

    assert run_demo(sessions=2, window=6_000, plain=False, out=out) == 0

    text = out.getvalue()
    assert capsys.readouterr().err == ""
    # The event stream, per session: prompts, tool calls, replies.
    assert "[demo-1] > List the directory so we know what the project holds." in text
    assert re.search(r"\[demo-1\] tool read_file\(\{\"path\": \"inventory.py\"\}\)", text)
    assert re.search(r"\[demo-2\] tool edit_file ok", text)
    assert "[demo-1] assistant: Here is what I did" in text
    # The steady session compacts at its threshold; the overflow session overflows, compacts, retries.
    assert re.search(r"\[demo-1\] COMPACTED \(threshold\): [\d,]+ -> [\d,]+ tokens", text)
    overflow = text.index("[demo-2] OVERFLOW: the provider refused")
    compacted = text.index("[demo-2] COMPACTED (overflow)", overflow)
    assert "[demo-2] turn ok" in text[compacted:]
    assert "[demo-2] ERROR" not in text
    # One delegation: a lead session hands a task to a sub-agent and reports its answer.
    assert "[demo-lead] > Delegate to a sub-agent" in text
    assert re.search(r"\[demo-lead\] sub-agent \w+: its own session, [1-9]\d* model calls?", text)
    assert (
        "[demo-lead] assistant: The sub-agent reported: Here is what I did: - I read `inventory.py`" in text
    )
    # The closing table: one row per session with its turns and a context bar.
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("demo-")}
    assert set(rows) == {"demo-1", "demo-2", "demo-lead"}  # the lead is in the table too
    assert re.match(r"demo-lead\s+lead\s+1\s+", rows["demo-lead"])
    turns = len(demo.TASK)
    assert re.match(
        rf"demo-1\s+steady\s+{turns}\s+\d+\s+[\d,]+\s+[\d,]+\s+\d+ threshold\s+\[[#.]{{20}}\]", rows["demo-1"]
    )
    assert re.match(rf"demo-2\s+overflow\s+{turns}\s.*\d+ overflow\s+\[", rows["demo-2"])
    assert re.search(r"threshold compactions?, [1-9]\d* overflow recover(y|ies), ", text)
    assert re.search(rf"\n3 sessions, {2 * turns + 1} turns in [\d.]+ s: [\d.]+ turns/s\n", text)
    # The header says what the provider is and names the sessions as they are.
    assert (
        "its replies are scripted (a policy reads and edits the files a prompt names), not a model's" in text
    )
    assert "  demo-1: told the real window, it compacts at the threshold" in text
    assert "demo-1..demo-1" not in text
    # the temporary workspaces and sessions are removed (the runtime's CPU lock files may stay: they are shared)
    assert list(tmp_path.glob("agentcell-demo-*")) == []


def test_demo_fails_when_it_shows_no_compaction(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "TASK", demo.TASK[:1])  # one short turn: nothing fills the window
    monkeypatch.setattr(demo, "MAX_PROMPTS", 1)
    assert run_demo(sessions=2, window=6_000, plain=True, out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "no automatic compaction at the threshold happened" in err
    assert "no overflow was recovered" in err


def test_demo_refuses_settings_that_cannot_show_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(sessions=1, window=6_000, plain=True, out=io.StringIO()) == 2
    assert "--sessions must be at least 2" in capsys.readouterr().err
    assert run_demo(sessions=2, window=500, plain=True, out=io.StringIO()) == 2
    assert "--window must be 4,000 to 16,000 tokens" in capsys.readouterr().err


def _view() -> tuple[DemoMonitor, SessionView]:
    view = SessionView(session_id="s", role="overflow", told_window=12_000)
    return DemoMonitor({"s": view}), view


def _overflow_turn(monitor: DemoMonitor, status: str) -> None:
    monitor(ev.AgentStart(session_id="s", turn_id="t"))
    monitor(ev.CompactionStart(session_id="s", trigger="overflow", messages_before=20, tokens_before=6_400))
    monitor(
        ev.CompactionEnd(
            session_id="s",
            trigger="overflow",
            messages_before=20,
            messages_after=5,
            tokens_before=6_400,
            tokens_after=2_000,
            summary_chars=900,
            mode="summarize",
        )
    )
    monitor(ev.AgentEnd(session_id="s", turn_id="t", status=status))  # type: ignore[arg-type]


def test_an_overflow_counts_as_recovered_only_when_the_retried_turn_succeeds() -> None:
    monitor, view = _view()
    _overflow_turn(monitor, "error")
    assert (view.overflow_compactions, view.recoveries) == (1, 0)
    _overflow_turn(monitor, "ok")
    assert (view.overflow_compactions, view.recoveries, view.turns) == (2, 1, 2)
    monitor(ev.AgentStart(session_id="s", turn_id="u"))
    monitor(ev.AgentEnd(session_id="s", turn_id="u", status="ok"))
    assert view.recoveries == 1  # a later good turn without an overflow is not a recovery


def test_prompts_are_shown_when_their_turn_starts() -> None:
    lines: list[str] = []
    view = SessionView(session_id="s", role="steady", told_window=6_000)
    monitor = DemoMonitor({"s": view}, emit=lambda sid, line: lines.append(line))
    monitor.sending("s", "first")
    monitor.sending("s", "second")
    monitor(ev.AgentStart(session_id="s", turn_id="a"))
    monitor(ev.TextDelta(session_id="s", turn_id="a", delta="Hello "))
    monitor(ev.TextDelta(session_id="s", turn_id="a", delta="there."))
    monitor(ev.TurnEnd(session_id="s", turn_id="a", stop_reason="stop"))
    monitor(ev.AgentStart(session_id="s", turn_id="b"))
    assert lines == ["> first", "assistant: Hello there.", "> second"]


def test_the_closing_line_counts_in_real_plurals() -> None:
    def outcome(compactions: int, recoveries: int) -> demo.DemoOutcome:
        view = SessionView(session_id="s", role="steady", told_window=6_000)
        view.threshold_compactions, view.recoveries = compactions, recoveries
        return demo.DemoOutcome(views=[view], seconds=12.34)

    assert demo.verdict(outcome(1, 1)) == "1 threshold compaction, 1 overflow recovery, 12.3 s"
    assert demo.verdict(outcome(2, 3)) == "2 threshold compactions, 3 overflow recoveries, 12.3 s"


def test_one_message_is_one_message() -> None:
    end = ev.CompactionEnd(
        session_id="s",
        trigger="threshold",
        messages_before=9,
        messages_after=1,
        tokens_before=5_000,
        tokens_after=900,
        summary_chars=1_200,
        mode="summarize",
    )
    assert (
        demo.describe(end)
        == "COMPACTED (threshold): 5,000 -> 900 tokens, 1 message now, summary of 1,200 chars"
    )


class _FailingRuntime:
    """A runtime whose one turn fails: its error event and its end reach the monitor, then the handle."""

    def __init__(self, monitor: DemoMonitor) -> None:
        self.monitor = monitor

    def prompt(self, sid: str, text: str) -> Any:
        self.monitor(ev.AgentStart(session_id=sid, turn_id="t"))
        self.monitor(ev.ErrorOccurred(session_id=sid, turn_id="t", code="provider_error", message="boom"))
        self.monitor(ev.AgentEnd(session_id=sid, turn_id="t", status="error"))
        failed = SimpleNamespace(status="error", text="", error="boom")
        return SimpleNamespace(result=lambda timeout: failed)


def test_one_failed_turn_is_one_failure() -> None:
    monitor, view = _view()
    sent = {"s": 0}
    demo._drive(_FailingRuntime(monitor), monitor, "s", sent)
    assert view.failures == ["boom"]  # its error, once; not also "stopped: turn 1 ended error"
    outcome = demo.DemoOutcome(views=[view], seconds=2.0)
    assert [p for p in outcome.problems if p.startswith("s:")] == ["s: boom"]
    assert demo.throughput(outcome) == "1 session, 1 turn in 2.0 s: 0.5 turns/s"


class _LateEventsRuntime:
    """A runtime whose turn events reach the monitor on another thread a moment after the turn's handle
    resolves, as a subscription's do on a loaded machine; the last turn of the task compacts."""

    def __init__(self, monitor: DemoMonitor) -> None:
        self.monitor = monitor
        self.prompts = 0

    def prompt(self, sid: str, text: str) -> Any:
        self.prompts += 1
        events: list[ev.Event] = [ev.AgentStart(session_id=sid, turn_id=f"t{self.prompts}")]
        if self.prompts == len(demo.TASK):
            events.append(
                ev.CompactionEnd(
                    session_id=sid,
                    trigger="threshold",
                    messages_before=30,
                    messages_after=10,
                    tokens_before=4_500,
                    tokens_after=2_400,
                    summary_chars=1_000,
                    mode="summarize",
                )
            )
        events.append(ev.AgentEnd(session_id=sid, turn_id=f"t{self.prompts}", status="ok"))

        def result(timeout: float) -> Any:
            deliver = threading.Timer(0.05, lambda: [self.monitor(e) for e in events])
            deliver.start()
            return SimpleNamespace(status="ok", text="done", error=None)

        return SimpleNamespace(result=result)


def test_the_demo_decides_on_another_prompt_from_the_last_turns_events() -> None:
    """A session that compacted in the task's last turn is done: the demo sends no prompt more for want of
    that turn's events, which come after its handle resolved (the table's turns would be one too many)."""
    view = SessionView(session_id="s", role="steady", told_window=6_000)
    monitor = DemoMonitor({"s": view})
    rt = _LateEventsRuntime(monitor)
    sent = {"s": 0}
    demo._drive(rt, monitor, "s", sent)
    assert rt.prompts == sent["s"] == len(demo.TASK)
    assert monitor.wait_for_turns({"s": len(demo.TASK)}, timeout=10) and view.threshold_compactions == 1


@pytest.mark.slow  # an agentcell demo process: seconds even on an idle machine
def test_demo_serve_stopped_by_sigterm_cleans_up_and_has_printed_its_summary(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-m", "runtime.apps.cli", "demo", "--serve", "--port", "0", "--plain"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "the demo is done" in line:
                break
        text = "".join(seen)
        assert re.search(r"^demo-lead\s+lead\s", text, re.MULTILINE), text  # the table came first
        assert list(tmp_path.glob("agentcell-demo-*")), "the demo's folder exists while it serves"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(tmp_path.glob("agentcell-demo-*")) == []  # the temporary workspaces and sessions are removed
