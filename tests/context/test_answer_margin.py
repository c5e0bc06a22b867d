"""The answer cap's margin for the estimate's error (design §4.5): a count made here with a stand-in
tokenizer, and the ratio a session learns from the server's own counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.config import Config
from runtime.context.estimate import (
    MAX_COUNT_RATIO,
    MIN_ANSWER_TOKENS,
    MIN_RATIO_SAMPLE,
    STAND_IN_COUNT_RATIO,
    ContextEstimate,
    CountRatio,
    answer_cap,
    answer_margin,
    prompt_room,
)
from runtime.turn.fit import answer_cap_for, default_count_ratio


def test_the_case_real_measured_is_no_longer_over_the_window() -> None:
    # llama.cpp + SmolLM2, right after a compaction: 841 counted with cl100k, 980 by the server (1.165 ×)
    old = 2_048 - 841 - 128
    assert 980 + old > 2_048  # what was asked: vLLM refuses 2,059 > 2,048
    cap = answer_cap(window=2_048, prompt_tokens=841, counted_tokens=841, count_ratio=STAND_IN_COUNT_RATIO)
    assert cap is not None and 980 + cap <= 2_048
    assert cap >= 2_048 - 980 - 128  # still most of the room: 956 of the 1,068 the server would accept
    # at the worst ratio measured (1.26), learned from an earlier reply, it still fits
    cap = answer_cap(window=2_048, prompt_tokens=841, counted_tokens=841, count_ratio=1.26)
    assert cap is not None and round(841 * 1.26) + cap <= 2_048


def test_the_provider_s_own_count_needs_no_more_than_the_fixed_margin() -> None:
    # an anchored estimate: 1,500 of 1,600 tokens were the provider's usage, 100 counted here
    anchored = answer_cap(window=2_048, prompt_tokens=1_600, counted_tokens=100, count_ratio=1.25)
    assert anchored == 2_048 - 1_600 - 128
    # a ratio at or below 1 (the server counts no more than we do): the sixteenth, as before
    assert answer_margin(2_048, 1_900, 1.0) == 128
    assert answer_margin(2_048, 1_900, 0.8) == 128
    assert answer_margin(128_000, 100_000, 1.0) == 8_000
    # the default arguments keep the old rule
    assert answer_cap(window=2_048, prompt_tokens=1_500) == 2_048 - 1_500 - 128


def test_a_large_counted_part_keeps_its_expected_excess_and_a_slack() -> None:
    # 100,000 counted at 1.25: 25,000 beyond ours, plus a 64th of the window for the ratio's drift
    assert answer_margin(128_000, 100_000, 1.25) == 25_000 + 2_000
    assert answer_margin(1_024, 600, 1.25) == 150 + 16


@given(
    window=st.integers(256, 1_000_000),
    counted=st.integers(0, 1_000_000),
    ratio=st.floats(0.5, MAX_COUNT_RATIO),
)
def test_the_server_s_count_plus_the_cap_fits_when_the_ratio_is_right(
    window: int, counted: int, ratio: float
) -> None:
    cap = answer_cap(window=window, prompt_tokens=counted, counted_tokens=counted, count_ratio=ratio)
    assert cap is not None
    server = counted * ratio
    if cap > 32:  # (a prompt that leaves nothing asks for the minimum: the overflow path's business)
        assert server + cap <= window - 16
    assert answer_margin(window, counted, ratio) >= max(16, window // 16)


def test_the_ratio_is_learned_from_the_counted_part_only() -> None:
    ratio = CountRatio(STAND_IN_COUNT_RATIO)
    assert ratio.value == STAND_IN_COUNT_RATIO and not ratio.learned
    # a full count: 800 counted, the server said 960
    ratio.observe(actual_input=960, estimate=800, counted=800)
    assert ratio.learned and abs(ratio.value - 1.2) < 1e-9
    # anchored: 1,000 of the provider's own plus 400 counted, the server said 1,400 + 400 × 1.25
    ratio.observe(actual_input=1_500, estimate=1_400, counted=400)
    assert abs(ratio.value - 1.25) < 1e-9
    # the highest is kept: a lower one later does not lower it
    ratio.observe(actual_input=1_000, estimate=1_000, counted=1_000)
    assert abs(ratio.value - 1.25) < 1e-9


def test_too_few_counted_tokens_or_absurd_figures_teach_nothing() -> None:
    ratio = CountRatio(1.0)
    ratio.observe(actual_input=5_000, estimate=1_100, counted=MIN_RATIO_SAMPLE - 1)
    ratio.observe(actual_input=0, estimate=1_000, counted=1_000)
    ratio.observe(actual_input=900, estimate=100, counted=1_000)  # counted cannot exceed the estimate
    assert not ratio.learned and ratio.value == 1.0
    ratio.observe(actual_input=100_000, estimate=1_000, counted=1_000)  # a hidden prompt: bounded
    assert ratio.value == MAX_COUNT_RATIO
    low = CountRatio(STAND_IN_COUNT_RATIO)
    low.observe(actual_input=10, estimate=1_000, counted=1_000)  # a server that counts far fewer
    assert low.value == 0.5  # the margin is then the fixed one (answer_margin never goes below it)


def test_the_anchored_part_of_an_estimate_is_the_provider_s_count() -> None:
    full = ContextEstimate(tokens=900, estimated=True, new_messages_tokens=850)
    assert full.anchored_tokens == 0
    anchored = ContextEstimate(
        tokens=1_300,
        estimated=False,
        last_input_tokens=1_000,
        last_output_tokens=100,
        new_messages_tokens=200,
    )
    assert anchored.anchored_tokens == 1_100


def test_the_default_ratio_is_for_stand_in_counts_only() -> None:
    config = Config()
    assert default_count_ratio("openai/smollm2", config) == STAND_IN_COUNT_RATIO
    assert default_count_ratio("anthropic/claude-sonnet-4-5", config) == STAND_IN_COUNT_RATIO
    assert default_count_ratio("openai/gpt-4o-mini", config) == 1.0  # o200k: the model's own
    assert default_count_ratio("gpt-4-turbo", config) == 1.0  # cl100k is gpt-4's own
    assert (
        default_count_ratio("openai/smollm2", config.with_overrides({"tokens.server_tokenize": True})) == 1.0
    )
    assert (
        default_count_ratio("openai/smollm2", config.with_overrides({"tokens.encoding": "o200k_base"})) == 1.0
    )


def test_the_request_s_cap_uses_the_counted_part_and_the_ratio() -> None:
    config = Config().with_overrides({"models.context_windows": {"openai/smollm2": 2_048}})
    full = answer_cap_for("openai/smollm2", 2_048, 841, config, count_ratio=1.25)
    anchored = answer_cap_for("openai/smollm2", 2_048, 841, config, counted=41, count_ratio=1.25)
    assert full is not None and anchored is not None
    assert anchored == 2_048 - 841 - 128 > full


def test_the_margin_s_floors_and_whole_tokens() -> None:
    """The margin is a whole number of tokens: a sixteenth of the window, never under 16; the ratio's excess
    plus a 64th of the window (never under 16) when that is more."""
    assert answer_margin(200) == 16  # a tiny window: the floor, not 12
    assert answer_margin(2_050) == 128  # 2,050 / 16 = 128.125: whole tokens
    assert answer_margin(1_000, 600, 1.25) == 150 + 16  # a 64th (15) is floored at 16
    assert answer_margin(100_000, 80_000, 1.25) == 20_000 + 1_562  # 100,000 / 64 = 1,562.5
    assert answer_margin(2_048, 1_900) == 128  # counted tokens without a ratio: no excess
    for margin in (answer_margin(2_050), answer_margin(100_000, 80_000, 1.25)):
        assert isinstance(margin, int)


def test_nothing_counted_here_needs_no_margin_for_the_ratio() -> None:
    """An estimate that is all the provider's own count keeps the fixed margin, whatever the ratio."""
    assert answer_margin(256, count_ratio=MAX_COUNT_RATIO) == 16
    assert answer_margin(256, 0, MAX_COUNT_RATIO) == 16
    assert answer_cap(window=256, prompt_tokens=100, count_ratio=MAX_COUNT_RATIO) == 256 - 100 - 16
    # a prompt of no (or a nonsensical negative) size has nothing counted in it, whatever the caller says
    assert answer_cap(window=256, prompt_tokens=0, counted_tokens=5, count_ratio=MAX_COUNT_RATIO) == 240
    assert answer_cap(window=256, prompt_tokens=-5, counted_tokens=100, count_ratio=MAX_COUNT_RATIO) == 240


def test_a_counted_prompt_without_a_ratio_keeps_the_sixteenth() -> None:
    assert answer_cap(window=2_048, prompt_tokens=1_000, counted_tokens=1_000) == 2_048 - 1_000 - 128
    # the ratio given is the ratio used: 2.0 doubles the counted part, plus a 64th of the window
    doubled = answer_cap(window=2_048, prompt_tokens=600, counted_tokens=600, count_ratio=2.0)
    assert doubled == 2_048 - 600 - (600 + 32)


def test_the_output_limits_and_an_unknown_window() -> None:
    """The cap is the smallest of the configured limit, the model's and the room the window leaves; a limit
    of 0 (unknown in a model map) is none, and a window of 0 is an unknown one."""
    assert answer_cap(window=None, prompt_tokens=10) is None  # nothing known: ask for nothing
    assert answer_cap(window=0, prompt_tokens=10) is None
    assert answer_cap(window=None, prompt_tokens=10, model_max=0) is None
    assert answer_cap(window=None, prompt_tokens=10, configured=1) == 1
    assert answer_cap(window=None, prompt_tokens=10, configured=500, model_max=300) == 300
    assert answer_cap(window=2_048, prompt_tokens=100, configured=500) == 500
    assert answer_cap(window=2_048, prompt_tokens=100, model_max=8_192) == 2_048 - 100 - 128
    # however little room is left, a request asks for the smallest answer (the overflow path decides)
    assert answer_cap(window=2_048, prompt_tokens=2_000) == MIN_ANSWER_TOKENS
    assert answer_cap(window=1, prompt_tokens=0) == MIN_ANSWER_TOKENS


def test_the_ratio_s_default_and_its_sample_boundaries() -> None:
    assert CountRatio().value == 1.0 and not CountRatio().learned  # until told otherwise: our count
    at_sample = CountRatio()
    at_sample.observe(actual_input=320, estimate=MIN_RATIO_SAMPLE, counted=MIN_RATIO_SAMPLE)
    assert at_sample.learned and at_sample.value == 320 / MIN_RATIO_SAMPLE  # exactly the sample: taught
    one = CountRatio(STAND_IN_COUNT_RATIO)
    one.observe(actual_input=1, estimate=1_000, counted=1_000)  # any positive count teaches (bounded)
    assert one.learned and one.value == 0.5


def test_the_prompt_room_at_our_count_is_the_window_less_the_answer_and_the_margin() -> None:
    assert prompt_room(2_048, 512) == 2_048 - 512 - 128  # the sixteenth
    assert prompt_room(4_096, 1_024, fixed=154) == 4_096 - 1_024 - 154  # a request's own margin
    assert prompt_room(4_096, 1_024, 0.8, fixed=154) == 4_096 - 1_024 - 154  # a server counting less
    assert answer_margin(4_096, 3_000, 1.0, fixed=154) == 154
    assert answer_margin(1_024, 1_000, 0.5, fixed=0) == 16  # a server counting less: still the drift
    assert prompt_room(1_000, 1_000) == -62  # no room at all, 62 short: the caller sends nothing
    assert prompt_room(1_000, 938) == 0  # just room for the margin
    # a margin that grows by a token with the first counted one: 0 fits, 1 does not (16 + 1 + 17 > 17 free)
    assert prompt_room(1_000, 983, 2.0, fixed=16) == 0
    assert prompt_room(1_000, 939) == -1


def test_the_prompt_room_shrinks_with_the_server_s_count() -> None:
    # 4,096 window, a 1,024-token answer, the server counting 1.5 × ours: 2,005 × 1.5 + 64 <= 3,072
    assert prompt_room(4_096, 1_024, 1.5, fixed=154) == 2_005
    assert prompt_room(4_096, 1_024, 1.25) == 2_406  # (3,072 - 64) / 1.25, below 4,096 - 1,024 - 256
    # a small excess stays within the fixed margin: the margin decides
    assert prompt_room(128_000, 4_096, 1.01) == 128_000 - 4_096 - 8_000


@given(
    window=st.integers(256, 1_000_000),
    answer=st.integers(0, 200_000),
    ratio=st.floats(0.5, MAX_COUNT_RATIO),
    fixed=st.none() | st.integers(0, 10_000),
)
def test_the_prompt_room_is_the_most_a_request_may_send(
    window: int, answer: int, ratio: float, fixed: int | None
) -> None:
    """The room is the converse of the answer cap's rule: a prompt of that size, the answer and the margin
    fit the window; one token more does not."""
    room = prompt_room(window, answer, ratio, fixed=fixed)
    free = window - answer
    if room > 0:
        assert room + answer_margin(window, room, ratio, fixed=fixed) <= free
    if room >= 0:
        assert room + 1 + answer_margin(window, room + 1, ratio, fixed=fixed) > free
