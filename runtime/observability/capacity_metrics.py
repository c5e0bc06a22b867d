"""Prometheus metrics of the capacity pools (design §3.11, §7.5), read from ``runtime.capacity()`` at scrape.

    capacity_queued{pool, shard}                 gauge      calls waiting for the pool's capacity
    capacity_running{pool, shard}                gauge      calls in flight on the pool
    capacity_limit{pool, shard, limit}           gauge      the limits in force: rpm, tpm, input_tpm,
                                                            output_tpm, max_concurrent (configured or learned)
    capacity_refused_total{pool, shard}          counter    429s the provider answered
    capacity_admitted_total{pool, shard}         counter    calls the pool let go
    capacity_admitted_tokens_total{pool, shard, type}  counter  input and output (cap) tokens admitted:
                                                            ``rate()`` of it is the admitted tokens/s
    capacity_wait_seconds{pool, shard}           histogram  how long each admitted call waited

``shard`` is empty in a plain runtime; a cluster's pools are per shard (each has its lease, §10.5).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from runtime.gateway import WAIT_BUCKETS, PoolSnapshot

__all__ = ["capacity_families"]

_LIMITS = ("rpm", "tpm", "input_tpm", "output_tpm", "max_concurrent")


def capacity_families(pools: Iterable[PoolSnapshot]) -> Iterator[Any]:
    """The metric families of ``pools`` (needs ``prometheus-client``)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    labels = ["pool", "shard"]
    queued = GaugeMetricFamily(
        "agentcell_capacity_queued", "Calls waiting for the pool's capacity.", labels=labels
    )
    running = GaugeMetricFamily("agentcell_capacity_running", "Calls in flight on the pool.", labels=labels)
    limit = GaugeMetricFamily(
        "agentcell_capacity_limit",
        "The pool's limits in force (per minute; max_concurrent in calls), configured or learned.",
        labels=[*labels, "limit"],
    )
    refused = CounterMetricFamily("agentcell_capacity_refused", "429s the provider answered.", labels=labels)
    admitted = CounterMetricFamily("agentcell_capacity_admitted", "Calls the pool let go.", labels=labels)
    tokens = CounterMetricFamily(
        "agentcell_capacity_admitted_tokens",
        "Tokens admitted: input (exact) and output (the cap reserved).",
        labels=[*labels, "type"],
    )
    wait = HistogramMetricFamily(
        "agentcell_capacity_wait_seconds", "How long each admitted call waited for capacity.", labels=labels
    )
    for pool in pools:
        key = [pool.name, pool.shard]
        queued.add_metric(key, pool.queued)
        running.add_metric(key, pool.running)
        for name in _LIMITS:
            value = getattr(pool, name)
            if value is not None:
                limit.add_metric([*key, name], float(value))
        refused.add_metric(key, pool.refused)
        admitted.add_metric(key, pool.admitted)
        tokens.add_metric([*key, "input"], pool.admitted_input_tokens)
        tokens.add_metric([*key, "output"], pool.admitted_output_tokens)
        if pool.wait_counts:
            cumulative, buckets = 0, []
            for bound, count in zip((*WAIT_BUCKETS, float("inf")), pool.wait_counts):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            wait.add_metric(key, buckets, pool.wait_sum)
    yield from (queued, running, limit, refused, admitted, tokens, wait)
