"""The Responses API front door with agent profiles as models: the server's own tools (``mcp_call`` items),
and ``truncation``: agentcell's compaction, or a context overflow as an error."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from runtime import Runtime
from runtime.apps.server import ApiServer
from runtime.config import Config
from runtime.provider.script import ToolCallSpec, Turn
from tests.scenarios.workload import filler

TOKEN = "profiles-token"
_names = itertools.count()


@pytest.fixture
def models(provider: Any) -> dict[str, str]:
    n = next(_names)
    chatty = f"chatty-p{n}"
    provider.add_script(
        chatty, [Turn(text="Noted. " + " ".join(f"detail{i}" for i in range(120)))], loop=True
    )
    tools = f"tools-p{n}"
    provider.add_script(
        tools,
        [
            Turn(tool_calls=(ToolCallSpec(name="list_dir", arguments='{"path": "."}', id="call_ls"),)),
            Turn(text="The directory could not be listed."),
        ],
        loop=True,
    )
    return {"chatty": f"openai/{chatty}", "tools": f"openai/{tools}"}


@pytest.fixture
def client(
    sessions_dir: Path, provider: Any, models: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[openai.OpenAI]:
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    chatty = models["chatty"]
    agents = {
        "tiny": {  # a 4,000-token window: a few turns fill it
            "description": "a model with a small window",
            "model": chatty,
            "system_prompt": "You take notes.",
            "tools": "none",
            "config": {
                "models.context_windows": {chatty: 4_000, "openai/summarizer": 32_000},
                "compaction.reserve_tokens": 500,
                "compaction.summarizer_model": "openai/summarizer",
            },
        },
        "lister": {"description": "lists files", "model": models["tools"], "tools": ["list_dir"]},
    }
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    with (
        Runtime(config, sessions_dir=sessions_dir, agents=agents) as rt,
        ApiServer(rt, TOKEN) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0, timeout=60) as c,
    ):
        yield c


def test_the_servers_own_tools_are_mcp_call_items(client: openai.OpenAI) -> None:
    response = client.responses.create(model="lister", input="What is in the directory?")
    assert response.model == "lister"
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_call", "message"]
    call = response.output[0]
    assert call.name == "list_dir" and call.server_label == "agentcell" and call.arguments == '{"path": "."}'
    assert call.status == "failed" and "no workspace" in (call.output or "")  # the tool ran on the server
    assert call.error is not None and call.error.type == "mcp_tool_execution_error"
    assert response.output_text == "The directory could not be listed."

    events = list(client.responses.create(model="lister", input="again", stream=True))
    types = [e.type for e in events]
    order = [
        "response.output_item.added",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.failed",
        "response.output_item.done",
    ]
    positions = [types.index(t) for t in order]
    assert positions == sorted(positions), types
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done[0].type == "mcp_call" and "no workspace" in (done[0].output or "")
    assert events[-1].response.output[0].model_dump() == done[0].model_dump()


def test_truncation_auto_compacts_and_a_client_that_asks_sees_the_extra_events(client: openai.OpenAI) -> None:
    previous: str | None = None
    extra: list[str] = []
    for turn in range(8):
        text = f"Note {turn}: {filler(2_400, f't{turn}')}"
        if turn % 2:  # the raw stream; and the SDK's helper, which builds the response from the events
            events = list(
                client.responses.create(
                    model="tiny",
                    input=text,
                    previous_response_id=previous,
                    stream=True,
                    include=["agentcell.events"],  # type: ignore[list-item]
                )
            )
            assert events[-1].type == "response.completed", [e.type for e in events]
            previous = events[-1].response.id
        else:
            with client.responses.stream(
                model="tiny",
                input=text,
                previous_response_id=previous,
                include=["agentcell.events"],  # type: ignore[list-item]
            ) as stream:
                events = list(stream)
                final = stream.get_final_response()
            assert final.status == "completed" and final.output_text.startswith("Noted.")
            previous = final.id
        extra += [
            f"{'raw' if turn % 2 else 'helper'} {e.type}" for e in events if e.type.startswith("agentcell.")
        ]
    for kind in ("raw", "helper"):  # (the window fills every other turn or so: both kinds see compactions)
        assert f"{kind} agentcell.compaction_start" in extra and f"{kind} agentcell.compaction_end" in extra


def test_truncation_disabled_makes_an_overflow_an_error(client: openai.OpenAI) -> None:
    previous: str | None = None
    with pytest.raises(openai.BadRequestError) as raised:
        for turn in range(12):
            response = client.responses.create(
                model="tiny",
                input=f"Note {turn}: {filler(2_400, f'd{turn}')}",
                previous_response_id=previous,
                truncation="disabled",
            )
            assert response.truncation == "disabled"
            previous = response.id
    error = raised.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert previous is not None  # some turns fitted before the window was full
    # the session stays usable: an earlier point of it goes on
    assert (
        client.responses.create(model="tiny", input="short", previous_response_id=previous).status
        == "completed"
    )


def test_a_client_tool_named_like_a_server_tool_is_refused(client: openai.OpenAI) -> None:
    clash = {"type": "function", "name": "list_dir", "parameters": {"type": "object", "properties": {}}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model="lister", input="list it", tools=[clash])
    error = raised.value.body
    assert isinstance(error, dict) and error["param"] == "tools" and "list_dir" in error["message"]
