"""agentcell's top-level packages ``runtime`` and ``actors`` hidden by a user's module of the same name: the
error names the file that hides them and what to do (it said only "'actors' is not a package")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import runtime
from runtime._layout import HOME, hidden_by


def _import_runtime_in(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HOME)}
    return subprocess.run(
        [sys.executable, "-c", "from runtime import Runtime; print(Runtime.__name__)"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_users_actors_py_is_named_as_the_cause(tmp_path: Path) -> None:
    (tmp_path / "actors.py").write_text("ROLE = 'mine'\n")
    done = _import_runtime_in(tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: agentcell's 'actors' package is hidden by")
    assert str(tmp_path / "actors.py") in last and "Rename yours" in last


def test_nothing_is_hidden_in_a_clean_folder(tmp_path: Path) -> None:
    (tmp_path / "actors").mkdir()  # a bare folder (a namespace package) never hides a package
    done = _import_runtime_in(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Runtime"
    assert hidden_by("actors") is None and hidden_by("runtime") is None
    assert Path(runtime.__file__).resolve().parent == HOME / "runtime"
