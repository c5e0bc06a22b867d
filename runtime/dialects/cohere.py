"""Cohere's dialect."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import WIN, Dialect, ErrorResponse, OverflowFormat, request_id

COHERE: Final = Dialect(
    name="cohere",
    # "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 5000."
    # v2: "too many tokens: size limit exceeded by 1234 tokens."
    overflow_phrases=("total number of tokens in the prompt cannot exceed", "size limit exceeded by"),
    window_regexes=(re.compile(rf"tokens in the prompt cannot exceed {WIN}"),),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Cohere."""
    message = (
        f"too many tokens: total number of tokens in the prompt cannot exceed {window} - received {prompt}. "
        "Try using a shorter prompt, or enabling prompt truncating. See "
        "https://docs.cohere.com/reference/chat for more details."
    )
    return ErrorResponse(400, {"id": request_id(""), "message": message})


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "cohere": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
