"""Is this provider error a context overflow? (design §6.1, 6.2) — a pure classifier.

Providers say "your prompt is larger than my context window" in many dialects. :func:`is_context_overflow`
reads an exception (litellm's, openai's, or anything with a message), or the loose facts of an error
(message, HTTP status, error code, JSON body), and answers whether compacting the context could help.

How a verdict is reached, first rule that applies wins:

1. litellm's ``ContextWindowExceededError`` (anywhere in the exception's class hierarchy or cause chain)
   → overflow. litellm raises it after running its own checks, so those are trusted as they are.
2. An explicit overflow error code (``context_length_exceeded``, ``request_too_large``, …) → overflow.
3. A request whose *sum* was too large — the prompt plus the output it asked for, stated with both numbers
   (vLLM, SGLang, TGI, DeepSeek, OpenRouter) — is an overflow when a smaller prompt could make room, and not
   one when the requested output alone fills the window (a ``max_tokens`` parameter error that no
   compaction can fix). vLLM's "'max_tokens' … is too large: X. This model's maximum context length is N
   tokens and your request has M input tokens" is one of these, not the parameter error it starts like.
4. A *negative*: rate limits ("tokens per minute" requests are too large for a quota, not for the window),
   ``max_tokens`` parameter validation ("max_tokens is too large: …"), authentication, content policy,
   throttling, overload, or an HTTP 401/402/403/429 status → not an overflow, even when the message also
   contains a phrase from the positive list (Opal's broad ``"max_tokens"`` and ``"request too large"``
   would otherwise fire on exactly these).
5. HTTP 413 (payload too large) → overflow.
6. Any phrase of :data:`OVERFLOW_PATTERNS` (or :data:`OVERFLOW_REGEXES`) in the text → overflow.

The text searched is the union of everything the error says: its message, its ``str()``, its body (nested
JSON included: OpenRouter relays the upstream provider's error as a JSON *string* inside its own JSON), and
the same for its ``__cause__`` chain, all case-insensitively. The classifier never raises: malformed,
recursive or enormous inputs are read defensively and bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, Final, TypeVar

from runtime.dialects import DIALECTS, generic

__all__ = [
    "LITELLM_PATTERNS",
    "NEGATIVE_CODES",
    "NEGATIVE_PHRASES",
    "NEGATIVE_REGEXES",
    "NEGATIVE_STATUSES",
    "OPAL_PATTERNS",
    "OUTPUT_BUDGET_REGEXES",
    "OVERFLOW_CODES",
    "OVERFLOW_PATTERNS",
    "OVERFLOW_REGEXES",
    "is_context_overflow",
    "is_usage_overflow",
    "overflow_reason",
    "stated_prompt_tokens",
    "stated_window",
]


_T = TypeVar("_T")


def _union(name: str) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(item for dialect in DIALECTS for item in getattr(dialect, name)))


# Every table below is the union of the provider dialects' (one module per provider: runtime/dialects/).

OVERFLOW_PATTERNS: Final[Mapping[str, tuple[str, ...]]] = {d.name: d.overflow_phrases for d in DIALECTS}
"""Overflow phrases by provider (lower case; matched as substrings of the lower-cased error text)."""

OPAL_PATTERNS: Final[tuple[str, ...]] = generic.OPAL.overflow_phrases
"""Opal's 17 substrings, kept verbatim so the union with them holds (design §6.1)."""

LITELLM_PATTERNS: Final[tuple[str, ...]] = generic.LITELLM.overflow_phrases
"""litellm's own substring checks (``ExceptionCheckers.is_error_str_context_window_exceeded`` and the
per-provider mappers), lower-cased."""

OVERFLOW_REGEXES: Final[tuple[re.Pattern[str], ...]] = _union("overflow_regexes")
"""Overflow messages whose shape, not a fixed phrase, gives them away."""

OVERFLOW_CODES: Final[frozenset[str]] = frozenset(_union("overflow_codes"))
"""Error codes / types that mean overflow whatever the message says."""

NEGATIVE_PHRASES: Final[tuple[str, ...]] = _union("negative_phrases")
"""Phrases that veto the broad positive phrases (lower case)."""

NEGATIVE_REGEXES: Final[tuple[re.Pattern[str], ...]] = _union("negative_regexes")

NEGATIVE_CODES: Final[frozenset[str]] = frozenset(_union("negative_codes"))

NEGATIVE_STATUSES: Final[frozenset[int]] = frozenset({401, 402, 403, 429})
"""Authentication, payment, permission and rate-limit statuses are never an overflow."""

OUTPUT_BUDGET_REGEXES: Final[tuple[re.Pattern[str], ...]] = _union("output_budget_regexes")
"""Messages that state both the window and the output the request asked for (rule 3)."""

WINDOW_REGEXES: Final[tuple[re.Pattern[str], ...]] = _union("window_regexes")
"""Overflow messages that state the window (the first match wins; see :func:`stated_window`)."""

PROMPT_REGEXES: Final[tuple[re.Pattern[str], ...]] = _union("prompt_regexes")
"""Overflow messages that state the server's count of the prompt (see :func:`stated_prompt_tokens`)."""

# A stated window outside these bounds is a misreading, not a model.
_MIN_WINDOW = 16
_MAX_WINDOW = 100_000_000

# Bounds that keep the classifier fast and safe on hostile input (a 100 MB body, a recursive dict).
_MAX_TEXT = 64 * 1024
_MAX_DEPTH = 8
_MAX_ITEMS = 512

_ALL_PATTERNS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(p for ps in OVERFLOW_PATTERNS.values() for p in ps)
)


def is_context_overflow(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> bool:
    """Whether an error says the request did not fit the model's context window.

    ``error`` is read for its message, status, code and body (litellm and openai exceptions, and anything
    shaped like them, including the ``__cause__`` chain); the keyword arguments add facts the caller has
    separately. Never raises.
    """
    return overflow_reason(error, message=message, status_code=status_code, code=code, body=body) is not None


def overflow_reason(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> str | None:
    """Why the error is an overflow (the rule or phrase that matched), or None when it is not one."""
    try:
        facts = _Facts.of(error, message, status_code, code, body)
        return facts.verdict()
    except Exception:  # a classifier must never turn one error into two
        return None


def is_usage_overflow(input_tokens: int, context_window: int) -> bool:
    """Silent overflow (design §6.2): a successful response that reports more input tokens than the window.

    Some providers (Ollama, some proxies) truncate instead of failing; the reported usage gives it away.
    An unknown window (0 or less) never overflows.
    """
    return context_window > 0 and input_tokens > context_window


def stated_window(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> int | None:
    """The context window an overflow error states, or None when it states none (or is no overflow).

    llama.cpp's JSON ``n_ctx`` first (the *slot's* context: ``--ctx-size`` divided by ``--parallel``), then
    the number in the first of :data:`WINDOW_REGEXES` that matches, then the window of a request whose
    prompt plus output did not fit (rule 3, even when the output alone was too large: a cap computed from a
    wrong window is exactly that). Never raises.
    """
    try:
        facts = _Facts.of(error, message, status_code, code, body)
        text = "\n".join(facts.texts)
        budget = _output_budget(text)
        if facts.verdict() is None and budget is None:
            return None
        candidates: list[int] = list(facts.n_ctx)
        for regex in WINDOW_REGEXES:
            match = regex.search(text)
            if match is not None:
                candidates.append(int(match["window"].replace(",", "")))
                break
        if budget is not None:
            candidates.append(budget[1])
        for window in candidates:
            if _MIN_WINDOW <= window <= _MAX_WINDOW:
                return window
        return None
    except Exception:  # like the classifier: never turn one error into two
        return None


def stated_prompt_tokens(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> int | None:
    """The server's count of the refused request's prompt, as an overflow error states it, or None (no
    count stated, or no overflow). What it teaches: the server's tokens per token counted here (design
    §4.5), which a refused summarizer request learns from before it is sent again, smaller (§5.4).

    llama.cpp's JSON ``n_prompt_tokens`` first, then the number in the first of the dialects'
    ``prompt_regexes`` that matches ("request (N tokens) exceeds …", "N in the messages", "your request has N
    input tokens", "prompt is too long: N tokens > …", ...). Never raises.
    """
    try:
        facts = _Facts.of(error, message, status_code, code, body)
        text = "\n".join(facts.texts)
        if facts.verdict() is None and _output_budget(text) is None:
            return None
        candidates: list[int] = list(facts.n_prompt)
        for regex in PROMPT_REGEXES:
            match = regex.search(text)
            if match is not None:
                candidates.append(int(match["prompt"].replace(",", "")))
                break
        return next((n for n in candidates if 0 < n <= _MAX_WINDOW * 2), None)
    except Exception:  # like the classifier: never turn one error into two
        return None


# ---------------------------------------------------------------------------------------------------


class _Facts:
    """What an error says, gathered from every place it may say it."""

    @classmethod
    def of(
        cls,
        error: BaseException | None,
        message: str | None,
        status: int | None,
        code: str | None,
        body: object,
    ) -> _Facts:
        """What ``error`` and the loose facts beside it say (the public functions' arguments)."""
        facts = cls()
        facts.add_text(message)
        facts.add_status(status)
        facts.add_code(code)
        facts.add_body(body, 0)
        if error is not None:
            facts.add_exception(error)
        return facts

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.codes: set[str] = set()
        self.statuses: set[int] = set()
        self.context_window_error = False
        self.n_ctx: list[int] = []  # llama.cpp's error body states the slot's context as n_ctx
        self.n_prompt: list[int] = []  # ... and the prompt's tokens as n_prompt_tokens
        self._size = 0
        self._seen: set[int] = set()

    # -- gathering ------------------------------------------------------------------------------------
    def add_text(self, text: object) -> None:
        if not isinstance(text, str) or not text or self._size >= _MAX_TEXT:
            return
        text = text[: _MAX_TEXT - self._size]
        self._size += len(text)
        self.texts.append(text.lower())

    def add_status(self, status: object) -> None:
        if isinstance(status, bool):
            return
        if isinstance(status, str) and status.strip().isdigit():
            status = int(status.strip())
        if isinstance(status, int) and 100 <= status <= 599:
            self.statuses.add(status)

    def add_code(self, code: object) -> None:
        if isinstance(code, str) and code and len(code) <= 200:
            self.codes.add(code.strip().lower())
        else:
            self.add_status(code)  # numeric codes (Gemini, OpenRouter) are HTTP statuses

    def add_body(self, body: object, depth: int) -> None:
        if body is None or depth > _MAX_DEPTH or id(body) in self._seen:
            return
        self._seen.add(id(body))
        if isinstance(body, (bytes, bytearray, memoryview)):
            body = bytes(body[:_MAX_TEXT]).decode("utf-8", "replace")
        if isinstance(body, str):
            self.add_text(body)
            nested = _maybe_json(body)
            if nested is not None:
                self.add_body(nested, depth + 1)
        elif isinstance(body, Mapping):
            for key, value in _bounded(body.items()):
                name = key.lower() if isinstance(key, str) else ""
                if name in ("code", "type", "status", "error_code", "errortype", "__type"):
                    self.add_code(value)
                elif name in ("status_code", "statuscode", "http_status"):
                    self.add_status(value)
                elif name == "n_ctx" and isinstance(value, int) and not isinstance(value, bool):
                    self.n_ctx.append(value)
                elif name == "n_prompt_tokens" and isinstance(value, int) and not isinstance(value, bool):
                    self.n_prompt.append(value)
                self.add_body(value, depth + 1)
        elif isinstance(body, (list, tuple)):
            for item in _bounded(body):
                self.add_body(item, depth + 1)

    def add_exception(self, error: BaseException) -> None:
        current: BaseException | None = error
        for _ in range(_MAX_DEPTH):
            if current is None or id(current) in self._seen:
                return
            self._seen.add(id(current))
            if any(cls.__name__ == "ContextWindowExceededError" for cls in type(current).__mro__):
                self.context_window_error = True
            for attr in ("message", "body", "error", "response_text", "detail"):
                value = _attr(current, attr)
                if isinstance(value, str):
                    self.add_text(value)
                    nested = _maybe_json(value)
                    if nested is not None:
                        self.add_body(nested, 1)
                else:
                    self.add_body(value, 1)
            for attr in ("code", "type", "error_code"):
                self.add_code(_attr(current, attr))
            self.add_status(_attr(current, "status_code"))
            self.add_status(_attr(current, "status"))
            response = _attr(current, "response")
            if response is not None:
                self.add_status(_attr(response, "status_code"))
            self.add_text(_safe_str(current))
            current = current.__cause__ or current.__context__

    # -- deciding -------------------------------------------------------------------------------------
    def verdict(self) -> str | None:
        if self.context_window_error:
            return "litellm ContextWindowExceededError"
        explicit = self.codes & OVERFLOW_CODES
        if explicit:
            return f"error code {min(explicit)}"
        text = "\n".join(self.texts)
        budget = _output_budget(text)
        if budget is not None:
            output, window = budget
            if output >= window or self.statuses & NEGATIVE_STATUSES or self.codes & NEGATIVE_CODES:
                return None  # the output asked for fills the window by itself: max_tokens, not the prompt
            return f"the prompt leaves no room for the {output} output tokens asked for (window {window})"
        if self._negative(text):
            return None
        if 413 in self.statuses:
            return "HTTP 413"
        for phrase in _ALL_PATTERNS:
            if phrase in text:
                return f"message contains {phrase!r}"
        for regex in OVERFLOW_REGEXES:
            if regex.search(text):
                return f"message matches {regex.pattern!r}"
        return None

    def _negative(self, text: str) -> bool:
        if self.statuses & NEGATIVE_STATUSES or self.codes & NEGATIVE_CODES:
            return True
        if any(phrase in text for phrase in NEGATIVE_PHRASES):
            return True
        return any(regex.search(text) for regex in NEGATIVE_REGEXES)


def _output_budget(text: str) -> tuple[int, int] | None:
    """The output tokens a request asked for and the window, when its error states both (rule 3)."""
    for regex in OUTPUT_BUDGET_REGEXES:
        match = regex.search(text)
        if match is not None:
            return int(match["output"].replace(",", "")), int(match["window"].replace(",", ""))
    return None


def _bounded(items: Iterable[_T]) -> Iterator[_T]:
    return islice(items, _MAX_ITEMS)


def _maybe_json(text: str) -> object:
    stripped = text.strip()
    if len(stripped) < 2 or stripped[0] not in "{[" or len(stripped) > _MAX_TEXT:
        # litellm often embeds the body after a prefix: "OpenAIException - {...}"
        start = text.find("{")
        if start <= 0 or len(text) - start > _MAX_TEXT:
            return None
        stripped = text[start:].strip()
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def _attr(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Exception:  # properties that raise (httpx.Response.text on a closed stream, ...)
        return None


def _safe_str(obj: object) -> str | None:
    try:
        return str(obj)
    except Exception:
        return None
