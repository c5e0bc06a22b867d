"""Provider dialects: one module per provider (or family of servers), holding what it says and how.

Each module holds one dialect's overflow wordings, codes and window-stating messages (a :class:`Dialect`
record the overflow classifier reads, design §6.1), its error types by kind (design §3.7), the error
responses it sends (the local provider imitates them, design §7.3) and, where it has them, its rate-limit
headers (read into the capacity pools, design §3.11; written by the local provider). Adding a provider's
wording is an edit of its module; the classifier, the gateway and the local provider read the union.

Pure: no I/O, no actors; nothing of the project below it but :mod:`runtime.dialects._base`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Final

from runtime.dialects import (
    anthropic,
    bedrock,
    cohere,
    deepseek,
    generic,
    google,
    groq,
    llamacpp,
    lmstudio,
    mistral,
    ollama,
    openai,
    openrouter,
    sglang,
    tgi,
    vllm,
    xai,
)
from runtime.dialects._base import Dialect, Dimension, ErrorKind, ErrorResponse, OverflowFormat

__all__ = [
    "DIALECTS",
    "MODULES",
    "OVERFLOW_FORMATS",
    "Dialect",
    "Dimension",
    "ErrorKind",
    "ErrorResponse",
    "OverflowFormat",
]

MODULES: Final[tuple[ModuleType, ...]] = (
    generic,
    openai,
    anthropic,
    google,
    llamacpp,
    vllm,
    sglang,
    tgi,
    ollama,
    bedrock,
    mistral,
    groq,
    deepseek,
    xai,
    openrouter,
    cohere,
    lmstudio,
)
"""Every dialect's module: the one list of them (what is read of all dialects is derived from it)."""

DIALECTS: Final[tuple[Dialect, ...]] = (
    generic.OPAL,
    generic.LITELLM,
    openai.OPENAI,
    openai.AZURE,
    anthropic.ANTHROPIC,
    google.GEMINI,
    google.VERTEX,
    bedrock.BEDROCK,
    mistral.MISTRAL,
    groq.GROQ,
    cohere.COHERE,
    deepseek.DEEPSEEK,
    xai.XAI,
    openrouter.OPENROUTER,
    ollama.OLLAMA,
    llamacpp.LLAMACPP,
    vllm.VLLM,
    sglang.SGLANG,
    tgi.TGI,
    lmstudio.LMSTUDIO,
    generic.OTHER,
)
"""Every dialect, in the order the classifier tries their phrases and regexes."""

OVERFLOW_FORMATS: Final[Mapping[str, OverflowFormat]] = {
    name: build for module in MODULES for name, build in getattr(module, "OVERFLOW_FORMATS", {}).items()
}
"""Every dialect's overflow errors by format name (each module's ``OVERFLOW_FORMATS``): what the local
provider answers with (``LocalProvider(overflow_format=...)``, ``--overflow-format``)."""
