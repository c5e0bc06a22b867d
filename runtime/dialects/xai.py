"""xAI's (Grok's) dialect."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import WIN, Dialect, ErrorResponse, OverflowFormat

XAI: Final = Dialect(
    name="xai",
    # "This model's maximum prompt length is 131072 but the request contains 150000 tokens."
    overflow_phrases=("maximum prompt length",),
    window_regexes=(re.compile(rf"maximum prompt length is {WIN}"),),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """xAI (Grok): a plain-text ``error`` with its own code field."""
    message = f"This model's maximum prompt length is {window} but the request contains {prompt} tokens."
    return ErrorResponse(400, {"code": "Client specified an invalid argument", "error": message})


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "xai": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
