"""`python -m benchmarks.ab`: a benchmark's figures of two versions, side by side."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.ab import SPECS, Figures, compare, export

SPEC = Figures(("side",), {"cpu_ms_per_turn": False, "turns_per_s": True})


def _doc(**sides: tuple[float, float]) -> dict[str, object]:
    return {
        "rows": [
            {"side": side, "cpu_ms_per_turn": cpu, "turns_per_s": rate, "note": "text is not a figure"}
            for side, (cpu, rate) in sides.items()
        ]
    }


def test_each_figure_gets_both_sides_runs_their_medians_and_a_verdict() -> None:
    before = [_doc(native=(1.5, 400.0)), _doc(native=(2.0, 350.0)), _doc(native=(1.7, 380.0))]
    after = [_doc(native=(1.6, 390.0)), _doc(native=(1.8, 360.0)), _doc(native=(1.7, 370.0))]
    rows = {row["figure"]: row for row in compare(SPEC, before, after)}
    assert set(rows) == {"cpu_ms_per_turn", "turns_per_s"}
    cpu = rows["cpu_ms_per_turn"]
    assert cpu["before"] == [1.5, 2.0, 1.7] and cpu["after"] == [1.6, 1.8, 1.7]
    assert (cpu["before_median"], cpu["after_median"], cpu["after_vs_before"]) == (1.7, 1.7, 1.0)
    assert cpu["verdict"] == "overlapping: no difference shown"
    assert rows["turns_per_s"]["after_median"] == 370.0


@pytest.mark.parametrize(
    ("after_cpu", "after_rate", "cpu_verdict", "rate_verdict"),
    [
        (2.5, 300.0, "every after run worse (1 in 3 by chance)", "every after run worse (1 in 3 by chance)"),
        (
            1.0,
            500.0,
            "every after run better (1 in 3 by chance)",
            "every after run better (1 in 3 by chance)",
        ),
    ],
)
def test_a_difference_is_called_only_when_the_sides_do_not_overlap_by_the_figures_direction(
    after_cpu: float, after_rate: float, cpu_verdict: str, rate_verdict: str
) -> None:
    before = [_doc(native=(1.5, 400.0)), _doc(native=(2.0, 350.0))]
    after = [_doc(native=(after_cpu, after_rate))]
    rows = {row["figure"]: row for row in compare(SPEC, before, after)}
    assert rows["cpu_ms_per_turn"]["verdict"] == cpu_verdict
    assert rows["turns_per_s"]["verdict"] == rate_verdict


def test_rows_or_figures_only_one_side_has_are_left_out() -> None:
    before = [
        {"rows": [{"side": "native", "cpu_ms_per_turn": 1.5}, {"side": "old_only", "cpu_ms_per_turn": 9.0}]}
    ]
    after = [{"rows": [{"side": "native", "cpu_ms_per_turn": 1.4, "turns_per_s": 400.0}]}]
    rows = compare(SPEC, before, after)
    assert [(row["row"], row["figure"]) for row in rows] == [("native", "cpu_ms_per_turn")]


def test_the_capacity_figures_it_compares_are_the_ones_bench_capacity_writes() -> None:
    from benchmarks.bench_capacity import Run, _row

    run = Run("runtime_native", 10, 30, 1.0, 0.06, 0.01, [0.1] * 30, 0, 0.04, 0.02)
    row = _row("runtime_native", [run])
    assert set(SPECS["capacity"].figures) <= set(row)
    assert (row["user_ms_per_turn"], row["sys_ms_per_turn"]) == (
        pytest.approx(4 / 3, abs=1e-3),
        pytest.approx(2 / 3, abs=1e-3),
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_version_compared_with_is_exported_from_the_repository(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    commit = export("HEAD", tmp_path / "tree")
    assert commit and (tmp_path / "tree" / "runtime" / "__init__.py").is_file()
    assert not (tmp_path / "tree.tar").exists()
