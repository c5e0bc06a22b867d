"""The native Anthropic transport: the Messages API (``POST /v1/messages``) over keep-alive HTTP/1.1, decoded with
msgspec (design §3.2). ``anthropic/`` models go here, not through litellm (which stays for Bedrock and Vertex).

The body is the one litellm's Anthropic request builder sends for the same request
(:mod:`runtime.gateway._anthropic_body`), with the runtime's cache breakpoints rendered as ``cache_control``;
the key goes in ``x-api-key`` with ``anthropic-version: 2023-06-01``. The answer's server-sent events
(``message_start``, ``content_block_start``/``_delta``/``_stop``, ``message_delta``, ``message_stop``) become
the shared deltas and one assistant message whose parts follow the answer's blocks: each ``thinking`` block a
reasoning part with its own ``signature`` (sent back unchanged on the next call: Anthropic refuses a changed
one), ``redacted_thinking`` kept as redacted reasoning, text, and tool calls with their JSON arguments as
streamed. ``ping`` events are keep-alives: no sign of an answer (the gateway's first-byte and stall limits run
on). Usage: ``input_tokens`` of the runtime's :class:`~runtime.messages.Usage` is the whole prompt (Anthropic's
``input_tokens`` plus ``cache_read_input_tokens`` and ``cache_creation_input_tokens``), with the cache's reads
and writes beside it; cost from the route's prices.

Errors are mapped where they arise (:meth:`AnthropicTransport.error_kind`): an error body's or an ``error``
event's ``error.type`` by Anthropic's table (:data:`runtime.dialects.anthropic.ERROR_TYPES`:
``overloaded_error`` and ``api_error`` transient, ``rate_limit_error`` a rate limit, ``authentication_error``
auth...), a stream cut short transient, the HTTP client's errors what they carry; the shared rules (overflow
wordings first, then the status) do the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

import msgspec

from runtime.dialects import anthropic as dialect
from runtime.gateway._anthropic_body import request_body
from runtime.gateway._cost import usage_with_cost
from runtime.gateway._models import Delta, ErrorKind
from runtime.gateway._stream import stop_reason
from runtime.gateway.transports._http import HTTPTransportError, Response
from runtime.gateway.transports.base import Attempt
from runtime.gateway.transports.openai_compat import PooledTransport, ProviderHTTPError, StreamError, error_of
from runtime.messages import Message, Part, ReasoningPart, TextPart, ToolCallPart, Usage, new_id

if TYPE_CHECKING:
    from runtime.gateway._routing import Route

NAME: Final = "anthropic"
VERSION: Final = "2023-06-01"


class _Event(msgspec.Struct):
    type: str = ""
    index: int = 0
    content_block: dict[str, Any] | None = None
    delta: dict[str, Any] | None = None
    message: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    error: Any = None


_decode_event = msgspec.json.Decoder(_Event).decode
_decode_any = msgspec.json.Decoder().decode


class _Answer:
    """The answer's blocks as they stream in (by index), its usage and stop reason."""

    __slots__ = ("blocks", "model", "stop", "stopped", "usage")

    def __init__(self) -> None:
        self.blocks: dict[int, list[Any]] = {}  # index -> [type, pieces, signature/id, name/data]
        self.usage: dict[str, Any] = {}
        self.stop: str | None = None
        self.stopped = False
        self.model: str | None = None

    def message(self, *, model: str | None, usage: Usage) -> Message:
        parts: list[Part] = []
        for index in sorted(self.blocks):
            kind, pieces, first, second = self.blocks[index]
            if kind == "thinking":
                parts.append(ReasoningPart("".join(pieces), signature=first or None))
            elif kind == "redacted_thinking":
                parts.append(ReasoningPart("", redacted=True, provider_metadata={"data": second}))
            elif kind == "text":
                text = "".join(pieces)
                if text:
                    parts.append(TextPart(text))
            elif kind == "tool_use":
                parts.append(
                    ToolCallPart(
                        id=first or f"toolu_{new_id()}", name=second or "", arguments="".join(pieces) or "{}"
                    )
                )
        has_calls = any(isinstance(p, ToolCallPart) for p in parts)
        return Message(
            role="assistant",
            parts=tuple(parts),
            model=model or self.model,
            usage=usage,
            stop_reason=stop_reason(self.stop, has_calls),
        )


def raw_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's usage in the shape :func:`~runtime.gateway._usage.normalize_usage` reads: the prompt is the
    uncached input plus what was read from and written to the cache (of which ``cache_creation`` says what
    was written for an hour)."""

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and value > 0 else 0

    read, write = count("cache_read_input_tokens"), count("cache_creation_input_tokens")
    by_ttl = usage.get("cache_creation")
    hour = by_ttl.get("ephemeral_1h_input_tokens") if isinstance(by_ttl, Mapping) else None
    return {
        "prompt_tokens": count("input_tokens") + read + write,
        "completion_tokens": count("output_tokens"),
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
        "cache_creation": {"ephemeral_1h_input_tokens": hour if isinstance(hour, int) and hour > 0 else 0},
    }


class AnthropicTransport(PooledTransport):
    """Anthropic's Messages API, natively."""

    name: ClassVar[str] = NAME

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        """An error's ``error.type`` by Anthropic's table; a stream cut short is transient; the HTTP client's
        errors are what they carry."""
        if isinstance(exc, ProviderHTTPError):
            kind = _error_type_kind(exc.body)
            if kind is not None:
                return kind
            return "transient" if isinstance(exc, StreamError) else None
        if isinstance(exc, HTTPTransportError):
            return exc.kind
        return None

    async def attempt(self, call: Attempt, route: Route) -> Message:
        request = call.request
        key = request.api_key or route.api_key
        auth = b"x-api-key: %s\r\n" % key.encode() if key else b""
        body = request_body(request, route.model, route.default_max_tokens)
        response = await self._http.post(self._endpoint(route), auth, body, request.timeout)
        try:
            call.response_started()
            call.received_headers(response.headers)
            if response.status >= 400:
                raise await error_of(response)
            if not request.stream:
                return _whole(await response.read(), request.model, route)
            return await _streamed(response, call, route)
        finally:
            response.close()


def _error_type_kind(body: object) -> ErrorKind | None:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("type"), str):
            return dialect.ERROR_TYPES.get(error["type"])
    return None


async def _streamed(response: Response, call: Attempt, route: Route) -> Message:
    answer = _Answer()
    on_delta = call.on_delta
    activity = call.activity
    pending = b""
    async for data in response.chunks():
        if pending:
            data = pending + data
        lines = data.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                _apply(line[5:], answer, activity, on_delta)
    if pending.startswith(b"data:"):
        _apply(pending[5:], answer, activity, on_delta)
    if not answer.stopped and answer.stop is None:
        raise StreamError(None, "the stream ended before the response was complete")
    usage = usage_with_cost(raw_usage(answer.usage), route.prices, NAME)
    return answer.message(model=call.request.model, usage=usage)


def _apply(payload: bytes, answer: _Answer, activity: Any, on_delta: Any) -> None:
    """One event into the answer; its delta (if any) reported."""
    try:
        event = _decode_event(payload)
    except msgspec.DecodeError as exc:
        raise StreamError(None, f"a stream event is not valid: {exc}") from None
    kind = event.type
    if kind == "ping":
        return  # a keep-alive: no sign of an answer
    activity()
    delta: Delta | None = None
    if kind == "content_block_delta" and event.delta is not None:
        block = answer.blocks.get(event.index)
        if block is None:
            block = answer.blocks[event.index] = ["text", [], None, None]
        piece = event.delta
        what = piece.get("type")
        if what == "text_delta":
            text = piece.get("text") or ""
            block[1].append(text)
            delta = Delta(kind="text", text=text)
        elif what == "thinking_delta":
            text = piece.get("thinking") or ""
            block[1].append(text)
            delta = Delta(kind="reasoning", text=text)
        elif what == "signature_delta":
            block[2] = (block[2] or "") + (piece.get("signature") or "")
        elif what == "input_json_delta":
            fragment = piece.get("partial_json") or ""
            block[1].append(fragment)
            delta = Delta(kind="tool_call", text=fragment, index=_call_index(answer, event.index))
    elif kind == "content_block_start" and event.content_block is not None:
        started = event.content_block
        what = started.get("type") or "text"
        if what == "tool_use":
            answer.blocks[event.index] = [what, [], started.get("id"), started.get("name")]
            delta = Delta(
                kind="tool_call",
                index=_call_index(answer, event.index),
                call_id=started.get("id"),
                name=started.get("name"),
            )
        elif what == "redacted_thinking":
            answer.blocks[event.index] = [what, [], None, started.get("data")]
        else:
            initial = started.get("thinking") if what == "thinking" else started.get("text")
            answer.blocks[event.index] = [what, [initial] if initial else [], started.get("signature"), None]
    elif kind == "message_start" and event.message is not None:
        answer.model = event.message.get("model")
        usage = event.message.get("usage")
        if isinstance(usage, dict):
            answer.usage.update(usage)
    elif kind == "message_delta":
        if event.delta is not None and event.delta.get("stop_reason"):
            answer.stop = event.delta["stop_reason"]
        if event.usage is not None:
            answer.usage.update({k: v for k, v in event.usage.items() if v is not None})
    elif kind == "message_stop":
        answer.stopped = True
    elif kind == "error":
        body = _decode_any(payload)
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        raise StreamError(None, str(message or "the provider sent an error event"), body)
    if delta is not None and on_delta is not None:
        on_delta(delta)


def _call_index(answer: _Answer, index: int) -> int:
    """The tool call's place among the answer's calls (the delta's index), from its block's index."""
    return sum(1 for i, b in answer.blocks.items() if i < index and b[0] == "tool_use")


def _whole(data: bytes, model: str, route: Route) -> Message:
    try:
        body = _decode_any(data)
    except msgspec.DecodeError as exc:
        raise StreamError(None, f"the response is not valid: {exc}") from None
    if not isinstance(body, dict):
        raise StreamError(None, "the response is not a message")
    answer = _Answer()
    for index, block in enumerate(body.get("content") or ()):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "thinking":
            answer.blocks[index] = [kind, [block.get("thinking") or ""], block.get("signature"), None]
        elif kind == "redacted_thinking":
            answer.blocks[index] = [kind, [], None, block.get("data")]
        elif kind == "text":
            answer.blocks[index] = [kind, [block.get("text") or ""], None, None]
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            answer.blocks[index] = [kind, [arguments], block.get("id"), block.get("name")]
    answer.stop = body.get("stop_reason")
    answer.model = body.get("model")
    usage = body.get("usage")
    raw = raw_usage(usage if isinstance(usage, dict) else {})
    return answer.message(model=model, usage=usage_with_cost(raw, route.prices, NAME))
