"""Capacity: CPU per answered turn, and the turns/s one process sustains at 1,000 concurrent sessions with a
provider latency of 1-2 s (design §8, the native OpenAI-compatible transport).

Every side holds ``sessions`` conversations at once; each conversation makes ``turns`` turns one after
another, its history growing (a turn: the user's prompt, one streamed answer with usage). The local provider
runs in a child process and answers every request after a latency drawn between 1 and 2 s, so that at any
moment about a thousand calls are in flight and the client process is busy only with its own work: its CPU
per answered turn, and the turns/s it reaches when that work, not the provider, is what limits it.

Sides, all in this process, taking turns slice by slice (A B C .. C B A):

- ``runtime_native``: a default :class:`runtime.Runtime` with ``gateway.transport = "openai_compat"``;
- ``runtime_litellm``: the same with ``gateway.transport = "litellm"``;
- ``bare_litellm``: coroutines calling ``litellm.acompletion`` (streamed, usage, no retries), nothing else;
- ``bare_openai``: coroutines calling the official ``openai`` SDK's ``AsyncOpenAI.chat.completions.create``
  (streamed, usage), its connection pool as large as the native transport's;
- ``agents_sdk``: the OpenAI Agents SDK's ``Runner.run_streamed`` on a chat-completions model (tracing off),
  if ``openai-agents`` is installed (``pip install 'agentcell[bench]'``); the table says when it is not.

CPU is this process's (every thread), per answered turn, and its split into user and system time (the
system part, syscalls and fsync among them, is the one that swings most from run to run on a shared
machine); the provider's CPU is reported beside it, to show it was not the limit. To compare two versions
of agentcell on this benchmark, ``python -m benchmarks.ab REV --bench capacity`` runs both, alternating. Targets (design §8): the runtime on the native transport <= 0.6x the CPU per turn of the
bare openai SDK loop and <= 0.2x bare litellm's.

Run: ``python -m benchmarks.bench_capacity`` (``--quick``: 200 sessions, one slice a side).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

import runtime  # first: the offline litellm/tiktoken environment before either loads
from benchmarks._common import format_table, write_results
from runtime.config import Config

NAME = "capacity"
MODEL = "capacity"
API_KEY = "sk-bench"
SYSTEM = "You are a concise assistant. Answer in two sentences."
REPLY = (
    "A gateway keeps every provider call of many sessions on one event loop, so that no actor waits for the "
    "network. It streams each answer back as it arrives and reads the usage at the end."
)
TARGET_VS_OPENAI = 0.6
TARGET_VS_LITELLM = 0.2
TARGET_LITELLM_RATE = 0.9
SLICE_TIMEOUT = 1_800.0
MAX_ATTEMPTS = 3


def _prompt(turn: int) -> str:
    return f"Turn {turn}: what does a gateway between actors and an LLM provider do?"


# -- the provider process -----------------------------------------------------------------------------------


def _serve(conn: multiprocessing.connection.Connection, low: float, high: float) -> None:
    """The provider: one looping script whose replies wait between ``low`` and ``high`` seconds."""
    from runtime.provider import LocalProvider, Turn

    rng = random.Random(26)
    provider = LocalProvider(context_window=1_000_000, chunk_chars=24)
    turns = [Turn(text=REPLY, latency=rng.uniform(low, high)) for _ in range(97)]
    provider.add_script(MODEL, turns, loop=True)
    provider.start()
    conn.send((provider.url, __import__("os").getpid()))
    conn.recv()  # any message: stop
    provider.stop()


class ProviderProcess:
    def __init__(self, low: float, high: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve, args=(child, low, high), name="bench-provider", daemon=True
        )
        self._process.start()
        self.url, pid = self._conn.recv()
        self.proc = psutil.Process(pid)

    def cpu(self) -> float:
        times = self.proc.cpu_times()
        return float(times.user + times.system)

    def close(self) -> None:
        self._conn.send("stop")
        self._process.join(10)


# -- the sides ------------------------------------------------------------------------------------------------


@dataclass
class Run:
    side: str
    sessions: int
    turns: int
    seconds: float
    cpu_seconds: float
    provider_cpu_seconds: float
    latencies: list[float] = field(default_factory=list)
    retries: int = 0
    user_seconds: float = 0.0  # cpu_seconds split: this process's own code and the kernel's work for it
    system_seconds: float = 0.0

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds

    @property
    def cpu_ms_per_turn(self) -> float:
        return self.cpu_seconds / self.turns * 1000


class Side(Protocol):
    name: str

    async def open(self, url: str, sessions: int) -> None: ...

    async def conversation(self, index: int, turns: int, latencies: list[float]) -> None: ...

    async def prepare(self, sessions: int) -> None: ...

    async def close(self) -> None: ...


class RuntimeSide:
    """Sessions of a default runtime, their turns awaited from coroutines."""

    def __init__(self, transport: str) -> None:
        self.name = f"runtime_{'native' if transport == 'openai_compat' else transport}"
        self.transport = transport
        self.rt: Any = None
        self.folder: str | None = None
        self.sids: list[str] = []

    async def open(self, url: str, sessions: int) -> None:
        self.url = url
        self.folder = tempfile.mkdtemp(prefix="agentcell-bench-capacity-")
        config = Config().with_overrides({"gateway.transport": self.transport})
        folder = self.folder
        self.rt = await asyncio.to_thread(lambda: runtime.Runtime(config, sessions_dir=folder).start())

    def _start(self, count: int) -> list[str]:
        sids = [
            str(
                self.rt.start_session(
                    model=f"openai/{MODEL}", system_prompt=SYSTEM, api_base=self.url, api_key=API_KEY
                )
            )
            for _ in range(count)
        ]
        for sid in sids:
            self.rt.usage(sid)  # starts the session's actors (lazy), before the clock runs
        # and their stores have their logs open (the log writer opens them, asynchronously): a session's start,
        # off the clock too, not a share of its first turn that depends on how fast the writer got there
        self.rt.services.writer.flush(timeout=120)
        return sids

    async def prepare(self, sessions: int) -> None:
        self.sids = await asyncio.to_thread(self._start, sessions)

    async def conversation(self, index: int, turns: int, latencies: list[float]) -> None:
        sid = self.sids[index]
        for turn in range(turns):
            began = time.perf_counter()
            result = await self.rt.prompt(sid, _prompt(turn))
            if result.status != "ok":
                raise RuntimeError(f"{self.name} {sid}: turn {turn} ended {result.status}: {result.error}")
            latencies.append(time.perf_counter() - began)

    async def close(self) -> None:
        if self.rt is not None:
            await asyncio.to_thread(self.rt.stop)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


class BareSide:
    """Plain coroutines holding OpenAI-format histories; subclasses make the call."""

    name = "bare"
    retryable: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self.histories: list[list[dict[str, Any]]] = []
        self.retries = 0

    async def prepare(self, sessions: int) -> None:
        self.histories = [[{"role": "system", "content": SYSTEM}] for _ in range(sessions)]

    async def call(self, messages: list[dict[str, Any]]) -> str:
        raise NotImplementedError

    async def conversation(self, index: int, turns: int, latencies: list[float]) -> None:
        messages = self.histories[index]
        for turn in range(turns):
            began = time.perf_counter()
            messages.append({"role": "user", "content": _prompt(turn)})
            for attempt in range(1, MAX_ATTEMPTS + 1):  # as the gateway retries a dropped connection
                try:
                    text = await self.call(messages)
                    break
                except self.retryable:
                    if attempt == MAX_ATTEMPTS:
                        raise
                    self.retries += 1
            messages.append({"role": "assistant", "content": text})
            latencies.append(time.perf_counter() - began)

    async def close(self) -> None:
        self.histories = []


class BareLitellm(BareSide):
    name = "bare_litellm"

    async def open(self, url: str, sessions: int) -> None:
        from runtime.gateway import load_litellm

        self.litellm = load_litellm()
        self.url = url
        self.retryable = (
            self.litellm.APIConnectionError,
            self.litellm.InternalServerError,
            self.litellm.Timeout,
        )

    async def call(self, messages: list[dict[str, Any]]) -> str:
        stream = await self.litellm.acompletion(
            model=f"openai/{MODEL}",
            messages=messages,
            api_base=self.url,
            api_key=API_KEY,
            stream=True,
            stream_options={"include_usage": True},
            num_retries=0,
            max_retries=0,
        )
        text: list[str] = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return "".join(text)


def _openai_client(url: str, sessions: int) -> Any:
    """The SDK's client with a pool as large as the native transport's (1,000, all kept alive) and its
    timeout for connecting too (the SDK's default gives up connecting after 5 s: a thousand connections
    opened at once on a loaded machine take longer)."""
    import openai

    try:  # the openai SDK's HTTP stack: httpx, or its fork httpx2 (openai >= 3)
        import httpx2 as hx
    except ImportError:
        import httpx as hx
    limits = hx.Limits(max_connections=max(1_000, sessions), max_keepalive_connections=max(1_000, sessions))
    http = openai.DefaultAsyncHttpxClient(limits=limits, timeout=hx.Timeout(600.0))
    return openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=600.0, http_client=http)


class BareOpenAI(BareSide):
    name = "bare_openai"

    async def open(self, url: str, sessions: int) -> None:
        import openai

        self.client = _openai_client(url, sessions)
        self.retryable = (openai.APIConnectionError, openai.InternalServerError)

    async def call(self, messages: list[dict[str, Any]]) -> str:
        stream = await self.client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        text: list[str] = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return "".join(text)

    async def close(self) -> None:
        await self.client.close()


class AgentsSDK(BareSide):
    """The OpenAI Agents SDK: an agent on a chat-completions model, each turn ``Runner.run_streamed``."""

    name = "agents_sdk"

    async def open(self, url: str, sessions: int) -> None:
        import openai
        from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, set_tracing_disabled

        set_tracing_disabled(True)
        self.client = _openai_client(url, sessions)
        self.retryable = (openai.APIConnectionError, openai.InternalServerError)
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=self.client)
        self.agent = Agent(
            name="bench", instructions=SYSTEM, model=model, model_settings=ModelSettings(include_usage=True)
        )

    async def prepare(self, sessions: int) -> None:
        self.histories = [[] for _ in range(sessions)]  # the agent holds the system prompt

    async def conversation(self, index: int, turns: int, latencies: list[float]) -> None:
        from agents import Runner

        history: list[Any] = self.histories[index]
        for turn in range(turns):
            began = time.perf_counter()
            history.append({"role": "user", "content": _prompt(turn)})
            for attempt in range(1, MAX_ATTEMPTS + 1):
                try:
                    result = Runner.run_streamed(self.agent, input=history)
                    async for _event in result.stream_events():
                        pass
                    break
                except self.retryable:
                    if attempt == MAX_ATTEMPTS:
                        raise
                    self.retries += 1
            history = result.to_input_list()
            latencies.append(time.perf_counter() - began)
        self.histories[index] = history

    async def close(self) -> None:
        await self.client.close()


def agents_sdk_available() -> str | None:
    """None when the Agents SDK can be imported, else why not."""
    try:
        import agents  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"{type(exc).__name__}: {exc}"
    return None


# -- running -------------------------------------------------------------------------------------------------


async def _slice(side: Any, sessions: int, turns: int, provider: ProviderProcess) -> Run:
    await side.prepare(sessions)
    latencies: list[float] = []
    retries_before = getattr(side, "retries", 0)
    gc.collect()
    times, provider_cpu, began = os.times(), provider.cpu(), time.perf_counter()
    await asyncio.gather(*(side.conversation(i, turns, latencies) for i in range(sessions)))
    if isinstance(side, RuntimeSide):
        await asyncio.to_thread(side.rt.services.writer.flush)
    seconds = time.perf_counter() - began
    after = os.times()
    user, system = after.user - times.user, after.system - times.system
    run = Run(
        side.name,
        sessions,
        len(latencies),
        seconds,
        user + system,
        provider.cpu() - provider_cpu,
        latencies,
        getattr(side, "retries", 0) - retries_before,
        user,
        system,
    )
    print(
        f"  {run.side:16} sessions={sessions:<5} turns={run.turns:<6} {run.turns_per_s:7.1f} turns/s"
        f"  cpu {run.cpu_ms_per_turn:6.2f} ms/turn (user {user / run.turns * 1000:4.2f} sys"
        f" {system / run.turns * 1000:4.2f})  p50 {_percentile(latencies, 0.5):5.2f} s"
        f"  provider cpu {run.provider_cpu_seconds / seconds * 100:4.0f}%",
        flush=True,
    )
    return run


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def measure(
    sides: list[Any],
    provider: ProviderProcess,
    sessions: int,
    turns: int,
    rounds: int,
    warmup: int,
    failures: dict[str, str],
) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {side.name: [] for side in sides}
    try:
        for side in sides:
            await side.open(provider.url, sessions)
            await side.prepare(warmup)  # connections opened, lazy imports and caches warmed, off the clock
            await asyncio.gather(*(side.conversation(i, 1, []) for i in range(warmup)))
        for r in range(rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                if side.name in failures:
                    continue
                try:
                    run = await asyncio.wait_for(_slice(side, sessions, turns, provider), SLICE_TIMEOUT)
                except Exception as exc:  # one side failing must not lose the others' figures
                    failures[side.name] = f"{type(exc).__name__}: {exc}"[:300]
                    print(f"  {side.name:16} FAILED: {failures[side.name]}", flush=True)
                    continue
                runs[side.name].append(run)
    finally:
        for side in sides:
            with contextlib.suppress(Exception):
                await side.close()
    return runs


def _row(name: str, runs: list[Run]) -> dict[str, Any]:
    latencies = [x for r in runs for x in r.latencies]
    return {
        "side": name,
        "sessions": runs[0].sessions,
        "turns": sum(r.turns for r in runs),
        "slices": len(runs),
        "turns_per_s": round(statistics.median(r.turns_per_s for r in runs), 1),
        "cpu_ms_per_turn": round(statistics.median(r.cpu_ms_per_turn for r in runs), 3),
        "user_ms_per_turn": round(statistics.median(r.user_seconds / r.turns * 1000 for r in runs), 3),
        "sys_ms_per_turn": round(statistics.median(r.system_seconds / r.turns * 1000 for r in runs), 3),
        "cpu_util": round(statistics.median(r.cpu_seconds / r.seconds for r in runs), 2),
        "provider_cpu_util": round(statistics.median(r.provider_cpu_seconds / r.seconds for r in runs), 2),
        "p50_s": round(_percentile(latencies, 0.5), 2),
        "p99_s": round(_percentile(latencies, 0.99), 2),
        "retries": sum(r.retries for r in runs),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000, help="concurrent sessions (default 1,000)")
    parser.add_argument("--turns", type=int, default=3, help="turns of each session per slice (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="slices of each side (default 2)")
    parser.add_argument("--latency", default="1.0-2.0", help="provider latency range in s (default 1.0-2.0)")
    parser.add_argument("--sides", default=None, help="comma-separated sides to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="200 sessions, 2 turns, one slice a side")
    args = parser.parse_args(argv)
    sessions, turns, rounds = (200, 2, 1) if args.quick else (args.sessions, args.turns, args.rounds)
    low, high = (float(x) for x in args.latency.split("-"))

    from runtime.gateway import load_litellm

    load_litellm()
    missing = agents_sdk_available()
    candidates: list[Any] = [
        RuntimeSide("openai_compat"),
        RuntimeSide("litellm"),
        BareLitellm(),
        BareOpenAI(),
    ]
    if missing is None:
        candidates.append(AgentsSDK())
    else:
        print(
            f"agents_sdk: not measured, the OpenAI Agents SDK is not installed ({missing}); "
            "pip install 'agentcell[bench]'"
        )
    chosen = {s.strip() for s in args.sides.split(",")} if args.sides else None
    sides = [s for s in candidates if chosen is None or s.name in chosen]
    provider = ProviderProcess(low, high)
    failures: dict[str, str] = {}
    loop = asyncio.new_event_loop()
    try:
        runs = loop.run_until_complete(
            measure(sides, provider, sessions, turns, rounds, min(sessions, 50), failures)
        )
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        provider.close()

    rows = [_row(name, r) for name, r in runs.items() if r]
    by_side = {row["side"]: row for row in rows}
    native = by_side.get("runtime_native")
    figures: dict[str, Any] = {}
    if native is not None:
        for other, target in (("bare_openai", TARGET_VS_OPENAI), ("bare_litellm", TARGET_VS_LITELLM)):
            if other in by_side:
                ratio = native["cpu_ms_per_turn"] / by_side[other]["cpu_ms_per_turn"]
                figures[f"native_cpu_vs_{other}"] = {
                    "ratio": round(ratio, 3),
                    "target": target,
                    "met": ratio <= target,
                }
        if "agents_sdk" in by_side:
            ratio = native["cpu_ms_per_turn"] / by_side["agents_sdk"]["cpu_ms_per_turn"]
            figures["native_cpu_vs_agents_sdk"] = {"ratio": round(ratio, 3), "target": None, "met": None}
    if "runtime_litellm" in by_side and "bare_litellm" in by_side:
        ratio = by_side["runtime_litellm"]["turns_per_s"] / by_side["bare_litellm"]["turns_per_s"]
        figures["litellm_turns_vs_bare_litellm"] = {
            "ratio": round(ratio, 3),
            "target": TARGET_LITELLM_RATE,
            "met": ratio >= TARGET_LITELLM_RATE,
        }
    for row in rows:
        if native is not None:
            row["cpu_vs_native"] = round(row["cpu_ms_per_turn"] / native["cpu_ms_per_turn"], 2)
    meta = {
        "quick": args.quick,
        "sessions": sessions,
        "turns_per_session_per_slice": turns,
        "rounds": rounds,
        "provider_latency_s": [low, high],
        "turn": "prompt -> one streamed answer with usage (history growing); the provider in a child process",
        "agents_sdk": "measured" if missing is None else f"not installed: {missing}",
        "failed": failures,
        "figures": figures,
    }
    print()
    write_results(NAME, rows, meta, table=False)
    print(format_table(rows))
    for name, figure in figures.items():
        verdict = "" if figure["met"] is None else ("met" if figure["met"] else "NOT met")
        target = (
            ""
            if figure["target"] is None
            else f" (target {'<=' if 'cpu' in name else '>='} {figure['target']})"
        )
        print(f"{name}: {figure['ratio']:.3f}{target} {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
