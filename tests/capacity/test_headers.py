"""Reading the rate-limit headers providers send (runtime.capacity._headers)."""

from __future__ import annotations

import datetime

import pytest

from runtime.capacity import Dimension, parse_duration, parse_rate_limit_headers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("1m30.5s", 90.5), ("20ms", 0.02), ("1h2m", 3720.0), ("0.25", 0.25)],
)
def test_openai_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "s1", "-"])
def test_a_duration_that_is_not_one_is_none(text: str) -> None:
    assert parse_duration(text) is None


def test_openai_headers_any_case() -> None:
    info = parse_rate_limit_headers(
        {
            "X-RateLimit-Limit-Requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "200000",
            "x-ratelimit-remaining-tokens": "199000",
            "x-ratelimit-reset-tokens": "6m0s",
            "content-type": "application/json",
        },
        now=0.0,
    )
    assert info is not None
    assert info.requests == Dimension(limit=500, remaining=499, reset=pytest.approx(0.12))
    assert info.tokens == Dimension(limit=200_000, remaining=199_000, reset=360.0)
    assert info.input_tokens is None and info.retry_after is None


def test_anthropic_headers_with_rfc3339_resets() -> None:
    now = datetime.datetime(2026, 11, 27, 3, 0, 0, tzinfo=datetime.UTC).timestamp()
    info = parse_rate_limit_headers(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2026-11-27T03:00:02Z",
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "retry-after": "2",
        },
        now=now,
    )
    assert info is not None
    assert info.requests == Dimension(limit=50, remaining=0, reset=2.0)
    assert info.input_tokens == Dimension(limit=40_000, remaining=39_000, reset=None)
    assert info.output_tokens is not None and info.output_tokens.limit == 8_000
    assert info.retry_after == 2.0


def test_retry_after_ms_wins_and_no_limits_is_none() -> None:
    info = parse_rate_limit_headers({"retry-after": "3", "retry-after-ms": "250"}, now=0.0)
    assert info is not None and info.retry_after == 0.25 and info.requests is None
    assert parse_rate_limit_headers({"content-type": "text/plain"}, now=0.0) is None
    assert parse_rate_limit_headers(None, now=0.0) is None


def test_garbage_values_are_ignored_not_raised() -> None:
    info = parse_rate_limit_headers(
        {"x-ratelimit-limit-requests": "lots", "x-ratelimit-remaining-requests": "-4", "retry-after": "nan"},
        now=0.0,
    )
    assert info is not None and info.requests == Dimension(limit=None, remaining=None, reset=None)
