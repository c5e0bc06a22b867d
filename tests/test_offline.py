"""Offline-safe start: import runtime sets the environment without litellm, and tiktoken works offline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_NO_NETWORK = textwrap.dedent(
    """
    import socket
    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")
    socket.socket.connect = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    """
)


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {
        k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "LITELLM_LOCAL_MODEL_COST_MAP")
    }
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", _NO_NETWORK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def test_import_runtime_sets_env_and_does_not_import_litellm() -> None:
    proc = _run(
        """
        import os, sys, runtime
        print(os.environ["LITELLM_LOCAL_MODEL_COST_MAP"])
        print(os.path.isdir(os.environ["TIKTOKEN_CACHE_DIR"]))
        print("litellm" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "False"]


def test_user_values_are_not_overridden(tmp_path: object) -> None:
    proc = _run(
        """
        import os, runtime
        print(os.environ["LITELLM_LOCAL_MODEL_COST_MAP"], os.environ["TIKTOKEN_CACHE_DIR"])
        """,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "False", "TIKTOKEN_CACHE_DIR": "/my/cache"},
    )
    assert proc.stdout.split() == ["False", "/my/cache"]


def test_tiktoken_encodings_work_without_network() -> None:
    proc = _run(
        """
        import runtime, tiktoken
        for name in ("o200k_base", "cl100k_base"):
            print(len(tiktoken.get_encoding(name).encode("hello world")))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]


def test_cli_help_does_not_import_litellm() -> None:
    proc = _run(
        """
        import sys, contextlib, io
        from runtime.apps import cli
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                cli.main(["--help"])
            except SystemExit:
                pass
        assert "demo" in out.getvalue()
        print("litellm" in sys.modules, "rich" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


@pytest.mark.slow  # a child process collects the whole suite: seconds even on an idle machine
def test_litellms_import_is_left_out_of_full_collections() -> None:
    # A full collection walks every tracked object; litellm's import leaves hundreds of thousands that live
    # as long as the process. Once loaded they are frozen, and a full pass takes a fraction of the time.
    proc = _run(
        """
        import gc, time, runtime
        from runtime.gateway import load_litellm
        litellm = load_litellm()
        print(gc.get_freeze_count() > 100_000)
        print(any(o is litellm.model_cost for o in gc.get_objects()))
        print(sum(len(gc.get_objects(g)) for g in range(3)) < gc.get_freeze_count() // 10)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "True"]
