"""The usage tracker actor (design §4.1, 4.4, 4.6): totals, last prompt size, calibration, usage events."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors.usage_tracker import (
    Calibration,
    GetCalibration,
    GetTotals,
    RecordResponse,
    Reset,
    Restore,
    SetModel,
    UsageTracker,
)
from runtime import events as ev
from runtime.config import Config
from runtime.context.estimate import context_stats, estimate_context
from runtime.messages import Message, StopReason, Usage, assistant, tool_result, user
from runtime.tokens import TokenCounter

WINDOWS = {"test-model": 100_000, "small-model": 16_000}
OUTPUTS = {"test-model": 8_000, "small-model": 2_000}


def make_config(**tokens: Any) -> Config:
    return Config().with_overrides(
        {"models": {"context_windows": WINDOWS, "max_output_tokens": OUTPUTS}, "tokens": tokens}
    )


class Recorder:
    """A thread-safe publish callback."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: type[ev.Event]) -> list[Any]:
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def published() -> Recorder:
    return Recorder()


@pytest.fixture
def start(published: Recorder) -> Iterator[Any]:
    refs: list[pykka.ActorRef[Any]] = []

    def starter(config: Config | None = None, **kw: Any) -> pykka.ActorRef[Any]:
        ref = UsageTracker.start("s1", "test-model", config or make_config(), published, **kw)
        refs.append(ref)
        return ref

    yield starter
    for ref in refs:
        ref.stop()


def reply(usage: Usage, stop: StopReason = "stop") -> Message:
    return assistant("answer", usage=usage, stop_reason=stop)


def test_totals_accumulate_every_kind_of_usage(start: Any, published: Recorder) -> None:
    ref = start()
    first = Usage(input_tokens=1_000, output_tokens=50, reasoning_tokens=20, cache_read_tokens=800, cost=0.01)
    second = Usage(input_tokens=1_200, output_tokens=70, cache_write_tokens=300, cost=0.02)
    ref.ask(RecordResponse(reply(first)))
    ref.ask(RecordResponse(reply(second)))
    totals = ref.proxy().totals().get()
    assert totals.input_tokens == 2_200
    assert totals.output_tokens == 120
    assert totals.reasoning_tokens == 20
    assert totals.cache_read_tokens == 800
    assert totals.cache_write_tokens == 300
    assert totals.cost == pytest.approx(0.03)


def test_current_context_is_the_last_prompt_not_the_total(start: Any) -> None:
    ref = start()
    proxy = ref.proxy()
    assert proxy.current_context_tokens().get() == 0
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_000, output_tokens=50))))
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_400, output_tokens=60))))
    assert proxy.current_context_tokens().get() == 1_400
    assert proxy.totals().get().input_tokens == 2_400


@pytest.mark.parametrize("stop", ["aborted", "error"])
def test_failed_responses_count_in_totals_but_not_as_context(start: Any, stop: StopReason) -> None:
    ref = start()
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_000, output_tokens=50))))
    ref.ask(
        RecordResponse(reply(Usage(input_tokens=5_000, output_tokens=5), stop=stop), estimated_input=1_100)
    )
    proxy = ref.proxy()
    assert proxy.totals().get().input_tokens == 6_000
    assert proxy.current_context_tokens().get() == 1_000
    assert proxy.calibration_error().get() is None


def test_usage_update_events_carry_window_and_context(start: Any, published: Recorder) -> None:
    ref = start()
    usage = Usage(input_tokens=1_000, output_tokens=50)
    ref.ask(RecordResponse(reply(usage)))
    (update,) = published.of(ev.UsageUpdate)
    assert update.session_id == "s1"
    assert update.usage == usage
    assert update.totals == usage
    assert update.context_window == 100_000
    assert update.context_tokens == 1_000
    assert not update.estimated


def test_a_message_without_usage_changes_nothing(start: Any, published: Recorder) -> None:
    ref = start()
    ref.ask(RecordResponse(assistant("no usage reported")))
    assert ref.proxy().totals().get() == Usage()
    assert published.events == []


def test_calibration_after_every_call(start: Any, published: Recorder) -> None:
    ref = start()
    proxy = ref.proxy()
    assert proxy.calibration_ratio().get() is None
    assert ref.ask(GetCalibration()) == Calibration(ratio=None, last_error=None)
    # First call: the estimate was a full count (1,100), the prompt was 1,000 tokens.
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_000, output_tokens=50)), estimated_input=1_100))
    assert proxy.calibration_error().get() == pytest.approx(0.1)
    assert proxy.calibration_ratio().get() == pytest.approx(1_000 / 1_100)
    # Second call: estimate = 1,000 + 50 (actual) + 100 counted; the prompt was 1,120, so the counted
    # part (100) turned out to be 70 tokens.
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_120, output_tokens=30)), estimated_input=1_150))
    assert proxy.calibration_error().get() == pytest.approx(30 / 1_120)
    assert proxy.calibration_ratio().get() == pytest.approx((1_000 + 70) / (1_100 + 100))
    asked = ref.ask(GetCalibration())  # what Runtime.context_stats asks
    assert asked.ratio == pytest.approx(1_070 / 1_200) and asked.last_error == pytest.approx(30 / 1_120)
    assert ref.ask(GetTotals()) == Usage(input_tokens=2_120, output_tokens=80)
    first, second = published.of(ev.Calibration)
    assert (first.estimated_tokens, first.actual_tokens) == (1_100, 1_000)
    assert first.error == pytest.approx(0.1)
    assert second.ratio == pytest.approx(1_070 / 1_200)


def test_calibration_is_logged(start: Any, caplog: pytest.LogCaptureFixture) -> None:
    ref = start()
    with caplog.at_level("INFO", logger="agentcell.usage"):
        ref.ask(RecordResponse(reply(Usage(input_tokens=1_000, output_tokens=50)), estimated_input=1_100))
    assert "estimate 1100, actual 1000, error +100 (+10.0%)" in caplog.text


def test_calibration_is_applied_to_heuristic_counts_when_enabled(start: Any) -> None:
    config = make_config(exact=False, apply_calibration=True)
    counter = TokenCounter("test-model", config.tokens)
    ref = start(config, counter=counter)
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_500, output_tokens=50)), estimated_input=1_000))
    assert counter.calibration == pytest.approx(1.5)
    # The next sample is measured against the raw count (the estimate was made with the factor on):
    # counted 300 with the factor = 200 raw, which turned out to be 300 actual tokens.
    ref.ask(RecordResponse(reply(Usage(input_tokens=1_850, output_tokens=10)), estimated_input=1_850))
    assert ref.proxy().calibration_ratio().get() == pytest.approx((1_500 + 300) / (1_000 + 200))


def test_reset_after_compaction(start: Any, published: Recorder) -> None:
    ref = start()
    ref.ask(RecordResponse(reply(Usage(input_tokens=80_000, output_tokens=500))))
    ref.ask(Reset(context_tokens=12_000))
    assert ref.proxy().current_context_tokens().get() == 12_000
    update = published.of(ev.UsageUpdate)[-1]
    assert (update.context_tokens, update.estimated) == (12_000, True)
    # The next estimate is a full count again: all of it is compared with the actual prompt.
    ref.ask(RecordResponse(reply(Usage(input_tokens=13_000, output_tokens=100)), estimated_input=12_000))
    assert ref.proxy().calibration_ratio().get() == pytest.approx(13_000 / 12_000)


def test_set_model_changes_the_window(start: Any, published: Recorder) -> None:
    ref = start()
    ref.ask(SetModel("small-model"))
    proxy = ref.proxy()
    assert proxy.context_window().get() == 16_000
    assert proxy.model_info().get().max_output_tokens == 2_000
    assert proxy.counter().get().model == "small-model"
    assert published.of(ev.UsageUpdate)[-1].context_window == 16_000
    ref.ask(SetModel("test-model", context_window=50_000))
    assert proxy.context_window().get() == 50_000


def test_restore_rebuilds_totals_from_messages(start: Any) -> None:
    ref = start()
    history = (
        user("a"),
        reply(Usage(input_tokens=1_000, output_tokens=10, cost=0.5)),
        user("b"),
        reply(Usage(input_tokens=2_000, output_tokens=20, cost=0.25)),
        reply(Usage(input_tokens=3_000, output_tokens=1), stop="aborted"),
    )
    ref.ask(Restore(history))
    proxy = ref.proxy()
    assert proxy.totals().get() == Usage(input_tokens=6_000, output_tokens=31, cost=0.75)
    assert proxy.current_context_tokens().get() == 2_000
    # The anchor of the next estimate is unknown after a restore: no calibration sample is taken.
    ref.ask(RecordResponse(reply(Usage(input_tokens=2_100, output_tokens=5)), estimated_input=2_050))
    assert proxy.calibration_ratio().get() is None
    assert proxy.calibration_error().get() == pytest.approx(-50 / 2_100)


def test_restore_takes_the_logs_spend_as_the_totals_and_the_view_for_the_prompt_size(start: Any) -> None:
    """design §4.1: the model's view after a compaction no longer holds what was paid before it; the totals are
    the log's record (``spent``), the last prompt size the view's newest usable response."""
    ref = start()
    spent = Usage(input_tokens=9_000, output_tokens=90, cost=1.5)
    ref.ask(Restore((user("a"), reply(Usage(input_tokens=2_000, output_tokens=20))), spent))
    proxy = ref.proxy()
    assert proxy.totals().get() == spent
    assert proxy.current_context_tokens().get() == 2_000


def test_a_restoring_tracker_answers_queries_with_the_restored_totals_not_zeros(start: Any) -> None:
    """A tracker started for a session with a history (a resume, a wake, a restart) answers ``usage()`` only
    once the agent's recovery told it the log's totals: before, the first answer after a resume was zeros."""
    ref = start(restoring=True)
    totals = ref.ask(GetTotals(), block=False)
    calibration = ref.ask(GetCalibration(), block=False)
    with pytest.raises(pykka.Timeout):
        totals.get(timeout=0.2)
    spent = Usage(input_tokens=4_000, output_tokens=40)
    ref.tell(Restore((), spent))
    assert totals.get(timeout=5) == spent
    assert calibration.get(timeout=5) == Calibration(ratio=None, last_error=None)
    assert ref.ask(GetTotals(), timeout=5) == spent  # at once from now on


def test_a_restore_that_could_not_read_the_log_releases_the_queries_and_keeps_the_totals(start: Any) -> None:
    ref = start(restoring=True)
    waiting = ref.ask(GetTotals(), block=False)
    ref.tell(Restore((), None, read=False))
    assert waiting.get(timeout=5) == Usage()
    ref.ask(RecordResponse(reply(Usage(input_tokens=10, output_tokens=1))))
    ref.tell(Restore((), None, read=False))  # not restoring any more: changes nothing
    assert ref.ask(GetTotals(), timeout=5) == Usage(input_tokens=10, output_tokens=1)


def test_estimate_and_stats_use_the_shared_formula(start: Any) -> None:
    config = make_config()
    counter = TokenCounter("test-model", config.tokens)
    ref = start(config, counter=counter)
    tools = [{"type": "function", "function": {"name": "now", "description": "Current time"}}]
    history = [
        user("hello world"),
        reply(Usage(input_tokens=900, output_tokens=40)),
        tool_result("c", "t", "ok"),
    ]
    proxy = ref.proxy()
    est = proxy.estimate(history, 0, "Be brief.", tools).get()
    expected = estimate_context(
        history,
        count=counter.count_message,
        system_tokens=counter.count_system("Be brief."),
        tools_tokens=counter.count_tools(tools),
    )
    assert est == expected
    assert est.tokens == 900 + 40 + counter.count_message(history[-1])
    s = proxy.stats(history, 0, "Be brief.", tools).get()
    assert s == context_stats(
        history,
        count=counter.count_message,
        system_tokens=counter.count_system("Be brief."),
        tools_tokens=counter.count_tools(tools),
        window=100_000,
        config=config.compaction,
    )
    assert s.total == est.tokens


def test_unexpected_messages_are_rejected(start: Any) -> None:
    ref = start()
    with pytest.raises(TypeError, match="unexpected message"):
        ref.ask("hello")
