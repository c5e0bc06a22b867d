"""Hugging Face Text Generation Inference's dialect (the router's input validation, a 422)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import NUM, OUT, PROMPT, WIN, Dialect, ErrorResponse, OverflowFormat

TGI: Final = Dialect(
    name="tgi",
    # router/src/validation.rs: "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000"
    # (a 422), and "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: …" (litellm's)
    overflow_phrases=("`inputs` must have less than",),
    output_budget_regexes=(
        re.compile(
            rf"`inputs` tokens \+ `max_new_tokens` must be <= {WIN}\. given: {NUM} `inputs` tokens and {OUT} `max_new_tokens`"
        ),
    ),
    window_regexes=(
        re.compile(rf"`inputs` must have less than {WIN} tokens"),
        re.compile(rf"`max_new_tokens` must be <= {WIN}"),
    ),
    prompt_regexes=(
        re.compile(rf"given: {PROMPT} `inputs` tokens"),
        re.compile(rf"`inputs` must have less than {NUM} tokens\. given: {PROMPT}"),
    ),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Hugging Face Text Generation Inference: a 422 from the router's input validation."""
    message = f"Input validation error: `inputs` must have less than {window} tokens. Given: {prompt}"
    return ErrorResponse(422, {"error": message, "error_type": "validation"})


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "tgi": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
