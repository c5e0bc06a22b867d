"""The machine facts every benchmark result carries."""

from __future__ import annotations

import os
import threading

import pytest

from benchmarks._common import machine_info, thread_handover

PINNABLE = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1


@pytest.mark.skipif(not PINNABLE, reason="needs Linux and more than one CPU")
def test_the_handover_probe_times_both_placements_and_gives_the_thread_its_cpus_back() -> None:
    before = os.sched_getaffinity(0)
    figures = thread_handover(round_trips=200)
    assert set(figures) == {
        "two_cpus_round_trip",
        "two_cpus_round_trip_cpu",
        "one_cpu_round_trip",
        "one_cpu_round_trip_cpu",
    }
    assert all(value > 0 for value in figures.values())
    assert os.sched_getaffinity(0) == before
    assert not [t for t in threading.enumerate() if t.name == "handover-probe"]


def test_every_result_says_what_a_thread_handover_cost() -> None:
    info = machine_info()
    assert info["thread_handover_us"], "the probe gave no figure"
    assert all(value > 0 for value in info["thread_handover_us"].values())


@pytest.mark.skipif(not PINNABLE, reason="needs Linux and more than one CPU")
def test_a_host_that_refuses_pinning_still_gets_its_results_written(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_pid: int, _cpus: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    info = machine_info()
    assert "Operation not permitted" in info["thread_handover_us"]["error"]
    assert info["packages"], "the other machine facts are still there"
