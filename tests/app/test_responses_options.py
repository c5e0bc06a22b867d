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
