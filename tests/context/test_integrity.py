"""Tool-call integrity (design §3.6): every call has exactly one result before the next provider call."""

from __future__ import annotations

from runtime import messages as m
from runtime.context.integrity import (
    ARCHIVED_TEXT,
    INTERRUPTED_TEXT,
    check_integrity,
    find_orphans,
    malformed_arguments_text,
    model_view,
    repair_tool_calls,
    request_view,
    unknown_tool_text,
)


def call(call_id: str, name: str = "read_file") -> m.ToolCallPart:
    return m.ToolCallPart(call_id, name, '{"path": "a.txt"}')


def result(call_id: str, text: str = "ok", **kw: object) -> m.Message:
    return m.tool_result(call_id, "read_file", text, **kw)  # type: ignore[arg-type]


def shape(messages: list[m.Message]) -> list[str]:
    return [f"{x.role}:{x.tool_call_id or ','.join(c.id for c in x.tool_calls) or x.text}" for x in messages]


def test_complete_conversation_is_untouched() -> None:
    ctx = [
        m.user("go"),
        m.assistant(tool_calls=[call("a"), call("b")]),
        result("a"),
        result("b"),
        m.assistant("done"),
    ]
    assert check_integrity(ctx).ok
    assert find_orphans(ctx) == [] and repair_tool_calls(ctx) == []
    assert model_view(ctx) == ctx
    assert request_view(ctx) == ([], ctx)


def test_aborted_turn_orphans_get_one_error_result_each() -> None:
    ctx = [m.user("go"), m.assistant(tool_calls=[call("a"), call("b"), call("c")]), result("b")]
    assert [c.id for c in find_orphans(ctx)] == ["a", "c"]
    repairs = repair_tool_calls(ctx)
    assert [(r.role, r.tool_call_id, r.is_error) for r in repairs] == [
        ("tool", "a", True),
        ("tool", "c", True),
    ]
    assert repairs[0].text == INTERRUPTED_TEXT and "interrupted" in INTERRUPTED_TEXT
    assert repairs[0].metadata == {"repaired": True}
    repaired = ctx + repairs
    assert check_integrity(repaired).ok
    assert repair_tool_calls(repaired) == []  # idempotent
    # A request first gets the same repairs (and no view); once they are appended, the model view.
    needed, view = request_view(ctx)
    assert shape(needed) == shape(repairs) and view == []
    assert request_view(repaired) == ([], model_view(repaired))


def test_model_view_places_results_after_their_call_in_call_order() -> None:
    # an abort left call "a" unanswered, the user typed again, then the repair was appended at the end
    ctx = [
        m.user("go"),
        m.assistant(tool_calls=[call("a"), call("b")]),
        result("b"),
        m.user("never mind"),
    ]
    ctx += repair_tool_calls(ctx)
    assert shape(model_view(ctx)) == ["user:go", "assistant:a,b", "tool:a", "tool:b", "user:never mind"]


def test_model_view_repairs_on_the_fly_even_without_a_persisted_repair() -> None:
    ctx = [m.user("go"), m.assistant(tool_calls=[call("a")]), m.user("next")]
    view = model_view(ctx)
    assert shape(view) == ["user:go", "assistant:a", "tool:a", "user:next"]
    assert view[2].is_error and view[2].text == INTERRUPTED_TEXT


def test_duplicate_results_keep_the_first() -> None:
    ctx = [m.user("go"), m.assistant(tool_calls=[call("a")]), result("a", "first"), result("a", "second")]
    report = check_integrity(ctx)
    assert report.duplicates == [3] and not report.orphans
    view = model_view(ctx)
    assert [x.text for x in view if x.role == "tool"] == ["first"]


def test_stray_result_is_dropped_from_the_view() -> None:
    ctx = [m.user("go"), result("ghost"), m.assistant("hi")]
    assert check_integrity(ctx).strays == [1]
    assert shape(model_view(ctx)) == ["user:go", "assistant:hi"]


def test_reused_call_ids_across_turns_match_the_latest_call() -> None:
    # some providers number calls "call_0" in every response
    ctx = [
        m.user("1"),
        m.assistant(tool_calls=[call("call_0")]),  # aborted: never answered
        m.user("2"),
        m.assistant(tool_calls=[call("call_0")]),
        result("call_0", "second turn's result"),
    ]
    orphans = check_integrity(ctx).orphans
    assert [(o.call.id, o.message_index) for o in orphans] == [("call_0", 1)]
    view = model_view(ctx)
    assert shape(view) == [
        "user:1",
        "assistant:call_0",
        "tool:call_0",
        "user:2",
        "assistant:call_0",
        "tool:call_0",
    ]
    assert view[2].text == INTERRUPTED_TEXT and view[5].text == "second turn's result"


def test_archived_result_becomes_a_placeholder_not_an_interruption() -> None:
    archived = result("a", "long output", agent_visible=False, kind=m.KIND_TOOL_RESULT_ARCHIVED)
    ctx = [
        m.user("go"),
        m.assistant(tool_calls=[call("a")]),
        archived,
        m.user("summary", kind=m.KIND_TOOL_SUMMARY),
    ]
    assert find_orphans(ctx) == []
    view = model_view(ctx)
    assert view[2].tool_call_id == "a" and view[2].text == ARCHIVED_TEXT


def test_hidden_assistant_message_hides_its_results() -> None:
    ctx = [m.user("go"), m.assistant(tool_calls=[call("a")], agent_visible=False), result("a"), m.user("x")]
    assert shape(model_view(ctx)) == ["user:go", "user:x"]


def test_error_texts_the_model_sees() -> None:
    bad = m.ToolCallPart("c1", "read_file", '{"path": ')
    try:
        bad.parsed_arguments()
    except ValueError as exc:
        text = malformed_arguments_text(bad, str(exc))
    assert "read_file" in text and "not valid JSON" in text and '{"path": ' in text
    unknown = unknown_tool_text("rm_rf", ["read_file", "grep"])
    assert "rm_rf" in unknown and "grep, read_file" in unknown
    assert "no tools" in unknown_tool_text("x", [])
