"""What a provider's answer says about its limits: OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*``, ``retry-after`` and ``retry-after-ms``, read into one :class:`RateLimitInfo`.

OpenAI sends, per key and model, ``x-ratelimit-limit-requests``/``-tokens`` (per minute),
``x-ratelimit-remaining-requests``/``-tokens`` and ``x-ratelimit-reset-requests``/``-tokens`` (a duration:
``1s``, ``6m0s``, ``20ms``). Anthropic sends ``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}`` (per minute; the reset an RFC 3339 time). Either may be missing.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import re
from collections.abc import Mapping
from typing import Final

import msgspec

__all__ = ["Dimension", "RateLimitInfo", "parse_duration", "parse_rate_limit_headers"]


class Dimension(msgspec.Struct, frozen=True, kw_only=True):
    """One limit as the provider reports it: per minute, what is left now, seconds until it is full."""

    limit: float | None = None
    remaining: float | None = None
    reset: float | None = None


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


_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """OpenAI's reset durations (``1s``, ``6m0s``, ``1m30.5s``, ``20ms``, ``1h2m``) or plain seconds."""
    text = text.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(text))
    total, end = 0.0, 0
    for match in _DURATION.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNIT[match.group(2)]
        end = match.end()
    return total if end == len(text) and end else None


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        number = float(value.strip())
        if number >= 0 and number == number and number != float("inf"):
            return number
    return None


def _instant(value: str | None, now: float) -> float | None:
    """Seconds from ``now`` (wall clock) until an RFC 3339 time (Anthropic's resets) or an HTTP date."""
    if value is None:
        return None
    text = value.strip()
    when: float | None = None
    with contextlib.suppress(ValueError):
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    if when is None:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            when = email.utils.parsedate_to_datetime(text).timestamp()
    if when is None:
        return parse_duration(text)
    return max(0.0, when - now)


def _dimension(
    headers: Mapping[str, str], prefix: str, name: str, now: float, *, anthropic: bool
) -> Dimension | None:
    if anthropic:
        limit = headers.get(f"{prefix}{name}-limit")
        remaining = headers.get(f"{prefix}{name}-remaining")
        reset_raw = headers.get(f"{prefix}{name}-reset")
        reset = _instant(reset_raw, now)
    else:
        limit = headers.get(f"{prefix}limit-{name}")
        remaining = headers.get(f"{prefix}remaining-{name}")
        reset_raw = headers.get(f"{prefix}reset-{name}")
        reset = parse_duration(reset_raw) if reset_raw is not None else None
    if limit is None and remaining is None and reset_raw is None:
        return None
    return Dimension(limit=_number(limit), remaining=_number(remaining), reset=reset)


def parse_rate_limit_headers(headers: Mapping[str, str] | None, *, now: float) -> RateLimitInfo | None:
    """The limits ``headers`` report (any case of names), or None when they report none. ``now`` is the
    wall clock (``time.time()``), for resets given as a time."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    retry_after: float | None = None
    if (ms := _number(lowered.get("retry-after-ms"))) is not None:
        retry_after = ms / 1000.0
    elif (raw := lowered.get("retry-after")) is not None:
        retry_after = _instant(raw, now)
    info = RateLimitInfo(
        requests=_dimension(lowered, "x-ratelimit-", "requests", now, anthropic=False)
        or _dimension(lowered, "anthropic-ratelimit-", "requests", now, anthropic=True),
        tokens=_dimension(lowered, "x-ratelimit-", "tokens", now, anthropic=False)
        or _dimension(lowered, "anthropic-ratelimit-", "tokens", now, anthropic=True),
        input_tokens=_dimension(lowered, "anthropic-ratelimit-", "input-tokens", now, anthropic=True),
        output_tokens=_dimension(lowered, "anthropic-ratelimit-", "output-tokens", now, anthropic=True),
        retry_after=retry_after,
    )
    return None if info.empty else info
