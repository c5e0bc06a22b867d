"""Two shards on one limited key (design §10.5): the key sees its limit, not twice it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.cluster import ClusterRuntime
from runtime.cluster._capacity import lease_shares
from runtime.config import Config
from runtime.provider import LocalProvider


def test_shares_of_a_pool_add_up_to_one_and_follow_demand() -> None:
    leases = lease_shares({"a": {"k": 30, "j": 0}, "b": {"k": 10}, "c": {}})
    for pool in ("k", "j"):
        assert sum(leases[s][0][pool] for s in "abc") == pytest.approx(1.0)
    assert leases["a"][0]["k"] > leases["b"][0]["k"] > leases["c"][0]["k"] > 0  # a floor for the idle one
    assert leases["a"][0]["j"] == leases["c"][0]["j"] == pytest.approx(1 / 3)  # nobody waits: equal
    assert all(default == pytest.approx(1 / 3) for _, default in leases.values())
    assert lease_shares({}) == {}


@pytest.fixture
def limited() -> Iterator[LocalProvider]:
    with LocalProvider(rpm=600) as provider:  # 10 requests/s, a burst of 10
        yield provider


@pytest.fixture
def cluster(ray_cluster: Any, tmp_path: Path) -> Iterator[ClusterRuntime]:
    config = Config().with_overrides({"retry.base_delay": 0.05, "persistence.fsync": "never"})
    with ClusterRuntime(config, sessions_dir=tmp_path / "sessions", shards=2, shard_cpus=0.5) as rt:
        yield rt


def test_two_shards_on_one_limited_key_send_it_its_limit_not_twice_it(
    cluster: ClusterRuntime, limited: LocalProvider
) -> None:
    sids: dict[str, list[str]] = {name: [] for name in cluster.shards}
    n = 0
    while any(len(v) < 20 for v in sids.values()):
        sid = f"key-{n}"
        n += 1
        if len(bucket := sids[cluster.placement(sid)]) < 20:
            bucket.append(sid)
    every = [sid for bucket in sids.values() for sid in bucket]
    for sid in every:
        cluster.start_session(sid, model="openai/x", api_base=limited.url, api_key="sk-one", tools=None)
    time.sleep(1.2)  # a leasing round has seen every shard
    started = time.monotonic()
    handles = [cluster.prompt(sid, "hello") for sid in every]
    results = [h.result(timeout=120) for h in handles]
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok"] * 40, {r.error for r in results}
    admitted, refused = limited.limiter.counts("sk-one")
    assert refused / (admitted + refused) <= 0.05  # two shards each at the full rate: about a third refused
    assert elapsed >= (40 - 10) / 10 * 0.85  # the key's rate set the pace: 10 a second, not 20
    pools = cluster.capacity()
    assert {p.shard for p in pools} == set(cluster.shards)
    assert all(p.rpm is not None and p.rpm < 600 for p in pools)  # each shard has a part of the limit
