"""Compaction of a long session, excluding the summarizer call (design §8: ≤ 50 ms for 10,000 messages).

Builds a session of N messages (user turns, tool steps with read/write/edit calls, results of varied size,
a previous summary), counts it once with the runtime's exact tiktoken counter (as the usage tracker has
done by the time compaction runs), then times :func:`plan_compaction` + :func:`finish_compaction` with
canned answers, in each mode. The baseline, timed the same way in the same process, is one pass over the
history summing the cached token counts: the least work any compaction must do (×base compares CPU
time, which a busy machine disturbs less than wall-clock time).

    python -m benchmarks.bench_compaction [--messages 10000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import runtime  # noqa: F401  (offline tiktoken)
from runtime import messages as m
from runtime.config import CompactionConfig
from runtime.context.compaction import (
    CompactionPlan,
    CompactionResult,
    finish_compaction,
    keep_recent_budget,
    plan_compaction,
)
from runtime.context.prompts import SUMMARY_PREFIX
from runtime.tokens import TokenCounter

NAME = "compaction"
TARGET_MS = 50.0
MODEL = "gpt-4o"
WINDOW = 128_000
SUMMARY_ANSWER = "## Goal\nKeep the service fast.\n\n## Progress\n### Done\n- Profiled the hot path.\n" * 20


def build_session(n: int, seed: int = 7) -> list[m.Message]:
    """A session of ``n`` messages: a previous summary, then turns of 1-8 tool steps."""
    rng = random.Random(seed)
    msgs: list[m.Message] = [
        m.user(
            f"{SUMMARY_PREFIX}\n\n## Goal\nRefactor the storage layer.",
            kind=m.KIND_COMPACTION_SUMMARY,
            metadata={"read_files": ["src/a.py"], "modified_files": ["src/b.py"]},
        )
    ]
    call = 0
    while len(msgs) < n:
        msgs.append(
            m.user(f"Next: look at module {rng.randrange(500)} and fix what is slow. " * rng.randint(1, 6))
        )
        for _ in range(rng.randint(1, 8)):
            call += 1
            tool = rng.choice(["read_file", "read_file", "grep", "edit_file", "write_file"])
            path = f"src/pkg{rng.randrange(40)}/mod{rng.randrange(200)}.py"
            part = m.ToolCallPart(f"call{call}", tool, json.dumps({"path": path, "pattern": "def "}))
            msgs.append(m.assistant(f"Checking {path}.", tool_calls=[part]))
            body = "\n".join(f"{i:4} def function_{i}(x): return x * {i}" for i in range(rng.randint(5, 120)))
            msgs.append(m.tool_result(part.id, tool, body))
        msgs.append(m.assistant("Done: " + "the change is in and the tests pass. " * rng.randint(1, 10)))
    return msgs[:n]


class Timing(NamedTuple):
    median_ms: float  # wall clock
    min_ms: float
    cpu_ms: float  # this thread's CPU time, median: steadier than wall clock on a busy machine


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Timing, Any]:
    """Timings over ``repeat`` runs after one warm-up, and the last result."""
    result = fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        result = fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
    return Timing(statistics.median(wall), min(wall), statistics.median(cpu)), result


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--out", type=Path, default=None, help="results directory (default benchmarks/results)"
    )
    args = parser.parse_args(argv)

    msgs = build_session(args.messages)
    counter = TokenCounter(MODEL)
    count = counter.count_message
    total = sum(count(x) for x in msgs)  # warms the per-message cache, as the usage tracker would
    config = CompactionConfig()
    keep = keep_recent_budget(WINDOW, config)

    base, _ = timed(lambda: sum(count(x) for x in msgs), args.repeat)
    rows: list[dict[str, Any]] = [
        _row("baseline: sum cached counts", base, base, len(msgs), len(msgs), total, total)
    ]
    cases: list[tuple[str, dict[str, Any]]] = [
        ("summarize (exact window fit)", {"count_text": counter.count_text}),
        ("summarize (char-estimate fit)", {}),
        ("emergency (window/5, force)", {"keep": keep_recent_budget(WINDOW, config, emergency=True)}),
        ("hard_reset", {"mode": "hard_reset", "count_text": counter.count_text}),
        ("truncate (no LLM)", {"mode": "truncate"}),
    ]
    for label, case in cases:

        def run(case: dict[str, Any] = case) -> CompactionResult:
            plan = plan_compaction(
                msgs,
                trigger="threshold",
                mode=case.get("mode", "summarize"),
                keep_tokens=case.get("keep", keep),
                count=count,
                config=config,
                force=True,
                summarizer_window=WINDOW,
                count_text=case.get("count_text"),
            )
            assert isinstance(plan, CompactionPlan)
            answers = [SUMMARY_ANSWER] * len(plan.requests)
            result = finish_compaction(plan, answers, count=count, tokens_before=total)
            assert isinstance(result, CompactionResult), result
            return result

        timing, result = timed(run, args.repeat)
        rows.append(_row(label, timing, base, len(msgs), result.messages_after, total, result.tokens_after))

    meta = {
        "messages": len(msgs),
        "model": MODEL,
        "summarizer_window": WINDOW,
        "keep_recent_tokens": keep,
        "repeat": args.repeat,
        "target_ms": TARGET_MS,
        "excludes": "the summarizer call",
    }
    from benchmarks._common import write_results

    write_results(NAME, rows, meta, directory=args.out)
    return rows


def _row(
    case: str, timing: Timing, base: Timing, before: int, after: int, t_before: int, t_after: int
) -> dict[str, Any]:
    return {
        "case": case,
        "median_ms": round(timing.median_ms, 3),
        "min_ms": round(timing.min_ms, 3),
        "cpu_ms": round(timing.cpu_ms, 3),
        "vs_baseline": round(timing.cpu_ms / base.cpu_ms, 2) if base.cpu_ms else None,
        "messages_before": before,
        "messages_after": after,
        "tokens_before": t_before,
        "tokens_after": t_after,
        "meets_target": timing.median_ms <= TARGET_MS,
    }


if __name__ == "__main__":
    main()
