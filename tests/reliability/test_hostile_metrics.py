"""Clients choose model names (free text); ``/metrics`` must stay bounded whatever they choose.

20,000 distinct model names (most failing, many answering) leave the scrape of `agentcell serve` at a few
hundred series: the host's configured models and the first ``telemetry.metrics_max_models`` that answered
keep their names, everything else is counted as ``other``, and nothing is lost from the totals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime import Runtime
from runtime import events as ev
from runtime.apps.server import ApiServer
from runtime.config import Config
from runtime.messages import Usage
from runtime.provider.script import Fault, Turn

pytest.importorskip("prometheus_client")

TOKEN = "metrics-hostile-token-" + "m" * 20
NAMES = 20_000
CAP = 50


@pytest.fixture
def rt(sessions_dir: Path) -> Iterator[Runtime]:
    config = Config().with_overrides(
        {
            "telemetry.metrics_max_models": CAP,
            "models.context_windows": {"openai/the-hosts-model": 100_000},
        }
    )
    with Runtime(config, sessions_dir=sessions_dir) as runtime:
        yield runtime


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_twenty_thousand_model_names_leave_metrics_bounded(rt: Runtime, provider: Any) -> None:
    with (
        ApiServer(rt, TOKEN) as server,
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client,
    ):
        # over HTTP: the host's model, 10 made-up names that answer and 10 whose calls fail
        provider.add_script("the-hosts-model", [Turn(text="ok")])
        models = ["openai/the-hosts-model"]
        for i in range(10):
            provider.add_script(f"made-up-{i}", [Turn(text="ok")])
            provider.add_script(f"failing-{i}", [Turn(fault=Fault(kind="auth"))])
            models += [f"openai/made-up-{i}", f"openai/failing-{i}"]
        for model in models:
            body = {"model": model, "api_base": provider.url, "api_key": "sk-local"}
            sid = client.post("/sessions", json=body).json()["id"]
            result = client.post(f"/sessions/{sid}/prompt", json={"text": "hi", "wait": True})
            assert result.status_code == 200, result.text
        # then as many more as a client could send: calls under 20,000 names, half answering with usage
        for i in range(NAMES):
            sid = f"flood-{i % 100}"
            model = f"openai/flood-{i}"
            rt.bus.publish(ev.RequestStart(session_id=sid, turn_id="t", attempt=1, model=model, messages=1,
                                           estimated_tokens=1))  # fmt: skip
            if i % 2:
                rt.bus.publish(ev.TurnEnd(session_id=sid, turn_id="t", stop_reason="stop",
                                          usage=Usage(input_tokens=3, output_tokens=2, cost=0.001)))  # fmt: skip
            else:
                rt.bus.publish(ev.ErrorOccurred(session_id=sid, message="no", code=f"provider_made_up_{i}"))
        scrape = client.get("/metrics")
    assert scrape.status_code == 200
    found = samples(scrape.text)
    models = {labels["model"] for _, labels, _ in found if "model" in labels}
    outcomes = {labels["outcome"] for _, labels, _ in found if "outcome" in labels}
    assert "openai/the-hosts-model" in models and "other" in models
    assert len(models - {"openai/the-hosts-model", "other"}) <= CAP
    assert len(outcomes) <= 4 + 32 + 1  # ok, overflow, cancelled, error; 32 more; other
    assert len(found) < 2_000  # series of the whole scrape (the flood alone would be 60,000+)
    assert len(scrape.content) < 400_000
    # nothing is lost: every call is counted, under its name or under "other"
    calls = sum(v for name, _, v in found if name == "agentcell_provider_calls_total")
    assert calls == 21 + NAMES
    tokens = sum(
        v for name, labels, v in found if name == "agentcell_tokens_total" and labels["type"] == "input"
    )
    assert tokens >= 3 * (NAMES // 2)
    # names that answered first keep them; a name that never answered is not named
    assert {f"openai/made-up-{i}" for i in range(10)} <= models
    assert not any(m.startswith("openai/failing-") for m in models)
    failed = {"model": "other", "outcome": "auth"}
    assert [
        v for name, labels, v in found if name == "agentcell_provider_calls_total" and labels == failed
    ] == [10]
