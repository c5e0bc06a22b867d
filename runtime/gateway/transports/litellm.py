"""The litellm transport: ``litellm.acompletion``, for every provider litellm knows.

litellm and the OpenAI client are told not to retry on their own (the gateway does). litellm is imported
lazily (it costs seconds), off the loop thread (``load_litellm``, in ``runtime.gateway._litellm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from runtime.gateway._caching import cache_key, tools_with_cache
from runtime.gateway._convert import to_provider_messages
from runtime.gateway._cost import usage_with_cost
from runtime.gateway._litellm import litellm_loaded
from runtime.gateway._litellm import load_litellm as load_litellm  # (its home before: tests import it here)
from runtime.gateway._models import CompletionRequest, ErrorKind
from runtime.gateway._stream import StreamAssembler, message_from_response
from runtime.gateway._usage import field
from runtime.gateway.transports.base import Attempt, Transport

if TYPE_CHECKING:
    from runtime.gateway._routing import Route
    from runtime.messages import Message

_log = logging.getLogger("agentcell.gateway")


def build_call_kwargs(request: CompletionRequest) -> dict[str, Any]:
    """The keyword arguments of ``litellm.acompletion`` for ``request`` (no retries inside litellm)."""
    kwargs: dict[str, Any] = {
        "model": request.model,
        "messages": to_provider_messages(request),
        "stream": request.stream,
        "timeout": request.timeout,
        "num_retries": 0,
        "max_retries": 0,
    }
    if request.stream:
        kwargs["stream_options"] = {"include_usage": True}
    if request.tools:
        kwargs["tools"] = tools_with_cache(request)
        if all(tool.get("type", "function") == "function" for tool in request.tools):
            # litellm checks every call with tools for its MCP gateway, importing the optional `mcp` package
            # (ModuleNotFoundError without it). Plain function tools never need that path: skip it.
            kwargs["_skip_mcp_handler"] = True
    optional = {
        "api_base": request.api_base,
        "api_key": request.api_key,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "mock_response": request.mock_response,
        "prompt_cache_key": cache_key(request),
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    kwargs.update(request.extra)
    passed = [k for k in _OPENAI_PARAMS if k in request.extra]
    if passed and _openai_wire(request.model):
        # An OpenAI-compatible endpoint (OpenAI, or a server of the user's behind ``openai/``) takes the
        # OpenAI parameters a client asked for, or refuses them itself: litellm's table of which models take
        # them would refuse them for any model it does not know. Other providers: litellm maps them
        # (Anthropic's thinking budget for ``reasoning_effort``) or names the ones it cannot.
        kwargs["allowed_openai_params"] = passed
    return kwargs


_OPENAI_PARAMS: Final = ("reasoning_effort", "verbosity", "parallel_tool_calls")


def _openai_wire(model: str) -> bool:
    provider, _, rest = model.partition("/")
    return bool(rest) and provider == "openai"


class LitellmTransport(Transport):
    """Every call through ``litellm.acompletion`` (streamed with ``stream_options.include_usage``)."""

    name: ClassVar[str] = "litellm"

    async def attempt(self, call: Attempt, route: Route) -> Message:
        litellm = litellm_loaded()
        if litellm is None:
            litellm = await asyncio.get_running_loop().run_in_executor(None, load_litellm)
        request = call.request
        response = await litellm.acompletion(**build_call_kwargs(request))
        call.response_started()  # streamed: its headers (the SDK skips keep-alives); else the whole answer
        if (headers := _response_headers(response)) is not None:
            call.received_headers(headers)
        model = request.model
        if not request.stream:
            raw_usage = field(response, "usage")
            return message_from_response(
                response, model=model, usage=usage_with_cost(raw_usage, route.prices, self.name)
            )
        assembler = StreamAssembler()
        on_delta = call.on_delta
        finished = False
        try:
            async for chunk in response:
                call.activity()
                deltas = assembler.add(chunk)
                if on_delta is not None:
                    for delta in deltas:
                        on_delta(delta)
            finished = True
        finally:
            # A stream abandoned midway (error, cancel) must give its connection back to the pool.
            aclose: Callable[[], Awaitable[object]] | None = getattr(response, "aclose", None)
            if not finished and aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        return assembler.message(model=model, usage=usage_with_cost(assembler.usage, route.prices, self.name))

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        """What litellm's, the OpenAI client's or httpx's exception types say (subclasses included)."""
        for types, kind in _error_types():
            if isinstance(exc, types):
                return kind
        return None

    async def aclose(self) -> None:
        await close_loop_clients(asyncio.get_running_loop())


async def close_loop_clients(loop: asyncio.AbstractEventLoop) -> None:
    """Close the HTTP clients litellm cached for ``loop`` and take them out of its cache.

    litellm keeps one client (and its pool of open connections) per event loop, its key suffixed with
    a mark of the loop, for as long as the process lives. Without this, every runtime that stops leaves
    its connections open (and, where the mark is ``id(loop)``, a later loop that happens to get the same
    ``id`` is handed clients bound to a closed loop). The mark is ``id(loop)`` up to litellm 1.106 and a
    per-loop counter after it; litellm's own ``update_cache_key_with_event_loop``, called on ``loop``,
    gives it in either case.
    """
    cache = getattr(litellm_loaded(), "in_memory_llm_clients_cache", None)
    entries = getattr(cache, "cache_dict", None)
    if not isinstance(entries, dict):
        return
    suffix = _loop_key_suffix(cache, loop)
    for key in [k for k in list(entries) if isinstance(k, str) and k.endswith(suffix)]:
        client = entries.pop(key, None)
        ttl = getattr(cache, "ttl_dict", None)
        if isinstance(ttl, dict):
            ttl.pop(key, None)
        close = getattr(client, "close", None) or getattr(client, "aclose", None)
        if close is None:
            continue
        try:
            closing = close()
            if asyncio.iscoroutine(closing) or isinstance(closing, asyncio.Future):
                await closing
        except Exception:  # a client that fails to close must not keep the others open
            _log.warning("closing a cached provider client failed", exc_info=True)


def _loop_key_suffix(cache: object, loop: asyncio.AbstractEventLoop) -> str:
    """What litellm appends to a client's cache key for ``loop`` (the running loop, as it is here)."""
    scoped = getattr(cache, "update_cache_key_with_event_loop", None)
    if callable(scoped) and asyncio.get_running_loop() is loop:
        suffix = scoped("")
        if isinstance(suffix, str) and suffix:
            return suffix
    return f"-{id(loop)}"


def _response_headers(response: object) -> Mapping[str, str] | None:
    """The provider's answer headers as litellm keeps them (``_hidden_params["additional_headers"]``, or
    ``_response_headers``), or None."""
    hidden = getattr(response, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    if not isinstance(headers, Mapping):
        headers = getattr(response, "_response_headers", None)
    if headers is not None and (isinstance(headers, Mapping) or hasattr(headers, "items")):
        return {str(k).removeprefix("llm_provider-"): str(v) for k, v in headers.items()}
    return None


_ERROR_TYPES: list[tuple[tuple[type[BaseException], ...], ErrorKind]] = []


def _error_types() -> list[tuple[tuple[type[BaseException], ...], ErrorKind]]:
    """litellm's exception types (and the OpenAI client's and httpx's it lets through) by error kind, the
    first match deciding: a subclass before its base (litellm's ``Timeout`` is an ``APIConnectionError``,
    its ``ContentPolicyViolationError`` a ``BadRequestError``). Built once litellm is loaded."""
    if not _ERROR_TYPES:
        import httpx
        import openai

        litellm = load_litellm()
        _ERROR_TYPES.extend(
            [
                ((litellm.ContentPolicyViolationError,), "content_policy"),
                (
                    (litellm.Timeout, openai.APITimeoutError, httpx.TimeoutException),
                    "timeout",
                ),
                ((openai.AuthenticationError, openai.PermissionDeniedError), "auth"),
                ((openai.RateLimitError,), "rate_limit"),
                (
                    (
                        litellm.APIConnectionError,
                        litellm.ServiceUnavailableError,
                        litellm.InternalServerError,
                        litellm.BadGatewayError,
                        litellm.exceptions.MidStreamFallbackError,
                        openai.APIConnectionError,
                        openai.InternalServerError,
                        httpx.ConnectError,
                        httpx.ReadError,
                        httpx.WriteError,
                        httpx.RemoteProtocolError,
                    ),
                    "transient",
                ),
                (
                    (
                        openai.BadRequestError,
                        openai.UnprocessableEntityError,
                        openai.NotFoundError,
                        litellm.UnsupportedParamsError,
                    ),
                    "invalid_request",
                ),
            ]
        )
    return _ERROR_TYPES
