"""Load (design §9): many sessions at once, many turns each, random aborts and manual compactions.

Nothing may be lost or mixed up: every session's log replays into a consistent tree in which every tool
call has exactly one result, every acknowledged message is in it, each session's events arrive in
order (live and in the transcript), and once the runtime stops it leaves no thread or file descriptor
behind.

The default run hosts a few dozen sessions; the soak version hosts 1,000 × ``AGENTCELL_SOAK_SCALE``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.handles import CompactionResult, Handle, PromptHandle, TurnResult
from runtime.provider.script import ToolCallSpec, Turn
from runtime.store.sessions import SessionDirectory
from runtime.tools.registry import ToolRegistry
from tests.reliability.support import (
    EventLog,
    Resources,
    check_log,
    message_ids,
    order_problems,
    soak_scale,
    transcript_problems,
    wait_for_no_leaks,
)

_runs = iter(range(1, 1_000_000))


def note_tools(seed: int) -> ToolRegistry:
    rng = random.Random(seed)
    lock = threading.Lock()
    registry = ToolRegistry()

    @registry.tool
    def note(text: str) -> str:
        """Write a note down and echo it."""
        with lock:
            pause = rng.uniform(0.0, 0.01)
        time.sleep(pause)  # long enough for some aborts to land while tools run
        return f"noted: {text} " * 8

    return registry


@dataclass
class LoadRun:
    """What a load run did and what came back."""

    sessions: list[str]
    results: dict[str, list[TurnResult]] = field(default_factory=dict)
    compactions: list[CompactionResult] = field(default_factory=list)
    aborts: int = 0
    compactions_asked: int = 0


def run_load(
    rt: Runtime,
    provider: Any,
    *,
    sessions: int,
    turns: int,
    seed: int,
    abort_rate: float,
    compact_rate: float,
) -> LoadRun:
    """Start ``sessions`` sessions and run ``turns`` prompts on each, all at once, while aborting and
    compacting at random."""
    rng = random.Random(seed)
    name = f"load-{next(_runs)}"
    calls = (
        ToolCallSpec(name="note", arguments='{"text": "first"}'),
        ToolCallSpec(name="note", arguments='{"text": "second"}'),
    )
    # One looping script shared by every session: requests take turns from it in whatever order they
    # arrive, so a run makes one or more tool steps before its answer.
    provider.add_script(
        name, [Turn(text="Working on it.", tool_calls=calls), Turn(text="Done. " * 30)], loop=True
    )
    config = {"compaction.summarizer_model": f"openai/{name}-summarizer"}  # the provider's policy summarizes
    tools = note_tools(seed)
    run = LoadRun(
        [
            rt.start_session(
                model=f"openai/{name}", api_base=provider.url, api_key="sk-local", tools=tools, config=config
            )
            for _ in range(sessions)
        ]
    )
    compaction_handles: list[Handle[CompactionResult]] = []
    for turn in range(turns):
        handles: dict[str, PromptHandle] = {
            sid: rt.prompt(sid, f"Turn {turn}: take notes.") for sid in run.sessions
        }
        for sid in rng.sample(run.sessions, len(run.sessions)):
            draw = rng.random()
            if draw < abort_rate:
                time.sleep(rng.uniform(0.0, 0.01))
                rt.abort(sid)
                run.aborts += 1
            elif draw < abort_rate + compact_rate:
                compaction_handles.append(rt.compact(sid))
                run.compactions_asked += 1
        for sid, handle in handles.items():
            run.results.setdefault(sid, []).append(handle.result(timeout=300))
    run.compactions = [h.result(timeout=300) for h in compaction_handles]
    return run


def check_load(rt: Runtime, run: LoadRun, events: EventLog, sessions_dir: Path) -> None:
    """Everything the load test promises, checked after the runtime stopped."""
    statuses = Counter(r.status for results in run.results.values() for r in results)
    errors = [r.error for results in run.results.values() for r in results if r.status == "error"]
    assert not errors, f"{len(errors)} runs failed, e.g. {errors[:3]}"
    assert statuses["ok"] > 0
    assert statuses["aborted"] <= run.aborts

    directory = SessionDirectory(sessions_dir)
    problems: dict[str, list[str]] = {}
    compacted = tool_results = 0
    for sid in run.sessions:
        check = check_log(directory, sid)
        found = list(check.problems)
        stored = message_ids(check.tree)
        acknowledged = {e.message_id for e in events.of(sid, "message_appended")}
        if acknowledged - stored:
            found.append(f"{len(acknowledged - stored)} acknowledged messages are not in the log")
        answers = [r.message.id for r in run.results[sid] if r.status == "ok" and r.message is not None]
        if set(answers) - stored:
            found.append("a final answer is not in the log")
        found += order_problems(events.events(sid))
        found += transcript_problems(directory, sid)
        if found:
            problems[sid] = found
        compacted += check.tree.compaction_count
        tool_results += sum(m.role == "tool" for m in check.tree.messages())
    assert not problems, f"{len(problems)} sessions inconsistent, e.g. {next(iter(problems.items()))}"
    assert tool_results > 0
    if run.compactions_asked:
        assert compacted == sum(c.compacted for c in run.compactions)


def load_test(
    sessions_dir: Path, provider: Any, *, sessions: int, turns: int, seed: int, dispatcher_threads: int = 2
) -> LoadRun:
    config = Config().with_overrides(
        {
            "retry.base_delay": 0.01,
            "retry.max_delay": 0.05,
            "bus.subscriber_queue": 1_000_000,  # the checker must see every event to check their order
            "runtime.dispatcher_threads": dispatcher_threads,
        }
    )
    with Runtime(config, sessions_dir=sessions_dir / "warm-up") as rt:  # process-wide caches, once
        sid = rt.start_session(model="openai/warm-up", api_base=provider.url, api_key="sk-local")
        assert rt.prompt(sid, "hello").result(timeout=60).status == "ok"
    before = Resources.now()
    events = EventLog()
    rt = Runtime(config, sessions_dir=sessions_dir)
    with rt:
        rt.subscribe("*", callback=events)
        run = run_load(
            rt, provider, sessions=sessions, turns=turns, seed=seed, abort_rate=0.15, compact_rate=0.15
        )
    threads, fds = wait_for_no_leaks(before)
    assert not threads, f"threads left after stop: {threads}"
    assert not fds, f"file descriptors left after stop: {fds}"
    check_load(rt, run, events, sessions_dir)
    return run


def test_dozens_of_sessions_with_aborts_and_compactions_lose_nothing(
    sessions_dir: Path, provider: Any
) -> None:
    run = load_test(sessions_dir, provider, sessions=24, turns=3, seed=7)
    assert run.aborts and run.compactions_asked


@pytest.mark.soak
@pytest.mark.timeout(3_600)  # the full size takes minutes: litellm makes ~15 calls/s on two cores
def test_a_thousand_sessions_with_aborts_and_compactions_lose_nothing(
    sessions_dir: Path, provider: Any
) -> None:
    scale = soak_scale()
    started = time.monotonic()
    run = load_test(sessions_dir, provider, sessions=max(20, round(1_000 * scale)), turns=6, seed=1_000)
    turns = sum(len(r) for r in run.results.values())
    print(
        f"{len(run.sessions)} sessions, {turns} runs, {run.aborts} aborts, "
        f"{run.compactions_asked} manual compactions in {time.monotonic() - started:.1f} s"
    )
