"""Prompt-cache hints (design §4.7): where the runtime places breakpoints, how each provider is told, and that
a request's prefix stays byte for byte the same from one step to the next."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from runtime import messages as m
from runtime.config import RetryConfig
from runtime.context.caching import MAX_BREAKPOINTS, min_cacheable_tokens, place_breakpoints
from runtime.gateway import CacheHints, CompletionRequest, Gateway, IoLoop, cache_hints, complete_sync
from runtime.gateway.transports.litellm import build_call_kwargs
from runtime.gateway.transports.openai_compat import request_body
from runtime.provider import LocalProvider, Turn
from runtime.tokens import TokenCounter

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool. " + "It does one thing well. " * 20,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("edit_file", "read_file", "write_file")
]
SYSTEM = m.system("You are a careful engineer. " + "Follow the house rules to the letter. " * 150)


def step_history(steps: int) -> list[m.Message]:
    """A system prompt, a prompt and ``steps`` tool steps (a call and a ~700-token result each)."""
    history = [SYSTEM, m.user("Read the files and tell me what they hold.")]
    for i in range(steps):
        call = m.ToolCallPart(id=f"call_{i}", name="read_file", arguments=f'{{"path": "f{i}.txt"}}')
        # (with a word of text: litellm leaves out the null content of a bare call, the native transport does not)
        history.append(m.Message(role="assistant", parts=(m.TextPart(f"Reading f{i}."), call)))
        history.append(m.tool_result(f"call_{i}", "read_file", f"line {i} of the file, with words\n" * 100))
    return history


def hints(model: str, messages: list[m.Message], tools: list[dict[str, Any]] = TOOLS) -> CacheHints:
    return cache_hints(model, messages, tools, TokenCounter(model), key="session-1")


def count(message: m.Message) -> int:
    return TokenCounter("openai/gpt-4o").count_message(message)


# --- placement ---------------------------------------------------------------------------------------------


def test_breakpoints_go_on_the_system_prompt_the_summary_and_the_last_two_ends() -> None:
    summary = m.Message(role="user", parts=(m.TextPart("[Previous conversation summary]\n" + "x " * 600),))
    summary = msgspec.structs.replace(summary, kind=m.KIND_COMPACTION_SUMMARY)
    history = [SYSTEM, summary, *step_history(3)[1:]]
    marks = place_breakpoints(history, count=count, tools_tokens=300, minimum=1_024)
    # the system prompt (tools + system), the summary, the previous step's end and the last message
    assert marks.positions == (0, 1, len(history) - 3, len(history) - 1)
    assert not marks.tools


def test_never_more_than_four_and_never_on_a_prefix_shorter_than_the_minimum() -> None:
    short = [m.system("Be brief."), m.user("hi")]
    assert place_breakpoints(short, count=count, tools_tokens=0, minimum=1_024).positions == ()
    history = step_history(6)
    for minimum in (1, 1_024, 2_048, 4_096, 10_000):
        marks = place_breakpoints(history, count=count, tools_tokens=200, minimum=minimum)
        assert len(marks.positions) + int(marks.tools) <= MAX_BREAKPOINTS
        for position in marks.positions:
            prefix = 200 + sum(count(msg) for msg in history[: position + 1])
            assert prefix >= minimum, (minimum, position, prefix)
    # the system prompt alone is ~1,500 tokens: marked at 1,024, not at 2,048
    assert 0 in place_breakpoints(history, count=count, tools_tokens=0, minimum=1_024).positions
    assert 0 not in place_breakpoints(history, count=count, tools_tokens=0, minimum=2_048).positions


def test_without_a_system_prompt_the_tools_are_marked() -> None:
    big_tools = TOOLS * 10
    marks = place_breakpoints(step_history(1)[1:], count=count, tools_tokens=2_000, minimum=1_024)
    assert marks.tools
    assert hints("anthropic/claude-sonnet-4-5", step_history(1)[1:], big_tools).tools


def test_minimums_follow_the_model() -> None:
    assert min_cacheable_tokens("anthropic/claude-sonnet-4-5") == 1_024
    assert min_cacheable_tokens("anthropic/claude-opus-4-5-20251101") == 4_096
    assert min_cacheable_tokens("bedrock/anthropic.claude-3-5-haiku-20241022-v1:0") == 2_048
    assert min_cacheable_tokens("openai/gpt-4o") == 1_024


# --- rendering ---------------------------------------------------------------------------------------------


def marks_in(body: dict[str, Any]) -> list[tuple[int, str]]:
    """(message index, where) of every cache_control in a chat-completions body."""
    found: list[tuple[int, str]] = []
    for i, message in enumerate(body["messages"]):
        if "cache_control" in message:
            found.append((i, "message"))
        for part in message.get("content") if isinstance(message.get("content"), list) else ():
            if "cache_control" in part:
                found.append((i, "part"))
        for call in message.get("tool_calls") or ():
            if "cache_control" in call:
                found.append((i, "tool_call"))
    return found


def test_anthropic_style_models_get_cache_control_on_the_marked_blocks_and_no_key() -> None:
    history = step_history(3)
    for model in (
        "anthropic/claude-sonnet-4-5",
        "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0",
        "vertex_ai/claude-sonnet-4-5",
    ):
        request = CompletionRequest(model=model, messages=history, tools=TOOLS, cache=hints(model, history))
        kwargs = build_call_kwargs(request)
        assert "prompt_cache_key" not in kwargs
        # the system prompt, the previous step's result and the last result
        assert marks_in(kwargs) == [(0, "part"), (5, "message"), (7, "message")], model
        assert kwargs["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    hour = CompletionRequest(
        model="anthropic/claude-sonnet-4-5",
        messages=history,
        cache=CacheHints(breakpoints=(0,), ttl="1h"),
    )
    assert build_call_kwargs(hour)["messages"][0]["content"][0]["cache_control"] == {
        "type": "ephemeral",
        "ttl": "1h",
    }


def test_openai_style_models_get_a_prompt_cache_key_and_no_cache_control() -> None:
    history = step_history(3)
    for model in ("openai/gpt-4.1", "gpt-4o"):
        request = CompletionRequest(model=model, messages=history, tools=TOOLS, cache=hints(model, history))
        kwargs = build_call_kwargs(request)
        assert kwargs["prompt_cache_key"] == "session-1"
        assert marks_in(kwargs) == [] and all("cache_control" not in t for t in kwargs["tools"])
    other = CompletionRequest(model="deepseek/deepseek-chat", messages=history, cache=hints("x", history))
    assert "prompt_cache_key" not in build_call_kwargs(other) and marks_in(build_call_kwargs(other)) == []


def test_a_marked_assistant_tool_call_and_the_tools() -> None:
    history = step_history(2)[1:]  # no system prompt
    request = CompletionRequest(
        model="anthropic/claude-sonnet-4-5",
        messages=history,
        tools=TOOLS,
        cache=CacheHints(breakpoints=(1, 2), tools=True),
    )
    kwargs = build_call_kwargs(request)
    assert marks_in(kwargs) == [(1, "tool_call"), (2, "message")]
    assert "cache_control" in kwargs["tools"][-1] and "cache_control" not in kwargs["tools"][0]


# --- byte-stable prefixes ------------------------------------------------------------------------------------


def test_two_steps_requests_share_their_prefix_byte_for_byte() -> None:
    """What a step sends is, byte for byte, the start of what the next step sends (OpenAI's automatic cache
    matches bytes): no timestamps, the tools in one order, deterministic JSON."""
    model = "openai/gpt-4.1"
    io = IoLoop(name="test-cache-route")
    try:
        gateway = Gateway(io, RetryConfig(max_attempts=1))
        bodies = []
        for history in (step_history(3), step_history(4)):
            request = CompletionRequest(
                model=model, messages=history, tools=TOOLS, cache=hints(model, history)
            )
            bodies.append(request_body(request, gateway.route(request)))
    finally:
        io.stop()
    first, second = bodies
    end = first.index(b"]", first.rindex(b'"role":"tool"'))  # the end of the first request's messages
    assert second[:end] == first[:end]
    assert first[first.index(b'"tools"') :] in second  # the same tools, the same bytes


def test_breakpoints_move_but_the_content_before_them_does_not() -> None:
    """Anthropic's cache is keyed by content, not by where the marks are: with the marks taken out, a step's
    request is the start of the next's."""
    model = "anthropic/claude-sonnet-4-5"
    sent = []
    for history in (step_history(3), step_history(4)):
        request = CompletionRequest(model=model, messages=history, tools=TOOLS, cache=hints(model, history))
        sent.append(msgspec.json.encode(_unmarked(build_call_kwargs(request)["messages"])))
    assert sent[1].startswith(sent[0][:-1])


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
        content = out.get("content")
        if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
            out["content"] = content[0]["text"]  # a marked string content became one text part
        return out
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


# --- the native transport sends what litellm sends -------------------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        yield p


@pytest.mark.parametrize("model", ["openrouter/anthropic/claude-sonnet-4.5", "openai/cached-model"])
def test_the_native_transport_renders_the_hints_as_litellm_does(model: str, provider: LocalProvider) -> None:
    io = IoLoop(name="test-cache-parity")
    gateway = Gateway(io, RetryConfig(max_attempts=1))
    history = step_history(3)
    bodies = []
    try:
        for transport in ("litellm", "openai_compat"):
            provider.add_script(model.split("/", 1)[1], [Turn(text="Done.")])
            request = CompletionRequest(
                model=model,
                messages=history,
                tools=TOOLS,
                api_base=provider.url,
                api_key="sk-local",
                transport=transport,  # type: ignore[arg-type]
                cache=hints(model, history),
            )
            assert gateway.route(request).transport == transport
            result = complete_sync(gateway, request, timeout=60)
            assert result.ok, result.error
            bodies.append(provider.request_log[-1].body)
    finally:
        io.stop()
    assert bodies[1] == bodies[0]
    if model.startswith("openrouter/"):
        assert marks_in(bodies[0]) == [(0, "part"), (5, "part"), (7, "part")]
    else:
        assert bodies[0]["prompt_cache_key"] == "session-1" and marks_in(bodies[0]) == []
