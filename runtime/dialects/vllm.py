"""vLLM's dialect (its OpenAI-compatible server), and NVIDIA NIM's, which shares it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import OUT, PROMPT, WIN, Dialect, ErrorResponse, OverflowFormat

VLLM: Final = Dialect(
    name="vllm",
    # ≤ 0.9: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in
    # the messages, 1000 in the completion). …"; the engine: "The decoder prompt (length 5000) is longer than
    # the maximum model length of 4096. Make sure that `max_model_len` is …"; ≥ 0.10: "… However, your request
    # has 40000 input tokens. Please reduce the length of the input messages." and, for prompt + max_tokens,
    # "'max_tokens' or 'max_completion_tokens' is too large: X. This model's maximum context length is N
    # tokens and your request has M input tokens (X > N - M)." (rule 3).
    # The V1 engine's processor: "The prompt (total length 5000) is too long to fit into the model (context
    # length 4096). Make sure that `max_model_len` is no smaller than the number of text tokens plus …"
    overflow_phrases=(
        "reduce the length of the input",
        "input tokens. please reduce",
        "longer than the maximum model length",
        "too long to fit into the model",
    ),
    output_budget_regexes=(
        # vLLM ≥ 0.10 and NVIDIA NIM
        re.compile(
            rf"is too large: {OUT}\. this model's maximum context length is {WIN} tokens and your request has"
        ),
        # vLLM, newest wording
        re.compile(rf"maximum context length is {WIN} tokens\. however, you requested {OUT} output tokens"),
    ),
    window_regexes=(
        # V1: "The prompt (total length N) is too long to fit into the model (context length M)"
        re.compile(rf"too long to fit into the model \(context length {WIN}\)"),
        # ≤ 0.9 engine: "is longer than the maximum model length of N"
        re.compile(rf"longer than the maximum model length of {WIN}"),
    ),
    prompt_regexes=(
        re.compile(rf"your request has {PROMPT} input tokens"),  # ≥ 0.10, both wordings
        re.compile(rf"the prompt \(total length {PROMPT}\)"),  # V1
        re.compile(rf"the decoder prompt \(length {PROMPT}\)"),  # ≤ 0.9 engine
    ),
    negative_phrases=("'max_tokens' or 'max_completion_tokens' is too large",),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """vLLM's OpenAI-compatible server up to 0.9 (counts the requested completion tokens too)."""
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return ErrorResponse(400, body)


def new_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """vLLM from 0.10: the prompt alone, counted as "input tokens", in an ``error`` object."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your request has {prompt} input "
        "tokens. Please reduce the length of the input messages."
    )
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return ErrorResponse(400, body)


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "vllm": overflow,
    "vllm_new": new_overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
