"""The Responses API front door against hostile and unlucky clients: unknown ids, malformed items, outputs for
calls nobody made, unsupported parameters, oversized bodies, a cancel and a disconnect mid-stream, two
requests racing on one session. Each is a clear error in the API's shape, and nothing is lost."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from runtime.apps.server import ApiServer
from runtime.provider.script import ToolCallSpec, Turn
from tests.conftest import wait_until

TOKEN = "hostile-token"
TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
def server(rt: Any, provider: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    with ApiServer(rt, TOKEN, max_body_bytes=64 * 1024) as s:
        yield s


def error_of(raised: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    body = raised.value.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}, body
    return body


def test_unknown_ids_are_404_in_the_api_shape(client: openai.OpenAI, script: Any) -> None:
    model = script(Turn(text="x"))
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=model, input="hi", previous_response_id="resp_" + "0" * 32)
    error = error_of(raised)
    assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"
    for bad in ("resp_../../etc/passwd", "nope", "resp_" + "f" * 32):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(bad)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="hi", conversation="conv_" + "1" * 32)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list("conv_../x")


@pytest.mark.parametrize(
    ("input", "param"),
    [
        ([{"type": "message", "role": "robot", "content": "x"}], "input[0].role"),
        ([{"type": "banana"}], "input[0].type"),
        ([42], "input[0]"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input[0].content[0]"),
        ([{"type": "function_call_output", "output": "no call id"}], "input[0].call_id"),
        ([{"role": "user", "content": None}], "input[0].content"),
        ({"not": "a list"}, "input"),
        ([], "input"),
        ([{"role": "assistant", "content": "an answer is not a question"}], "input"),
    ],
)
def test_malformed_input_items_are_400_naming_them(client: openai.OpenAI, input: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="openai/never-called", input=input)
    assert error_of(raised)["param"] == param


def test_unsupported_and_unknown_parameters_are_named(client: openai.OpenAI, server: ApiServer) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="openai/x", input="hi", temperature=0.2)
    assert error_of(raised)["param"] == "temperature" and "temperature" in error_of(raised)["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="openai/x", input="hi", extra_body={"bogus": 1})
    assert error_of(raised)["code"] == "unknown_parameter" and error_of(raised)["param"] == "bogus"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="openai/x", input="hi", tools=[{"type": "custom", "name": "x"}])
    assert error_of(raised)["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="bad model name\n", input="hi")
    assert error_of(raised)["param"] == "model"
    with pytest.raises(openai.BadRequestError) as raised:  # a model no provider serves: the provider's 400
        client.responses.create(model="no-such-provider/model", input="hi")
    assert error_of(raised)["code"] == "invalid_prompt"
    raw = httpx.post(
        f"{server.url}/v1/responses",
        content=b"{not json",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    unauthorized = httpx.post(f"{server.url}/v1/responses", json={}, headers={"Authorization": "Bearer nope"})
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["code"] == "invalid_api_key"


def test_function_call_outputs_must_answer_the_waiting_calls(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="lookup", id="call_a"), ToolCallSpec(name="lookup", id="call_b"))),
        Turn(text="both looked up"),
    )
    first = client.responses.create(model=model, input="look both up", tools=[TOOL])
    assert [i.call_id for i in first.output] == ["call_a", "call_b"]

    def outputs(*ids: str) -> list[dict[str, Any]]:
        return [{"type": "function_call_output", "call_id": i, "output": f"result {i}"} for i in ids]

    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=model, previous_response_id=first.id, input=outputs("call_a", "call_zz")
        )
    assert "call_zz" in error_of(raised)["message"]
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=model, previous_response_id=first.id, input=outputs("call_a"))
    assert "call_b" in error_of(raised)["message"]
    with pytest.raises(openai.BadRequestError):  # outputs with no call waiting at all
        client.responses.create(model=model, input=outputs("call_a"))
    # nothing was lost: the right outputs still continue the thread
    done = client.responses.create(
        model=model, previous_response_id=first.id, input=outputs("call_a", "call_b"), tools=[TOOL]
    )
    assert done.output_text == "both looked up"


def test_an_oversized_body_is_413(client: openai.OpenAI, script: Any) -> None:
    with pytest.raises(openai.APIStatusError) as raised:
        client.responses.create(model=script(Turn(text="x")), input="y" * 100_000)
    assert raised.value.status_code == 413 and error_of(raised)["code"] == "request_too_large"


def test_cancel_mid_stream_stops_the_turn_and_the_session_goes_on(
    client: openai.OpenAI, script: Any, provider: Any
) -> None:
    model = script(Turn(text="first"), Turn(text="too slow", latency=30), Turn(text="after the cancel"))
    first = client.responses.create(model=model, input="one")
    stream = client.responses.create(model=model, input="two", previous_response_id=first.id, stream=True)
    events = iter(stream)
    created = next(events)
    assert created.type == "response.created"
    # mid-stream: the provider holds the request (a cancel before it arrived would leave "too slow" unsaid)
    wait_until(lambda: provider.remaining_turns(model.split("/", 1)[1]) == 1, "the provider has the request")
    cancelled = client.responses.cancel(created.response.id)
    assert cancelled.status == "cancelled"
    rest = list(events)
    assert rest[-1].type == "response.failed" and rest[-1].response.status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(created.response.id)  # only a response in progress can be cancelled
    after = client.responses.create(model=model, input="three", previous_response_id=created.response.id)
    assert after.output_text == "after the cancel"


def test_cancelling_a_response_that_waits_for_its_session_leaves_the_running_one_alone(
    client: openai.OpenAI, script: Any
) -> None:
    model = script(Turn(text="root"), Turn(text="the running one", latency=2.0), Turn(text="never asked"))
    root = client.responses.create(model=model, input="root")
    running = client.responses.create(model=model, input="a", previous_response_id=root.id, stream=True)
    running_events = iter(running)
    assert next(running_events).type == "response.created"
    waiting = client.responses.create(model=model, input="b", previous_response_id=root.id, stream=True)
    waiting_events = iter(waiting)
    created = next(waiting_events)
    assert client.responses.cancel(created.response.id).status == "cancelled"
    assert list(waiting_events)[-1].response.status == "cancelled"
    finished = list(running_events)[-1]
    assert finished.type == "response.completed" and finished.response.output_text == "the running one"


def test_a_client_that_disconnects_mid_stream_leaves_the_response_whole(
    server: ApiServer, client: openai.OpenAI, script: Any
) -> None:
    model = script(Turn(text="kept even without a listener", latency=1.0), Turn(text="and it goes on"))
    with (
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
        http.stream(
            "POST", "/v1/responses", json={"model": model, "input": "go", "stream": True}
        ) as response,
    ):
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        response_id = json.loads(first.removeprefix("data: "))["response"]["id"]
    # gone mid-turn; continuing from its response waits for it to end, then goes on from it
    after = client.responses.create(model=model, input="more", previous_response_id=response_id)
    assert after.output_text == "and it goes on"
    kept = client.responses.retrieve(response_id)
    assert kept.status == "completed" and kept.output_text == "kept even without a listener"


def test_two_requests_continuing_one_response_each_get_their_own_branch(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(Turn(text="root"), Turn(text="a branch", latency=0.3), Turn(text="a branch", latency=0.3))
    root = client.responses.create(model=model, input="root")
    results: dict[str, Any] = {}

    def ask(text: str) -> None:
        results[text] = client.responses.create(model=model, input=text, previous_response_id=root.id)

    threads = [threading.Thread(target=ask, args=(t,)) for t in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {r.status for r in results.values()} == {"completed"}
    name = model.removeprefix("openai/")
    branches = [[m["content"] for m in r.body["messages"]] for r in provider.request_log if r.model == name][
        1:
    ]
    assert sorted(branches) == [["root", "root", "left"], ["root", "root", "right"]]
