"""OpenRouter's dialect (it also relays the upstream provider's error as a JSON string in its own)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import NUM, OUT, PROMPT, WIN, Dialect, ErrorResponse, OverflowFormat

OPENROUTER: Final = Dialect(
    name="openrouter",
    # "This endpoint's maximum context length is 200000 tokens. However, you requested about …"
    overflow_phrases=("endpoint's maximum context length", "middle-out"),
    output_budget_regexes=(
        re.compile(
            rf"maximum context length is {WIN} tokens\. however, you requested about {NUM} tokens "
            rf"\({NUM} of text input, {OUT} in the output\)"
        ),
    ),
    prompt_regexes=(re.compile(rf"\({PROMPT} of text input,"),),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """OpenRouter."""
    message = (
        f"This endpoint's maximum context length is {window} tokens. However, you requested about "
        f"{prompt + completion} tokens ({prompt} of text input, {completion} in the output). Please reduce "
        'the length of either one, or use the "middle-out" transform to compress your prompt automatically.'
    )
    return ErrorResponse(
        400, {"error": {"message": message, "code": 400, "metadata": {"provider_name": None}}}
    )


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "openrouter": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
