"""runtime.cpu: the runtime's own threads on one CPU, tools and the embedding program left free."""

from __future__ import annotations

import os
import subprocess
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
    assert affinity.place_runtime("off").cpus is None


def test_auto_tries_the_cpus_in_an_order_spread_by_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({2, 5, 7}))
    orders = {}
    for pid in range(6):
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        orders[pid] = affinity.auto_candidates()
    assert all(sorted(order) == [2, 5, 7] for order in orders.values())
    assert {order[0] for order in orders.values()} == {2, 5, 7}  # processes do not all start at the first


def test_auto_stays_off_where_one_cpu_would_cost_parallelism(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({3}))
    assert affinity.place_runtime("auto").cpus is None  # one CPU anyway
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: None)
    assert affinity.place_runtime("auto").cpus is None  # a platform that cannot place threads
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({0, 1}))
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert affinity.place_runtime("auto").cpus is None  # free-threaded: threads really run at once


def test_a_cpu_the_process_may_not_use_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: frozenset({0, 1}))
    assert affinity.place_runtime(1).cpus == frozenset({1})
    with pytest.raises(ValueError, match=r"runtime.cpu = 4: this process may only use CPUs \[0, 1\]"):
        affinity.place_runtime(4)
    monkeypatch.setattr(affinity, "allowed_cpus", lambda: None)
    with pytest.raises(ValueError, match="cannot place threads"):
        affinity.place_runtime(0)


def test_the_setting_is_checked_when_the_config_is_made() -> None:
    assert Config().runtime.cpu == "auto"
    assert Config().with_overrides({"runtime.cpu": "off"}).runtime.cpu == "off"
    assert load_config(environ={"AGENTCELL_RUNTIME__CPU": "1"}).runtime.cpu == 1
    for bad in ("fast", -1):
        with pytest.raises((msgspec.ValidationError, ValueError)):
            Config().with_overrides({"runtime.cpu": bad})


# -- auto's claim: one CPU per process while there are free ones --------------------------------------

_CLAIMER = """
import sys
from pathlib import Path
from runtime import affinity
affinity.LOCK_DIR = Path(sys.argv[1])
affinity.auto_candidates = lambda: [int(c) for c in sys.argv[2:]]
print(sorted(affinity.place_runtime("auto").cpus), flush=True)
sys.stdin.read()  # hold the claim until the test closes stdin
"""


class Claimer:
    """Another process that hosts a runtime with ``auto``: it claims a CPU and holds it until closed."""

    def __init__(self, lock_dir: Path, candidates: list[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, str(lock_dir), *map(str, candidates)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.cpu = msgspec.json.decode(self.proc.stdout.readline())[0]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """A fresh claim with its lock files in ``tmp_path``; auto tries CPUs 0 then 1."""
    monkeypatch.setattr(affinity, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(affinity, "_claim", affinity._Claim())
    monkeypatch.setattr(affinity, "auto_candidates", lambda: [0, 1])
    return [0, 1]


def test_auto_skips_a_cpu_another_process_holds_until_that_process_ends(
    claims: list[int], tmp_path: Path
) -> None:
    other = Claimer(tmp_path, claims)
    assert other.cpu == 0
    mine = affinity.place_runtime("auto")
    assert mine.cpus == frozenset({1})
    mine.release()
    other.close()  # its lock goes with it
    assert affinity.place_runtime("auto").cpus == frozenset({0})


def test_runtimes_of_one_process_share_the_claim_and_the_last_releases_it(
    claims: list[int], tmp_path: Path
) -> None:
    first, second = affinity.place_runtime("auto"), affinity.place_runtime("auto")
    assert first.cpus == second.cpus == frozenset({0})  # one GIL: one CPU
    first.release()
    first.release()  # idempotent: does not give up the second runtime's share
    held = Claimer(tmp_path, claims)
    assert held.cpu == 1  # CPU 0 is still claimed
    held.close()
    second.release()
    free = Claimer(tmp_path, claims)
    assert free.cpu == 0
    free.close()


def test_with_every_cpu_held_elsewhere_auto_still_places_the_runtime(
    claims: list[int], tmp_path: Path
) -> None:
    others = [Claimer(tmp_path, claims), Claimer(tmp_path, claims)]
    assert sorted(o.cpu for o in others) == [0, 1]
    placement = affinity.place_runtime("auto")
    assert placement.cpus == frozenset({0})  # shares the first in its order
    placement.release()
    for other in others:
        other.close()


def test_auto_places_without_lock_files_where_they_cannot_be_made(
    claims: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(affinity, "LOCK_DIR", tmp_path / "missing")
    placement = affinity.place_runtime("auto")
    assert placement.cpus == frozenset({0})
    placement.release()


def test_a_lock_file_planted_as_a_link_is_not_followed(claims: list[int], tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("not a lock")
    (tmp_path / "agentcell-cpu-0.lock").symlink_to(target)
    placement = affinity.place_runtime("auto")
    assert placement.cpus == frozenset({1})
    placement.release()
    assert target.read_text() == "not a lock"


_FORKER = """
import fcntl, os, sys
from pathlib import Path
from runtime import affinity
affinity.LOCK_DIR = Path(sys.argv[1])
affinity.auto_candidates = lambda: [0, 1]

def held(cpu):  # whether some claim holds the CPU's lock (another descriptor conflicts, in this process too)
    fd = os.open(affinity.LOCK_DIR / f"agentcell-cpu-{cpu}.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)

parent = affinity.place_runtime("auto")
pid = os.fork()
if pid == 0:  # a child does not inherit the parent's claim, and leaves the parent's lock held
    child = affinity.place_runtime("auto")
    parent.release()  # the parent's share, copied into the child: must not give up the child's claim
    print("child", min(child.cpus), held(1), flush=True)
    child.release()
    print("child released", held(1), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent", min(parent.cpus), held(0), flush=True)
"""


def test_a_forked_child_claims_its_own_cpu(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FORKER, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == ["child 1 True", "child released False", "parent 0 True"]


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
            config={"gateway.transport": "litellm"},  # litellm starts threads of its own: see below
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
    with Runtime(Config().with_overrides({"runtime.cpu": "off"}), sessions_dir=sessions_dir) as rt:
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


@needs_two_cpus
def test_by_default_a_runtime_claims_a_cpu_for_its_threads_until_it_stops(
    sessions_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(affinity, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(affinity, "_claim", affinity._Claim())
    order = affinity.auto_candidates()
    with Runtime(Config(), sessions_dir=sessions_dir) as rt:
        assert rt.cpus == frozenset(order[:1])
        assert _cpus_of(_runtime_threads(rt)) == {rt.cpus}
        while_running = Claimer(tmp_path, order)
        assert while_running.cpu == order[1]  # another process hosting a runtime takes another CPU
        while_running.close()
    after = Claimer(tmp_path, order)
    assert after.cpu == order[0]  # stopped: the CPU is free again
    after.close()


def test_a_start_that_fails_gives_the_cpu_back(claims: list[int], tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    rt = Runtime(Config(), sessions_dir=not_a_dir / "sessions")
    with pytest.raises(OSError):
        rt.start()
    free = Claimer(tmp_path, claims)
    assert free.cpu == 0
    free.close()
