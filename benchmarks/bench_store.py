"""Session store benchmarks (design §2.3, 8).

1. Appends per second for each fsync policy, against a baseline in the same process: a bare loop of
   ``os.write`` calls (plus ``fdatasync`` per line under ``always``) on one file — the least any
   append-only log can cost.
   * ``sequential``: one session waiting for each acknowledgement before the next append (latency).
   * ``pipelined``: 64 appends in flight (what many sessions writing at once look like to the writer).
   * ``actor``: pipelined through the :class:`SessionStore` actor (``Append`` with a reply callback).
   Under ``turn`` a sync is requested every 5 appends, a short turn.
2. Reopening a 10,000-message session (tool calls, tool results, usage, a compaction and overlays):
   decoding the file, replaying it into the tree, and a whole store actor start up to its first answer.
   Baseline: decoding the same bytes with a bare ``msgspec`` decoder.
3. A turn's view at 10, 1,000 and 10,000 messages: append one message, then compute ``context()``
   (cached and extended in O(1); the copy handed out is a C-level list copy). Baseline: 10 messages.

Run: ``python -m benchmarks.bench_store`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from actors.session_store import Append, GetContext, SessionStore, Stored, SyncTurn
from benchmarks._common import write_results
from runtime.messages import (
    KIND_COMPACTION_SUMMARY,
    Message,
    ToolCallPart,
    Usage,
    assistant,
    tool_result,
    user,
)
from runtime.store.entries import Entry, MessageEntry, new_header
from runtime.store.log import SessionLog, read_log, replay
from runtime.store.sessions import SessionDirectory
from runtime.store.tree import SessionTree
from runtime.store.writer import FsyncPolicy, LogWriter

NAME = "store"
POLICIES: tuple[FsyncPolicy, ...] = ("always", "turn", "never")
TURN = 5  # appends per turn under the "turn" policy
IN_FLIGHT = 64
_BODY = "the store appends one line per message and replays them when a session opens again. " * 3


def _message(i: int) -> Message:
    return user(f"{i} {_BODY}", id=f"m{i:07d}")


def _line(i: int, parent: str | None) -> bytes:
    m = _message(i)
    return msgspec.json.encode(MessageEntry(id=m.id, parent_id=parent, message=m)) + b"\n"


# -- 1. appends -------------------------------------------------------------------------------------------


def _baseline(folder: Path, policy: FsyncPolicy, seconds: float) -> float:
    lines = [_line(i, None) for i in range(1000)]
    fd = os.open(folder / "baseline.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    n, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.write(fd, lines[n % 1000])
            n += 1
            if policy == "always" or (policy == "turn" and n % TURN == 0):
                os.fdatasync(fd)
    finally:
        os.close(fd)
    return n / (time.perf_counter() - start)


def _through_log(folder: Path, policy: FsyncPolicy, seconds: float, in_flight: int) -> dict[str, float]:
    writer = LogWriter(policy)
    log = SessionLog(folder / f"log-{policy}-{in_flight}.jsonl", writer)
    slots = threading.Semaphore(in_flight)
    parent: str | None = None
    n, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            slots.acquire()
            m = _message(n)
            log.append(MessageEntry(id=m.id, parent_id=parent, message=m), lambda _e: slots.release())
            parent = m.id
            n += 1
            if policy == "turn" and n % TURN == 0:
                slots.acquire()
                log.sync(lambda _e: slots.release())
        for _ in range(in_flight):  # every append acknowledged
            slots.acquire()
        elapsed = time.perf_counter() - start
    finally:
        writer.close()
    return {"appends_s": n / elapsed, "batches": writer.stats.batches, "fsyncs": writer.stats.fsyncs}


def _through_actor(folder: Path, policy: FsyncPolicy, seconds: float) -> dict[str, float]:
    writer = LogWriter(policy)
    directory = SessionDirectory(folder / f"actor-{policy}")
    ref = SessionStore.start("bench", directory, writer, new_header("bench", model="m"), lambda _e: None)
    slots = threading.Semaphore(IN_FLIGHT)

    def acknowledged(reply: Stored) -> None:
        assert reply.ok, reply.error
        slots.release()

    n, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            slots.acquire()
            ref.tell(Append(_message(n), reply_to=acknowledged))
            n += 1
            if policy == "turn" and n % TURN == 0:
                slots.acquire()
                ref.tell(SyncTurn(reply_to=acknowledged))
        for _ in range(IN_FLIGHT):
            slots.acquire()
        elapsed = time.perf_counter() - start
    finally:
        ref.stop()
        writer.close()
    return {"appends_s": n / elapsed, "batches": writer.stats.batches, "fsyncs": writer.stats.fsyncs}


def bench_appends(folder: Path, seconds: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for policy in POLICIES:
        # The baseline runs before and after the store's runs; the faster of the two is the bar.
        before = _baseline(folder, policy, seconds)
        results = {
            "sequential": _through_log(folder, policy, seconds, 1),
            "pipelined": _through_log(folder, policy, seconds, IN_FLIGHT),
            "actor": _through_actor(folder, policy, seconds),
        }
        base = max(before, _baseline(folder, policy, seconds))
        for mode, result in results.items():
            per_fsync = result["appends_s"] * seconds / result["fsyncs"] if result["fsyncs"] else None
            rows.append(
                _row(
                    "appends",
                    f"{policy}, {mode}",
                    result["appends_s"],
                    "appends/s",
                    base,
                    appends_per_fsync=None if per_fsync is None else round(per_fsync, 1),
                )
            )
    return rows


def _row(bench: str, case: str, value: float, unit: str, baseline: float, **extra: Any) -> dict[str, Any]:
    return {
        "bench": bench,
        "case": case,
        "value": round(value, 2),
        "unit": unit,
        "baseline": round(baseline, 2),
        "ratio": round(value / baseline, 3),
        **extra,
    }


# -- 2. reopen --------------------------------------------------------------------------------------------


def build_session(messages: int) -> SessionTree:
    """A realistic session: prompts, assistant tool calls with usage, tool results, one compaction and
    a tool-result archive overlay every 50 messages."""
    tree = SessionTree(new_header("big", model="gpt-4o"))
    results: list[Message] = []
    i = 0
    while len(tree) < messages:
        tree.append(user(f"step {i}: " + _BODY))
        call = ToolCallPart(id=f"c{i}", name="read_file", arguments=f'{{"path": "src/module_{i}.py"}}')
        tree.append(
            assistant("reading", tool_calls=[call], usage=Usage(input_tokens=1000 + i, output_tokens=40))
        )
        result = tree.append(tool_result(call.id, "read_file", f"# module {i}\n" + "x = 1\n" * 60)).message
        results.append(result)
        tree.append(assistant(f"done with {i}", usage=Usage(input_tokens=1100 + i, output_tokens=20)))
        if i % 12 == 11:
            archived = [msgspec.structs.replace(r, agent_visible=False) for r in results[:-3]]
            tree.overlay(archived)
            results = results[-3:]
        if len(tree) == messages // 2:
            keep = tree.context()[-20].id
            tree.record_compaction(user("summary " + _BODY, kind=KIND_COMPACTION_SUMMARY), keep)
        i += 1
    return tree


def _median(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_reopen(folder: Path, messages: int, repeats: int) -> list[dict[str, Any]]:
    tree = build_session(messages)
    directory = SessionDirectory(folder / "reopen")
    directory.ensure()
    path = directory.log_path("big")
    writer = LogWriter("never")
    SessionLog(path, writer).append_many(tree.entries())
    writer.flush()
    data = path.read_bytes()
    bare = msgspec.json.Decoder(Entry)
    entries: list[Entry] = read_log(path)[0]
    del tree

    def start_store() -> None:
        ref = SessionStore.start("big", directory, writer, None, lambda _e: None)
        ref.ask(GetContext(), timeout=60)
        ref.stop()

    decode_s = _median(lambda: bare.decode_lines(data), repeats)
    steps = {
        "read_log (decode, checks)": _median(lambda: read_log(path), repeats),
        "replay into the tree": _median(lambda: replay(path, entries), repeats),
        "store start to first answer": _median(start_store, repeats),
    }
    writer.close()
    size = {"entries": len(entries), "mb": round(len(data) / 2**20, 2)}
    rows = [
        _row("reopen_10k", "bare msgspec decode (baseline)", decode_s * 1e3, "ms", decode_s * 1e3, **size)
    ]
    rows += [_row("reopen_10k", step, t * 1e3, "ms", decode_s * 1e3, **size) for step, t in steps.items()]
    return rows


# -- 3. a turn's view -------------------------------------------------------------------------------------


def bench_view(sizes: tuple[int, ...], turns: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base: float | None = None
    for size in sizes:
        tree = build_session(size)
        context_len = len(tree.context())
        per_turn = []
        gc.collect()
        for t in range(turns):
            message = user(f"turn {t}")
            start = time.perf_counter()
            tree.append(message)
            tree.context()
            per_turn.append(time.perf_counter() - start)
        us = statistics.median(per_turn) * 1e6
        base = base or us
        rows.append(
            _row("turn_view", f"{size:,} messages", us, "us/turn", base, context_messages=context_len)
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (for CI)")
    args = parser.parse_args(argv)
    seconds = 0.3 if args.quick else 1.5
    repeats = 3 if args.quick else 7
    folder = Path(tempfile.mkdtemp(prefix="agentcell-bench-store-"))
    try:
        rows = bench_appends(folder, seconds)
        rows += bench_reopen(folder, 10_000, repeats)
        rows += bench_view((10, 1_000, 10_000), 200 if args.quick else 2_000)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    meta = {
        "seconds_per_append_run": seconds,
        "in_flight": IN_FLIGHT,
        "appends_per_turn": TURN,
        "tmp_filesystem": tempfile.gettempdir(),
        "quick": args.quick,
    }
    write_results(NAME, rows, meta)


if __name__ == "__main__":
    main()
