"""Shared benchmark helpers: machine facts, a plain-text table, and the JSON results file.

``write_results(name, rows, meta)`` prints ``rows`` as a table and writes
``benchmarks/results/<name>.json`` as ``{"name", "created", "machine", "meta", "rows"}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "format_table", "machine_info", "results_dir", "thread_handover", "write_results"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS_ENV = "AGENTCELL_BENCH_RESULTS"


def results_dir() -> Path:
    """Where results are written and read: ``$AGENTCELL_BENCH_RESULTS`` (``python -m benchmarks --results
    DIR`` sets it for the benchmarks it runs), else ``benchmarks/results`` of this checkout."""
    chosen = os.environ.get(RESULTS_ENV)
    return Path(chosen).resolve() if chosen else RESULTS_DIR


def machine_info() -> dict[str, Any]:
    """What a reader needs to compare figures across machines."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpus": os.cpu_count(),
        "switch_interval_s": sys.getswitchinterval(),
    }
    if hasattr(os, "getloadavg"):  # other work on the machine skews every figure: say how much there was
        info["load_average_at_write_1_5_15m"] = [round(x, 2) for x in os.getloadavg()]
    # How dear it is here to wake another thread: it sets what every hop between threads costs (actors,
    # the I/O loop, the log writer, reader threads), and it changes from host to host, day to day.
    try:
        info["thread_handover_us"] = thread_handover()
    except OSError as exc:  # a figure for context: never worth a benchmark's results
        info["thread_handover_us"] = {"error": str(exc)}
    try:
        import psutil

        info["memory_total_mb"] = round(psutil.virtual_memory().total / 2**20)
        info["cpus_physical"] = psutil.cpu_count(logical=False)
    except ImportError:
        pass
    versions = {}
    for package in ("agentcell", "pykka", "msgspec", "litellm", "tiktoken"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    info["packages"] = versions
    return info


def thread_handover(round_trips: int = 2_000) -> dict[str, float]:
    """Microseconds a round trip takes when two threads wake each other in turn through locks: wall
    clock and CPU, with the two threads on two different CPUs and both on one CPU (where the OS lets a
    thread choose its CPUs), else wherever the OS puts them.

    The calling thread's CPU affinity is what it was afterwards.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus:
        wall, cpu = _ping_pong(round_trips, None, None)
        return {"round_trip": wall, "round_trip_cpu": cpu}
    mine = set(cpus)
    result: dict[str, float] = {}
    try:
        if len(cpus) > 1:
            wall, cpu = _ping_pong(round_trips, cpus[0], cpus[1])
            result |= {"two_cpus_round_trip": wall, "two_cpus_round_trip_cpu": cpu}
        wall, cpu = _ping_pong(round_trips, cpus[0], cpus[0])
        result |= {"one_cpu_round_trip": wall, "one_cpu_round_trip_cpu": cpu}
    finally:
        os.sched_setaffinity(0, mine)
    return result


def _ping_pong(round_trips: int, here: int | None, there: int | None) -> tuple[float, float]:
    """Round trips between this thread (on CPU ``here``) and a helper (on ``there``): µs wall, µs CPU."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        if there is not None:
            with contextlib.suppress(OSError):  # the CPU was taken away since: time it wherever it runs
                os.sched_setaffinity(0, {there})  # 0: the calling thread only
        for _ in range(round_trips):
            ping.acquire()
            pong.release()

    if here is not None:
        os.sched_setaffinity(0, {here})
    helper = threading.Thread(target=other, name="handover-probe", daemon=True)
    helper.start()
    began, cpu_began = time.perf_counter(), time.process_time()
    for _ in range(round_trips):
        ping.release()
        pong.acquire()
    wall, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
    helper.join()
    return round(wall / round_trips * 1e6, 1), round(cpu_seconds / round_trips * 1e6, 1)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as an aligned table; columns are the union of the rows' keys, in first-seen order."""
    if not rows:
        return "(no rows)"
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(line[i]) for line in cells)) for i, col in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out.extend(line(values) for values in cells)
    return "\n".join(out)


def write_results(
    name: str,
    rows: list[dict[str, Any]],
    meta: dict[str, Any],
    *,
    directory: Path | None = None,
    table: bool = True,
) -> Path:
    """Print ``rows`` as a table (unless ``table`` is False) and write them, with ``meta`` and machine
    facts, to ``<name>.json``."""
    if table:
        print(format_table(rows))
    out_dir = directory if directory is not None else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    document = {
        "name": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "meta": meta,
        "rows": rows,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")
    return path
