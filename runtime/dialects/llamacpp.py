"""llama.cpp's ``llama-server`` dialect. Its error body states the slot's context as ``n_ctx``
(``--ctx-size`` divided by ``--parallel``), which the overflow classifier reads first."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import PROMPT, WIN, Dialect, ErrorResponse, OverflowFormat

LLAMACPP: Final = Dialect(
    name="llama.cpp",
    # tools/server: "input is larger than the max context size. skipping" (2024), then "input (N tokens) is
    # larger than the max context size (M tokens). skipping", "the request exceeds the available context
    # size, try increasing it" (2025), "request (N tokens) exceeds the available context size (M tokens), try
    # increasing it"; mid-generation "Context size has been exceeded." Type exceed_context_size_error.
    overflow_phrases=(
        "exceed_context_size_error",
        "available context size",
        "context size has been exceeded",
        "larger than the max context size",
    ),
    overflow_codes=frozenset({"exceed_context_size_error"}),
    window_regexes=(
        # "request (1431 tokens) exceeds the available context size (1024 tokens)"; older "input (N tokens) is
        # larger than the max context size (M tokens)"
        re.compile(rf"(?:available|max) context size \({WIN} tokens?\)"),
    ),
    # the same messages' prompt (its JSON body's n_prompt_tokens too)
    prompt_regexes=(re.compile(rf"(?:request|input) \({PROMPT} tokens?\) (?:exceeds|is larger)"),),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """llama.cpp ``llama-server`` (its wording since 2025; ``n_ctx`` is the slot's context)."""
    body = {
        "error": {
            "code": 400,
            "message": f"request ({prompt} tokens) exceeds the available context size ({window} tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": window,
        }
    }
    return ErrorResponse(400, body)


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "llamacpp": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
