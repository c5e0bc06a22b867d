"""AWS Bedrock's dialect (Converse / InvokeModel, and Mantle): ``ValidationException`` overflows and
``ThrottlingException`` refusals."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from runtime.dialects._base import WIN, Dialect, ErrorResponse, OverflowFormat

BEDROCK: Final = Dialect(
    name="bedrock",
    # "Input is too long for requested model."; Mantle: "prompt tokens (210000) exceed model maximum (200000)"
    overflow_phrases=("input is too long for requested model", "exceed model maximum"),
    overflow_regexes=(re.compile(r"prompt tokens \(\d+\) exceed model maximum"),),
    window_regexes=(re.compile(rf"exceed model maximum \({WIN}\)"),),
    negative_phrases=(
        "please wait before trying again",  # ThrottlingException ("Too many tokens, please wait …")
        "throttlingexception",
    ),
    negative_codes=frozenset({"throttlingexception"}),
)


def overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """AWS Bedrock runtime (Converse / InvokeModel): a ``ValidationException``."""
    return ErrorResponse(
        400,
        {"message": "Input is too long for requested model."},
        {"x-amzn-errortype": "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
    )


OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    "bedrock": overflow,
}
"""This dialect's overflow errors by format name (the local provider's ``overflow_format``)."""
