"""What ``Runtime.stop()`` costs with N idle sessions hosted, and how many events it publishes (design §1.4).

A session stopping publishes ``session_stopped`` to whoever follows it. With a million idle sessions that
must not become a million events because some subscriber follows every session for a few of them: the spans
(``telemetry.tracing``), or ``agentcell serve``'s drain, which counts running turns from ``agent_start`` and
``agent_end``. Each run starts a default runtime in a fresh child process, starts N sessions (idle: their
actors never start), and times ``stop()`` (wall and CPU), counting the events it published (the sum of
every session's ``seq`` after the stop, less before). Configurations:

- ``none``: nobody subscribes;
- ``traced``: an OpenTelemetry SDK tracer provider (a batch span processor whose exporter drops the spans);
- ``traced_drain``: the same, and an all-sessions subscriber of ``agent_start`` and ``agent_end`` as ``serve``
  has;
- ``every_event``: an all-sessions subscriber of every event type (a user's ``subscribe()``: it asked for
  each session's ``session_stopped``, and gets them);
- ``metrics_board``: a hand-built ``RuntimeMetrics(rt)`` and the dashboard's board (``SessionBoard``), as a
  server with its page open has (no tracing).

Run: ``python -m benchmarks.bench_stop`` (``--sizes 10000,100000,1000000``; ``--configs traced,none``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._common import format_table, write_results

NAME = "stop"
CONFIGS = ("none", "traced", "traced_drain", "every_event", "metrics_board")
SIZES = (10_000, 100_000)


def measure(config: str, n: int) -> dict[str, Any]:
    """Start a runtime with ``n`` idle sessions in ``config``, stop it, and say what the stop cost."""
    from runtime import Runtime
    from runtime.config import Config

    provider = None
    if config.startswith("traced"):
        from benchmarks.bench_overhead import sdk_tracer_provider

        provider = sdk_tracer_provider()
    folder = tempfile.mkdtemp(prefix="agentcell-bench-stop-")
    try:
        rt = Runtime(Config(), sessions_dir=folder, tracer_provider=provider).start()
        if (provider is not None) != (rt._machinery.tracing is not None):
            raise RuntimeError(f"{config}: tracing is {'off' if provider is not None else 'on'}")
        if config == "traced_drain":
            rt.subscribe("*", ("agent_start", "agent_end"), callback=lambda event: None)
        elif config == "every_event":
            rt.subscribe("*", queue_size=2 * n + 10)
        elif config == "metrics_board":
            from runtime.apps.dashboard import SessionBoard
            from runtime.observability.metrics import RuntimeMetrics

            RuntimeMetrics(rt, queue_size=2 * n + 10)
            SessionBoard.for_runtime(rt)
        sids = [rt.start_session(model="openai/idle") for _ in range(n)]
        rt.flush()
        bus = rt.bus
        before = sum(bus.last_seq(sid) for sid in sids)
        cpu, began = time.process_time(), time.perf_counter()
        rt.stop()
        seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu
        published = sum(bus.last_seq(sid) for sid in sids) - before
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "config": config,
        "sessions": n,
        "stop_s": round(seconds, 3),
        "stop_cpu_s": round(cpu_seconds, 3),
        "events_at_stop": published,
    }


def run_child(config: str, n: int) -> dict[str, Any]:
    """:func:`measure` in a fresh process (one run's memory and threads cannot weigh on the next)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_stop", "--child", config, str(n)],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated session counts")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {CONFIGS}")
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]))))
        return 0
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs: {sorted(unknown)}")
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for config in configs:
            row = run_child(config, n)
            print(
                f"  {config:>12} {n:>9,} sessions: stop {row['stop_s']:.3f} s (CPU {row['stop_cpu_s']:.3f} s),"
                f" {row['events_at_stop']:,} events",
                flush=True,
            )
            rows.append(row)
    print(format_table(rows))
    write_results(NAME, rows, {"sizes": args.sizes, "configs": configs}, table=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
