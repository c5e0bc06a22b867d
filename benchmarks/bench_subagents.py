"""What a sub-agent costs (design §3.10): starting a child session and returning its answer, against a turn.

Three kinds of turn against the local provider over HTTP, each repeated on fresh sessions:

- ``plain``: prompt → answer (one provider call);
- ``tool``: prompt → a call to a trivial tool → its result → answer (two calls);
- ``delegation``: prompt → a call to the ``agent`` tool, which starts a child session and runs its turn
  (one call) → the child's answer as the result → answer (three calls).

A delegation is a tool turn whose tool is a whole child turn, so ``delegation − tool`` is what starting
the child, prompting it, waiting for its turn and returning its answer costs; the table gives it beside a
plain turn, in wall time and in CPU of this process.

Run: ``python -m benchmarks.bench_subagents`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

from benchmarks._common import write_results

NAME = "subagents"


def _measure(rt: Any, provider: Any, kind: str, rounds: int) -> tuple[float, float]:
    """Median wall seconds and mean CPU seconds per turn of ``kind``."""
    from runtime.provider.script import ToolCallSpec, Turn

    walls: list[float] = []
    cpu_start = time.process_time()
    for i in range(rounds):
        parent, child = f"bench-{kind}-{i}", f"bench-{kind}-{i}-child"
        agents: dict[str, Any] = {}
        if kind == "plain":
            turns = [Turn(text="done")]
        elif kind == "tool":
            turns = [Turn(tool_calls=(ToolCallSpec(name="noop"),)), Turn(text="done")]
        else:
            call = ToolCallSpec(name="agent", arguments=json.dumps({"profile": "helper", "task": "say done"}))
            turns = [Turn(tool_calls=(call,)), Turn(text="done")]
            provider.add_script(child, [Turn(text="child done")])
            agents = {"helper": {"description": "helps", "model": f"openai/{child}", "tools": "none"}}
        provider.add_script(parent, turns)

        def noop() -> str:
            """Do nothing."""
            return "ok"

        sid = rt.start_session(
            model=f"openai/{parent}",
            api_base=provider.url,
            api_key="sk-local",
            tools=[noop] if kind == "tool" else None,
            agents=agents,
        )
        started = time.perf_counter()
        result = rt.prompt(sid, "go").result(timeout=60)
        walls.append(time.perf_counter() - started)
        if result.status != "ok":
            raise RuntimeError(f"{kind} turn {i} ended {result.status}: {result.error}")
    return statistics.median(walls), (time.process_time() - cpu_start) / rounds


def run(rounds: int) -> list[dict[str, Any]]:
    from runtime import Runtime
    from runtime.provider import LocalProvider

    with LocalProvider() as provider, Runtime(sessions_dir=tempfile.mkdtemp(prefix="bench-sub-")) as rt:
        _measure(rt, provider, "plain", 3)  # warm up: litellm, the tokenizer, the connection pool
        figures = {kind: _measure(rt, provider, kind, rounds) for kind in ("plain", "tool", "delegation")}
    rows = [
        {"turn": kind, "provider calls": calls, "wall ms": wall * 1e3, "cpu ms": cpu * 1e3}
        for (kind, (wall, cpu)), calls in zip(figures.items(), (1, 2, 3), strict=True)
    ]
    plain_wall, plain_cpu = figures["plain"]
    child_wall = figures["delegation"][0] - figures["tool"][0]
    child_cpu = figures["delegation"][1] - figures["tool"][1]
    rows.append(
        {
            "turn": "a child (delegation − tool)",
            "provider calls": 1,
            "wall ms": child_wall * 1e3,
            "cpu ms": child_cpu * 1e3,
            "× plain turn (wall)": child_wall / plain_wall,
            "× plain turn (cpu)": child_cpu / plain_cpu,
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (10 if args.quick else 40)
    rows = run(rounds)
    write_results(NAME, rows, {"rounds": rounds})


if __name__ == "__main__":
    main()
