"""Error responses of the local provider, in the wording and shape real vendors send.

Context overflow comes in many dialects: each function of :data:`OVERFLOW_FORMATS` imitates one vendor's
HTTP status, JSON body shape and message wording (as observed from their APIs), so that the runtime's
overflow classifier is tested against what it will meet in production. Each lives in its vendor's module of
:mod:`runtime.dialects`, beside the wordings the classifier reads; faults (rate limit, server error,
overload, bad key) too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from runtime.dialects import OVERFLOW_FORMATS, anthropic, openai
from runtime.dialects._base import ErrorResponse, OverflowFormat

__all__ = [
    "OVERFLOW_FORMATS",
    "ErrorResponse",
    "FaultWords",
    "OverflowFormat",
    "auth_error",
    "bad_request",
    "overflow_error",
    "overloaded_error",
    "rate_limit_error",
    "server_error",
]


def overflow_error(fmt: str, prompt: int, window: int, completion: int = 0) -> ErrorResponse:
    """The overflow error of vendor ``fmt``; raises ``ValueError`` listing the known formats."""
    try:
        build = OVERFLOW_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown overflow format {fmt!r}; known: {', '.join(OVERFLOW_FORMATS)}") from None
    return build(prompt, window, completion)


# Faults, in OpenAI's words (the chat completions endpoint's) but for Anthropic's overload.
rate_limit_error = openai.rate_limit_error
server_error = openai.server_error
overloaded_error = anthropic.overloaded_error
auth_error = openai.auth_error
bad_request = openai.bad_request


@dataclass(frozen=True, kw_only=True)
class FaultWords:
    """How an endpoint's dialect says each injected fault (:meth:`runtime.provider._faults.FaultPlayer.respond`)."""

    rate_limit: Callable[[], ErrorResponse]
    server_error: Callable[[int | None], ErrorResponse]
    overloaded: Callable[[int | None], ErrorResponse]
    auth: Callable[[], ErrorResponse]
    overflow: Callable[[int], ErrorResponse]
    """The overflow error for a prompt of so many tokens."""
    frames: Callable[[str], Iterator[bytes]]
    """The SSE frames of a reply saying a phrase (what a mid-stream fault breaks into)."""
    error_event: bytes
    """The SSE event a stream that fails midway ends with."""
    keepalive: bytes = b": keep-alive\n\n"
