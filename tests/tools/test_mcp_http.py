"""MCP tools over streamable HTTP (design §3.9): the test server (the ``mcp`` SDK's ``MCPServer``) served by
uvicorn in a subprocess on a free port; headers (one a secret) reach it, and the secret stays out of the
session's files; a server that goes away gives error results and events, and is reached again once back.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from tests.conftest import Recorder
from tests.tools.mcp_support import SERVER, Model, call, kill, results

pytest.importorskip("mcp")

SECRET = "Bearer mcp-http-secret-4fd1c2a9b8e7d6c5"


class HttpServer:
    """The test server over HTTP in a subprocess; :meth:`start` again brings it back on the same port."""

    def __init__(self) -> None:
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--http", "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())  # printed once it listens

    def kill(self) -> None:
        if self.proc is not None:
            kill(self.proc.pid)
            self.proc.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


@pytest.fixture(scope="module")
def server() -> Iterator[HttpServer]:
    srv = HttpServer()
    srv.start()
    yield srv
    srv.kill()


def test_tools_over_http_with_headers_and_no_secret_on_disk(
    server: HttpServer, provider: Any, tmp_path: Path
) -> None:
    provider.add_responder("mcp-http-model", Model())
    os.environ["AGENTCELL_TEST_HTTP_VALUE"] = "from the environment"
    recorder = Recorder()
    config = Config().with_overrides({"mcp": {"restart_backoff": 0.0}})
    try:
        with Runtime(config, sessions_dir=tmp_path / "sessions") as rt:
            rt.subscribe(callback=recorder)
            sid = rt.start_session(
                model="openai/mcp-http-model",
                api_base=provider.url,
                api_key="sk-local",
                mcp_servers={
                    "h": {
                        "url": server.url,
                        "headers": {"Authorization": SECRET, "X-Test": "${AGENTCELL_TEST_HTTP_VALUE}"},
                    }
                },
            )
            auth, plain, echo = results(
                rt,
                sid,
                call(
                    ("h__header", {"name": "authorization", "digest": True}),
                    ("h__header", {"name": "x-test"}),
                    ("h__echo", {"text": "hi"}),
                ),
            )
            digest = hashlib.sha256(SECRET.encode()).hexdigest()
            assert (auth.text, plain.text, echo.text) == (digest, "from the environment", "echo: hi")
            (started,) = recorder.of("mcp_server_started", sid)
            assert started.transport == "http"

            # The server goes away: the call fails and says so; once it is back, calls reach it again.
            server.kill()
            (lost,) = results(rt, sid, call(("h__echo", {"text": "anyone?"})))
            assert lost.is_error
            assert recorder.of("mcp_server_error", sid)
            server.start()
            (back,) = results(rt, sid, call(("h__echo", {"text": "back"})))
            assert back.text == "echo: back", back.text
            assert [e.restarts for e in recorder.of("mcp_server_started", sid)][-1] >= 1
    finally:
        os.environ.pop("AGENTCELL_TEST_HTTP_VALUE", None)
    files = [p for p in (tmp_path / "sessions").rglob("*") if p.is_file()]
    assert files and not [p for p in files if SECRET.encode() in p.read_bytes()]
    header = next(p for p in files if p.suffix == ".jsonl" and not p.name.endswith(".events.jsonl"))
    assert b"${AGENTCELL_TEST_HTTP_VALUE}" in header.read_bytes()  # a reference is kept as written
