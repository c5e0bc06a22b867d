"""``agentcell demo``: offline sessions that really compact at the threshold and recover from an overflow."""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path

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
    assert re.search(r"\[demo-lead\] sub-agent \w+: its own session, [1-9]\d* model calls", text)
    assert "[demo-lead] The sub-agent reported: Here is what I did: - I read `inventory.py`" in text
    # The closing table: one row per session with its turns and a context bar.
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("demo-")}
    assert set(rows) == {"demo-1", "demo-2"}
    turns = len(demo.TASK)
    assert re.match(
        rf"demo-1\s+steady\s+{turns}\s+\d+\s+[\d,]+\s+[\d,]+\s+\d+ threshold\s+\[[#.]{{20}}\]", rows["demo-1"]
    )
    assert re.match(rf"demo-2\s+overflow\s+{turns}\s.*\d+ overflow\s+\[", rows["demo-2"])
    assert re.search(r"threshold compactions?, [1-9]\d* overflow recover(y|ies), ", text)
    assert list(tmp_path.iterdir()) == []  # the temporary workspaces and sessions are removed


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

    assert demo._verdict(outcome(1, 1)) == "1 threshold compaction, 1 overflow recovery, 12.3 s"
    assert demo._verdict(outcome(2, 3)) == "2 threshold compactions, 3 overflow recoveries, 12.3 s"
