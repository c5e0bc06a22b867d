"""The tool executor (design §3.4-3.6, 9): parallel calls, timeouts, errors as results, approval, abort,
and bad output (100 MB, binary, invalid UTF-8)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.config import Config, ToolOutputConfig
from runtime.messages import ToolCallPart
from runtime.tools.builtin import builtin_registry
from runtime.tools.executor import ContextFactory, ToolExecutor, ToolRunResult, context_factory
from runtime.tools.registry import ToolContext, ToolError, ToolRegistry
from runtime.tools.workspace import Workspace

release = threading.Event()  # set at teardown: lets abandoned tools finish


@pytest.fixture(autouse=True)
def _release_hung_tools() -> Iterator[None]:
    release.clear()
    yield
    release.set()


@pytest.fixture
def executor() -> Iterator[ToolExecutor]:
    pool = ToolExecutor(workers=4)
    yield pool
    pool.shutdown()


@pytest.fixture
def registry() -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    def nap(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return f"slept {seconds:g}"

    @reg.tool
    def boom(message: str = "kaput") -> str:
        """Raise."""
        raise ValueError(message)

    @reg.tool
    def refuse() -> str:
        """Raise a ToolError."""
        raise ToolError("not today")

    @reg.tool
    def exit_now() -> str:
        """Raise SystemExit."""
        raise SystemExit(3)

    @reg.tool
    def hang(ctx: ToolContext) -> str:
        """Wait until released (or cancelled)."""
        while not release.is_set() and not ctx.cancelled.is_set():
            time.sleep(0.01)
        return "released"

    @reg.tool
    def stubborn() -> str:
        """Ignore cancellation; wait until released."""
        release.wait(30)
        return "finally"

    @reg.tool
    def emit(ctx: ToolContext) -> str:
        """Stream two chunks."""
        ctx.emit_output("one ")
        ctx.emit_output("two")
        return "done"

    @reg.tool
    def blob(kind: str) -> bytes:
        """Return raw bytes."""
        return b"\x00\x01ELF\xff" * 10 if kind == "binary" else b"caf\xe9 au lait"

    @reg.tool(requires_approval=True)
    def dangerous() -> str:
        """Needs approval."""
        return "did it"

    return reg


def ctx_factory(tmp_path: Path) -> ContextFactory:
    return context_factory(session_id="s1", workspace=tmp_path, config=Config(), logs_dir=tmp_path / "logs")


def calls(*specs: tuple[str, str]) -> list[ToolCallPart]:
    return [ToolCallPart(f"call_{i}", name, args) for i, (name, args) in enumerate(specs)]


def run_all(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path, specs: list[ToolCallPart], **kw: object
) -> list[ToolRunResult]:
    kw.setdefault("timeout", 10.0)
    handle = executor.run(specs, registry, ctx_factory(tmp_path), spill_dir=tmp_path / "spill", **kw)  # type: ignore[arg-type]
    return handle.wait(timeout=30)


def test_parallel_calls_run_at_once_and_keep_their_order(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    specs = calls(*[("nap", f'{{"seconds": {0.2 + i / 100}}}') for i in range(4)])
    started: list[str] = []
    done: list[str] = []
    all_done: list[list[ToolRunResult]] = []
    t0 = time.monotonic()
    handle = executor.run(
        specs,
        registry,
        ctx_factory(tmp_path),
        timeout=5,
        on_start=lambda c: started.append(c.id),
        on_done=lambda r: done.append(r.call.id),
        on_all_done=all_done.append,
    )
    assert time.monotonic() - t0 < 0.15  # run() does not wait for the tools
    results = handle.wait(5)
    assert time.monotonic() - t0 < 0.6  # 4 × 0.2 s in parallel
    assert [r.call.id for r in results] == ["call_0", "call_1", "call_2", "call_3"]
    assert [r.message.text for r in results] == ["slept 0.2", "slept 0.21", "slept 0.22", "slept 0.23"]
    assert sorted(started) == sorted(done) == ["call_0", "call_1", "call_2", "call_3"]
    assert len(all_done) == 1 and all_done[0] == results
    assert all(
        r.message.role == "tool" and r.message.tool_call_id == r.call.id and not r.is_error for r in results
    )
    assert all(0.19 < r.duration < 0.6 for r in results)


def test_max_parallel_limits_concurrency(executor: ToolExecutor, tmp_path: Path) -> None:
    reg = ToolRegistry()
    active, peak, lock = [0], [0], threading.Lock()

    @reg.tool
    def work() -> str:
        """Count concurrency."""
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return "ok"

    results = run_all(executor, reg, tmp_path, calls(*[("work", "{}")] * 6), max_parallel=2)
    assert len(results) == 6 and peak[0] == 2


def test_errors_become_results_the_model_can_read(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    results = run_all(
        executor,
        registry,
        tmp_path,
        calls(
            ("boom", '{"message": "disk on fire"}'),
            ("refuse", "{}"),
            ("exit_now", "{}"),
            ("nap", '{"seconds": '),
            ("nap", '["not", "an", "object"]'),
            ("no_such_tool", "{}"),
            ("nap", '{"seconds": "soon"}'),
        ),
    )
    texts = [r.message.text for r in results]
    assert all(r.is_error for r in results)
    assert texts[0] == "Error: ValueError: disk on fire"
    assert texts[1] == "Error: not today"
    assert texts[2] == "Error: SystemExit: 3"
    assert "not valid JSON" in texts[3] and "'nap'" in texts[3]
    assert "must be a JSON object" in texts[4]
    assert "no tool named 'no_such_tool'" in texts[5] and "nap" in texts[5] and "boom" in texts[5]
    assert "invalid arguments for 'nap'" in texts[6] and "seconds" in texts[6]
    assert [r.message.metadata["error"] for r in results] == [
        "exception", "tool_error", "exception", "invalid_arguments", "invalid_arguments", "unknown_tool", "tool_error",
    ]  # fmt: skip
    # the pool survived all of it (SystemExit included)
    assert (
        run_all(executor, registry, tmp_path, calls(("nap", '{"seconds": 0}')))[0].message.text == "slept 0"
    )


def test_hung_tool_times_out_and_its_worker_is_replaced(registry: ToolRegistry, tmp_path: Path) -> None:
    pool = ToolExecutor(workers=1)
    try:
        t0 = time.monotonic()
        [result] = run_all(pool, registry, tmp_path, calls(("stubborn", "{}")), timeout=0.2)
        assert 0.2 <= time.monotonic() - t0 < 2.0  # the deadline, not the tool's 30 s
        assert result.is_error and result.message.text.startswith(
            "Error: tool 'stubborn' timed out after 0.2 s"
        )
        assert result.message.metadata["error"] == "timeout"
        # the only worker is stuck in a tool that ignores cancellation, yet the pool still runs calls
        [after] = run_all(pool, registry, tmp_path, calls(("nap", '{"seconds": 0}')))
        assert after.message.text == "slept 0"
    finally:
        pool.shutdown()


def test_cancel_aborts_unfinished_calls(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    all_done: list[list[ToolRunResult]] = []
    handle = executor.run(
        calls(("nap", '{"seconds": 0}'), ("hang", "{}"), ("hang", "{}")),
        registry,
        ctx_factory(tmp_path),
        timeout=30,
        on_all_done=all_done.append,
    )
    deadline = time.monotonic() + 5
    while handle.results[0] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handle.cancel("aborted by the user") == 2
    assert handle.done and len(all_done) == 1
    results = handle.wait(0)
    assert results[0].message.text == "slept 0" and not results[0].is_error
    for r in results[1:]:
        assert (
            r.is_error
            and r.message.text == "Error: tool call was aborted (aborted by the user) before it finished"
        )
    assert handle.cancel() == 0  # nothing left to cut


def test_approval_hook(executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path) -> None:
    asked: list[str] = []

    def approve(call: ToolCallPart) -> bool | str:
        asked.append(call.name)
        if call.name == "dangerous":
            return "not on a Friday"
        return True

    results = run_all(
        executor, registry, tmp_path, calls(("nap", '{"seconds": 0}'), ("dangerous", "{}")), approve=approve
    )
    assert sorted(asked) == ["dangerous", "nap"]
    assert results[0].message.text == "slept 0"
    assert results[1].is_error and results[1].message.text == "Error: tool call denied: not on a Friday"
    assert results[1].message.metadata["error"] == "denied"

    [no_hook] = run_all(executor, registry, tmp_path, calls(("dangerous", "{}")))
    assert no_hook.is_error and "requires approval" in no_hook.message.text

    def broken(call: ToolCallPart) -> bool:
        raise RuntimeError("hook crashed")

    [failed] = run_all(executor, registry, tmp_path, calls(("dangerous", "{}")), approve=broken)
    assert failed.is_error and "hook crashed" in failed.message.text
    [allowed] = run_all(executor, registry, tmp_path, calls(("dangerous", "{}")), approve=lambda c: True)
    assert allowed.message.text == "did it"


def test_blocking_approval_blocks_only_its_worker(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    answer = threading.Event()

    def approve(call: ToolCallPart) -> bool:
        return call.name != "dangerous" or answer.wait(5)

    t0 = time.monotonic()
    handle = executor.run(
        calls(("dangerous", "{}"), ("nap", '{"seconds": 0}')),
        registry,
        ctx_factory(tmp_path),
        approve=approve,
    )
    assert time.monotonic() - t0 < 1.0  # the approval wait is on a worker
    deadline = time.monotonic() + 5
    while handle.results[1] is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handle.results[1] is not None and handle.results[0] is None  # the other call went ahead
    answer.set()
    assert handle.wait(5)[0].message.text == "did it"


def test_output_streams_through_on_output(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    chunks: list[tuple[str, str]] = []
    [result] = run_all(
        executor, registry, tmp_path, calls(("emit", "{}")), on_output=lambda c, s: chunks.append((c.id, s))
    )
    assert chunks == [("call_0", "one "), ("call_0", "two")] and result.message.text == "done"


def test_binary_and_invalid_utf8_output(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    binary, latin = run_all(
        executor, registry, tmp_path, calls(("blob", '{"kind": "binary"}'), ("blob", '{"kind": "latin"}'))
    )
    assert binary.message.text.startswith("[binary output: 60 bytes") and "\x00" not in binary.message.text
    assert latin.message.text == "caf\ufffd au lait"
    assert not binary.is_error and not latin.is_error


def test_100_mb_output_is_spilled_with_flat_memory(executor: ToolExecutor, tmp_path: Path) -> None:
    size = 100 * 1024 * 1024
    line = "0123456789abcdef" * 4 + "\n"  # 65 bytes
    reg = ToolRegistry()

    @reg.tool
    def flood() -> str:
        """Return 100 MB."""
        return line * (size // len(line))

    tracemalloc.start()
    try:
        [result] = run_all(executor, reg, tmp_path, calls(("flood", "{}")))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = len(line) * (size // len(line))
    assert peak < 2 * total  # the output itself, plus small chunks — never copies of it
    assert result.truncated and result.spilled is not None and not result.is_error
    assert result.spilled.parent == tmp_path / "spill"
    assert result.spilled.stat().st_size == total
    digest = hashlib.sha256()
    with result.spilled.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    sha = digest.hexdigest()
    assert result.message.metadata["spill_sha256"] == sha
    assert sha in result.message.text and str(result.spilled) in result.message.text
    assert len(result.message.text) < 5_000


def test_unwritable_spill_dir_falls_back_to_truncation(executor: ToolExecutor, tmp_path: Path) -> None:
    reg = ToolRegistry()

    @reg.tool
    def big() -> str:
        """300 K chars."""
        return "y" * 300_000

    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    handle = executor.run(
        calls(("big", "{}")), reg, ctx_factory(tmp_path), spill_dir=blocker, limits=ToolOutputConfig()
    )
    [result] = handle.wait(10)
    assert result.spilled is None and result.truncated
    assert "could not be saved" in result.message.text and len(result.message.text) < 60 * 1024


def test_builtin_tools_through_the_executor_refuse_symlink_escapes(
    executor: ToolExecutor, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("s3cret")
    os.symlink(tmp_path / "secret.txt", ws / "innocent.txt")
    factory = context_factory(
        session_id="s", workspace=Workspace(ws), config=Config(), logs_dir=tmp_path / "logs"
    )
    handle = executor.run(
        calls(("read_file", '{"path": "innocent.txt"}'), ("read_file", '{"path": "../secret.txt"}')),
        builtin_registry(),
        factory,
    )
    for result in handle.wait(10):
        text = result.message.text
        assert result.is_error and ("outside the workspace" in text or "escapes the workspace" in text)
        assert "s3cret" not in text


def test_context_factory_carries_the_session_settings(tmp_path: Path) -> None:
    cfg = Config().with_overrides({"agent.shell_enabled": True, "agent.shell_timeout": 7})
    make = context_factory(session_id="s9", workspace=tmp_path, config=cfg, logs_dir=tmp_path / "logs")
    ctx = make(ToolCallPart("c1", "shell", "{}"))
    assert (ctx.session_id, ctx.call_id, ctx.shell_enabled, ctx.shell_timeout) == ("s9", "c1", True, 7.0)
    assert ctx.workspace is not None and ctx.workspace.root == tmp_path.resolve()


def test_empty_batch_completes_at_once(
    executor: ToolExecutor, registry: ToolRegistry, tmp_path: Path
) -> None:
    seen: list[list[ToolRunResult]] = []
    handle = executor.run([], registry, ctx_factory(tmp_path), on_all_done=seen.append)
    assert handle.done and handle.wait(0) == [] and seen == [[]]


def test_abort_kills_a_running_shell_command(executor: ToolExecutor, tmp_path: Path) -> None:
    cfg = Config().with_overrides({"agent.shell_enabled": True})
    factory = context_factory(session_id="s", workspace=tmp_path, config=cfg, logs_dir=tmp_path / "logs")
    marker = tmp_path / "survived"
    started: list[str] = []
    handle = executor.run(
        calls(("shell", json.dumps({"command": f"(sleep 0.6; touch {marker}) & sleep 30"}))),
        builtin_registry(shell=True),
        factory,
        on_start=lambda c: started.append(c.id),
    )
    t0 = time.monotonic()
    while not started and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    time.sleep(0.1)
    handle.cancel()
    [result] = handle.wait(1)
    assert result.is_error and "aborted" in result.message.text
    time.sleep(max(0.0, t0 + 1.0 - time.monotonic()))
    assert not marker.exists()  # the command's whole process group was killed
