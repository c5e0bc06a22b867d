"""SGLang's dialect (its OpenAI-compatible server)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import NUM, OUT, PROMPT, WIN, Dialect, ErrorResponse, OverflowFormat

SGLANG: Final = Dialect(
    name="sglang",
    # "The input (N tokens) is longer than the model's context length (M tokens)."; with max_new_tokens:
    # "Requested token count exceeds the model's maximum context length of M tokens. You requested a total of
    # T tokens: N tokens from the input messages and X tokens for the completion. …" (tokenizer_manager.py)
    overflow_phrases=("is longer than the model's context length", "requested token count exceeds"),
    output_budget_regexes=(
        re.compile(
            rf"maximum context length of {WIN} tokens\. you requested a total of {NUM} tokens: "
            rf"{NUM} tokens from the input messages and {OUT} tokens for the completion"
        ),
    ),
    window_regexes=(re.compile(rf"model's context length \({WIN} tokens?\)"),),
    prompt_regexes=(
        re.compile(rf"the input \({PROMPT} tokens?\) is longer"),
        re.compile(rf"{PROMPT} tokens from the input messages"),
    ),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """SGLang's OpenAI-compatible server."""
    message = f"The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return ErrorResponse(400, body)


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "sglang": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
