"""What the spans cost a turn, counted on the thread that makes them (design §7.5).

The spans are made from the events on a bus subscriber's thread, so their cost is that thread's CPU time, which
``/proc`` counts exactly (``schedstat``: nanoseconds run), and the thread switches that wake it (its voluntary
context switches; each is tens of microseconds of CPU on a VM). Whole-process CPU a turn (``bench_overhead``'s
``traced`` rows against its ``default`` ones) swings by more than the spans cost in a short run. This runs one
runtime with an OpenTelemetry SDK tracer provider (a batch span processor whose exporter drops the spans) and
100 sessions answered by litellm's in-process mock (an answer turn: two spans), and counts, per turn:

- ``sequential``: 500 turns one after another (each event of a turn finds the spans' queue empty);
- ``concurrent``: 5 rounds of one turn in each of the 100 sessions at once.

Linux only (``/proc/self/task``). Run: ``python -m benchmarks.bench_spans``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._common import format_table, write_results
from benchmarks.bench_overhead import sdk_tracer_provider

NAME = "spans"
SESSIONS = 100
TURNS = 500


def _thread_counts(tid: int) -> tuple[int, int]:
    """(voluntary context switches, nanoseconds run) of thread ``tid`` of this process."""
    with open(f"/proc/self/task/{tid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        ran = int(f.read().split()[0])
    return int(status["voluntary_ctxt_switches"]), ran


def _row(
    kind: str, turns: int, before: tuple[int, int], after: tuple[int, int], cpu: float
) -> dict[str, Any]:
    return {
        "kind": kind,
        "turns": turns,
        "spans_thread_wakes_per_turn": round((after[0] - before[0]) / turns, 2),
        "spans_thread_us_per_turn": round((after[1] - before[1]) / turns / 1e3, 1),
        "process_cpu_ms_per_turn": round(cpu / turns * 1e3, 2),
    }


def measure(turns: int) -> list[dict[str, Any]]:
    from runtime import Runtime
    from runtime.config import Config

    folder = tempfile.mkdtemp(prefix="agentcell-bench-spans-")
    rt = Runtime(
        Config().with_overrides({"agent.mock_response": "ok"}),
        sessions_dir=folder,
        tracer_provider=sdk_tracer_provider(),
    ).start()
    try:
        tracing = rt._machinery.tracing
        threads = [t for t in threading.enumerate() if t.name.startswith("bus-callback")]
        if tracing is None or len(threads) != 1 or threads[0].native_id is None:
            raise RuntimeError("expected one bus callback thread: the spans'")
        tid = threads[0].native_id
        sids = [rt.start_session(model="openai/gpt-4o-mini", api_key="sk-bench") for _ in range(SESSIONS)]
        for sid in sids:  # (their actors start, and litellm warms up, before the counts)
            rt.prompt(sid, "warm").result(timeout=60)
        tracing.flush()
        rows = []
        before, cpu = _thread_counts(tid), time.process_time()
        for i in range(turns):
            rt.prompt(sids[i % SESSIONS], "hi").result(timeout=60)
        tracing.flush()
        rows.append(_row("sequential", turns, before, _thread_counts(tid), time.process_time() - cpu))

        async def round_() -> None:
            await asyncio.gather(*(rt.prompt(sid, "hi") for sid in sids))

        rounds = max(1, turns // SESSIONS)
        before, cpu = _thread_counts(tid), time.process_time()
        for _ in range(rounds):
            asyncio.run(round_())
        tracing.flush()
        rows.append(
            _row("concurrent", rounds * SESSIONS, before, _thread_counts(tid), time.process_time() - cpu)
        )
        return rows
    finally:
        rt.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=TURNS, help="turns of each kind")
    args = parser.parse_args(argv)
    rows = measure(args.turns)
    print(format_table(rows))
    write_results(NAME, rows, {"sessions": SESSIONS, "turns": args.turns}, table=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
