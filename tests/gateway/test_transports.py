"""Which transport serves a call, and that the native one sends what litellm sends (design §3.2).

The routing rules of :mod:`runtime.gateway._routing`, and one check that keeps ``auto`` honest: for every
provider it sends over the native transport, the same request made through litellm and natively reaches the
local provider as the same JSON body (and, for OpenRouter, with the same app headers). If a litellm upgrade
starts shaping a provider's requests differently, this fails and the provider's dialect must follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import runtime  # noqa: F401  (offline environment)
from runtime import messages as m
from runtime.config import RetryConfig
from runtime.gateway import CompletionRequest, Gateway, IoLoop, complete_sync
from runtime.gateway._routing import DIALECTS, Router
from runtime.gateway.transports.openai_compat import request_body
from runtime.provider import LocalProvider, Turn

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
HISTORY = [
    m.system("You are careful."),
    m.user("Read a.txt and look at this.", "https://example.com/diagram.png"),
    m.Message(
        role="assistant",
        parts=(
            m.ReasoningPart("The user wants a.txt.", signature="sig-1"),
            m.TextPart("Reading it."),
            m.ToolCallPart(id="call_1", name="read_file", arguments='{"path": "a.txt"}'),
        ),
    ),
    m.tool_result("call_1", "read_file", "hello"),
    m.user("Thanks. What did it say?"),
]


DECLINED = {"deepseek"}
"""Providers whose calls with images go to litellm (it collapses them to text for models without vision)."""
LITELLM_FAILS = {
    (
        "groq",
        False,
    ): "litellm 1.110 fails Groq's non-streamed replies ('ModelResponse' has no 'service_tier')",
}


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        yield p


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    io = IoLoop(name="test-io-transports")
    gw = Gateway(io, RetryConfig(max_attempts=1))
    gw.preload().result(timeout=60)
    yield gw
    io.stop()


def req(model: str, transport: Any = "auto", **kw: Any) -> CompletionRequest:
    return CompletionRequest(model=model, messages=[m.user("hi")], transport=transport, **kw)


# --- the same request on both transports ----------------------------------------------------------------


@pytest.mark.parametrize("provider_name", sorted(DIALECTS))
@pytest.mark.parametrize("stream", [True, False])
def test_the_native_transport_sends_what_litellm_sends(
    provider_name: str, stream: bool, provider: LocalProvider, gateway: Gateway
) -> None:
    bodies: list[dict[str, Any]] = []
    headers: list[dict[str, str]] = []
    for transport in ("litellm", "openai_compat"):
        provider.add_script(f"same-{provider_name}", [Turn(text="Hello.")])
        request = CompletionRequest(
            model=f"{provider_name}/same-{provider_name}",
            messages=HISTORY,
            tools=TOOLS,
            api_base=provider.url,
            api_key="sk-local",
            max_tokens=321,
            stream=stream,
            transport=transport,  # type: ignore[arg-type]
        )
        route = gateway.route(request)
        if route.transport != transport:  # the native transport declines what it would not send the same way
            assert transport == "openai_compat" and provider_name in DECLINED, route.reason
            request = msgspec.structs.replace(request, messages=[msg for msg in HISTORY if not msg.images])
            assert gateway.route(request).transport == transport
        result = complete_sync(gateway, request, timeout=30)
        if (provider_name, stream) in LITELLM_FAILS and transport == "litellm":
            assert result.error is not None, "litellm's bug is fixed: drop it from LITELLM_FAILS"
            pytest.skip(LITELLM_FAILS[provider_name, stream])
        assert result.message is not None and result.message.text == "Hello.", result.error
        assert result.transport == transport
        logged = provider.request_log[-1]
        bodies.append(logged.body)
        headers.append({k: v for k, v in logged.headers.items() if k in ("http-referer", "x-title")})
    litellm_body, native_body = bodies
    if provider_name in DECLINED:  # compare the call without images (litellm collapsed them to text)
        del litellm_body["messages"][1]
    assert native_body == litellm_body
    assert headers[1] == headers[0]


@pytest.mark.parametrize("provider_name", sorted(DIALECTS))
def test_auto_sends_every_dialect_provider_natively(provider_name: str, gateway: Gateway) -> None:
    request = req(f"{provider_name}/some-model", api_base="http://127.0.0.1:9/v1")
    route = gateway.route(request)
    assert route.transport == "openai_compat", route.reason
    assert route.url == "http://127.0.0.1:9/v1/chat/completions"
    assert route.model == "some-model"


def test_a_temperature_goes_natively_where_litellm_passes_it_through(
    provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("warm", [Turn(text="ok")], loop=True)
    bodies = []
    for transport in ("litellm", "openai_compat"):
        request = CompletionRequest(
            model="openai/warm",
            messages=[m.user("hi")],
            api_base=provider.url,
            api_key="sk-local",
            temperature=0.3,
            transport=transport,  # type: ignore[arg-type]
        )
        assert complete_sync(gateway, request, timeout=30).transport == transport
        bodies.append(provider.request_log[-1].body)
    assert bodies[0] == bodies[1] and bodies[1]["temperature"] == 0.3


# --- routing ----------------------------------------------------------------------------------------------


def test_auto_routes_openai_compatible_endpoints_natively_and_the_rest_to_litellm(gateway: Gateway) -> None:
    assert gateway.route(req("openai/local", api_base="http://127.0.0.1:9/v1")).transport == "openai_compat"
    openai = gateway.route(req("gpt-4o-mini"))
    assert (openai.transport, openai.provider, openai.url) == (
        "openai_compat",
        "openai",
        "https://api.openai.com/v1/chat/completions",
    )
    assert openai.prices is not None, "gpt-4o-mini's prices come from litellm's map"
    groq = gateway.route(req("groq/llama-3.1-8b-instant"))
    assert (groq.transport, groq.url) == ("openai_compat", "https://api.groq.com/openai/v1/chat/completions")
    assert gateway.route(req("anthropic/claude-sonnet-4-5")).transport == "anthropic", "its Messages API"
    for model in (
        "gemini/gemini-2.5-pro",
        "bedrock/anthropic.claude-3",
        "azure/gpt-4o",
    ):
        assert gateway.route(req(model)).transport == "litellm", model
    assert gateway.route(req("mistral/mistral-large-latest")).transport == "litellm", (
        "a dialect not written down"
    )
    assert gateway.route(req("ollama_chat/llama3")).transport == "litellm", "Ollama's own API"


def test_forcing_a_transport(gateway: Gateway) -> None:
    assert gateway.route(req("openai/x", "litellm", api_base="http://127.0.0.1:9/v1")).transport == "litellm"
    forced = gateway.route(req("mistral/mistral-large-latest", "openai_compat"))
    assert (forced.transport, forced.url) == ("openai_compat", "https://api.mistral.ai/v1/chat/completions")
    anthropic = gateway.route(req("anthropic/claude-sonnet-4-5", "openai_compat"))
    assert anthropic.transport == "litellm", "Anthropic does not speak OpenAI chat completions"
    assert "litellm's own request shape" in anthropic.reason


def test_what_only_litellm_can_do_goes_to_litellm(gateway: Gateway) -> None:
    for mode in ("auto", "openai_compat"):
        assert gateway.route(req("gpt-4o-mini", mode, mock_response="hi")).transport == "litellm"
        assert gateway.route(req("gpt-4o-mini", mode, extra={"top_p": 0.5})).transport == "litellm"
        assert gateway.route(req("o1-pro", mode)).transport == "litellm", "served over the Responses API"
        assert gateway.route(req("o3-mini", mode, temperature=0.5)).transport == "litellm", "litellm maps it"
        assert gateway.route(req("o3-mini", mode, temperature=None)).transport == "openai_compat"


def test_max_tokens_goes_where_litellm_puts_it() -> None:
    router = Router()
    reasoning = CompletionRequest(model="o3-mini", messages=[m.user("hi")], max_tokens=50)
    route = router.route(reasoning)
    assert route.transport == "openai_compat" and route.max_tokens_param == "max_completion_tokens"
    assert msgspec.json.decode(request_body(reasoning, route))["max_completion_tokens"] == 50
    plain = CompletionRequest(model="gpt-4o-mini", messages=[m.user("hi")], max_tokens=50)
    assert msgspec.json.decode(request_body(plain, router.route(plain)))["max_tokens"] == 50


def test_each_model_is_resolved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.gateway import _routing

    calls: list[str] = []
    real = _routing.resolve

    def counting(model: str, api_base: str | None, mode: Any) -> Any:
        calls.append(model)
        return real(model, api_base, mode)

    monkeypatch.setattr(_routing, "resolve", counting)
    router = Router()
    for _ in range(5):
        router.route(req("openai/a", api_base="http://127.0.0.1:9/v1"))
        router.route(req("openai/b", api_base="http://127.0.0.1:9/v1"))
        router.route(req("openai/a", "litellm", api_base="http://127.0.0.1:9/v1"))
    assert sorted(calls) == ["openai/a", "openai/a", "openai/b"]
    assert router.cached(req("openai/a", api_base="http://127.0.0.1:9/v1")) is not None
    assert router.cached(req("openai/c", api_base="http://127.0.0.1:9/v1")) is None


def test_endpoints_and_keys_come_from_where_litellm_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/openai/v1")
    monkeypatch.setenv("GROQ_API_KEY", "gsk-env")
    monkeypatch.setenv("OPENROUTER_API_KEY", "or-env")
    monkeypatch.setenv("OR_APP_NAME", "my-app")
    router = Router()
    openai = router.route(req("gpt-4o-mini"))
    assert (openai.url, openai.api_key) == ("http://127.0.0.1:9/openai/v1/chat/completions", "sk-openai-env")
    assert router.route(req("groq/llama-3.1-8b-instant")).api_key == "gsk-env"
    openrouter = router.route(req("openrouter/anthropic/claude-sonnet-4"))
    assert (openrouter.url, openrouter.api_key) == ("https://openrouter.ai/api/v1/chat/completions", "or-env")
    assert openrouter.headers["X-Title"] == "my-app"
    assert "sk-openai-env" not in repr(openai) and "or-env" not in str(openrouter)


def test_dialects_shape_the_body_as_litellm_does() -> None:
    router = Router()
    base = "http://127.0.0.1:9/v1"

    def body(model: str) -> dict[str, Any]:
        request = CompletionRequest(model=model, messages=HISTORY, api_base=base)
        return msgspec.json.decode(request_body(request, router.route(request)))

    assistant = body("openai/x")["messages"][2]
    assert assistant["reasoning_content"] and assistant["thinking_blocks"]
    vllm = body("hosted_vllm/x")["messages"][2]
    assert "reasoning_content" in vllm and "thinking_blocks" not in vllm
    groq = body("groq/x")["messages"][2]
    assert "reasoning_content" not in groq and "thinking_blocks" not in groq
    assert body("openrouter/x")["usage"] == {"include": True}
    assert HISTORY[2].reasoning, "the caller's messages are left as they were"


def test_an_endpoint_behind_a_proxy_goes_to_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    router = Router()
    proxied = router.route(req("gpt-4o-mini"))
    assert proxied.transport == "litellm" and "proxy" in proxied.reason
    assert router.route(req("openai/x", api_base="https://127.0.0.1:9/v1")).transport == "openai_compat"
