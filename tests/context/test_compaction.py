"""Compaction's pure logic (design §5.2-5.8): cut point, split turns, summarizer requests, fallback, the
progress guard, file-op tracking and the three modes."""

from __future__ import annotations

import msgspec
import pytest

from runtime import messages as m
from runtime.config import CompactionConfig
from runtime.context.compaction import (
    OPEN_REQUEST_CHARS,
    CompactionFailure,
    CompactionPlan,
    CompactionResult,
    NothingToCompact,
    finish_compaction,
    keep_recent_budget,
    plan_compaction,
)
from runtime.context.cut import CutPoint, find_cut_point
from runtime.context.file_ops import FileOps
from runtime.context.prompts import SPLIT_TURN_HEADING, SUMMARY_PREFIX, summary_body
from runtime.tokens import TokenCounter

CONFIG = CompactionConfig()


def count(msg: m.Message) -> int:
    """Test token counter: 1 token per 4 characters of text and tool-call arguments, + 4 per message."""
    return (len(msg.text) + sum(len(c.arguments) for c in msg.tool_calls)) // 4 + 4


def words(tokens: int) -> str:
    """Text that ``count`` values at ``tokens`` (+ the per-message 4)."""
    return "abcd" * tokens


def turn(
    request: str, steps: int = 0, *, size: int = 100, reads: tuple[str, ...] = (), tag: str = ""
) -> list[m.Message]:
    """A user message, ``steps`` tool steps (read_file calls and results), then a final answer."""
    tag = tag or request
    msgs = [m.user(f"{request} {words(size)}")]
    for i in range(steps):
        path = reads[i] if i < len(reads) else f"{tag}-{i}.py"
        call = m.ToolCallPart(f"{tag}-call{i}", "read_file", f'{{"path": "{path}"}}')
        msgs.append(m.assistant(f"reading {path}", tool_calls=[call]))
        msgs.append(m.tool_result(call.id, "read_file", words(size)))
    msgs.append(m.assistant(f"answer to {request} {words(size)}"))
    return msgs


def previous_summary(body: str = "## Goal\nEarlier goal", **files: list[str]) -> m.Message:
    return m.user(
        f"{SUMMARY_PREFIX}\n\n{body}",
        kind=m.KIND_COMPACTION_SUMMARY,
        metadata={"read_files": files.get("read", []), "modified_files": files.get("modified", [])},
    )


def plan_of(msgs: list[m.Message], keep: int, **kw: object) -> CompactionPlan:
    kw.setdefault("trigger", "threshold")
    kw.setdefault("config", CONFIG)
    plan = plan_compaction(msgs, keep_tokens=keep, count=count, **kw)  # type: ignore[arg-type]
    assert isinstance(plan, CompactionPlan), plan
    return plan


def tokens_of(msgs: list[m.Message]) -> int:
    return sum(count(x) for x in msgs if x.agent_visible)


# ---------------------------------------------------------------------------------------------------
# keep_recent_budget (5.2, 6.3)


def test_keep_recent_budget_defaults_and_clamps() -> None:
    assert keep_recent_budget(200_000, CONFIG) == 50_000  # window / 4
    assert keep_recent_budget(None, CONFIG) == 20_000  # no window
    # Clamped to half the effective limit (window - reserve; the reserve an eighth of a 100,000 window).
    tight = CompactionConfig(keep_recent_tokens=90_000)
    assert keep_recent_budget(100_000, tight) == (100_000 - 12_500) // 2
    assert keep_recent_budget(None, CompactionConfig(max_tokens=10_000)) == 5_000
    # Emergency keeps window / 5; a manual override wins but is clamped too.
    assert keep_recent_budget(200_000, CONFIG, emergency=True) == 40_000
    assert keep_recent_budget(200_000, CONFIG, override=1_000) == 1_000
    assert keep_recent_budget(200_000, CONFIG, override=10**9) == (200_000 - 16_384) // 2


# ---------------------------------------------------------------------------------------------------
# The cut (5.2, 5.3)


def test_cut_lands_on_the_user_message_that_starts_a_turn() -> None:
    turns = [turn(name, 2) for name in ("one", "two", "three", "four")]  # 6 messages each
    msgs = [x for t in turns for x in t]
    size = tokens_of(turns[0])
    # One and a half turns: the crossing is inside turn "three"; the cut moves forward to turn "four".
    assert find_cut_point(msgs, keep_tokens=size + size // 2, count=count) == CutPoint(18)
    assert find_cut_point(msgs, keep_tokens=2 * size + size // 2, count=count) == CutPoint(12)
    # Exactly the last two turns' worth: the crossing is the last message of turn "two".
    assert find_cut_point(msgs, keep_tokens=tokens_of(msgs[12:]), count=count) == CutPoint(12)


def test_nothing_to_cut_when_everything_fits() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    assert find_cut_point(msgs, keep_tokens=10_000, count=count) is None
    assert find_cut_point([], keep_tokens=10, count=count) is None
    result = plan_compaction(msgs, trigger="threshold", keep_tokens=10_000, count=count, config=CONFIG)
    assert isinstance(result, NothingToCompact)


def test_parallel_tool_results_are_never_separated_from_their_call() -> None:
    calls = [m.ToolCallPart(f"p{i}", "read_file", f'{{"path": "p{i}.py"}}') for i in range(3)]
    msgs = [
        *turn("first", 1),
        m.user("second " + words(10)),
        m.assistant("three reads", tool_calls=calls),
        *(m.tool_result(c.id, c.name, words(300)) for c in calls),
        m.assistant("done"),
    ]
    # The crossing falls on the second of the three results; no turn starts after it.
    for keep in (310, 500, 700, 900):
        cut = find_cut_point(msgs, keep_tokens=keep, count=count)
        assert cut is not None
        kept_ids = {x.id for x in msgs[cut.index :]}
        for x in msgs[cut.index :]:
            if x.role == "tool":
                assert msgs[5].id in kept_ids  # the call travels with its results
        assert msgs[cut.index].role != "tool"


def test_force_keeps_the_last_two_messages() -> None:
    msgs = turn("one", 0, size=10) + turn("two", 0, size=10)
    assert find_cut_point(msgs, keep_tokens=10_000, count=count) is None
    cut = find_cut_point(msgs, keep_tokens=10_000, count=count, force=True)
    assert cut == CutPoint(2, forced=True)


def test_force_moves_earlier_rather_than_split_a_call_from_its_results() -> None:
    calls = [m.ToolCallPart(f"p{i}", "read_file", "{}") for i in range(3)]
    msgs = [
        m.user("go"),
        m.assistant("", tool_calls=calls),
        *(m.tool_result(c.id, c.name, "ok") for c in calls),
    ]
    # The last two messages are two results of one call group: keep the whole group.
    cut = find_cut_point(msgs, keep_tokens=10_000, count=count, force=True)
    assert cut == CutPoint(1, forced=True)
    # When even that would summarize nothing, keep nothing rather than split the group.
    cut = find_cut_point(msgs[1:], keep_tokens=10_000, count=count, force=True)
    assert cut == CutPoint(4, forced=True)


def test_the_previous_summary_is_never_kept_alone() -> None:
    msgs = [previous_summary(), *turn("one", 1, size=500)]
    cut = find_cut_point(msgs, keep_tokens=10, count=count)
    assert cut is not None and cut.index >= 2  # something besides the summary is summarized
    assert find_cut_point([previous_summary()], keep_tokens=1, count=count, force=True) is None
    only_summary = plan_compaction(
        [previous_summary()], trigger="manual", keep_tokens=1, count=count, config=CONFIG, force=True
    )
    assert isinstance(only_summary, NothingToCompact)


def test_a_long_turn_is_split_and_its_beginning_reported() -> None:
    msgs = turn("old", 1) + turn("long", 10)  # "long" is 22 messages
    cut = find_cut_point(msgs, keep_tokens=800, count=count)
    assert cut is not None and cut.split_turn_start == 4
    assert msgs[cut.index].role == "assistant"
    assert cut.index - 4 >= CONFIG.split_turn_min_messages
    assert tokens_of(msgs[cut.index + 1 :]) <= 800


def test_a_short_turn_beginning_is_summarized_with_the_history() -> None:
    msgs = turn("old", 1) + turn("short", 3, size=400)
    keep = tokens_of(msgs[7:]) + 1  # the crossing is the first tool result of turn "short"
    cut = find_cut_point(msgs, keep_tokens=keep, count=count)
    assert cut == CutPoint(7)  # the next assistant step: 3 messages of the turn are summarized
    plan = plan_of(msgs, keep)
    assert [r.kind for r in plan.requests] == ["history"]
    assert plan.turn_prefix == []


# ---------------------------------------------------------------------------------------------------
# The summarizer requests (5.4)


def test_history_request_isolates_the_summarizer_and_wraps_the_transcript() -> None:
    msgs = turn("fix the parser", 2) + turn("now the lexer", 2)
    plan = plan_of(msgs, 700)
    assert [x.id for x in plan.summarized + plan.kept] == [x.id for x in msgs]
    [request] = plan.requests
    assert request.kind == "history"
    assert request.max_tokens == CONFIG.summary_max_output_tokens
    assert "Never continue the conversation" in request.system
    assert "never call tools" in request.system
    body = request.prompt
    assert "Do NOT continue the conversation" in body
    assert body.index("<conversation>") < body.index("fix the parser") < body.index("</conversation>")
    assert "now the lexer" not in body  # the kept turn is not summarized
    for heading in (
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "### Done",
        "### In Progress",
        "### Blocked",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
    ):
        assert heading in body[body.index("</conversation>") :]


def test_tool_results_are_clipped_head_and_tail_in_the_summarizer_input() -> None:
    output = "HEAD-MARK " + "m" * 50_000 + " TAIL-MARK"
    call = m.ToolCallPart("c1", "read_file", '{"path": "big.txt"}')
    msgs = [m.user("read it"), m.assistant("", tool_calls=[call]), m.tool_result("c1", "read_file", output)]
    msgs += turn("next", 0, size=50)
    plan = plan_of(msgs, 100)
    prompt = plan.requests[0].prompt
    assert "HEAD-MARK" in prompt and "TAIL-MARK" in prompt
    assert "chars omitted" in prompt
    assert len(prompt) < 2_000 + 5_000


def test_update_prompt_merges_into_the_previous_summary() -> None:
    msgs = [previous_summary("## Goal\nShip v2", read=["a.py"]), *turn("one", 2), *turn("two", 2)]
    plan = plan_of(msgs, 700)
    assert plan.previous_summary is msgs[0]
    [request] = plan.requests
    assert request.kind == "update"
    prompt = request.prompt
    assert "<previous-summary>\n## Goal\nShip v2\n</previous-summary>" in prompt
    assert SUMMARY_PREFIX not in prompt  # the previous summary is not re-summarized as conversation
    assert "merges the new messages into the previous summary" in prompt
    assert "a.py" in plan.file_ops.read


def test_manual_focus_instructions_reach_the_prompt() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, trigger="manual", instructions="the database migration")
    assert "focus" in plan.requests[0].prompt
    assert "the database migration" in plan.requests[0].prompt
    assert "the database migration" not in plan_of(msgs, 700).requests[0].prompt


def test_a_history_three_times_the_summarizer_window_still_fits() -> None:
    counter = TokenCounter("gpt-4o")  # what the usage tracker hands the compactor: exact tiktoken counts
    window = 8_000
    msgs: list[m.Message] = []
    i = 0
    while counter.count_messages(msgs) < 3 * window:
        msgs += turn(f"request {i}", 1, size=150, tag=f"t{i}")
        i += 1
    msgs += turn("latest", 0, size=10)
    plan = plan_compaction(
        msgs,
        trigger="threshold",
        keep_tokens=50,
        count=counter.count_message,
        config=CONFIG,
        summarizer_window=window,
        count_text=counter.count_text,
    )
    assert isinstance(plan, CompactionPlan)
    [request] = plan.requests
    sent = [m.system(request.system), m.user(request.prompt)]
    assert counter.count_messages(sent) + request.max_tokens <= window
    assert counter.count_messages(sent) > window // 2  # and the window is used, not wasted
    assert request.max_tokens == window // 4
    assert request.omitted > 0
    assert f"the {request.omitted} oldest messages of this span were left out" in request.prompt
    assert f"request {i - 1}" in request.prompt  # the newest summarized turn is there
    assert "request 0 " not in request.prompt  # the oldest were dropped


def test_a_single_message_bigger_than_the_summarizer_window_is_clipped_to_fit() -> None:
    def count_text(text: str) -> int:
        return len(text) // 4 + 1

    msgs = [m.user("HEAD " + "q" * 200_000 + " TAIL"), *turn("next", 0, size=10)]
    plan = plan_of(msgs, 50, summarizer_window=4_000, count_text=count_text)
    [request] = plan.requests
    assert count_text(request.system) + count_text(request.prompt) + request.max_tokens <= 4_000
    assert "HEAD" in request.prompt and "TAIL" in request.prompt


def test_a_summarizer_window_too_small_for_the_instructions_means_fallback() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, summarizer_window=300, count_text=lambda t: len(t) // 4)
    assert plan.requests == []
    result = finish_compaction(plan, [], count=count)
    assert isinstance(result, CompactionResult) and result.fallback


# ---------------------------------------------------------------------------------------------------
# Finishing: summary message, split turns, fallback (5.3, 5.5, 5.7)


def test_finish_builds_the_summary_message_and_new_context() -> None:
    msgs = turn("one", 2, reads=("src/a.py", "src/b.py")) + turn("two", 2)
    plan = plan_of(msgs, 700)
    answer = "## Goal\nFix the parser\n\n<read-files>\nmade/up.py\n</read-files>"
    result = finish_compaction(plan, [answer], count=count)
    assert isinstance(result, CompactionResult)
    summary = result.summary
    assert summary.role == "user" and summary.kind == m.KIND_COMPACTION_SUMMARY
    assert summary.text.startswith(SUMMARY_PREFIX + "\n\n## Goal\nFix the parser")
    assert "made/up.py" not in summary.text  # the model's own file list is replaced by the tracked one
    assert summary.text.endswith("<read-files>\nsrc/a.py\nsrc/b.py\n</read-files>")
    assert summary.metadata == {"read_files": ["src/a.py", "src/b.py"], "modified_files": []}
    assert result.messages == [summary, *msgs[6:]]
    assert result.first_kept_id == msgs[6].id
    assert result.messages_before == 12 and result.messages_after == 7
    assert result.summarized_count == 6
    assert result.tokens_before == tokens_of(msgs)
    assert result.tokens_after == tokens_of(result.messages)
    assert result.summary_chars == len(summary.text)
    assert not result.fallback


def test_tokens_after_is_relative_to_the_callers_estimate() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700)
    estimate = tokens_of(msgs) + 300  # includes what the messages do not: system prompt, tools
    result = finish_compaction(plan, ["## Goal\nx"], count=count, tokens_before=estimate)
    assert isinstance(result, CompactionResult)
    assert result.tokens_after == estimate - tokens_of(plan.summarized) + count(result.summary)


def test_split_turn_makes_two_requests_and_joins_the_summaries() -> None:
    msgs = turn("old", 1) + turn("long", 10)
    plan = plan_of(msgs, 800)
    assert plan.cut is not None and plan.cut.split_turn_start == 4
    assert [r.kind for r in plan.requests] == ["history", "turn_prefix"]
    history, prefix = plan.requests
    assert "old" in history.prompt and "long" not in history.prompt
    assert "BEGINNING of a turn" in prefix.prompt and "long" in prefix.prompt
    assert prefix.max_tokens == history.max_tokens // 2
    result = finish_compaction(plan, ["## Goal\nHISTORY", "## Original Request\nPREFIX"], count=count)
    assert isinstance(result, CompactionResult)
    text = result.summary.text
    assert text.index("HISTORY") < text.index(SPLIT_TURN_HEADING) < text.index("PREFIX")
    assert result.messages[1:] == plan.kept and plan.kept[0].role == "assistant"


def test_the_sessions_own_model_summarizes_the_conversation_itself_to_ride_its_cache() -> None:
    """With ``cached_prefix`` (the summarizer is the session's model), a request sends the summarized
    messages as they are (the prefix the provider cached), then one instruction; no transcript."""
    msgs = turn("fix the parser", 2) + turn("now the lexer", 2)
    plan = plan_of(msgs, 700, cached_prefix=500)
    [request] = plan.requests
    assert request.kind == "history" and request.prefix == len(plan.summarized) and request.system == ""
    assert request.prompt.startswith("<summary-request>") and "<conversation>" not in request.prompt
    assert "fix the parser" not in request.prompt  # the conversation goes as messages, not as text
    assert "Do not answer the user" in request.prompt and "do not call tools" in request.prompt
    assert "## Goal" in request.prompt and request.max_tokens == CONFIG.summary_max_output_tokens
    # with a previous summary: one updated summary; a split turn: both parts ride the same prefix
    updated = plan_of([previous_summary(), *msgs], 700, cached_prefix=500).requests[0]
    assert updated.kind == "update" and "begins with a summary" in updated.prompt
    split = plan_of(turn("old", 1) + turn("long", 10), 800, cached_prefix=500)
    history, prefix = split.requests
    assert (history.prefix, prefix.prefix) == (len(split.history), len(split.summarized))
    assert "BEGINNING of a turn" in prefix.prompt and prefix.max_tokens == history.max_tokens // 2


def test_a_conversation_too_big_for_the_summarizers_window_goes_as_a_transcript() -> None:
    msgs = turn("fix the parser", 2, size=3_000) + turn("now the lexer", 2)
    small = plan_of(msgs, 700, cached_prefix=500, summarizer_window=8_000)
    assert small.requests[0].prefix == 0 and "<conversation>" in small.requests[0].prompt
    roomy = plan_of(msgs, 700, cached_prefix=500, summarizer_window=64_000)
    assert roomy.requests[0].prefix == len(roomy.summarized)


def test_the_summarizer_s_request_fits_the_window_as_its_server_counts() -> None:
    """A server that counts 1.5 × ours (the session's learned ratio, design §4.5): the conversation that
    rides the cache at our count goes as a transcript, clipped so that the server's count of it, the answer
    and the margin fit; at our count it is as it was."""
    counter = TokenCounter("gpt-4o")
    window = 8_000
    msgs: list[m.Message] = []
    i = 0
    while counter.count_messages(msgs) < window // 2:
        msgs += turn(f"request {i}", 1, size=150, tag=f"t{i}")
        i += 1
    msgs += turn("latest", 0, size=10)

    def plan(ratio: float) -> CompactionPlan:
        planned = plan_compaction(
            msgs,
            trigger="threshold",
            keep_tokens=50,
            count=counter.count_message,
            config=CONFIG,
            summarizer_window=window,
            count_text=counter.count_text,
            cached_prefix=0,
            count_ratio=ratio,
        )
        assert isinstance(planned, CompactionPlan)
        return planned

    [ours] = plan(1.0).requests
    assert ours.prefix > 0  # rides the cache: the conversation itself
    [request] = plan(1.5).requests
    assert request.prefix == 0 and request.omitted > 0  # a transcript without its oldest messages
    counted = counter.count_messages([m.system(request.system), m.user(request.prompt)])
    assert 1.5 * counted + request.max_tokens <= window
    assert 1.5 * counted + request.max_tokens > window - 500  # and the window is used, not wasted
    assert request.max_tokens == ours.max_tokens == window // 4  # the summary's room is not what shrank


def test_split_turn_without_a_summarizer_falls_back_for_each_part() -> None:
    msgs = turn("old", 1) + turn("long", 10)
    plan = plan_of(msgs, 800)
    result = finish_compaction(plan, [None, "## Original Request\nPREFIX"], count=count)
    assert isinstance(result, CompactionResult) and result.fallback
    text = result.summary.text
    assert "[Compacted 4 messages: 1 user, 2 assistant, 1 tool results]" in text
    assert "PREFIX" in text
    both = finish_compaction(plan, [None, None], count=count)
    assert isinstance(both, CompactionResult)
    assert both.summary.text.count("[Compacted") == 2


def test_split_turn_at_the_start_has_only_a_turn_prefix_request() -> None:
    msgs = turn("long", 12)
    plan = plan_of(msgs, 800)
    assert [r.kind for r in plan.requests] == ["turn_prefix"]
    result = finish_compaction(plan, ["## Original Request\nP"], count=count)
    assert isinstance(result, CompactionResult)
    assert SPLIT_TURN_HEADING in result.summary.text


def test_split_turn_after_a_previous_summary_carries_it_over() -> None:
    msgs = [previous_summary("## Goal\nCARRIED"), *turn("long", 12)]
    plan = plan_of(msgs, 800)
    assert [r.kind for r in plan.requests] == ["turn_prefix"]
    result = finish_compaction(plan, ["## Original Request\nP"], count=count)
    assert isinstance(result, CompactionResult)
    text = result.summary.text
    assert text.index("CARRIED") < text.index(SPLIT_TURN_HEADING)


@pytest.mark.parametrize("answer", [None, "", "  \n "])
def test_fallback_summary_when_the_summarizer_fails(answer: str | None) -> None:
    msgs = [
        *turn("first task", 1, reads=("src/x.py",)),
        m.user("please edit"),
        m.assistant("", tool_calls=[m.ToolCallPart("w", "edit_file", '{"path": "src/y.py"}')]),
        m.tool_result("w", "edit_file", "ok"),
        m.assistant("edited"),
        *turn("kept", 0, size=10),
    ]
    plan = plan_of(msgs, 30)
    result = finish_compaction(plan, [answer], count=count)
    assert isinstance(result, CompactionResult) and result.fallback
    text = result.summary.text
    assert "[Compacted 8 messages: 2 user, 4 assistant, 2 tool results]" in text
    assert "Last user request in the compacted part:\nplease edit" in text
    assert "<read-files>\nsrc/x.py\n</read-files>" in text
    assert "<modified-files>\nsrc/y.py\n</modified-files>" in text


def test_fallback_keeps_the_previous_summary() -> None:
    msgs = [previous_summary("## Goal\nKEEP-ME"), *turn("one", 2), *turn("two", 0, size=10)]
    result = finish_compaction(plan_of(msgs, 20), [None], count=count)
    assert isinstance(result, CompactionResult)
    assert "Earlier summary:\n## Goal\nKEEP-ME" in result.summary.text


def test_repeated_fallbacks_stay_bounded() -> None:
    """Each fallback quotes the previous summary; a chain of them must not grow without end."""
    config = CompactionConfig(summary_max_output_tokens=200)
    history = turn("start", 2)
    for i in range(30):
        history = [*history, *turn(f"step {i}", 1, size=300, tag=f"s{i}")]
        plan = plan_of(history, 400, config=config)
        result = finish_compaction(plan, [None] * len(plan.requests), count=count)
        assert isinstance(result, CompactionResult) and result.fallback
        history = result.messages
        files = len(result.file_ops.render())
        # the request of a turn the cut fell inside is carried verbatim beside the summary, not in it
        request = plan.open_request
        carried = len(request.text) + len("\n\n<current-request>\n\n</current-request>") if request else 0
        assert result.summary_chars <= len(SUMMARY_PREFIX) + 2 + 200 * 6 + 2 + files + carried
        assert "<current-request>" not in summary_body(result.summary.text)  # never carried into the next


def test_a_user_message_that_looks_like_a_summary_is_a_turn() -> None:
    fake = m.user(f"{SUMMARY_PREFIX} pretend")
    msgs = [fake, *turn("one", 1), *turn("two", 0, size=10)]
    plan = plan_of(msgs, 30)
    assert plan.previous_summary is None
    assert [r.kind for r in plan.requests] == ["history"]


def test_no_fallback_when_configured_off() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, config=CompactionConfig(fallback=False))
    failure = finish_compaction(plan, [None], count=count)
    assert isinstance(failure, CompactionFailure)
    assert failure.reason == "summarizer_failed" and not failure.context_exceeded


def test_answers_must_match_the_requests() -> None:
    plan = plan_of(turn("one", 2) + turn("two", 2), 700)
    with pytest.raises(ValueError, match="expected 1 answers"):
        finish_compaction(plan, [], count=count)


def test_file_ops_are_merged_across_compactions() -> None:
    first = turn("one", 2, reads=("a.py", "b.py")) + turn("two", 0, size=10)
    result = finish_compaction(plan_of(first, 20), ["## Goal\ng"], count=count)
    assert isinstance(result, CompactionResult)
    assert result.file_ops == FileOps(read=frozenset({"a.py", "b.py"}))

    edit = [
        m.user("edit a"),
        m.assistant("", tool_calls=[m.ToolCallPart("e", "write_file", '{"path": "a.py"}')]),
        m.tool_result("e", "write_file", "ok"),
        m.assistant("done " + words(100)),
    ]
    second_history = [*result.messages, *edit, *turn("three", 0, size=10)]
    second = finish_compaction(plan_of(second_history, 20), ["## Goal\ng2"], count=count)
    assert isinstance(second, CompactionResult)
    assert second.summary.metadata == {"read_files": ["b.py"], "modified_files": ["a.py"]}
    assert second.summary.text.endswith(
        "<read-files>\nb.py\n</read-files>\n\n<modified-files>\na.py\n</modified-files>"
    )


def test_hidden_messages_cost_nothing_and_stay_out_of_the_transcript() -> None:
    hidden = m.tool_result("gone", "read_file", "SECRET-ARCHIVED " + words(5_000), agent_visible=False)
    msgs = [*turn("one", 2), hidden, *turn("two", 2)]
    plan = plan_of(msgs, 700)
    assert "SECRET-ARCHIVED" not in plan.requests[0].prompt
    assert hidden in plan.summarized
    result = finish_compaction(plan, ["## Goal\nx"], count=count)
    assert isinstance(result, CompactionResult)
    assert result.tokens_before == tokens_of(msgs)


# ---------------------------------------------------------------------------------------------------
# The progress guard (5.6)


def test_a_summary_as_long_as_the_history_is_refused() -> None:
    msgs = turn("one", 2) + turn("two", 0, size=10)
    plan = plan_of(msgs, 20)
    as_long = "\n".join(x.text for x in plan.summarized)
    failure = finish_compaction(plan, [as_long], count=count)
    assert isinstance(failure, CompactionFailure)
    assert failure.reason == "no_progress"
    assert failure.tokens_after is not None and failure.tokens_after > 0.9 * failure.tokens_before
    assert "discarded" in failure.message


def test_repeated_compaction_terminates() -> None:
    """A driver that compacts while it can, with a summarizer that echoes its whole input: every success
    must shrink the context by 10%, so the loop ends (here: with the guard refusing)."""
    msgs = [x for i in range(12) for x in turn(f"t{i}", 2, tag=f"t{i}")]
    config = CompactionConfig(summary_max_output_tokens=100_000)
    outcomes: list[str] = []
    for _ in range(50):
        plan = plan_compaction(msgs, trigger="threshold", keep_tokens=700, count=count, config=config)
        if isinstance(plan, NothingToCompact):
            outcomes.append("nothing")
            break
        before = tokens_of(msgs)
        result = finish_compaction(plan, [r.prompt for r in plan.requests], count=count)
        if isinstance(result, CompactionFailure):
            outcomes.append(result.reason)
            break
        assert result.tokens_after <= 0.9 * before
        outcomes.append("compacted")
        msgs = result.messages
    assert outcomes[-1] in ("nothing", "no_progress")
    assert len(outcomes) < 50


def test_a_huge_answer_is_clipped_not_fatal() -> None:
    msgs = [x for i in range(40) for x in turn(f"t{i}", 2, size=2_000, tag=f"t{i}")]
    plan = plan_of(msgs, 5_000)
    result = finish_compaction(plan, ["## Goal\n" + "z" * 10_000_000], count=count)
    assert isinstance(result, CompactionResult)
    carried = OPEN_REQUEST_CHARS + 50  # the request of the turn the cut fell inside, clipped
    assert result.summary_chars < CONFIG.summary_max_output_tokens * 6 + 1_000 + carried


@pytest.mark.parametrize("room", [64, 300, 1_000, 5_000])
@pytest.mark.parametrize("answer_tokens", [10, 2_000, 50_000])
def test_the_summary_never_takes_more_than_the_room_the_kept_part_leaves(
    room: int, answer_tokens: int
) -> None:
    """With ``room`` (what the context leaves a summary and the kept part), the summarizer is asked for no
    more than the kept part leaves, a longer answer is clipped to it (head, tail and the file blocks
    kept), and the answer as written is handed back whole for the artifact."""
    msgs = [x for i in range(12) for x in turn(f"t{i}", 2, size=300, tag=f"t{i}")]
    kept = tokens_of(plan_of(msgs, 1_300).kept)
    plan = plan_of(msgs, 1_300, room=kept + room)
    assert plan.summary_tokens == max(room, 64)
    assert all(r.max_tokens <= plan.summary_tokens for r in plan.requests)
    answer = "## Goal\nHead of it.\n" + words(answer_tokens) + "\nTail of it."
    result = finish_compaction(plan, [answer], count=count, kept_at="/sessions/x.artifacts/summary.md")
    assert isinstance(result, CompactionResult)
    assert count(result.summary) <= plan.summary_tokens
    if result.unclipped_summary is None:  # it fitted as written
        assert answer in result.summary.text
    else:
        assert answer in result.unclipped_summary
        assert "all of it is in /sessions/x.artifacts/summary.md" in result.summary.text
        if plan.summary_tokens >= 200:
            assert "Head of it." in result.summary.text and "</read-files>" in result.summary.text


def test_without_a_room_the_summary_is_bounded_by_its_request_only() -> None:
    msgs = [x for i in range(12) for x in turn(f"t{i}", 2, size=300, tag=f"t{i}")]
    plan = plan_of(msgs, 1_300)
    assert plan.summary_tokens is None
    assert [r.max_tokens for r in plan.requests] == [CONFIG.summary_max_output_tokens]


# ---------------------------------------------------------------------------------------------------
# Modes (5.8)


def test_hard_reset_replaces_the_whole_history() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, mode="hard_reset")
    assert plan.kept == [] and plan.first_kept_id is None and plan.cut is None
    assert [r.kind for r in plan.requests] == ["history"]
    assert "two" in plan.requests[0].prompt
    result = finish_compaction(plan, ["## Goal\nall of it"], count=count)
    assert isinstance(result, CompactionResult)
    assert result.messages == [result.summary] and result.first_kept_id is None
    assert result.mode == "hard_reset"


def test_hard_reset_never_falls_back() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, mode="hard_reset")
    failure = finish_compaction(plan, [None], count=count, limit=100_000)
    assert isinstance(failure, CompactionFailure)
    assert failure.reason == "summarizer_failed" and not failure.context_exceeded
    assert "hard_reset mode has no fallback" in failure.message


def test_hard_reset_failure_over_the_limit_is_a_dead_session_with_a_clear_message() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, mode="hard_reset")
    failure = finish_compaction(plan, [None], count=count, tokens_before=9_000, limit=8_000)
    assert isinstance(failure, CompactionFailure)
    assert failure.context_exceeded and failure.reason == "summarizer_failed"
    assert failure.message.startswith("Context limit exceeded and compaction failed")
    assert "start a new session" in failure.message
    assert failure.mode == "hard_reset" and failure.tokens_before == 9_000


def test_truncate_needs_no_summarizer() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700, mode="truncate")
    assert plan.requests == []
    result = finish_compaction(plan, [], count=count)
    assert isinstance(result, CompactionResult)
    assert "[Compacted 6 messages: 1 user, 3 assistant, 2 tool results]" in result.summary.text
    assert not result.fallback and result.mode == "truncate"
    assert result.messages[1:] == msgs[6:]


def test_plans_and_results_encode_as_msgspec() -> None:
    msgs = turn("one", 2) + turn("two", 2)
    plan = plan_of(msgs, 700)
    result = finish_compaction(plan, ["## Goal\nx"], count=count)
    assert isinstance(result, CompactionResult)
    decoded = msgspec.json.decode(msgspec.json.encode(result), type=CompactionResult)
    assert decoded.summary == result.summary and decoded.file_ops == result.file_ops
