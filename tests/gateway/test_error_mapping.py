"""Errors mapped where they arise (design §3.7): each transport says what its library's exceptions are by
their types, subclasses included, and the gateway acts on that kind. A subclass of a library's timeout
(a proxy's, a wrapper's) is a timeout and is retried; it used to be classified by its class name, came out
``unknown`` and failed the call at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

import runtime  # noqa: F401  (offline environment)
from runtime import messages as m
from runtime.config import RetryConfig
from runtime.gateway import CompletionRequest, Gateway, IoLoop, complete_sync
from runtime.gateway._routing import Route
from runtime.gateway.transports import _http
from runtime.gateway.transports.litellm import LitellmTransport, load_litellm
from runtime.gateway.transports.openai_compat import OpenAICompatTransport, ProviderHTTPError, StreamError
from runtime.provider import LocalProvider

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

ROUTE = Route(transport="litellm", provider="openai")
REQUEST = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


class ProxyReadTimeout(httpx.ReadTimeout):
    """What a wrapper around httpx raises: an httpx timeout under another name."""


class GatewayTimeout(openai.APITimeoutError):
    """The OpenAI client's timeout, subclassed (as litellm and SDK wrappers do)."""


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        yield p


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    io = IoLoop(name="test-io-error-mapping")
    gw = Gateway(io, RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.02))
    gw.preload().result(timeout=60)
    yield gw
    io.stop()


@pytest.mark.parametrize(
    "failure",
    [lambda: ProxyReadTimeout("no bytes from upstream"), lambda: GatewayTimeout(request=REQUEST)],
    ids=["httpx-ReadTimeout-subclass", "openai-APITimeoutError-subclass"],
)
def test_a_subclass_of_a_library_timeout_is_retried(
    failure: Any, gateway: Gateway, provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    litellm = load_litellm()
    real = litellm.acompletion
    calls = 0

    async def first_times_out(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise failure()
        return await real(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", first_times_out)
    request = CompletionRequest(
        model="openai/agentcell-local",
        messages=[m.user("hi")],
        api_base=provider.url,
        api_key="sk-local",
        transport="litellm",
    )
    result = complete_sync(gateway, request, timeout=60)
    assert result.ok, result.error
    assert (calls, result.attempts) == (2, 2)


def test_the_litellm_transport_maps_its_libraries_exceptions_by_type() -> None:
    litellm = load_litellm()
    transport = LitellmTransport()
    who = {"model": "m", "llm_provider": "openai"}

    def response(status: int) -> httpx.Response:
        return httpx.Response(status, request=REQUEST)

    expected: list[tuple[BaseException, str]] = [
        (litellm.Timeout(message="slow", **who), "timeout"),
        (GatewayTimeout(request=REQUEST), "timeout"),
        (ProxyReadTimeout("no bytes"), "timeout"),
        (httpx.PoolTimeout("pool"), "timeout"),
        (litellm.APIConnectionError(message="refused", **who), "transient"),
        (litellm.ServiceUnavailableError(message="busy", **who), "transient"),
        (litellm.BadGatewayError(message="bad gateway", **who), "transient"),
        (httpx.RemoteProtocolError("cut"), "transient"),
        (httpx.ConnectError("refused"), "transient"),
        (litellm.ContentPolicyViolationError(message="refused", **who), "content_policy"),
        (litellm.BadRequestError(message="max_tokens is too large", **who), "invalid_request"),
        (litellm.NotFoundError(message="no such model", **who), "invalid_request"),
        (openai.AuthenticationError("bad key", response=response(401), body=None), "auth"),
        (litellm.RateLimitError(message="slow down", **who), "rate_limit"),
        (ValueError("something odd"), "unknown"),
    ]
    for exc, kind in expected:
        assert transport.classify(exc, ROUTE).kind == kind, exc
    # what the type says, before the status and message rules
    assert transport.error_kind(litellm.ContentPolicyViolationError(message="x", **who)) == "content_policy"
    assert transport.error_kind(ProxyReadTimeout("x")) == "timeout"
    assert transport.error_kind(ValueError("x")) is None


def test_the_native_transport_maps_its_errors_by_type_and_status() -> None:
    transport = OpenAICompatTransport()
    route = Route(transport="openai_compat", provider="openai")

    class BehindAProxy(_http.ReadTimeout):
        pass

    expected: list[tuple[BaseException, str]] = [
        (_http.ReadTimeout("no data"), "timeout"),
        (_http.ConnectTimeout("no connection"), "timeout"),
        (_http.PoolTimeout("no free connection"), "timeout"),
        (BehindAProxy("no data"), "timeout"),
        (_http.ConnectError("refused"), "transient"),
        (_http.ReadError("reset"), "transient"),
        (_http.WriteError("broken pipe"), "transient"),
        (_http.RemoteProtocolError("not an HTTP answer"), "transient"),
        (StreamError(None, "the stream ended before the response was complete"), "transient"),
        (ProviderHTTPError(401, "bad key"), "auth"),
        (ProviderHTTPError(429, "slow down", headers={"retry-after": "2"}), "rate_limit"),
        (ProviderHTTPError(503, "unavailable"), "transient"),
        (ProviderHTTPError(400, "bad request"), "invalid_request"),
    ]
    for exc, kind in expected:
        assert transport.classify(exc, route).kind == kind, exc
    assert (
        transport.classify(ProviderHTTPError(429, "x", headers={"retry-after": "2"}), route).retry_after == 2
    )
