"""The native Anthropic transport (design §3.2): ``anthropic/`` models over the Messages API without litellm.

It must send what litellm's Anthropic request builder sends: the same request made through litellm and
natively reaches the local provider's ``/v1/messages`` as the same JSON body, with and without cache hints,
streamed or not. Then what it reads back: each thinking block with its own signature, sent back unchanged;
usage with the cache's reads and writes; errors mapped by Anthropic's error types. (Every gateway test of
tests/gateway/test_gateway.py, test_silence.py and test_e2e.py runs on it too.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import runtime  # noqa: F401  (offline environment)
from runtime import messages as m
from runtime.config import RetryConfig
from runtime.gateway import CacheHints, CompletionRequest, Gateway, IoLoop, complete_sync
from runtime.gateway._anthropic_body import request_body
from runtime.gateway._routing import Route
from runtime.gateway.transports.anthropic import AnthropicTransport, _Answer, _apply
from runtime.gateway.transports.openai_compat import ProviderHTTPError, StreamError
from runtime.provider import LocalProvider, ToolCallSpec, Turn

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "write_file")
]


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        p.cache_min_tokens = 16
        yield p


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    io = IoLoop(name="test-io-anthropic")
    gw = Gateway(io, RetryConfig(max_attempts=1))
    gw.preload().result(timeout=60)
    yield gw
    io.stop()


def history(provider: LocalProvider) -> list[m.Message]:
    """A session's history in every shape the runtime sends: system, a data: image, signed and redacted
    thinking, text, two tool calls answered by consecutive results, a follow-up."""
    signed = provider.messages.signer.sign("The user wants a.txt and b.txt.")
    return [
        m.system("You are careful."),
        m.user("Read a.txt and b.txt, and look at this.", "data:image/png;base64,iVBORw0KGgo="),
        m.Message(
            role="assistant",
            parts=(
                m.ReasoningPart("The user wants a.txt and b.txt.", signature=signed),
                m.ReasoningPart("", redacted=True, provider_metadata={"data": "EncryptedBlob=="}),
                m.TextPart("Reading them."),
                m.ToolCallPart(id="toolu_1", name="read_file", arguments='{"path": "a.txt"}'),
                m.ToolCallPart(id="call.2", name="read_file", arguments='{"path": "b.txt"}'),
            ),
        ),
        m.tool_result("toolu_1", "read_file", "hello"),
        m.tool_result("call.2", "read_file", ""),
        m.user("Thanks. What did they say?"),
    ]


CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "max_tokens and temperature": {"max_tokens": 321, "temperature": 0.3},
    "max_tokens": {"max_tokens": 99},
    "temperature": {"temperature": 1.0},
    "cache hints": {"cache": CacheHints(breakpoints=(0, 3, 4, 5))},
    "cache hints, one hour, on the tools": {"cache": CacheHints(breakpoints=(2,), tools=True, ttl="1h")},
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("stream", [True, False])
def test_the_native_transport_sends_what_litellm_sends(
    case: str, stream: bool, provider: LocalProvider, gateway: Gateway
) -> None:
    bodies: list[dict[str, Any]] = []
    headers: list[dict[str, str]] = []
    for transport in ("litellm", "auto"):
        provider.add_script("same", [Turn(text="Hello.")])
        request = CompletionRequest(
            model="anthropic/same",
            messages=history(provider),
            tools=TOOLS,
            api_base=provider.base_url,
            api_key="sk-local",
            stream=stream,
            transport=transport,  # type: ignore[arg-type]
            **CASES[case],
        )
        expected = "litellm" if transport == "litellm" else "anthropic"
        assert gateway.route(request).transport == expected, gateway.route(request).reason
        result = complete_sync(gateway, request, timeout=30)
        assert result.message is not None and result.message.text == "Hello.", result.error
        assert result.transport == expected
        logged = provider.request_log[-1]
        assert logged.status == 200, logged.outcome
        bodies.append(logged.body)
        headers.append({k: v for k, v in logged.headers.items() if k.startswith("anthropic-")})
    litellm_body, native_body = bodies
    assert native_body == litellm_body
    assert headers[0] == headers[1] == {"anthropic-version": "2023-06-01"}
    assert msgspec.json.encode(native_body) == msgspec.json.encode(litellm_body), "same keys, same order"


def test_auto_sends_anthropic_models_natively_and_leaves_what_litellm_reshapes_to_it(
    gateway: Gateway,
) -> None:
    def route(**kw: Any) -> Route:
        base: dict[str, Any] = {"model": "anthropic/claude-sonnet-4-5", "messages": [m.user("hi")]}
        return gateway.route(CompletionRequest(**{**base, **kw}))

    native = route()
    assert native.transport == "anthropic" and native.url == "https://api.anthropic.com/v1/messages"
    assert route(api_base="http://127.0.0.1:9/").url == "http://127.0.0.1:9/v1/messages"
    assert route(transport="litellm").transport == "litellm"
    assert route(mock_response="hi").transport == "litellm"
    assert route(messages=[m.user("look", "https://example.com/a.png")]).transport == "litellm"
    late_system = [m.user("hi"), m.assistant("hello"), m.system("Now be brief.")]
    assert route(messages=late_system).transport == "litellm"
    call = m.ToolCallPart(id="t1", name="read_file", arguments="{}")
    bare = [m.user("hi"), m.assistant(tool_calls=[call]), m.tool_result("t1", "read_file", "x")]
    assert "tool blocks without tools" in route(messages=bare).reason
    assert route(messages=bare, tools=TOOLS).transport == "anthropic"
    bedrock = gateway.route(
        CompletionRequest(model="bedrock/anthropic.claude-3-haiku", messages=[m.user("hi")])
    )
    assert bedrock.transport == "litellm", "Bedrock and Vertex stay with litellm"


def _events(*events: dict[str, Any]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]


def test_each_thinking_block_keeps_its_own_signature_and_goes_back_unchanged() -> None:
    answer = _Answer()
    deltas: list[Any] = []
    stream = _events(
        {
            "type": "message_start",
            "message": {"model": "claude", "usage": {"input_tokens": 10, "output_tokens": 1}},
        },
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "First, "},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "read."}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "SIG-A"},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "XYZ"},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "thinking", "thinking": ""}},
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "thinking_delta", "thinking": "Then write."},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "signature_delta", "signature": "SIG-B"},
        },
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": '{"path": '},
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": '"a"}'},
        },
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 30}},
        {"type": "message_stop"},
    )
    active = [0]
    for payload in stream:
        _apply(payload, answer, lambda: active.__setitem__(0, active[0] + 1), deltas.append)
    assert active[0] == len(stream) - 1, "a ping is a keep-alive, not data"
    message = answer.message(model="anthropic/claude", usage=m.Usage())
    assert [p for p in message.parts if isinstance(p, m.ReasoningPart)] == [
        m.ReasoningPart("First, read.", signature="SIG-A"),
        m.ReasoningPart("", redacted=True, provider_metadata={"data": "XYZ"}),
        m.ReasoningPart("Then write.", signature="SIG-B"),
    ]
    assert message.tool_calls == (m.ToolCallPart(id="toolu_9", name="read_file", arguments='{"path": "a"}'),)
    assert message.stop_reason == "tool_calls"
    assert [d.kind for d in deltas].count("reasoning") == 3
    calls = [d for d in deltas if d.kind == "tool_call"]
    assert calls[0].call_id == "toolu_9" and calls[0].name == "read_file" and {d.index for d in calls} == {0}
    follow_up = CompletionRequest(
        model="anthropic/claude",
        messages=[m.user("go"), message, m.tool_result("toolu_9", "read_file", "done")],
        tools=TOOLS,
    )
    sent = msgspec.json.decode(request_body(follow_up, "claude", 1024))
    assert sent["messages"][1]["content"][:3] == [
        {"type": "thinking", "thinking": "First, read.", "signature": "SIG-A"},
        {"type": "redacted_thinking", "data": "XYZ"},
        {"type": "thinking", "thinking": "Then write.", "signature": "SIG-B"},
    ]


def test_a_cached_prefix_reads_back_as_cache_usage_and_the_prompt_is_counted_whole(
    provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("cached", [Turn(text="one"), Turn(text="two")])
    system = m.system("You are a careful engineer. " + "Follow the house rules. " * 40)

    def call(messages: list[m.Message]) -> m.Usage:
        request = CompletionRequest(
            model="anthropic/cached",
            messages=messages,
            api_base=provider.base_url,
            api_key="sk-local",
            cache=CacheHints(breakpoints=(0,)),
        )
        result = complete_sync(gateway, request, timeout=30)
        assert result.message is not None and result.transport == "anthropic", result.error
        return result.usage

    first = call([system, m.user("first")])
    second = call([system, m.user("second")])
    assert first.cache_write_tokens > 16 and first.cache_read_tokens == 0
    assert second.cache_read_tokens == first.cache_write_tokens and second.cache_write_tokens == 0
    logged = provider.request_log[-1]
    assert second.input_tokens == logged.prompt_tokens, (
        "input is the whole prompt, the cache's share included"
    )


def test_errors_are_mapped_by_anthropics_error_types() -> None:
    transport = AnthropicTransport()

    def body(kind: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": "..."}}

    assert transport.error_kind(ProviderHTTPError(529, "Overloaded", body("overloaded_error"))) == "transient"
    assert transport.error_kind(StreamError(None, "Overloaded", body("overloaded_error"))) == "transient"
    assert transport.error_kind(StreamError(None, "slow down", body("rate_limit_error"))) == "rate_limit"
    assert transport.error_kind(ProviderHTTPError(401, "bad key", body("authentication_error"))) == "auth"
    assert (
        transport.error_kind(ProviderHTTPError(400, "no", body("invalid_request_error"))) == "invalid_request"
    )
    assert transport.error_kind(StreamError(None, "cut")) == "transient"
    assert transport.error_kind(ProviderHTTPError(418, "teapot", {"weird": 1})) is None
    rate = transport.classify(
        StreamError(None, "slow down", body("rate_limit_error")), Route(transport="anthropic")
    )
    assert rate.kind == "rate_limit" and rate.retryable
    overflow = ProviderHTTPError(
        400, "prompt is too long: 300000 tokens > 200000 maximum", body("invalid_request_error")
    )
    classified = transport.classify(overflow, Route(transport="anthropic"))
    assert classified.kind == "overflow" and classified.window == 200_000


def test_a_tool_session_turn_round_trips_signed_thinking_over_the_wire(
    provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script(
        "loop",
        [
            Turn(
                reasoning="Read it.", tool_calls=(ToolCallSpec(name="read_file", arguments='{"path": "a"}'),)
            ),
            Turn(reasoning="Done.", text="It says hello."),
        ],
    )
    messages: list[m.Message] = [m.user("What is in a?")]
    for _ in range(2):
        request = CompletionRequest(
            model="anthropic/loop", messages=messages, tools=TOOLS, api_base=provider.base_url, api_key="k"
        )
        result = complete_sync(gateway, request, timeout=30)
        assert result.message is not None and result.transport == "anthropic", result.error
        messages.append(result.message)
        for call in result.message.tool_calls:
            messages.append(m.tool_result(call.id, call.name, "hello"))
    assert messages[-1].text == "It says hello."
    assert provider.request_log[-1].status == 200, "the provider accepted the signature it gave"
