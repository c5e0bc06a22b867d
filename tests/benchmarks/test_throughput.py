"""How the throughput benchmark turns alternating slices into the reported ratio and its spread."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from benchmarks.bench_throughput import Pinned, Run, Side, Workload, _row, _spread, can_pin

WORK = Workload("mock", sessions=10, turns=2)


def _run(side: Side, turns_per_s: float) -> Run:
    # 20 turns in 20 / turns_per_s seconds: the slice's rate is exactly turns_per_s
    return Run(side, WORK, 20 / turns_per_s, 0.1, [0.05] * 20, calls=20, rss_mb=100.0)


def test_ratio_is_the_median_of_neighbouring_slices_not_of_the_median_rates() -> None:
    bare = [_run("bare", rate) for rate in (100, 50, 100, 50)]
    ours = [_run("runtime", rate) for rate in (95, 40, 90, 40)]  # pairwise: 0.95, 0.80, 0.90, 0.80
    row = _row(ours, bare)
    assert row["vs_bare"] == pytest.approx(0.85)
    # The sides' median rates (65 and 75) would say 0.87: the machine's drift between slices leaks in.
    assert row["turns_per_s"] == pytest.approx(65)
    assert row["vs_bare_spread"] == pytest.approx([0.8, 0.938], abs=1e-3)


def test_spread_is_the_quartiles_or_with_few_pairs_the_range() -> None:
    assert _spread([0.8, 1.0]) == [0.8, 1.0]
    assert _spread([0.9, 0.7, 0.8]) == [0.7, 0.9]
    low, high = _spread([0.70, 0.85, 0.88, 0.90, 0.92, 1.30])
    assert 0.70 < low < 0.88 and 0.90 < high < 1.30  # one wild slice pair does not set the spread


def test_a_baseline_row_has_no_ratio() -> None:
    row = _row([_run("bare", 50)], None)
    assert "vs_bare" not in row and "vs_bare_spread" not in row
    assert row["side"] == "bare" and row["slices"] == 1


def _masks() -> dict[int, set[int]]:
    """The CPU affinity of every thread of this process."""
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}


class _Slices:
    """A contender whose slice notes the affinity of every thread while it runs, or fails."""

    side: Side = "runtime"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[dict[int, set[int]]] = []

    async def open(self, warmup: int) -> None: ...

    async def close(self) -> None: ...

    async def slice(self) -> Run:
        self.seen.append(_masks())
        if self.fail:
            raise RuntimeError("the slice failed")
        return _run("runtime", 10)


@pytest.mark.skipif(not can_pin(), reason="needs Linux and more than one CPU")
def test_a_pinned_slice_runs_every_thread_on_one_cpu_and_frees_them_afterwards() -> None:
    everywhere = os.sched_getaffinity(0)
    one = {min(everywhere)}
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)  # a thread besides this one, as the runtime has many
    helper.start()
    try:
        ok, failing = _Slices(), _Slices(fail=True)
        run = asyncio.run(Pinned(ok, one, everywhere).slice())
        assert run.cpus == 1
        with pytest.raises(RuntimeError, match="failed"):
            asyncio.run(Pinned(failing, one, everywhere).slice())
        for seen in ok.seen + failing.seen:
            assert helper.native_id in seen
            assert all(mask == one for mask in seen.values())
        assert all(mask == everywhere for mask in _masks().values())
    finally:
        stop.set()
        helper.join()
