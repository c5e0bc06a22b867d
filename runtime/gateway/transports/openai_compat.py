"""The native transport: OpenAI chat completions over keep-alive HTTP/1.1, decoded with msgspec (design §3.2).

Connections come from keep-alive pools, one per endpoint (:mod:`runtime.gateway.transports._http`; httpx's
pool costs O(n) to O(n^2) per call in the number of pooled connections, more than litellm's whole call at a
thousand). The request body is the one litellm sends over the route (see :mod:`runtime.gateway._routing`),
encoded once with msgspec; the response's server-sent events are split into lines and each ``data:``
payload decoded straight into msgspec Structs that hold only what the runtime reads -- no per-chunk model
objects, no logging or cost callbacks. Text, ``reasoning_content`` (or ``reasoning``), signed
``thinking_blocks`` and tool-call fragments (by index) go to the shared
:class:`~runtime.gateway._stream.StreamAssembler`; usage comes from the last chunk
(``stream_options.include_usage``), cost from the route's prices.

Failures are mapped into the shared error kinds by type (:meth:`OpenAICompatTransport.error_kind`), then by the
same rules litellm's are: an error response is a
:class:`ProviderHTTPError` carrying the status, the decoded JSON body (where the overflow classifier reads
every vendor's wording) and the headers (``retry-after``); an error sent mid-stream, a stream cut short and an
undecodable chunk are :class:`StreamError` (transient); the HTTP client's errors are named as httpx's are and
carry their kind (``ReadTimeout`` is a timeout, ``ConnectError``, ``ReadError`` and ``RemoteProtocolError`` are
transient).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

import msgspec

from runtime.errors import TransportError
from runtime.gateway._caching import cache_key, in_content, tools_with_cache
from runtime.gateway._convert import to_provider_messages
from runtime.gateway._cost import usage_with_cost
from runtime.gateway._models import CompletionRequest, Delta, ErrorKind
from runtime.gateway._stream import StreamAssembler, message_from_response
from runtime.gateway.transports._http import Endpoint, HTTPClient, HTTPTransportError, Response
from runtime.gateway.transports.base import Attempt, Transport

if TYPE_CHECKING:
    from runtime.gateway._routing import Route
    from runtime.messages import Message

NAME: Final = "openai_compat"
MAX_ERROR_BODY: Final = 64 * 1024
"""How much of an error response is read (the classifier bounds what it reads too)."""


class ProviderHTTPError(TransportError):
    """An error response: its status, the provider's own message, its JSON body and its headers."""

    def __init__(
        self,
        status_code: int | None,
        message: str,
        body: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.body = body
        self.headers = headers


class StreamError(ProviderHTTPError):
    """The stream failed after it started: an error event, a cut, or a chunk that is not JSON (transient)."""


# -- what a chunk holds, as far as the runtime reads it ---------------------------------------------------


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _ThinkingBlock(msgspec.Struct):
    type: str | None = None
    signature: str | None = None
    data: Any = None


class _Delta(msgspec.Struct):
    content: Any = None
    reasoning_content: Any = None
    reasoning: Any = None
    tool_calls: list[_ToolCall] | None = None
    thinking_blocks: list[_ThinkingBlock] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    error: Any = None


class _Completion(msgspec.Struct):
    choices: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_completion = msgspec.json.Decoder(_Completion).decode
_decode_any = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_DONE: Final = b"[DONE]"
_STRIP_REASONING: Final = ("reasoning_content", "thinking_blocks")
_STRIP_THINKING_BLOCKS: Final = ("thinking_blocks",)


class PooledTransport(Transport):
    """A native transport's connections: keep-alive pools of the HTTP client, one endpoint per URL and
    headers (shared by ``openai_compat`` and ``anthropic``)."""

    def __init__(self, *, max_connections: int = 1_000, keepalive_expiry: float = 5.0) -> None:
        self._http = HTTPClient(max_connections=max_connections, keepalive_expiry=keepalive_expiry)
        self._endpoints: dict[object, Endpoint] = {}

    def _endpoint(self, route: Route) -> Endpoint:
        key: object = route.url if not route.headers else (route.url, *sorted(route.headers.items()))
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            endpoint = self._endpoints[key] = Endpoint(route.url, route.headers)
        return endpoint

    async def aclose(self) -> None:
        await self._http.aclose()


class OpenAICompatTransport(PooledTransport):
    """Chat completions straight to an OpenAI-compatible endpoint."""

    name: ClassVar[str] = NAME

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        """A stream that failed is transient, the HTTP client's errors are what they carry, and an error
        response is decided by its status and body (None here)."""
        if isinstance(exc, StreamError):
            return "transient"
        if isinstance(exc, HTTPTransportError):
            return exc.kind
        return None

    async def attempt(self, call: Attempt, route: Route) -> Message:
        request = call.request
        key = request.api_key or route.api_key
        auth = b"authorization: Bearer %s\r\n" % key.encode() if key else b""
        response = await self._http.post(
            self._endpoint(route), auth, request_body(request, route), request.timeout
        )
        try:
            call.response_started()
            call.received_headers(response.headers)
            if response.status >= 400:
                raise await error_of(response)
            if not request.stream:
                return _whole(await response.read(), request, route)
            return await _streamed(response, call, route)
        finally:
            response.close()


def request_body(request: CompletionRequest, route: Route) -> bytes:
    """The JSON body for ``request``: what litellm sends over this route."""
    dialect = route.dialect
    messages = to_provider_messages(request)
    strip = (
        _STRIP_REASONING
        if not dialect.reasoning
        else _STRIP_THINKING_BLOCKS
        if not dialect.thinking_blocks
        else ()
    )
    if strip:
        messages = [_without(m, strip) if m.get("role") == "assistant" else m for m in messages]
    if request.cache is not None and route.provider == "openrouter":
        messages = in_content(messages)  # where litellm puts OpenRouter's breakpoints
    body: dict[str, Any] = {"model": route.model, "messages": messages}
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    elif dialect.stream_false:
        body["stream"] = False
    if request.tools:
        body["tools"] = tools_with_cache(request)
    if request.max_tokens is not None and route.max_tokens_param is not None:
        body[route.max_tokens_param] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if (key := cache_key(request)) is not None:
        body["prompt_cache_key"] = key
    if dialect.body:
        body.update(dialect.body)
    return _encode(body)


def _without(message: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    if not any(k in message for k in keys):
        return message
    return {k: v for k, v in message.items() if k not in keys}


async def _streamed(response: Response, call: Attempt, route: Route) -> Message:
    assembler = StreamAssembler()
    on_delta = call.on_delta
    activity = call.activity
    pending = b""
    done = False
    async for data in response.chunks():
        if pending:
            data = pending + data
        lines = data.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank lines, comments (": keep-alive": no sign of an answer), event/id/retry fields
            activity()
            payload = line[5:].strip()
            if payload == _DONE:
                done = True
                continue
            for delta in _apply(payload, assembler):
                if on_delta is not None:
                    on_delta(delta)
    if pending.startswith(b"data:"):  # a last event without its blank line
        activity()
        payload = pending[5:].strip()
        if payload == _DONE:
            done = True
        else:
            for delta in _apply(payload, assembler):
                if on_delta is not None:
                    on_delta(delta)
    if not done and assembler.finish_reason is None:
        raise StreamError(None, "the stream ended before the response was complete")
    return assembler.message(
        model=call.request.model, usage=usage_with_cost(assembler.usage, route.prices, NAME)
    )


def _apply(payload: bytes, assembler: StreamAssembler) -> list[Delta]:
    """One chunk into the assembler; the deltas it brought."""
    try:
        chunk = _decode_chunk(payload)
    except msgspec.DecodeError as exc:  # a cut or mangled chunk: as litellm, a transient failure
        raise StreamError(None, f"a stream chunk is not valid: {exc}") from None
    if chunk.error is not None:
        raise _stream_error(chunk.error, payload)
    if chunk.usage is not None:
        assembler.usage = chunk.usage
    if assembler.model is None:
        assembler.model = chunk.model
    deltas: list[Delta] = []
    for choice in chunk.choices or ():
        if choice.finish_reason:
            assembler.finish_reason = choice.finish_reason
        delta = choice.delta
        if delta is None:
            continue
        reasoning = delta.reasoning_content or delta.reasoning
        if reasoning and isinstance(reasoning, str):
            deltas.append(assembler.reasoning_piece(reasoning))
        if delta.thinking_blocks:
            for block in delta.thinking_blocks:
                assembler.thinking_block(block.type, block.signature, block.data)
        content = delta.content
        if content:
            if isinstance(content, str):
                deltas.append(assembler.text_piece(content))
            elif isinstance(content, list):  # content parts (Mistral's shape): their text
                text = "".join(
                    p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"
                )
                if text:
                    deltas.append(assembler.text_piece(text))
        if delta.tool_calls:
            for call in delta.tool_calls:
                fn = call.function
                name, fragment = (fn.name, fn.arguments or "") if fn is not None else (None, "")
                deltas.append(assembler.tool_call_piece(call.index or 0, call.id, name, fragment))
    return deltas


def _whole(data: bytes, request: CompletionRequest, route: Route) -> Message:
    try:
        completion = _decode_completion(data)
    except msgspec.DecodeError as exc:
        raise StreamError(None, f"the response is not valid: {exc}") from None
    for choice in completion.choices or ():
        message = choice.get("message")
        if (
            isinstance(message, dict)
            and "reasoning_content" not in message
            and isinstance(message.get("reasoning"), str)
        ):
            message["reasoning_content"] = message["reasoning"]
    return message_from_response(
        completion, model=request.model, usage=usage_with_cost(completion.usage, route.prices, NAME)
    )


async def error_of(response: Response) -> ProviderHTTPError:
    """An error response read (bounded) into a :class:`ProviderHTTPError` with the provider's own words."""
    raw = await response.read(MAX_ERROR_BODY)
    text = raw[:MAX_ERROR_BODY].decode("utf-8", "replace")
    try:
        body: object = _decode_any(raw) if raw and len(raw) < MAX_ERROR_BODY else text
    except msgspec.DecodeError:
        body = text
    message = _message_of(body) or text.strip() or f"HTTP {response.status} {response.reason}"
    return ProviderHTTPError(response.status, message, body, response.headers)


def _stream_error(error: object, payload: bytes) -> ProviderHTTPError:
    body = _decode_any(payload)
    message = _message_of(body) or str(error)
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    if status is not None and status < 500:
        return ProviderHTTPError(status, message, body)
    return StreamError(status, message, body)


def _message_of(body: object) -> str | None:
    """The provider's own words in an error body of any vendor's shape."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(error, str) and error:
        return error
    for key in ("message", "detail"):
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
    return None
