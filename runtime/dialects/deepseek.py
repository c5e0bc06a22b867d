"""DeepSeek's dialect: OpenAI's old wording, with the messages and the completion counted apart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from runtime.dialects import openai
from runtime.dialects._base import Dialect, ErrorResponse, OverflowFormat

DEEPSEEK: Final = Dialect(
    name="deepseek",
    # DeepSeek uses OpenAI's wording ("This model's maximum context length is 65536 tokens. …").
    overflow_phrases=("this model's maximum context length",),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """DeepSeek."""
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )
    return ErrorResponse(400, openai.error_body(message, "invalid_request_error", "invalid_request_error"))


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "deepseek": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
