"""Groq's dialect: OpenAI's code, a wording of its own."""

from __future__ import annotations

from typing import Final

from runtime.dialects import openai
from runtime.dialects._base import Dialect, ErrorResponse

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
