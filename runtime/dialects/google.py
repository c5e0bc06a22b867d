"""Google's dialects: the Gemini API and Vertex AI (Gemini through Google Cloud), in Google's error shape
``{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import WIN, Dialect, ErrorResponse, OverflowFormat

GEMINI: Final = Dialect(
    name="gemini",
    # "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575)."
    overflow_phrases=("input token count", "request payload size exceeds the limit"),
    window_regexes=(re.compile(rf"maximum number of tokens allowed \({WIN}\)"),),
    negative_phrases=(
        "resource has been exhausted",
        "resource_exhausted",
        "api key not valid",
        "permission_denied",
        "maxoutputtokens value",
    ),
    negative_codes=frozenset({"resource_exhausted", "permission_denied", "unauthenticated"}),
)

VERTEX: Final = Dialect(
    name="vertex",
    # "Unable to submit request because the input token count is 1052710 but model only supports up to
    # 1048576. Reduce the input token count and try again. You can also use the CountTokens API …"
    overflow_phrases=("but model only supports up to", "reduce the input token count"),
    window_regexes=(re.compile(rf"model only supports up to {WIN}"),),
)


def gemini_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Google Gemini API (and Vertex AI for some models)."""
    message = f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({window})."
    return ErrorResponse(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})


def vertex_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Vertex AI (Gemini through Google Cloud): its own wording, in Google's error shape."""
    message = (
        f"Unable to submit request because the input token count is {prompt} but model only supports up to "
        f"{window}. Reduce the input token count and try again. You can also use the CountTokens API to "
        "calculate prompt token count and billable characters. Learn more: "
        "https://cloud.google.com/vertex-ai/generative-ai/docs/learn/models"
    )
    return ErrorResponse(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "gemini": gemini_overflow,
    "vertex": vertex_overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
