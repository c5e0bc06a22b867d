"""Which pool a request draws on, and the limits configured for it (``[limits."<name>"]``, ``capacity``).

A pool is one provider key at one endpoint (``capacity.group_by = "key"``, the default: providers limit a
key, and every model of the key shares it) or one model of it (``"model"``: providers that limit each model
apart, as OpenAI does). A ``[limits."<model>"]`` table gives that model a pool of its own, with its limits;
a ``[limits."<api_base>"]`` table sets the limits of the pools at that endpoint. The key itself never
appears in a pool's name: a short hash of it does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Literal

from runtime.capacity._pool import Limits

__all__ = ["GroupBy", "pool_for"]

GroupBy = Literal["key", "model"]


def _key_tag(api_key: str | None) -> str:
    if not api_key:
        return "no key"
    return "key " + hashlib.sha256(api_key.encode()).hexdigest()[:8]


def pool_for(
    *,
    model: str,
    endpoint: str,
    api_key: str | None,
    group_by: GroupBy,
    configured: Mapping[str, Limits],
) -> tuple[str, Limits]:
    """The name of the pool a call of ``model`` to ``endpoint`` with ``api_key`` draws on, and the limits
    configured for it (empty when none are: they are learned)."""
    own = configured.get(model)
    base = configured.get(endpoint) or configured.get(endpoint.rstrip("/"))
    tag = _key_tag(api_key)
    if own is not None or group_by == "model":
        return f"{model} @ {endpoint} ({tag})", own if own is not None else (base or Limits())
    return f"{endpoint} ({tag})", base or Limits()
