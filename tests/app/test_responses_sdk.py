"""The Responses API front door (runtime/apps/responses) driven by the official ``openai`` SDK over real HTTP,
against ``agentcell serve`` with the local provider behind it."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from runtime.provider.script import ToolCallSpec, Turn
from tests.app.support import sent

TOKEN = "responses-token"  # the bearer token of the server (conftest.py's server fixture reads it)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_store_false_keeps_nothing(client: openai.OpenAI, rt: Any, script: Any) -> None:
    model = script(Turn(text="not kept"))
    before = {s.id for s in rt.list_sessions()}
    response = client.responses.create(model=model, input="forget this", store=False)
    assert response.output_text == "not kept" and response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="more", previous_response_id=response.id)
    # the session it started stays only while the client may go on with it (a stateless thread, bounded):
    # tests/app/test_responses_clients.py follows it to its end
    assert len({s.id for s in rt.list_sessions()} - before) == 1


def test_a_response_starts_a_session_and_is_kept(client: openai.OpenAI, provider: Any, script: Any) -> None:
    model = script(Turn(text="Hello there!", reasoning="The user greets me."))
    response = client.responses.create(model=model, input="Hi!", instructions="Be brief.")
    assert response.status == "completed" and response.object == "response"
    assert response.output_text == "Hello there!"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].summary[0].text == "The user greets me."
    assert response.instructions == "Be brief." and response.model == model
    assert response.usage is not None and response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert sent(provider, model)[-1][0] == {"role": "system", "content": "Be brief."}

    again = client.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()
    inputs = client.responses.input_items.list(response.id)
    assert [(i.type, i.role, i.content[0].text) for i in inputs.data] == [("message", "user", "Hi!")]

    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_previous_response_id_continues_and_an_older_one_branches(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    model = script(Turn(text="one"), Turn(text="two"), Turn(text="two again"))
    first = client.responses.create(model=model, input="first")
    second = client.responses.create(model=model, input="second", previous_response_id=first.id)
    assert second.output_text == "two" and second.previous_response_id == first.id
    assert [m["content"] for m in sent(provider, model)[-1]] == ["first", "one", "second"]
    # from the first response again: the second exchange is on another branch of the session's tree
    other = client.responses.create(model=model, input="instead", previous_response_id=first.id)
    assert other.output_text == "two again"
    assert [m["content"] for m in sent(provider, model)[-1]] == ["first", "one", "instead"]
    # and the second response still continues its own branch
    third_model = [m["content"] for m in sent(provider, model)[-1]]
    assert "second" not in third_model


def test_streaming_sends_the_api_events_in_order(client: openai.OpenAI, script: Any) -> None:
    model = script(Turn(text="Streaming works fine.", reasoning="Think first."))
    events = list(client.responses.create(model=model, input="stream please", stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    expected = [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]][2:-1] == expected
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Streaming works fine."
    done = events[-1].response
    assert done.output_text == "Streaming works fine." and done.status == "completed"
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [item.id for item in done.output]  # the stream's items are the response's
    assert client.responses.retrieve(done.id).output_text == "Streaming works fine."


def test_a_function_tool_round_trip(client: openai.OpenAI, provider: Any, script: Any) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Oslo"}', id="call_oslo"),)),
        Turn(text="Sunny in Oslo."),
    )
    first = client.responses.create(model=model, input="Weather in Oslo?", tools=[WEATHER_TOOL])
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id == "call_oslo"
    assert call.arguments == '{"city": "Oslo"}'
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_oslo", "output": "sunny, 21 C"}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "Sunny in Oslo."
    last = sent(provider, model)[-1]
    assert [m["role"] for m in last] == ["user", "assistant", "tool"]
    assert last[-1]["content"] == "sunny, 21 C" and last[-1]["tool_call_id"] == "call_oslo"
    items = client.responses.input_items.list(second.id)
    assert [(i.type, i.call_id) for i in items.data] == [("function_call_output", "call_oslo")]


def test_a_streamed_function_call(client: openai.OpenAI, script: Any) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Rome"}', id="call_rome"),)),
    )
    events = list(client.responses.create(model=model, input="Rome?", tools=[WEATHER_TOOL], stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == ['{"city": "Rome"}']
    item = [e.item for e in events if e.type == "response.output_item.done"][-1]
    assert item.type == "function_call" and item.call_id == "call_rome" and item.status == "completed"
    assert events[-1].type == "response.completed"


def test_conversations_keep_the_thread(client: openai.OpenAI, provider: Any, script: Any) -> None:
    model = script(Turn(text="Blue."), Turn(text="Still blue."))
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Remember: the colour is blue."}],
        metadata={"topic": "colours"},
    )
    assert conversation.object == "conversation" and conversation.metadata == {"topic": "colours"}
    first = client.responses.create(model=model, conversation=conversation.id, input="Which colour?")
    assert first.output_text == "Blue." and first.conversation is not None
    assert first.conversation.id == conversation.id
    assert [m["content"] for m in sent(provider, model)[-1]] == [
        "Remember: the colour is blue.",
        "Which colour?",
    ]
    client.conversations.items.create(conversation.id, items=[{"role": "user", "content": "Noted?"}])
    second = client.responses.create(model=model, conversation=conversation.id, input="And now?")
    assert second.output_text == "Still blue."
    assert [m["content"] for m in sent(provider, model)[-1]] == [
        "Remember: the colour is blue.",
        "Which colour?",
        "Blue.",
        "Noted?",
        "And now?",
    ]
    listed = client.conversations.items.list(conversation.id, order="asc")
    texts = [item.content[0].text for item in listed.data]
    assert texts == [
        "Remember: the colour is blue.",
        "Which colour?",
        "Blue.",
        "Noted?",
        "And now?",
        "Still blue.",
    ]
    newest = client.conversations.items.list(conversation.id, limit=2)
    assert [i.content[0].text for i in newest.data] == ["Still blue.", "And now?"] and newest.has_more
    item = client.conversations.items.retrieve(listed.data[2].id, conversation_id=conversation.id)
    assert item.role == "assistant"
    updated = client.conversations.update(conversation.id, metadata={"topic": "paint"})
    assert client.conversations.retrieve(conversation.id).metadata == updated.metadata == {"topic": "paint"}
    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_two_responses_at_once_in_a_conversation_go_one_after_the_other(
    client: openai.OpenAI, provider: Any, script: Any
) -> None:
    import threading

    model = script(Turn(text="first answer", latency=0.5), Turn(text="second answer", latency=0.5))
    conversation = client.conversations.create()
    answers: list[str] = []
    threads = [
        threading.Thread(
            target=lambda text=text: answers.append(
                client.responses.create(model=model, conversation=conversation.id, input=text).output_text
            )
        )
        for text in ("one", "two")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == ["first answer", "second answer"]
    last = [m["content"] for m in sent(provider, model)[-1]]
    assert len(last) == 3 and last[1] == "first answer"  # the second saw the first: one thread, not two
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert len(items) == 4


def test_the_sdks_stream_helper_accumulates_the_same_response(client: openai.OpenAI, script: Any) -> None:
    model = script(
        Turn(
            text="Let me check.",
            reasoning="A tool helps.",
            tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Oslo"}', id="call_h"),),
        ),
    )
    with client.responses.stream(model=model, input="Oslo?", tools=[WEATHER_TOOL]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Let me check." == final.output_text
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == '{"city": "Oslo"}'
    kept = client.responses.retrieve(final.id).output
    assert [(i.id, i.type) for i in kept] == [(i.id, i.type) for i in final.output]
