"""Operating the server: SIGTERM/SIGINT drain a real ``agentcell serve`` (no new turns, running ones
finish or, past ``server.drain_timeout``, are aborted with a note in the log; exit 0), ``/healthz`` and
``/readyz`` without the token, and the JSON log format (runtime/apps/drain.py, serve_log.py).

Before this, SIGTERM ended the process at once (status 143) with the turn unanswered and its log ending
at the prompt.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.apps.drain import RETRY_AFTER
from runtime.apps.server import ApiServer
from runtime.provider.script import Turn
from tests.serve import serve_process

TOKEN = "drain-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
_names = itertools.count(1)


def _script(provider: Any, *turns: Turn) -> str:
    name = f"drain-{next(_names)}"
    provider.add_script(name, list(turns))
    return name


def _start_turn(url: str, provider: Any, model: str) -> str:
    created = httpx.post(
        f"{url}/sessions",
        headers=AUTH,
        json={"model": f"openai/{model}", "api_base": provider.url, "api_key": "sk-local"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    sid = str(created.json()["id"])
    events = f"{url}/events?session={sid}&type=request_start"
    with httpx.stream("GET", events, headers=AUTH, timeout=30) as stream:
        accepted = httpx.post(
            f"{url}/sessions/{sid}/prompt", headers=AUTH, json={"text": "go", "wait": False}, timeout=30
        )
        assert accepted.status_code == 202, accepted.text
        for line in stream.iter_lines():  # the turn has asked the provider (which answers late)
            if line == "event: request_start":
                break
    return sid


def _file(sessions: Path, name: str) -> Path:
    (path,) = sessions.rglob(name)
    return path


def _refused_while_draining(url: str, sid: str) -> None:
    deadline = time.monotonic() + 10
    while (ready := httpx.get(f"{url}/readyz", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, "/readyz still says ready after SIGTERM"
        time.sleep(0.02)
    assert ready.status_code == 503 and ready.json() == {"status": "draining"}
    assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "alive"}
    refused = httpx.post(f"{url}/sessions/{sid}/prompt", headers=AUTH, json={"text": "more"}, timeout=10)
    assert refused.status_code == 503 and refused.headers["retry-after"] == str(RETRY_AFTER)
    assert "shutting down" in refused.json()["error"]
    assert httpx.post(f"{url}/sessions", headers=AUTH, json={}, timeout=10).status_code == 503


@pytest.mark.slow  # an agentcell serve process
def test_sigterm_lets_the_running_turn_finish_then_exits_0(tmp_path: Path, provider: Any) -> None:
    model = _script(provider, Turn(text="finished while draining", latency=3.0))
    sessions = tmp_path / "sessions"
    with serve_process(sessions, "--token", TOKEN) as served:
        url = served.url
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200  # no token needed
        assert httpx.get(f"{url}/readyz", timeout=10).json() == {"status": "ready"}
        sid = _start_turn(url, provider, model)
        served.process.send_signal(signal.SIGTERM)
        _refused_while_draining(url, sid)
        assert served.process.wait(timeout=60) == 0  # not 143: the signal no longer kills it
    log = _file(sessions, f"{sid}.jsonl").read_text()
    assert "finished while draining" in log  # the turn was answered and flushed before the exit


@pytest.mark.slow  # an agentcell serve process
def test_a_turn_past_the_drain_timeout_is_aborted_and_logged_as_json(tmp_path: Path, provider: Any) -> None:
    model = _script(provider, Turn(text="never sent", latency=120.0))
    sessions = tmp_path / "sessions"
    args = ("--token", TOKEN, "--drain-timeout", "1", "--log-format", "json")
    with serve_process(sessions, *args) as served:
        assert json.loads(served.banner.splitlines()[-1])["message"].startswith("listening on")
        sid = _start_turn(served.url, provider, model)
        began = time.monotonic()
        served.process.send_signal(signal.SIGINT)
        assert served.process.wait(timeout=60) == 0
        took = time.monotonic() - began
        assert served.process.stderr is not None
        rest = served.process.stderr.read()
    assert 1.0 <= took < 30, took
    lines = [json.loads(line) for line in (served.banner + rest).splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    notes = [line["message"] for line in lines if sid in line["message"]]
    assert any("aborting the turn" in note and "server.drain_timeout" in note for note in notes), lines
    transcript = [
        json.loads(line) for line in _file(sessions, f"{sid}.events.jsonl").read_text().splitlines()
    ]
    assert [e["status"] for e in transcript if e["type"] == "agent_end"] == ["aborted"]
    assert "never sent" not in _file(sessions, f"{sid}.jsonl").read_text()


def test_probes_answer_without_the_token_and_a_draining_server_refuses_new_work(rt: Any) -> None:
    """In process: /healthz and /readyz need no token (every other route still does); once draining,
    readiness fails and every POST but an abort gets 503 with Retry-After; aborts and reads go through."""
    with ApiServer(rt, TOKEN) as server:
        url = server.url
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        assert httpx.get(f"{url}/sessions", timeout=10).status_code == 401
        server.drain.begin()
        _refused_while_draining(url, "s1")
        assert httpx.post(f"{url}/sessions/s1/abort", headers=AUTH, timeout=10).status_code == 404  # routed
        assert httpx.get(f"{url}/sessions/s1/messages", headers=AUTH, timeout=10).status_code == 404
        assert httpx.get(f"{url}/sessions", headers=AUTH, timeout=10).status_code == 200
        assert server.drain.finish(5) == []  # nothing running: nothing to abort
