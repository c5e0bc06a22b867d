"""Ollama's dialect (its OpenAI-compatible endpoint; the runner's errors relayed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from runtime.dialects import openai
from runtime.dialects._base import Dialect, ErrorResponse, OverflowFormat

OLLAMA: Final = Dialect(
    name="ollama",
    # "the input length exceeds the context length"; the runner's "prompt too long; exceeded max context
    # length by …"; since 2026-06 (no context shift): "the prompt is longer than the context length currently
    # available to the model; shorten the prompt, …"; MLX: "input length (N tokens) exceeds the model's
    # maximum context length (M tokens)" (server/routes.go, llm/llama_server.go, x/mlxrunner/pipeline.go)
    overflow_phrases=(
        "exceeds the context length",
        "exceeded max context length",
        "prompt too long",
        "longer than the context length",
    ),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Ollama's OpenAI-compatible endpoint when truncation is off: the runner's error relayed as a 500."""
    message = "the input length exceeds the context length"
    return ErrorResponse(500, openai.error_body(message, "api_error", None))


def new_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Ollama since mid-2026 when the prompt does not fit and context shift is off: a 400."""
    message = (
        "the prompt is longer than the context length currently available to the model; shorten the prompt, "
        "adjust the context length in settings, or use a model with a longer context length"
    )
    return ErrorResponse(400, openai.error_body(message, "invalid_request_error", None))


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "ollama": overflow,
    "ollama_new": new_overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
