"""Backoff between attempts: exponential with jitter, honouring the server's ``retry-after`` (design §3.7)."""

from __future__ import annotations

import random
from typing import Final

from runtime.config import RetryConfig

MAX_HONOURED_RETRY_AFTER: Final = 60.0
"""A ``retry-after`` above this many seconds is not waited for; the computed backoff is used instead."""


def backoff_delay(
    attempt: int, config: RetryConfig, *, retry_after: float | None = None, rng: random.Random | None = None
) -> float:
    """Delay before the attempt after failed attempt ``attempt`` (1-based).

    ``retry-after`` is honoured when the server sends a usable value (at most
    :data:`MAX_HONOURED_RETRY_AFTER`); otherwise ``base_delay * 2**(attempt-1)`` capped at ``max_delay``,
    less a random fraction of up to ``jitter`` of it (so concurrent clients spread out).
    """
    if retry_after is not None and 0.0 <= retry_after <= MAX_HONOURED_RETRY_AFTER:
        return retry_after
    delay = min(config.max_delay, config.base_delay * (2.0 ** max(0, attempt - 1)))
    draw = rng.random() if rng is not None else random.random()
    return delay * (1.0 - config.jitter * draw)
