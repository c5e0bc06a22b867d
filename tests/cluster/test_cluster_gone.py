"""A cluster that goes away, and an address where something other than Ray answers (design §10): clear errors,
in seconds. Each runs in a child process with a Ray cluster of its own, which it then kills."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys, threading, time
import psutil
import runtime
from runtime.cluster import ClusterRuntime, ClusterUnavailable
from runtime.provider import LocalProvider

folder = sys.argv[1]
out = {}
with LocalProvider() as provider:
    began = time.monotonic()
    try:  # nothing connected yet: this is ray.init's own path, which would wait for minutes
        ClusterRuntime(sessions_dir=folder, address=f"127.0.0.1:{provider.port}").start()
    except ClusterUnavailable as exc:
        out["not_ray"] = [str(exc), time.monotonic() - began]

rt = ClusterRuntime(
    sessions_dir=folder, shards=1, shard_cpus=0.5, ray_init={"num_cpus": 1, "log_to_driver": False}
).start()
out["before"] = [i.id for i in rt.list_sessions()]
events = rt.subscribe("*")
ended = threading.Event()
threading.Thread(target=lambda: (list(events), ended.set()), daemon=True).start()

for process in psutil.Process().children(recursive=True):  # the cluster goes away: every Ray process
    process.kill()
began = time.monotonic()
errors = []
for call in (rt.list_sessions, lambda: rt.start_session("s", model="openai/x"), lambda: rt.prompt("s", "hi")):
    try:
        call()
        errors.append(None)
    except Exception as exc:
        errors.append([type(exc).__name__, str(exc)])
out["after"] = errors
out["subscription_ended"] = ended.wait(30)
out["seconds"] = time.monotonic() - began
print(json.dumps(out), flush=True)
os._exit(0)  # (Ray's exit handlers would try to reach the dead cluster)
"""


@pytest.mark.slow  # a child process that starts a Ray cluster of its own: 5-7 s idle, a minute under load
def test_a_cluster_that_goes_away_and_an_address_that_is_not_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the cluster tests need the ray extra: pip install -e '.[dev,ray]'")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "sessions")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the child printed no result (exit {child.returncode}):\n{child.stderr[-3000:]}"
    out = json.loads(lines[-1])

    message, seconds = out["not_ray"]
    assert "not as a Ray cluster" in message and seconds < 15

    assert out["before"] == []
    for error in out["after"]:  # every call says so at once, the same way
        assert error is not None and error[0] == "ClusterUnavailable", out["after"]
        assert "went away" in error[1] or "no Ray cluster" in error[1], error
    assert out["subscription_ended"]  # a subscriber is not left waiting for events that cannot come
    assert out["seconds"] < 60
