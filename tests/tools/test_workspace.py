"""Workspace confinement (design §3.4, 9): traversal, absolute paths and symlink escapes are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.tools.workspace import Workspace, WorkspaceError


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Workspace, Path]:
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    (root / "src").mkdir(parents=True)
    outside.mkdir()
    (root / "src" / "main.py").write_text("print('hi')\n")
    (outside / "secret.txt").write_text("top secret\n")
    os.symlink(outside, root / "link_out")  # a directory link leading out
    os.symlink(outside / "secret.txt", root / "secret_link.txt")  # a file link leading out
    os.symlink(outside / "missing.txt", root / "dangling_out.txt")  # dangling, but pointing out
    os.symlink(root / "src" / "main.py", root / "inner_link.py")  # a link that stays inside
    return Workspace(root), outside


def test_paths_inside_resolve(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    assert ws.resolve("src/main.py") == ws.root / "src" / "main.py"
    assert ws.resolve("src/../src/main.py") == ws.root / "src" / "main.py"  # '..' that stays inside
    assert ws.resolve(".") == ws.root and ws.resolve("") == ws.root
    assert ws.resolve(str(ws.root / "src")) == ws.root / "src"  # absolute, but inside
    assert ws.resolve("new/dir/file.txt") == ws.root / "new" / "dir" / "file.txt"  # not yet existing
    assert ws.resolve("inner_link.py") == ws.root / "src" / "main.py"
    assert ws.relative(ws.resolve("src/main.py")) == "src/main.py"
    assert ws.relative(ws.root) == "."


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside/secret.txt", "escapes the workspace with '..'"),
        ("src/../../outside", "escapes the workspace with '..'"),
        ("/etc/passwd", "absolute path outside the workspace"),
        ("link_out/secret.txt", "symbolic link leads outside"),
        ("link_out", "symbolic link leads outside"),
        ("secret_link.txt", "symbolic link leads outside"),
        ("dangling_out.txt", "symbolic link leads outside"),
        ("link_out/new_file.txt", "symbolic link leads outside"),
        ("src/main.py\x00.txt", "NUL byte"),
    ],
)
def test_escapes_are_refused_with_a_clear_reason(
    layout: tuple[Workspace, Path], path: str, reason: str
) -> None:
    ws, _ = layout
    with pytest.raises(WorkspaceError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        ws.resolve(path)
    assert not ws.contains(path)


def test_symlink_loop_is_an_error_not_a_hang(tmp_path: Path) -> None:
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    ws = Workspace(tmp_path)
    with pytest.raises(WorkspaceError):
        ws.resolve("a/file")


def test_workspace_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="not a directory"):
        Workspace(tmp_path / "nope")


def test_root_given_through_a_symlink_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    ws = Workspace(tmp_path / "alias")
    assert ws.root == (tmp_path / "real").resolve()
    assert ws.resolve("x.txt") == ws.root / "x.txt"
