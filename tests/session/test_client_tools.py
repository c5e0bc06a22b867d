"""Client-side tools (``TurnOptions.client_tools``): a run stops after the model's calls to tools the client
runs, without running them; the next ``Runtime.send`` brings their results and the thread goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.protocol import TurnOptions
from runtime import Runtime
from runtime.context.integrity import INTERRUPTED_TEXT
from runtime.messages import tool_result, user
from runtime.provider.script import ToolCallSpec, Turn

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
OPTIONS = TurnOptions(client_tools=(WEATHER,))


def _tool_messages(provider: Any, model: str) -> list[dict[str, Any]]:
    return [m for m in _last(provider, model)["messages"] if m.get("role") == "tool"]


def _last(provider: Any, model: str) -> dict[str, Any]:
    """The body of the newest request for ``model``."""
    return dict([r for r in provider.request_log if r.model == model.removeprefix("openai/")][-1].body)


def test_a_client_tool_call_stops_the_run_and_its_result_continues_the_thread(
    rt: Runtime, provider: Any, script: Any
) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Oslo"}', id="call_w1"),)),
        Turn(text="It is sunny in Oslo."),
    )
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
    first = rt.send(sid, [user("Weather in Oslo?")], options=OPTIONS).result(timeout=30)
    assert first.status == "ok"
    assert [(c.id, c.name, c.arguments) for c in first.awaiting] == [
        ("call_w1", "get_weather", '{"city": "Oslo"}')
    ]
    assert first.message is not None and first.message.tool_calls
    assert [t["function"]["name"] for t in _last(provider, model).get("tools", [])] == [
        "get_weather"
    ]  # the model saw the tool
    assert rt.messages(sid)[-1].role == "assistant"  # nothing ran, no error result was made up

    second = rt.send(sid, [tool_result("call_w1", "get_weather", "sunny, 21 C")], options=OPTIONS).result(
        timeout=30
    )
    assert second.status == "ok" and second.text == "It is sunny in Oslo." and not second.awaiting
    assert [m["content"] for m in _tool_messages(provider, model)] == ["sunny, 21 C"]
    assert [m.role for m in rt.messages(sid)] == ["user", "assistant", "tool", "assistant"]


def test_the_sessions_own_tools_run_in_the_same_step_and_the_client_ones_wait(
    rt: Runtime, provider: Any, script: Any, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("hello")
    model = script(
        Turn(
            tool_calls=(
                ToolCallSpec(name="read_file", arguments='{"path": "notes.txt"}', id="call_own"),
                ToolCallSpec(name="get_weather", arguments='{"city": "Rome"}', id="call_cli"),
            )
        ),
        Turn(text="done"),
    )
    sid = rt.start_session(
        model=model, api_base=provider.url, api_key="sk-local", tools="builtin", workspace=workspace
    )
    first = rt.send(sid, [user("Read and check the weather")], options=OPTIONS).result(timeout=30)
    assert [c.id for c in first.awaiting] == ["call_cli"]
    recorded = rt.messages(sid)
    assert [(m.role, m.tool_call_id) for m in recorded[-2:]] == [("assistant", None), ("tool", "call_own")]
    assert "hello" in recorded[-1].text
    second = rt.send(sid, [tool_result("call_cli", "get_weather", "rainy")], options=OPTIONS).result(
        timeout=30
    )
    assert second.text == "done"
    own, client = _tool_messages(provider, model)  # each result right after its call, in call order
    assert "hello" in own["content"] and client["content"] == "rainy"


def test_a_restart_keeps_the_client_calls_waiting(sessions_dir: Path, provider: Any, script: Any) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Lima"}', id="call_r"),)),
        Turn(text="warm"),
    )
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
        assert rt.send(sid, [user("Lima?")], options=OPTIONS).result(timeout=30).awaiting
    with Runtime(sessions_dir=sessions_dir) as rt:
        rt.resume_session(sid, api_key="sk-local")
        assert rt.messages(sid)[-1].role == "assistant"  # recovery made up no result for the waiting call
        done = rt.send(sid, [tool_result("call_r", "get_weather", "28 C")], options=OPTIONS).result(
            timeout=30
        )
        assert done.text == "warm"
        assert [m["content"] for m in _tool_messages(provider, model)] == ["28 C"]


def test_a_prompt_without_the_results_repairs_the_waiting_calls(
    rt: Runtime, provider: Any, script: Any
) -> None:
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="get_weather", arguments='{"city": "Oslo"}', id="call_x"),)),
        Turn(text="never mind then"),
    )
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
    assert rt.send(sid, [user("Oslo?")], options=OPTIONS).result(timeout=30).awaiting
    result = rt.prompt(sid, "forget it").result(timeout=30)
    assert result.text == "never mind then"
    assert [m["content"] for m in _tool_messages(provider, model)] == [INTERRUPTED_TEXT]


def test_options_set_the_runs_instructions_and_can_turn_compaction_off(
    rt: Runtime, provider: Any, script: Any
) -> None:
    model = script(Turn(text="a"), Turn(text="b"))
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local", system_prompt="session")
    rt.send(sid, [user("one")], options=TurnOptions(instructions="for this run")).result(timeout=30)
    assert _last(provider, model)["messages"][0] == {"role": "system", "content": "for this run"}
    rt.send(sid, [user("two")]).result(timeout=30)
    assert _last(provider, model)["messages"][0] == {"role": "system", "content": "session"}
