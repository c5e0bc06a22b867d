"""What every provider dialect module is made of (see :mod:`runtime.dialects`): a :class:`Dialect` record of
its wordings and codes, the error an HTTP provider answers with (:class:`ErrorResponse`), one rate limit as a
provider reports it (:class:`Dimension`), and the small readers the dialects share. Pure: no I/O."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

import msgspec

__all__ = [
    "NUM",
    "OUT",
    "PROMPT",
    "WIN",
    "Dialect",
    "Dimension",
    "ErrorKind",
    "ErrorResponse",
    "OverflowFormat",
    "number",
    "parse_duration",
    "parse_instant",
    "request_id",
]

ErrorKind = Literal[
    "overflow",
    "rate_limit",
    "rate_limited",
    "transient",
    "auth",
    "invalid_request",
    "timeout",
    "cancelled",
    "content_policy",
    "unknown",
]
"""The kinds of provider failure the runtime acts on (design §3.7)."""


class ErrorResponse(NamedTuple):
    """An HTTP error to send: status, JSON body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = {}  # noqa: RUF012 - NamedTuple defaults are shared and never mutated


OverflowFormat = Callable[[int, int, int], ErrorResponse]
"""A vendor's overflow error, from the prompt's tokens, the window and the completion tokens asked for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Dialect:
    """What one provider (or family of servers) says when a request does not fit, and how it names its
    errors. The overflow classifier (:mod:`runtime.context.overflow`) reads the union of every dialect's;
    all strings are lower case, matched as substrings of the lower-cased error text."""

    name: str
    overflow_phrases: tuple[str, ...] = ()
    """Phrases of its overflow messages (rule 6 of the classifier)."""
    overflow_codes: frozenset[str] = frozenset()
    """Error codes or types that mean overflow whatever the message says (rule 2)."""
    overflow_regexes: tuple[re.Pattern[str], ...] = ()
    """Overflow messages whose shape, not a fixed phrase, gives them away (rule 6)."""
    output_budget_regexes: tuple[re.Pattern[str], ...] = ()
    """Messages stating the window and the output the request asked for (rule 3); groups ``output`` and
    ``window``."""
    window_regexes: tuple[re.Pattern[str], ...] = ()
    """Overflow messages that state the window (group ``window``)."""
    prompt_regexes: tuple[re.Pattern[str], ...] = ()
    """Overflow messages that state the server's count of the refused request's prompt (group ``prompt``)."""
    negative_phrases: tuple[str, ...] = ()
    """Phrases of its errors that are never an overflow (rate limits, parameter errors, auth, policy)."""
    negative_regexes: tuple[re.Pattern[str], ...] = ()
    negative_codes: frozenset[str] = frozenset()
    error_types: Mapping[str, ErrorKind] = field(default_factory=dict)
    """Its error bodies' ``type`` (or code) by the kind of failure it is, for a transport that reads them."""


class Dimension(msgspec.Struct, frozen=True, kw_only=True):
    """One limit as the provider reports it: per minute, what is left now, seconds until it is full."""

    limit: float | None = None
    remaining: float | None = None
    reset: float | None = None


# Pieces of the regexes that read numbers out of messages.
NUM: Final = r"\d[\d,]*"
OUT: Final = rf"(?P<output>{NUM})"
WIN: Final = rf"(?P<window>{NUM})"
PROMPT: Final = rf"(?P<prompt>{NUM})"

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


def number(value: str | None) -> float | None:
    """A header's non-negative finite number, or None."""
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        result = float(value.strip())
        if result >= 0 and result == result and result != float("inf"):
            return result
    return None


def parse_instant(value: str | None, now: float) -> float | None:
    """Seconds from ``now`` (wall clock) until an RFC 3339 time (Anthropic's resets) or an HTTP date (or a
    duration, read as :func:`parse_duration` does)."""
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


def request_id(prefix: str = "req_") -> str:
    """A request id as vendors put in their error bodies."""
    return prefix + os.urandom(12).hex()
