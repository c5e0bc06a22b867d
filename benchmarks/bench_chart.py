"""The scale chart: turns/s and memory against the number of sessions (``results/scale.png``).

Drawn from ``results/throughput.json`` and ``results/sessions.json`` by ``python -m benchmarks`` (or on
its own: ``python -m benchmarks.bench_chart``). Needs matplotlib (in the ``dev`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks._common import results_dir

CHART = "scale.png"
_STYLES: dict[tuple[str, str], tuple[str, str, str]] = {
    # (mode, side): label, colour, line style
    ("http", "bare"): ("HTTP, bare litellm", "tab:gray", "--"),
    ("http", "runtime"): ("HTTP, runtime (litellm transport)", "tab:blue", "-"),
    ("http", "native"): ("HTTP, runtime (native transport)", "tab:purple", "-"),
    ("mock", "bare"): ("mock, bare litellm", "tab:olive", "--"),
    ("mock", "runtime"): ("mock, runtime", "tab:green", "-"),
    ("mock", "threads"): ("mock, thread per actor", "tab:red", ":"),
}


def _load(name: str, directory: Path) -> dict[str, Any] | None:
    try:
        document: dict[str, Any] = json.loads((directory / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return document


def draw(directory: Path | None = None) -> Path | None:
    """Draw the chart from the results in ``directory``; returns its path, or None without data."""
    folder = directory if directory is not None else results_dir()
    throughput, sessions = _load("throughput", folder), _load("sessions", folder)
    if throughput is None and sessions is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (turns_ax, memory_ax) = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    if throughput is not None:
        rows = [r for r in throughput["rows"] if r["bench"] in ("turns", "thread_per_actor")]
        for (mode, side), (label, colour, style) in _STYLES.items():
            points = sorted(
                {
                    r["sessions"]: r["turns_per_s"]
                    for r in rows
                    if r["mode"] == mode
                    and r["side"] == side
                    and r["bench"] == ("thread_per_actor" if side == "threads" else "turns")
                }.items()
            )
            if points:
                xs, ys = zip(*points, strict=True)
                turns_ax.plot(xs, ys, style, marker="o", color=colour, label=label)
    turns_ax.set(
        xscale="log",
        yscale="log",  # the native transport's turns/s are an order of magnitude above litellm's
        xlabel="concurrent sessions",
        ylabel="turns per second (log)",
        title="Turn throughput (2 streamed calls + a tool per HTTP turn)",
    )
    turns_ax.grid(True, which="both", alpha=0.3)
    turns_ax.legend(fontsize="small")

    if sessions is not None:
        for kind, label, colour in (
            ("runtime", "runtime, idle sessions", "tab:blue"),
            ("bare", "bare: a dict entry + 2 files", "tab:gray"),
            ("running", "runtime, actors started", "tab:orange"),
        ):
            points = sorted(
                (r["sessions"], r["rss_bytes_per_session"] / 1024)
                for r in sessions["rows"]
                if r["kind"] == kind
            )
            if points:
                xs, ys = zip(*points, strict=True)
                memory_ax.plot(xs, ys, marker="o", color=colour, label=label)
        memory_ax.axhline(10, color="tab:red", linestyle=":", label="target: 10 KB per idle session")
    memory_ax.set(
        xscale="log",
        xlabel="sessions hosted",
        ylabel="RSS per session (KB)",
        title="Memory per session",
    )
    memory_ax.set_ylim(bottom=0)
    memory_ax.grid(True, which="both", alpha=0.3)
    memory_ax.legend(fontsize="small")

    machine = (throughput or sessions or {}).get("machine", {})
    fig.suptitle(
        f"agentcell benchmarks — {machine.get('cpus', '?')} CPUs, Python {machine.get('python', '?')}",
        fontsize="medium",
    )
    path = folder / CHART
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    out = draw()
    print(f"wrote {out}" if out is not None else "no results to draw")
