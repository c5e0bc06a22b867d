"""runtime.cpu: the runtime's own threads on one CPU, tools and the embedding program left free."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runtime import Runtime, affinity
from runtime.config import Config, load_config
from runtime.provider.script import ToolCallSpec, Turn
from runtime.tools.registry import ToolRegistry

CAN_PLACE = affinity.allowed_cpus() is not None and len(affinity.allowed_cpus() or ()) > 1
needs_two_cpus = pytest.mark.skipif(not CAN_PLACE, reason="needs Linux and a process allowed two CPUs")


def test_off_places_nothing() -> None:
    assert affinity.runtime_cpus("off") is None


def test_auto_chooses_one_allowed_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({2, 5, 7}))
    chosen = {}
    for pid in range(6):  # processes that each host a runtime spread over the CPUs
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        chosen[pid] = affinity.runtime_cpus("auto")
    assert all(c is not None and len(c) == 1 and c <= {2, 5, 7} for c in chosen.values())
    assert {next(iter(c)) for c in chosen.values() if c} == {2, 5, 7}


def test_auto_stays_off_where_one_cpu_would_cost_parallelism(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({3}))
    assert affinity.runtime_cpus("auto") is None  # one CPU anyway
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: None)
    assert affinity.runtime_cpus("auto") is None  # a platform that cannot place threads
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({0, 1}))
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert affinity.runtime_cpus("auto") is None  # free-threaded: threads really run at once


def test_a_cpu_the_process_may_not_use_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({0, 1}))
    assert affinity.runtime_cpus(1) == frozenset({1})
    with pytest.raises(ValueError, match=r"runtime.cpu = 4: this process may only use CPUs \[0, 1\]"):
        affinity.runtime_cpus(4)
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: None)
    with pytest.raises(ValueError, match="cannot place threads"):
        affinity.runtime_cpus(0)


def test_the_setting_is_checked_when_the_config_is_made() -> None:
    assert Config().runtime.cpu == "off"
    assert Config().with_overrides({"runtime.cpu": "auto"}).runtime.cpu == "auto"
    assert load_config(environ={"AGENTCELL_RUNTIME__CPU": "1"}).runtime.cpu == 1
    for bad in ("fast", -1):
        with pytest.raises((msgspec.ValidationError, ValueError)):
            Config().with_overrides({"runtime.cpu": bad})


def test_a_refused_placement_leaves_the_thread_where_it_was(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(_pid: int, _cpus: Any) -> None:
        raise PermissionError("not in this container")

    monkeypatch.setattr(os, "sched_setaffinity", refuse, raising=False)
    affinity.place_thread(frozenset({0}))  # no exception: the thread just runs wherever the OS puts it
    assert "could not place thread on CPUs [0]" in caplog.text


def _cpus_of(threads: list[threading.Thread]) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(thread.native_id or 0)) for thread in threads if thread.is_alive()}


def _runtime_threads(rt: Runtime) -> list[threading.Thread]:
    threads = [*rt.dispatcher._workers, rt.io._thread, rt.services.writer._thread]
    assert all(thread.is_alive() for thread in threads)
    return threads


@needs_two_cpus
def test_the_runtimes_threads_run_on_the_chosen_cpu_and_tools_do_not(
    sessions_dir: Path, workspace: Path, provider: Any
) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    cpu = max(allowed)
    tool_cpus: list[frozenset[int]] = []
    registry = ToolRegistry()

    @registry.tool
    def where() -> str:
        """Says which CPUs it may run on."""
        tool_cpus.append(frozenset(os.sched_getaffinity(0)))
        return "here"

    name = "affinity-script"
    provider.add_script(
        name, [Turn(tool_calls=(ToolCallSpec(name="where", arguments="{}"),)), Turn(text="done")]
    )
    config = Config().with_overrides({"runtime.cpu": cpu})
    with Runtime(config, sessions_dir=sessions_dir) as rt:
        assert rt.cpus == frozenset({cpu})
        sid = rt.start_session(
            model=f"openai/{name}",
            api_base=provider.url,
            api_key="sk-local",
            tools=registry,
            workspace=workspace,
        )
        result = rt.prompt(sid, "where do tools run?").result(timeout=30)
        assert result.status == "ok" and result.text == "done"
        assert _cpus_of(_runtime_threads(rt)) == {frozenset({cpu})}
        workers = [t for t in threading.enumerate() if t.name.startswith(("AnyIO", "asyncio_"))]
        assert frozenset({cpu}) in _cpus_of(workers)  # litellm's, started from the I/O loop: inherited
    assert tool_cpus == [allowed]  # tools, and what they start, may use every CPU
    assert frozenset(os.sched_getaffinity(0)) == allowed  # the caller's thread is untouched


@needs_two_cpus
def test_off_leaves_every_thread_to_the_os(sessions_dir: Path) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    with Runtime(Config(), sessions_dir=sessions_dir) as rt:
        assert rt.cpus is None
        assert _cpus_of(_runtime_threads(rt)) == {allowed}


def test_a_bad_cpu_stops_the_start_before_anything_is_made(tmp_path: Path) -> None:
    allowed = affinity.allowed_cpus()
    bad = 10_000 if allowed is None else max(allowed) + 1
    before = {t.name for t in threading.enumerate()}
    rt = Runtime(Config().with_overrides({"runtime.cpu": bad}), sessions_dir=tmp_path / "never-made")
    with pytest.raises(ValueError, match=f"runtime.cpu = {bad}"):
        rt.start()
    assert not (tmp_path / "never-made").exists()
    assert not {t.name for t in threading.enumerate()} - before  # no dispatcher, loop or writer started
