"""Anthropic's dialect (the Messages API, ``POST /v1/messages``): its overflow wordings and error types, the
errors it answers with (as the local provider imitates them), and its ``anthropic-ratelimit-*`` headers.

Every error body is ``{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}``, its
type by status: ``invalid_request_error`` (400), ``authentication_error`` (401), ``billing_error`` (402),
``permission_error`` (403), ``not_found_error`` (404), ``request_too_large`` (413), ``rate_limit_error`` (429,
with ``retry-after``), ``api_error`` (500), ``timeout_error`` (504) and ``overloaded_error`` (529). A prompt
over the window: "prompt is too long: 208310 tokens > 200000 maximum"; with the output asked for: "input
length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or `max_tokens`
and try again". Rate limits: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
remaining,reset}`` (per minute; the reset an RFC 3339 time).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any, Final

from runtime.dialects._base import (
    NUM,
    OUT,
    PROMPT,
    WIN,
    Dialect,
    Dimension,
    ErrorKind,
    ErrorResponse,
    OverflowFormat,
    number,
    parse_instant,
    request_id,
)

ERROR_TYPES: Final[Mapping[str, ErrorKind]] = {
    "invalid_request_error": "invalid_request",
    "authentication_error": "auth",
    "permission_error": "auth",
    "billing_error": "invalid_request",
    "not_found_error": "invalid_request",
    "request_too_large": "overflow",
    "rate_limit_error": "rate_limit",
    "api_error": "transient",
    "overloaded_error": "transient",
    "timeout_error": "timeout",
}
"""An error body's ``error.type`` by the kind of failure it is."""

ERROR_STATUSES: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""The HTTP status each error type comes with."""

ANTHROPIC: Final = Dialect(
    name="anthropic",
    # "prompt is too long: 208310 tokens > 200000 maximum"; "input length and `max_tokens` exceed context
    # limit: …"; 413 "request_too_large".
    overflow_phrases=("request_too_large", "exceed context limit"),
    overflow_codes=frozenset({"request_too_large", "model_context_window_exceeded"}),  # (and Z.ai's)
    output_budget_regexes=(
        re.compile(rf"input length and `max_tokens` exceed context limit: {NUM} \+ {OUT} > {WIN}"),
    ),
    window_regexes=(
        # "prompt is too long: 208310 tokens > 200000 maximum"
        re.compile(rf"{NUM} tokens? > {WIN} maximum"),
    ),
    prompt_regexes=(
        re.compile(rf"prompt is too long: {PROMPT} tokens? >"),
        re.compile(rf"exceed context limit: {PROMPT} \+"),
    ),
    negative_phrases=(
        "invalid x-api-key",
        "overloaded",
        "`max_tokens` must be",
        "max_tokens` must be less",
        "maximum allowed number of output tokens",
    ),
    negative_codes=frozenset(
        {"rate_limit_error", "authentication_error", "permission_error", "overloaded_error"}
    ),
    error_types=ERROR_TYPES,
)

# -- the errors it answers with (the local provider's imitations) -------------------------------------------


def error(
    type_: str, message: str, status: int | None = None, headers: Mapping[str, str] | None = None
) -> ErrorResponse:
    """An error of ``type_`` in Anthropic's shape, with its status (or ``status``) and a ``request-id``."""
    rid = request_id()
    body: dict[str, Any] = {"type": "error", "error": {"type": type_, "message": message}, "request_id": rid}
    return ErrorResponse(
        status or ERROR_STATUSES.get(type_, 400), body, {"request-id": rid, **(headers or {})}
    )


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Anthropic Messages API."""
    return error("invalid_request_error", f"prompt is too long: {prompt} tokens > {window} maximum")


def request_too_large(prompt: int, window: int, completion: int) -> ErrorResponse:
    """HTTP 413, as Anthropic sends it when the request body itself is over the size limit."""
    body = {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "Request exceeds the maximum allowed number of bytes.",
        },
    }
    return ErrorResponse(413, body)


def overloaded_error(status: int | None = None) -> ErrorResponse:
    """Anthropic's ``overloaded_error`` (sent with 529 by Anthropic; 503 by default here, as the chat
    completions endpoint of the local provider has always sent it)."""
    body = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": request_id(),
    }
    return ErrorResponse(status or 503, body)


def rate_limit_error(
    model: str,
    retry_after: float | None,
    *,
    limit: str = "requests",
    limit_value: int = 50,
    headers: Mapping[str, str] | None = None,
) -> ErrorResponse:
    """Anthropic's 429 for a per-minute limit (``limit``: ``requests``, ``input-tokens``, ``tokens`` or
    ``concurrent``), with ``retry-after`` (whole seconds, as Anthropic sends it) and ``headers``."""
    what = {
        "requests": "requests per minute",
        "tokens": "input tokens per minute",
        "input-tokens": "input tokens per minute",
        "output-tokens": "output tokens per minute",
    }.get(limit, "concurrent connections")
    message = (
        f"This request would exceed your organization's rate limit of {limit_value} {what} (model: {model}). "
        "For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers "
        "for current usage."
    )
    sent = dict(headers or {})
    if retry_after is not None:
        sent["retry-after"] = str(max(1, int(-(-retry_after // 1))))
    return error("rate_limit_error", message, 429, sent)


def auth_error() -> ErrorResponse:
    """Anthropic's 401 for a wrong key (no part of the key echoed)."""
    return error("authentication_error", "invalid x-api-key")


def api_error(status: int | None = None) -> ErrorResponse:
    """Anthropic's 500."""
    return error("api_error", "Internal server error", status or 500)


def bad_request(message: str) -> ErrorResponse:
    """A 400 ``invalid_request_error`` (a malformed request)."""
    return error("invalid_request_error", message)


# -- rate-limit headers ---------------------------------------------------------------------------------------

PREFIX: Final = "anthropic-ratelimit-"
LIMITS: Final = ("requests", "tokens", "input-tokens", "output-tokens")


def read_rate_limit(headers: Mapping[str, str], name: str, now: float) -> Dimension | None:
    """The limit ``name`` (one of :data:`LIMITS`) of lower-cased ``headers``, or None; ``now`` is the wall
    clock the RFC 3339 resets are read against."""
    limit = headers.get(f"{PREFIX}{name}-limit")
    remaining = headers.get(f"{PREFIX}{name}-remaining")
    reset_raw = headers.get(f"{PREFIX}{name}-reset")
    if limit is None and remaining is None and reset_raw is None:
        return None
    return Dimension(limit=number(limit), remaining=number(remaining), reset=parse_instant(reset_raw, now))


def rate_limit_headers(name: str, limit: float, remaining: float, reset: float, now: float) -> dict[str, str]:
    """The three headers of limit ``name`` (per minute; ``reset`` seconds after the wall clock ``now``, written
    as an RFC 3339 time)."""
    when = datetime.datetime.fromtimestamp(now + max(0.0, reset), tz=datetime.UTC)
    return {
        f"{PREFIX}{name}-limit": str(int(limit)),
        f"{PREFIX}{name}-remaining": str(max(0, int(remaining))),
        f"{PREFIX}{name}-reset": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


# -- prompt caching -------------------------------------------------------------------------------------------
# Anthropic caches only a prefix that ends at a block marked ``cache_control: {"type": "ephemeral"}`` (with
# ``"ttl": "1h"`` for an hour; 5 minutes otherwise, refreshed by every read). The prefix runs tools, then
# system, then messages. At most 4 marked blocks per request; a prefix shorter than the model's minimum is
# not cached (the request still succeeds). A lookup checks each breakpoint and up to 20 blocks before it.
# Usage then reports ``cache_read_input_tokens`` (read), ``cache_creation_input_tokens`` (written) and
# ``input_tokens`` (the rest, after the last breakpoint); writes are billed at 1.25x the input price (2x for
# 1-hour entries), reads at 0.1x.

MAX_BREAKPOINTS: Final = 4
LOOKBACK_BLOCKS: Final = 20
TTL_SECONDS: Final[Mapping[str, float]] = {"5m": 300.0, "1h": 3600.0}
CACHE_READ: Final = 0.1
"""What a token read from the cache costs, relative to an input token."""
CACHE_WRITE: Final[Mapping[str, float]] = {"5m": 1.25, "1h": 2.0}
"""What a token written to the cache costs, relative to an input token, by TTL."""

_MIN_TOKENS: Final = (
    # (a piece of the model's name, the minimum cacheable prompt); the first that matches wins
    ("opus-4-6", 4_096),
    ("opus-4-5", 4_096),
    ("haiku-4-5", 4_096),
    ("sonnet-4-6", 2_048),
    ("haiku-3", 2_048),
    ("3-haiku", 2_048),
    ("3-5-haiku", 2_048),
)
DEFAULT_MIN_TOKENS: Final = 1_024


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix Anthropic caches for ``model`` (Opus 4.5/4.6 and Haiku 4.5: 4,096; Sonnet 4.6,
    Haiku 3 and 3.5: 2,048; other Claude models: 1,024)."""
    name = model.lower().replace(".", "-")
    for piece, tokens in _MIN_TOKENS:
        if piece in name:
            return tokens
    return DEFAULT_MIN_TOKENS


def too_many_breakpoints(found: int) -> ErrorResponse:
    """The 400 for a request with more than :data:`MAX_BREAKPOINTS` ``cache_control`` blocks."""
    return bad_request(
        f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
    )


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "anthropic": overflow,
    "request_too_large": request_too_large,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
