"""The built-in tools (runtime.tools.builtin): file tools confined to the workspace, and the shell."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runtime.tools.builtin import builtin_registry
from runtime.tools.registry import ToolContext, ToolError
from runtime.tools.workspace import Workspace, WorkspaceError


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    root = tmp_path / "ws"
    root.mkdir()
    return ToolContext(
        workspace=Workspace(root), call_id="call_1", logs_dir=tmp_path / "logs", shell_timeout=10.0
    )


def run(name: str, ctx: ToolContext, **args: object) -> str:
    result = builtin_registry(shell=True)[name].invoke(args, ctx)
    assert isinstance(result, str)
    return result


def test_builtin_registry_has_shell_only_when_asked() -> None:
    assert builtin_registry().names == [
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "grep",
        "read_saved",
    ]
    assert "shell" in builtin_registry(shell=True)


def test_write_then_read_with_offset_and_limit(ctx: ToolContext) -> None:
    content = "".join(f"line {i}\n" for i in range(1, 11))
    assert (
        run("write_file", ctx, path="deep/dir/f.txt", content=content)
        == "Created deep/dir/f.txt: 71 bytes, 10 lines"
    )
    assert run("write_file", ctx, path="deep/dir/f.txt", content=content).startswith("Overwrote")
    out = run("read_file", ctx, path="deep/dir/f.txt", offset=3, limit=2)
    assert out.splitlines() == [
        "     3\tline 3",
        "     4\tline 4",
        "[lines 3-4 of 10; continue with offset=5]",
    ]
    assert run("read_file", ctx, path="deep/dir/f.txt").splitlines()[-1] == "    10\tline 10"
    with pytest.raises(ToolError, match="past the end"):
        run("read_file", ctx, path="deep/dir/f.txt", offset=50)


def test_read_file_refuses_binary_and_handles_invalid_utf8(ctx: ToolContext) -> None:
    root = ctx.require_workspace().root
    (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(ToolError, match="binary file"):
        run("read_file", ctx, path="blob.bin")
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert run("read_file", ctx, path="latin1.txt") == "     1\tcaf\ufffd"
    with pytest.raises(ToolError, match="no such file"):
        run("read_file", ctx, path="missing.txt")


def test_edit_file_exact_match_rules(ctx: ToolContext) -> None:
    run("write_file", ctx, path="a.py", content="x = 1\ny = 1\nx = 1\n")
    with pytest.raises(ToolError, match="matches 2 times"):
        run("edit_file", ctx, path="a.py", old="x = 1", new="x = 2")
    with pytest.raises(ToolError, match="not found"):
        run("edit_file", ctx, path="a.py", old="z = 1", new="z = 2")
    with pytest.raises(ToolError, match="whitespace"):
        run("edit_file", ctx, path="a.py", old="  y = 1", new="y = 2")
    assert (
        run("edit_file", ctx, path="a.py", old="y = 1", new="y = 2") == "Edited a.py: replaced 1 occurrence"
    )
    assert run("edit_file", ctx, path="a.py", old="x = 1", new="x = 3", replace_all=True).endswith(
        "2 occurrences"
    )
    assert (ctx.require_workspace().root / "a.py").read_text() == "x = 3\ny = 2\nx = 3\n"


def test_list_dir_and_grep(ctx: ToolContext, tmp_path: Path) -> None:
    root = ctx.require_workspace().root
    run("write_file", ctx, path="src/app.py", content="def main():\n    return 42\n")
    run("write_file", ctx, path="src/util.py", content="def helper():\n    pass\n")
    run("write_file", ctx, path="README.md", content="def not code\n")
    (root / "image.png").write_bytes(b"\x89PNG\x00\x00def main")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("def main\n")
    outside = tmp_path / "outside.py"
    outside.write_text("def main(): leaked\n")
    os.symlink(outside, root / "src" / "escape.py")

    listing = run("list_dir", ctx)
    assert listing.splitlines()[0] == "./ (4 entries)"
    assert ".git/" in listing and "src/" in listing and "README.md  (13 bytes)" in listing
    assert "escape.py" in run("list_dir", ctx, path="src") and "(outside the workspace)" in run(
        "list_dir", ctx, path="src"
    )

    assert run("grep", ctx, pattern=r"def \w+\(") == "src/app.py:1: def main():\nsrc/util.py:1: def helper():"
    assert run("grep", ctx, pattern="def", glob="*.md") == "README.md:1: def not code"
    assert run("grep", ctx, pattern="def", path="src", max_results=1).startswith(
        "src/app.py:1: def main():\n[stopped"
    )
    assert run("grep", ctx, pattern="nothing here").startswith("No matches")
    with pytest.raises(ToolError, match="invalid regular expression"):
        run("grep", ctx, pattern="(unclosed")


def test_file_tools_refuse_escapes(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path, ctx.require_workspace().root / "up")
    for name, args in [
        ("read_file", {"path": "../secret.txt"}),
        ("read_file", {"path": "up/secret.txt"}),
        ("read_file", {"path": str(tmp_path / "secret.txt")}),
        ("write_file", {"path": "../evil.txt", "content": "x"}),
        ("write_file", {"path": "up/evil.txt", "content": "x"}),
        ("edit_file", {"path": "up/secret.txt", "old": "secret", "new": "gone"}),
        ("list_dir", {"path": "up"}),
        ("grep", {"pattern": "secret", "path": "up"}),
    ]:
        with pytest.raises(WorkspaceError):
            run(name, ctx, **args)
    assert (tmp_path / "secret.txt").read_text() == "secret"
    assert not (tmp_path / "evil.txt").exists()


def test_file_tools_without_a_workspace_say_so() -> None:
    with pytest.raises(ToolError, match="no workspace"):
        run("read_file", ToolContext(workspace=None), path="a.txt")


def test_shell_is_refused_unless_enabled(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="disabled"):
        run("shell", ctx, command="echo hi")


def test_shell_runs_in_the_workspace_and_logs_everything(ctx: ToolContext) -> None:
    from dataclasses import replace

    chunks: list[str] = []
    on = replace(ctx, shell_enabled=True, emit_output=chunks.append)
    out = run("shell", on, command="pwd; echo err >&2; exit 3")
    root = on.require_workspace().root
    assert out.splitlines()[0] == str(root)
    assert "err" in out and "[exit code 3]" in out
    log = on.logs_dir / "shell-call_1.log"
    assert str(log) in out and log.read_text() == f"{root}\nerr\n"
    assert "".join(chunks) == f"{root}\nerr\n"


def test_shell_keeps_the_tail_of_big_output(ctx: ToolContext) -> None:
    from dataclasses import replace

    on = replace(ctx, shell_enabled=True)
    out = run("shell", on, command="seq 1 200000")
    assert "200000\n[exit code 0]" in out and "\n1\n" not in out
    assert "full output: /" in out  # a path: this context has no saved folders for read_saved
    assert (on.logs_dir / "shell-call_1.log").read_text().splitlines()[0] == "1"


def test_shell_timeout_kills_the_process_group(ctx: ToolContext, tmp_path: Path) -> None:
    from dataclasses import replace

    on = replace(ctx, shell_enabled=True)
    marker = tmp_path / "survived"
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"timed out after 0\.2 s"):
        run("shell", on, command=f"echo start; (sleep 0.6; touch {marker}) & sleep 30", timeout=0.2)
    assert time.monotonic() - started < 2
    time.sleep(max(0.0, started + 1.0 - time.monotonic()))
    assert not marker.exists()  # the background child was killed with its group


def test_shell_does_not_pass_credentials(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("AGENTCELL_PLAIN", "visible")
    out = run("shell", replace(ctx, shell_enabled=True), command="env")
    assert "sk-should-not-leak" not in out and "AGENTCELL_PLAIN" not in out  # an allow-list: not named
    out = run("shell", replace(ctx, shell_enabled=True, shell_env=("AGENTCELL_PLAIN",)), command="env")
    assert "sk-should-not-leak" not in out and "AGENTCELL_PLAIN=visible" in out
