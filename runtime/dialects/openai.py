"""OpenAI's dialect (and Azure OpenAI's, which relays OpenAI's bodies): its overflow wordings and codes, the
errors it answers with (as the local provider imitates them), and its ``x-ratelimit-*`` headers.

Overflow: "This model's maximum context length is 128000 tokens. However, your messages resulted in …"
(old), "Your input exceeds the context window of this model. Please adjust your input and try again." (new),
code ``context_length_exceeded``. Rate limits: per key and model, ``x-ratelimit-limit-requests``/``-tokens``
(per minute), ``x-ratelimit-remaining-requests``/``-tokens`` and ``x-ratelimit-reset-requests``/``-tokens``
(a duration: ``1s``, ``6m0s``, ``20ms``); a 429 with ``retry-after`` (and ``retry-after-ms``).
"""

from __future__ import annotations

import math
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
    ErrorResponse,
    OverflowFormat,
    number,
    parse_duration,
)

OPENAI: Final = Dialect(
    name="openai",
    overflow_phrases=(
        "exceeds the context window",
        "input exceeds the context window",
        "reduce the length of the messages",
    ),
    overflow_codes=frozenset({"context_length_exceeded"}),  # OpenAI, Azure, Groq, many compatible servers
    output_budget_regexes=(
        # OpenAI's old wording (vLLM ≤ 0.9 and DeepSeek say the same)
        re.compile(
            rf"maximum context length is {WIN} tokens\. however, you requested {NUM} tokens "
            rf"\({NUM} in the messages, {OUT} in the completion\)"
        ),
    ),
    window_regexes=(
        # OpenAI (old), vLLM, DeepSeek, OpenRouter ("this endpoint's …"), NIM: "maximum context length is N
        # tokens"; SGLang "maximum context length of N tokens"; Ollama (MLX) "maximum context length (N tokens)"
        re.compile(rf"maximum context length (?:is|of|\() ?{WIN} tokens"),
    ),
    prompt_regexes=(
        re.compile(rf"you requested {NUM} tokens \({PROMPT} in the messages"),  # (vLLM ≤ 0.9, DeepSeek too)
        re.compile(rf"your messages resulted in {PROMPT} tokens"),
    ),
    negative_phrases=(
        "tokens per min",
        "requests per min",
        "(tpm)",
        "(rpm)",
        "tokens per minute",
        "completion tokens, whereas you provided",
        "invalid 'max_tokens'",
        "invalid 'max_completion_tokens'",
        "invalid 'max_output_tokens'",
        "unsupported parameter",
        "unsupported value",
        "incorrect api key",
        "invalid api key",
        "safety system",
    ),
    negative_codes=frozenset(
        {
            "rate_limit_exceeded",
            "insufficient_quota",
            "invalid_api_key",
            "content_filter",
            "content_policy_violation",
            "unsupported_parameter",
            "unsupported_value",
        }
    ),
)

AZURE: Final = Dialect(
    name="azure",
    # Azure OpenAI relays OpenAI's bodies; its own gateway says "tokens_limit_reached" for Foundry models.
    overflow_phrases=("tokens_limit_reached", "the input tokens exceeded the maximum"),
    overflow_codes=frozenset({"tokens_limit_reached"}),  # Azure AI Foundry
    negative_phrases=(
        "content management policy",
        "content filtering policy",
        "responsibleaipolicyviolation",
    ),
)

# -- the errors it answers with (the local provider's imitations) -------------------------------------------


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """OpenAI Chat Completions (and Azure OpenAI, which relays the same body)."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{prompt} tokens. Please reduce the length of the messages."
    )
    return ErrorResponse(
        400, error_body(message, "invalid_request_error", "context_length_exceeded", "messages")
    )


def new_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """OpenAI's newer wording (Responses API and recent models): no numbers at all."""
    message = "Your input exceeds the context window of this model. Please adjust your input and try again."
    return ErrorResponse(
        400, error_body(message, "invalid_request_error", "context_length_exceeded", "input")
    )


def rate_limit_error(
    model: str,
    retry_after: float | None,
    *,
    limit: str = "requests",
    limit_value: int = 60,
    headers: dict[str, str] | None = None,
) -> ErrorResponse:
    """OpenAI's 429 for a per-minute limit (``limit``: ``requests``, ``tokens`` or ``concurrent``), with
    ``retry-after`` (and ``retry-after-ms``); ``headers``: the rate-limit headers to send (default: OpenAI's
    for an exhausted request limit)."""
    wait = f"{retry_after:g}s" if retry_after is not None else "a moment"
    what = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}.get(
        limit, "concurrent requests"
    )
    message = (
        f"Rate limit reached for {model} in organization org-agentcell-local on {what}: "
        f"Limit {limit_value}, Used {limit_value}, Requested 1. Please try again in {wait}. Visit "
        "https://platform.openai.com/account/rate-limits to learn more."
    )
    sent: dict[str, str] = (
        {"x-ratelimit-limit-requests": str(limit_value), "x-ratelimit-remaining-requests": "0"}
        if headers is None
        else dict(headers)
    )
    sent.update(retry_after_headers(retry_after))
    type_ = "requests" if limit != "tokens" else "tokens"
    return ErrorResponse(429, error_body(message, type_, "rate_limit_exceeded"), sent)


def retry_after_headers(retry_after: float | None) -> dict[str, str]:
    """``retry-after`` (seconds) and ``retry-after-ms``, or nothing."""
    if retry_after is None:
        return {}
    return {
        "retry-after": f"{retry_after:.3f}".rstrip("0").rstrip("."),
        "retry-after-ms": str(math.ceil(retry_after * 1000)),
    }


def server_error(status: int | None = None) -> ErrorResponse:
    """OpenAI's 500."""
    message = (
        "The server had an error while processing your request. Sorry about that! You can retry your "
        "request, or contact us through our help center if the error persists."
    )
    return ErrorResponse(status or 500, error_body(message, "server_error", None))


def auth_error() -> ErrorResponse:
    """OpenAI's 401 for a wrong key. No part of the key is echoed (keys never reach logs or events)."""
    message = "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
    return ErrorResponse(401, error_body(message, "invalid_request_error", "invalid_api_key"))


def bad_request(message: str, code: str | None = None, param: str | None = None) -> ErrorResponse:
    """A 400 in OpenAI's shape (malformed request, unknown script turn, ...)."""
    return ErrorResponse(400, error_body(message, "invalid_request_error", code, param))


# -- rate-limit headers ---------------------------------------------------------------------------------------

PREFIX: Final = "x-ratelimit-"


def read_rate_limit(headers: Mapping[str, str], name: str) -> Dimension | None:
    """The limit ``name`` (``requests`` or ``tokens``) of lower-cased ``headers``, or None."""
    limit = headers.get(f"{PREFIX}limit-{name}")
    remaining = headers.get(f"{PREFIX}remaining-{name}")
    reset_raw = headers.get(f"{PREFIX}reset-{name}")
    if limit is None and remaining is None and reset_raw is None:
        return None
    reset = parse_duration(reset_raw) if reset_raw is not None else None
    return Dimension(limit=number(limit), remaining=number(remaining), reset=reset)


def format_reset(seconds: float) -> str:
    """A reset duration the way OpenAI writes it: ``120ms``, ``1.5s``, ``1m30s``."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60.0:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.3g}s"


def rate_limit_headers(name: str, limit: float, remaining: float, reset: float) -> dict[str, str]:
    """The three headers of limit ``name`` (per minute; ``reset`` in seconds until it is full)."""
    return {
        f"{PREFIX}limit-{name}": str(int(limit)),
        f"{PREFIX}remaining-{name}": str(max(0, math.floor(remaining))),
        f"{PREFIX}reset-{name}": format_reset(reset),
    }


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "openai": overflow,
    "azure": overflow,
    "openai_new": new_overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
