"""The ``agentcell`` command line: fast help that imports nothing heavy, argument checks, and the
``sessions`` command over a real sessions directory."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from runtime.apps.cli import main
from runtime.apps.sessions_cli import run_sessions
from runtime.provider.script import ToolCallSpec, Turn
from runtime.store.sessions import SessionDirectory

HEAVY = ("litellm", "uvicorn", "rich", "starlette", "tiktoken", "httpx", "pykka")

_HELP_PROBE = """
import contextlib, io, json, sys
from runtime.apps.cli import main
out = {}
for command in sys.argv[1:]:
    argv = [command, "--help"] if command else ["--help"]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
    out[command] = {"code": code, "text": text.getvalue()}
out["modules"] = sorted({name.split(".")[0] for name in sys.modules})
print(json.dumps(out))
"""


def test_help_answers_without_importing_heavy_libraries() -> None:
    commands = ["", "demo", "chat", "sessions", "serve"]
    done = subprocess.run(
        [sys.executable, "-c", _HELP_PROBE, *commands], capture_output=True, text=True, check=True, timeout=30
    )
    result = json.loads(done.stdout)
    for command in commands:
        assert result[command]["code"] == 0, command
        assert result[command]["text"].startswith(f"usage: agentcell {command}".rstrip()), command
    assert "--sessions" in result["demo"]["text"] and "--plain" in result["demo"]["text"]
    assert "/compact" in result["chat"]["text"] and "--model" in result["chat"]["text"]
    assert "{list,show,delete}" in result["sessions"]["text"]
    assert "--token" in result["serve"]["text"] and "127.0.0.1" in result["serve"]["text"]
    for command in ("demo", "chat", "sessions", "serve", "provider", "bench"):
        assert command in result[""]["text"]
    assert not set(HEAVY) & set(result["modules"])


def test_passthrough_commands_get_their_own_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["provider", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: agentcell provider") and "--context-window" in help_text


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--sessions", "0"])
    assert exit_info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert (
        main(["demo", "--sessions", "1", "--plain"]) == 2
    )  # the demo needs a steady and an overflow session
    assert "at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sessions", "rename"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.fixture
def stored(rt: Any, provider: Any, workspace: Path, script: Any) -> str:
    """A stored session with a tool call, a tool result and a final answer, plus an empty one."""
    (workspace / "todo.txt").write_text("buy milk\n")
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="read_file", arguments='{"path": "todo.txt"}'),)),
        Turn(text="Your list says: buy milk."),
    )
    sid = rt.start_session(
        "errands",
        model=model,
        system_prompt="You keep lists.",
        tools="builtin",
        workspace=workspace,
        api_base=provider.url,
        api_key="sk-local",
    )
    assert rt.prompt(sid, "What is on my list?").result(timeout=30).status == "ok"
    rt.start_session("empty", model="openai/other")
    rt.services.writer.flush()
    return str(sid)


def sessions(*args: str, sessions_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    action, *rest = args
    code = run_sessions(action, rest[0] if rest else None, sessions_dir=str(sessions_dir), out=out)
    return code, out.getvalue()


def test_sessions_list_and_show(
    stored: str, sessions_dir: Path, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, listing = sessions("list", sessions_dir=sessions_dir)
    assert code == 0
    lines = listing.splitlines()
    assert lines[0].split() == ["session", "updated", "messages", "model"]
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert rows["errands"][3] == "4" and rows["errands"][4].startswith("openai/script-")
    assert rows["empty"][3] == "0" and rows["empty"][4] == "openai/other"
    assert lines[-1] == f"2 sessions in {sessions_dir}"

    code, shown = sessions("show", "errands", sessions_dir=sessions_dir)
    assert code == 0
    head, body = shown.split("\n\n", 1)
    assert "session errands · model openai/script-" in head and "4 messages on the current branch" in head
    assert f"workspace: {workspace}" in head and "system: You keep lists." in head
    assert body.splitlines() == [
        "[user] What is on my list?",
        '[assistant] -> read_file({"path": "todo.txt"})',
        "[tool read_file] 1 buy milk (15 chars)",
        "[assistant] Your list says: buy milk.",
    ]
    # The same through the command line.
    assert main(["sessions", "show", "errands", "--dir", str(sessions_dir)]) == 0
    assert capsys.readouterr().out == shown


def test_sessions_errors_and_delete(
    stored: str, sessions_dir: Path, rt: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sessions("show", sessions_dir=sessions_dir)[0] == 2
    assert "a session id is required" in capsys.readouterr().err
    assert sessions("show", "../etc", sessions_dir=sessions_dir)[0] == 2
    assert "path separator" in capsys.readouterr().err
    assert sessions("delete", "nobody", sessions_dir=sessions_dir)[0] == 1
    assert "no session 'nobody'" in capsys.readouterr().err
    # The running runtime holds the session open: deleting it under its feet is refused.
    assert sessions("delete", "errands", sessions_dir=sessions_dir)[0] == 1
    assert "errands" in capsys.readouterr().err
    assert SessionDirectory(sessions_dir).log_path("errands").exists()
    rt.stop()
    code, out = sessions("delete", "errands", sessions_dir=sessions_dir)
    assert (code, out) == (0, "deleted errands\n")
    assert not any(p.name.startswith("errands") for p in sessions_dir.rglob("*"))
    assert [
        line.split()[0] for line in sessions("list", sessions_dir=sessions_dir)[1].splitlines()[1:-1]
    ] == ["empty"]
    empty_dir = sessions_dir / "nothing-here"
    assert sessions("list", sessions_dir=empty_dir) == (0, f"no sessions in {empty_dir}\n")


ROOT = Path(__file__).resolve().parents[2]


def test_bench_outside_a_checkout_says_where_the_benchmarks_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--list"]) == 2
    assert "run this command from a checkout" in capsys.readouterr().err


def test_bench_writes_its_results_where_it_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("AGENTCELL_BENCH_RESULTS", raising=False)
    checkout_summary = ROOT / "benchmarks" / "results" / "summary.json"
    before = checkout_summary.stat().st_mtime if checkout_summary.exists() else None
    out = tmp_path / "figures"
    assert main(["bench", "--report", "--only", "tokens", "--no-chart", "--results", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["meta"]["report_only"] is True
    after = checkout_summary.stat().st_mtime if checkout_summary.exists() else None
    assert after == before  # nothing written into the checkout's own results
    capsys.readouterr()


@pytest.mark.slow
def test_the_wheel_installs_no_benchmarks_package(tmp_path: Path) -> None:
    """``benchmarks/`` is part of the repository, not of what ``pip install`` puts into site-packages (a
    top-level ``benchmarks`` there would hide a user's own, and results would be written into it)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("agentcell-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"runtime", "actors"} <= tops
    assert "benchmarks" not in tops
