"""The Responses API front door as real clients use it (issue 41): what Codex sends on every request, reasoning
sealed in ``encrypted_content`` and sent back, the API's shape on every route, a retry mid-stream that
leaves the stream true. Driven by the official ``openai`` SDK (and the Agents SDK) over real HTTP against
``agentcell serve`` with the local provider behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from runtime.apps.server import ApiServer
from runtime.config import AgentProfile, Config
from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.app.support import sent

TOKEN = "clients-token"  # the bearer token of the server (conftest.py's server fixture reads it)

EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "strict": False,
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
        }
    ],
}


@pytest.fixture
def rt(sessions_dir: Path, gateway_transport: str) -> Iterator[Any]:
    from runtime import Runtime

    config = Config().with_overrides(
        {"retry.base_delay": 0.01, "retry.max_delay": 0.05, "gateway.transport": gateway_transport}
    )
    profiles = {
        "helper": AgentProfile(description="A helper.", model="openai/helper-model", system_prompt="Help.")
    }
    with Runtime(config, sessions_dir=sessions_dir, agents=profiles) as r:
        yield r


def codex_body(model: str, input: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A request as Codex 0.171 sends it by default (its fields, as recorded from ``codex exec``), as the
    SDK's keyword arguments (``client_metadata``, which the SDK does not know, in ``extra_body``)."""
    return {
        "model": model,
        "input": input,
        "tools": [EXEC, NAMESPACE, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "extra_body": {"client_metadata": CLIENT_METADATA},
        **extra,
    }


CLIENT_METADATA = {"session_id": "thread-1", "x-codex-window-id": "thread-1:0"}
DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be Codex."}]}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_codex_default_request_is_taken_with_its_meaning(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(
        Turn(
            reasoning="Run ls first.", tool_calls=(ToolCallSpec(name="spawn_agent", arguments="{}", id="c1"),)
        ),
    )
    body = codex_body(model, [DEVELOPER, user("list files")])
    raw = client.responses.with_raw_response.create(**body)
    assert raw.headers["x-agentcell-tools-not-offered"] == "web_search"
    assert raw.headers["x-request-id"].startswith("req_")
    events = list(raw.parse())
    final = events[-1].response
    assert events[-1].type == "response.completed", [e.type for e in events]
    assert final.metadata == CLIENT_METADATA and final.prompt_cache_key == "thread-1"
    assert final.instructions is None  # the developer message is input, not the response's instructions
    reasoning, call = final.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert call.type == "function_call" and call.name == "spawn_agent" and call.namespace == "multi_agent_v1"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.model_dump() for i in done] == [i.model_dump() for i in final.output]
    request = provider.request_log[-1].body
    offered = [t["function"]["name"] for t in request["tools"]]
    assert offered[-2:] == ["exec_command", "spawn_agent"] and "web_search" not in str(offered)
    assert request["messages"][0] == {"role": "system", "content": "Be Codex."}
    assert not any(e.type.startswith("agentcell.") for e in events)  # not asked for


def test_sealed_reasoning_comes_back_as_the_models_own_and_a_forged_token_is_refused(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(
        Turn(
            reasoning="The secret plan: ls.",
            tool_calls=(ToolCallSpec(name="exec_command", arguments="{}", id="c7"),),
        ),
        Turn(text="Done."),
    )
    first = client.responses.create(**codex_body(model, [user("go")], stream=False))
    reasoning, call = first.output
    assert reasoning.encrypted_content and "secret" not in reasoning.encrypted_content  # opaque
    history = [
        user("go"),
        {**reasoning.model_dump(exclude_none=True), "summary": []},  # only the token carries the text
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": "c7", "output": "a.txt"},
    ]
    second = client.responses.create(**codex_body(model, history, stream=False, store=True))
    assert second.output_text == "Done."
    kept = client.responses.input_items.list(second.id, order="asc").data
    assert [i.summary[0].text for i in kept if i.type == "reasoning"] == ["The secret plan: ls."]

    token = reasoning.encrypted_content
    forged = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    history[1] = {**history[1], "encrypted_content": forged}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(**codex_body(model, history, stream=False))
    assert raised.value.body["param"] == "input[1].encrypted_content"  # type: ignore[index]


def test_the_apis_shape_on_every_route(client: openai.OpenAI, server: ApiServer, script: Any) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for method, path, status in (
        ("GET", "/v1/nowhere", 404),
        ("DELETE", "/v1/responses", 405),
        ("PUT", "/v1/conversations/conv_x", 405),
    ):
        answer = httpx.request(method, f"{server.url}{path}", headers=headers)
        assert answer.status_code == status
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert answer.headers["x-request-id"].startswith("req_")
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.retrieve("resp_" + "0" * 32)
    assert raised.value.request_id and raised.value.request_id.startswith("req_")

    models = [m.id for m in client.models.list()]
    assert models[0] == "helper" and "openai/helper-model" in models
    assert client.models.retrieve("helper").id == "helper"

    model = script(Turn(text="counted"))
    counted = client.responses.input_tokens.count(model=model, input="how many tokens is this?", tools=[EXEC])
    alone = client.responses.input_tokens.count(model=model, input="how many tokens is this?")
    assert counted.object == "response.input_tokens" and 0 < alone.input_tokens < counted.input_tokens

    response = client.responses.with_raw_response.create(model=model, input="hi").http_response.json()
    assert type(response["created_at"]) is int  # an integer, as the API sends (the SDK makes it a float)


def test_agentcell_events_only_for_a_client_that_asks(client: openai.OpenAI, script: Any) -> None:
    model = script(
        Turn(fault=Fault(kind="server_error")),
        Turn(text="ok"),
        Turn(fault=Fault(kind="server_error")),
        Turn(text="ok"),
    )
    plain = list(client.responses.create(model=model, input="a", stream=True))
    asked = list(client.responses.create(model=model, input="b", stream=True, include=["agentcell.events"]))  # type: ignore[list-item]
    assert not [e for e in plain if e.type.startswith("agentcell.")]
    assert "agentcell.provider_retry" in [e.type for e in asked]


def test_a_retry_mid_stream_leaves_every_done_event_and_the_response_true(
    client: openai.OpenAI, rt: Any, script: Any
) -> None:
    model = script(
        Turn(fault=Fault(kind="stream_error", after_chunks=3)),
        Turn(text="recovered after a mid-stream error"),
    )
    seen: list[Any] = []
    subscription = rt.subscribe("*", ("text_delta", "stream_reset"), callback=seen.append)
    with client.responses.stream(model=model, input="hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    subscription.close()
    streamed: dict[str, str] = {}
    for event in events:
        if event.type == "response.output_text.delta":
            streamed[event.item_id] = streamed.get(event.item_id, "") + event.delta
    done = {e.item_id: e.text for e in events if e.type == "response.output_text.done"}
    assert done == streamed and len(done) == 2  # the broken attempt's item, and the retry's
    items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.status for i in items] == ["incomplete", "completed"]
    assert [i.model_dump(exclude_none=True) for i in items] == [
        i.model_dump(exclude_none=True) for i in final.output
    ]
    assert final.output[1].content[0].text == "recovered after a mid-stream error"  # type: ignore[union-attr]
    kept = client.responses.retrieve(final.id).output
    assert [i.model_dump(exclude_none=True) for i in kept] == [i.model_dump(exclude_none=True) for i in items]

    # the runtime's own events: a stream_reset says to drop what the failed attempt streamed
    reset = _last_reset(seen)
    assert reset > 0 and seen[reset].attempt == 1
    assert "".join(e.delta for e in seen[:reset] if e.type == "text_delta") == streamed[final.output[0].id]
    after = "".join(e.delta for e in seen[reset:] if e.type == "text_delta")
    assert after == "recovered after a mid-stream error"


def _last_reset(events: list[Any]) -> int:
    return max((i for i, e in enumerate(events) if e.type == "stream_reset"), default=-1)


def test_a_model_name_no_provider_serves_is_model_not_found(server: ApiServer) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)
    agents.set_default_openai_client(client, use_for_tracing=False)
    agent = agents.Agent(name="two", instructions="Hi.", model="openai/two")  # the SDK sends "two"
    with pytest.raises(openai.BadRequestError) as raised:
        asyncio.run(agents.Runner.run(agent, "hello"))
    body = raised.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found" and body["param"] == "model"
    assert "openai/two" in body["message"]


def test_a_conversation_refuses_an_output_for_no_call_and_items_can_be_deleted(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(Turn(text="first"), Turn(text="second"))
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "one"}])
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.create(
            conversation.id, items=[{"type": "function_call_output", "call_id": "nobody", "output": "x"}]
        )
    client.responses.create(model=model, input="two", conversation=conversation.id)
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [getattr(i, "role", None) for i in items] == ["user", "user", "assistant"]
    client.conversations.items.delete(items[1].id, conversation_id=conversation.id)
    left = client.conversations.items.list(conversation.id, order="asc").data
    assert [i.content[0].text for i in left] == ["one", "first"]  # type: ignore[union-attr]
    client.responses.create(model=model, input="three", conversation=conversation.id)
    texts = [m.get("content") for m in sent(provider, model)[-1] if m["role"] != "system"]
    assert "two" not in str(texts) and "one" in str(texts) and "three" in str(texts)


@pytest.mark.slow  # two real servers, one killed with SIGKILL
def test_a_response_id_survives_a_kill_mid_stream_and_can_be_continued(
    tmp_path: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from tests.serve import serve_process

    provider.add_script("crash-script", [Turn(text="never finished", latency=15)])
    provider.add_script(
        "crash-after", [Turn(text="continued after the crash")]
    )  # (one script's turns wait in turn)
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    sessions = tmp_path / "sessions"
    with serve_process(sessions, "--token", TOKEN, check_exit=False) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=TOKEN, max_retries=0)
        stream = client.responses.create(model="openai/crash-script", input="remember me", stream=True)
        first = next(iter(stream))
        assert first.type == "response.created"
        response_id = first.response.id
        served.process.send_signal(signal.SIGKILL)
        served.process.wait(timeout=30)
        client.close()
    with serve_process(sessions, "--token", TOKEN) as served:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=TOKEN, max_retries=0, timeout=60)
        interrupted = client.responses.retrieve(response_id)
        assert interrupted.status == "failed" and interrupted.error is not None
        assert "server stopped" in interrupted.error.message
        again = client.responses.create(
            model="openai/crash-after", input="go on", previous_response_id=response_id
        )
        assert again.status == "completed" and again.output_text == "continued after the crash"
        client.close()
    texts = [str(m.get("content")) for m in sent(provider, "crash-after")[-1]]
    assert "remember me" in texts and "go on" in texts  # the first input was kept, the thread went on


def test_a_first_response_whose_session_a_kill_left_unwritten_goes_on_in_a_session_of_its_own(
    client: openai.OpenAI, rt: Any, provider: Any, script: Any
) -> None:
    """What a server SIGKILLed right after a thread's first ``response.created`` can leave: the response's record
    (written before the first byte) naming a session the log writer had not yet written. Going on from it
    starts the thread again with that response's input, not a 500 ``SessionNotFound`` (seen under load in the
    kill test above)."""
    from runtime.apps.responses.api import ResponseRecord
    from runtime.apps.responses.records import Records, new_response_id
    from runtime.messages import new_id

    model = script(Turn(text="continued after the crash"), Turn(text="nothing more"))
    record = ResponseRecord(
        id=new_response_id(), session_id=new_id(), model=model, input_items=[user("remember me")]
    )
    Records(rt.sessions_path).save_response(record)  # in_progress, as the killed server left it
    interrupted = client.responses.retrieve(record.id)
    assert interrupted.status == "failed" and interrupted.error is not None
    again = client.responses.create(model=model, input="go on", previous_response_id=record.id)
    assert again.status == "completed" and again.output_text == "continued after the crash"
    texts = [str(m.get("content")) for m in sent(provider, model)[-1]]
    assert "remember me" in texts and "go on" in texts  # the first input was kept, the thread went on
    later = client.responses.create(model=model, input="and then?", previous_response_id=again.id)
    assert [str(m.get("content")) for m in sent(provider, model)[-1]][-3:] == [
        "go on",
        "continued after the crash",
        "and then?",
    ]
    assert later.status == "completed" and later.output_text == "nothing more"


def as_input(items: list[Any]) -> list[dict[str, Any]]:
    """Output items as a client sends them back (what it was given, without nulls)."""
    return [i.model_dump(exclude_none=True) for i in items]


def test_a_stateless_client_goes_on_in_one_session_and_store_false_leaves_no_text(
    server: ApiServer, rt: Any, provider: Any, script: Any, sessions_dir: Path
) -> None:
    model = script(
        Turn(
            reasoning="Look first.", tool_calls=(ToolCallSpec(name="exec_command", arguments="{}", id="c1"),)
        ),
        Turn(text="It holds a secret-ish note."),
        Turn(text="Nothing more to say."),
    )
    before = {s.id for s in rt.list_sessions()}
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    history: list[dict[str, Any]] = [DEVELOPER, user("what is in the box-4711?")]
    first = client.responses.create(**codex_body(model, history, stream=False))
    history += [
        *as_input(first.output),
        {"type": "function_call_output", "call_id": "c1", "output": "a note"},
    ]
    second = client.responses.create(**codex_body(model, history, stream=False))
    assert second.output_text == "It holds a secret-ish note."
    history += [*as_input(second.output), user("anything else?")]
    third = client.responses.create(**codex_body(model, history, stream=False))
    assert third.output_text == "Nothing more to say."

    started = {s.id for s in rt.list_sessions()} - before
    assert len(started) == 1  # one session for the whole thread, not one a request
    (session,) = started
    roles = [m.role for m in rt.messages(session)]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]  # each message once
    assert [m["role"] for m in sent(provider, model)[-1]] == ["system", *roles[:-1]]
    assert rt.usage(session).input_tokens > 0

    client.close()
    server.stop()
    assert any("box-4711" in p.read_text(errors="ignore") for p in sessions_dir.rglob("*") if p.is_file())
    with ApiServer(rt, TOKEN):  # a restart lets go of the store: false sessions the last run left
        assert session not in {s.id for s in rt.list_sessions()}
        assert not [
            p for p in sessions_dir.rglob("*") if p.is_file() and "box-4711" in p.read_text(errors="ignore")
        ]


def test_dropped_streams_waiting_for_a_session_are_cancelled_and_the_queue_is_bounded(
    client: openai.OpenAI, server: ApiServer, provider: Any, script: Any
) -> None:
    from runtime.apps.responses.door import MAX_QUEUED

    model = script(Turn(text="r0"), Turn(text="r1", latency=3), Turn(text="the real answer"))
    r0 = client.responses.create(model=model, input="start")
    running = client.responses.create(model=model, input="slow", previous_response_id=r0.id, stream=True)
    assert next(iter(running)).type == "response.created"  # (r1 holds the session for 3 s)
    body = {"model": model, "input": "dropped", "previous_response_id": r0.id, "stream": True}
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def drop_and_overflow() -> int:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
            for _ in range(40):  # clients that go away from a response still queued behind r1
                async with http.stream("POST", "/v1/responses", json=body) as answer:
                    assert answer.status_code == 200
                    async for line in answer.aiter_lines():
                        if line.startswith("data:"):
                            break  # (response.created) and gone
            held = []
            for _ in range(MAX_QUEUED + 1):  # a queue that stays: bounded
                stream = http.stream("POST", "/v1/responses", json=body)
                answer = await stream.__aenter__()
                held.append((stream, answer))
                if answer.status_code != 200:
                    break
            status = held[-1][1].status_code
            error = (await held[-1][1].aread()).decode() if status != 200 else ""
            for stream, _ in reversed(held):
                await stream.__aexit__(None, None, None)
            assert "too_many_queued_responses" in error, error
            return status

    assert asyncio.run(drop_and_overflow()) == 429
    real = client.responses.create(model=model, input="the real one", previous_response_id=r0.id)
    assert real.output_text == "the real answer"  # no dropped response ran a turn (each would take one)
    assert len(sent(provider, model)) == 3
    list(running)


def files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text in p.read_text(errors="ignore")]


def test_store_false_writes_nothing_when_it_goes_on_from_a_stored_response_or_in_a_conversation(
    client: openai.OpenAI, provider: Any, script: Any, sessions_dir: Path
) -> None:
    model = script(
        Turn(text="stored answer"),
        Turn(text="secret answer-9931"),
        Turn(text="secret answer-9932"),
        Turn(text="fine"),
    )
    stored = client.responses.create(model=model, input="a stored question", instructions="Be kind.")
    off = client.responses.create(
        model=model, input="secret question-9931", previous_response_id=stored.id, store=False
    )
    assert off.output_text == "secret answer-9931"
    assert [m.get("content") for m in sent(provider, model)[-1]] == [
        "Be kind.",
        "a stored question",
        "stored answer",
        "secret question-9931",
    ]  # the model saw the stored thread
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "hello"}]
    )
    before = client.conversations.items.list(conversation.id).data
    inside = client.responses.create(
        model=model, input="secret question-9932", conversation=conversation.id, store=False
    )
    assert inside.output_text == "secret answer-9932"
    assert client.conversations.items.list(conversation.id).data == before  # nothing added to it
    for marker in ("question-9931", "answer-9931", "question-9932", "answer-9932"):
        assert files_holding(sessions_dir, marker) == [], marker
    after = client.responses.create(model=model, input="and now?", previous_response_id=stored.id)
    assert "9931" not in str(sent(provider, model)[-1])  # the stored thread never saw it
    assert after.previous_response_id == stored.id


def test_responses_compact_gives_a_window_that_goes_on_in_the_compacted_session(
    client: openai.OpenAI, rt: Any, provider: Any, script: Any
) -> None:
    model = script(
        Turn(text="first answer"),
        Turn(text="second answer"),
        Turn(text="SUMMARY-77: the user asked about boxes."),
        Turn(text="after the compaction"),
        Turn(text="stored first"),
        Turn(text="stored second"),
        Turn(text="SUMMARY-78: stored."),
        Turn(text="stored after"),
    )
    before = {s.id for s in rt.list_sessions()}
    long = "what about boxes? " + "The boxes are stacked on shelves in the north hall. " * 60
    history = [user(long)]
    first = client.responses.create(**codex_body(model, history, stream=False))
    history += [*as_input(first.output), user(long)]
    second = client.responses.create(**codex_body(model, history, stream=False))
    history += as_input(second.output)
    compacted = client.responses.compact(model=model, input=history)  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    assert [i.type for i in compacted.output] == ["message", "message", "compaction"]
    assert compacted.output[0].content[0].text == long  # type: ignore[union-attr]
    window = [*as_input(compacted.output), user("and now?")]
    after = client.responses.create(**codex_body(model, window, stream=False))
    assert after.output_text == "after the compaction"
    assert "SUMMARY-77" in str(sent(provider, model)[-1])  # the model goes on from the summary
    assert len({s.id for s in rt.list_sessions()} - before) == 1  # in the compacted session
    forged = {**window[-2], "encrypted_content": window[-2]["encrypted_content"][:-4] + "AAAA"}
    with pytest.raises(openai.BadRequestError):
        client.responses.create(**codex_body(model, [*window[:-2], forged, user("x")], stream=False))

    stored = client.responses.create(model=model, input=long + " Remember the shelf.")
    stored = client.responses.create(model=model, input=long, previous_response_id=stored.id)
    squeezed = client.responses.compact(model=model, previous_response_id=stored.id)  # type: ignore[arg-type]
    on = client.responses.create(model=model, input="go on", previous_response_id=squeezed.id)
    assert on.output_text == "stored after" and "SUMMARY-78" in str(sent(provider, model)[-1])
    with pytest.raises(openai.BadRequestError):  # nothing this server holds
        client.responses.compact(model=model, input=[user("never seen")])  # type: ignore[arg-type]
