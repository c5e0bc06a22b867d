"""Mistral La Plateforme's dialect."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import PROMPT, WIN, Dialect, ErrorResponse, OverflowFormat

MISTRAL: Final = Dialect(
    name="mistral",
    # "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length"
    overflow_phrases=("too large for model with",),
    window_regexes=(re.compile(rf"too large for model with {WIN} maximum context length"),),
    prompt_regexes=(re.compile(rf"prompt contains {PROMPT} tokens"),),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Mistral La Plateforme."""
    message = f"Prompt contains {prompt} tokens and {completion} draft tokens, too large for model with {window} maximum context length"
    body = {
        "object": "error",
        "message": message,
        "type": "invalid_request_message_error",
        "param": None,
        "code": "3051",
    }
    return ErrorResponse(400, body)


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "mistral": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
