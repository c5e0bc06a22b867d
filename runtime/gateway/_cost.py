"""What a call cost, from litellm's price map: looked up once per model, then arithmetic (design §4.1).

litellm's own ``cost_per_token`` walks the model map on every call; here a model's prices are read once
(:func:`prices_for`, cached) and each call's cost is computed from its usage: uncached input, cache reads
and cache writes at their own rates, output (reasoning included, unless the model prices reasoning on its
own), and the rates of the highest ``above_<N>k_tokens`` tier the prompt is over.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from runtime.gateway._usage import normalize_usage, stamped_cost
from runtime.messages import CostSplit, Usage


class Rates(msgspec.Struct, frozen=True):
    """USD per token."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    cache_write_1h: float | None = None
    """A write kept for an hour (Anthropic bills it at 2x input, a 5-minute write at 1.25x): the map's
    ``cache_creation_input_token_cost_above_1hr``; None when it has none (then at ``cache_write``)."""

    @property
    def hour_write(self) -> float:
        return self.cache_write if self.cache_write_1h is None else self.cache_write_1h


class Prices(msgspec.Struct, frozen=True):
    """A model's rates, and the tiers that apply above a prompt size (ascending thresholds)."""

    base: Rates
    reasoning: float | None = None
    tiers: tuple[tuple[int, Rates], ...] = ()

    def cost(self, usage: Usage) -> float:
        return self.split(usage).total

    def split(self, usage: Usage) -> CostSplit:
        """``usage``'s cost by kind of token, and what it would have cost without a cache."""
        rates = self.base
        for threshold, tier in self.tiers:
            if usage.input_tokens > threshold:
                rates = tier
        uncached = max(0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens)
        hour = min(usage.cache_write_1h_tokens, usage.cache_write_tokens)
        if self.reasoning is not None and usage.reasoning_tokens:
            reasoning = min(usage.reasoning_tokens, usage.output_tokens)
            completion = (usage.output_tokens - reasoning) * rates.output + reasoning * self.reasoning
        else:
            completion = usage.output_tokens * rates.output
        return CostSplit(
            input=uncached * rates.input,
            cache_read=usage.cache_read_tokens * rates.cache_read,
            cache_write=(usage.cache_write_tokens - hour) * rates.cache_write + hour * rates.hour_write,
            output=completion,
            without_cache=usage.input_tokens * rates.input + completion,
        )


_TIER: Final = re.compile(r"^input_cost_per_token_above_(\d+)k_tokens$")
_lock = threading.Lock()
_cache: dict[tuple[str, str | None], Prices | None] = {}


def prices_for(litellm: Any, model: str, provider: str | None = None) -> Prices | None:
    """``model``'s prices from litellm's map (``provider`` as litellm resolved it), or None when litellm
    does not price it. Looked up once per (model, provider) for the life of the process."""
    key = (model, provider)
    try:
        return _cache[key]
    except KeyError:
        pass
    prices = _lookup(litellm, model, provider)
    with _lock:
        _cache[key] = prices
    return prices


def _lookup(litellm: Any, model: str, provider: str | None) -> Prices | None:
    # Only ask about names litellm can route: for others, get_model_info prints a provider list to stdout.
    prefix = model.split("/", 1)[0] if "/" in model else None
    if provider is None and model not in litellm.model_cost and prefix not in litellm.provider_list:
        return None
    try:
        info: Mapping[str, Any] = litellm.get_model_info(model=model, custom_llm_provider=provider)
    except Exception:  # litellm raises a plain Exception for an unmapped model
        return None
    return prices_from_info(info)


def prices_from_info(info: Mapping[str, Any]) -> Prices | None:
    """:class:`Prices` from one entry of litellm's model map; None without input and output prices."""
    base = _rates(info, "")
    if base is None:
        return None
    tiers: list[tuple[int, Rates]] = []
    for key in info:
        match = _TIER.match(key)
        if match is not None:
            tier = _rates(info, f"_above_{match.group(1)}k_tokens", fallback=base)
            if tier is not None:
                tiers.append((int(match.group(1)) * 1000, tier))
    reasoning = _price(info.get("output_cost_per_reasoning_token"))
    return Prices(base=base, reasoning=reasoning, tiers=tuple(sorted(tiers, key=lambda t: t[0])))


def _rates(info: Mapping[str, Any], suffix: str, *, fallback: Rates | None = None) -> Rates | None:
    given = _price(info.get(f"input_cost_per_token{suffix}"))
    taken = _price(info.get(f"output_cost_per_token{suffix}"))
    if given is None and taken is None:
        return None
    base = fallback or Rates(0.0, 0.0, 0.0, 0.0)
    input_rate = given if given is not None else base.input
    read = _price(info.get(f"cache_read_input_token_cost{suffix}"))
    write = _price(info.get(f"cache_creation_input_token_cost{suffix}"))
    hour = _price(info.get(f"cache_creation_input_token_cost_above_1hr{suffix}"))
    return Rates(
        input=input_rate,
        output=taken if taken is not None else base.output,
        cache_read=read if read is not None else (base.cache_read if fallback else input_rate),
        cache_write=write if write is not None else (base.cache_write if fallback else input_rate),
        cache_write_1h=hour if hour is not None else base.cache_write_1h,
    )


def _price(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def usage_with_cost(raw_usage: Any, prices: Prices | None, transport: str) -> Usage:
    """A response's usage, normalized, with its cost in USD (what the provider -- OpenRouter -- or litellm
    stamped on it, else computed from ``prices``; None when neither knows), its split by kind of token (from
    ``prices``) and the transport that made it."""
    usage = normalize_usage(raw_usage)
    cost = None if raw_usage is None else stamped_cost(raw_usage)
    costs = prices.split(usage) if prices is not None and raw_usage is not None else None
    if cost is None and costs is not None:
        cost = costs.total
    return msgspec.structs.replace(usage, cost=cost, transport=transport, costs=costs)
