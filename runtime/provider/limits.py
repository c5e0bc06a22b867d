"""The local provider's own rate limiter: what a provider does to one API key (design §7.3).

Per key (the bearer token; requests without one share the key ``""``) three limits, each optional:

- ``rpm``: requests per minute, a token bucket refilled at ``rpm / 60`` per second that holds
  ``burst`` seconds of it (default one second: 10 requests/s lets 10 through at once, not 600);
- ``tpm``: tokens per minute (the prompt's tokens plus the request's output cap, as OpenAI counts them
  before answering), a bucket of the same shape; a full bucket admits one request of any size;
- ``max_concurrent``: requests answered at once.

Every answer carries OpenAI's headers: ``x-ratelimit-limit-requests``/``-tokens`` (per minute),
``x-ratelimit-remaining-requests``/``-tokens`` (what the bucket holds now) and ``x-ratelimit-reset-requests``/
``-tokens`` (until it is full again, as ``1.5s`` or ``120ms``). A request over a limit gets a 429 with
``retry-after`` and ``retry-after-ms`` (when the bucket will hold it) and the same headers. With
``headers=False`` no rate-limit header is sent, only the 429s with their ``retry-after`` -- a provider
that tells nothing, which a client must learn from refusals alone.

Pure bookkeeping, thread-safe (one lock); the clock is passed in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from runtime.dialects import openai
from runtime.dialects.openai import format_reset

__all__ = ["Decision", "ProviderLimiter", "format_reset"]


@dataclass
class _Bucket:
    """A token bucket: ``rate`` per second, holding at most ``capacity``."""

    rate: float
    capacity: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` can be taken (a full bucket takes any amount)."""
        need = min(amount, self.capacity)
        if self.level >= need:
            return 0.0
        return (need - self.level) / self.rate

    def reset_in(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)


@dataclass
class _Key:
    requests: _Bucket | None
    tokens: _Bucket | None
    running: int = 0
    refused: int = 0
    admitted: int = 0


@dataclass(frozen=True)
class Decision:
    """What the limiter says to one request: admitted or not, and the headers its answer carries."""

    admitted: bool
    headers: dict[str, str] = field(default_factory=dict)
    retry_after: float | None = None
    limit: str = ""
    """When refused: which limit (``requests``, ``tokens`` or ``concurrent``)."""
    levels: tuple[tuple[str, float, float, float], ...] = ()
    """Each limit as ``(name, per minute, remaining, seconds until full)``, for a dialect to write its own
    headers from (the Messages endpoint's ``anthropic-ratelimit-*``)."""


class ProviderLimiter:
    """Token buckets per API key (see the module docstring). ``None`` for a limit means none."""

    def __init__(
        self,
        *,
        rpm: float | None = None,
        tpm: float | None = None,
        max_concurrent: int | None = None,
        burst: float = 1.0,
        headers: bool = True,
    ) -> None:
        for name, value in (("rpm", rpm), ("tpm", tpm), ("max_concurrent", max_concurrent)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
        if burst <= 0:
            raise ValueError(f"burst must be positive seconds, not {burst}")
        self.rpm = rpm
        self.tpm = tpm
        self.max_concurrent = max_concurrent
        self.burst = burst
        self.headers = headers
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None

    def _bucket(self, per_minute: float | None, now: float) -> _Bucket | None:
        if per_minute is None:
            return None
        rate = per_minute / 60.0
        capacity = max(1.0, rate * self.burst)
        return _Bucket(rate=rate, capacity=capacity, level=capacity, updated=now)

    def _key(self, key: str, now: float) -> _Key:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(self._bucket(self.rpm, now), self._bucket(self.tpm, now))
        return state

    def admit(self, key: str, tokens: int, now: float) -> Decision:
        """Take one request of ``tokens`` tokens for ``key`` at ``now``, or refuse it (a 429)."""
        with self._lock:
            state = self._key(key, now)
            for bucket in (state.requests, state.tokens):
                if bucket is not None:
                    bucket.refill(now)
            waits: list[tuple[float, str]] = []
            if state.requests is not None and (w := state.requests.wait_for(1.0)) > 0:
                waits.append((w, "requests"))
            if state.tokens is not None and (w := state.tokens.wait_for(float(tokens))) > 0:
                waits.append((w, "tokens"))
            if self.max_concurrent is not None and state.running >= self.max_concurrent:
                waits.append((0.05, "concurrent"))  # a slot frees when an answer ends; try again soon
            if waits:
                state.refused += 1
                wait, limit = max(waits)
                return Decision(
                    False, self._headers(state), retry_after=wait, limit=limit, levels=self._levels(state)
                )
            if state.requests is not None:
                state.requests.level -= 1.0
            if state.tokens is not None:
                state.tokens.level -= float(tokens)
            state.running += 1
            state.admitted += 1
            return Decision(True, self._headers(state), levels=self._levels(state))

    def limit_of(self, limit: str) -> int:
        """The value of the limit a refusal names (``requests``: rpm, ``tokens``: tpm, else max_concurrent)."""
        value = {"requests": self.rpm, "tokens": self.tpm}.get(limit) or self.max_concurrent
        return int(value or 0)

    def release(self, key: str) -> None:
        """An admitted request's answer ended (its concurrent slot is free)."""
        with self._lock:
            state = self._keys.get(key)
            if state is not None and state.running > 0:
                state.running -= 1

    def counts(self, key: str = "") -> tuple[int, int]:
        """(admitted, refused) requests of ``key`` so far."""
        with self._lock:
            state = self._keys.get(key)
            return (state.admitted, state.refused) if state is not None else (0, 0)

    def _levels(self, state: _Key) -> tuple[tuple[str, float, float, float], ...]:
        levels: list[tuple[str, float, float, float]] = []
        if state.requests is not None and self.rpm is not None:
            levels.append(("requests", self.rpm, state.requests.level, state.requests.reset_in()))
        if state.tokens is not None and self.tpm is not None:
            levels.append(("tokens", self.tpm, state.tokens.level, state.tokens.reset_in()))
        return tuple(levels)

    def _headers(self, state: _Key) -> dict[str, str]:
        if not self.headers:
            return {}
        out: dict[str, str] = {}
        if state.requests is not None and self.rpm is not None:
            out.update(
                openai.rate_limit_headers(
                    "requests", self.rpm, state.requests.level, state.requests.reset_in()
                )
            )
        if state.tokens is not None and self.tpm is not None:
            out.update(
                openai.rate_limit_headers("tokens", self.tpm, state.tokens.level, state.tokens.reset_in())
            )
        return out
