"""Provider errors classified into the kinds the runtime acts on (design §3.7, 6.1).

Each transport says what its library's exceptions are by their types (``Transport.error_kind``: isinstance,
as httpx maps its transport errors; no class names compared), and the rules here do the rest, the same on
every transport, so one error means the same on each: overflow is
decided first by :func:`runtime.context.overflow.is_context_overflow` (an overflow that arrives as a 500, as
Ollama sends it, or as a 413 is never retried as a transient error), then authentication, rate limits (with
``retry-after``), timeouts, content policy, transient failures (5xx, "overloaded", connection errors) and
invalid requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import re
import time
from collections.abc import Mapping
from typing import Final

from runtime.gateway._models import ErrorKind, ProviderError


def classify_error(
    exc: BaseException, *, provider: str | None = None, kind: ErrorKind | None = None
) -> ProviderError:
    """Classify a provider exception. ``kind`` is what its type says, as the transport that raised it maps
    its library's exception types (:meth:`Transport.error_kind`); the status code, the overflow wordings and
    the message decide the rest (a 401 is ``auth`` whatever its type)."""
    from runtime.context.overflow import is_context_overflow, stated_prompt_tokens, stated_window

    status = _status_code(exc)
    body = getattr(exc, "body", None)
    code = _error_code(exc, body)
    message = _error_message(exc)
    provider = provider or getattr(exc, "llm_provider", None) or None
    retry_after = retry_after_seconds(_response_headers(exc))
    cancelled = isinstance(exc, asyncio.CancelledError)
    window = (
        None if cancelled else stated_window(exc, message=message, status_code=status, code=code, body=body)
    )
    prompt = (
        None
        if cancelled
        else stated_prompt_tokens(exc, message=message, status_code=status, code=code, body=body)
    )

    def error(kind: ErrorKind, retry: float | None = None) -> ProviderError:
        return ProviderError(
            kind=kind,
            message=clean_error_message(message),
            status_code=status,
            code=code,
            retry_after=retry,
            provider=provider,
            window=window,
            prompt_tokens=prompt if kind == "overflow" else None,
        )

    if isinstance(exc, asyncio.CancelledError):
        return error("cancelled")
    if is_context_overflow(exc, message=message, status_code=status, code=code, body=body):
        return error("overflow")
    lowered = message.lower()
    if status in (401, 403) or kind == "auth":
        return error("auth")
    if status == 429 or kind == "rate_limit":
        return error("rate_limit", retry_after)
    if (
        isinstance(exc, TimeoutError)
        or kind == "timeout"
        or "timed out" in lowered
        or "timeout on reading" in lowered
    ):
        return error("timeout", retry_after)
    if kind == "content_policy" or "content_policy" in lowered:
        return error("content_policy")
    if (
        (status is not None and (status >= 500 or status in (408, 409)))
        or "overloaded" in lowered
        or isinstance(exc, ConnectionError | OSError)
        or kind == "transient"
    ):
        return error("transient", retry_after)
    if status is not None and 400 <= status < 500:
        return error("invalid_request")
    if kind == "invalid_request":
        return error("invalid_request")
    return error("unknown")


def _status_code(exc: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def _error_code(exc: BaseException, body: object) -> str | None:
    if isinstance(body, Mapping):
        inner = body.get("error")
        for source in (inner if isinstance(inner, Mapping) else None, body):
            if source is not None and source.get("code") is not None:
                return str(source["code"])
    code = getattr(exc, "code", None)
    return str(code) if code is not None else None


_WRAPPER_PREFIX: Final = re.compile(r"^(?:(?:litellm\.\w+|\w+(?:Error|Exception))\s*[:-]\s*)+")


def _error_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    return text or type(exc).__name__


def clean_error_message(message: str) -> str:
    """The provider's own words: litellm's ``litellm.XError: XError: OpenAIException - `` prefixes removed."""
    return _WRAPPER_PREFIX.sub("", message, count=1).strip() or message


def _response_headers(exc: BaseException) -> Mapping[str, str] | None:
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(exc, "headers", None)
    if headers is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "get") else None


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait according to ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        with contextlib.suppress(ValueError):
            return max(0.0, float(raw_ms) / 1000.0)
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = email.utils.parsedate_to_datetime(raw).timestamp()
        return max(0.0, when - (time.time() if now is None else now))
    return None
