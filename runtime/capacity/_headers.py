"""What a provider's answer says about its limits: OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*``, ``retry-after`` and ``retry-after-ms``, read into one :class:`RateLimitInfo`.

OpenAI sends, per key and model, ``x-ratelimit-limit-requests``/``-tokens`` (per minute),
``x-ratelimit-remaining-requests``/``-tokens`` and ``x-ratelimit-reset-requests``/``-tokens`` (a duration:
``1s``, ``6m0s``, ``20ms``). Anthropic sends ``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}`` (per minute; the reset an RFC 3339 time). Either may be missing.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from runtime.dialects import anthropic, openai
from runtime.dialects._base import Dimension, number, parse_duration, parse_instant

__all__ = ["Dimension", "RateLimitInfo", "parse_duration", "parse_rate_limit_headers"]


class RateLimitInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The limits an answer reported; ``retry_after`` in seconds (``retry-after-ms`` preferred)."""

    requests: Dimension | None = None
    tokens: Dimension | None = None
    """Input and output tokens together (OpenAI's ``tokens``; Anthropic's older combined limit)."""
    input_tokens: Dimension | None = None
    output_tokens: Dimension | None = None
    retry_after: float | None = None

    @property
    def empty(self) -> bool:
        return not (self.requests or self.tokens or self.input_tokens or self.output_tokens) and (
            self.retry_after is None
        )


def parse_rate_limit_headers(headers: Mapping[str, str] | None, *, now: float) -> RateLimitInfo | None:
    """The limits ``headers`` report (any case of names), or None when they report none. ``now`` is the
    wall clock (``time.time()``), for resets given as a time. Each dialect reads its own headers
    (:mod:`runtime.dialects.openai`, :mod:`runtime.dialects.anthropic`)."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    retry_after: float | None = None
    if (ms := number(lowered.get("retry-after-ms"))) is not None:
        retry_after = ms / 1000.0
    elif (raw := lowered.get("retry-after")) is not None:
        retry_after = parse_instant(raw, now)
    info = RateLimitInfo(
        requests=openai.read_rate_limit(lowered, "requests")
        or anthropic.read_rate_limit(lowered, "requests", now),
        tokens=openai.read_rate_limit(lowered, "tokens") or anthropic.read_rate_limit(lowered, "tokens", now),
        input_tokens=anthropic.read_rate_limit(lowered, "input-tokens", now),
        output_tokens=anthropic.read_rate_limit(lowered, "output-tokens", now),
        retry_after=retry_after,
    )
    return None if info.empty else info
