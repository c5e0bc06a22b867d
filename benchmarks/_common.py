"""Shared benchmark helpers: machine facts, a plain-text table, and the JSON results file.

``write_results(name, rows, meta)`` prints ``rows`` as a table and writes
``benchmarks/results/<name>.json`` as ``{"name", "created", "machine", "meta", "rows"}``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "format_table", "machine_info", "write_results"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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
    out_dir = directory if directory is not None else RESULTS_DIR
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
