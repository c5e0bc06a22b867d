"""The session tree (design §2.2, 2.3): branches, the computed model view, and replay from the log."""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.messages import (
    KIND_COMPACTION_SUMMARY,
    KIND_TOOL_RESULT_ARCHIVED,
    Message,
    Usage,
    assistant,
    tool_result,
    user,
)
from runtime.store.entries import CompactionEntry, MessageEntry, OverlayEntry, VisibilityEntry, new_header
from runtime.store.log import SessionLog, load_tree
from runtime.store.tree import SPEND_KEY, NeedsHistory, SessionTree
from runtime.store.writer import LogWriter


def summary(text: str = "summary") -> Message:
    return user(text, kind=KIND_COMPACTION_SUMMARY, metadata={"read_files": ["a.py"], "modified_files": []})


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


def test_append_follows_the_leaf_and_the_path_is_the_conversation() -> None:
    tree = SessionTree(new_header("s", model="m"))
    a = tree.append(user("a"))
    b = tree.append(assistant("b"))
    assert a.parent_id is None and b.parent_id == a.id
    assert tree.leaf_id == b.id
    assert [n.id for n in tree.path()] == [a.id, b.id]
    assert texts(tree.context()) == texts(tree.messages()) == ["a", "b"]


def test_branch_starts_a_sibling_and_nothing_is_deleted() -> None:
    tree = SessionTree()
    a = tree.append(user("a"))
    b = tree.append(assistant("b"))
    tree.branch(a.id)
    c = tree.append(assistant("c"))
    assert c.parent_id == a.id
    assert texts(tree.context()) == ["a", "c"]
    assert len(tree) == 3
    assert tree.children(a.id) == [b.id, c.id]
    assert tree.get(b.id) == b
    tree.branch(None)
    root2 = tree.append(user("fresh start"))
    assert root2.parent_id is None
    assert texts(tree.context()) == ["fresh start"]
    assert len(tree.children(None)) == 2


def test_append_with_an_explicit_parent_branches_in_one_step() -> None:
    tree = SessionTree()
    a = tree.append(user("a"))
    tree.append(assistant("b"))
    tree.append(user("c"), parent_id=a.id)
    assert texts(tree.context()) == ["a", "c"]


def test_compaction_view_is_summary_then_kept_span_then_newer_messages() -> None:
    tree = SessionTree()
    ids = [tree.append(user(f"m{i}")).id for i in range(6)]
    entry = tree.record_compaction(summary(), ids[4], tokens_before=900, tokens_after=300)
    tree.append(assistant("after"))
    assert texts(tree.context()) == ["summary", "m4", "m5", "after"]
    assert tree.usage_floor == 3
    assert texts(tree.context_since_compaction()) == ["after"]
    assert tree.latest_compaction == entry
    # The user's view keeps everything, with the summary as a marker where the compaction happened.
    assert texts(tree.messages()) == ["m0", "m1", "m2", "m3", "m4", "m5", "summary", "after"]


def test_an_overflow_compaction_s_cause_is_in_its_log_entry_and_an_older_entry_without_one_loads() -> None:
    """The log says why an overflow compaction ran (``refused``, ``counted``) as its events do; a line
    written before the entry had a ``cause`` reads as None."""
    from runtime.store.entries import decode_entries, encode_entry

    tree = SessionTree()
    first = tree.append(user("m0")).id
    entry = tree.record_compaction(summary(), first, trigger="overflow", cause="refused")
    line = encode_entry(entry)
    assert msgspec.json.decode(line)["cause"] == "refused"
    (read,) = decode_entries(line)
    assert isinstance(read, CompactionEntry) and read.cause == "refused"
    older = msgspec.json.decode(line)
    del older["cause"]
    (read,) = decode_entries(msgspec.json.encode(older) + b"\n")
    assert isinstance(read, CompactionEntry) and read.cause is None and read.trigger == "overflow"


def test_a_compaction_without_a_cause_is_written_without_the_field_and_lines_with_or_without_it_load(
    tmp_path: Path,
) -> None:
    """A compaction of any trigger but an overflow has no cause: its log line leaves the field out (it
    said ``"cause": null`` in every such line). The loader reads a log with a line as written now, the
    same line with ``"cause": null`` (as agentcell wrote it from 2026-11-27 15:47) and one with a cause."""
    from runtime.store.entries import encode_entry

    tree = SessionTree(new_header("s", model="m"))
    tree.append(user("m0"))
    tree.record_compaction(summary("s1"), None, trigger="threshold", artifacts=["a.txt"])
    tree.append(user("m1"))
    tree.record_compaction(summary("s2"), None, trigger="manual")
    tree.append(user("m2"))
    tree.record_compaction(summary("s3"), None, trigger="overflow", cause="counted")
    path = tmp_path / "s.jsonl"
    writer = LogWriter("never")
    try:
        SessionLog(path, writer).append_many(tree.entries())
        writer.flush()
    finally:
        writer.close()
    lines = path.read_bytes().splitlines(keepends=True)
    compactions = [i for i, line in enumerate(lines) if msgspec.json.decode(line)["type"] == "compaction"]
    written = [msgspec.json.decode(lines[i]) for i in compactions]
    assert [c.get("cause", "(absent)") for c in written] == ["(absent)", "(absent)", "counted"]
    assert lines[compactions[0]] == encode_entry(tree.entries()[compactions[0]])
    with_null = written[1] | {"cause": None}  # the second one as the earlier writer had it
    lines[compactions[1]] = msgspec.json.encode(with_null) + b"\n"
    path.write_bytes(b"".join(lines))

    replayed, info = load_tree(path)
    assert not info.torn
    assert replayed.entries() == tree.entries()
    read = [e for e in replayed.entries() if isinstance(e, CompactionEntry)]
    assert [(e.trigger, e.cause) for e in read] == [
        ("threshold", None),
        ("manual", None),
        ("overflow", "counted"),
    ]
    assert read[0].artifacts == ["a.txt"] and replayed.context()[0].text == "s3"


def test_hard_reset_compaction_replaces_the_whole_history() -> None:
    tree = SessionTree()
    for i in range(4):
        tree.append(user(f"m{i}"))
    tree.record_compaction(summary(), None, mode="hard_reset")
    tree.append(user("next"))
    assert texts(tree.context()) == ["summary", "next"]
    assert tree.usage_floor == 1


def test_a_second_compaction_can_keep_from_the_first_summary() -> None:
    tree = SessionTree()
    ids = [tree.append(user(f"m{i}")).id for i in range(4)]
    first = tree.record_compaction(summary("s1"), ids[2])
    tree.append(user("x"))
    tree.record_compaction(summary("s2"), first.id)
    assert texts(tree.context()) == ["s2", "s1", "m2", "m3", "x"]
    later = tree.context()[3].id
    tree.record_compaction(summary("s3"), later)
    assert texts(tree.context()) == ["s3", "m3", "x"]


def test_hidden_messages_are_left_out_of_the_model_view_only() -> None:
    tree = SessionTree()
    tree.append(user("visible"))
    tree.append(user("note to the user", agent_visible=False))
    assert texts(tree.context()) == ["visible"]
    assert texts(tree.messages()) == ["visible", "note to the user"]


def test_overlay_archives_a_tool_result_on_paths_through_it_only() -> None:
    tree = SessionTree()
    call = tree.append(assistant("calling"))
    result = tree.append(tool_result("c1", "read_file", "big output"))
    archived = msgspec.structs.replace(result.message, agent_visible=False, kind=KIND_TOOL_RESULT_ARCHIVED)
    tree.overlay([archived])
    tree.append(user("go on"))
    assert texts(tree.context()) == ["calling", "go on"]
    assert [m.kind for m in tree.messages()] == [None, KIND_TOOL_RESULT_ARCHIVED, None]
    original = tree.get(result.id)
    assert isinstance(original, MessageEntry) and original.message.agent_visible
    tree.branch(result.id)  # a path that does not pass through the overlay sees the original
    assert texts(tree.context()) == ["calling", "big output"]
    assert call.id in tree


@pytest.mark.parametrize(
    "change",
    [
        lambda t, ids: t.append(user("dup", id=ids[0])),
        lambda t, ids: t.append(user("orphan"), parent_id="nope"),
        lambda t, ids: t.branch("nope"),
        lambda t, ids: t.record_compaction(summary(), "nope"),
        lambda t, ids: t.overlay([user("replacement", id="nope")]),
    ],
    ids=["duplicate-id", "unknown-parent", "unknown-leaf", "kept-id-off-path", "overlay-off-path"],
)
def test_inconsistent_changes_raise_and_leave_the_tree_unchanged(change: object) -> None:
    tree = SessionTree()
    ids = [tree.append(user(f"m{i}")).id for i in range(3)]
    before = (tree.entries(), tree.leaf_id, tree.context(), tree.messages())
    with pytest.raises(ValueError):
        change(tree, ids)  # type: ignore[operator]
    assert (tree.entries(), tree.leaf_id, tree.context(), tree.messages()) == before


def test_kept_id_on_another_branch_is_refused() -> None:
    tree = SessionTree()
    a = tree.append(user("a"))
    b = tree.append(user("b"))
    tree.branch(a.id)
    tree.append(user("c"))
    with pytest.raises(ValueError, match="not on the path"):
        tree.record_compaction(summary(), b.id)


def test_model_metadata_overrides_the_header() -> None:
    tree = SessionTree(new_header("s", model="small"))
    assert tree.model == "small"
    tree.set_metadata("model", "large")
    assert tree.model == "large"
    assert SessionTree.from_entries(tree.entries()).model == "large"


# -- property: any sequence of changes replays from the log to the same tree ----------------------------


@dataclass
class _Snapshot:
    """The oracle: the views after each node, derived from the operations, not from the tree's code."""

    context: list[Message] = field(default_factory=list)
    floor: int = 0
    user: list[Message] = field(default_factory=list)


def _apply_random_change(data: st.DataObject, tree: SessionTree, model: dict[str | None, _Snapshot]) -> None:
    current = model[tree.leaf_id]
    nodes = list(model)  # insertion order: deterministic for hypothesis
    kind = data.draw(
        st.sampled_from(
            ["append", "append", "append", "hidden", "branch", "compact", "overlay", "visibility"]
        )
    )
    if kind in ("append", "hidden"):
        message = user(f"m{len(tree)}", id=f"m{len(tree)}", agent_visible=kind == "append")
        tree.append(message)
        context = [*current.context, message] if message.agent_visible else list(current.context)
        model[message.id] = _Snapshot(context, current.floor, [*current.user, message])
    elif kind == "branch":
        tree.branch(data.draw(st.sampled_from(nodes)))
    elif kind == "compact":
        candidates = [m.id for m in current.context]
        keep = data.draw(st.sampled_from([None, *candidates]))
        s = msgspec.structs.replace(summary(f"s{tree.compaction_count}"), id=f"s{tree.compaction_count}")
        tree.record_compaction(s, keep, mode="summarize" if keep else "hard_reset")
        start = candidates.index(keep) if keep is not None else len(candidates)
        context = [s, *current.context[start:]]
        model[s.id] = _Snapshot(context, len(context), [*current.user, s])
    else:
        visible = [m for m in current.context if m.kind != KIND_COMPACTION_SUMMARY]
        if not visible:
            return
        targets = data.draw(
            st.lists(st.sampled_from(visible), min_size=1, max_size=3, unique_by=lambda m: m.id)
        )
        if kind == "visibility":  # hide by id: the same message, its flag changed
            replacements = {m.id: msgspec.structs.replace(m, agent_visible=False) for m in targets}
            entry: OverlayEntry | VisibilityEntry = tree.set_visibility(replacements, agent_visible=False)
        else:
            hide = data.draw(st.booleans())
            replacements = {
                m.id: msgspec.structs.replace(m, agent_visible=not hide, parts=user(m.text + "'").parts)
                for m in targets
            }
            entry = tree.overlay(replacements.values())
        remaining: list[Message] = []
        floor = current.floor
        for i, m in enumerate(current.context):
            new = replacements.get(m.id, m)
            if new.agent_visible:
                remaining.append(new)
            elif i < current.floor:
                floor -= 1
        model[entry.id] = _Snapshot(remaining, floor, [replacements.get(m.id, m) for m in current.user])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_changes_replay_from_the_log_to_the_same_tree_and_views(
    data: st.DataObject, tmp_path: Path
) -> None:
    tree = SessionTree(new_header("s", model="m"))
    model: dict[str | None, _Snapshot] = {None: _Snapshot()}
    for _ in range(data.draw(st.integers(1, 40))):
        _apply_random_change(data, tree, model)
        expected = model[tree.leaf_id]
        assert tree.context() == expected.context
        assert tree.usage_floor == expected.floor
        assert tree.messages() == expected.user

    path = tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl"
    writer = LogWriter("never")
    try:
        SessionLog(path, writer).append_many(tree.entries())
        writer.flush()
    finally:
        writer.close()
    replayed, info = load_tree(path)
    assert not info.torn
    assert replayed.entries() == tree.entries()
    assert replayed.leaf_id == tree.leaf_id
    assert replayed.path() == tree.path()
    assert replayed.context() == tree.context()
    assert replayed.messages() == tree.messages()
    assert replayed.usage_floor == tree.usage_floor
    assert replayed.latest_compaction == tree.latest_compaction


def test_visibility_hides_by_id_over_an_overlay_on_paths_through_it_only() -> None:
    tree = SessionTree()
    prompt = tree.append(user("a very long prompt"))
    tree.overlay([msgspec.structs.replace(prompt.message, parts=user("rewritten").parts)])
    change = tree.set_visibility([prompt.id], agent_visible=False)
    assert change.message_ids == [prompt.id] and b"prompt" not in msgspec.json.encode(change)
    tree.append(user("next"))
    assert texts(tree.context()) == ["next"]
    assert texts(tree.messages()) == ["rewritten", "next"] and not tree.messages()[0].agent_visible
    tree.branch(prompt.id)  # a path that does not pass through it sees the message as it was
    assert texts(tree.context()) == ["a very long prompt"]
    with pytest.raises(ValueError, match="not a message on the path"):
        tree.set_visibility(["nope"], agent_visible=False)


def test_nodes_of_every_kind_are_on_the_path() -> None:
    tree = SessionTree()
    m = tree.append(user("a"))
    o = tree.overlay([msgspec.structs.replace(m.message, agent_visible=False)])
    c = tree.record_compaction(summary(), None)
    kinds = [type(n) for n in tree.path()]
    assert kinds == [MessageEntry, OverlayEntry, CompactionEntry]
    assert tree.leaf_id == c.id and o.parent_id == m.id


# -- memory bounded by the context (design §2.2) ---------------------------------------------------------


def long_tree(turns: int, every: int) -> tuple[SessionTree, list[Message]]:
    """``turns`` exchanges, compacted every ``every`` turns keeping the latest exchange."""
    tree = SessionTree(new_header("s", model="m"))
    prompts: list[Message] = []
    for i in range(turns):
        prompt = tree.append(user(f"prompt {i}")).message
        prompts.append(prompt)
        tree.append(assistant(f"answer {i} " + "words " * 40))
        if i % every == every - 1:
            tree.record_compaction(summary(f"summary {i}"), prompt.id)
    return tree, prompts


def test_trim_keeps_the_model_view_and_counts_what_the_user_view_left_in_the_log() -> None:
    tree, prompts = long_tree(50, 5)
    full_messages, full_context, entries = tree.messages(), tree.context(), tree.entry_count
    assert tree.trim() > 0 and tree.trimmed
    assert tree.context() == full_context
    assert tree.messages_before == len(full_messages) - len(tree.messages())
    assert tree.messages() == full_messages[tree.messages_before :]
    assert tree.path()[0].id == prompts[-1].id  # the kept part of the latest compaction
    # it goes on as before, and trims again after the next compaction
    nxt = tree.append(user("next")).message
    tree.append(assistant("and again"))
    tree.record_compaction(summary("latest"), nxt.id)
    tree.trim()
    assert texts(tree.context()) == ["latest", "next", "and again"]
    assert tree.messages_before + len(tree.messages()) == len(full_messages) + 3
    assert len(tree) == 52 * 2 - 2 and tree.entry_count == entries + 3


def test_a_trimmed_tree_asks_for_the_log_for_what_it_dropped() -> None:
    tree, prompts = long_tree(20, 5)
    tree.trim()
    view = (tree.leaf_id, tree.context(), tree.messages())
    old = prompts[0]
    for change in (
        lambda: tree.branch(old.id),  # a branch to a dropped message
        lambda: tree.branch(None),  # to the start
        lambda: tree.append(old),  # a message whose id may be a dropped one's
        lambda: tree.append(user("x"), parent_id=old.id),  # under a dropped parent
        lambda: tree.overlay([msgspec.structs.replace(old, parts=())]),
        lambda: tree.set_visibility([old.id], agent_visible=False),
        tree.entries,
        tree.copy,
    ):
        with pytest.raises(NeedsHistory):
            change()
    assert (tree.leaf_id, tree.context(), tree.messages()) == view  # and nothing changed
    with pytest.raises(ValueError, match="no such node"):
        tree.branch("nowhere")  # an id it never had is a plain error still


def test_a_trimmed_tree_holds_the_context_not_the_history() -> None:
    tree, _ = long_tree(200, 5)
    tree.trim()
    # what this test allocates (a runtime of another test may still be importing litellm on a thread)
    mine = [tracemalloc.Filter(True, __file__, all_frames=True)]
    tracemalloc.start(30)
    try:
        gc.collect()
        base = tracemalloc.take_snapshot().filter_traces(mine)
        for i in range(2_000):
            prompt = tree.append(user(f"prompt {i}")).message
            tree.append(assistant(f"answer {i} " + "words " * 40))
            if i % 5 == 4:
                tree.record_compaction(summary(f"summary {i}"), prompt.id)
                tree.trim()
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(mine)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(base, "filename"))
    assert grown < 2_000 * 50, f"{grown} bytes kept for 2,000 turns"  # 8 bytes an id dropped, a few runs


def test_spent_counts_every_response_summary_and_unlogged_spend_once_whatever_the_view() -> None:
    """design §4.1: what a session paid for is every response on every branch, every compaction summary's
    summarizer spend, and the spend of compactions that wrote none (``unlogged_spend``) until the next summary
    carries it; an overlay's copy of a message is not paid again. A trim keeps it, a replay gives it back."""

    def paid(text: str, tokens: int, cost: float) -> Message:
        return msgspec.structs.replace(
            assistant(text), usage=Usage(input_tokens=tokens, output_tokens=1, cost=cost)
        )

    tree = SessionTree(new_header("s", model="m"))
    first = tree.append(user("a"))
    answer = tree.append(paid("b", 100, 0.5))
    tree.append(user("c"))
    tree.append(paid("d", 200, 0.25))
    tree.overlay([msgspec.structs.replace(answer.message, agent_visible=False)])  # a copy: not paid again
    tree.set_metadata(SPEND_KEY, msgspec.to_builtins(Usage(input_tokens=7, output_tokens=3)))  # discarded
    assert tree.spent == Usage(input_tokens=307, output_tokens=5, cost=0.75)
    carried = msgspec.structs.replace(summary(), usage=Usage(input_tokens=57, output_tokens=13))  # 50+7, 10+3
    tree.record_compaction(carried, None)  # clears unlogged_spend: its summary carries it
    assert tree.unlogged_spend is None
    tree.append(user("e"))
    tree.append(paid("f", 400, 1.0))
    tree.branch(first.id)  # spend on a branch the view no longer shows is still paid for
    tree.append(paid("g", 800, 2.0))
    expected = Usage(input_tokens=1_557, output_tokens=17, cost=3.75)
    assert tree.spent == expected
    assert sum((m.usage for m in tree.context() if m.usage), Usage()) != expected  # the view holds less
    again = SessionTree.from_entries(tree.entries())
    assert again.spent == expected
    again.trim()
    assert again.spent == expected
