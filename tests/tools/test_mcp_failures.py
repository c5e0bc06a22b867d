"""Hostile MCP servers (design §3.9): one that crashes in the middle of a call, one that stops answering, one
that fails to start (at once, or on its restart), a command that does not exist. Each call such a server
cuts short gets an error result and an ``mcp_server_error`` event; the session goes on; the server is
started again on its next use, after a growing delay when it keeps failing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from tests.conftest import Recorder
from tests.tools.mcp_support import Model, alive, call, kill, results, stdio, wait_gone

pytest.importorskip("mcp")


@pytest.fixture(scope="module")
def world(provider: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    config = Config().with_overrides({"mcp": {"ping_timeout": 1.0, "restart_backoff": 60.0}})
    provider.add_responder("mcp-failures-model", Model())
    recorder = Recorder()
    with Runtime(config, sessions_dir=tmp_path_factory.mktemp("mcp-failures")) as rt:
        sub = rt.subscribe(callback=recorder)

        def start(**servers: Any) -> str:
            return str(
                rt.start_session(
                    model="openai/mcp-failures-model",
                    api_base=provider.url,
                    api_key="sk-local",
                    mcp_servers=servers,
                )
            )

        yield {"rt": rt, "start": start, "events": recorder}
        sub.close()


def errors(world: dict[str, Any], sid: str) -> list[Any]:
    return list(world["events"].of("mcp_server_error", sid))


def test_a_server_that_crashes_mid_call_is_restarted_on_its_next_use(world: dict[str, Any]) -> None:
    rt = world["rt"]
    sid = world["start"](t=stdio())
    (first,) = results(rt, sid, call("t__pid"))

    crashed, other = results(rt, sid, call("t__crash", ("t__slow", {"seconds": 5})))
    assert crashed.is_error and "went away during the call" in crashed.text
    assert crashed.metadata["mcp_server"] == "t"
    assert other.is_error  # the call in flight on the same connection is cut short too
    assert not alive(int(first.text))
    assert [e.kind for e in errors(world, sid)] == ["crashed"]

    (second,) = results(rt, sid, call("t__pid"))  # restarted on its next use
    assert not second.is_error and second.text != first.text
    assert [e.restarts for e in world["events"].of("mcp_server_started", sid)] == [0, 1]
    assert rt.prompt(sid, "anything else?").result(timeout=60).text == "plain answer"


@pytest.mark.slow  # three server starts and a timeout: ~20 s on a loaded machine
def test_a_server_that_stops_answering_is_restarted(world: dict[str, Any]) -> None:
    rt = world["rt"]
    sid = world["start"](t=stdio(timeout=3.0))
    (first,) = results(rt, sid, call("t__pid"))
    (frozen,) = results(rt, sid, call(("t__freeze", {"seconds": 120})))  # it answers nothing, not even pings
    assert frozen.is_error and frozen.metadata["error"] == "timeout"
    world["events"].wait_for(lambda evs: any(getattr(e, "kind", "") == "unresponsive" for e in evs), 30)
    assert not alive(int(first.text))  # stopped (stdin closed, then TERM)
    (second,) = results(rt, sid, call("t__pid"))
    assert not second.is_error and second.text != first.text


def test_a_server_that_fails_on_restart_is_not_respawned_at_every_call(
    world: dict[str, Any], tmp_path: Path
) -> None:
    rt = world["rt"]
    starts = tmp_path / "starts"
    sid = world["start"](t=stdio("--count-file", str(starts), "--fail-after", "1"))
    (crashed,) = results(rt, sid, call("t__crash"))
    assert crashed.is_error

    # The next turn starts it again (before its calls): it fails, and says why.
    (refused,) = results(rt, sid, call(("t__echo", {"text": "x"})))
    crash, failed_start = errors(world, sid)
    assert (crash.kind, failed_start.kind) == ("crashed", "start_failed")
    assert "this server refuses to start" in failed_start.message  # the tail of its stderr
    assert failed_start.retry_in == 60.0  # two failures in a row: the next start waits
    assert refused.is_error and "is down" in refused.text and "refuses to start" in refused.text

    (held,) = results(rt, sid, call(("t__echo", {"text": "x"})))
    assert held.is_error and "started again by a call from" in held.text
    assert len(starts.read_text().split()) == 2  # the first start and one restart: no third spawn
    assert len(errors(world, sid)) == 2
    assert rt.prompt(sid, "still there?").result(timeout=60).text == "plain answer"


def test_a_server_that_never_starts_leaves_the_session_working(world: dict[str, Any]) -> None:
    rt = world["rt"]
    token = "sk-never-printed-0123456789"
    sid = world["start"](
        bad=stdio("--fail-start", "--token", token), gone={"command": "/nonexistent/mcp-server"}
    )
    outcome = rt.prompt(sid, call(("bad__echo", {"text": "x"}))).result(timeout=90)
    assert outcome.status == "ok"
    (result,) = [m for m in rt.messages(sid) if m.role == "tool"]
    assert result.metadata["error"] == "unknown_tool"  # its tools never reached the model
    by_server = {e.server: e for e in errors(world, sid)}
    assert by_server["bad"].kind == "start_failed" and "refuses to start" in by_server["bad"].message
    assert by_server["gone"].kind == "start_failed" and "not found" in by_server["gone"].message
    # Its stderr quoted the command line: the credential on it is cut out of what the event says.
    assert "--token <withheld>" in by_server["bad"].message and token not in by_server["bad"].message
    assert rt.prompt(sid, "hello").result(timeout=60).text == "plain answer"


@pytest.mark.slow  # a runtime in a subprocess (it imports litellm): 10-30 s on a loaded machine
def test_a_server_does_not_outlive_a_killed_runtime(provider: Any, tmp_path: Path) -> None:
    """kill -9 of the runtime's process: its servers see their stdin close and exit."""
    script = f"""
import sys
from runtime import Runtime
from runtime.config import Config
from tests.tools.mcp_support import Model, call, results, stdio
from runtime.provider import LocalProvider

with LocalProvider() as provider:
    provider.add_responder("m", Model())
    rt = Runtime(Config(), sessions_dir={str(tmp_path)!r}).start()
    sid = rt.start_session(model="openai/m", api_base=provider.url, api_key="sk-local", mcp_servers={{"t": stdio()}})
    (pid,) = results(rt, sid, call("t__pid"))
    print(pid.text, flush=True)
    sys.stdin.read()
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path.cwd(),
    )
    try:
        assert proc.stdout is not None
        server = int(proc.stdout.readline())
        assert alive(server)
    finally:
        kill(proc.pid)
        proc.wait()
    assert wait_gone(server, timeout=30)
