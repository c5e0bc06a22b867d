"""Before and after in one run: one benchmark, two versions of agentcell, taking turns on this machine.

    python -m benchmarks.ab REV [--bench capacity] [--pairs 3] [-- ARGS for the benchmark]

``REV`` (a commit, tag or branch of this repository) is exported into a temporary folder (``git archive``);
"after" is this checkout as it is, uncommitted changes included. Each pair runs ``python -m
benchmarks.bench_<bench> ARGS`` once from each tree, each in a process of its own with its tree first on
``PYTHONPATH`` and its results in a temporary folder, in the order A B, B A, A B, ... so that a machine
growing busier or quieter during the run weighs on both sides alike. Each tree runs its own version of the
benchmark, as anyone checking that commit out would.

On a shared machine one process's figures swing by a third; a single before/after pair says little. The
table gives every process's figure, the median of each side and their ratio, and calls a difference only when
the two sides do not overlap at all, with the odds of that by chance alone. Run it on a quiet machine.

Examples::

    python -m benchmarks.ab fc624e2 --bench capacity --pairs 4 -- --sides runtime_native,bare_openai
    python -m benchmarks.ab main~10 --bench actors --pairs 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_ENV, format_table, write_results

ROOT = Path(__file__).resolve().parent.parent
NAME = "ab"


@dataclass(frozen=True)
class Figures:
    """How to read a benchmark's rows: the fields that name a row, and its figures (True: higher is better)."""

    keys: tuple[str, ...]
    figures: Mapping[str, bool]


SPECS: dict[str, Figures] = {
    "capacity": Figures(
        ("side",),
        {"cpu_ms_per_turn": False, "user_ms_per_turn": False, "sys_ms_per_turn": False, "turns_per_s": True},
    ),
    "actors": Figures(("bench", "kind", "n"), {"rate_per_s": True, "rss_bytes_per_actor": False}),
    "overhead": Figures(("turn", "config", "sessions"), {"cpu_ms_per_turn": False, "turns_per_s": True}),
    "gateway": Figures(("side",), {"cpu_ms_per_call": False, "median_calls_per_s": True}),
}


def compare(
    spec: Figures, before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per (row name, figure) found on both sides: each side's figures in run order, their medians,
    after/before, and a verdict.

    ``before`` and ``after`` are the benchmark's results documents, one per process. The verdict calls a
    difference only when the two sides' figures do not overlap at all (every after run better, or worse, than
    every before run) and says how likely that is by chance alone if the versions were the same (one in
    C(n + m, m) for n and m runs: 1 in 20 for 3 and 3); otherwise the sides overlap and no difference is
    shown.
    """

    def collect(docs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[float]]:
        values: dict[tuple[str, str], list[float]] = {}
        for doc in docs:
            for row in doc.get("rows", ()):
                name = " ".join(str(row.get(k)) for k in spec.keys if k in row)
                for figure in spec.figures:
                    value = row.get(figure)
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        values.setdefault((name, figure), []).append(float(value))
        return values

    old, new = collect(before), collect(after)
    rows = []
    for (name, figure), was in old.items():
        now = new.get((name, figure))
        if not now:
            continue
        median_was, median_now = statistics.median(was), statistics.median(now)
        higher_is_better = spec.figures[figure]
        chance = f"1 in {math.comb(len(was) + len(now), len(now))} by chance"
        if min(now) > max(was):
            verdict = f"every after run {'better' if higher_is_better else 'worse'} ({chance})"
        elif max(now) < min(was):
            verdict = f"every after run {'worse' if higher_is_better else 'better'} ({chance})"
        else:
            verdict = "overlapping: no difference shown"
        rows.append(
            {
                "row": name,
                "figure": figure,
                "before": [round(v, 3) for v in was],
                "after": [round(v, 3) for v in now],
                "before_median": round(median_was, 3),
                "after_median": round(median_now, 3),
                "after_vs_before": round(median_now / median_was, 3) if median_was else None,
                "verdict": verdict,
            }
        )
    return rows


def export(rev: str, into: Path) -> str:
    """Write the tree of ``rev`` into ``into``; returns the commit's short hash."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = into.with_suffix(".tar")
    subprocess.run(["git", "-C", str(ROOT), "archive", "--output", str(archive), commit], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return commit


def run_once(tree: Path, bench: str, args: Sequence[str], results: Path) -> dict[str, Any]:
    """One process of the benchmark from ``tree``; its results document."""
    results.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(tree), RESULTS_ENV: str(results)}
    subprocess.run([sys.executable, "-m", f"benchmarks.bench_{bench}", *args], cwd=tree, env=env, check=True)
    documents = sorted(results.glob("*.json"))
    if len(documents) != 1:
        raise RuntimeError(f"bench_{bench} from {tree} wrote {len(documents)} results files, not 1")
    doc: dict[str, Any] = json.loads(documents[0].read_text())
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("rev", help="the version to compare this checkout with (a commit, tag or branch)")
    parser.add_argument("--bench", default="capacity", help="the benchmark (default capacity)")
    parser.add_argument("--pairs", type=int, default=3, help="processes of each side (default 3)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.args = argv[cut + 1 :]  # the benchmark's own, after --
    spec = SPECS.get(args.bench)
    if spec is None:
        parser.error(f"no figures known for {args.bench!r}: one of {', '.join(sorted(SPECS))}")
    with tempfile.TemporaryDirectory(prefix="agentcell-ab-") as tmp:
        before_tree = Path(tmp) / "before"
        commit = export(args.rev, before_tree)
        trees = {"before": before_tree, "after": ROOT}
        docs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        loads = []
        for pair in range(args.pairs):
            for side in ("before", "after") if pair % 2 == 0 else ("after", "before"):
                loads.append(round(os.getloadavg()[0], 2))
                print(
                    f"--- {side} ({commit if side == 'before' else 'this checkout'}), process {pair + 1}",
                    flush=True,
                )
                docs[side].append(run_once(trees[side], args.bench, args.args, Path(tmp) / f"{side}-{pair}"))
        rows = compare(spec, docs["before"], docs["after"])
    meta = {
        "bench": args.bench,
        "before": commit,
        "after": "this checkout",
        "pairs": args.pairs,
        "args": args.args,
        "load_average_1m_at_each_start": loads,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print()
    write_results(f"{NAME}_{args.bench}", rows, meta, table=False)
    print(format_table([{k: v for k, v in row.items() if k not in ("before", "after")} for row in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
