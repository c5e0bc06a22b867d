"""Codex CLI (``@openai/codex`` from npm, a client nobody here wrote) against ``agentcell serve``: ``codex exec``
with Codex's default request shape (no proxy in between), a scripted local model that calls Codex's
``exec_command`` and then answers, and ``codex exec resume --last`` going on from there.

Codex runs in a temporary ``CODEX_HOME`` whose ``config.toml`` names agentcell as its model provider
(``wire_api = "responses"``, the server's token in an environment variable), so it never touches the network.
Without ``codex`` on PATH the test installs it with npm (``.ci/run`` does so first); it skips only when npm is
absent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.provider.script import ToolCallSpec, Turn
from tests.serve import serve_process

pytestmark = pytest.mark.slow

TOKEN = "codex-token"
MARKER = "agentcell-codex-marker-4711"


def codex_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    found = os.environ.get("AGENTCELL_CODEX") or shutil.which("codex")
    if found:
        return found
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is absent: Codex CLI (@openai/codex) cannot be installed")
    prefix = tmp_path_factory.mktemp("codex-npm")
    subprocess.run([npm, "install", "--prefix", str(prefix), "@openai/codex"], check=True, timeout=600)
    return str(prefix / "node_modules" / ".bin" / "codex")


def codex_home(path: Path, base_url: str) -> Path:
    path.mkdir()
    (path / "config.toml").write_text(
        f"""model = "openai/codex-script"
model_provider = "agentcell"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.agentcell]
name = "agentcell"
base_url = "{base_url}/v1"
env_key = "AGENTCELL_CODEX_TOKEN"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
    )
    return path


def test_codex_exec_runs_a_tool_through_agentcell_and_resumes(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    codex = codex_binary(tmp_path_factory)
    provider.add_script(
        "codex-script",
        [
            Turn(
                reasoning="Read the file first.",
                tool_calls=(
                    ToolCallSpec(name="exec_command", arguments=json.dumps({"cmd": "cat note.txt"})),
                ),
            ),
            Turn(text="The note holds the marker."),
            Turn(text="Still here after the resume."),
        ],
    )
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)  # (the server's provider settings, inherited)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text(f"{MARKER}\n")
    with serve_process(tmp_path / "sessions", "--token", TOKEN) as served:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "CODEX_HOME": str(codex_home(tmp_path / "codex-home", served.url)),
            "AGENTCELL_CODEX_TOKEN": TOKEN,
        }

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [codex, "exec", "--skip-git-repo-check", *args],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
                stdin=subprocess.DEVNULL,
            )

        first = run("What does note.txt say?")
        assert first.returncode == 0, first.stderr[-3000:]
        assert "The note holds the marker." in first.stdout, first.stdout + first.stderr[-3000:]
        second = run("resume", "--last", "Are you still there?")
        assert second.returncode == 0, second.stderr[-3000:]
        assert "Still here after the resume." in second.stdout, second.stdout + second.stderr[-3000:]
        sessions = httpx.get(f"{served.url}/sessions", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        # Codex keeps its history itself (store: false): all three requests went on in one session
        assert len(sessions["sessions"]) == 1, sessions

    requests = [r.body for r in provider.request_log if r.model == "codex-script"]
    assert len(requests) == 3
    # Codex ran the call in its own sandbox and sent the output back: the model saw the file's content
    outputs = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert outputs and MARKER in outputs[0]["content"]
    # the resumed run sent the history again (store: false); the model saw the whole conversation
    last = requests[2]["messages"]
    assert MARKER in json.dumps(last) and last[-1] == {"role": "user", "content": "Are you still there?"}
    assert "exec_command" in [t["function"]["name"] for t in requests[0]["tools"]]
