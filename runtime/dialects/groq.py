"""Groq's dialect: OpenAI's code, a wording of its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from runtime.dialects import openai
from runtime.dialects._base import Dialect, ErrorResponse, OverflowFormat

GROQ: Final = Dialect(
    name="groq",
    # Groq sends OpenAI's code and "Please reduce the length of the messages or completion."
    overflow_phrases=("reduce the length of the messages or completion",),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Groq."""
    message = "Please reduce the length of the messages or completion."
    return ErrorResponse(
        400, openai.error_body(message, "invalid_request_error", "context_length_exceeded", "messages")
    )


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "groq": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
