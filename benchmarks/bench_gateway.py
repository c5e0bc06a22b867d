"""Gateway throughput on each transport against bare litellm (design §8: runtime overhead <= 10%).

All sides make the same streamed calls (``stream_options.include_usage``) to the same local provider,
which runs in its own process so that it does not compete with the client for the GIL:

- **bare**: ``asyncio.gather`` of ``concurrency`` workers, each awaiting ``litellm.acompletion`` and reading
  the stream to its end, on the gateway's own I/O loop;
- **gateway** (``gateway.transport = "litellm"``) and **native** (``"openai_compat"``): ``Gateway.complete``
  with the same concurrency, driven the way actors drive it: each result is handed to another thread (the
  "dispatcher"), which converts nothing and immediately starts the next call. The gateway converts our
  messages, assembles the message and usage, watches for stalls and delivers results across threads; on
  the native transport it also speaks HTTP and decodes the stream itself, in place of litellm.

Rounds alternate the order of the sides (bare, gateway, native, then native, gateway, bare, ...) so that
all see the same machine load; the figures are the medians of the per-round ratios to bare. Target: the
litellm transport >= 0.90 of bare litellm's calls/s. The native one's CPU per call is reported against bare
litellm's (``bench_capacity`` compares whole turns with the openai SDK and the Agents SDK).

With ``--dialect anthropic`` the same over Anthropic's Messages API (the provider's ``/v1/messages``):
``anthropic/`` model calls through bare litellm, the gateway on litellm, and the native ``anthropic`` transport
(issue 44's target: its CPU per call <= 0.2x bare litellm's); results in ``gateway_anthropic.json``.

Run: ``python -m benchmarks.bench_gateway`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.connection
import platform
import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

import runtime  # noqa: F401  (offline environment before litellm and tiktoken load)
from runtime.config import RetryConfig
from runtime.gateway import (
    CompletionRequest,
    CompletionResult,
    Gateway,
    IoLoop,
    build_call_kwargs,
    load_litellm,
)
from runtime.messages import Message, system, user

NAME = "gateway"
TARGET_RATIO = 0.90
MODEL = "bench"
REPLY = (
    "The gateway streams this reply in several chunks so that the client has real work to do: "
    "parse each server-sent event, assemble the text, and read the usage at the end."
)
REASONING = "A short chain of thought, streamed before the answer."


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """The provider process: serve a looping script until told to stop."""
    from runtime.provider import LocalProvider, Turn

    provider = LocalProvider(context_window=1_000_000, chunk_chars=32)
    provider.add_script(MODEL, [Turn(text=REPLY, reasoning=REASONING)], loop=True)
    provider.start()
    conn.send(provider.url)
    conn.recv()  # any message: stop
    provider.stop()


def _conversation() -> list[Message]:
    return [
        system("You are a benchmark. Answer briefly."),
        user("Explain in two sentences what a gateway between actors and an LLM provider does."),
    ]


async def _bare(kwargs: dict[str, Any], calls: int, concurrency: int) -> int:
    litellm = load_litellm()
    done = 0

    async def worker(count: int) -> None:
        nonlocal done
        for _ in range(count):
            response = await litellm.acompletion(**kwargs)
            async for _chunk in response:
                pass
            done += 1

    share, extra = divmod(calls, concurrency)
    await asyncio.gather(*(worker(share + (1 if i < extra else 0)) for i in range(concurrency)))
    return done


def run_bare(io: IoLoop, request: CompletionRequest, calls: int, concurrency: int) -> float:
    """Calls per second of bare ``litellm.acompletion`` on the I/O loop."""
    kwargs = build_call_kwargs(request)
    started = time.perf_counter()
    done = io.submit(_bare(kwargs, calls, concurrency)).result()
    elapsed = time.perf_counter() - started
    assert done == calls
    return calls / elapsed


def run_gateway(gateway: Gateway, request: CompletionRequest, calls: int, concurrency: int) -> float:
    """Calls per second through :meth:`Gateway.complete`, results handled on another thread."""
    inbox: queue.SimpleQueue[CompletionResult | None] = queue.SimpleQueue()
    failures: list[CompletionResult] = []
    finished = threading.Event()

    def dispatcher() -> None:
        started = completed = 0
        for _ in range(min(concurrency, calls)):
            gateway.complete(request, inbox.put)
            started += 1
        while completed < calls:
            result = inbox.get()
            assert result is not None
            completed += 1
            if not result.ok:
                failures.append(result)
            if started < calls:
                gateway.complete(request, inbox.put)
                started += 1
        finished.set()

    begin = time.perf_counter()
    thread = threading.Thread(target=dispatcher, name="bench-dispatcher")
    thread.start()
    finished.wait()
    elapsed = time.perf_counter() - begin
    thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} calls failed, e.g. {failures[0].error}")
    return calls / elapsed


def _measured(run: Callable[..., float], *args: Any) -> tuple[float, float]:
    """The calls/s ``run`` reports, and the CPU seconds this process spent on it (all threads)."""
    cpu = time.process_time()
    rate = run(*args)
    return rate, time.process_time() - cpu


def _print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    table = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in table:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _write(rows: list[dict[str, Any]], meta: dict[str, Any], name: str = NAME) -> None:
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
    parser.add_argument("--calls", type=int, default=100, help="calls per side and round (default 100)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight (default 16)")
    parser.add_argument("--rounds", type=int, default=12, help="rounds (default 12)")
    parser.add_argument("--quick", action="store_true", help="60 calls, 4 rounds")
    parser.add_argument(
        "--dialect",
        choices=("openai", "anthropic"),
        default="openai",
        help="chat completions (default), or Anthropic's Messages API over the native anthropic transport",
    )
    args = parser.parse_args(argv)
    calls, rounds = (60, 4) if args.quick else (args.calls, args.rounds)

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child,), name="bench-provider", daemon=True)
    server.start()
    if not parent.poll(60):
        server.kill()
        raise RuntimeError("the provider process did not start within 60 s")
    url = parent.recv()
    io = IoLoop(name="bench-io")
    try:
        load_litellm()
        gateway = Gateway(io, RetryConfig(max_attempts=1))
        anthropic = args.dialect == "anthropic"
        request = CompletionRequest(
            model=f"{args.dialect}/{MODEL}",
            messages=_conversation(),
            api_base=url.removesuffix("/v1") if anthropic else url,
            api_key="sk-bench",
            transport="litellm",
        )
        native = msgspec.structs.replace(request, transport="auto" if anthropic else "openai_compat")
        assert gateway.route(native).transport == ("anthropic" if anthropic else "openai_compat")
        # Warm-up: connection pools, litellm's lazy imports and caches, on every path.
        run_bare(io, request, max(20, args.concurrency), args.concurrency)
        run_gateway(gateway, request, max(20, args.concurrency), args.concurrency)
        run_gateway(gateway, native, max(20, args.concurrency), args.concurrency)
        sides: list[tuple[str, Callable[[], float]]] = [
            ("bare", lambda: run_bare(io, request, calls, args.concurrency)),
            ("gateway", lambda: run_gateway(gateway, request, calls, args.concurrency)),
            ("native", lambda: run_gateway(gateway, native, calls, args.concurrency)),
        ]
        rows: list[dict[str, Any]] = []
        for r in range(1, rounds + 1):
            # Alternate the order, so that no side always runs on a warmer (or busier) machine.
            measured = {name: _measured(run) for name, run in (sides if r % 2 else sides[::-1])}
            bare, bare_cpu = measured["bare"]
            gated, gated_cpu = measured["gateway"]
            fast, fast_cpu = measured["native"]
            rows.append(
                {
                    "round": r,
                    "calls": calls,
                    "bare_calls_per_s": bare,
                    "gateway_calls_per_s": gated,
                    "native_calls_per_s": fast,
                    "ratio": gated / bare,
                    "native_ratio": fast / bare,
                    "bare_cpu_ms_per_call": bare_cpu * 1000 / calls,
                    "gateway_cpu_ms_per_call": gated_cpu * 1000 / calls,
                    "native_cpu_ms_per_call": fast_cpu * 1000 / calls,
                }
            )
            print(
                f"round {r}: bare {bare:7.1f}  gateway {gated:7.1f}  native {fast:7.1f} calls/s  "
                f"(CPU per call: bare {bare_cpu * 1000 / calls:.2f} ms, gateway {gated_cpu * 1000 / calls:.2f} ms, "
                f"native {fast_cpu * 1000 / calls:.2f} ms)",
                flush=True,
            )
    finally:
        io.stop()
        parent.send("stop")
        server.join(10)

    medians = {
        side: statistics.median(r[f"{side}_calls_per_s"] for r in rows)
        for side in ("bare", "gateway", "native")
    }
    cpu = {
        side: statistics.median(r[f"{side}_cpu_ms_per_call"] for r in rows)
        for side in ("bare", "gateway", "native")
    }
    ratio = statistics.median(r["ratio"] for r in rows)
    native_ratio = statistics.median(r["native_ratio"] for r in rows)
    print()
    _print_table(
        [
            {"side": "bare litellm", "median_calls_per_s": medians["bare"], "cpu_ms_per_call": cpu["bare"]},
            {
                "side": "gateway (litellm)",
                "median_calls_per_s": medians["gateway"],
                "cpu_ms_per_call": cpu["gateway"],
            },
            {
                "side": "gateway (native)",
                "median_calls_per_s": medians["native"],
                "cpu_ms_per_call": cpu["native"],
            },
        ],
        ["side", "median_calls_per_s", "cpu_ms_per_call"],
    )
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    cpu_ratio = statistics.median(r["gateway_cpu_ms_per_call"] / r["bare_cpu_ms_per_call"] for r in rows)
    native_cpu_ratio = statistics.median(
        r["native_cpu_ms_per_call"] / r["bare_cpu_ms_per_call"] for r in rows
    )
    print(
        f"CPU per call, gateway (litellm) / bare, median: {cpu_ratio:.3f}; native / bare: {native_cpu_ratio:.3f}"
    )
    print(f"native / bare calls/s, median of {rounds} rounds: {native_ratio:.3f}")
    print(
        f"gateway (litellm) / bare calls/s, median of {rounds} rounds: {ratio:.3f} (target >= {TARGET_RATIO}): {verdict}"
    )
    meta = {
        "dialect": args.dialect,
        "calls_per_round": calls,
        "rounds": rounds,
        "concurrency": args.concurrency,
        "stream": True,
        "median_bare_calls_per_s": medians["bare"],
        "median_gateway_calls_per_s": medians["gateway"],
        "median_native_calls_per_s": medians["native"],
        "ratio": ratio,
        "native_ratio": native_ratio,
        "cpu_per_call_ratio": cpu_ratio,
        "native_cpu_per_call_ratio": native_cpu_ratio,
        "median_cpu_ms_per_call": cpu,
        "target_ratio": TARGET_RATIO,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    _write(rows, meta, NAME if args.dialect == "openai" else f"{NAME}_anthropic")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
