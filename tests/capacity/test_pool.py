"""A capacity pool (runtime.capacity._pool) against the local provider's own limiter, on a simulated clock.

The provider side is :class:`runtime.provider.limits.ProviderLimiter`, the buckets the local provider
answers with (a 429 and ``retry-after`` past them, OpenAI's headers or none): the pool must use the key's
limit and get almost no refusals, whatever it was told beforehand.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.capacity import Limits, Pool, Ticket, parse_rate_limit_headers
from runtime.provider.limits import ProviderLimiter


@dataclass
class Run:
    done: float
    refused: int
    refused_at: list[float]
    admitted_at: list[float]
    tokens_at: list[tuple[float, int]]


def simulate(
    pool: Pool,
    server: ProviderLimiter,
    requests: int,
    *,
    latency: float = 0.05,
    tokens: int = 0,
    seed: int = 1,
) -> Run:
    """``requests`` waiting at 0 s; each goes when the pool admits it, reaches the server 0-5 ms later and is
    answered ``latency`` later (refused at once). Returns when the last one is answered."""
    rng = random.Random(seed)
    now = 0.0
    waiting = [Ticket(flow=f"s{i}", input_tokens=tokens) for i in range(requests)]
    events: list[tuple[float, int, str, Ticket, dict[str, str]]] = []
    order = 0
    refused = 0
    refused_at: list[float] = []
    admitted_at: list[float] = []
    tokens_at: list[tuple[float, int]] = []
    answered = 0
    while answered < requests:
        while waiting and (wait := pool.ready_in(waiting[0], now)) == 0.0:
            ticket = waiting.pop(0)
            pool.admit(ticket, now)
            order += 1
            heapq.heappush(events, (now + rng.uniform(0.0, 0.005), order, "arrive", ticket, {}))
        next_event = events[0][0] if events else math.inf
        wake = now + wait if waiting and math.isfinite(wait) else math.inf
        now = min(next_event, wake)
        assert math.isfinite(now), "nothing can happen: the pool waits forever"
        if now < next_event:
            continue
        at, _, kind, ticket, headers = heapq.heappop(events)
        if kind == "arrive":
            decision = server.admit("key", ticket.input_tokens, at)
            order += 1
            if decision.admitted:
                admitted_at.append(at)
                tokens_at.append((at, ticket.input_tokens))
                heapq.heappush(events, (at + latency, order, "answer", ticket, decision.headers))
            else:
                hdrs = dict(decision.headers)
                hdrs["retry-after-ms"] = str(math.ceil((decision.retry_after or 0) * 1000))
                heapq.heappush(events, (at + 0.002, order, "refused", ticket, hdrs))
        elif kind == "answer":
            server.release("key")
            pool.release(ticket, at)
            pool.observe(ticket, parse_rate_limit_headers(headers, now=0.0), at)
            answered += 1
        else:
            refused += 1
            refused_at.append(at)
            pool.release(ticket, at)
            pool.refused(ticket, parse_rate_limit_headers(headers, now=0.0), at)
            waiting.insert(0, ticket)
    return Run(now, refused, refused_at, admitted_at, tokens_at)


def most_in_a_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while times[start] < t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_a_key_learned_from_headers_is_used_to_its_limit_without_refusals() -> None:
    pool = Pool("p", rng=random.Random(0))
    run = simulate(pool, ProviderLimiter(rpm=600), 400)
    assert pool.limits.rpm == 600
    assert run.refused <= 0.05 * 400
    assert run.done <= 1.1 * 400 / 10  # 10 requests/s


def test_a_configured_limit_paces_from_the_first_request() -> None:
    pool = Pool("p", Limits(rpm=600), rng=random.Random(0))
    run = simulate(pool, ProviderLimiter(rpm=600), 300)
    assert run.refused == 0
    assert run.done <= 1.1 * 300 / 10
    assert most_in_a_window(run.admitted_at, 1.0) <= 10 + 10  # a burst of one second's worth, then the rate


def test_max_concurrent_is_never_exceeded() -> None:
    pool = Pool("p", Limits(max_concurrent=3), rng=random.Random(0))
    seen = []
    original = pool.admit

    def admit(ticket: Ticket, now: float, *, waited: bool = False) -> None:
        original(ticket, now, waited=waited)
        seen.append(pool.running)

    pool.admit = admit  # type: ignore[method-assign]
    run = simulate(pool, ProviderLimiter(max_concurrent=3), 50, latency=0.2)
    assert max(seen) == 3 and run.refused == 0
    assert run.done == pytest.approx(0.2 * 50 / 3, rel=0.15)


def test_a_token_bound_key_keeps_under_its_tokens_per_minute() -> None:
    pool = Pool("p", rng=random.Random(0))
    server = ProviderLimiter(tpm=60_000)  # 1,000 tokens/s
    run = simulate(pool, server, 120, tokens=500)
    assert run.refused <= 6
    assert run.done <= 1.15 * 120 * 500 / 1_000
    assert pool.limits.tpm == 60_000


def test_a_provider_without_headers_is_learned_from_its_refusals() -> None:
    """No limits in any header: the first burst is refused (nothing said what the limit is), then the rate
    is learned: few refusals after the first second, and the batch within 1.25x of what the limit allows."""
    pool = Pool("p", rng=random.Random(0))
    run = simulate(pool, ProviderLimiter(rpm=600, headers=False), 600)
    assert pool.aimd_rps is not None and 6 < pool.aimd_rps < 14
    assert len([t for t in run.refused_at if t > 1.0]) <= 0.05 * 600
    assert run.done <= 1.25 * 600 / 10


def test_a_429_pauses_the_whole_pool_with_jitter() -> None:
    pool = Pool("p", Limits(rpm=6_000), rng=random.Random(3))
    ticket = Ticket(flow="a")
    pool.admit(ticket, 0.0)
    pause = pool.refused(ticket, parse_rate_limit_headers({"retry-after": "2"}, now=0.0), 0.1)
    assert 2.0 <= pause <= 2.5
    assert pool.ready_in(Ticket(flow="b"), 0.2) == pytest.approx(0.1 + pause - 0.2)
    assert pool.ready_in(Ticket(flow="b"), 0.1 + pause + 0.02) == 0.0


@settings(max_examples=30, deadline=None)
@given(
    rpm=st.sampled_from([120, 600, 3_000]),
    requests=st.integers(20, 200),
    latency=st.floats(0.01, 0.5),
    seed=st.integers(0, 1_000),
)
def test_the_pool_never_sends_more_than_the_limit_allows(
    rpm: int, requests: int, latency: float, seed: int
) -> None:
    """Configured or learned, the requests admitted in any minute stay within the limit plus one burst."""
    pool = Pool("p", Limits(rpm=rpm), rng=random.Random(seed))
    run = simulate(pool, ProviderLimiter(rpm=rpm), requests, latency=latency, seed=seed)
    assert run.refused == 0
    per_second = rpm / 60
    assert most_in_a_window(run.admitted_at, 5.0) <= per_second * 5 + max(1.0, per_second) + 1
