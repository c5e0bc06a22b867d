"""The README's Python examples, run as written: each fenced ``python`` block is saved to a file in an empty
folder (with a copy of the README for the first one to read) and run there in a fresh interpreter,
offline, against the built-in local provider the examples start themselves."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# An example's event callback prints on the subscription's thread while the main thread prints too, and one
# ``print`` is several writes (each argument, the separators, the end): without this, one thread's words land
# inside the other's line ("compacted:event:  compaction_skippedFalse ..."). The child runs the example as
# written, with each ``print`` call made whole, so each printed line can be read on its own.
WHOLE_PRINTS = """\
import builtins, runpy, threading
_print, _lock = builtins.print, threading.Lock()
def _whole(*args, **kwargs):
    with _lock:
        _print(*args, **kwargs)
builtins.print = _whole
runpy.run_path("example.py", run_name="__main__")
"""


def examples() -> list[str]:
    return FENCE.findall(README.read_text(encoding="utf-8"))


def run_example(code: str, folder: Path) -> str:
    folder.mkdir()
    shutil.copy(README, folder / "README.md")
    (folder / "example.py").write_text(code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", WHOLE_PRINTS], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"the example failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_readme_has_its_three_python_examples() -> None:
    codes = examples()
    assert len(codes) == 3
    assert "Runtime(sessions_dir=" in codes[0] and "asyncio.run(main())" in codes[1]
    assert "client.responses.create" in codes[2]


@pytest.mark.slow  # runs the README's example in a child process: seconds even on an idle machine
def test_the_threads_example_runs_as_written(tmp_path: Path) -> None:
    out = run_example(examples()[0], tmp_path / "threads")
    assert "event: tool_execution_start" in out  # the callback saw the agent read README.md
    assert re.search(r"^ok Here is what I did:\n- I read `README\.md`", out, re.MULTILINE), out
    assert re.search(r"^Done\. \d+$", out, re.MULTILINE), out  # the text ends, then the input tokens
    assert re.search(r"^compacted: (True|False nothing to compact: )", out, re.MULTILINE), out
    assert re.search(r"^event: compaction_(end|skipped)$", out, re.MULTILINE), out  # the watcher saw it
    assert re.search(r"^[\d,]+ of 128,000 tokens; compacts at [\d,]+$", out, re.MULTILINE), out
    assert list((tmp_path / "threads" / "sessions").rglob("*.jsonl"))  # the session is stored where it said


@pytest.mark.slow  # runs the README's example in a child process: seconds even on an idle machine
def test_the_asyncio_example_runs_as_written(tmp_path: Path) -> None:
    out = run_example(examples()[1], tmp_path / "asyncio")
    assert 'You asked: "Hello!"' in out  # streamed from the text deltas
    assert re.search(r"^ok: [\d,]+ tokens in context$", out, re.MULTILINE), out


@pytest.mark.slow  # runs the README's example in a child process: seconds even on an idle machine
def test_the_responses_api_example_runs_as_written(tmp_path: Path) -> None:
    out = run_example(examples()[2], tmp_path / "responses")
    assert 'function_call get_weather {"city": "Oslo"}' in out  # the turn stopped for the client's tool
    assert "It is sunny in Oslo, 21 C." in out  # the tool's output went on with the same thread
    assert re.search(
        r"^You asked about the weather in Oslo\.\n\d+ tokens in resp_[0-9a-f]{32}$", out, re.MULTILINE
    ), out
