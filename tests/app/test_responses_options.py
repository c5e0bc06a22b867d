"""What a client asks of the model through the Responses door (issue 40): ``max_output_tokens`` caps the
answer (the smaller of it and the runtime's own cap) and an answer cut there is ``incomplete`` with reason
``max_output_tokens``, as OpenAI's API says it; ``reasoning.effort``, ``text.verbosity`` and
``parallel_tool_calls: false`` reach the model's request. Driven by the official ``openai`` SDK over HTTP."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from actors.protocol import TurnOptions
from runtime.provider.script import ToolCallSpec, Turn

TOKEN = "responses-token"
TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


def bodies(provider: Any, model: str) -> list[dict[str, Any]]:
    name = model.removeprefix("openai/")
    return [dict(r.body) for r in provider.request_log if r.model == name]


def answer_cap(body: dict[str, Any]) -> Any:
    return body.get("max_completion_tokens", body.get("max_tokens"))


def test_max_output_tokens_caps_the_answer_and_a_cut_answer_is_incomplete(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(Turn(text="The start of a long", finish_reason="length"), Turn(text="Short."))
    cut = client.responses.create(model=model, input="Tell me everything.", max_output_tokens=16)
    assert answer_cap(bodies(provider, model)[-1]) == 16
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.max_output_tokens == 16 and cut.output_text == "The start of a long"
    whole = client.responses.create(model=model, input="Briefly.", previous_response_id=cut.id)
    assert whole.status == "completed" and whole.max_output_tokens is None
    assert answer_cap(bodies(provider, model)[-1]) != 16  # the cap was that response's only


def test_an_answer_the_model_would_write_past_the_cap_is_cut_there_and_incomplete(
    client: openai.OpenAI, script: Any
) -> None:
    """The local provider stops a model at ``max_tokens`` as a real server does (the answer is scripted
    whole, the cut is the provider's own)."""
    long = "Once upon a time, in a lighthouse by the sea, there lived a keeper who counted the waves. " * 8
    model = script(Turn(text=long))
    cut = client.responses.create(model=model, input="Tell me everything.", max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 16
    assert cut.output_text and long.startswith(cut.output_text) and len(cut.output_text) < len(long)


def test_the_smaller_of_the_clients_cap_and_the_runtimes_is_asked_for() -> None:
    options = TurnOptions(max_output_tokens=500)
    assert options.answer_cap(None) == 500  # the runtime asks for nothing: the client's cap
    assert options.answer_cap(2_000) == 500
    assert options.answer_cap(100) == 100  # the room the window leaves is smaller
    assert TurnOptions().answer_cap(100) == 100


def test_a_cap_below_the_apis_minimum_is_refused_as_openai_refuses_it(
    client: openai.OpenAI, script: Any
) -> None:
    model = script(Turn(text="never"))
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=model, input="hi", max_output_tokens=8)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "max_output_tokens" and error["code"] == "integer_below_min_value"


def test_reasoning_effort_verbosity_and_one_tool_call_a_step_reach_the_model(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="lookup", arguments="{}", id="c1"),)),
        Turn(text="done"),
    )
    response = client.responses.create(
        model=model,
        input="Look it up.",
        tools=[TOOL],  # type: ignore[list-item]
        parallel_tool_calls=False,
        reasoning={"effort": "low", "summary": "auto"},
        text={"verbosity": "low"},
    )
    body = bodies(provider, model)[-1]
    assert body["reasoning_effort"] == "low" and body["verbosity"] == "low"
    assert body["parallel_tool_calls"] is False
    assert response.parallel_tool_calls is False
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert response.text is not None and response.text.verbosity == "low"
    assert [item.type for item in response.output] == ["function_call"]
    done = client.responses.create(
        model=model,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": "c1", "output": "42"}],
    )
    assert done.output_text == "done"
    assert "reasoning_effort" not in bodies(provider, model)[-1]  # each response's own options


def two_calls_then(text: str) -> tuple[Turn, Turn]:
    """A model that ignores ``parallel_tool_calls: false``: two calls in one answer, then ``text``."""
    calls = (
        ToolCallSpec(name="lookup", arguments='{"q": "a"}', id="c1"),
        ToolCallSpec(name="lookup", arguments='{"q": "b"}', id="c2"),
    )
    return Turn(tool_calls=calls), Turn(text=text)


def assistant_calls(body: dict[str, Any]) -> list[list[str]]:
    """The tool call ids of each assistant message of a chat request, and the ids the results answer."""
    return [
        [c["id"] for c in m.get("tool_calls") or []]
        if m["role"] == "assistant"
        else [f"->{m['tool_call_id']}"]
        for m in body["messages"]
        if m["role"] in ("assistant", "tool")
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_model_that_makes_two_calls_when_one_is_allowed_gets_its_first_shown_run_and_answered(
    client: openai.OpenAI, provider: Any, script: Any, stream: bool
) -> None:
    model = script(*two_calls_then("done"))
    asked = {"model": model, "input": "Look both up.", "tools": [TOOL], "parallel_tool_calls": False}
    if stream:
        events = list(client.responses.create(**asked, stream=True))  # type: ignore[call-overload]
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [(i.type, i.call_id) for i in added] == [("function_call", "c1")]  # c2 is never streamed
        assert not [
            e for e in events if e.type == "response.function_call_arguments.delta" and "b" in e.delta
        ]
        response = events[-1].response
    else:
        response = client.responses.create(**asked)  # type: ignore[call-overload]
    assert [(i.type, i.call_id, i.arguments) for i in response.output] == [
        ("function_call", "c1", '{"q": "a"}')
    ]
    # the client answers the one call it was given, and the conversation goes on: no call waits unanswered
    done = client.responses.create(
        model=model,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": "c1", "output": "42"}],
    )
    assert done.status == "completed" and done.output_text == "done"
    assert assistant_calls(bodies(provider, model)[-1]) == [["c1"], ["->c1"]]


def test_with_parallel_tool_calls_allowed_both_calls_are_the_clients(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(*two_calls_then("done"))
    response = client.responses.create(model=model, input="Look both up.", tools=[TOOL])  # type: ignore[list-item]
    assert [i.call_id for i in response.output if i.type == "function_call"] == ["c1", "c2"]
    done = client.responses.create(
        model=model,
        previous_response_id=response.id,
        input=[
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "function_call_output", "call_id": "c2", "output": "43"},
        ],
    )
    assert done.output_text == "done"
    assert assistant_calls(bodies(provider, model)[-1]) == [["c1", "c2"], ["->c1"], ["->c2"]]


def test_the_runtimes_own_tools_run_one_call_a_step_when_one_is_allowed(
    rt: Any, session: Any, script: Any, workspace: Any
) -> None:
    from runtime.messages import user

    (workspace / "a.txt").write_text("alpha")
    (workspace / "b.txt").write_text("beta")
    model = script(
        Turn(
            tool_calls=(
                ToolCallSpec(name="read_file", arguments='{"path": "a.txt"}', id="r1"),
                ToolCallSpec(name="read_file", arguments='{"path": "b.txt"}', id="r2"),
            )
        ),
        Turn(text="read"),
    )
    sid = session(model)
    ran: list[str] = []
    sub = rt.subscribe(
        sid, callback=lambda e: ran.append(e.call_id) if e.type == "tool_execution_start" else None
    )
    result = rt.send(sid, [user("Read both.")], options=TurnOptions(parallel_tool_calls=False)).result(
        timeout=30
    )
    sub.close()
    assert result.status == "ok" and result.text == "read"
    assert ran == ["r1"]  # the second call never ran
    call = next(m for m in rt.messages(sid) if m.role == "assistant" and m.tool_calls)
    assert [c.id for c in call.tool_calls] == ["r1"]
    assert call.metadata["dropped_tool_calls"] == [
        {"id": "r2", "name": "read_file", "arguments": '{"path": "b.txt"}'}
    ]
