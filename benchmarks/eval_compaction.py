"""How much a compaction keeps: facts planted across a long session, compaction forced, questions asked.

    python -m benchmarks.eval_compaction --api-base URL --model openai/NAME [--api-key KEY] [--facts 8]
    python -m benchmarks.eval_compaction --llama              # llama.cpp + SmolLM2 from PyPI (benchmarks/_llama.py)

A session against any OpenAI-compatible endpoint is told ``--facts`` facts (a locker code, a city, a
colour, ... each with a made-up owner and value), one per turn, with ``--filler`` ordinary turns between
them. Then ``compact()`` is forced (the session's summarizer is its own model) and each fact is asked for on
a branch of its own from the compacted history, so no answer sees another question. Scored:

* ``kept``: facts whose value is in the summary text (what the summarizer kept; independent of answering);
* ``answered``: questions whose answer contains the value (what the model can use of it);
* ``baseline``: the same questions with every fact still in the context, no compaction (the model's own
  ceiling: a weak model is weak at both).

Results go to ``benchmarks/results/eval_compaction.json``. A tiny model is a floor, not a verdict: SmolLM2
135M answers few questions even from an uncompacted context.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import write_results

KINDS: tuple[tuple[str, str, Sequence[str]], ...] = (
    ("locker code", "What is the locker code of {owner}? Answer with the code only.",
     [str(n) for n in range(1000, 9999, 37)]),
    ("home city", "Which city does {owner} live in? Answer with the city only.",
     ["Lisbon", "Oslo", "Nairobi", "Quito", "Hanoi", "Tallinn", "Perth", "Montreal", "Seville", "Kyoto"]),
    ("favourite colour", "What is the favourite colour of {owner}? Answer with the colour only.",
     ["turquoise", "crimson", "amber", "violet", "olive", "magenta", "indigo", "saffron"]),
    ("pet's name", "What is the name of {owner}'s pet? Answer with the name only.",
     ["Biscuit", "Pickle", "Nimbus", "Pepper", "Waffles", "Juniper", "Tofu", "Marble"]),
    ("project code name", "What is the code name of {owner}'s project? Answer with the code name only.",
     ["Blue Falcon", "Iron Lotus", "Silent Comet", "Paper Tiger", "Green Anchor", "Night Orchid"]),
)  # fmt: skip
OWNERS = ("Maria", "Tomasz", "Aiko", "Dev", "Lena", "Omar", "Grace", "Felix", "Ines", "Kofi", "Noor", "Pablo")
FILLER = (
    "Tell me something about rivers.",
    "What is a good way to start the day?",
    "Describe a lighthouse in two sentences.",
    "Why do leaves change colour in autumn?",
    "Give me a tip for learning a language.",
    "What makes bread rise?",
)
SYSTEM = "You are a careful assistant. Keep track of what the user tells you. Answer briefly."


@dataclass(frozen=True)
class Fact:
    owner: str
    kind: str
    value: str
    question: str

    @property
    def statement(self) -> str:
        return f"Please remember this: the {self.kind} of {self.owner} is {self.value}."


def make_facts(count: int, seed: int) -> list[Fact]:
    rng = random.Random(seed)
    facts: list[Fact] = []
    owners = list(OWNERS)
    rng.shuffle(owners)
    for i in range(count):
        kind, question, values = KINDS[i % len(KINDS)]
        owner = owners[i % len(owners)]
        facts.append(Fact(owner, kind, rng.choice(list(values)), question.format(owner=owner)))
    return facts


def _contains(text: str, value: str) -> bool:
    return value.lower() in text.lower()


def _ask_each(rt: Any, sid: str, facts: Sequence[Fact], timeout: float) -> list[dict[str, Any]]:
    """Each question on its own branch from the session's current leaf."""
    leaf = rt.messages(sid)[-1].id
    rows = []
    for fact in facts:
        rt.branch(sid, leaf)
        result = rt.prompt(sid, fact.question).result(timeout=timeout)
        answer = result.text if result.status == "ok" else f"[{result.status}: {result.error}]"
        rows.append(
            {"fact": fact.statement, "answer": answer.strip()[:200], "ok": _contains(answer, fact.value)}
        )
    rt.branch(sid, leaf)
    return rows


def run(
    api_base: str,
    model: str,
    api_key: str | None,
    facts_count: int,
    filler: int,
    seed: int,
    timeout: float,
    max_output_tokens: int | None = None,
) -> dict[str, Any]:
    from runtime import Runtime

    facts = make_facts(facts_count, seed)
    answers = {} if max_output_tokens is None else {"agent.max_output_tokens": max_output_tokens}
    with tempfile.TemporaryDirectory() as tmp, Runtime(sessions_dir=Path(tmp) / "sessions") as rt:
        started = time.monotonic()
        # the ceiling: every fact in the context, no compaction
        base = rt.start_session(
            model=model,
            api_base=api_base,
            api_key=api_key,
            system_prompt=SYSTEM,
            config={"compaction.auto": False, **answers},
        )
        for fact in facts:
            rt.prompt(base, fact.statement).result(timeout=timeout)
        baseline = _ask_each(rt, base, facts, timeout)

        sid = rt.start_session(
            model=model, api_base=api_base, api_key=api_key, system_prompt=SYSTEM, config=answers or None
        )
        fillers = iter(FILLER * (1 + filler * len(facts) // len(FILLER)))
        turns_failed = 0
        for fact in facts:
            turns_failed += rt.prompt(sid, fact.statement).result(timeout=timeout).status != "ok"
            for _ in range(filler):
                turns_failed += rt.prompt(sid, next(fillers)).result(timeout=timeout).status != "ok"
        compaction = rt.compact(sid, keep_recent_tokens=0).result(timeout=timeout * 2)
        summaries = [m for m in rt.messages(sid, view="model") if m.kind == "compaction_summary"]
        summary = summaries[-1].text if summaries else ""
        answered = _ask_each(rt, sid, facts, timeout)
        window = rt.context_stats(sid).window
        elapsed = time.monotonic() - started
    kept = [_contains(summary, f.value) for f in facts]
    return {
        "model": model,
        "api_base": api_base,
        "window": window,
        "facts": facts_count,
        "filler_turns_per_fact": filler,
        "turns_failed": turns_failed,
        "compaction": {
            "compacted": compaction.compacted,
            "reason": compaction.reason,
            "fallback": compaction.fallback,
        },
        "summary_chars": len(summary),
        "kept": sum(kept),
        "answered": sum(r["ok"] for r in answered),
        "baseline": sum(r["ok"] for r in baseline),
        "seconds": round(elapsed, 1),
        "answers": answered,
        "baseline_answers": baseline,
        "summary": summary[:4000],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api-base", help="an OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--model", default="openai/smollm2", help="the model, litellm-style (openai/NAME)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--llama", action="store_true", help="start llama.cpp + SmolLM2 (from PyPI) for it")
    parser.add_argument("--ctx-size", type=int, default=4096, help="with --llama: the server's context")
    parser.add_argument("--facts", type=int, default=8)
    parser.add_argument("--filler", type=int, default=1, help="ordinary turns after each fact")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per turn")
    parser.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        help="cap each answer (not the summary): a small model rambles to the end of its window otherwise",
    )
    args = parser.parse_args(argv)
    if args.api_base is None and not args.llama:
        parser.error("give --api-base (and --model), or --llama")
    server = None
    if args.llama:
        from benchmarks._llama import INSTALL_HINT, server_binary, smollm2_gguf, start_llama_server

        binary, gguf = server_binary(), smollm2_gguf()
        if binary is None or gguf is None:
            parser.error(INSTALL_HINT)
        server = start_llama_server(binary, gguf, Path(tempfile.mkdtemp()), ctx_size=args.ctx_size, slots=1)
    try:
        api_base = server.url if server is not None else args.api_base
        result = run(
            api_base,
            args.model,
            args.api_key,
            args.facts,
            args.filler,
            args.seed,
            args.timeout,
            args.max_output_tokens,
        )
    finally:
        if server is not None:
            server.stop()
    row = {k: result[k] for k in ("model", "window", "facts", "kept", "answered", "baseline", "seconds")}
    row["compacted"] = result["compaction"]["compacted"]
    row["fallback_summary"] = result["compaction"]["fallback"]
    write_results(
        "eval_compaction",
        [row],
        {
            "api_base": result["api_base"] if server is None else "llama.cpp + SmolLM2 (--llama)",
            "filler_turns_per_fact": args.filler,
            "max_output_tokens": args.max_output_tokens,
            "seed": args.seed,
            "turns_failed": result["turns_failed"],
            "summary_chars": result["summary_chars"],
            "summary": result["summary"],
            "answers": result["answers"],
            "baseline_answers": result["baseline_answers"],
        },
    )


if __name__ == "__main__":
    main()
