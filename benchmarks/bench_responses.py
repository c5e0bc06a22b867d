"""The Responses API front door's cost: CPU per turn through ``POST /v1/responses`` against the runtime's own
HTTP API (issue 33).

One ``agentcell serve`` (an :class:`~runtime.apps.server.ApiServer` on a default :class:`~runtime.Runtime`,
in this process) answers every side; the local provider runs in a child process, and so does the client
(httpx, ``sessions`` conversations at once, each ``turns`` turns one after another), so the CPU counted is
this process's alone: the runtime, the server and, on the Responses sides, the front door. A turn is one
prompt and one streamed provider call (a short text answer).

Sides:

- ``own``: the runtime's own API: ``POST /sessions`` (with the provider's ``api_base``), then
  ``POST /sessions/{id}/prompt`` with ``"wait": true`` for each turn.
- ``responses``: ``POST /v1/responses``, the first starting the session, the next ones continuing it with
  ``previous_response_id`` (non-streamed answers).
- ``responses_stream``: the same, streamed (Server-Sent Events with the API's events).

Slices of ``sessions`` × ``turns`` turns alternate between the sides (A B C C B A ...), so a drift of the
machine's speed hits all alike. Reported per side: CPU ms per turn (median of its slices), turns/s, and the
ratio of its CPU per turn to ``own``'s in the slices next to it in time (median of the pairs).

Run: ``python -m benchmarks.bench_responses`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import runtime  # first: the offline litellm/tiktoken environment before either loads
from benchmarks._common import write_results

NAME = "responses"
TOKEN = "bench-token"
MODEL = "bench-text"
ANSWER = "The sum of two and three is five."
SIDES = ("own", "responses", "responses_stream")


def _serve_provider(conn: multiprocessing.connection.Connection) -> None:
    """The provider process: one looping one-step script."""
    from runtime.provider import LocalProvider, Turn

    provider = LocalProvider(context_window=1_000_000)
    provider.add_script(MODEL, [Turn(text=ANSWER)], loop=True)
    provider.start()
    conn.send(provider.url)
    conn.recv()
    provider.stop()


def _drive(conn: multiprocessing.connection.Connection, url: str, provider_url: str) -> None:
    """The client process: runs the slices it is sent, answers with their wall time."""
    import httpx

    async def conversation(http: httpx.AsyncClient, side: str, turns: int) -> None:
        if side == "own":
            created = await http.post(
                "/sessions",
                json={"model": f"openai/{MODEL}", "api_base": provider_url, "api_key": "sk-bench"},
            )
            sid = created.json()["id"]
            for turn in range(turns):
                answer = await http.post(
                    f"/sessions/{sid}/prompt", json={"text": f"turn {turn}", "wait": True}
                )
                assert answer.json()["status"] == "ok", answer.text
            return
        previous: str | None = None
        for turn in range(turns):
            body: dict[str, Any] = {"model": f"openai/{MODEL}", "input": f"turn {turn}"}
            if previous is not None:
                body["previous_response_id"] = previous
            if side == "responses":
                answer = await http.post("/v1/responses", json=body)
                previous = answer.json()["id"]
                continue
            async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
                async for line in stream.aiter_lines():
                    if line.startswith('data: {"type":"response.created"'):
                        previous = line.split('"id":"', 1)[1].split('"', 1)[0]

    async def slice_(side: str, sessions: int, turns: int) -> float:
        limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as http:
            started = time.perf_counter()
            await asyncio.gather(*(conversation(http, side, turns) for _ in range(sessions)))
            return time.perf_counter() - started

    while True:
        order = conn.recv()
        if order is None:
            return
        conn.send(asyncio.run(slice_(*order)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    sessions = args.sessions or (4 if args.quick else 16)
    turns = args.turns or (5 if args.quick else 10)
    rounds = args.rounds or (2 if args.quick else 6)

    from runtime.apps.server import ApiServer
    from runtime.config import Config

    ctx = multiprocessing.get_context("spawn")
    provider_conn, provider_child = ctx.Pipe()
    provider = ctx.Process(target=_serve_provider, args=(provider_child,), daemon=True)
    provider.start()
    provider_url: str = provider_conn.recv()
    os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = provider_url, "sk-bench"
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as sessions_dir:
        config = Config().with_overrides({"persistence.sessions_dir": sessions_dir})
        with runtime.Runtime(config) as rt, ApiServer(rt, TOKEN) as server:
            driver_conn, driver_child = ctx.Pipe()
            driver = ctx.Process(target=_drive, args=(driver_child, server.url, provider_url), daemon=True)
            driver.start()
            try:
                for side in SIDES:  # warm every path once
                    driver_conn.send((side, 2, 2))
                    driver_conn.recv()
                for round_ in range(rounds):
                    order = SIDES if round_ % 2 == 0 else SIDES[::-1]
                    for side in order:
                        before = time.process_time()
                        driver_conn.send((side, sessions, turns))
                        seconds = driver_conn.recv()
                        used = time.process_time() - before
                        cpu[side].append(used * 1000 / (sessions * turns))
                        rates[side].append(sessions * turns / seconds)
                        print(
                            f"round {round_ + 1}/{rounds} {side}: {cpu[side][-1]:.2f} ms CPU/turn", flush=True
                        )
            finally:
                driver_conn.send(None)
                driver.join(10)
    provider_conn.send("stop")
    provider.join(10)
    rows = []
    for side in SIDES:
        ratios = [c / o for c, o in zip(cpu[side], cpu["own"], strict=True)]
        rows.append(
            {
                "side": side,
                "cpu_ms_per_turn": round(statistics.median(cpu[side]), 3),
                "turns_per_s": round(statistics.median(rates[side]), 1),
                "cpu_ratio_to_own": round(statistics.median(ratios), 3),
                "slices": len(cpu[side]),
            }
        )
    meta = {"sessions": sessions, "turns": turns, "rounds": rounds, "quick": args.quick}
    write_results(NAME, rows, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
