"""`agentcell serve` in a child process, for the tests that check what only the real command does (its
token, its address, its flags)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple


class Served(NamedTuple):
    url: str  # http://127.0.0.1:<port>
    banner: str  # what the process printed up to and including its "listening on" line
    process: subprocess.Popen[str]


@contextmanager
def serve_process(
    sessions_dir: Path, *args: str, start_timeout: float = 60.0, check_exit: bool = True
) -> Iterator[Served]:
    """Run ``agentcell serve --port 0 ARGS`` with its sessions in ``sessions_dir`` (and no token from the
    environment) until it listens; on leaving, stop it with SIGINT and check that it exits 0 (unless
    ``check_exit`` is false: a test that killed it)."""
    env = {**os.environ, "AGENTCELL_PERSISTENCE__SESSIONS_DIR": str(sessions_dir)}
    env.pop("AGENTCELL_SERVER__TOKEN", None)
    command = [sys.executable, "-m", "runtime.apps.cli", "serve", "--port", "0", *args]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        timer = threading.Timer(start_timeout, proc.kill)
        timer.start()
        try:
            while not lines or "listening on" not in lines[-1]:
                line = proc.stderr.readline()
                assert line, f"serve exited before it listened: {''.join(lines)}"
                lines.append(line)
        finally:
            timer.cancel()
        url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", lines[-1])
        assert url, lines[-1]
        yield Served(url.group(1), "".join(lines), proc)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert code == 0 or not check_exit, code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
