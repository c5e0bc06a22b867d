"""One capacity pool: what a provider key may be sent, configured and learned, and who may go now.

A pool keeps a token bucket per limit it knows -- requests, tokens (input and output together, OpenAI's
way), input tokens and output tokens (Anthropic's), each per minute, refilled continuously and holding
``burst`` seconds of its rate -- and the requests in flight against ``max_concurrent``. A request is admitted
when every bucket holds its cost (1 request; its exact input tokens; its output cap); a full bucket admits a
request of any size, as providers do.

Limits come from the configuration and from the answers (:func:`~runtime.capacity.parse_rate_limit_headers`):
the lower of the two holds, at ``headroom`` of it (0.98: a little under, so that the clocks of two token
buckets drifting apart cost no refusals). An answer's ``remaining`` brings the bucket down to what the
provider says is left, less what was admitted since that request. Until the first answer of a pool that has
no configured limit, one request goes at a time (its answer says what the limits are).

A refusal (429) pauses the whole pool until its ``retry-after`` plus up to ``jitter`` of it (so waiters do
not come back together) and empties the request bucket. A provider that sends no limits is learned from its
refusals alone, as TCP learns a path: at the first refusal the rate starts from ``decrease`` times the rate of
the answers of the last seconds and doubles every second (slow start) until the next refusal; from then on
additive increase, multiplicative decrease -- each refusal multiplies the rate by ``decrease``, and it climbs
back by ``increase`` of itself per second. Refusals of requests sent before the last decrease do not count.

Pure: no threads, no I/O; the clock (``now``, monotonic seconds) and the random draws are passed in.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

import msgspec

from runtime.capacity._headers import Dimension, RateLimitInfo

__all__ = ["Limits", "Pool", "PoolStats", "Ticket"]

_tickets = itertools.count(1)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-minute limits of a key (None: no such limit) and the requests it may have in flight."""

    rpm: float | None = None
    tpm: float | None = None
    input_tpm: float | None = None
    output_tpm: float | None = None
    max_concurrent: int | None = None

    @property
    def empty(self) -> bool:
        return all(
            v is None for v in (self.rpm, self.tpm, self.input_tpm, self.output_tpm, self.max_concurrent)
        )

    def __and__(self, other: Limits) -> Limits:
        """The tighter of the two, limit by limit."""

        def low(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else min(a, b)

        concurrent = low(self.max_concurrent, other.max_concurrent)
        return Limits(
            rpm=low(self.rpm, other.rpm),
            tpm=low(self.tpm, other.tpm),
            input_tpm=low(self.input_tpm, other.input_tpm),
            output_tpm=low(self.output_tpm, other.output_tpm),
            max_concurrent=None if concurrent is None else int(concurrent),
        )

    def scaled(self, share: float) -> Limits:
        """These limits times ``share`` (a shard's part of a key shared by several processes)."""

        def part(value: float | None) -> float | None:
            return None if value is None else value * share

        concurrent = None if self.max_concurrent is None else max(1, math.floor(self.max_concurrent * share))
        return Limits(
            rpm=part(self.rpm),
            tpm=part(self.tpm),
            input_tpm=part(self.input_tpm),
            output_tpm=part(self.output_tpm),
            max_concurrent=concurrent,
        )


@dataclass(eq=False)
class Ticket:
    """A request asking a pool for capacity: its flow (session), priority and weight in the queue, and
    its cost (exact input tokens, the output cap reserved)."""

    flow: str
    priority: int = 1
    weight: float = 1.0
    input_tokens: int = 0
    output_tokens: int = 0
    enqueued: float = 0.0
    id: int = field(default_factory=lambda: next(_tickets))
    seq: int = 0
    """The pool's admission count when this was admitted (what was admitted after it is newer)."""
    tokens_seq: float = 0.0
    admitted_at: float = 0.0


@dataclass
class _Bucket:
    rate: float  # per second
    capacity: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait(self, amount: float) -> float:
        need = min(amount, self.capacity)
        short = need - self.level
        return 0.0 if short <= 1e-9 * max(1.0, need) else short / self.rate


@dataclass
class PoolStats:
    """Counts since the pool was made (what the metrics export)."""

    admitted: int = 0
    admitted_input_tokens: int = 0
    admitted_output_tokens: int = 0
    refused: int = 0
    """429s the provider answered."""
    waited: int = 0
    """Requests that had to wait for capacity."""


class Pool:
    """The capacity of one provider key (see the module docstring)."""

    def __init__(
        self,
        name: str,
        configured: Limits | None = None,
        *,
        headroom: float = 0.98,
        burst: float = 1.0,
        jitter: float = 0.25,
        decrease: float = 0.8,
        increase: float = 0.1,
        min_rate: float = 0.2,
        rng: random.Random | None = None,
        now: float = 0.0,
    ) -> None:
        self.name = name
        self.configured = configured or Limits()
        self.learned = Limits()
        self.share = 1.0
        """The part of the limits this process may use (the cluster's lease, runtime/cluster)."""
        self.headroom = headroom
        self.burst = burst
        self.jitter = jitter
        self.decrease = decrease
        self.increase = increase
        self.min_rate = min_rate
        self.rng = rng or random.Random()
        self.running = 0
        self.paused_until = 0.0
        self.answered = False  # any answer seen (until then, with nothing configured: one at a time)
        self.aimd_rps: float | None = None  # the learned rate of a provider that sends no limits
        self._aimd_step = 0.0
        self._slow_start = False
        self._decreased_at_seq = 0
        self._answers: deque[float] = deque()  # times of recent answers (the AIMD's measured rate)
        self._seq = 0
        self._tokens_seq = 0.0
        self.stats = PoolStats()
        self._buckets: dict[str, _Bucket] = {}
        self._limits = Limits()
        self._rebuild(now)

    # -- limits --------------------------------------------------------------------------------------

    @property
    def limits(self) -> Limits:
        """The limits in force: configured and learned, the tighter of each, times this process's share
        (the AIMD rate as ``rpm`` when no rate is known)."""
        return self._limits

    def _effective(self) -> Limits:
        limits = (self.configured & self.learned).scaled(self.share)
        if limits.rpm is None and self.aimd_rps is not None:
            limits = msgspec.structs.replace(limits, rpm=self.aimd_rps * 60.0)
        return limits

    def _rebuild(self, now: float) -> None:
        """Buckets for the limits in force; a bucket that stays keeps its level (at most its capacity)."""
        limits = self._limits = self._effective()
        per_minute = {
            "requests": limits.rpm,
            "tokens": limits.tpm,
            "input": limits.input_tpm,
            "output": limits.output_tpm,
        }
        aimd = self.aimd_rps is not None and (self.configured & self.learned).rpm is None
        for name, value in per_minute.items():
            old = self._buckets.get(name)
            if value is None:
                self._buckets.pop(name, None)
                continue
            rate = value / 60.0 * (1.0 if aimd and name == "requests" else self.headroom)
            capacity = max(1.0, rate * self.burst)
            if old is None:
                self._buckets[name] = _Bucket(rate, capacity, capacity, now)
            else:
                old.refill(now)
                old.rate, old.capacity = rate, capacity
                old.level = min(old.level, capacity)

    def set_share(self, share: float, now: float) -> None:
        self.share = max(1e-6, share)
        self._rebuild(now)

    def configure(self, limits: Limits, now: float) -> None:
        self.configured = limits
        self._rebuild(now)

    # -- admission -----------------------------------------------------------------------------------

    def ready_in(self, ticket: Ticket, now: float) -> float:
        """Seconds until ``ticket`` could be admitted: 0.0 now, ``math.inf`` when only an answer ending
        (a free concurrent slot) can let it go."""
        if now < self.paused_until:
            return self.paused_until - now
        concurrent = self._limits.max_concurrent
        if concurrent is not None and self.running >= concurrent:
            return math.inf
        if not self.answered and self._limits.empty and self.running >= 1:
            return math.inf
        wait = 0.0
        for name, bucket in self._buckets.items():
            bucket.refill(now)
            wait = max(wait, bucket.wait(self._cost(name, ticket)))
        return wait

    @staticmethod
    def _cost(bucket: str, ticket: Ticket) -> float:
        if bucket == "requests":
            return 1.0
        if bucket == "tokens":
            return float(ticket.input_tokens + ticket.output_tokens)
        if bucket == "input":
            return float(ticket.input_tokens)
        return float(ticket.output_tokens)

    def admit(self, ticket: Ticket, now: float, *, waited: bool = False) -> None:
        """Take ``ticket``'s cost (call when :meth:`ready_in` is 0)."""
        for name, bucket in self._buckets.items():
            bucket.refill(now)
            bucket.level -= self._cost(name, ticket)
        self.running += 1
        self._seq += 1
        self._tokens_seq += ticket.input_tokens + ticket.output_tokens
        ticket.seq, ticket.tokens_seq, ticket.admitted_at = self._seq, self._tokens_seq, now
        self.stats.admitted += 1
        self.stats.admitted_input_tokens += ticket.input_tokens
        self.stats.admitted_output_tokens += ticket.output_tokens
        if waited:
            self.stats.waited += 1

    def release(self, ticket: Ticket, now: float, *, output_tokens: int | None = None) -> None:
        """``ticket``'s call ended; ``output_tokens`` (when known) settle its output reservation."""
        self.running = max(0, self.running - 1)
        if output_tokens is not None:
            bucket = self._buckets.get("output")
            if bucket is not None:
                bucket.refill(now)
                bucket.level = min(bucket.capacity, bucket.level + ticket.output_tokens - output_tokens)

    def estimate_wait(self, ahead: int, ahead_tokens: int, now: float) -> float:
        """Seconds a request behind ``ahead`` requests (of ``ahead_tokens`` tokens) may wait, roughly."""
        wait = max(0.0, self.paused_until - now)
        rates = [(b.rate, 1.0 if n == "requests" else None) for n, b in self._buckets.items()]
        estimate = 0.0
        for rate, per_request in rates:
            amount = ahead + 1 if per_request else ahead_tokens
            estimate = max(estimate, amount / rate if rate > 0 else 0.0)
        return wait + estimate

    # -- what the provider said ----------------------------------------------------------------------

    def answering(self, info: RateLimitInfo | None, now: float) -> None:
        """An attempt's answer began (its first data, so not a refusal): the one-at-a-time wait of a pool with
        nothing known ends now, not when that answer ends (a streamed turn can take minutes), and the limits
        its headers report hold from now. The attempt's end is observed as before."""
        if self.answered:
            return
        self.answered = True
        if info is not None and self._reports(info):
            self._learn(info)
        self._rebuild(now)

    def observe(self, ticket: Ticket, info: RateLimitInfo | None, now: float) -> None:
        """An answer (not a refusal) to ``ticket``, with the limits its headers reported."""
        first = not self.answered
        self.answered = True
        self._answers.append(now)
        while self._answers and self._answers[0] < now - 2.0:
            self._answers.popleft()
        if info is not None and self._reports(info):
            if self._learn(info) or self.aimd_rps is not None:
                self.aimd_rps = None
                self._rebuild(now)
        elif self.aimd_rps is not None and ticket.seq > self._decreased_at_seq:
            if self._slow_start:  # +1 a answer: the rate doubles every second until the next refusal
                self.aimd_rps += 1.0
            else:
                self.aimd_rps += self._aimd_step / max(self.aimd_rps, self.min_rate)
            self._rebuild(now)
        elif first:
            self._rebuild(now)
        if info is not None:
            self._sync(ticket, info, now)

    def refused(self, ticket: Ticket, info: RateLimitInfo | None, now: float) -> float:
        """A 429 to ``ticket``: pause the pool (until ``retry-after`` with jitter), learn what the answer
        says; with no rate known, decrease the AIMD rate. Returns the pause in seconds."""
        self.answered = True
        self.stats.refused += 1
        learned = info is not None and self._reports(info)
        if info is not None and learned:
            self._learn(info)
        retry_after = info.retry_after if info is not None else None
        # One decrease per rate: the requests admitted before the last decrease went at the old rate.
        unknown = not learned and (self.configured & self.learned).rpm is None
        if unknown and ticket.seq > self._decreased_at_seq:
            if self.aimd_rps is None:  # the first refusal: from the answers' rate, doubling (slow start)
                measured = len([t for t in self._answers if t >= now - 2.0]) / 2.0
                self.aimd_rps = max(self.min_rate, self.decrease * measured)
                self._slow_start = True
            else:
                self.aimd_rps = max(self.min_rate, self.decrease * self.aimd_rps)
                self._slow_start = False
            self._aimd_step = self.increase * self.aimd_rps
            self._decreased_at_seq = self._seq
        self._rebuild(now)
        rate = self._buckets["requests"].rate if "requests" in self._buckets else 1.0
        pause = retry_after if retry_after is not None else 1.0 / rate
        pause = min(60.0, pause) * (1.0 + self.jitter * self.rng.random())
        self.paused_until = max(self.paused_until, now + pause)
        bucket = self._buckets.get("requests")
        if bucket is not None:
            bucket.refill(now)
            bucket.level = min(bucket.level, 0.0)
        return pause

    @staticmethod
    def _reported(info: RateLimitInfo) -> Limits:
        def limit(dim: Dimension | None) -> float | None:
            return dim.limit if dim is not None and dim.limit else None

        return Limits(
            rpm=limit(info.requests),
            tpm=limit(info.tokens),
            input_tpm=limit(info.input_tokens),
            output_tpm=limit(info.output_tokens),
        )

    def _reports(self, info: RateLimitInfo) -> bool:
        return not self._reported(info).empty

    def _learn(self, info: RateLimitInfo) -> bool:
        """Take the limits ``info`` reports; True when they changed."""
        learned = self._reported(info)
        if learned.empty or learned == self.learned:
            return False
        self.learned = learned
        return True

    def _sync(self, ticket: Ticket, info: RateLimitInfo, now: float) -> None:
        """Bring the buckets down to what the provider says is left, less what went since ``ticket``."""
        since = self._seq - ticket.seq
        since_tokens = self._tokens_seq - ticket.tokens_seq
        for name, dim, newer in (
            ("requests", info.requests, float(since)),
            ("tokens", info.tokens, since_tokens),
        ):
            bucket = self._buckets.get(name)
            if bucket is None or dim is None or dim.remaining is None:
                continue
            bucket.refill(now)
            # what is left by the provider's count, refilled since it counted, less what went since
            left = dim.remaining * self.share + bucket.rate * max(0.0, now - ticket.admitted_at) - newer
            bucket.level = min(bucket.level, left)
