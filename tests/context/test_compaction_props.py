"""Property tests of compaction over random histories (design §5.2, 5.3, 5.6, 5.7).

Histories mix user turns, assistant steps with 0..3 tool calls and their results (in any order), tool
digests, archived (hidden) steps and a previous summary. For every one of them: the kept part starts at a
turn (or is a split turn's remainder, or the forced tail), no tool result is separated from its call, every
message is either kept or summarized, the new context neither duplicates nor loses a message, and every
request fits the summarizer's window.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import messages as m
from runtime.config import CompactionConfig
from runtime.context.compaction import (
    CompactionFailure,
    CompactionPlan,
    CompactionResult,
    NothingToCompact,
    finish_compaction,
    plan_compaction,
)
from runtime.context.cut import is_turn_start
from runtime.context.prompts import SUMMARY_PREFIX
from runtime.store.entries import decode_entries, encode_entry, new_header
from runtime.store.log import replay
from runtime.store.tree import SessionTree

CONFIG = CompactionConfig()
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[m.Message], dict[str, int]]:
    msgs: list[m.Message] = []
    if draw(st.booleans()):
        msgs.append(
            m.user(
                f"{SUMMARY_PREFIX}\n\n## Goal\nearlier",
                kind=m.KIND_COMPACTION_SUMMARY,
                metadata={"read_files": ["old.py"], "modified_files": []},
            )
        )
    call_no = 0
    for t in range(draw(st.integers(0, 7))):
        msgs.append(m.user(f"turn {t}"))
        for _ in range(draw(st.integers(0, 4))):
            calls = []
            for _ in range(draw(st.integers(0, 3))):
                call_no += 1
                tool = draw(st.sampled_from(["read_file", "write_file", "grep"]))
                calls.append(m.ToolCallPart(f"call{call_no}", tool, f'{{"path": "f{call_no % 5}.py"}}'))
            hidden = bool(calls) and draw(st.integers(0, 5)) == 0  # an archived step
            msgs.append(m.assistant("step", tool_calls=calls, agent_visible=not hidden))
            for call in draw(st.permutations(calls)):
                msgs.append(
                    m.tool_result(
                        call.id,
                        call.name,
                        "out",
                        is_error=draw(st.integers(0, 6)) == 0,
                        agent_visible=not hidden,
                    )
                )
            if calls and draw(st.integers(0, 6)) == 0:
                msgs.append(m.user("[digest]", kind=m.KIND_TOOL_SUMMARY, user_visible=False))
        if draw(st.booleans()):
            msgs.append(m.assistant("answer"))
    sizes = draw(st.lists(st.integers(1, 400), min_size=len(msgs), max_size=len(msgs)))
    return msgs, {msg.id: size for msg, size in zip(msgs, sizes)}


def valid_cut(msgs: list[m.Message], i: int) -> bool:
    """The oracle, written independently: the kept part may start at ``i``."""
    if i == len(msgs):
        return True
    if msgs[i].role == "tool":
        return False
    calls_before = {c.id for x in msgs[:i] if x.role == "assistant" for c in x.tool_calls}
    return not any(x.role == "tool" and x.tool_call_id in calls_before for x in msgs[i:])


def check_plan(msgs: list[m.Message], plan: CompactionPlan, keep: int, tokens: dict[str, int]) -> None:
    kept, summarized = plan.kept, plan.summarized
    # Every message is summarized or kept, in order.
    assert [x.id for x in summarized + kept] == [x.id for x in msgs]
    assert plan.cut is not None
    cut = plan.cut.index
    # No tool result is separated from its call (and nothing kept begins with a result).
    assert valid_cut(msgs, cut)
    # Something besides a previous summary is summarized; the previous summary is never kept.
    assert any(x.kind != m.KIND_COMPACTION_SUMMARY for x in summarized)
    assert all(x.kind != m.KIND_COMPACTION_SUMMARY for x in kept)
    if plan.cut.forced:
        return
    assert kept
    if not is_turn_start(kept[0]):
        # Only inside the newest turn: a turn start at or after the crossing would have been taken.
        assert not any(is_turn_start(x) for x in kept)
    if plan.cut.split_turn_start is not None:
        start = plan.cut.split_turn_start
        assert is_turn_start(msgs[start])
        assert cut - start >= CONFIG.split_turn_min_messages
        assert not any(is_turn_start(x) for x in msgs[start + 1 : cut])
        assert plan.turn_prefix == msgs[start:cut]
        assert [r.kind for r in plan.requests][-1] == "turn_prefix"
    # Keep the newest `keep` tokens: the kept part beyond its first message fits the budget, unless no
    # later cut was possible.
    tail = sum(tokens[x.id] for x in kept[1:] if x.agent_visible)
    later_cuts = [i for i in range(cut + 1, len(msgs)) if valid_cut(msgs, i)]
    assert tail <= keep or not later_cuts


@PROPS
@given(history=histories(), keep=st.integers(1, 2_500), force=st.booleans(), data=st.data())
def test_any_history_compacts_consistently(
    history: tuple[list[m.Message], dict[str, int]], keep: int, force: bool, data: st.DataObject
) -> None:
    msgs, tokens = history

    def count(msg: m.Message) -> int:
        return tokens.get(msg.id, len(msg.text) // 4 + 1)

    plan = plan_compaction(
        msgs, trigger="threshold", keep_tokens=keep, count=count, config=CONFIG, force=force
    )
    if isinstance(plan, NothingToCompact):
        content = [i for i, x in enumerate(msgs) if x.kind != m.KIND_COMPACTION_SUMMARY]
        if force:  # forced and still nothing: only previous summaries (or nothing at all) to summarize
            assert not content
        else:  # everything fits, or no cut would summarize anything
            total = sum(tokens[x.id] for x in msgs if x.agent_visible)
            cuts = [i for i in range(content[0] + 1, len(msgs)) if valid_cut(msgs, i)] if content else []
            assert total <= keep or not cuts
        return
    check_plan(msgs, plan, keep, tokens)

    answers = [data.draw(st.one_of(st.none(), st.text(min_size=0, max_size=300))) for _ in plan.requests]
    result = finish_compaction(plan, answers, count=count)
    if isinstance(result, CompactionFailure):
        assert result.reason == "no_progress"
        assert result.tokens_after is not None and result.tokens_after > 0.9 * result.tokens_before
        return
    assert isinstance(result, CompactionResult)
    assert result.tokens_after <= 0.9 * result.tokens_before
    summary = result.summary
    assert summary.kind == m.KIND_COMPACTION_SUMMARY and summary.text.startswith(SUMMARY_PREFIX)
    assert not set(summary.metadata["read_files"]) & set(summary.metadata["modified_files"])
    ids = [x.id for x in result.messages]
    assert len(ids) == len(set(ids))
    assert set(ids) - {summary.id} == {x.id for x in plan.kept}
    # Record it as the store does, write the log, and read it back as a restarted store would: the log
    # keeps every original message, and the model's view computed from it is the summary followed by the
    # kept part — what the compaction reported, and worth the tokens it reported.
    tree = SessionTree(new_header("props", model="m"))
    for x in msgs:
        tree.append(x)
    tree.record_compaction(
        summary,
        result.first_kept_id,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        mode=result.mode,
        trigger=result.trigger,
    )
    reread = replay("props.jsonl", decode_entries(b"".join(encode_entry(e) for e in tree.entries())))
    for store in (tree, reread):
        context = store.context()
        assert [x.id for x in context] == [x.id for x in result.messages if x.agent_visible]
        assert sum(count(x) for x in context) == result.tokens_after
        assert store.usage_floor == len(context)  # nothing appended since the compaction
        assert [x.id for x in store.messages()] == [*(x.id for x in msgs), summary.id]  # nothing lost


@PROPS
@given(
    history=histories(),
    window=st.integers(1_500, 12_000),
    bloat=st.integers(0, 3),
    mode=st.sampled_from(["summarize", "hard_reset"]),
    ratio=st.sampled_from([1.0, 1.25, 1.6, 2.0]),
)
def test_every_request_fits_the_summarizer_window(
    history: tuple[list[m.Message], dict[str, int]], window: int, bloat: int, mode: str, ratio: float
) -> None:
    """Every request fits the summarizer's window as its server counts it: ``ratio`` × ours (design §4.5)."""
    msgs, _ = history
    # Make some messages big enough that the span is several times the window.
    big = "lorem ipsum dolor " * (2_000 * bloat)
    msgs = [m.user(x.text + big, kind=x.kind) if x.role == "user" and x.kind is None else x for x in msgs]

    def count_text(text: str) -> int:
        return len(text) // 3 + 1

    def count(msg: m.Message) -> int:  # like a real counter: text, tool calls, framing
        return count_text(msg.text) + sum(count_text(c.name + c.arguments) for c in msg.tool_calls) + 3

    plan = plan_compaction(
        msgs,
        trigger="manual",
        mode=mode,  # type: ignore[arg-type]
        keep_tokens=200,
        count=count,
        config=CONFIG,
        force=True,
        summarizer_window=window,
        count_text=count_text,
        count_ratio=ratio,
    )
    if isinstance(plan, NothingToCompact):
        return
    for request in plan.requests:
        server = ratio * (count_text(request.system) + count_text(request.prompt))
        assert server + request.max_tokens <= window
        assert "<conversation>" in request.prompt
