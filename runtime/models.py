"""Context window and output limit per model (design §4.5).

Resolution order for the context window:

1. the user's overrides (``ModelsConfig.context_windows``), by full model name or by the name without its
   provider prefix (``openrouter/anthropic/claude-sonnet-4`` matches ``anthropic/claude-sonnet-4`` and
   ``claude-sonnet-4``);
2. litellm's model info, ``max_input_tokens`` — never ``litellm.get_max_tokens``, which returns the
   *output* limit;
3. a built-in table of current models litellm may lack (longest matching name prefix);
4. ``ModelsConfig.fallback_context_window`` (128,000).

The output limit follows the same order, and is None when nobody knows it. litellm is imported lazily
(it takes seconds) and its answers are cached per model name.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal

import msgspec

from runtime.config import ModelsConfig

__all__ = [
    "BUILTIN_MODELS",
    "MAX_MODEL_NAME",
    "ModelInfo",
    "Source",
    "context_window",
    "model_info",
    "name_candidates",
    "validate_model_name",
]


Source = Literal["override", "litellm", "builtin", "fallback"]


MAX_MODEL_NAME: Final = 256


def validate_model_name(model: object) -> str:
    """``model`` if it can name a model (1-256 characters, no whitespace or control characters); else a
    ``ValueError`` saying why (``TypeError`` for a non-string)."""
    if not isinstance(model, str):
        raise TypeError(f"a model name is a string, not {type(model).__name__}")
    if not model:
        raise ValueError("the model name must not be empty")
    if len(model) > MAX_MODEL_NAME:
        raise ValueError(f"the model name is {len(model):,} characters long; at most {MAX_MODEL_NAME}")
    if not model.isprintable() or any(c.isspace() for c in model):
        raise ValueError(f"the model name {model[:80]!r} holds whitespace or control characters")
    return model


class ModelInfo(msgspec.Struct, frozen=True):
    """What the runtime needs to know about a model's limits, and where the window came from."""

    context_window: int
    max_output_tokens: int | None
    source: Source


# (context window as input tokens, max output tokens) of current models, for when litellm lacks them.
# Keys are model names without a provider prefix; the longest key that prefixes a name wins.
BUILTIN_MODELS: Final[Mapping[str, tuple[int, int | None]]] = {
    # OpenAI
    "gpt-3.5-turbo": (16_385, 4_096),
    "gpt-4": (8_192, 8_192),
    "gpt-4-turbo": (128_000, 4_096),
    "gpt-4o": (128_000, 16_384),
    "chatgpt-4o": (128_000, 16_384),
    "gpt-4.1": (1_047_576, 32_768),
    "gpt-5": (272_000, 128_000),
    "o1": (200_000, 100_000),
    "o3": (200_000, 100_000),
    "o4-mini": (200_000, 100_000),
    "gpt-oss": (131_072, None),
    # Anthropic (both the API's and OpenRouter's spellings)
    "claude-3-5-sonnet": (200_000, 8_192),
    "claude-3.5-sonnet": (200_000, 8_192),
    "claude-3-5-haiku": (200_000, 8_192),
    "claude-3.5-haiku": (200_000, 8_192),
    "claude-3-7-sonnet": (200_000, 64_000),
    "claude-3.7-sonnet": (200_000, 64_000),
    "claude-sonnet-4": (200_000, 64_000),
    "claude-opus-4": (200_000, 32_000),
    "claude-haiku-4": (200_000, 64_000),
    # Google
    "gemini-1.5-pro": (2_097_152, 8_192),
    "gemini-1.5-flash": (1_048_576, 8_192),
    "gemini-2.0-flash": (1_048_576, 8_192),
    "gemini-2.5-pro": (1_048_576, 65_536),
    "gemini-2.5-flash": (1_048_576, 65_536),
    # Others
    "grok-3": (131_072, None),
    "grok-4": (256_000, None),
    "deepseek-chat": (131_072, 8_192),
    "deepseek-reasoner": (131_072, None),
    "mistral-large": (131_072, None),
    "codestral": (256_000, None),
    "qwen3-coder": (262_144, None),
    "kimi-k2": (131_072, None),
    "glm-4.5": (131_072, None),
    "glm-4.6": (200_000, None),
    "llama-3.1": (131_072, None),
    "llama-3.3": (131_072, None),
}

# A key prefixes a name only up to one of these (so "gpt-4" is not taken for "gpt-4.1" or "gpt-4o").
_NAME_BOUNDARIES: Final = frozenset("-:@_")


def model_info(model: str, config: ModelsConfig | None = None) -> ModelInfo:
    """The context window (input tokens) and max output tokens of ``model``; see the module docstring."""
    config = config if config is not None else ModelsConfig()
    names = list(name_candidates(model))
    window = _override(config.context_windows, names)
    max_output = _override(config.max_output_tokens, names)
    if window is not None and max_output is not None:
        return ModelInfo(window, max_output, "override")  # nothing to look up (and no litellm import)

    known_window, known_output = _from_litellm(names)
    builtin = _from_builtin(names[-1])
    if max_output is None:
        max_output = known_output or (builtin[1] if builtin is not None else None)
    if window is not None:
        return ModelInfo(window, max_output, "override")
    if known_window is not None:
        return ModelInfo(known_window, max_output, "litellm")
    if builtin is not None:
        return ModelInfo(builtin[0], max_output, "builtin")
    return ModelInfo(config.fallback_context_window, max_output, "fallback")


def context_window(model: str, config: ModelsConfig | None = None) -> int:
    """Shorthand for ``model_info(model, config).context_window``."""
    return model_info(model, config).context_window


def name_candidates(model: str) -> Iterator[str]:
    """``model``, then the name with its provider prefixes removed one at a time, down to the bare name."""
    name = model.strip()
    yield name
    while "/" in name:
        name = name.split("/", 1)[1]
        if name:
            yield name


def _override(table: Mapping[str, int], names: list[str]) -> int | None:
    for name in names:
        if name in table:
            return table[name]
    return None


def _from_builtin(name: str) -> tuple[int, int | None] | None:
    name = name.lower()
    best: str | None = None
    for key in BUILTIN_MODELS:
        matches = name == key or (name.startswith(key) and name[len(key)] in _NAME_BOUNDARIES)
        if matches and (best is None or len(key) > len(best)):
            best = key
    return BUILTIN_MODELS[best] if best is not None else None


def _from_litellm(names: list[str]) -> tuple[int | None, int | None]:
    """(window, max output) from the first name litellm knows; (None, None) when it knows none."""
    for name in names:
        found = _litellm_limits(name)
        if found is not None:
            return found
    return None, None


@functools.lru_cache(maxsize=1024)
def _litellm_limits(name: str) -> tuple[int | None, int | None] | None:
    """``(max_input_tokens, max_output_tokens)`` from litellm's model map, or None if it lacks ``name``."""
    import litellm

    # Only ask about names litellm can route: for others, get_model_info prints a provider list to stdout.
    provider = name.split("/", 1)[0] if "/" in name else None
    if name not in litellm.model_cost and provider not in litellm.provider_list:
        return None
    try:
        info: Mapping[str, Any] = litellm.get_model_info(name)
    except Exception:  # litellm raises a plain Exception for an unmapped model
        return None
    window = _positive(info.get("max_input_tokens"))
    output = _positive(info.get("max_output_tokens"))
    if window is None and output is None:
        return None
    return window, output


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None
