"""Usage read from any provider's response shape, normalized into :class:`runtime.messages.Usage`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from runtime.messages import Usage


def normalize_usage(raw: Any, *, cost: float | None = None) -> Usage:
    """litellm's (or an OpenAI/Anthropic-shaped) usage as our :class:`Usage`.

    ``input_tokens`` is the whole prompt (cache reads included, as OpenAI and litellm count it);
    ``cache_read_tokens`` and ``cache_write_tokens`` say how much of it came from or went to the cache.
    """
    if raw is None:
        return Usage(cost=cost)
    prompt = _int(field(raw, "prompt_tokens")) or _int(field(raw, "input_tokens"))
    completion = _int(field(raw, "completion_tokens")) or _int(field(raw, "output_tokens"))
    completion_details = field(raw, "completion_tokens_details")
    prompt_details = field(raw, "prompt_tokens_details")
    reasoning = _int(field(completion_details, "reasoning_tokens")) or _int(field(raw, "reasoning_tokens"))
    cache_read = _int(field(prompt_details, "cached_tokens")) or _int(field(raw, "cache_read_input_tokens"))
    cache_write = _int(field(raw, "cache_creation_input_tokens")) or _int(
        field(prompt_details, "cache_creation_tokens")
    )
    # The writes kept for an hour: Anthropic's ``cache_creation`` split, as litellm carries it or as sent
    by_ttl = field(prompt_details, "cache_creation_token_details") or field(raw, "cache_creation")
    hour = min(cache_write, _int(field(by_ttl, "ephemeral_1h_input_tokens")))
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        reasoning_tokens=reasoning,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=hour,
        cost=cost,
    )


def stamped_cost(raw: Any) -> float | None:
    """The cost the provider (OpenRouter) or litellm stamped on a response's usage, if any (USD)."""
    if raw is None:
        return None
    stamped = field(raw, "cost")
    if isinstance(stamped, Mapping):  # a provider's breakdown (OpenRouter): its total
        stamped = stamped.get("total_cost")
    if isinstance(stamped, (int, float)) and not isinstance(stamped, bool) and stamped >= 0:
        return float(stamped)
    return None


def field(obj: Any, key: str) -> Any:
    """``obj[key]`` or ``obj.key``, None when absent.

    litellm's response objects are pydantic models whose optional fields (``reasoning_content``, ...) are
    often simply absent, and a missing attribute costs a raised and caught ``AttributeError`` inside
    pydantic. A streamed call makes hundreds of these lookups, so the instance dictionaries are read
    first and what a class can answer otherwise is worked out once per class and key.
    """
    if obj is None:
        return None
    cls = type(obj)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    if kind is _MAPPING:
        return obj.get(key)
    values = getattr(obj, "__dict__", None)
    if values is not None:
        value = values.get(key, _MISSING)
        if value is not _MISSING:
            return value
    if kind is _OBJECT:
        return getattr(obj, key, None)
    extra = getattr(obj, "__pydantic_extra__", None)
    if extra is not None and key in extra:
        return extra[key]
    # Not in the instance: a declared field litellm deleted (absent), or a property of the class.
    computed = _COMPUTED.get((cls, key))
    if computed is None:
        computed = _COMPUTED[(cls, key)] = key not in cls.__pydantic_fields__ and hasattr(cls, key)
    return getattr(obj, key, None) if computed else None


_MAPPING: Final = "mapping"
_PYDANTIC: Final = "pydantic"
_OBJECT: Final = "object"
_MISSING: Final = object()
_KINDS: dict[type, str] = {}
_COMPUTED: dict[tuple[type, str], bool] = {}  # (pydantic class, key) -> answered by a class attribute


def _kind_of(cls: type) -> str:
    if issubclass(cls, Mapping):
        return _MAPPING
    # ``__pydantic_fields__`` is a plain class dict; the class-level ``model_fields`` is a slow property.
    if isinstance(getattr(cls, "__pydantic_fields__", None), dict) and "__pydantic_extra__" in dir(cls):
        return _PYDANTIC
    return _OBJECT


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
