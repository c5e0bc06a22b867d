"""Token accounting benchmarks (design §4.3, 8).

1. The estimate a turn costs at 10, 1,000 and 10,000 messages of history: a response arrives, a new
   message is appended, and the context is estimated (new messages tokenized, everything else cached).
   Target: flat, at most 1.2x between 10 and 10,000 messages.
2. tiktoken against the heuristic on a mixed corpus (prose, code, JSON, logs, shell output, CJK): speed
   and the heuristic's error, per encoding.

Run: ``python -m benchmarks.bench_tokens`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import inspect
import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import runtime  # noqa: F401  (sets TIKTOKEN_CACHE_DIR before tiktoken loads)
from runtime.context.estimate import estimate_context
from runtime.messages import Message, ToolCallPart, Usage, assistant, tool_result, user
from runtime.tokens import TokenCounter, get_encoding, heuristic_tokens

NAME = "tokens"
HISTORY_SIZES = (10, 1_000, 10_000)
TARGET_RATIO = 1.2

_TEXT = (
    "the runtime keeps every session inside its window by counting tokens once per message and "
    "anchoring each estimate on the provider's own usage numbers so a turn costs the same whatever "
    "the length of the conversation that came before it"
)
_WORDS = _TEXT.split()


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _history(size: int, rng: random.Random) -> list[Message]:
    """A conversation of ``size`` messages: user prompts, assistant tool calls with usage, tool results."""
    messages: list[Message] = []
    prompt_tokens = 1_000
    while len(messages) < size:
        messages.append(user(_sentence(rng, 20)))
        call = ToolCallPart(id=f"c{len(messages)}", name="read_file", arguments='{"path": "src/app.py"}')
        prompt_tokens += 300
        messages.append(
            assistant(
                _sentence(rng, 15),
                tool_calls=[call],
                usage=Usage(input_tokens=prompt_tokens, output_tokens=60),
                stop_reason="tool_calls",
            )
        )
        messages.append(tool_result(call.id, "read_file", "\n".join(_sentence(rng, 12) for _ in range(8))))
    return messages[:size]


class _TurnBench:
    """One session's history of a given size, on which turns are estimated."""

    def __init__(self, counter: TokenCounter, size: int, rng: random.Random) -> None:
        self.counter = counter
        self.size = size
        self.history = _history(size, rng)
        self.system_tokens = counter.count_system("You are a careful coding assistant.")
        counter.count_messages(self.history)  # earlier turns counted these already
        self.last_input = 1_000_000

    def turn(self, rng: random.Random) -> float:
        """A turn: a response arrives (with usage), a new message is appended, the context is estimated.
        The history is restored afterwards, so every turn sees ``size`` messages of history."""
        self.last_input += 50
        response = assistant(_sentence(rng, 15), usage=Usage(input_tokens=self.last_input, output_tokens=40))
        self.history += (response, user(_sentence(rng, 20)))
        start = time.perf_counter()
        estimate_context(
            self.history, count=self.counter.count_message, system_tokens=self.system_tokens, tools_tokens=0
        )
        elapsed = time.perf_counter() - start
        del self.history[-2:]
        return elapsed

    def full(self) -> None:
        """Right after a compaction there is no usable response: a full count, every message cached."""
        estimate_context(
            self.history,
            count=self.counter.count_message,
            system_tokens=self.system_tokens,
            tools_tokens=0,
            usage_floor=len(self.history),
        )


def bench_turn_estimates(counter: TokenCounter, turns: int, rng: random.Random) -> list[dict[str, Any]]:
    """Per-turn estimate cost at each history size; turns are interleaved so noise hits all sizes alike."""
    benches = [_TurnBench(counter, size, rng) for size in HISTORY_SIZES]
    samples: dict[int, list[float]] = {b.size: [] for b in benches}
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(turns):
            rng.shuffle(benches)
            for bench in benches:
                samples[bench.size].append(bench.turn(rng))
    finally:
        if gc_enabled:
            gc.enable()
    rows = []
    for bench in sorted(benches, key=lambda b: b.size):
        times = samples[bench.size]
        rows.append(
            {
                "history": bench.size,
                "turn_us": statistics.median(times) * 1e6,
                "turn_p90_us": statistics.quantiles(times, n=10)[-1] * 1e6,
                "full_cached_us": _median_time(bench.full, repeat=9) * 1e6,
            }
        )
    return rows


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _corpus(rng: random.Random) -> dict[str, str]:
    from pydoc_data.topics import topics

    prose = "\n\n".join(topics[k] for k in sorted(topics)[::4])
    code = "\n\n".join(
        inspect.getsource(importlib.import_module(m))
        for m in ("json.decoder", "textwrap", "dataclasses", "functools", "argparse", "shlex")
    )
    records = [
        {
            "id": rng.randint(0, 10**6),
            "name": f"item-{i}",
            "price": round(rng.random() * 100, 2),
            "tags": ["a", "b"],
        }
        for i in range(2_000)
    ]
    data = json.dumps({"items": records}, indent=2)
    logs = "\n".join(
        f"2025-01-{1 + i % 28:02d}T12:{i % 60:02d}:{(i * 7) % 60:02d}Z INFO worker-{i % 8} handled request "
        f"{rng.getrandbits(32):08x} in {rng.random() * 100:.1f} ms (status={rng.choice([200, 200, 404, 500])})"
        for i in range(3_000)
    )
    listing = "\n".join(
        f"-rw-r--r--  1 user staff {rng.randint(100, 10**6):>8} Jan {1 + i % 28:2d} 12:{i % 60:02d} file_{i}.py"
        for i in range(3_000)
    )
    cjk = (
        "今天早上我们在会议室讨论了明年的预算。大多数成员事先读过报告，但也有几个人没有读。"
        "祖母は家の裏に小さな庭を持っていました。豆やトマトを育て、夏になるとひまわりが道の方へ傾いていました。"
    ) * 200
    return {"prose": prose, "code": code, "json": data, "logs": logs, "shell": listing, "cjk": cjk}


def bench_counting(rng: random.Random, repeat: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    corpus = _corpus(rng)
    for encoding_name in ("o200k_base", "cl100k_base"):
        enc = get_encoding(encoding_name)
        total_exact = total_heuristic = 0
        for kind, text in corpus.items():
            exact = len(enc.encode_ordinary(text))
            approx = heuristic_tokens(text)
            total_exact += exact
            total_heuristic += approx
            t_exact = _median_time(functools.partial(enc.encode_ordinary, text), repeat)
            t_heur = _median_time(functools.partial(heuristic_tokens, text), repeat)
            mb = len(text.encode()) / 1e6
            rows.append(
                {
                    "encoding": encoding_name,
                    "corpus": kind,
                    "chars": len(text),
                    "tiktoken_tokens": exact,
                    "heuristic_tokens": approx,
                    "error_pct": 100 * (approx - exact) / exact,
                    "tiktoken_mb_s": mb / t_exact,
                    "heuristic_mb_s": mb / t_heur,
                    "speedup": t_exact / t_heur,
                }
            )
        rows.append(
            {
                "encoding": encoding_name,
                "corpus": "all",
                "tiktoken_tokens": total_exact,
                "heuristic_tokens": total_heuristic,
                "error_pct": 100 * (total_heuristic - total_exact) / total_exact,
            }
        )
    return rows


def _print_table(title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}"
        if isinstance(value, int):
            return f"{value:,}"
        return "" if value is None else str(value)

    table = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for r in table:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def _write(name: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    try:
        from benchmarks._common import write_results
    except ImportError:
        out = Path(__file__).with_name("results") / f"{name}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({"name": name, "meta": meta, "rows": rows}, indent=2) + "\n")
        print(f"\nwrote {out}")
    else:
        write_results(name, rows, meta)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer turns and repeats")
    parser.add_argument("--model", default="gpt-4o")
    args = parser.parse_args(argv)
    turns, repeat = (500, 3) if args.quick else (5_000, 7)
    rng = random.Random(42)

    counter = TokenCounter(args.model)
    turn_rows = bench_turn_estimates(counter, turns, rng)
    base = turn_rows[0]["turn_us"]
    for row in turn_rows:
        row["vs_10"] = row["turn_us"] / base
    ratio = turn_rows[-1]["vs_10"]
    _print_table(
        f"Estimate per turn ({counter.encoding_name}, median of {turns} turns)",
        turn_rows,
        ["history", "turn_us", "turn_p90_us", "vs_10", "full_cached_us"],
    )
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"10,000 vs 10 messages: {ratio:.2f}x (target <= {TARGET_RATIO}x): {verdict}")

    count_rows = bench_counting(rng, repeat)
    _print_table(
        "tiktoken vs heuristic",
        count_rows,
        [
            "encoding",
            "corpus",
            "tiktoken_tokens",
            "heuristic_tokens",
            "error_pct",
            "tiktoken_mb_s",
            "heuristic_mb_s",
            "speedup",
        ],
    )
    meta = {
        "model": args.model,
        "encoding": counter.encoding_name,
        "turns": turns,
        "ratio_10k_vs_10": ratio,
        "target_ratio": TARGET_RATIO,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    rows = [{"bench": "turn_estimate", **r} for r in turn_rows] + [
        {"bench": "counting", **r} for r in count_rows
    ]
    _write(NAME, rows, meta)
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
