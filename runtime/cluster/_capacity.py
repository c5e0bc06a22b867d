"""One budget per provider key across the shards (design §10.5): the front leases each shard its part.

Each shard's runtime paces its calls against its own pools (design §3.11); alone, two shards on one key
would send it twice its limit. The front is the coordinator: every :data:`INTERVAL` seconds it asks each
live shard for its pools (calls waiting and in flight, by pool) and gives each shard a share of each pool
(:func:`lease_shares`): a floor for every shard (so that a shard's first call never waits for the next
round) and the rest in proportion to demand. The shares of a pool add up to 1, so the key sees its limit,
not N times it. A pool no shard has used yet gets ``1 / N`` on every shard. Shards joining or leaving are
in the next round.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

log = logging.getLogger("agentcell.cluster")

__all__ = ["INTERVAL", "Leases", "lease_shares"]

INTERVAL: Final = 0.5
"""Seconds between two rebalancing rounds."""
FLOOR: Final = 0.25
"""Of an equal share (1 / N), what every shard keeps whatever its demand (the rest follows demand)."""


def lease_shares(
    demand: Mapping[str, Mapping[str, int]], *, floor: float = FLOOR
) -> dict[str, tuple[dict[str, float], float]]:
    """Each shard's shares: ``demand[shard][pool]`` is what the shard has waiting or in flight on the pool.
    Returns, by shard, its share of each pool and the share of pools not listed (``1 / N``)."""
    shards = list(demand)
    if not shards:
        return {}
    n = len(shards)
    equal = 1.0 / n
    pools = {pool for by_pool in demand.values() for pool in by_pool}
    out: dict[str, tuple[dict[str, float], float]] = {shard: ({}, equal) for shard in shards}
    for pool in pools:
        wants = [max(0, demand[shard].get(pool, 0)) for shard in shards]
        total = sum(wants)
        for shard, want in zip(shards, wants):
            out[shard][0][pool] = equal if total == 0 else floor * equal + (1.0 - floor) * want / total
    return out


class Leases:
    """The front's rebalancing thread: asks the shards for their pools, sets their shares."""

    def __init__(
        self,
        shards: Callable[[], Sequence[tuple[str, Any]]],
        *,
        interval: float = INTERVAL,
    ) -> None:
        self._shards = shards  # the live shards: (name, Ray actor handle)
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def start(self) -> None:
        self.rebalance()  # before any session runs: no shard starts with the whole limit
        self._thread = threading.Thread(target=self._run, name="agentcell-cluster-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.rebalance()
            except Exception:  # a shard dying mid-round: the next round goes without it
                log.debug("rebalancing the capacity leases failed", exc_info=True)

    def rebalance(self) -> None:
        import ray

        shards = list(self._shards())
        if not shards:
            return
        refs = [actor.capacity.remote() for _, actor in shards]
        demand: dict[str, dict[str, int]] = {}
        for (name, _), ref in zip(shards, refs):
            try:
                pools = ray.get(ref, timeout=10)
            except Exception:
                continue
            demand[name] = {p.name: p.queued + p.running for p in pools}
        leases = lease_shares(demand)
        sets = [actor.set_capacity_shares.remote(*leases[name]) for name, actor in shards if name in leases]
        ray.wait(sets, num_returns=len(sets), timeout=10)
        self.rounds += 1
