"""MCP servers through the applications (design §3.9, 7): ``agentcell chat --mcp`` and the HTTP API's
session body; and the promise that ``import runtime`` does not import the ``mcp`` SDK."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.apps.cli import build_parser
from runtime.store.entries import decode_entry
from runtime.store.sessions import SessionDirectory
from runtime.tools.mcp.servers import WITHHELD
from tests.tools.mcp_support import SERVER

pytest.importorskip("mcp")


def test_importing_the_runtime_does_not_import_the_mcp_sdk() -> None:
    code = (
        "import sys, runtime, runtime.host, runtime.tools, runtime.tools.mcp, runtime.apps.chat; "
        "from runtime.config import Config; Config().with_overrides({'mcp.servers': {'x': {'command': 'y'}}}); "
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd()
    )
    assert out.stdout.strip() == "[]"


def test_chat_takes_mcp_servers_from_the_command_line(tmp_path: Path) -> None:
    from runtime.apps.chat import run_chat

    args = build_parser().parse_args(
        [
            "chat",
            "--mcp",
            f"t={sys.executable} {SERVER}",
            "--mcp",
            "http://127.0.0.1:9/mcp",
            "--session",
            "c1",
        ]
    )
    assert args.mcp == [f"t={sys.executable} {SERVER}", "http://127.0.0.1:9/mcp"]
    out = io.StringIO()
    lines = iter(["hello there", "/quit"])
    status = run_chat(
        model=None,
        session_id="c1",
        sessions_dir=str(tmp_path),
        mcp=[f"t={sys.executable} {SERVER} --token sk-abcdef123456"],
        input_fn=lambda _: next(lines),
        out=out,
    )
    assert status == 0
    assert "[MCP server t ready: " in out.getvalue()
    header = decode_entry(SessionDirectory(tmp_path).log_path("c1").read_bytes().splitlines()[0])
    stored = header.mcp_servers["t"]  # type: ignore[union-attr]
    assert stored["command"] == sys.executable
    assert stored["args"] == [
        str(SERVER),
        "--token",
        WITHHELD,
    ]  # a credential on the command line is withheld


def test_a_bad_mcp_flag_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.apps.chat import run_chat

    status = run_chat(
        model=None, sessions_dir=str(tmp_path), mcp=["bad__name=echo hi"], input_fn=lambda _: "/quit"
    )
    assert status == 2
    assert "invalid MCP server name" in capsys.readouterr().err


def test_the_http_api_takes_mcp_servers_in_the_session_body(tmp_path: Path, provider: Any) -> None:
    from starlette.testclient import TestClient

    from runtime import Runtime
    from runtime.apps.server import create_app
    from runtime.config import Config

    stdio = {"command": sys.executable, "args": [str(SERVER)]}
    for allow in (False, True):
        config = Config().with_overrides(
            {"server": {"allow_mcp_commands": allow, "mcp_allowed_urls": ["http://127.0.0.1:9/"]}}
        )
        with (
            Runtime(config, sessions_dir=tmp_path / str(allow)) as rt,
            TestClient(create_app(rt, "t0k")) as client,
        ):
            auth = {"authorization": "Bearer t0k"}
            body = {
                "model": "openai/x",
                "api_base": provider.url,
                "api_key": "sk-local",
                "mcp_servers": {"t": stdio},
            }
            created = client.post("/sessions", json=body, headers=auth)
            if not allow:  # a command would run on the server's machine: refused unless the server allows it
                assert created.status_code == 403, created.text
                assert "allow_mcp_commands" in created.json()["error"]
                url = dict(body, mcp_servers={"h": {"url": "http://127.0.0.1:9/mcp"}})
                assert client.post("/sessions", json=url, headers=auth).status_code in (200, 201)
                bad = dict(body, mcp_servers={"a__b": {"url": "http://127.0.0.1:9/mcp"}})
                refused = client.post("/sessions", json=bad, headers=auth)
                assert refused.status_code == 400 and "MCP server name" in refused.json()["error"]
                continue
            assert created.status_code in (200, 201), created.text
            sid = created.json()["id"]
            assert rt._session(sid).spec.mcp_servers["t"].command == sys.executable
            assert json.dumps(rt._session(sid).spec.mcp_servers["t"].args) == json.dumps([str(SERVER)])


def test_a_resumed_session_gets_its_servers_back_from_its_log_without_secrets(
    tmp_path: Path, provider: Any
) -> None:
    from runtime import Runtime
    from runtime.config import Config
    from tests.conftest import Recorder
    from tests.tools.mcp_support import Model

    provider.add_responder("mcp-resume-model", Model())
    secret = "ghp_0123456789abcdefABCDEF"
    servers = {
        "t": {"command": sys.executable, "args": [str(SERVER)], "env": {"GITHUB_TOKEN": secret, "MODE": "x"}}
    }
    recorder = Recorder()
    with Runtime(Config(), sessions_dir=tmp_path) as rt:
        rt.subscribe(callback=recorder)
        rt.start_session(
            "r1",
            model="openai/mcp-resume-model",
            api_base=provider.url,
            api_key="sk-local",
            mcp_servers=servers,
        )
        rt.stop_session("r1")
        header = SessionDirectory(tmp_path).read_header("r1")  # (never used: its header is in the index)
        assert header is not None
        stored = header.mcp_servers["t"]
        assert (
            stored["env"] == {"GITHUB_TOKEN": WITHHELD, "MODE": "x"} and stored["command"] == sys.executable
        )

        rt.resume_session("r1", api_key="sk-local")
        assert rt.prompt("r1", "hello").result(timeout=60).text == "plain answer"  # the session goes on
        recorder.wait_type("agent_end")  # the callback's thread has the turn's events
        (failed,) = recorder.of("mcp_server_error", "r1")
        assert failed.kind == "start_failed" and "env GITHUB_TOKEN" in failed.message
        assert "resume_session(mcp_servers=" in failed.message
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
