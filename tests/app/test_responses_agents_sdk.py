"""The OpenAI Agents SDK (``openai-agents``) running an agent with a function tool against agentcell's
Responses API front door: ``OpenAIResponsesModel`` over an ``AsyncOpenAI`` client whose base URL is
``agentcell serve``, the local provider behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.apps.server import ApiServer
from runtime.provider.script import ToolCallSpec, Turn

agents = pytest.importorskip("agents")
openai = pytest.importorskip("openai")

TOKEN = "agents-sdk-token"


@pytest.fixture
def server(rt: Any, provider: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    agents.set_tracing_disabled(True)  # (the SDK would send traces to OpenAI)
    with ApiServer(rt, TOKEN) as s:
        yield s


def weather_agent(server: ApiServer, model: str, calls: list[str]) -> Any:
    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        calls.append(city)
        return f"sunny and 21 C in {city}"

    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)
    return agents.Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=agents.OpenAIResponsesModel(model=model, openai_client=client),
        tools=[get_weather],
    )


def tool_script(script: Any) -> str:
    return script(
        Turn(
            tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Oslo"}', id="call_agents_1"),)
        ),
        Turn(text="It is sunny and 21 C in Oslo."),
    )


def test_an_agents_sdk_agent_runs_its_function_tool_through_agentcell(
    server: ApiServer, provider: Any, script: Any
) -> None:
    model = tool_script(script)
    calls: list[str] = []
    result = asyncio.run(agents.Runner.run(weather_agent(server, model, calls), "Weather in Oslo?"))
    assert result.final_output == "It is sunny and 21 C in Oslo."
    assert calls == ["Oslo"]  # the tool ran in the client, as the SDK's own tool
    name = model.removeprefix("openai/")
    last = [r for r in provider.request_log if r.model == name][-1].body["messages"]
    assert last[0] == {"role": "system", "content": "Answer with the weather tool."}
    assert last[-1]["role"] == "tool" and last[-1]["content"] == "sunny and 21 C in Oslo"


def test_an_agents_sdk_agent_streams_through_agentcell(server: ApiServer, script: Any) -> None:
    model = tool_script(script)
    calls: list[str] = []

    async def run() -> tuple[Any, list[str]]:
        streamed = agents.Runner.run_streamed(weather_agent(server, model, calls), "Weather in Oslo?")
        kinds = [event.type async for event in streamed.stream_events()]
        return streamed, kinds

    streamed, kinds = asyncio.run(run())
    assert streamed.final_output == "It is sunny and 21 C in Oslo."
    assert calls == ["Oslo"] and "raw_response_event" in kinds


def test_an_agents_sdk_agent_chains_previous_response_ids(server: ApiServer, script: Any) -> None:
    model = tool_script(script)
    calls: list[str] = []
    agent = weather_agent(server, model, calls)
    result = asyncio.run(agents.Runner.run(agent, "Weather in Oslo?", auto_previous_response_id=True))
    assert result.final_output == "It is sunny and 21 C in Oslo." and calls == ["Oslo"]
    assert result.last_response_id is not None and result.last_response_id.startswith("resp_")
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0) as client:
        last = client.responses.retrieve(result.last_response_id)
        assert last.previous_response_id is not None  # the tool's output went back on the same thread
        assert [i.type for i in client.responses.input_items.list(last.id).data] == ["function_call_output"]
