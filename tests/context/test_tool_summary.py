"""Tool-result archiving, tool summaries and old-output clearing (design §5.9)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import pytest

from runtime import messages as m
from runtime.config import CompactionConfig
from runtime.context.prompts import TOOL_SUMMARY_PREFIX
from runtime.context.tool_summary import (
    archive_bounds,
    finish_tool_archive,
    plan_tool_archive,
    plan_tool_output_clearing,
)


def tool_steps(
    n: int, *, output: str = "result line\n" * 20, calls_per_step: int = 1, tag: str = "c"
) -> list[m.Message]:
    """A user message, then ``n`` assistant steps with their tool results (call ids ``{tag}{step}-{j}``)."""
    history = [m.user("go")]
    for i in range(n):
        calls = [
            m.ToolCallPart(f"{tag}{i}-{j}", "read_file", f'{{"path": "f{i}-{j}.py"}}')
            for j in range(calls_per_step)
        ]
        history.append(m.assistant(f"step {i}", tool_calls=calls))
        history += [m.tool_result(c.id, c.name, f"output of {c.id}\n{output}") for c in calls]
    return history


def apply(
    history: Sequence[m.Message], replacements: list[m.Message], appended: m.Message
) -> list[m.Message]:
    """What the store does: replace messages by id, append the summary."""
    by_id = {r.id: r for r in replacements}
    return [by_id.get(msg.id, msg) for msg in history] + [appended]


def visible_results(history: Sequence[m.Message]) -> list[m.Message]:
    return [msg for msg in history if msg.role == "tool" and msg.agent_visible]


def assert_every_visible_call_has_a_visible_result(history: Sequence[m.Message]) -> None:
    sent = m.to_openai(history)
    answered = {d["tool_call_id"] for d in sent if d["role"] == "tool"}
    asked = {c["id"] for d in sent if d["role"] == "assistant" for c in d.get("tool_calls", [])}
    assert asked == answered


def test_nothing_to_archive_at_or_below_the_cutoff_or_when_off() -> None:
    assert plan_tool_archive(tool_steps(10), cutoff=10, strategy="llm") is None
    assert plan_tool_archive(tool_steps(30), cutoff=10, strategy="off") is None


def test_an_archive_waits_until_it_frees_what_breaking_the_cache_costs() -> None:
    """Where the provider caches, an archive (which rewrites the conversation from its oldest step on) must
    free at least ``min_freed`` tokens: over the cutoff by a step or two is not enough, many steps are."""
    from runtime.tokens import TokenCounter

    count = TokenCounter("openai/gpt-4o").count_message
    few, many = tool_steps(13), tool_steps(30)
    assert plan_tool_archive(few, cutoff=10, strategy="heuristic") is not None
    assert plan_tool_archive(few, cutoff=10, strategy="heuristic", min_freed=1_000, count=count) is None
    plan = plan_tool_archive(many, cutoff=10, strategy="heuristic", min_freed=1_000, count=count)
    assert plan is not None and plan.results == 20
    assert sum(count(msg) for msg in plan.archived) >= 1_000


def test_with_a_cache_an_archive_is_made_only_in_the_first_half_of_the_way_to_the_compaction() -> None:
    """design §5.9: while the provider caches, an archive must free a quarter of the window and is not made
    once the context is half way to the compaction threshold (the compaction near it sheds the same results
    from the cached prefix); a configured minimum, no cache or no automatic compaction: no such bound."""
    auto = CompactionConfig()
    assert archive_bounds(32_000, auto, caching=True) == (8_000, 11_200)  # threshold 22,400
    assert archive_bounds(128_000, auto, caching=True) == (32_000, 44_800)
    assert archive_bounds(32_000, auto, caching=False) == (0, None)
    assert archive_bounds(32_000, CompactionConfig(archive_min_freed_tokens=0), caching=True) == (0, None)
    assert archive_bounds(32_000, CompactionConfig(auto=False), caching=True) == (8_000, None)
    history = tool_steps(30)
    plan = partial(plan_tool_archive, history, cutoff=10, strategy="heuristic")
    assert plan(tokens=11_199, below=11_200) is not None
    assert plan(tokens=11_200, below=11_200) is None
    assert plan(tokens=10**6, below=None) is not None


def test_oldest_steps_are_archived_down_to_the_cutoff() -> None:
    history = tool_steps(13)
    plan = plan_tool_archive(history, cutoff=10, strategy="heuristic")
    assert plan is not None and plan.results == 3
    replacements, summary = finish_tool_archive(plan)
    after = apply(history, replacements, summary)

    assert len(visible_results(after)) == 10
    archived = [msg for msg in after if msg.kind == m.KIND_TOOL_RESULT_ARCHIVED]
    assert [msg.tool_call_id for msg in archived] == ["c0-0", "c1-0", "c2-0"]
    # Archived results stay in the record for the user, hidden from the model; ids are unchanged.
    assert all(msg.user_visible and not msg.agent_visible for msg in archived)
    assert {r.id for r in replacements} <= {msg.id for msg in history}
    # The calls that made them are hidden with them, so the provider never sees a call without its result.
    assert [msg.kind for msg in after[1:3]] == [m.KIND_TOOL_CALL_ARCHIVED, m.KIND_TOOL_RESULT_ARCHIVED]
    assert_every_visible_call_has_a_visible_result(after)

    assert summary.role == "user" and summary.kind == m.KIND_TOOL_SUMMARY
    assert summary.agent_visible and not summary.user_visible
    assert summary.text.startswith(TOOL_SUMMARY_PREFIX)
    assert "3 older tool results archived" in summary.text
    assert summary.metadata["strategy"] == "heuristic" and summary.metadata["archived_results"] == 3


def test_a_step_is_archived_whole_and_the_newest_step_never() -> None:
    history = tool_steps(3, calls_per_step=4)  # 12 results in 3 steps
    plan = plan_tool_archive(history, cutoff=10, strategy="heuristic")
    assert plan is not None and plan.results == 4  # excess 2, but the first step has 4 results
    replacements, summary = finish_tool_archive(plan)
    assert_every_visible_call_has_a_visible_result(apply(history, replacements, summary))

    one_big_step = tool_steps(1, calls_per_step=15)
    assert plan_tool_archive(one_big_step, cutoff=10, strategy="heuristic") is None


def test_llm_strategy_request_input_and_output_limits() -> None:
    history = tool_steps(40, output="x" * 5_000)
    plan = plan_tool_archive(history, cutoff=10, strategy="llm", input_chars=12_000, output_chars=1_200)
    assert plan is not None and plan.request is not None
    request = plan.request
    assert request.kind == "tool_summary" and request.max_tokens > 0
    start = request.prompt.index("<tool-results>\n") + len("<tool-results>\n")
    digest = request.prompt[start : request.prompt.index("\n</tool-results>")]
    assert len(digest) <= 12_000
    assert "read_file" in digest and "c0-0" in digest
    assert "never call tools" in request.system

    _, summary = finish_tool_archive(plan, "- read 30 files\n" + "detail " * 1_000)
    body = summary.text[len(TOOL_SUMMARY_PREFIX) + 1 :]
    assert len(body) <= 1_200
    assert body.startswith("- read 30 files")
    assert summary.metadata["strategy"] == "llm"


@pytest.mark.parametrize("answer", [None, "", "   "])
def test_llm_strategy_falls_back_to_the_heuristic_summary(answer: str | None) -> None:
    history = tool_steps(12)
    plan = plan_tool_archive(history, cutoff=10, strategy="llm")
    assert plan is not None
    _, summary = finish_tool_archive(plan, answer)
    assert summary.metadata["strategy"] == "heuristic"
    assert summary.text == f"{TOOL_SUMMARY_PREFIX}\n{plan.heuristic}"


def test_heuristic_summary_is_clipped_head_and_tail() -> None:
    history = tool_steps(60)
    plan = plan_tool_archive(history, cutoff=10, strategy="heuristic", heuristic_chars=800)
    assert plan is not None
    assert len(plan.heuristic) <= 800
    assert plan.heuristic.startswith("50 older tool results archived")
    assert "omitted" in plan.heuristic
    # Head and tail: the first and the last archived results are both there.
    assert "output of c0-0" in plan.heuristic
    assert plan.heuristic.endswith('- read_file({"path": "f49-0.py"}) [ok, 256 chars]: output of c49-0')


def test_earlier_tool_summaries_are_folded_into_the_new_one() -> None:
    history = tool_steps(12)
    plan = plan_tool_archive(history, cutoff=10, strategy="heuristic")
    assert plan is not None
    replacements, first = finish_tool_archive(plan)
    history = apply(history, replacements, first) + tool_steps(3, tag="later")

    plan = plan_tool_archive(history, cutoff=10, strategy="llm")
    assert plan is not None
    assert [msg.id for msg in plan.retired] == [first.id]
    assert plan.request is not None and "Summary of earlier tool results" in plan.request.prompt
    replacements, second = finish_tool_archive(plan, None)
    after = apply(history, replacements, second)
    summaries = [msg for msg in after if msg.kind == m.KIND_TOOL_SUMMARY and msg.agent_visible]
    assert summaries == [second]
    assert "older tool results archived" in second.text
    assert_every_visible_call_has_a_visible_result(after)


def count(msg: m.Message) -> int:
    return len(msg.text) // 4 + 4


def test_clearing_protects_the_newest_tool_tokens_and_needs_enough_freed() -> None:
    # 30 results of ~2,500 tokens each.
    history = tool_steps(30, output="y" * 10_000)
    plan = plan_tool_output_clearing(history, count=count, protect_tokens=40_000, min_freed=20_000)
    assert plan is not None
    cleared_ids = {r.id for r in plan.replacements}
    results = visible_results(history)
    protected = [r for r in results if r.id not in cleared_ids]
    assert sum(count(r) for r in protected) <= 40_000
    assert protected == results[-len(protected) :]  # the newest ones
    assert len(protected) == 40_000 // count(results[-1])
    for r in plan.replacements:
        assert r.kind == m.KIND_TOOL_OUTPUT_CLEARED and r.agent_visible
        assert "cleared" in r.text and len(r.text) < 200
        assert r.metadata["cleared_chars"] > 10_000
    freed = sum(count(r) for r in results if r.id in cleared_ids) - sum(count(r) for r in plan.replacements)
    assert plan.tokens_freed == freed

    assert plan_tool_output_clearing(history, count=count, protect_tokens=40_000, min_freed=10**9) is None
    small = tool_steps(5, output="y" * 10_000)
    assert plan_tool_output_clearing(small, count=count, protect_tokens=40_000, min_freed=0) is None


def test_clearing_never_touches_the_newest_step_or_cleared_outputs() -> None:
    history = tool_steps(3, output="z" * 400_000)  # each result alone is over the protection
    plan = plan_tool_output_clearing(history, count=count, protect_tokens=40_000, min_freed=1)
    assert plan is not None
    assert [r.tool_call_id for r in plan.replacements] == ["c0-0", "c1-0"]
    by_id = {r.id: r for r in plan.replacements}
    again = [by_id.get(msg.id, msg) for msg in history]
    assert plan_tool_output_clearing(again, count=count, protect_tokens=40_000, min_freed=1) is None
