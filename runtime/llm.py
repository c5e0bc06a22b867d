"""The litellm gateway: every provider call of the runtime, on one asyncio loop thread (SPEC 3.2, 3.3, 3.7).

Actors never wait for the network. They hand a :class:`CompletionRequest` to :meth:`Gateway.complete`, which
returns at once with a :class:`CallHandle`; the call runs on the :class:`IoLoop` (``litellm.acompletion``,
streamed with ``stream_options.include_usage``), and its :class:`CompletionResult` -- the assistant message
with normalized usage, or a classified :class:`ProviderError` -- comes back through ``on_result`` exactly
once, from the loop thread (pass e.g. ``actor_ref.tell``). Streaming deltas, retries and stalls are
reported through their own callbacks as they happen.

Transient failures (429, 5xx, "overloaded", timeouts, connection resets) are retried with exponential
backoff and jitter, honouring ``retry-after``; overflow, auth and invalid requests never are. litellm and
the OpenAI client are told not to retry on their own.

litellm is imported lazily (it costs seconds), off the loop thread, on the first call or :meth:`preload`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import gc
import importlib
import logging
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar

import msgspec
import pykka

from runtime.affinity import place_thread
from runtime.config import RetryConfig
from runtime.messages import (
    Message,
    Part,
    ReasoningPart,
    StopReason,
    TextPart,
    ToolCallPart,
    Usage,
    message_from_openai,
    message_to_openai,
    new_id,
)

_log = logging.getLogger(__name__)
T = TypeVar("T")

ErrorKind = Literal[
    "overflow",
    "rate_limit",
    "transient",
    "auth",
    "invalid_request",
    "timeout",
    "cancelled",
    "content_policy",
    "unknown",
]
RETRYABLE_KINDS: Final[frozenset[str]] = frozenset({"rate_limit", "transient", "timeout"})
MAX_HONOURED_RETRY_AFTER: Final = 60.0
"""A ``retry-after`` above this many seconds is not waited for; the computed backoff is used instead."""


# ---------------------------------------------------------------------------------------------------
# The I/O loop


class IoLoop:
    """One asyncio event loop running in a daemon thread, shared by the whole runtime.

    Thread-safe: :meth:`submit` and :meth:`call_soon` may be called from any thread.
    """

    def __init__(self, name: str = "agentcell-io", *, cpus: frozenset[int] | None = None) -> None:
        self._cpus = cpus  # where the loop's thread runs, and the worker threads started from it
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Future[None] = self._loop.create_future()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        place_thread(self._cpus)
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_until_complete(self._root())
        finally:
            self._shutdown()

    async def _root(self) -> None:
        # The loop runs one long-lived root task (run_until_complete) rather than run_forever(): anyio, which
        # litellm's HTTP stack uses, ties its worker threads to the root task. Without one it takes each
        # call's own task as the root and starts (and stops) a thread per call: milliseconds each.
        await self._stopping

    def _request_stop(self) -> None:
        if not self._stopping.done():
            self._stopping.set_result(None)

    def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(_close_loop_clients(self._loop))
        with contextlib.suppress(RuntimeError):
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._loop.is_closed()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its result (or exception) arrives in the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop thread, soon."""
        self._loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what is still running, stop the loop and join its thread. Idempotent."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._request_stop)
        if not self.in_loop_thread():
            self._thread.join(timeout)

    def __enter__(self) -> IoLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _close_loop_clients(loop: asyncio.AbstractEventLoop) -> None:
    """Close the HTTP clients litellm cached for ``loop`` and take them out of its cache.

    litellm keeps one client (and its pool of open connections) per event loop, its key suffixed with
    a mark of the loop, for as long as the process lives. Without this, every runtime that stops leaves
    its connections open (and, where the mark is ``id(loop)``, a later loop that happens to get the same
    ``id`` is handed clients bound to a closed loop). The mark is ``id(loop)`` up to litellm 1.106 and a
    per-loop counter after it; litellm's own ``update_cache_key_with_event_loop``, called on ``loop``,
    gives it in either case.
    """
    cache = getattr(_litellm_module, "in_memory_llm_clients_cache", None)
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


# ---------------------------------------------------------------------------------------------------
# Requests, results, errors


class CompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One provider call. ``messages`` are ours (converted here) or already in the OpenAI chat format.

    ``api_key`` is never logged and never shown by ``repr``; keep requests out of events and the store.
    ``mock_response`` uses litellm's in-process fake instead of the network (tests, dry runs).
    """

    model: str
    messages: Sequence[Message | dict[str, Any]]
    tools: Sequence[dict[str, Any]] = ()
    api_base: str | None = None
    api_key: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    timeout: float = 600.0
    stream: bool = True
    include_reasoning: bool = True
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    mock_response: str | None = None

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else "None"
        return (
            f"CompletionRequest(model={self.model!r}, messages=<{len(self.messages)}>, tools=<{len(self.tools)}>, "
            f"api_base={self.api_base!r}, api_key={key}, stream={self.stream})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> Any:
        yield "model", self.model
        yield "messages", len(self.messages)
        yield "api_base", self.api_base
        yield "api_key", "***" if self.api_key else None


class ProviderError(msgspec.Struct, frozen=True, kw_only=True):
    """A failed provider call, classified. ``retryable`` says whether the gateway would retry it."""

    kind: ErrorKind
    message: str
    status_code: int | None = None
    code: str | None = None
    retry_after: float | None = None
    provider: str | None = None

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    @property
    def is_overflow(self) -> bool:
        return self.kind == "overflow"


class CompletionResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a call produced: an assistant message (with usage and stop reason) or an error."""

    message: Message | None
    usage: Usage = msgspec.field(default_factory=Usage)
    error: ProviderError | None = None
    attempts: int = 0
    latency: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.message is not None


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """A streamed piece: text, reasoning, or a tool call's (name and) argument fragment, by call index."""

    kind: Literal["text", "reasoning", "tool_call"]
    text: str = ""
    index: int = 0
    call_id: str | None = None
    name: str | None = None


class RetryInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Attempt ``attempt`` of ``max_attempts`` failed with ``error``; the next starts after ``delay`` s."""

    attempt: int
    max_attempts: int
    delay: float
    error: str
    status_code: int | None = None
    kind: ErrorKind = "transient"


# ---------------------------------------------------------------------------------------------------
# Pure helpers: classification, backoff, usage, conversion


def classify_error(exc: BaseException, *, provider: str | None = None) -> ProviderError:
    """Classify a provider exception (litellm's, the OpenAI client's, httpx's, asyncio's).

    Overflow is decided first, by :func:`runtime.context.overflow.is_context_overflow`, so that an overflow
    that arrives as a 500 (Ollama) or a 413 is never retried as a transient error.
    """
    from runtime.context.overflow import is_context_overflow

    status = _status_code(exc)
    body = getattr(exc, "body", None)
    code = _error_code(exc, body)
    message = _error_message(exc)
    provider = provider or getattr(exc, "llm_provider", None) or None
    retry_after = retry_after_seconds(_response_headers(exc))

    def error(kind: ErrorKind, retry: float | None = None) -> ProviderError:
        return ProviderError(
            kind=kind,
            message=clean_error_message(message),
            status_code=status,
            code=code,
            retry_after=retry,
            provider=provider,
        )

    if isinstance(exc, asyncio.CancelledError):
        return error("cancelled")
    if is_context_overflow(exc, message=message, status_code=status, code=code, body=body):
        return error("overflow")
    name = type(exc).__name__
    lowered = message.lower()
    if status in (401, 403) or name in ("AuthenticationError", "PermissionDeniedError"):
        return error("auth")
    if status == 429 or name == "RateLimitError":
        return error("rate_limit", retry_after)
    if (
        isinstance(exc, TimeoutError)
        or name in ("Timeout", "APITimeoutError", "ReadTimeout", "ConnectTimeout")
        or "timed out" in lowered
        or "timeout on reading" in lowered
    ):
        return error("timeout", retry_after)
    if name == "ContentPolicyViolationError" or "content_policy" in lowered:
        return error("content_policy")
    if (
        (status is not None and (status >= 500 or status in (408, 409)))
        or "overloaded" in lowered
        or isinstance(exc, ConnectionError | OSError)
        or name
        in (
            "APIConnectionError",
            "ServiceUnavailableError",
            "InternalServerError",
            "BadGatewayError",
            "MidStreamFallbackError",
            "RemoteProtocolError",
            "ReadError",
            "ConnectError",
        )
    ):
        return error("transient", retry_after)
    if status is not None and 400 <= status < 500:
        return error("invalid_request")
    if name in ("BadRequestError", "UnprocessableEntityError", "NotFoundError", "UnsupportedParamsError"):
        return error("invalid_request")
    return error("unknown")


def _status_code(exc: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def _error_code(exc: BaseException, body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error")
        for source in (inner if isinstance(inner, Mapping) else None, body):
            if source is not None and source.get("code") is not None:
                return str(source["code"])
    code = getattr(exc, "code", None)
    return str(code) if code is not None else None


_WRAPPER_PREFIX: Final = re.compile(r"^(?:(?:litellm\.\w+|\w+(?:Error|Exception))\s*[:-]\s*)+")


def _error_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    return text or type(exc).__name__


def clean_error_message(message: str) -> str:
    """The provider's own words: litellm's ``litellm.XError: XError: OpenAIException - `` prefixes removed."""
    return _WRAPPER_PREFIX.sub("", message, count=1).strip() or message


def _response_headers(exc: BaseException) -> Mapping[str, str] | None:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "get") else None


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait according to ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        with contextlib.suppress(ValueError):
            return max(0.0, float(raw_ms) / 1000.0)
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = email.utils.parsedate_to_datetime(raw).timestamp()
        return max(0.0, when - (time.time() if now is None else now))
    return None


def backoff_delay(
    attempt: int, config: RetryConfig, *, retry_after: float | None = None, rng: random.Random | None = None
) -> float:
    """Delay before the attempt after failed attempt ``attempt`` (1-based).

    ``retry-after`` is honoured when the server sends a usable value (at most
    :data:`MAX_HONOURED_RETRY_AFTER`); otherwise ``base_delay * 2**(attempt-1)`` capped at ``max_delay``,
    less a random fraction of up to ``jitter`` of it (so concurrent clients spread out).
    """
    if retry_after is not None and 0.0 <= retry_after <= MAX_HONOURED_RETRY_AFTER:
        return retry_after
    delay = min(config.max_delay, config.base_delay * (2 ** max(0, attempt - 1)))
    draw = (rng or random).random()
    return delay * (1.0 - config.jitter * draw)


def normalize_usage(raw: Any, *, cost: float | None = None) -> Usage:
    """litellm's (or an OpenAI/Anthropic-shaped) usage as our :class:`Usage`.

    ``input_tokens`` is the whole prompt (cache reads included, as OpenAI and litellm count it);
    ``cache_read_tokens`` and ``cache_write_tokens`` say how much of it came from or went to the cache.
    """
    if raw is None:
        return Usage(cost=cost)
    prompt = _int(_field(raw, "prompt_tokens")) or _int(_field(raw, "input_tokens"))
    completion = _int(_field(raw, "completion_tokens")) or _int(_field(raw, "output_tokens"))
    completion_details = _field(raw, "completion_tokens_details")
    prompt_details = _field(raw, "prompt_tokens_details")
    reasoning = _int(_field(completion_details, "reasoning_tokens")) or _int(_field(raw, "reasoning_tokens"))
    cache_read = _int(_field(prompt_details, "cached_tokens")) or _int(_field(raw, "cache_read_input_tokens"))
    cache_write = _int(_field(raw, "cache_creation_input_tokens")) or _int(
        _field(prompt_details, "cache_creation_tokens")
    )
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        reasoning_tokens=reasoning,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cost=cost,
    )


def _field(obj: Any, key: str) -> Any:
    """``obj[key]`` or ``obj.key``, None when absent.

    litellm's response objects are pydantic models whose optional fields (``reasoning_content``, ...) are
    often simply absent, and a missing attribute costs a raised and caught ``AttributeError`` inside
    pydantic. A streamed call makes hundreds of these lookups, so the instance dictionaries are read
    first and what a class can answer otherwise is worked out once per class and key.
    """
    if obj is None:
        return None
    cls = type(obj)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    if kind is _MAPPING:
        return obj.get(key)
    values = getattr(obj, "__dict__", None)
    if values is not None:
        value = values.get(key, _MISSING)
        if value is not _MISSING:
            return value
    if kind is _OBJECT:
        return getattr(obj, key, None)
    extra = getattr(obj, "__pydantic_extra__", None)
    if extra is not None and key in extra:
        return extra[key]
    # Not in the instance: a declared field litellm deleted (absent), or a property of the class.
    computed = _COMPUTED.get((cls, key))
    if computed is None:
        computed = _COMPUTED[(cls, key)] = key not in cls.__pydantic_fields__ and hasattr(cls, key)
    return getattr(obj, key, None) if computed else None


_MAPPING: Final = "mapping"
_PYDANTIC: Final = "pydantic"
_OBJECT: Final = "object"
_MISSING: Final = object()
_KINDS: dict[type, str] = {}
_COMPUTED: dict[tuple[type, str], bool] = {}  # (pydantic class, key) -> answered by a class attribute


def _kind_of(cls: type) -> str:
    if issubclass(cls, Mapping):
        return _MAPPING
    # ``__pydantic_fields__`` is a plain class dict; the class-level ``model_fields`` is a slow property.
    if isinstance(getattr(cls, "__pydantic_fields__", None), dict) and "__pydantic_extra__" in dir(cls):
        return _PYDANTIC
    return _OBJECT


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


_NO_REASONING_PREFIXES: Final = ("deepseek/",)


def accepts_reasoning(model: str, api_base: str | None) -> bool:
    """Whether reasoning may be sent back to this provider (reference 004, SPEC 3.3).

    litellm carries it as ``reasoning_content`` / ``thinking_blocks`` and translates it for providers that
    take it back (Anthropic's signed thinking, Gemini's thought signatures, Bedrock). OpenAI's own API
    rejects unknown message fields and DeepSeek rejects ``reasoning_content`` in input, so neither gets
    it; an OpenAI-compatible server at a custom ``api_base`` (vLLM, llama.cpp, the local provider) does.
    """
    if model.startswith(_NO_REASONING_PREFIXES):
        return False
    if "/" not in model or model.startswith(("openai/", "text-completion-openai/")):
        return api_base is not None
    return True


def to_provider_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    """The request's messages in the OpenAI chat format litellm takes; hidden messages are left out."""
    include = request.include_reasoning and accepts_reasoning(request.model, request.api_base)
    out: list[dict[str, Any]] = []
    for message in request.messages:
        if isinstance(message, Message):
            if message.agent_visible:
                out.append(message_to_openai(message, include_reasoning=include))
        else:
            out.append(message)
    return out


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
        kwargs["tools"] = list(request.tools)
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
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    kwargs.update(request.extra)
    return kwargs


_STOP_REASONS: Final[dict[str, StopReason]] = {
    "stop": "stop",
    "end_turn": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
}


def stop_reason(finish_reason: str | None, has_tool_calls: bool) -> StopReason:
    """Our stop reason for a provider's ``finish_reason``."""
    reason = _STOP_REASONS.get(finish_reason or "", "stop")
    if has_tool_calls and reason == "stop":
        return "tool_calls"
    return reason


class StreamAssembler:
    """Builds the assistant message from streamed chunks; each :meth:`add` returns the chunk's deltas.

    Tool-call fragments are joined by index; the id and name come from the first fragment that has them.
    Reasoning signatures arrive as ``thinking_blocks`` deltas (litellm's carrier for Anthropic's
    ``signature_delta``); redacted thinking blocks are kept as redacted reasoning parts.
    """

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.signature: str | None = None
        self.redacted: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # index -> [id, name, argument fragments]
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.model: str | None = None

    def add(self, chunk: Any) -> list[Delta]:
        usage = _field(chunk, "usage")
        if usage is not None:
            self.usage = usage
        self.model = self.model or _field(chunk, "model")
        deltas: list[Delta] = []
        for choice in _field(chunk, "choices") or ():
            finish = _field(choice, "finish_reason")
            if finish:
                self.finish_reason = finish
            delta = _field(choice, "delta")
            if delta is None:
                continue
            reasoning = _field(delta, "reasoning_content")
            if reasoning:
                self.reasoning.append(reasoning)
                deltas.append(Delta(kind="reasoning", text=reasoning))
            for block in _field(delta, "thinking_blocks") or ():
                self._thinking_block(block)
            content = _field(delta, "content")
            if content:
                self.text.append(content)
                deltas.append(Delta(kind="text", text=content))
            for call in _field(delta, "tool_calls") or ():
                deltas.append(self._tool_call(call))
        return deltas

    def _thinking_block(self, block: Any) -> None:
        kind = _field(block, "type")
        if kind == "redacted_thinking":
            self.redacted.append(str(_field(block, "data") or ""))
            return
        signature = _field(block, "signature")
        if signature:
            self.signature = signature

    def _tool_call(self, call: Any) -> Delta:
        index = _field(call, "index") or 0
        fn = _field(call, "function")
        call_id, name, fragment = _field(call, "id"), _field(fn, "name"), _field(fn, "arguments") or ""
        entry = self.calls.setdefault(index, [None, None, []])
        if call_id and not entry[0]:
            entry[0] = call_id
        if name and not entry[1]:
            entry[1] = name
        entry[2].append(fragment)
        return Delta(kind="tool_call", text=fragment, index=index, call_id=call_id or None, name=name or None)

    def message(self, *, model: str | None, usage: Usage) -> Message:
        parts: list[Part] = []
        reasoning = "".join(self.reasoning)
        if reasoning:
            parts.append(ReasoningPart(reasoning, signature=self.signature))
        parts.extend(ReasoningPart("", redacted=True, provider_metadata={"data": d}) for d in self.redacted)
        text = "".join(self.text)
        if text:
            parts.append(TextPart(text))
        for index in sorted(self.calls):
            call_id, name, fragments = self.calls[index]
            parts.append(
                ToolCallPart(id=call_id or f"call_{new_id()}", name=name or "", arguments="".join(fragments))
            )
        has_calls = bool(self.calls)
        return Message(
            role="assistant",
            parts=tuple(parts),
            model=model or self.model,
            usage=usage,
            stop_reason=stop_reason(self.finish_reason, has_calls),
        )


def message_from_response(response: Any, *, model: str | None, usage: Usage) -> Message:
    """The assistant message of a non-streamed litellm ``ModelResponse``."""
    choices = _field(response, "choices") or ()
    if not choices:
        return Message(role="assistant", model=model, usage=usage, stop_reason="stop")
    choice = choices[0]
    data = _field(choice, "message")
    message = message_from_openai(data) if data is not None else Message(role="assistant")
    return msgspec.structs.replace(
        message,
        model=model or _field(response, "model"),
        usage=usage,
        stop_reason=stop_reason(_field(choice, "finish_reason"), bool(message.tool_calls)),
    )


# ---------------------------------------------------------------------------------------------------
# litellm, loaded once

_FIRST_CALL_MODULES: Final = (
    # What litellm's first OpenAI-compatible call imports lazily (~500 modules, seconds): imported here, off
    # the loop thread, so that the first call does not stall every other coroutine of the I/O loop.
    "openai.resources",
    "litellm.proxy._types",
    "litellm.llms.litellm_proxy.chat.transformation",
    "litellm.llms.openai_like.dynamic_config",
    "litellm.llms.openai.chat.gpt_audio_transformation",
    "litellm._service_logger",
    "anyio._backends._asyncio",
    "litellm.litellm_core_utils.default_encoding",
    "litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic.transformation",
    "litellm.proxy.openai_files_endpoints.common_utils",
    "litellm.types.litellm_core_utils.streaming_chunk_builder_utils",
)
_litellm_lock = threading.Lock()
_litellm_module: Any = None


def load_litellm() -> Any:
    """Import and configure litellm once: quiet, no telemetry, no retries of its own, and its import's
    objects kept out of the cycle collector's full passes (``gc.freeze()``)."""
    global _litellm_module
    if _litellm_module is not None:
        return _litellm_module
    with _litellm_lock:
        if _litellm_module is None:
            import litellm

            litellm.suppress_debug_info = True
            litellm.set_verbose = False
            if hasattr(litellm, "telemetry"):
                litellm.telemetry = False
            logging.getLogger("LiteLLM").setLevel(logging.WARNING)
            for module in _FIRST_CALL_MODULES:
                with contextlib.suppress(ImportError):
                    importlib.import_module(module)
            # litellm's import leaves ~360,000 objects that live as long as the process. The cycle collector
            # would walk them all in every full collection (~0.25 s on a small machine, while every session
            # waits); frozen, they are left out. Garbage from the import is collected first.
            gc.collect()
            gc.freeze()
            _litellm_module = litellm
    return _litellm_module


# ---------------------------------------------------------------------------------------------------
# The gateway


class CallHandle:
    """A call in flight. :meth:`cancel` is safe from any thread; the result then reports ``cancelled``."""

    __slots__ = ("_call", "_loop")

    def __init__(self, loop: IoLoop, call: _Call) -> None:
        self._loop = loop
        self._call = call

    @property
    def done(self) -> bool:
        return self._call.finished.is_set()

    @property
    def attempts(self) -> int:
        return self._call.attempts

    def cancel(self) -> None:
        """Stop the call; ``on_result`` still fires once, with a ``cancelled`` error (unless already done)."""
        if not self._call.finished.is_set():
            with contextlib.suppress(RuntimeError):  # loop already closed: nothing left to cancel
                self._loop.call_soon(self._call.cancel)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the result was delivered; True if it was."""
        return self._call.finished.wait(timeout)


class _Call:
    """The state of one call, owned by the loop thread."""

    def __init__(
        self,
        request: CompletionRequest,
        on_result: Callable[[CompletionResult], object],
        on_delta: Callable[[Delta], object] | None,
        on_retry: Callable[[RetryInfo], object] | None,
        on_stall: Callable[[float], object] | None,
        stall_after: float,
    ) -> None:
        self.request = request
        self.on_result = on_result
        self.on_delta = on_delta
        self.on_retry = on_retry
        self.on_stall = on_stall
        self.stall_after = stall_after
        self.attempts = 0
        self.started = time.monotonic()
        self.task: asyncio.Task[CompletionResult] | None = None
        self.cancel_requested = False
        self.finished = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_activity = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_reported = False

    def cancel(self) -> None:
        self.cancel_requested = True
        if self.task is not None:
            self.task.cancel()

    # Stall watch: one timer per stall period, re-armed lazily (not per chunk).

    def activity(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._last_activity = loop.time()
        if self._stall_reported:
            self._stall_reported = False
            self._arm_stall()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._last_activity = loop.time()
        self._stall_reported = False
        if self.on_stall is not None and self._stall_timer is None:
            self._arm_stall()

    def _arm_stall(self) -> None:
        if self._loop is not None and self.on_stall is not None:
            self._stall_timer = self._loop.call_at(self._last_activity + self.stall_after, self._check_stall)

    def _check_stall(self) -> None:
        self._stall_timer = None
        if self._loop is None or self.finished.is_set() or self.on_stall is None:
            return
        idle = self._loop.time() - self._last_activity
        if idle + 1e-3 < self.stall_after:
            self._arm_stall()
            return
        self._stall_reported = True
        _safely(self.on_stall, round(idle, 3))

    def unwatch(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._loop = None


class Gateway:
    """Runs provider calls on the :class:`IoLoop` and delivers their results as callbacks (messages)."""

    def __init__(
        self, loop: IoLoop, retry: RetryConfig | None = None, *, rng: random.Random | None = None
    ) -> None:
        self._io = loop
        self._retry = retry or RetryConfig()
        self._rng = rng or random.Random()
        self._in_flight: set[_Call] = set()
        self._priced: dict[str, bool] = {}

    @property
    def retry_config(self) -> RetryConfig:
        return self._retry

    @property
    def in_flight(self) -> int:
        """Calls started and not yet delivered."""
        return len(self._in_flight)

    def preload(self) -> concurrent.futures.Future[Any]:
        """Import litellm in a background thread now, so that the first call does not wait for it."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def load() -> None:
            try:
                future.set_result(load_litellm())
            except BaseException as exc:
                future.set_exception(exc)

        # Not a daemon: a program that exits while litellm is still importing must wait for the import.
        # A daemon thread would be frozen mid-import holding a module lock, and the first finalizer that
        # imports (litellm's HTTP handlers do, in __del__) would then hang the exit forever.
        threading.Thread(target=load, name="agentcell-litellm-import").start()
        return future

    def complete(
        self,
        request: CompletionRequest,
        on_result: Callable[[CompletionResult], object],
        *,
        on_delta: Callable[[Delta], object] | None = None,
        on_retry: Callable[[RetryInfo], object] | None = None,
        on_stall: Callable[[float], object] | None = None,
        stall_after: float = 10.0,
    ) -> CallHandle:
        """Start ``request`` on the loop and return at once.

        ``on_result`` fires exactly once (from the loop thread) with the result, a classified error, or a
        ``cancelled`` error after :meth:`CallHandle.cancel`. ``on_delta`` gets each streamed piece,
        ``on_retry`` each retry before its backoff, ``on_stall`` the idle seconds once per stall (no chunk
        for ``stall_after`` seconds). Callbacks must not block: hand the value on (e.g. ``ref.tell``).
        """
        call = _Call(request, on_result, on_delta, on_retry, on_stall, stall_after)
        try:
            self._io.call_soon(self._start, call)
        except RuntimeError:  # the loop is closed
            raise RuntimeError("the gateway's I/O loop is stopped; no call can start") from None
        return CallHandle(self._io, call)

    async def acomplete(
        self,
        request: CompletionRequest,
        *,
        on_delta: Callable[[Delta], object] | None = None,
        on_retry: Callable[[RetryInfo], object] | None = None,
        on_stall: Callable[[float], object] | None = None,
        stall_after: float = 10.0,
    ) -> CompletionResult:
        """The same call, awaited from code already running on the gateway's loop."""
        future: asyncio.Future[CompletionResult] = asyncio.get_running_loop().create_future()

        def deliver(result: CompletionResult) -> None:
            if not future.done():
                future.set_result(result)

        call = _Call(request, deliver, on_delta, on_retry, on_stall, stall_after)
        self._start(call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            call.cancel()
            raise

    # -- on the loop thread -------------------------------------------------------------------------

    def _start(self, call: _Call) -> None:
        self._in_flight.add(call)
        if call.cancel_requested:  # cancelled before it started
            self._deliver(call, self._cancelled(call))
            return
        call.task = asyncio.get_running_loop().create_task(self._run(call))
        call.task.add_done_callback(lambda task: self._finish(call, task))

    def _finish(self, call: _Call, task: asyncio.Task[CompletionResult]) -> None:
        if task.cancelled():
            result = self._cancelled(call)
        elif (exc := task.exception()) is not None:
            _log.error("provider call failed unexpectedly", exc_info=exc)
            error = ProviderError(kind="unknown", message=f"{type(exc).__name__}: {exc}")
            result = CompletionResult(
                message=None, error=error, attempts=call.attempts, latency=self._elapsed(call)
            )
        else:
            result = task.result()
        self._deliver(call, result)

    def _deliver(self, call: _Call, result: CompletionResult) -> None:
        call.unwatch()
        self._in_flight.discard(call)
        call.finished.set()
        _safely(call.on_result, result)

    def _cancelled(self, call: _Call) -> CompletionResult:
        error = ProviderError(kind="cancelled", message="the call was cancelled")
        return CompletionResult(
            message=None, error=error, attempts=call.attempts, latency=self._elapsed(call)
        )

    @staticmethod
    def _elapsed(call: _Call) -> float:
        return time.monotonic() - call.started

    async def _run(self, call: _Call) -> CompletionResult:
        litellm = _litellm_module
        if litellm is None:
            litellm = await asyncio.get_running_loop().run_in_executor(None, load_litellm)
        request = call.request
        kwargs = build_call_kwargs(request)
        max_attempts = self._retry.max_attempts
        provider = request.model.split("/", 1)[0] if "/" in request.model else None
        while True:
            call.attempts += 1
            call.watch(asyncio.get_running_loop())
            try:
                message = await self._attempt(litellm, kwargs, call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = classify_error(exc, provider=provider)
                if request.api_key and request.api_key in error.message:  # keys never reach events or logs
                    error = msgspec.structs.replace(
                        error, message=error.message.replace(request.api_key, "***")
                    )
                if not error.retryable or call.attempts >= max_attempts:
                    return CompletionResult(
                        message=None, error=error, attempts=call.attempts, latency=self._elapsed(call)
                    )
                delay = backoff_delay(
                    call.attempts, self._retry, retry_after=error.retry_after, rng=self._rng
                )
                info = RetryInfo(
                    attempt=call.attempts,
                    max_attempts=max_attempts,
                    delay=delay,
                    error=error.message,
                    status_code=error.status_code,
                    kind=error.kind,
                )
                call.unwatch()
                if call.on_retry is not None:
                    _safely(call.on_retry, info)
                await asyncio.sleep(delay)
                continue
            finally:
                call.unwatch()
            usage = message.usage or Usage()
            return CompletionResult(
                message=message, usage=usage, attempts=call.attempts, latency=self._elapsed(call)
            )

    async def _attempt(self, litellm: Any, kwargs: dict[str, Any], call: _Call) -> Message:
        response = await litellm.acompletion(**kwargs)
        call.activity()
        model = call.request.model
        if not call.request.stream:
            raw_usage = _field(response, "usage")
            usage = normalize_usage(raw_usage, cost=self._cost(litellm, model, raw_usage))
            return message_from_response(response, model=model, usage=usage)
        assembler = StreamAssembler()
        on_delta = call.on_delta
        finished = False
        try:
            async for chunk in response:
                call.activity()
                deltas = assembler.add(chunk)
                if on_delta is not None:
                    for delta in deltas:
                        _safely(on_delta, delta)
            finished = True
        finally:
            # A stream abandoned midway (error, cancel) must give its connection back to the pool.
            aclose: Callable[[], Awaitable[object]] | None = getattr(response, "aclose", None)
            if not finished and aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        usage = normalize_usage(assembler.usage, cost=self._cost(litellm, model, assembler.usage))
        return assembler.message(model=model, usage=usage)

    def _cost(self, litellm: Any, model: str, raw_usage: Any) -> float | None:
        """The call's cost in USD: what the provider or litellm stamped on the usage (litellm's own
        figure for a streamed call), else litellm's prices for the model; None when neither knows."""
        if raw_usage is None:
            return None
        stamped = _field(raw_usage, "cost")
        if isinstance(stamped, Mapping):  # a provider's breakdown (OpenRouter): its total
            stamped = stamped.get("total_cost")
        if isinstance(stamped, (int, float)) and not isinstance(stamped, bool) and stamped >= 0:
            return float(stamped)
        if self._priced.get(model) is False:
            return None
        try:
            prompt_cost, completion_cost = litellm.cost_per_token(model=model, usage_object=raw_usage)
        except Exception:
            self._priced[model] = False
            return None
        self._priced[model] = True
        return float(prompt_cost + completion_cost)


def _safely(fn: Callable[[T], object], value: T) -> None:
    try:
        fn(value)
    except pykka.ActorDeadError:  # e.g. the result of a call cancelled as its session was deleted
        _log.debug("gateway callback %r: its actor has stopped; the value is dropped", fn)
    except Exception:
        _log.exception("gateway callback %r raised", fn)


def complete_sync(
    gateway: Gateway, request: CompletionRequest, timeout: float | None = None
) -> CompletionResult:
    """Run one call and wait for its result (for tests and the CLI; never from the gateway's loop thread).

    When ``timeout`` passes first, the call is cancelled and its ``cancelled`` result returned.
    """
    if gateway._io.in_loop_thread():
        raise RuntimeError("complete_sync() would deadlock on the gateway's own loop thread; use acomplete()")
    box: list[CompletionResult] = []
    done = threading.Event()

    def deliver(result: CompletionResult) -> None:
        box.append(result)
        done.set()

    handle = gateway.complete(request, deliver)
    if not done.wait(timeout):
        handle.cancel()
        done.wait(5.0)
    if not box:
        raise TimeoutError("the gateway did not deliver a result")
    return box[0]
