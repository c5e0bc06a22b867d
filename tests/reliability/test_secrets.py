"""Secrets (design §9): a run with an API key leaves no trace of it in sessions, transcripts, events or logs.

One runtime does everything that writes something down — turns with file tools and a shell, retries,
provider errors (one from a provider that echoes the key back), compactions (with their artifacts), an
overflow, a crash, hibernation and resume — with the key given to the session and in the environment.
Then every file under the sessions directory, every event and everything logged is searched for it.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.events import encode_event
from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.conftest import RPM
from tests.reliability.support import EventLog, grep_tree

_names = iter(range(1, 1_000_000))


class _EchoingAuthError(BaseHTTPRequestHandler):
    """A provider that rejects every key and quotes it back in the error, as some real ones do."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        key = self.headers.get("authorization", "").removeprefix("Bearer ")
        body = json.dumps(
            {
                "error": {
                    "message": f"Incorrect API key provided: {key}. Check your key and try again.",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # keep the test output clean
        pass


@pytest.fixture
def echoing_provider() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoingAuthError)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def script(provider: Any, *turns: Turn, loop: bool = False) -> str:
    name = f"secrets-{next(_names)}"
    provider.add_script(name, list(turns), loop=loop)
    return f"openai/{name}"


def test_an_api_key_leaves_no_trace(
    sessions_dir: Path,
    workspace: Path,
    provider: Any,
    echoing_provider: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    key = "sk-secret-" + secrets.token_hex(16)
    env_key = "sk-env-secret-" + secrets.token_hex(16)
    monkeypatch.setenv("OPENAI_API_KEY", env_key)
    caplog.set_level(logging.DEBUG)  # everything any logger says, at every level
    (workspace / "notes.txt").write_text("nothing secret here\n")
    events = EventLog()
    summarizer = script(provider, Turn(text="## Goal\nKeep going."), loop=True)
    # (the overflow's compaction has little to take away here: any reduction will do, so the turn goes on)
    config = {
        "agent.shell_enabled": True,
        "compaction.summarizer_model": summarizer,
        "compaction.min_reduction": 0.01,
    }
    tools_turn = Turn(
        tool_calls=(
            ToolCallSpec(name="read_file", arguments='{"path": "notes.txt"}'),
            ToolCallSpec(name="write_file", arguments='{"path": "out.txt", "content": "done"}'),
            ToolCallSpec(name="shell", arguments='{"command": "env; echo \\"key=$OPENAI_API_KEY\\""}'),
        )
    )
    model = script(
        provider,
        tools_turn,
        Turn(text="tools done " * 20),
        Turn(fault=Fault(kind="rate_limit", retry_after=0.01, rpm=RPM)),
        Turn(text="after a retry " * 20),
        Turn(fault=Fault(kind="auth")),
        Turn(fault=Fault(kind="overflow")),
        Turn(text="after an overflow"),
        Turn(text="after a crash"),
        Turn(text="after resuming"),
    )
    with Runtime(Config().with_overrides({"retry.base_delay": 0.01}), sessions_dir=sessions_dir) as rt:
        rt.subscribe("*", callback=events)
        sid = rt.start_session(
            model=model,
            api_base=provider.url,
            api_key=key,
            tools="builtin",
            workspace=workspace,
            config=config,
            system_prompt="Be careful.",
        )
        statuses = [rt.prompt(sid, f"step {i}").result(timeout=60).status for i in range(3)]
        assert statuses == ["ok", "ok", "error"]  # tools, a retried rate limit, an auth failure
        assert rt.compact(sid).result(timeout=60).compacted  # summarizer call, artifacts
        assert rt.prompt(sid, "overflow").result(timeout=60).text == "after an overflow"
        rt._session(sid).refs.agent.tell(object())  # a crash, logged with its traceback
        events.wait_for(sid, "agent_recovered", 1)
        assert rt.prompt(sid, "crash").result(timeout=60).text == "after a crash"
        assert rt.hibernate(sid)
        rt.stop_session(sid)
        rt.resume_session(sid, api_key=key)
        assert rt.prompt(sid, "resume").result(timeout=60).text == "after resuming"

        # The key from the environment, and a provider that quotes the key back in its error.
        env_sid = rt.start_session(model=script(provider, Turn(text="env key")), api_base=provider.url)
        assert rt.prompt(env_sid, "hi").result(timeout=60).text == "env key"
        echo_sid = rt.start_session(model="openai/any", api_base=echoing_provider, api_key=key)
        rejected = rt.prompt(echo_sid, "hi").result(timeout=60)
        assert rejected.status == "error" and "Incorrect API key" in (rejected.error or "")
        assert key not in (rejected.error or "")
        shell = next(m for m in rt.messages(sid) if m.role == "tool" and m.name == "shell")
        assert "key=\n" in shell.text or shell.text.rstrip().endswith("key=")  # not passed to commands

    needles = [key.encode(), env_key.encode()]
    assert sorted(p.name for p in sessions_dir.iterdir())  # the runtime did write things down ...
    assert not grep_tree(sessions_dir, needles)  # ... and none of them holds a key
    assert not grep_tree(workspace, needles)
    for event in events.all():
        encoded = encode_event(event)
        assert key.encode() not in encoded and env_key.encode() not in encoded, event.type
    logged = caplog.text
    captured = capfd.readouterr()
    for secret in (key, env_key):
        assert secret not in logged
        assert secret not in captured.out and secret not in captured.err
    assert len(events.all()) > 50 and caplog.records  # there was plenty to search
