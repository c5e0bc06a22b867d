"""Prompt caching (design §4.7, §5.4): the share of a long tool-heavy session's input read from the cache,
and its input cost against the same session without a cache.

One session per window (32,000 and 128,000 tokens) runs ``--turns`` (60) turns of the context scenarios'
workload model (``tests/scenarios/workload.py``) against the local provider: each turn's prompt asks for
two or three steps of parallel ``blob`` tool calls (results of 400 to 6,000 characters), then an answer,
so the window fills and compacts again and again; the summarizer is the session's own model. Sides:

- ``cache``: the default runtime: cache hints on (design §4.7) and a summarizer that rides the
  conversation's cache (design §5.4);
- ``flat``: ``gateway.prompt_cache = false``: the summarizer gets the flattened transcript it always got
  (what main did before issue 44).

Dialects: ``openai`` (chat completions; the local provider caches automatically, ``cached_tokens`` being
the longest prefix an earlier request sent). Anthropic's (``/v1/messages``: only what ends at a breakpoint
is cached) runs once the local provider speaks it.

Per side and window: requests (agent, summarizer), input tokens, the share read from the cache (all, the
agent's requests, the summarizer's), and the input cost relative to no cache at OpenAI's rates for
gpt-4.1 (a cached token costs 0.25 of an input token) and at Anthropic's for Claude Sonnet 4.5 (a read
0.1, a write 1.25), from litellm's price map. Targets: >= 90% read from the cache with automatic caching,
>= 85% with Anthropic's.

    python -m benchmarks.bench_cache [--turns 60] [--windows 32000 128000] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from benchmarks._common import write_results

NAME = "cache"
DIALECTS = {"openai": "openai/gpt-4.1", "anthropic": "anthropic/claude-sonnet-4-5"}
"""The model each dialect's sessions name (the local provider answers both; litellm prices both)."""
AUTOMATIC_TARGET = 0.90
ANTHROPIC_TARGET = 0.85


def is_summary(body: dict[str, Any]) -> bool:
    from runtime.provider import policy

    messages = body.get("messages") or []
    system = " ".join(policy.text_of(m.get("content")) for m in messages if m.get("role") == "system")
    system += policy.text_of(body.get("system"))  # Anthropic's Messages API: the system prompt apart
    return "summariz" in system.lower() or policy.is_cached_summary_request(messages)


def run_session(provider: Any, dialect: str, window: int, turns: int, cache: bool) -> dict[str, Any]:
    from runtime import Runtime
    from runtime.config import Config
    from tests.scenarios.workload import run_tool_heavy

    model = DIALECTS[dialect]
    api_base = provider.url if dialect == "openai" else provider.url.removesuffix("/v1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config().with_overrides({"gateway.prompt_cache": cache})
        with Runtime(cfg, sessions_dir=tmp) as rt:
            sid = run_tool_heavy(
                rt,
                provider,
                model,
                api_base,
                window=window,
                turns=turns,
                system_prompt=SYSTEM_PROMPT,
                timeout=300,
            )
            usage = rt.usage(sid)
    seconds = time.perf_counter() - started
    sides = {name: {"requests": 0, "input": 0, "cached": 0, "written": 0} for name in ("agent", "summarizer")}
    for request in provider.request_log:
        if request.outcome != "ok":
            continue
        side = sides["summarizer" if is_summary(request.body) else "agent"]
        side["requests"] += 1
        side["input"] += request.prompt_tokens
        side["cached"] += request.cached_tokens
        side["written"] += request.cache_write_tokens
    return {**sides, "usage": usage, "seconds": seconds}


SYSTEM_PROMPT = (
    "You are a methodical assistant working in a repository. Use the blob tool exactly as each request "
    "says, one step at a time, and answer briefly when the steps are done. "
) * 12
"""~600 tokens: with the tools, past Anthropic's 1,024-token minimum only once the conversation starts."""


def run(turns: int, windows: list[int], dialects: list[str]) -> list[dict[str, Any]]:
    from runtime.gateway._cost import prices_from_info
    from runtime.gateway._litellm import load_litellm
    from runtime.provider import LocalProvider

    litellm = load_litellm()
    rows: list[dict[str, Any]] = []
    for dialect in dialects:
        prices = prices_from_info(litellm.model_cost[DIALECTS[dialect].split("/", 1)[1]])
        assert prices is not None
        rates = prices.base
        for window in windows:
            for cache in (True, False):
                with LocalProvider() as provider:  # a fresh provider: its cache holds this session's prefixes
                    got = run_session(provider, dialect, window, turns, cache)
                agent, summ = got["agent"], got["summarizer"]
                total = agent["input"] + summ["input"]
                cached = agent["cached"] + summ["cached"]
                written = agent["written"] + summ["written"]
                cost = (
                    (total - cached - written) * rates.input
                    + cached * rates.cache_read
                    + written * rates.cache_write
                )
                usage = got["usage"]
                rows.append(
                    {
                        "dialect": dialect,
                        "side": "cache" if cache else "flat",
                        "window": window,
                        "turns": turns,
                        "agent requests": agent["requests"],
                        "summaries": summ["requests"],
                        "input tokens": total,
                        "cached share": round(cached / total, 4) if total else 0.0,
                        "agent cached": round(agent["cached"] / agent["input"], 4) if agent["input"] else 0.0,
                        "summarizer cached": round(summ["cached"] / summ["input"], 4)
                        if summ["input"]
                        else 0.0,
                        "written share": round(written / total, 4) if total else 0.0,
                        "input cost vs none": round(cost / (total * rates.input), 4) if total else 1.0,
                        "input cost $": round(cost, 4),
                        "runtime's cost $": round(usage.cost or 0.0, 4),
                        "seconds": round(got["seconds"], 1),
                    }
                )
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 turns at 32,000 tokens")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--windows", type=int, nargs="+", default=None)
    parser.add_argument("--dialects", nargs="+", default=list(DIALECTS), choices=list(DIALECTS))
    args = parser.parse_args()
    turns = args.turns or (20 if args.quick else 60)
    windows = args.windows or ([32_000] if args.quick else [32_000, 128_000])
    rows = run(turns, windows, args.dialects)
    targets = {"openai": AUTOMATIC_TARGET, "anthropic": ANTHROPIC_TARGET}
    met = {
        f"{r['dialect']} {r['window']}": r["cached share"] >= targets[r["dialect"]]
        for r in rows
        if r["side"] == "cache"
    }
    write_results(NAME, rows, {"turns": turns, "windows": windows, "targets": targets, "met": met})


if __name__ == "__main__":
    main()
