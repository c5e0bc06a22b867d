"""The capacity pools' Prometheus metrics (design §3.11, §7.5), scraped after sessions shared a limited key."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.provider import LocalProvider

pytest.importorskip("prometheus_client")


def test_pool_metrics_show_the_limit_the_queue_waits_and_refusals(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    config = Config().with_overrides({"persistence.fsync": "never"})
    with LocalProvider(rpm=600) as provider, Runtime(config, sessions_dir=tmp_path) as rt:
        metrics = rt.metrics()
        sids = [
            rt.start_session(model="openai/m", api_base=provider.url, api_key="sk-m", tools=None)
            for _ in range(25)
        ]
        handles = [rt.prompt(sid, "hi") for sid in sids]
        assert [h.result(timeout=60).status for h in handles] == ["ok"] * 25
        body, _ = metrics.exposition()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name.startswith("agentcell_capacity")
    }
    (pool,) = {dict(labels)["pool"] for _, labels in samples}
    assert pool.startswith(provider.url) and "sk-m" not in pool  # the key never shows, only its hash

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"pool": pool, "shard": "", **labels}.items())))]

    assert value("agentcell_capacity_limit", limit="rpm") == 600
    assert value("agentcell_capacity_admitted_total") == 25
    assert value("agentcell_capacity_refused_total") == 0
    assert value("agentcell_capacity_queued") == 0 and value("agentcell_capacity_running") == 0
    assert value("agentcell_capacity_admitted_tokens_total", type="input") > 25
    assert value("agentcell_capacity_wait_seconds_count") == 25
    assert value("agentcell_capacity_wait_seconds_sum") > 1.0  # 25 on a key of 10 a second: most waited
    assert value("agentcell_capacity_wait_seconds_bucket", le="0.0") < 25
