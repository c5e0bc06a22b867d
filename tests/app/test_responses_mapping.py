"""The Responses front door's pure mapping (runtime/apps/responses: items, api, stream), checked against the
``openai`` package's own types (pydantic validation of every shape we produce)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import events as ev
from runtime.apps.responses import items as it
from runtime.apps.responses.api import (
    CreateResponse,
    ResponseRecord,
    failure,
    function_tools,
    unsupported,
    usage_object,
)
from runtime.apps.responses.stream import StreamTranslator
from runtime.context.integrity import CLIENT_CALLS_KEY
from runtime.messages import Message, ReasoningPart, TextPart, ToolCallPart, Usage, tool_result

pydantic = pytest.importorskip("pydantic")
responses_types = pytest.importorskip("openai.types.responses")

EVENT = pydantic.TypeAdapter(responses_types.ResponseStreamEvent)
ITEM = pydantic.TypeAdapter(responses_types.ResponseItem)


def check_event(event: dict[str, Any]) -> None:
    if not event["type"].startswith("agentcell."):
        EVENT.validate_python(event)


HISTORY: list[dict[str, Any]] = [
    {"role": "developer", "content": "Be terse."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": "use the tool"}]},
    {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
    {"role": "user", "content": "Thanks"},
]


def test_input_items_become_messages_and_back() -> None:
    parsed = it.parse_input(HISTORY)
    assert parsed.instructions == ["Be terse."]
    assert parsed.calls == ["c1"] and parsed.outputs == ["c1"]
    roles = [m.role for m in parsed.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    call_message = parsed.messages[1]
    assert call_message.reasoning == "use the tool" and call_message.tool_calls[0].id == "c1"
    assert call_message.metadata[CLIENT_CALLS_KEY] == ["c1"]
    items = it.to_items(parsed.messages)
    assert [i["type"] for i in items] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    for item in items:
        ITEM.validate_python(item)
    assert it.parse_input("just text").messages[0].text == "just text"


def test_the_runtimes_own_calls_carry_their_results() -> None:
    call = ToolCallPart("c9", "read_file", '{"path": "a"}')
    messages = [
        Message(role="assistant", parts=(call,), id="a" * 16),
        tool_result("c9", "read_file", "contents", id="b" * 16),
        Message(role="assistant", parts=(TextPart("done"),), id="c" * 16),
    ]
    items = it.to_items(messages)
    assert [i["type"] for i in items] == ["mcp_call", "message"]
    assert items[0]["output"] == "contents" and items[0]["status"] == "completed"
    assert items[0]["server_label"] == "agentcell"
    failed = it.to_items([messages[0], tool_result("c9", "read_file", "boom", is_error=True)])
    assert failed[0]["status"] == "failed" and failed[0]["error"]["content"] == [
        {"type": "text", "text": "boom"}
    ]
    for item in (*items, *failed):
        ITEM.validate_python(item)


def test_a_conversations_stored_items_keep_their_ids() -> None:
    stored = it.to_items(it.parse_input([{"role": "user", "content": "hello"}]).messages)
    again = it.parse_input(stored, keep_ids=True)
    assert it.message_item_id(again.messages[0].id) == stored[0]["id"]
    assert it.parse_input(stored).messages[0].id != again.messages[0].id  # a client's ids are not taken


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"temperature": 0.3}, "temperature"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"background": True}, "background"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"reasoning": {"summary": "verbose"}}, "reasoning.summary"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"reasoning": {"effort": "turbo"}}, "reasoning.effort"),
        ({"reasoning": {"generate_summary": "auto"}}, "reasoning"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
    ],
)
def test_parameters_not_honoured_are_named(fields: dict[str, Any], named: str) -> None:
    assert unsupported(CreateResponse(model="m", **fields)) == [named]


def test_what_sdks_send_by_default_is_accepted() -> None:
    body = CreateResponse(
        model="m",
        tool_choice="auto",
        parallel_tool_calls=True,
        include=["reasoning.encrypted_content"],
        text={"format": {"type": "text"}, "verbosity": "low"},
        reasoning={"effort": None, "summary": "auto"},
        prompt_cache_key="k",
        client_metadata={"session_id": "x"},
        store=True,
        stream=False,
    )
    assert unsupported(body) == []


def test_tools_usage_errors_and_the_response_object_have_the_apis_shapes() -> None:
    tools = function_tools([{"type": "function", "name": "f", "parameters": {"type": "object"}}])
    assert tools.schemas == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    usage = usage_object(Usage(input_tokens=10, output_tokens=4, reasoning_tokens=2, cache_read_tokens=6))
    responses_types.ResponseUsage.model_validate(usage)
    assert usage["input_tokens_details"]["cached_tokens"] == 6 and usage["total_tokens"] == 14
    assert failure("context_overflow_after_compaction", "x") == (
        400,
        {"code": "context_length_exceeded", "message": "x", "param": "input"},
    )
    assert failure("turn_budget", "x")[0] == 500 and failure("provider_rate_limit", "x")[0] == 429
    record = ResponseRecord(id="resp_1", session_id="s", model="m", usage=usage, status="completed")
    responses_types.Response.model_validate(record.to_api())


def _message_events(translator: StreamTranslator, mid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    feed = [
        ev.RequestStart(
            session_id="s", turn_id="t", attempt=1, model="m", messages=1, estimated_tokens=1, message_id=mid
        ),
        ev.ReasoningDelta(session_id="s", turn_id="t", delta="think"),
        ev.ReasoningDelta(session_id="s", turn_id="t", delta="ing"),
        ev.TextDelta(session_id="s", turn_id="t", delta="Hel"),
        ev.TextDelta(session_id="s", turn_id="t", delta="lo"),
        ev.ToolCallDelta(
            session_id="s", turn_id="t", index=0, call_id="c1", name="weather", arguments_delta='{"a"'
        ),
        ev.ToolCallDelta(
            session_id="s", turn_id="t", index=0, call_id=None, name=None, arguments_delta=": 1}"
        ),
        ev.CompactionStart(session_id="s", trigger="threshold", messages_before=3, tokens_before=9),
        ev.TurnEnd(session_id="s", turn_id="t", stop_reason="tool_calls"),
    ]
    for event in feed:
        out += translator.on_event(event)
    return out


def test_the_stream_of_a_step_matches_its_final_items() -> None:
    translator = StreamTranslator(frozenset({"weather"}), extra_events=True)
    record = ResponseRecord(id="resp_1", session_id="s", model="m")
    events = translator.start(record.to_api()) + _message_events(translator, "f" * 16)
    message = Message(
        role="assistant",
        parts=(ReasoningPart("thinking"), TextPart("Hello"), ToolCallPart("c1", "weather", '{"a": 1}')),
        id="f" * 16,
        metadata={CLIENT_CALLS_KEY: ["c1"]},
    )
    record.output, record.status = it.to_items([message]), "completed"
    events += translator.finish(record.to_api())
    for event in events:
        check_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == record.output  # the stream's items are the response's, field by field
    assert "agentcell.compaction_start" in [e["type"] for e in events]
    assert [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"] == [
        '{"a": 1}'
    ]
    assert events[-1]["type"] == "response.completed"


def test_a_server_tool_is_done_when_its_result_comes_and_unstreamed_items_are_added_at_the_end() -> None:
    translator = StreamTranslator(frozenset())
    record = ResponseRecord(id="resp_2", session_id="s", model="m")
    events = translator.start(record.to_api())
    events += translator.on_event(
        ev.RequestStart(
            session_id="s",
            turn_id="t",
            attempt=1,
            model="m",
            messages=1,
            estimated_tokens=1,
            message_id="a" * 16,
        )
    )
    events += translator.on_event(
        ev.ToolCallDelta(
            session_id="s", turn_id="t", index=0, call_id="c2", name="read_file", arguments_delta="{}"
        )
    )
    events += translator.on_event(ev.TurnEnd(session_id="s", turn_id="t", stop_reason="tool_calls"))
    events += translator.on_event(
        ev.ToolExecutionStart(session_id="s", turn_id="t", call_id="c2", name="read_file", arguments="{}")
    )
    result = tool_result("c2", "read_file", "the file")
    events += translator.results([result])
    final = Message(
        role="assistant", parts=(TextPart("read it"),), id="b" * 16
    )  # a step the stream did not show
    record.output = it.to_items(
        [
            Message(role="assistant", parts=(ToolCallPart("c2", "read_file", "{}"),), id="a" * 16),
            result,
            final,
        ]
    )
    record.status = "failed"
    events += translator.finish(record.to_api())
    for event in events:
        check_event(event)
    types = [e["type"] for e in events]
    assert types.index("response.mcp_call_arguments.done") < types.index("response.mcp_call.in_progress")
    assert types.index("response.mcp_call.in_progress") < types.index("response.mcp_call.completed")
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == record.output
    assert types[-1] == "response.failed"


def test_stateless_threads_match_the_longest_history_of_the_same_owner_and_stay_bounded() -> None:
    from runtime.apps.responses.threads import Thread, Threads, chain
    from runtime.messages import user

    history = [user("one"), Message(role="assistant", parts=(TextPart("two"),)), user("three")]
    mine = chain("alice", history)
    threads = Threads(limit=2)
    threads.put(Thread(session_id="s1", leaf_id="l1", digest=mine[2], length=2))
    assert threads.take(chain("mallory", history), None) is None  # another owner's identical history
    taken = threads.take(mine, None)
    assert taken is not None and taken.session_id == "s1" and len(threads) == 0  # taken while it runs
    assert threads.take(mine, None) is None
    assert threads.take(mine[:3], None) is None  # the whole input is the thread: nothing new to answer
    gone: list[Thread] = []
    for n in range(4):
        digest = chain("alice", [user(f"thread {n}"), user("x")])[1]
        gone += threads.put(Thread(session_id=f"t{n}", leaf_id="l", digest=digest, length=1))
    assert [t.session_id for t in gone] == ["t0", "t1"] and len(threads) == 2  # the least recently used go
    assert [t.session_id for t in threads.expire(now=float("inf"))] == ["t2", "t3"]
