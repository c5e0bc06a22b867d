"""LM Studio's local server dialect."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import WIN, Dialect, ErrorResponse, OverflowFormat

LMSTUDIO: Final = Dialect(
    name="lm studio",
    # "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded with
    # context length of only 4096 tokens, which is not enough."
    overflow_phrases=("when context the overflows", "context length of only", "context overflow"),
    window_regexes=(re.compile(rf"context length of only {WIN} tokens"),),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """LM Studio's local server."""
    message = (
        f"Trying to keep the first {prompt} tokens when context the overflows. However, the model is loaded "
        f"with context length of only {window} tokens, which is not enough. Try to load the model with a "
        "larger context length, or provide a shorter input"
    )
    return ErrorResponse(400, {"error": message})


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "lmstudio": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
