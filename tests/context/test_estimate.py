"""The context estimate (design §4.2), the compaction trigger (5.1) and the context breakdown (4.6)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import CompactionConfig
from runtime.context.estimate import (
    ACTUAL,
    ACTUAL_PLUS_ESTIMATE,
    BACK_CALCULATED,
    BASIS_FULL,
    BASIS_LAST_RESPONSE,
    ESTIMATED,
    ContextEstimate,
    ContextStats,
    compaction_threshold,
    context_stats,
    effective_limit,
    estimate_context,
    reserve_tokens,
    should_compact,
)
from runtime.messages import Message, StopReason, Usage, assistant, tool_result, user
from runtime.tokens import TokenCounter

SYSTEM, TOOLS = 700, 300


def count(msg: Message) -> int:
    """A simple, predictable count: 10 per message plus one per character."""
    return 10 + len(msg.text)


def reply(text: str, input_tokens: int, output_tokens: int, stop: StopReason | None = "stop") -> Message:
    return assistant(
        text, usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens), stop_reason=stop
    )


def estimate(messages: Sequence[Message], usage_floor: int = 0) -> ContextEstimate:
    return estimate_context(
        messages, count=count, system_tokens=SYSTEM, tools_tokens=TOOLS, usage_floor=usage_floor
    )


# -- the formula ------------------------------------------------------------------------------------------


def test_no_response_yet_is_a_full_estimate() -> None:
    history = [user("hello"), user("are you there?")]
    est = estimate(history)
    assert est == ContextEstimate(
        tokens=SYSTEM + TOOLS + (10 + 5) + (10 + 14), estimated=True, new_messages_tokens=39, basis=BASIS_FULL
    )
    assert estimate([]).tokens == SYSTEM + TOOLS


def test_last_input_plus_last_output_plus_new_messages() -> None:
    history = [
        user("What's the weather in NYC?"),
        reply("checking", 5_000, 100, stop="tool_calls"),
        tool_result("c1", "weather", "NYC: 72F, sunny"),
    ]
    est = estimate(history)
    assert est == ContextEstimate(
        tokens=5_000 + 100 + (10 + 15),
        estimated=False,
        last_input_tokens=5_000,
        last_output_tokens=100,
        new_messages_tokens=25,
        basis=BASIS_LAST_RESPONSE,
    )


def test_the_newest_usable_response_is_the_anchor() -> None:
    history = [user("a"), reply("b", 1_000, 10), user("c"), reply("d", 2_000, 20), user("e")]
    assert estimate(history).tokens == 2_000 + 20 + 11


@pytest.mark.parametrize("stop", ["aborted", "error"])
def test_aborted_and_failed_responses_are_ignored(stop: StopReason) -> None:
    history = [user("a"), reply("b", 1_000, 10), user("c"), reply("partial", 9_999, 99, stop=stop)]
    # The failed response's usage is ignored; its text is in the context, so it is counted.
    assert estimate(history).tokens == 1_000 + 10 + (10 + 1) + (10 + 7)
    only_failed = [user("a"), reply("partial", 9_999, 99, stop=stop)]
    assert estimate(only_failed).estimated


def test_a_response_without_input_tokens_is_not_usable() -> None:
    history = [user("a"), reply("b", 0, 10)]
    assert estimate(history).basis == BASIS_FULL


def test_usage_from_before_the_latest_compaction_is_ignored() -> None:
    summary = user("[summary of 500 messages]", kind="compaction_summary")
    kept = [user("recent question"), reply("recent answer", 90_000, 500)]
    context = [summary, *kept, user("next")]
    # Right after compaction (the floor is past the kept messages): a full estimate.
    after = estimate(context, usage_floor=3)
    assert after.estimated
    assert after.tokens == SYSTEM + TOOLS + sum(count(m) for m in context)
    # Once a response arrives after the compaction, it anchors the estimate.
    context += [reply("fresh", 3_000, 40), user("more")]
    assert estimate(context, usage_floor=3).tokens == 3_000 + 40 + 14


def test_hidden_messages_are_not_counted() -> None:
    archived = tool_result("c1", "grep", "x" * 1_000, agent_visible=False, kind="tool_result_archived")
    assert estimate([user("a"), archived]).tokens == estimate([user("a")]).tokens
    anchored = [user("a"), reply("b", 100, 5), archived, user("c")]
    assert estimate(anchored).tokens == 100 + 5 + 11


def test_only_messages_after_the_response_are_counted() -> None:
    counted: list[str] = []

    def spy(msg: Message) -> int:
        counted.append(msg.text)
        return count(msg)

    history = [user(f"old {i}") for i in range(1_000)] + [reply("answer", 50_000, 200), user("new")]
    estimate_context(history, count=spy, system_tokens=SYSTEM, tools_tokens=TOOLS)
    assert counted == ["new"]


# -- the trigger ------------------------------------------------------------------------------------------


def test_effective_limit_and_threshold() -> None:
    config = CompactionConfig()  # reserve 16,384 (at most an eighth of the window), threshold 0.8
    assert effective_limit(200_000, config) == 200_000 - 16_384
    assert compaction_threshold(200_000, config) == int(0.8 * (200_000 - 16_384))
    # No window: the configured max tokens, or no token limit at all.
    assert effective_limit(None, config) is None
    assert effective_limit(None, CompactionConfig(max_tokens=50_000)) == 50_000
    # max_tokens also caps a known window's limit.
    assert effective_limit(200_000, CompactionConfig(max_tokens=50_000)) == 50_000
    # A window smaller than twice a configured reserve keeps at least half of itself.
    assert effective_limit(8_192, CompactionConfig(reserve_tokens=16_384)) == 4_096


def test_the_automatic_reserve_is_an_eighth_of_a_small_window_so_it_compacts_late_enough() -> None:
    """design §5.1: 16,384 tokens for an answer, at most an eighth of the window, at least 1,024 (at most
    half the window). A 32,000-token window compacts at 22,400 tokens (it compacted at 12,800 with half of
    itself reserved); a tiny one keeps the reserve it had; a configured reserve is taken as it is, at most
    half the window."""
    auto = CompactionConfig()
    assert reserve_tokens(200_000, auto) == 16_384
    assert reserve_tokens(128_000, auto) == 16_000
    assert reserve_tokens(32_000, auto) == 4_000
    assert compaction_threshold(32_000, auto) == 22_400
    assert reserve_tokens(8_000, auto) == 1_024
    assert reserve_tokens(2_048, auto) == 1_024  # llama.cpp's small default slot: as before
    assert reserve_tokens(1_024, auto) == 512
    assert reserve_tokens(32_000, CompactionConfig(reserve_tokens=16_384)) == 16_000
    assert reserve_tokens(200_000, CompactionConfig(reserve_tokens=16_384)) == 16_384
    assert reserve_tokens(32_000, CompactionConfig(reserve_tokens=0)) == 0


@pytest.mark.parametrize(
    ("window", "reserve"),
    [
        (16_384, 2_048),  # an eighth of the window
        (8_200, 1_025),  # just over the floor: an eighth
        (8_192, 1_024),  # an eighth is the floor itself
        (8_191, 1_024),  # under it: the floor, 1,024
        (2_049, 1_024),  # the floor is at most half the window: 1,024 still fits
        (2_047, 1_023),  # ... and here it is half the window, rounded down
        (33_003, 4_125),  # whole tokens: 33,003 / 8 = 4,125.375
        (131_072, 16_384),  # the automatic reserve reached
        (131_080, 16_384),  # ... and never more: an eighth would be 16,385
    ],
)
def test_the_automatic_reserve_at_its_boundaries(window: int, reserve: int) -> None:
    """The automatic reserve is a whole number of tokens: 16,384, at most an eighth of the window, at least
    1,024, never over half the window; the compaction limit is the window less it."""
    auto = CompactionConfig()
    got = reserve_tokens(window, auto)
    assert got == reserve and isinstance(got, int)
    limit = effective_limit(window, auto)
    assert limit == window - reserve and isinstance(limit, int)


def test_should_compact_at_the_threshold() -> None:
    config = CompactionConfig()
    threshold = compaction_threshold(128_000, config)
    assert threshold is not None
    assert should_compact(threshold, 128_000, config)
    assert not should_compact(threshold - 1, 128_000, config)
    assert should_compact(ContextEstimate(tokens=threshold, estimated=True), 128_000, config)
    assert not should_compact(10**9, 128_000, CompactionConfig(auto=False))
    assert not should_compact(10**9, None, config)  # no window and no max tokens: no token trigger


def test_message_count_trigger() -> None:
    config = CompactionConfig(max_messages=100)
    assert not should_compact(10, 128_000, config, message_count=99)
    assert should_compact(10, 128_000, config, message_count=100)
    assert not should_compact(10, 128_000, CompactionConfig(), message_count=10**6)  # off by default


# -- the breakdown ------------------------------------------------------------------------------------------


def stats(
    messages: Sequence[Message], *, last_error: float | None = None, calibration_ratio: float | None = None
) -> ContextStats:
    return context_stats(
        messages,
        count=count,
        system_tokens=SYSTEM,
        tools_tokens=TOOLS,
        window=200_000,
        config=CompactionConfig(),
        last_error=last_error,
        calibration_ratio=calibration_ratio,
    )


def test_stats_back_calculate_messages_from_the_actual_total() -> None:
    history = [user("a"), reply("b", 50_000, 2_000), user("hello there")]
    s = stats(history, last_error=0.006, calibration_ratio=0.98)
    total = 50_000 + 2_000 + 21
    assert s.total == total and not s.estimated
    assert (s.system_prompt, s.tools) == (SYSTEM, TOOLS)
    assert s.messages == total - SYSTEM - TOOLS and not s.messages_floored
    assert (s.last_input_tokens, s.last_output_tokens, s.new_messages_tokens) == (50_000, 2_000, 21)
    assert s.reserve == 16_384
    assert s.limit == 200_000 - 16_384
    assert s.free == 200_000 - total - 16_384
    assert s.compaction_threshold == compaction_threshold(200_000, CompactionConfig())
    assert not s.will_compact
    assert s.percent == pytest.approx(100 * total / 200_000)
    assert (s.last_estimate_error, s.calibration_ratio) == (0.006, 0.98)
    assert s.sources["total"] == ACTUAL_PLUS_ESTIMATE
    assert s.sources["system_prompt"] == s.sources["tools"] == ESTIMATED
    assert s.sources["messages"] == BACK_CALCULATED
    assert s.sources["last_input_tokens"] == ACTUAL


def test_stats_total_is_actual_when_nothing_is_new() -> None:
    s = stats([user("a"), reply("b", 1_000, 10)])
    assert s.sources["total"] == ACTUAL and s.total == 1_010


def test_stats_floor_messages_at_zero_when_the_estimates_overshoot() -> None:
    s = stats([user("a"), reply("b", 600, 10)])  # the actual total is below system + tools estimates
    assert s.total == 610
    assert s.messages == 0 and s.messages_floored


def test_stats_without_a_response_are_estimated() -> None:
    history = [user("hello"), user("world")]
    s = stats(history)
    assert s.estimated and s.sources["total"] == ESTIMATED and s.sources["messages"] == ESTIMATED
    assert s.messages == 15 + 15
    assert s.last_input_tokens is None


def test_stats_report_when_compaction_is_due() -> None:
    s = stats([user("a"), reply("b", 190_000, 10)])
    assert s.will_compact and s.free == 0


def test_stats_with_a_real_token_counter() -> None:
    counter = TokenCounter("gpt-4o")
    history = [user("hello world"), reply("hi", 1_000, 5), user("hello world")]
    s = context_stats(
        history,
        count=counter.count_message,
        system_tokens=counter.count_system("Be brief."),
        tools_tokens=0,
        window=128_000,
        config=CompactionConfig(),
    )
    assert s.total == 1_000 + 5 + (3 + 1 + 2)


# -- the compactor's trigger and the display agree -----------------------------------------------------------

messages_strategy = st.lists(
    st.one_of(
        st.builds(lambda n: user("u" * n), st.integers(0, 400)),
        st.builds(
            lambda n, i, o, stop, visible: assistant(
                "a" * n, usage=Usage(input_tokens=i, output_tokens=o), stop_reason=stop, agent_visible=visible
            ),
            st.integers(0, 400),
            st.integers(0, 150_000),
            st.integers(0, 5_000),
            st.sampled_from(["stop", "tool_calls", "aborted", "error", None]),
            st.booleans(),
        ),
        st.builds(lambda n: assistant("x" * n), st.integers(0, 50)),  # no usage
        st.builds(
            lambda n, visible: tool_result("c", "t", "r" * n, agent_visible=visible),
            st.integers(0, 2_000),
            st.booleans(),
        ),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    messages=messages_strategy,
    floor=st.integers(0, 35),
    system_tokens=st.integers(0, 5_000),
    tools_tokens=st.integers(0, 5_000),
    window=st.sampled_from([8_192, 32_000, 128_000, 200_000]),
    threshold=st.floats(0.1, 1.0),
    max_messages=st.one_of(st.none(), st.integers(1, 40)),
)
def test_context_stats_and_the_compaction_trigger_agree(
    messages: list[Message],
    floor: int,
    system_tokens: int,
    tools_tokens: int,
    window: int,
    threshold: float,
    max_messages: int | None,
) -> None:
    config = CompactionConfig(threshold=threshold, max_messages=max_messages)
    # What the compactor computes before each turn (actors/compactor.py):
    est = estimate_context(
        messages, count=count, system_tokens=system_tokens, tools_tokens=tools_tokens, usage_floor=floor
    )
    due = should_compact(est.tokens, window, config, len(messages))
    # What context_stats shows:
    s = context_stats(
        messages,
        count=count,
        system_tokens=system_tokens,
        tools_tokens=tools_tokens,
        window=window,
        config=config,
        usage_floor=floor,
    )
    assert s.total == est.tokens
    assert s.estimated == est.estimated
    assert s.will_compact == due
    assert s.system_prompt + s.tools + s.messages == max(s.total, system_tokens + tools_tokens)


# -- boundaries the mutation run found untested (issue 47 item 12) -------------------------------------------


def test_a_response_of_one_input_token_anchors_the_estimate() -> None:
    est = estimate([reply("a", 1, 2)])
    assert (est.tokens, est.estimated, est.basis) == (3, False, BASIS_LAST_RESPONSE)


def test_a_first_message_that_is_a_response_anchors_by_default() -> None:
    history = [reply("a", 100, 5), user("b")]
    assert (
        estimate_context(history, count=count, system_tokens=SYSTEM, tools_tokens=TOOLS).tokens
        == 100 + 5 + 11
    )
    assert estimate(history, usage_floor=-3).tokens == 116  # a floor below the start is the start
    assert stats(history).basis == BASIS_LAST_RESPONSE


def test_the_reserve_is_at_most_half_the_window_in_whole_tokens() -> None:
    config = CompactionConfig(reserve_tokens=1_000)
    assert effective_limit(1_001, config) == 501 and isinstance(effective_limit(1_001, config), int)
    assert effective_limit(1, config) == 1  # a window of one token still has a limit
    assert effective_limit(0, config) is None  # an unknown (zero) window: no limit unless max_tokens says
    assert effective_limit(0, CompactionConfig(max_tokens=500)) == 500


def test_the_message_count_trigger_counts_nothing_by_default() -> None:
    config = CompactionConfig(max_messages=1)
    assert not should_compact(0, 128_000, config)
    assert should_compact(0, 128_000, config, 1)


def test_stats_of_a_window_of_zero_reserve_nothing() -> None:
    s = context_stats(
        [user("a")],
        count=count,
        system_tokens=SYSTEM,
        tools_tokens=TOOLS,
        window=0,
        config=CompactionConfig(),
    )
    assert (s.reserve, s.free, s.limit, s.compaction_threshold) == (0, 0, None, None)


def test_stats_name_every_figure_and_its_source() -> None:
    history = [user("a"), reply("b", 1_000, 10), user("c")]
    s = stats(history)
    assert s.message_count == 3 and s.basis == BASIS_LAST_RESPONSE
    assert s.sources == {
        "total": ACTUAL_PLUS_ESTIMATE,
        "system_prompt": ESTIMATED,
        "tools": ESTIMATED,
        "messages": BACK_CALCULATED,
        "last_input_tokens": ACTUAL,
        "last_output_tokens": ACTUAL,
        "new_messages_tokens": ESTIMATED,
        "reserve": "configured",
        "compaction_threshold": "configured",
    }


def test_messages_of_exactly_zero_are_not_floored() -> None:
    s = stats([user("a"), reply("b", SYSTEM + TOOLS - 10, 10)])  # the total is exactly system + tools
    assert s.messages == 0 and not s.messages_floored


def test_the_newest_usable_response_is_found_from_the_start_by_default() -> None:
    from runtime.context.estimate import last_response_index

    assert last_response_index([reply("a", 10, 1), user("b")]) == 0
    assert last_response_index([reply("a", 10, 1), user("b")], usage_floor=1) is None
