"""Sessions per process (design §8): host 10,000, 100,000 and 1,000,000 idle sessions in one runtime.

Each size runs in a fresh child process, so one run's freed memory cannot hide the next run's growth.
The child starts a default runtime with an empty sessions directory and then measures:

- ``start``: the wall time and CPU time for N ``start_session`` calls to return, per session. After that
  the session is hosted and usable, and its header line is queued for the sessions index.
- ``durable``: the time from the last start until every header is written to the index and fsynced
  (``durable_after_last_s``); ``on_disk_s`` is the same moment counted from the first start.
- ``rss``: RSS growth per session after a full garbage collection: the runtime's overhead per idle
  session (an idle session holds no messages, and its actors start on first use).
- ``files``: the files under the sessions directory, and the most entries any one folder holds.
- ``wake``: prompts to ``WAKES`` random idle sessions, one at a time (litellm's in-process
  ``mock_response``), each timed from ``prompt`` to its answer: the first use of a session starts its
  actors and reads its (missing) log. Its baseline is the same prompt to a session whose actors already
  run (``hot``), taken in turns with the wakes; ``wake_extra`` is the difference, at the median and p99.
- ``stop``: ``Runtime.stop()``.

Baseline, in its own child of the same size: the least a persistent session can cost. That is an id, a
small object in a dict holding its header line, and the same header appended to one index file with bare
``os.write`` (a write per 1,000 sessions) and fsynced at the end; its ``stop`` closes the file.

Running sessions: in the 10,000-session run, the actors of 1,000 of the sessions are started (5 pooled
actors each, plus a supervisor). The bench measures RSS per running session, then hibernates every session
(its actors stop and its state stays in the log) and counts the live actors before and after.

Targets (design §8): 1,000,000 sessions hosted; at most 3 KB of runtime overhead per idle session; start
per session at 1,000,000 within 1.2x of its value at 10,000 (judged on CPU time: on a shared machine the
wall time is mostly other work; both are in the table); durable within 30 s of the last start; wake
p99 at most 20 ms above a hot prompt; ``stop`` in at most 10 s.

Run: ``python -m benchmarks.bench_sessions`` (``--quick``: 10,000 only; ``--sizes 10000,100000``).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import psutil

from benchmarks._common import write_results

NAME = "sessions"
TARGET_HOSTED = 1_000_000
TARGET_BYTES_PER_SESSION = 3 * 1024
TARGET_START_RATIO = 1.2  # start per session at the largest size / at 10,000
TARGET_DURABLE_S = 30.0
TARGET_WAKE_P99_MS = 20.0
TARGET_STOP_S = 10.0
MOCK_REPLY = "Still here."
MODEL = "openai/gpt-4o-mini"
RUNNING = 1_000  # sessions whose actors are started in the "running" measurement ...
RUNNING_IN = 10_000  # ... taken from the run with this many idle sessions
WAKES = 200  # prompts to random idle sessions (and as many to hot ones)
BARE_BATCH = 1_000  # sessions per write of the bare baseline's index


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _start_row(
    kind: str,
    n: int,
    hosted: int,
    seconds: float,
    cpu_seconds: float,
    on_disk: float,
    grown: int,
    folder: str,
) -> dict[str, Any]:
    """What starting ``n`` sessions cost one side: time, CPU, time until on disk, memory and files."""
    files, widest = _files(folder)
    return {
        "kind": kind,
        "sessions": n,
        "hosted": hosted,
        "start_s": seconds,
        "start_us_per_session": seconds / n * 1e6,
        "cpu_us_per_session": cpu_seconds / n * 1e6,
        "on_disk_s": on_disk,
        "durable_after_last_s": on_disk - seconds,
        "rss_bytes_per_session": round(grown / n),
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "files": files,
        "widest_folder": widest,
    }


def _files(folder: str) -> tuple[int, int]:
    """Files under ``folder``, and the most entries one folder holds."""
    files = widest = 0
    for _root, dirs, names in os.walk(folder):
        files += len(names)
        widest = max(widest, len(dirs) + len(names))
    return files, widest


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the baseline ----------------------------------------------------------------------------------------


class _BareSession:
    __slots__ = ("header", "id")

    def __init__(self, session_id: str, header: bytes) -> None:
        self.id = session_id
        self.header = header


def measure_bare(n: int, folder: str) -> dict[str, Any]:
    """N sessions as an id and a slotted object with its header line, appended to one file in batches."""
    sessions: dict[str, _BareSession] = {}
    fd = os.open(os.path.join(folder, "index.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rss = _rss()
    cpu, began = time.process_time(), time.perf_counter()
    batch: list[bytes] = []
    for _ in range(n):
        sid = os.urandom(8).hex()
        header = {"type": "header", "v": 1, "session_id": sid, "created_at": time.time(), "model": MODEL}
        line = json.dumps(header).encode() + b"\n"
        sessions[sid] = _BareSession(sid, line)
        batch.append(line)
        if len(batch) == BARE_BATCH:
            os.write(fd, b"".join(batch))
            batch = []
    seconds = time.perf_counter() - began
    cpu_seconds = time.process_time() - cpu
    os.write(fd, b"".join(batch))
    os.fsync(fd)
    on_disk = time.perf_counter() - began
    grown = _rss() - rss
    stopping = time.perf_counter()
    os.close(fd)
    sessions.clear()
    stop_s = time.perf_counter() - stopping
    return {**_start_row("bare", n, n, seconds, cpu_seconds, on_disk, grown, folder), "stop_s": stop_s}


# -- the runtime -------------------------------------------------------------------------------------------


def _runtime(folder: str) -> Any:
    from runtime import Runtime
    from runtime.config import Config
    from runtime.gateway import load_litellm

    load_litellm()  # imported now, so the runtime's background import does not run during the timing
    config = Config().with_overrides({"agent.mock_response": MOCK_REPLY})
    return Runtime(config, sessions_dir=folder).start()


def _answer(rt: Any, sid: str) -> float:
    """Seconds from prompting ``sid`` to its answer."""
    began = time.perf_counter()
    result = rt.prompt(sid, "Are you there?").result(timeout=120)
    took = time.perf_counter() - began
    if result.status != "ok" or result.text != MOCK_REPLY:
        raise RuntimeError(f"session {sid} did not answer: {result}")
    return took


def _wake(rt: Any, sids: list[str], hot: list[str]) -> dict[str, Any]:
    """Prompt random idle sessions and, in turns, sessions already running: latencies in ms."""
    rng = random.Random(32)
    idle = rng.sample(sids, min(WAKES, len(sids)))
    for sid in hot:
        _answer(rt, sid)  # their actors run from here on
    woken, warm = [], []
    for i, sid in enumerate(idle):
        woken.append(_answer(rt, sid) * 1e3)
        warm.append(_answer(rt, hot[i % len(hot)]) * 1e3)
    p50, p99 = statistics.median(woken), _quantile(woken, 0.99)
    hot50, hot99 = statistics.median(warm), _quantile(warm, 0.99)
    return {
        "wakes": len(woken),
        "wake_p50_ms": round(p50, 2),
        "wake_p99_ms": round(p99, 2),
        "hot_p50_ms": round(hot50, 2),
        "hot_p99_ms": round(hot99, 2),
        "wake_extra_p50_ms": round(p50 - hot50, 2),
        "wake_extra_p99_ms": round(p99 - hot99, 2),
    }


def measure_runtime(n: int, folder: str, running: int = 0) -> list[dict[str, Any]]:
    """Start N idle sessions, wake random ones; then start ``running`` sessions' actors; stop."""
    rt = _runtime(folder)
    rows: list[dict[str, Any]] = []
    try:
        hot = [rt.start_session(model=MODEL) for _ in range(100)]  # also warms the code paths
        rt.services.writer.flush()
        rss = _rss()
        cpu, began = time.process_time(), time.perf_counter()
        sids = [rt.start_session(model=MODEL) for _ in range(n)]
        seconds = time.perf_counter() - began
        cpu_seconds = time.process_time() - cpu
        rt.services.writer.flush()  # every header written to the index and fsynced
        on_disk = time.perf_counter() - began
        grown = _rss() - rss
        hosted = len(rt.hosted_sessions())
        row = _start_row("runtime", n, hosted, seconds, cpu_seconds, on_disk, grown, folder)
        rows.append(row)
        if running:  # (first: the wakes below would leave some of these sessions running already)
            rows.append(_running(rt, sids[-running:]))
        row |= _wake(rt, sids, hot[:10])
    finally:
        stopping = time.perf_counter()
        rt.stop(timeout=120)
        stop_s = time.perf_counter() - stopping
    rows[0]["stop_s"] = stop_s
    return rows


def _running(rt: Any, sids: list[str]) -> dict[str, Any]:
    """Start the actors of idle sessions (their first request does), then hibernate them all."""
    idle_actors = len(rt.dispatcher)
    rss = _rss()
    began = time.perf_counter()
    for sid in sids:
        rt.usage(sid)
    start_s = time.perf_counter() - began
    grown = _rss() - rss
    running_actors = len(rt.dispatcher)
    began = time.perf_counter()
    parked = sum(rt.hibernate(sid) for sid in sids)
    hibernate_s = time.perf_counter() - began
    return {
        "kind": "running",
        "sessions": len(sids),
        "hosted": len(rt.hosted_sessions()),
        "start_s": start_s,
        "start_us_per_session": start_s / len(sids) * 1e6,
        "rss_bytes_per_session": round(grown / len(sids)),
        "actors_before": idle_actors,
        "actors_running": running_actors,
        "hibernated": parked,
        "hibernate_s": hibernate_s,
        "actors_after_hibernate": len(rt.dispatcher),
    }


def _child(kind: str, n: int, running: int, conn: Any) -> None:
    import runtime  # noqa: F401  (offline litellm/tiktoken environment)

    folder = tempfile.mkdtemp(prefix=f"agentcell-bench-sessions-{kind}-")
    try:
        conn.send([measure_bare(n, folder)] if kind == "bare" else measure_runtime(n, folder, running))
    except BaseException as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_child(kind: str, n: int, running: int = 0) -> list[dict[str, Any]]:
    """One measurement in a fresh (spawned) process: its rows."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(kind, n, running, child), name=f"bench-sessions-{kind}-{n}")
    process.start()
    child.close()
    try:
        result: list[dict[str, Any]] | dict[str, Any] = parent.recv()
    except EOFError:
        result = {"error": f"the child process died (exit code {process.exitcode})"}
    process.join(600)
    if isinstance(result, dict):
        raise RuntimeError(f"{kind} with {n:,} sessions failed: {result['error']}")
    return result


def _print(row: dict[str, Any]) -> None:
    line = (
        f"  {row['kind']:8} {row['sessions']:>9,} sessions: {row['start_us_per_session']:5.1f} us each,"
        f" durable {row['durable_after_last_s']:5.2f} s after the last, {row['rss_bytes_per_session']:>5,} B"
        f" RSS each, {row['files']:,} files (widest folder {row['widest_folder']:,}),"
        f" stop {row['stop_s']:5.2f} s"
    )
    if "wake_p99_ms" in row:
        line += (
            f", wake p50/p99 {row['wake_p50_ms']:.1f}/{row['wake_p99_ms']:.1f} ms"
            f" (hot {row['hot_p50_ms']:.1f}/{row['hot_p99_ms']:.1f})"
        )
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 sessions only")
    parser.add_argument("--sizes", default=None, help="comma-separated session counts")
    args = parser.parse_args(argv)
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    else:
        sizes = [10_000] if args.quick else [10_000, 100_000, 1_000_000]

    rows: list[dict[str, Any]] = []
    for n in sizes:
        (bare,) = run_child("bare", n)
        ours, *extra = run_child("runtime", n, RUNNING if n == RUNNING_IN else 0)
        ours["time_vs_bare"] = round(ours["start_s"] / bare["start_s"], 2)
        ours["memory_vs_bare"] = round(
            ours["rss_bytes_per_session"] / max(1, bare["rss_bytes_per_session"]), 1
        )
        ours["stop_vs_bare_s"] = round(ours["stop_s"] - bare["stop_s"], 3)
        for row in (bare, ours):
            rows.append(row)
            _print(row)
        for row in extra:
            rows.append(row)
            print(
                f"  running  {row['sessions']:>9,} sessions: actors {row['actors_before']:,} ->"
                f" {row['actors_running']:,} -> {row['actors_after_hibernate']:,} after hibernation,"
                f" {row['rss_bytes_per_session']:,} B RSS per running session",
                flush=True,
            )

    ours_rows = {r["sessions"]: r for r in rows if r["kind"] == "runtime"}
    largest = max(ours_rows.values(), key=lambda r: r["sessions"])
    smallest = min(ours_rows.values(), key=lambda r: r["sessions"])
    # Per-session figures of small runs are dominated by allocator granularity: judge the large ones.
    judged = [r for r in ours_rows.values() if r["sessions"] >= 10_000] or list(ours_rows.values())
    worst_bytes = max(r["rss_bytes_per_session"] for r in judged)
    # Judged on CPU time: the wall time of a run on a shared machine is mostly other processes' load.
    start_ratio = largest["cpu_us_per_session"] / smallest["cpu_us_per_session"]
    wall_ratio = largest["start_us_per_session"] / smallest["start_us_per_session"]
    worst = {
        "durable_after_last_s": max(r["durable_after_last_s"] for r in judged),
        "wake_extra_p99_ms": max(r["wake_extra_p99_ms"] for r in judged),
        "stop_s": max(r["stop_s"] for r in judged),
    }
    met = {
        "hosted_1m": largest["hosted"] >= TARGET_HOSTED,
        "bytes_per_idle_session": worst_bytes <= TARGET_BYTES_PER_SESSION,
        "start_flat": len(ours_rows) > 1 and start_ratio <= TARGET_START_RATIO,
        "durable_30s": worst["durable_after_last_s"] <= TARGET_DURABLE_S,
        "wake_p99_20ms": worst["wake_extra_p99_ms"] <= TARGET_WAKE_P99_MS,
        "stop_10s": worst["stop_s"] <= TARGET_STOP_S,
    }
    meta = {
        "sizes": sizes,
        "targets": {
            "hosted": {"target": TARGET_HOSTED, "measured": largest["hosted"]},
            "bytes_per_idle_session": {"target": TARGET_BYTES_PER_SESSION, "measured": worst_bytes},
            "start_ratio": {
                "target": TARGET_START_RATIO,
                "measured": round(start_ratio, 3),
                "wall_clock": round(wall_ratio, 3),
                "between": [smallest["sessions"], largest["sessions"]],
            },
            "durable_after_last_s": {
                "target": TARGET_DURABLE_S,
                "measured": round(worst["durable_after_last_s"], 3),
            },
            "wake_extra_p99_ms": {"target": TARGET_WAKE_P99_MS, "measured": worst["wake_extra_p99_ms"]},
            "stop_s": {"target": TARGET_STOP_S, "measured": round(worst["stop_s"], 3)},
        },
        "met": met,
        "model": MODEL,
        "note": "each size in a fresh spawned process; RSS after gc.collect(); sessions idle (no messages)",
    }
    print()
    write_results(NAME, rows, meta)
    for what, ok in met.items():
        print(f"target {what}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
