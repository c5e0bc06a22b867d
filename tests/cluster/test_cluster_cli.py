"""``agentcell serve --shards N | --ray-address ADDR`` and ``agentcell demo --shards N`` (design §10.4)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from runtime.apps import cli


def test_serve_and_demo_take_shards_and_an_address(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, dict[str, Any]] = {}
    monkeypatch.setattr("runtime.apps.server.run_server", lambda **kw: calls.setdefault("serve", kw) and 0)
    monkeypatch.setattr("runtime.apps.demo.run_demo", lambda **kw: calls.setdefault("demo", kw) and 0)
    assert cli.main(["serve", "--shards", "3", "--ray-address", "head:6379", "--port", "0"]) == 0
    assert calls["serve"]["shards"] == 3 and calls["serve"]["ray_address"] == "head:6379"
    assert cli.main(["demo", "--shards", "2", "--plain"]) == 0
    assert calls["demo"]["shards"] == 2
    with pytest.raises(SystemExit):
        cli.main(["serve", "--shards", "0"])


def test_serve_with_a_bad_ray_address_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.apps.server import run_server

    assert run_server(port=0, token="t", ray_address="not an address") == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


@pytest.mark.slow
def test_the_demo_on_two_shards() -> None:
    pytest.importorskip("ray")
    from runtime.apps.demo import run_demo

    out = io.StringIO()
    assert run_demo(sessions=3, window=6_000, plain=True, shards=2, out=out) == 0, out.getvalue()[-2000:]
    assert "2 shards (Ray actors, one process each)" in out.getvalue()
