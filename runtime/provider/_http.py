"""What both of the local provider's endpoints (chat completions, Anthropic's Messages) share: JSON and error
responses, server-sent events (headers, frames paced), a request's concurrent slot held until its answer is
sent, the key a request is counted under, the status an injected fault is logged with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime.dialects._base import ErrorResponse
from runtime.provider.script import Fault

if TYPE_CHECKING:
    from runtime.provider.limits import ProviderLimiter

_json = msgspec.json.Encoder()

_FAULT_STATUSES = {"rate_limit": 429, "server_error": 500, "auth": 401, "overflow": 400, "stream_error": 200}

SSE_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}
SSE_DONE: Final = b"data: [DONE]\n\n"
"""The frame that ends a chat completions stream (not paced: nothing follows it)."""


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(body), status_code=status, media_type="application/json", headers=headers)


def error_response(error: ErrorResponse) -> Response:
    return json_response(error.status, error.body, error.headers)


def fault_status(fault: Fault, *, overloaded: int) -> int:
    """The HTTP status ``fault`` answers with; ``overloaded`` is the endpoint's (OpenAI 503, Anthropic 529)."""
    if fault.status:
        return fault.status
    return overloaded if fault.kind == "overloaded" else _FAULT_STATUSES.get(fault.kind, 0)


def sse(body: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> StreamingResponse:
    """A streamed answer of server-sent events."""
    return StreamingResponse(body, media_type="text/event-stream", headers=headers or SSE_HEADERS)


def sse_frames(frames: Iterator[bytes], delay: float, headers: dict[str, str]) -> Response:
    """A reply's SSE frames: all at once, or streamed ``delay`` seconds apart."""
    if delay <= 0:
        return Response(b"".join(frames), media_type="text/event-stream", headers=headers)
    return sse(paced(frames, delay), headers)


async def paced(frames: Iterator[bytes], delay: float) -> AsyncIterator[bytes]:
    """``frames`` with ``delay`` seconds after each (but the last, :data:`SSE_DONE`)."""
    for frame in frames:
        yield frame
        if frame is not SSE_DONE:
            await asyncio.sleep(delay)


async def within_slot(limiter: ProviderLimiter, key: str, answer: Awaitable[Response]) -> Response:
    """``answer`` awaited in the concurrent slot ``limiter`` admitted ``key``'s request to: the slot is freed
    once the answer is sent (a streamed one when its body ends or is cut off), or at once if it fails."""
    try:
        response = await answer
    except BaseException:
        limiter.release(key)
        raise
    if isinstance(response, StreamingResponse):
        response.body_iterator = _released(response.body_iterator, lambda: limiter.release(key))
    else:
        limiter.release(key)
    return response


async def _released(body: AsyncIterable[Any], release: Callable[[], None]) -> AsyncIterator[Any]:
    try:
        async for piece in body:
            yield piece
    finally:
        release()


def pieces(text: str, size: int) -> list[str]:
    """``text`` in chunks of ``size`` characters (as a reply streams)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def bearer(request: Request) -> str:
    """The request's API key (its bearer token), the key its limits are counted under."""
    header = request.headers.get("authorization", "")
    return header[7:] if header.startswith("Bearer ") else ""
