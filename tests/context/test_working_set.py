"""The working set and the rules of each request of a turn (design §5.13), the pure part.

Where the working set begins; that automatic compactions never cut into it (over random histories); how a
step's results are clipped to a budget; and the decision before each request: at most one threshold and one
emergency compaction per turn, only when they can pass the progress guard, nothing sent that cannot fit,
and the turn's input budget.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import messages as m
from runtime.config import CompactionConfig
from runtime.context import working_set as ws
from runtime.context.compaction import CompactionResult, NothingToCompact, finish_compaction, plan_compaction
from runtime.context.prompts import summary_body

CONFIG = CompactionConfig(reserve_tokens=1_000)  # window 10,000: limit 9,000, threshold 7,200


def count(msg: m.Message) -> int:
    return (len(msg.text) + sum(len(c.arguments) for c in msg.tool_calls)) // 4 + 4


def step(tag: str, sizes: list[int]) -> list[m.Message]:
    calls = [
        m.ToolCallPart(f"{tag}-{i}", "read_file", f'{{"path": "{tag}{i}.py"}}') for i in range(len(sizes))
    ]
    return [
        m.assistant("", tool_calls=calls),
        *(m.tool_result(c.id, c.name, "x" * size) for c, size in zip(calls, sizes, strict=True)),
    ]


# ---------------------------------------------------------------------------------------------------
# Where the working set begins


def test_the_working_set_is_the_newest_step_of_the_turn() -> None:
    history = [m.user("one"), m.assistant("done"), m.user("two"), *step("a", [10]), *step("b", [10, 20])]
    assert ws.working_set_start(history) == 5
    assert history[5].tool_calls[0].id == "b-0"


def test_before_the_first_step_the_working_set_is_the_prompt() -> None:
    history = [m.user("one"), *step("a", [10]), m.assistant("done"), m.user("two")]
    assert ws.working_set_start(history) == 4


def test_a_tool_digest_or_hidden_prompt_after_the_step_does_not_move_it() -> None:
    digest = m.user("[Archived tool results summary] ...", kind=m.KIND_TOOL_SUMMARY)
    hidden = m.user("too big", agent_visible=False)
    history = [m.user("one"), *step("a", [10]), digest, hidden]
    assert ws.working_set_start(history) == 1


def test_no_working_set_without_a_prompt_or_a_step() -> None:
    assert ws.working_set_start([]) is None
    assert ws.working_set_start([m.user("s", kind=m.KIND_COMPACTION_SUMMARY)]) is None


# ---------------------------------------------------------------------------------------------------
# Automatic compactions keep it


@st.composite
def conversations(draw: st.DrawFn) -> list[m.Message]:
    msgs: list[m.Message] = []
    if draw(st.booleans()):
        msgs.append(m.user("[Previous conversation summary] earlier", kind=m.KIND_COMPACTION_SUMMARY))
    for t in range(draw(st.integers(1, 5))):
        msgs.append(m.user(f"turn {t} " + "w" * draw(st.integers(0, 2_000))))
        for s in range(draw(st.integers(0, 4))):
            sizes = draw(st.lists(st.integers(0, 8_000), min_size=1, max_size=6))
            msgs.extend(step(f"t{t}s{s}", sizes))
        if draw(st.booleans()):
            msgs.append(m.assistant("answer " + "w" * draw(st.integers(0, 800))))
    return msgs


@settings(max_examples=300, deadline=None)
@given(
    msgs=conversations(),
    keep=st.integers(1, 5_000),
    force=st.booleans(),
    mode=st.sampled_from(["summarize", "truncate", "hard_reset"]),
)
def test_an_automatic_compaction_never_summarizes_the_working_set(
    msgs: list[m.Message], keep: int, force: bool, mode: str
) -> None:
    start = ws.working_set_start(msgs)
    plan = plan_compaction(
        msgs,
        trigger="threshold",
        keep_tokens=keep,
        count=count,
        config=CONFIG,
        mode=mode,  # type: ignore[arg-type]
        force=force,
        keep_from=start,
    )
    if isinstance(plan, NothingToCompact):
        return
    assert start is not None
    working_set = msgs[start:]
    assert plan.kept[-len(working_set) :] == working_set
    assert plan.summarized + plan.kept == msgs
    # the request being worked on is carried verbatim when the cut falls inside its turn
    if plan.kept and plan.kept[0].role != "user":
        prompt = next(x for x in reversed(plan.summarized) if x.role == "user" and x.kind is None)
        assert plan.open_request == prompt
        answers = [None] * len(plan.requests)
        result = finish_compaction(plan, answers, count=count)
        if isinstance(result, CompactionResult):
            assert "<current-request>" in result.summary.text
            assert "<current-request>" not in summary_body(result.summary.text)


# ---------------------------------------------------------------------------------------------------
# Clipping a step's results


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 50_000), min_size=1, max_size=6), budget=st.integers(0, 20_000))
def test_clips_cut_the_largest_first_to_fit_the_budget(sizes: list[int], budget: int) -> None:
    tokens = [(chars // 4, chars) for chars in sizes]
    clips = {c.index: c.max_chars for c in ws.plan_clips(tokens, budget)}
    if sum(t for t, _ in tokens) <= budget:
        assert clips == {}
        return
    kept = [clips.get(i, chars) for i, chars in enumerate(sizes)]
    for i, max_chars in clips.items():  # the largest are cut, to less than they were
        assert max_chars < sizes[i] and all(sizes[j] <= sizes[i] for j in range(len(sizes)) if j not in clips)
    total = sum(k // 4 for k in kept) + len(clips) * ws.CLIP_NOTICE_TOKENS
    # they fit, unless the budget is below what every result clipped to the minimum would take
    least = sum(
        min(c, ws.MIN_CLIP_CHARS) // 4 + (ws.CLIP_NOTICE_TOKENS if c > ws.MIN_CLIP_CHARS else 0)
        for c in sizes
    )
    assert total <= budget or budget < least


def test_a_clipped_result_keeps_head_and_tail_and_names_the_full_text() -> None:
    text = "HEAD" + "m" * 10_000 + "TAIL"
    result = m.tool_result("c1", "read_file", text, metadata={"duration": 0.1})
    clipped = ws.clip_result(result, 1_000, saved_path="/s/read_file-ab.txt", sha256="ab" * 32)
    assert clipped.id == result.id and clipped.tool_call_id == "c1"
    assert "HEAD" in clipped.text and "TAIL" in clipped.text and len(clipped.text) < 1_400
    assert "/s/read_file-ab.txt" in clipped.text and "ab" * 32 in clipped.text
    assert clipped.metadata == {
        "duration": 0.1,
        "clipped": True,
        "clipped_from_chars": len(text),
        "clip_path": "/s/read_file-ab.txt",
        "clip_sha256": "ab" * 32,
    }
    assert ws.clip_result(result, 20_000, saved_path="-", sha256="-") is result


def test_a_clipped_result_names_its_id_and_the_tool_that_reads_it_when_there_is_one() -> None:
    result = m.tool_result("c1", "grep", "x" * 10_000)
    clipped = ws.clip_result(
        result, 1_000, saved_path="/s/a.spill/grep-ab.txt", sha256="ab", reader="read_saved"
    )
    assert (
        'saved as "grep-ab.txt" (SHA-256 ab); read the middle in parts with read_saved(id="grep-ab.txt")'
        in (clipped.text)
    )
    assert "/s/a.spill" not in clipped.text  # a path the model cannot open is not offered


def test_the_budget_leaves_room_for_the_call_and_a_summary() -> None:
    budget = ws.working_set_budget(limit=9_000, fixed_tokens=500, call_tokens=100, config=CONFIG)
    assert budget == 9_000 - 500 - 100 - 1_800  # a fifth of the limit for the summary


# ---------------------------------------------------------------------------------------------------
# Before each request


def decide(estimate: int, **kw: object) -> ws.StepDecision:
    args: dict[str, object] = {
        "estimate": estimate,
        "message_count": 10,
        "window": 10_000,
        "config": CONFIG,
        "pending": None,
        "threshold_used": False,
        "overflow_used": False,
        "turn_input_tokens": 0,
        "turn_budget": 200_000,
        "tool_results_in_view": True,
    }
    args.update(kw)
    return ws.decide_step(**args)  # type: ignore[arg-type]


def test_under_the_threshold_the_request_goes_out() -> None:
    assert decide(7_199).action == "send"


def test_one_threshold_compaction_a_turn_then_send_while_it_fits() -> None:
    assert decide(7_200) == ws.StepDecision(action="compact", trigger="threshold")
    assert decide(8_900, threshold_used=True).action == "send"  # over the threshold, under the limit


def test_over_the_limit_one_emergency_compaction_then_a_clear_error() -> None:
    assert decide(9_500, threshold_used=True) == ws.StepDecision(action="compact", trigger="overflow")
    failed = decide(9_500, threshold_used=True, overflow_used=True)
    assert failed.action == "fail" and failed.code == ws.WORKING_SET_TOO_LARGE
    assert "9,500" in (failed.message or "") and "10,000" in (failed.message or "")
    plain = decide(9_500, threshold_used=True, overflow_used=True, tool_results_in_view=False)
    assert plain.code == ws.CONTEXT_OVERFLOW


def test_a_silent_overflow_asks_for_the_turns_compaction() -> None:
    assert decide(100, pending="usage_overflow") == ws.StepDecision(
        action="compact", trigger="usage_overflow"
    )


def test_no_compaction_that_could_only_fail_the_progress_guard() -> None:
    assert decide(7_500, compactable=lambda: 700).action == "send"  # under 10% of 7,500
    assert decide(7_500, compactable=lambda: 800).action == "compact"
    over = decide(9_500, compactable=lambda: 10)
    assert over.action == "fail" and over.code == ws.WORKING_SET_TOO_LARGE


def test_without_auto_compaction_the_provider_judges_up_to_the_window() -> None:
    off = CompactionConfig(reserve_tokens=1_000, auto=False)
    assert decide(9_999, config=off).action == "send"
    assert decide(10_001, config=off).action == "fail"


@pytest.mark.parametrize(
    ("sent", "estimate", "action"), [(0, 5_000, "send"), (15_000, 5_000, "send"), (15_001, 5_000, "fail")]
)
def test_the_turn_budget(sent: int, estimate: int, action: str) -> None:
    decision = decide(estimate, turn_input_tokens=sent, turn_budget=20_000)
    assert decision.action == action
    if action == "fail":
        assert decision.code == ws.TURN_BUDGET and "20,000" in (decision.message or "")


def test_the_default_turn_budget_is_twenty_windows() -> None:
    assert ws.turn_input_budget(None, 8_000) == 160_000
    assert ws.turn_input_budget(5_000, 8_000) == 5_000


def test_a_prompt_that_cannot_fit_on_its_own() -> None:
    assert ws.prompt_too_large(prompt_tokens=8_000, fixed_tokens=1_000, window=10_000, limit=9_000) is None
    refusal = ws.prompt_too_large(prompt_tokens=8_001, fixed_tokens=1_000, window=10_000, limit=9_000)
    assert refusal is not None and "8,001" in refusal and "10,000" in refusal


# ---------------------------------------------------------------------------------------------------
# Boundaries the mutation run found untested (issue 47 item 12)


def test_the_message_count_trigger_compacts_before_a_request() -> None:
    config = CompactionConfig(reserve_tokens=1_000, max_messages=40)
    assert decide(1_000, message_count=40, config=config) == ws.StepDecision(
        action="compact", trigger="threshold"
    )
    assert decide(1_000, message_count=39, config=config).action == "send"


def test_a_compaction_is_tried_when_it_can_remove_exactly_the_required_share() -> None:
    # 7,200 is the threshold; 10% of it is 720: exactly that much compactable is enough, one less is not.
    assert decide(7_200, compactable=lambda: 720).action == "compact"
    assert decide(7_200, compactable=lambda: 719).action == "send"


def test_the_common_cap_is_a_whole_number_of_tokens() -> None:
    # 1,000 tokens over three results of 500: a third each is 333 (whole tokens), not 333.33.
    assert ws._common_cap([500, 500, 500], 1_000) == 333
    assert isinstance(ws._common_cap([500, 500, 500], 1_000), int)
    assert ws._common_cap([100, 500, 500], 1_000) == 450  # the small one whole, the rest split


def test_a_budget_below_zero_clips_everything_to_the_minimum() -> None:
    clips = ws.plan_clips([(5_000, 20_000), (4_000, 16_000)], -50)
    assert [(c.index, c.max_chars) for c in clips] == [(0, ws.MIN_CLIP_CHARS), (1, ws.MIN_CLIP_CHARS)]
    assert ws._common_cap([5_000, 4_000], 0) == 0


def test_what_a_compaction_could_remove_is_everything_before_the_working_set_but_summaries() -> None:
    summary = m.Message(role="user", parts=(m.TextPart("S" * 90),), kind=m.KIND_COMPACTION_SUMMARY)
    hidden = m.Message(role="user", parts=(m.TextPart("H" * 90),), agent_visible=False)
    call = m.assistant("d" * 40, tool_calls=[m.ToolCallPart(id="c1", name="grep", arguments="{}")])
    history = [summary, m.user("a" * 10), m.assistant("b" * 20), hidden, m.user("c" * 30), call]
    size = lambda msg: len(msg.text)  # noqa: E731
    # before the working set (the call): the two prompts and the answer; not the summary, not the hidden
    assert ws.compactable_tokens(history, size) == 10 + 20 + 30
    # no working set at all: every visible message but the summary
    assert ws.compactable_tokens([summary, m.assistant("b" * 20)], size) == 20
    assert ws.compactable_tokens([], size) == 0


def test_an_answer_without_tool_calls_does_not_start_the_working_set() -> None:
    history = [m.user("do it"), m.assistant("done")]
    assert ws.working_set_start(history) == 0  # the turn's prompt, not the plain answer after it


def test_a_clipped_result_keeps_exactly_its_head_and_tail() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(1_000))
    clipped = ws.clip_result(
        m.tool_result("c1", "grep", text), 101, saved_path="C:\\s\\x.spill\\grep-ab.txt", sha256="ab"
    )
    body = clipped.text.split("\n", 1)[1]
    assert body == f"{text[:51]}\n[... 899 chars omitted ...]\n{text[-50:]}"
    assert "saved at C:\\s\\x.spill\\grep-ab.txt (SHA-256 ab)" in clipped.text
    named = ws.clip_result(
        m.tool_result("c1", "grep", text),
        101,
        saved_path="C:\\s\\x.spill\\grep-ab.txt",
        sha256="ab",
        reader="r",
    )
    assert 'saved as "grep-ab.txt"' in named.text and 'r(id="grep-ab.txt")' in named.text
    one = ws.clip_result(m.tool_result("c1", "grep", text), 1, saved_path="/s/a/b.txt", sha256="ab")
    assert one.text.split("\n", 1)[1] == f"{text[:1]}\n[... 999 chars omitted ...]\n"  # no tail at all
    exact = m.tool_result("c1", "grep", text)
    assert ws.clip_result(exact, 1_000, saved_path="-", sha256="-") is exact  # it fits: untouched


def test_the_common_cap_when_everything_fits_is_the_largest_result() -> None:
    assert ws._common_cap([300, 100, 200], 1_000) == 300
    assert ws._common_cap([], 1_000) == 0
    assert ws._common_cap([100, 200, 300], 450) == 175  # 100 whole, then 350 between the other two
    assert ws._common_cap([100, 200, 300], 300) == 100  # a share of exactly a result's size: it fits


def test_results_that_fit_their_budget_exactly_are_not_clipped() -> None:
    assert ws.plan_clips([(500, 2_000), (500, 2_000)], 1_000) == []
    assert ws.plan_clips([], 0) == []
    clips = ws.plan_clips([(500, 2_000), (1_500, 6_000)], 1_200)
    assert [c.index for c in clips] == [1]  # the small one stays whole
    assert clips[0].max_chars == int(6_000 * (1_200 - 500 - ws.CLIP_NOTICE_TOKENS) / 1_500 * 0.9)
    # a result of no tokens is never clipped, whatever the cap
    assert [c.index for c in ws.plan_clips([(0, 5_000), (3_000, 12_000)], 100)] == [1]


def test_three_rounds_of_notice_room_settle_the_cap() -> None:
    sizes = [(1_000, 4_000), (900, 3_600), (120, 480)]
    clips = ws.plan_clips(sizes, 1_300)
    # cap after the notices of the two large results: (1,300 - 2 × 110 - 120) / 2 = 480
    assert [(c.index, c.max_chars) for c in clips] == [
        (0, int(4_000 * 480 / 1_000 * 0.9)),
        (1, int(3_600 * 480 / 900 * 0.9)),
    ]


def test_the_working_set_budget_is_whole_tokens() -> None:
    budget = ws.working_set_budget(limit=9_003, fixed_tokens=3, call_tokens=0, config=CONFIG)
    assert budget == 9_003 - 3 - 1_800 and isinstance(budget, int)  # a fifth of 9,003 is 1,800


def test_a_request_of_exactly_the_limit_is_sent() -> None:
    assert decide(9_000, threshold_used=True) == ws.StepDecision(action="send")
    assert decide(9_001, threshold_used=True) == ws.StepDecision(action="compact", trigger="overflow")


def test_a_request_over_the_limit_fails_with_what_is_left() -> None:
    decision = decide(9_500, threshold_used=True, overflow_used=True)
    assert decision == ws.StepDecision(
        action="fail",
        code=ws.WORKING_SET_TOO_LARGE,
        message=(
            "The next request (about 9,500 tokens) does not fit the model's context of 10,000 tokens "
            "(at most 9,000 after the output reserve) even after compacting everything else: what is left is "
            "the newest step's tool calls and results, which compaction keeps whole (their largest outputs "
            "were clipped, the full text saved on disk). Nothing was lost; ask for smaller pieces of work, use "
            "a model with a larger window, or compact by hand."
        ),
    )
    off = CompactionConfig(reserve_tokens=1_000, auto=False)
    manual = decide(10_001, config=off, tool_results_in_view=False)
    assert manual.code == ws.CONTEXT_OVERFLOW
    assert manual.message == (
        "The next request (about 10,001 tokens) does not fit the model's context of 10,000 tokens "
        "(at most 9,000 after the output reserve) and automatic compaction is off for this session "
        "(compaction.auto): what is left is the newest messages. Nothing was lost; ask for smaller pieces of "
        "work, use a model with a larger window, or compact by hand."
    )
    assert decide(10_000, config=off).action == "send"  # without auto, up to the window itself


def test_the_turn_budget_error_says_what_was_spent() -> None:
    decision = decide(5_000, turn_input_tokens=196_000)
    assert decision == ws.StepDecision(
        action="fail",
        code=ws.TURN_BUDGET,
        message=(
            "The turn stopped before its next request: it has sent 196,000 input tokens, and the next request "
            "(about 5,000) would pass its budget of 200,000 (agent.max_turn_input_tokens, by default 20 × the "
            "context window). Nothing was lost; send another prompt to go on, or raise the budget."
        ),
    )
    assert decide(5_000, turn_input_tokens=195_000).action == "send"  # exactly the budget


def test_a_prompt_too_large_is_explained_word_for_word() -> None:
    assert ws.prompt_too_large(prompt_tokens=8_000, fixed_tokens=1_000, window=10_000, limit=9_000) is None
    assert ws.prompt_too_large(prompt_tokens=8_001, fixed_tokens=1_000, window=10_000, limit=9_000) == (
        "The prompt is about 8,001 tokens; with the system prompt and tools (1,000) it does not fit the "
        "model's context window of 10,000 tokens (at most 9,000 after the output reserve). It was not sent "
        "and not summarized: it stays in the session's record, hidden from the model. Send a shorter prompt, "
        "or put the content in a file for the agent to read in parts."
    )


def test_a_share_equal_to_a_result_lets_the_rest_share_more() -> None:
    # 302 over three: 100 fits (a share of exactly 100), the other two then share 202: 101 each.
    assert ws._common_cap([100, 200, 300], 302) == 101


def test_a_result_of_one_token_can_be_clipped_too() -> None:
    clips = ws.plan_clips([(1, 1_000), (5_000, 20_000)], 0)
    assert [(c.index, c.max_chars) for c in clips] == [(0, ws.MIN_CLIP_CHARS), (1, ws.MIN_CLIP_CHARS)]


def test_an_even_clip_splits_head_and_tail_evenly() -> None:
    text = "x" * 500 + "y" * 500
    clipped = ws.clip_result(
        m.tool_result("c1", "grep", text), 100, saved_path="grep-ab.txt", sha256="ab", reader="r"
    )
    assert clipped.text.split("\n", 1)[1] == f"{'x' * 50}\n[... 900 chars omitted ...]\n{'y' * 50}"
    assert 'saved as "grep-ab.txt"' in clipped.text  # a bare name is its own id


def settled_plan(sizes: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """The plan by its definition: the cap that leaves room for the notices of exactly the results over
    it, found by counting up from none until the count holds."""
    tokens = [t for t, _ in sizes]
    if sum(tokens) <= budget:
        return []
    clipped = 0
    while True:
        cap = ws._common_cap(tokens, max(0, budget - clipped * ws.CLIP_NOTICE_TOKENS))
        over = sum(t > cap for t in tokens)
        if over == clipped:
            break
        clipped = over
    keep = [(i, max(ws.MIN_CLIP_CHARS, int(c * cap / t * 0.9))) for i, (t, c) in enumerate(sizes) if t > cap]
    return [(i, k) for i, k in keep if k < sizes[i][1]]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 20_000)), min_size=1, max_size=6),
    st.integers(-200, 8_000),
)
def test_the_clip_plan_is_the_settled_one(sizes: list[tuple[int, int]], budget: int) -> None:
    assert [(c.index, c.max_chars) for c in ws.plan_clips(sizes, budget)] == settled_plan(sizes, budget)


def test_clip_plans_that_took_more_than_three_rounds_to_settle() -> None:
    for sizes, budget in [
        ([(1_497, 14_708), (2_467, 4_100), (188, 5_975), (814, 4_990), (848, 4_088), (895, 6_006)], 4_625),
        ([(1_169, 9_328), (980, 7_577), (2_622, 3_327), (1_065, 2_258)], 4_250),
    ]:
        plan = ws.plan_clips(sizes, budget)
        assert [(c.index, c.max_chars) for c in plan] == settled_plan(sizes, budget)


def test_a_clip_to_the_whole_text_is_no_clip() -> None:
    assert ws.plan_clips([(1_000, 400), (1_000, 400)], 100) == []  # the minimum is all there is


def test_notices_past_the_budget_leave_the_minimum() -> None:
    # one result, a budget smaller than its notice: cap 0, so the minimum, whatever chars per token
    assert [(c.index, c.max_chars) for c in ws.plan_clips([(1_000, 1_000_000)], 50)] == [
        (0, ws.MIN_CLIP_CHARS)
    ]
