"""Admission control on the I/O loop: the shell around :mod:`runtime.capacity` (design §3.11).

Every provider call of the runtime asks its pool for capacity before each attempt. When the pool has it and
nobody waits, the call goes at once (no await, no event). Otherwise it waits in the pool's fair queue -- an
asyncio future on the loop, never a thread -- until the pool's buckets hold its cost; one timer per pool
wakes the queue when the head can go, and an answer ending wakes it too (a concurrent slot freed). A call
that waits longer than its budget (the rest of its turn's ``capacity.queue_timeout``) ends with a
``rate_limited`` error naming the pool and the wait. Waiting uses none of a call's retry attempts; a 429
pauses the pool and puts the call back in the queue, also without an attempt, up to
``capacity.max_refusals`` times.

Thread-safety: everything here runs on the loop thread, except :meth:`AdmissionControl.snapshot` (a
consistent-enough read for metrics and the dashboard from any thread).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import msgspec

from runtime.capacity import FairQueue, Limits, Pool, RateLimitInfo, Ticket, pool_for
from runtime.config import CapacityConfig, LimitConfig
from runtime.errors import AgentcellError

__all__ = ["WAIT_BUCKETS", "AdmissionControl", "PoolSnapshot", "PoolState", "QueueTimeout", "limits_of"]

WAIT_BUCKETS: Final = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the wait histogram's buckets."""

OnQueued = Callable[[str, int, float], object]
"""``(pool, position, estimated_wait)`` when a call starts waiting."""


class QueueTimeout(AgentcellError):
    """A call waited past its budget for a pool's capacity."""

    def __init__(self, pool: str, waited: float, budget: float) -> None:
        super().__init__(pool, waited, budget)
        self.pool = pool
        self.waited = waited
        self.budget = budget


class PoolSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A pool as the metrics and the dashboard show it."""

    name: str
    queued: int
    running: int
    paused_for: float
    rpm: float | None
    tpm: float | None
    input_tpm: float | None
    output_tpm: float | None
    max_concurrent: int | None
    learned: bool
    admitted: int
    admitted_input_tokens: int
    admitted_output_tokens: int
    refused: int
    waited: int
    share: float = 1.0
    wait_counts: tuple[int, ...] = ()
    wait_sum: float = 0.0
    shard: str = ""
    """The cluster shard whose pool this is (``ClusterRuntime.capacity``); empty in a plain runtime."""


def limits_of(config: LimitConfig) -> Limits:
    return Limits(
        rpm=config.rpm,
        tpm=config.tpm,
        input_tpm=config.input_tpm,
        output_tpm=config.output_tpm,
        max_concurrent=config.max_concurrent,
    )


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    future: asyncio.Future[None]
    since: float

    @property
    def flow(self) -> str:
        return self.ticket.flow

    @property
    def priority(self) -> int:
        return self.ticket.priority

    @property
    def weight(self) -> float:
        return self.ticket.weight


@dataclass(eq=False)
class PoolState:
    """A pool, its queue and its wake-up timer (owned by the loop thread)."""

    pool: Pool
    queue: FairQueue[_Waiter] = field(default_factory=FairQueue)
    queued_tokens: int = 0
    timer: asyncio.TimerHandle | None = None
    timer_at: float = math.inf
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    """How many admitted calls waited up to each of :data:`WAIT_BUCKETS` seconds (the last: longer)."""
    wait_sum: float = 0.0

    def record_wait(self, seconds: float) -> None:
        index = next((i for i, bound in enumerate(WAIT_BUCKETS) if seconds <= bound), len(WAIT_BUCKETS))
        self.wait_counts[index] += 1
        self.wait_sum += seconds


class AdmissionControl:
    """The pools of one runtime and the waiting calls (see the module docstring)."""

    def __init__(
        self,
        config: CapacityConfig | None = None,
        limits: Mapping[str, LimitConfig] | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or CapacityConfig()
        self._configured = {name: limits_of(c) for name, c in (limits or {}).items()}
        self._rng = rng or random.Random()
        self._clock = clock
        self._pools: dict[str, PoolState] = {}
        self._share = 1.0
        self.on_change: Callable[[PoolState], object] | None = None
        """Called (on the loop) when a pool's limits or state changed; the cluster's lease uses it."""

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def pool(self, *, model: str, endpoint: str, api_key: str | None) -> PoolState:
        name, configured = pool_for(
            model=model,
            endpoint=endpoint,
            api_key=api_key,
            group_by=self.config.group_by,
            configured=self._configured,
        )
        state = self._pools.get(name)
        if state is None:
            pool = Pool(
                name,
                configured,
                headroom=self.config.headroom,
                burst=self.config.burst,
                jitter=self.config.jitter,
                rng=self._rng,
                now=self._clock(),
            )
            if self._share != 1.0:
                pool.set_share(self._share, self._clock())
            state = self._pools[name] = PoolState(pool)
        return state

    def set_shares(self, shares: Mapping[str, float], default: float) -> None:
        """This process's part of each pool's limits (``shares`` by pool name; ``default`` for the others
        and those made later): the lease of a cluster shard (:mod:`runtime.cluster._capacity`)."""
        self._share = default
        now = self._clock()
        for name, state in self._pools.items():
            share = shares.get(name, default)
            if share != state.pool.share:
                state.pool.set_share(share, now)
                self._pump(state)

    def ticket(
        self, flow: str, priority: int, weight: float, input_tokens: int, output_cap: int | None
    ) -> Ticket:
        output = output_cap if output_cap is not None else self.config.default_output_tokens
        return Ticket(
            flow=flow, priority=priority, weight=weight, input_tokens=input_tokens, output_tokens=output
        )

    async def acquire(
        self, state: PoolState, ticket: Ticket, budget: float | None, on_queued: OnQueued | None
    ) -> float:
        """Wait until ``state``'s pool admits ``ticket``; the seconds waited. Raises :class:`QueueTimeout`
        after ``budget`` seconds (None: no limit). Cancelling the awaiting task takes it out of the queue."""
        pool = state.pool
        now = self._clock()
        if not state.queue and pool.ready_in(ticket, now) == 0.0:
            pool.admit(ticket, now)
            state.record_wait(0.0)
            return 0.0
        if budget is not None and budget <= 0:
            raise QueueTimeout(pool.name, 0.0, 0.0)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(ticket, loop.create_future(), now)
        ahead, ahead_tokens = len(state.queue), state.queued_tokens
        state.queue.push(waiter)
        state.queued_tokens += ticket.input_tokens + ticket.output_tokens
        if on_queued is not None:
            on_queued(pool.name, ahead + 1, round(pool.estimate_wait(ahead, ahead_tokens, now), 3))
        self._pump(state)
        try:
            if budget is None:
                await waiter.future
            else:
                await asyncio.wait_for(asyncio.shield(waiter.future), budget)
        except TimeoutError:
            if self._forget(state, waiter):
                self._pump(state)
                raise QueueTimeout(pool.name, self._clock() - now, budget or 0.0) from None
            # admitted in the same instant the budget ran out: it goes
        except asyncio.CancelledError:
            if not self._forget(state, waiter):  # already admitted: give the capacity back
                pool.release(ticket, self._clock())
            self._pump(state)
            raise
        waited = self._clock() - now
        state.record_wait(waited)
        return waited

    def _forget(self, state: PoolState, waiter: _Waiter) -> bool:
        """Take a waiter out of the queue; False when it was admitted already."""
        if state.queue.remove(waiter):
            state.queued_tokens -= waiter.ticket.input_tokens + waiter.ticket.output_tokens
            return True
        return False

    def release(
        self,
        state: PoolState,
        ticket: Ticket,
        *,
        output_tokens: int | None = None,
        info: RateLimitInfo | None = None,
        answered: bool = False,
    ) -> None:
        """``ticket``'s attempt ended (``answered``: with an answer, whose headers said ``info``)."""
        now = self._clock()
        state.pool.release(ticket, now, output_tokens=output_tokens)
        if answered:
            state.pool.observe(ticket, info, now)
        self._pump(state)

    def answering(self, state: PoolState, info: RateLimitInfo | None) -> None:
        """An attempt's answer began: a pool that let one call go at a time lets the queue go."""
        if state.pool.answered:
            return
        state.pool.answering(info, self._clock())
        self._pump(state)

    def refused(self, state: PoolState, ticket: Ticket, info: RateLimitInfo | None) -> float:
        """``ticket``'s attempt got a 429: the pool pauses; the seconds it pauses."""
        now = self._clock()
        state.pool.release(ticket, now)
        pause = state.pool.refused(ticket, info, now)
        self._pump(state)
        return pause

    # -- the queue ------------------------------------------------------------------------------------

    def _pump(self, state: PoolState) -> None:
        """Admit from the head of the queue while the pool has capacity; then arm the timer."""
        pool, queue = state.pool, state.queue
        now = self._clock()
        while queue:
            waiter = queue.head()
            assert waiter is not None
            if waiter.future.done():  # cancelled: its task takes it out; skip it now
                self._forget(state, waiter)
                continue
            wait = pool.ready_in(waiter.ticket, now)
            if wait > 0.0:
                if math.isfinite(wait):
                    self._arm(state, now + wait)
                break
            queue.pop()
            state.queued_tokens -= waiter.ticket.input_tokens + waiter.ticket.output_tokens
            pool.admit(waiter.ticket, now, waited=True)
            waiter.future.set_result(None)
        if self.on_change is not None:
            self.on_change(state)

    def _arm(self, state: PoolState, at: float) -> None:
        if state.timer is not None and state.timer_at <= at + 1e-4:
            return
        if state.timer is not None:
            state.timer.cancel()
        loop = asyncio.get_running_loop()
        state.timer_at = at
        state.timer = loop.call_at(loop.time() + max(0.0, at - self._clock()), self._wake, state)

    def _wake(self, state: PoolState) -> None:
        state.timer, state.timer_at = None, math.inf
        self._pump(state)

    # -- what is seen from outside --------------------------------------------------------------------

    def snapshot(self) -> list[PoolSnapshot]:
        now = self._clock()
        out = []
        for name, state in list(self._pools.items()):
            pool, stats, limits = state.pool, state.pool.stats, state.pool.limits
            out.append(
                PoolSnapshot(
                    name=name,
                    queued=len(state.queue),
                    running=pool.running,
                    paused_for=round(max(0.0, pool.paused_until - now), 3),
                    rpm=limits.rpm,
                    tpm=limits.tpm,
                    input_tpm=limits.input_tpm,
                    output_tpm=limits.output_tpm,
                    max_concurrent=limits.max_concurrent,
                    learned=not pool.learned.empty or pool.aimd_rps is not None,
                    admitted=stats.admitted,
                    admitted_input_tokens=stats.admitted_input_tokens,
                    admitted_output_tokens=stats.admitted_output_tokens,
                    refused=stats.refused,
                    waited=stats.waited,
                    share=pool.share,
                    wait_counts=tuple(state.wait_counts),
                    wait_sum=state.wait_sum,
                )
            )
        return out
