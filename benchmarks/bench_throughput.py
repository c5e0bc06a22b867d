"""Turn throughput: the runtime against a bare asyncio loop making the same litellm calls (design §8).

Each of N sessions runs ``turns`` prompts one after another; all N sessions run at once.

Workloads:

- ``http``: tool-using conversations with the local provider over real HTTP. The provider runs in a child
  process, so it does not compete with the client for this process's GIL. A turn is: the user's prompt,
  the model calls the ``add`` tool, the tool's result, the model's answer. That makes two streamed calls
  and one tool run per turn.
- ``mock``: conversations on litellm's in-process ``mock_response`` (``agent.mock_response``), with no
  network. A turn is one streamed call. litellm's mock answers with text only, so these turns have no tools.

Sides, all in this process:

- ``bare``: the baseline. N coroutines on one asyncio loop. Each keeps an OpenAI-format message list and
  calls ``litellm.acompletion`` with the arguments the runtime sends: streamed with usage, the same
  tools, no retries. It reads the stream, puts the text and tool calls back together, and runs the tool
  inline. There is no runtime.
- ``runtime``: a default :class:`runtime.Runtime` (fsync at turn end, transcripts on, its own threads on
  one CPU: ``runtime.cpu = "auto"``) with N sessions, its calls on the litellm transport
  (``gateway.transport = "litellm"``). Driver coroutines on one asyncio loop await each prompt's handle.
- ``native`` (``http`` only): the same runtime on the native OpenAI-compatible transport
  (``gateway.transport = "openai_compat"``, what ``auto`` picks for these calls). litellm's in-process mock
  exists only in litellm, so ``mock`` turns have no native side.
- ``threads``: the same runtime with one dispatcher thread per session actor (5 per session). This is the
  thread count and scheduling of pykka's ThreadingActor. The session actors rely on the pooled actors'
  non-blocking replies, so they cannot run on ``ThreadingActor`` itself.

The sides are set up once, warmed, and kept open; then they take turns. A slice is ``turns`` turns of
N new conversations at once (the runtime starts its N sessions before the clock runs); the sides alternate
slices in A B B A order (A B C C B A with the native side), so a drift of the machine's speed hits all alike. This matters here: the same
pure-Python loop runs at anything from 200 to 370 ms from one second to the next on this shared 2-core
machine, which two long back-to-back runs cannot tell from a difference between the sides. Each side's
slice rates are compared with the other side's slice next to it in time; the ratio reported is the median
of those pairwise ratios of turns/s (target: >= 0.90), and the table also gives each side's median rate.

One CPU: CPython runs one thread at a time, and on a machine with several cores the threads of one
process hand that turn from core to core (litellm's worker threads on the bare side; the runtime's I/O,
dispatcher and log writer threads on the other), each hand-over starting on a cold cache. The runtime
keeps its own threads on one CPU by default for that reason (``runtime.affinity``); the ``turns_cpu_off``
rows measure it with ``runtime.cpu = "off"``, every thread left to the OS. Each side also alternates
slices with the whole process pinned to one CPU and slices free, and the two sides are compared once
more, both pinned. This tells how much a deployment gains from pinning (``taskset``) and what the
runtime costs when neither side pays for hand-overs. Linux only (``os.sched_setaffinity``), and only
where the process may use more than one CPU.

Fan-out: a runtime with 1, 100 or 1,000 subscribers to every session alternates slices with one that has
none. The subscribers are async iterators on a reader thread's event loop. It reports deliveries/s and
the turn rate against the runtime without subscribers. The thread-per-actor comparison alternates the
same way.

Run: ``python -m benchmarks.bench_throughput`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import psutil

import runtime  # first: the offline litellm/tiktoken environment before either loads
from benchmarks._common import format_table, write_results
from runtime.affinity import auto_candidates
from runtime.config import Config
from runtime.tools.registry import ToolRegistry

NAME = "throughput"
TARGET_RATIO = 0.90
API_KEY = "sk-bench"
SYSTEM = "You are a careful calculator. Use the add tool for every sum."
MOCK_MODEL = "openai/gpt-4o-mini"
MOCK_REPLY = "Two and three make five; the sum is checked and correct."
ANSWER = "The tool says 2 + 3 = 5, so the answer is five."
SLICE_TIMEOUT = 1_800.0
MAX_ATTEMPTS = 3  # the runtime's default (retry.max_attempts)
ACTORS_PER_SESSION = 5

Mode = Literal["http", "mock"]
Side = Literal["bare", "runtime", "native", "threads"]


def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return str(a + b)


def _registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(add)
    return registry


def _prompt(turn: int) -> str:
    return f"Turn {turn}: what is 2 + 3? Check it with the tool."


def _script_model(index: int) -> str:
    return f"bench-{index}"


# -- the provider process -------------------------------------------------------------------------------


def tool_turn_steps() -> list[Any]:
    """The provider's script for one ``http`` turn: a call to the ``add`` tool, then the answer."""
    from runtime.provider import ToolCallSpec, Turn

    return [
        Turn(text="Let me add.", tool_calls=(ToolCallSpec(name="add", arguments='{"a": 2, "b": 3}'),)),
        Turn(text=ANSWER),
    ]


def _serve(conn: multiprocessing.connection.Connection, sessions: int) -> None:
    """The provider process: one looping two-step script (tool call, answer) per session."""
    from runtime.provider import LocalProvider

    provider = LocalProvider(context_window=1_000_000)
    steps = tool_turn_steps()
    for i in range(sessions):
        provider.add_script(_script_model(i), steps, loop=True)
    provider.start()
    conn.send(provider.url)
    conn.recv()  # any message: stop
    provider.stop()


class ProviderProcess:
    """The local provider in a child process (spawned: no threads or litellm state inherited)."""

    def __init__(self, sessions: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, sessions), name="bench-provider", daemon=True)
        self._process.start()
        self.url: str = self._conn.recv()

    def close(self) -> None:
        self._conn.send("stop")
        self._process.join(10)


# -- one measured run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    mode: Mode
    sessions: int
    turns: int

    def model(self, index: int) -> str:
        return MOCK_MODEL if self.mode == "mock" else f"openai/{_script_model(index)}"


@dataclass
class Run:
    """What one side measured on one workload."""

    side: Side
    work: Workload
    seconds: float
    cpu_seconds: float
    latencies: list[float]
    calls: int
    rss_mb: float
    subscribers: int = 0
    deliveries: int = 0
    dropped: int = 0
    delivery_seconds: float = 0.0
    cpus: int | None = None  # the CPUs the process was pinned to, if it was
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return len(self.latencies)

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _spread(ratios: Sequence[float]) -> list[float]:
    """The middle half of the pairwise ratios (lower and upper quartile): how far one pair of slices
    can be from the median on this machine. With fewer than four pairs, their range."""
    if len(ratios) < 4:
        return [round(min(ratios), 3), round(max(ratios), 3)]
    low, _, high = statistics.quantiles(ratios, n=4)
    return [round(low, 3), round(high, 3)]


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss / 2**20)


# -- the bare baseline -------------------------------------------------------------------------------------


async def _read_stream(stream: Any) -> dict[str, Any]:
    """Read a streamed reply to its end; the assistant message in OpenAI format."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
        for piece in delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": []})
            if piece.id:
                call["id"] = piece.id
            if piece.function is not None:
                if piece.function.name:
                    call["name"] = piece.function.name
                if piece.function.arguments:
                    call["arguments"].append(piece.function.arguments)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
            }
            for c in calls.values()
        ]
    return message


class Bare:
    """The baseline: the same litellm calls from plain coroutines, no runtime."""

    side: Side = "bare"

    def __init__(self, work: Workload, url: str | None, tools: list[dict[str, Any]]) -> None:
        self.work = work
        self.url = url
        self.tools = tools if work.mode == "http" else []
        self.retries = 0
        self.litellm: Any = None
        self.histories: list[list[dict[str, Any]]] = []

    def _kwargs(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        # The arguments runtime.gateway.build_call_kwargs gives the same request.
        kwargs: dict[str, Any] = {
            "model": self.work.model(index),
            "messages": messages,
            "stream": True,
            "timeout": 600.0,
            "num_retries": 0,
            "max_retries": 0,
            "stream_options": {"include_usage": True},
            "api_key": API_KEY,
        }
        if self.tools:
            kwargs["tools"] = self.tools
            kwargs["_skip_mcp_handler"] = True
        if self.url is not None and self.work.mode == "http":
            kwargs["api_base"] = self.url
        if self.work.mode == "mock":
            kwargs["mock_response"] = MOCK_REPLY
        return kwargs

    async def _complete(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One call, read to its end. A connection error is retried at once, up to ``MAX_ATTEMPTS`` in
        all, as the runtime's gateway retries it (e.g. a kept-alive connection the server has closed)."""
        litellm = self.litellm
        retryable = (litellm.APIConnectionError, litellm.InternalServerError, litellm.Timeout)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                stream = await litellm.acompletion(**self._kwargs(index, messages))
                return await _read_stream(stream)
            except retryable:
                if attempt == MAX_ATTEMPTS:
                    raise
                self.retries += 1
        raise AssertionError("unreachable")

    async def conversation(
        self, index: int, messages: list[dict[str, Any]], turns: int, latencies: list[float]
    ) -> int:
        """``turns`` turns of one conversation, appended to ``messages``."""
        calls = 0
        for turn in range(turns):
            began = time.perf_counter()
            messages.append({"role": "user", "content": _prompt(turn)})
            while True:
                reply = await self._complete(index, messages)
                calls += 1
                messages.append(reply)
                tool_calls = reply.get("tool_calls")
                if not tool_calls:
                    break
                for call in tool_calls:
                    arguments = json.loads(call["function"]["arguments"])
                    result = add(**arguments)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            latencies.append(time.perf_counter() - began)
        return calls

    async def open(self, warmup: int) -> None:
        from runtime.gateway import load_litellm

        self.litellm = load_litellm()
        warm = [[{"role": "system", "content": SYSTEM}] for _ in range(min(warmup, self.work.sessions))]
        await asyncio.gather(*(self.conversation(i, h, 1, []) for i, h in enumerate(warm)))
        self.histories = [[{"role": "system", "content": SYSTEM}] for _ in range(self.work.sessions)]

    async def slice(self) -> Run:
        """``work.turns`` turns of new conversations, one per session, all at once."""
        self.histories = [[{"role": "system", "content": SYSTEM}] for _ in range(self.work.sessions)]
        latencies: list[float] = []
        retries_before = self.retries
        gc.collect()
        cpu, began = time.process_time(), time.perf_counter()
        calls = await asyncio.gather(
            *(self.conversation(i, h, self.work.turns, latencies) for i, h in enumerate(self.histories))
        )
        seconds = time.perf_counter() - began
        run = Run("bare", self.work, seconds, time.process_time() - cpu, latencies, sum(calls), _rss_mb())
        run.extra["retries"] = self.retries - retries_before
        return run

    async def close(self) -> None:
        self.histories = []


# -- the runtime ----------------------------------------------------------------------------------------


class _Readers:
    """``count`` subscribers to every session, read as async iterators on one event loop thread."""

    def __init__(self, rt: Any, count: int) -> None:
        self.subs = [rt.subscribe("*") for _ in range(count)]
        self.received = [0] * count
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="bench-subscribers", daemon=True
        )
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        async def read(i: int) -> None:
            async for _event in self.subs[i]:
                self.received[i] += 1

        async def main() -> None:
            tasks = [asyncio.ensure_future(read(i)) for i in range(len(self.subs))]
            await asyncio.sleep(0)
            started.set()
            await asyncio.gather(*tasks)

        self._loop.run_until_complete(main())
        self._loop.close()

    def settle(self, timeout: float = 120.0) -> float:
        """Wait until every subscriber has read what is queued; returns when that was (perf_counter)."""
        deadline = time.monotonic() + timeout
        while any(sub.pending for sub in self.subs) and time.monotonic() < deadline:
            time.sleep(0.005)
        return time.perf_counter()

    def close(self) -> None:
        for sub in self.subs:
            sub.close()
        self._thread.join(30)

    @property
    def delivered(self) -> int:
        return sum(self.received)

    @property
    def dropped(self) -> int:
        return sum(sub.dropped for sub in self.subs)


class OnRuntime:
    """The same conversations as runtime sessions."""

    def __init__(
        self,
        work: Workload,
        url: str | None,
        *,
        subscribers: int = 0,
        thread_per_actor: bool = False,
        overrides: dict[str, Any] | None = None,
        transport: str = "litellm",
        tracer_provider: Any = None,
    ) -> None:
        self.work = work
        self.tracer_provider = tracer_provider  # an OpenTelemetry TracerProvider for the runtime's spans
        self.url = url
        self.subscribers = subscribers
        self.thread_per_actor = thread_per_actor
        native = transport == "openai_compat"
        self.side: Side = "threads" if thread_per_actor else "native" if native else "runtime"
        self.overrides = {"gateway.transport": transport, **(overrides or {})}
        self.rt: Any = None
        self.folder: str | None = None
        self.sids: list[str] = []
        self.readers: _Readers | None = None

    def _session(self, rt: Any, index: int) -> str:
        if self.work.mode == "mock":
            return str(
                rt.start_session(
                    model=MOCK_MODEL,
                    system_prompt=SYSTEM,
                    api_key=API_KEY,
                    config={"agent.mock_response": MOCK_REPLY},
                )
            )
        return str(
            rt.start_session(
                model=self.work.model(index),
                system_prompt=SYSTEM,
                tools=_registry(),
                api_base=self.url,
                api_key=API_KEY,
            )
        )

    async def _drive(self, sids: list[str], turns: int, latencies: list[float]) -> int:
        rt = self.rt

        async def conversation(sid: str) -> int:
            steps = 0
            for turn in range(turns):
                began = time.perf_counter()
                result = await rt.prompt(sid, _prompt(turn))
                if result.status != "ok":
                    raise RuntimeError(f"session {sid}: turn {turn} ended {result.status}: {result.error}")
                latencies.append(time.perf_counter() - began)
                steps += result.steps
            return steps

        steps = await asyncio.gather(*(conversation(sid) for sid in sids))
        return sum(steps)

    def _start(self, count: int, offset: int = 0) -> list[str]:
        sids = [self._session(self.rt, offset + i) for i in range(count)]
        for sid in sids:
            self.rt.usage(sid)  # starts the session's actors (lazy), outside the timed part
        return sids

    async def open(self, warmup: int) -> None:
        overrides = dict(self.overrides)
        if self.thread_per_actor:
            overrides["runtime.dispatcher_threads"] = ACTORS_PER_SESSION * (self.work.sessions + warmup)
        self.folder = tempfile.mkdtemp(prefix="agentcell-bench-throughput-")
        folder, tracer_provider = self.folder, self.tracer_provider
        self.rt = await asyncio.to_thread(
            lambda: runtime.Runtime(
                Config().with_overrides(overrides), sessions_dir=folder, tracer_provider=tracer_provider
            ).start()
        )
        warm = await asyncio.to_thread(self._start, min(warmup, self.work.sessions))
        await self._drive(warm, 1, [])
        if self.subscribers:
            self.readers = _Readers(self.rt, self.subscribers)

    async def slice(self) -> Run:
        """``work.turns`` turns of new sessions (started before the clock runs), all at once. The slice
        ends when every turn has ended and what they left behind is done (:meth:`_settle`), so none of it
        spills into the next slice."""
        self.sids = await asyncio.to_thread(self._start, self.work.sessions)
        readers = self.readers
        delivered_before = readers.delivered if readers is not None else 0
        dropped_before = readers.dropped if readers is not None else 0
        latencies: list[float] = []
        gc.collect()
        cpu, began = time.process_time(), time.perf_counter()
        calls = await self._drive(self.sids, self.work.turns, latencies)
        await asyncio.to_thread(self._settle)
        seconds = time.perf_counter() - began
        cpu_seconds = time.process_time() - cpu
        run = Run(self.side, self.work, seconds, cpu_seconds, latencies, calls, _rss_mb())
        if readers is not None:
            settled = await asyncio.to_thread(readers.settle)
            run.subscribers = self.subscribers
            run.deliveries = readers.delivered - delivered_before
            run.dropped = readers.dropped - dropped_before
            run.delivery_seconds = settled - began
        return run

    def _settle(self) -> None:
        """Wait for the work the slice's turns left behind them: the log writer's lines, and with tracing the
        spans of their events (made on the spans' own thread, after the handles resolve: design §7.5) and
        their hand-over to the tracer provider's processors. All of it is the slice's cost."""
        self.rt.services.writer.flush()
        tracing = self.rt._machinery.tracing
        if tracing is not None:
            tracing.flush()
            if self.tracer_provider is not None:
                self.tracer_provider.force_flush()

    async def close(self) -> None:
        if self.readers is not None:
            await asyncio.to_thread(self.readers.close)
            self.readers = None
        if self.rt is not None:
            await asyncio.to_thread(self.rt.stop)
            self.rt = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def pin_threads(cpus: set[int]) -> dict[int, set[int]]:
    """Set the CPU affinity of every thread of this process and return what each had; threads started
    later inherit it from the thread that starts them. (On Linux each thread has its own mask: setting the
    process's is not enough.)"""
    before: dict[int, set[int]] = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):  # a thread that ended since the listing
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
    return before


def unpin_threads(before: dict[int, set[int]], everywhere: set[int]) -> None:
    """Give each thread back the mask it had before :func:`pin_threads` (a runtime's placed threads stay
    placed); threads started since then get ``everywhere``."""
    for tid in map(int, os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, before.get(tid, everywhere))


def can_pin() -> bool:
    """Whether this process can compare one CPU with several: Linux, and more than one CPU allowed."""
    return (
        hasattr(os, "sched_setaffinity")
        and os.path.isdir("/proc/self/task")
        and len(os.sched_getaffinity(0)) > 1
    )


class Pinned:
    """Another contender whose slices run with the whole process pinned to ``cpus``; between its slices
    each thread has its own mask back (threads started meanwhile get ``everywhere``)."""

    def __init__(self, inner: Contender, cpus: set[int], everywhere: set[int]) -> None:
        self.inner = inner
        self.side = inner.side
        self.cpus = cpus
        self.everywhere = everywhere

    async def open(self, warmup: int) -> None:
        await self.inner.open(warmup)

    async def slice(self) -> Run:
        before = pin_threads(self.cpus)
        try:
            run = await self.inner.slice()
        finally:
            unpin_threads(before, self.everywhere)
        run.cpus = len(self.cpus)
        return run

    async def close(self) -> None:
        await self.inner.close()


class Contender(Protocol):
    """One side of a comparison: opened once, then measured slice by slice."""

    side: Side

    async def open(self, warmup: int) -> None: ...

    async def slice(self) -> Run: ...

    async def close(self) -> None: ...


async def alternate(
    first: Contender, second: Contender, rounds: int, warmup: int
) -> tuple[list[Run], list[Run]]:
    """``rounds`` slices of each side, in A B B A order; both sides stay open throughout.

    Runs ``i`` of the two lists were measured next to each other in time.
    """
    ones, twos = await alternate_all([first, second], rounds, warmup)
    return ones, twos


async def alternate_all(contenders: Sequence[Contender], rounds: int, warmup: int) -> list[list[Run]]:
    """``rounds`` slices of each contender, in A B C C B A order; all stay open throughout. Runs ``i`` of
    the lists were measured next to each other in time."""
    runs: list[list[Run]] = [[] for _ in contenders]
    opened: list[Contender] = []
    try:
        for contender in contenders:
            await contender.open(warmup)
            opened.append(contender)
        for i in range(rounds):
            order = list(zip(contenders, runs, strict=True))
            for contender, mine in order if i % 2 == 0 else order[::-1]:
                run = await asyncio.wait_for(contender.slice(), SLICE_TIMEOUT)
                _progress(run)
                mine.append(run)
    finally:
        for contender in reversed(opened):
            await contender.close()
    return runs


# -- rows, plans, main --------------------------------------------------------------------------------------


def _row(runs: list[Run], baseline: list[Run] | None) -> dict[str, Any]:
    first = runs[0]
    rates = [r.turns_per_s for r in runs]
    latencies = [x for r in runs for x in r.latencies]
    row: dict[str, Any] = {
        "bench": "fanout" if first.subscribers else "turns",
        "mode": first.work.mode,
        "side": first.side,
        "sessions": first.work.sessions,
        "turns_per_slice": first.work.turns,
        "slices": len(runs),
        "turns_per_s": round(statistics.median(rates), 2),
        "calls_per_s": round(statistics.median(r.calls / r.seconds for r in runs), 2),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 1),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 1),
        "cpu_ms_per_turn": round(statistics.median(r.cpu_seconds / r.turns for r in runs) * 1000, 2),
        "rss_mb": round(max(r.rss_mb for r in runs), 1),
    }
    retries = sum(r.extra.get("retries", 0) for r in runs)
    if retries:
        row["retries"] = retries
    if baseline:
        ratios = [r.turns_per_s / b.turns_per_s for r, b in zip(runs, baseline)]
        row["vs_bare"] = round(statistics.median(ratios), 3)
        row["vs_bare_spread"] = _spread(ratios)
        cpu = [(r.cpu_seconds / r.turns) / (b.cpu_seconds / b.turns) for r, b in zip(runs, baseline)]
        row["cpu_vs_bare"] = round(statistics.median(cpu), 3)
    if first.subscribers:
        row["subscribers"] = first.subscribers
        row["deliveries"] = sum(r.deliveries for r in runs)
        row["deliveries_per_s"] = round(statistics.median(r.deliveries / r.delivery_seconds for r in runs))
        row["events_per_turn"] = round(
            statistics.median(r.deliveries / r.subscribers / r.turns for r in runs), 1
        )
        row["dropped"] = sum(r.dropped for r in runs)
    return row


@dataclass(frozen=True)
class Plan:
    warmup: int
    # (sessions, turns of each session per slice, slices of each side)
    http: tuple[tuple[int, int, int], ...]
    mock: tuple[tuple[int, int, int], ...]
    threads: tuple[tuple[int, int, int], ...]  # mock workloads compared on one thread per actor
    one_core: tuple[int, int, int]  # the mock workload compared pinned to one CPU and free
    fanout: tuple[int, int, int]  # the mock workload the fan-out runs use
    subscribers: tuple[int, ...]
    unplaced: tuple[tuple[str, int, int, int], ...]  # (mode, sessions, turns, slices) with runtime.cpu = off


QUICK = Plan(
    warmup=5,
    http=((10, 2, 2),),
    mock=((10, 4, 2), (100, 1, 2)),
    threads=((10, 4, 2),),
    one_core=(100, 1, 2),
    fanout=(10, 2, 2),
    subscribers=(1, 100, 1_000),
    unplaced=(("mock", 100, 1, 2),),
)
FULL = Plan(
    warmup=10,
    http=((10, 3, 6), (100, 1, 6), (1_000, 1, 2)),
    mock=((10, 5, 8), (100, 1, 16), (1_000, 1, 4)),
    threads=((10, 5, 4), (100, 1, 4), (1_000, 1, 2)),
    one_core=(100, 1, 8),
    fanout=(100, 2, 4),
    subscribers=(1, 100, 1_000),
    unplaced=(("http", 10, 3, 6), ("mock", 100, 1, 16)),
)


def _progress(run: Run) -> None:
    w = run.work
    subs = f" subscribers={run.subscribers:<5}" if run.subscribers else ""
    subs += f" cpus={run.cpus}" if run.cpus else ""
    print(
        f"  {w.mode:4} {run.side:7} sessions={w.sessions:<5} turns={run.turns:<5}{subs}"
        f" {run.turns_per_s:8.1f} turns/s  p50 {_percentile(run.latencies, 0.5) * 1000:7.0f} ms"
        f"  cpu {run.cpu_seconds / run.turns * 1000:6.1f} ms/turn",
        flush=True,
    )


_COMMON = (
    "mode",
    "side",
    "sessions",
    "turns_per_slice",
    "slices",
    "turns_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_ms_per_turn",
)
_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "turns": (
        "Turn throughput, runtime (litellm transport; native: openai_compat) against bare litellm",
        (*_COMMON, "calls_per_s", "vs_bare", "vs_bare_spread", "cpu_vs_bare"),
    ),
    "thread_per_actor": (
        "Pooled actors against one thread per actor (ThreadingActor's thread count)",
        (*_COMMON, "rss_mb", "dispatcher_threads", "pooled_vs_threads"),
    ),
    "one_core": (
        "Each side pinned to one CPU against itself free to use every CPU",
        (*_COMMON, "cpus", "vs_all_cpus"),
    ),
    "one_core_vs_bare": (
        "Runtime against bare litellm, both pinned to one CPU",
        (*_COMMON, "cpus", "vs_bare", "vs_bare_spread"),
    ),
    "turns_cpu_off": (
        "Turn throughput with the runtime's threads left to the OS (runtime.cpu = off) against bare litellm",
        (*_COMMON, "vs_bare", "vs_bare_spread"),
    ),
    "fanout": (
        "Event fan-out to subscribers of every session, during the turns",
        (
            "sessions",
            "subscribers",
            "turns_per_s",
            "vs_no_subscribers",
            "events_per_turn",
            "deliveries_per_s",
            "dropped",
            "p50_ms",
        ),
    ),
}


def _one_core_rows(
    compare: Callable[[Contender, Contender, int], tuple[list[Run], list[Run]]],
    work: Workload,
    rounds: int,
    tools: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each side free against itself pinned to one CPU, then the two sides both pinned."""
    everywhere = os.sched_getaffinity(0)
    one = {min(everywhere)}
    rows: list[dict[str, Any]] = []
    for make in (lambda: Bare(work, None, tools), lambda: OnRuntime(work, None)):
        free, pinned = compare(make(), Pinned(make(), one, everywhere), rounds)
        free_row = {**_row(free, None), "bench": "one_core", "cpus": len(everywhere)}
        pinned_row = {**_row(pinned, None), "bench": "one_core", "cpus": 1}
        pinned_row["vs_all_cpus"] = round(
            statistics.median(p.turns_per_s / f.turns_per_s for p, f in zip(pinned, free)), 3
        )
        rows += [free_row, pinned_row]
    bare, ours = compare(
        Pinned(Bare(work, None, tools), one, everywhere),
        Pinned(OnRuntime(work, None), one, everywhere),
        rounds,
    )
    rows.append({**_row(bare, None), "bench": "one_core_vs_bare", "cpus": 1})
    rows.append({**_row(ours, bare), "bench": "one_core_vs_bare", "cpus": 1})
    return rows


def _print_tables(rows: list[dict[str, Any]]) -> None:
    for bench, (title, columns) in _TABLES.items():
        selected = [{c: r.get(c) for c in columns} for r in rows if r["bench"] == bench]
        if selected:
            print(f"\n{title}\n{format_table(selected)}")


def _close(loop: asyncio.AbstractEventLoop) -> None:
    """Close the driver loop cleanly, also after a failed run: cancel what is left, then let litellm's
    worker threads (anyio's, tied to the loop's tasks) and the default executor finish."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, two slices a side (about 1 minute)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="slices of each side, for every workload")
    parser.add_argument(
        "--modes", default="http,mock", help="comma-separated workloads to run (default http,mock)"
    )
    parser.add_argument("--no-threads", action="store_true", help="skip the thread-per-actor comparison")
    parser.add_argument("--no-one-core", action="store_true", help="skip the pinned-to-one-CPU comparison")
    parser.add_argument("--no-fanout", action="store_true", help="skip the subscriber fan-out runs")
    parser.add_argument("--no-unplaced", action="store_true", help="skip the runs with runtime.cpu = off")
    parser.add_argument("--no-native", action="store_true", help="skip the native transport's side (http)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}

    from runtime.gateway import load_litellm

    load_litellm()
    tools = _registry().schemas()
    loop = asyncio.new_event_loop()  # the driver loop, kept for every run (litellm caches clients per loop)

    def compare(first: Contender, second: Contender, rounds: int) -> tuple[list[Run], list[Run]]:
        return loop.run_until_complete(alternate(first, second, args.rounds or rounds, plan.warmup))

    def compare_all(contenders: list[Contender], rounds: int) -> list[list[Run]]:
        return loop.run_until_complete(alternate_all(contenders, args.rounds or rounds, plan.warmup))

    rows: list[dict[str, Any]] = []
    unplaced = [p for p in plan.unplaced if p[0] in modes] if not args.no_unplaced else []
    if unplaced and not auto_candidates():
        print(
            "runs with runtime.cpu = off skipped: the default places nothing here either (one CPU, or no affinity)"
        )
        unplaced = []
    provider = ProviderProcess(max(s for s, _, _ in plan.http)) if "http" in modes else None
    try:
        for mode, sizes in (("http", plan.http), ("mock", plan.mock)):
            if mode not in modes:
                continue
            url = provider.url if provider is not None and mode == "http" else None
            for sessions, turns, rounds in sizes:
                work = Workload(mode, sessions, turns)  # type: ignore[arg-type]
                contenders: list[Contender] = [Bare(work, url, tools), OnRuntime(work, url)]
                if mode == "http" and not args.no_native:
                    contenders.append(OnRuntime(work, url, transport="openai_compat"))
                bare, *ours = compare_all(contenders, rounds)
                rows.append(_row(bare, None))
                rows.extend(_row(runs, bare) for runs in ours)
        if not args.no_threads:
            for sessions, turns, rounds in plan.threads:
                work = Workload("mock", sessions, turns)
                pooled, threaded = compare(
                    OnRuntime(work, None), OnRuntime(work, None, thread_per_actor=True), rounds
                )
                row = _row(threaded, None)
                row["bench"] = "thread_per_actor"
                row["dispatcher_threads"] = ACTORS_PER_SESSION * (sessions + plan.warmup)
                row["pooled_vs_threads"] = round(
                    statistics.median(p.turns_per_s / t.turns_per_s for p, t in zip(pooled, threaded)), 3
                )
                pooled_row = _row(pooled, None)
                pooled_row["bench"] = "thread_per_actor"
                rows.extend([pooled_row, row])
        if not args.no_one_core:
            if can_pin():
                rows.extend(
                    _one_core_rows(compare, Workload("mock", *plan.one_core[:2]), plan.one_core[2], tools)
                )
            else:
                print("one-core comparison skipped: needs Linux and a process allowed more than one CPU")
        for mode, sessions, turns, rounds in unplaced:
            url = provider.url if provider is not None and mode == "http" else None
            work = Workload(mode, sessions, turns)  # type: ignore[arg-type]
            bare, ours = compare(
                Bare(work, url, tools), OnRuntime(work, url, overrides={"runtime.cpu": "off"}), rounds
            )
            rows.append({**_row(bare, None), "bench": "turns_cpu_off"})
            rows.append({**_row(ours, bare), "bench": "turns_cpu_off"})
        if not args.no_fanout:
            sessions, turns, rounds = plan.fanout
            work = Workload("mock", sessions, turns)
            for count in plan.subscribers:
                quiet, loud = compare(OnRuntime(work, None), OnRuntime(work, None, subscribers=count), rounds)
                if count == plan.subscribers[0]:
                    rows.append({**_row(quiet, None), "bench": "fanout", "subscribers": 0})
                row = _row(loud, None)
                row["vs_no_subscribers"] = round(
                    statistics.median(a.turns_per_s / b.turns_per_s for a, b in zip(loud, quiet)), 3
                )
                rows.append(row)
    finally:
        _close(loop)
        if provider is not None:
            provider.close()

    ratios = {
        f"{r['mode']}_{r['sessions']}": r["vs_bare"]
        for r in rows
        if r["bench"] == "turns" and r["side"] == "runtime" and "vs_bare" in r
    }
    native = {
        f"{r['mode']}_{r['sessions']}": {"turns_vs_bare": r["vs_bare"], "cpu_vs_bare": r["cpu_vs_bare"]}
        for r in rows
        if r["bench"] == "turns" and r["side"] == "native"
    }
    met = {key: ratio >= TARGET_RATIO for key, ratio in ratios.items()}
    meta = {
        "quick": args.quick,
        "method": (
            "both sides open at once, taking turns in slices (A B B A); ratio: median over adjacent slices,"
            " spread: their lower and upper quartile"
        ),
        "warmup_sessions": plan.warmup,
        "target_ratio": TARGET_RATIO,
        "runtime_vs_bare": ratios,
        "native_vs_bare": native,
        "met": met,
        "turn": {
            "http": "prompt -> tool call (add) -> tool result -> answer: 2 streamed calls over HTTP (runtime: on"
            " the litellm transport; native: on openai_compat)",
            "mock": "prompt -> answer: 1 streamed litellm mock_response call, no network",
        },
        "config": (
            "defaults: fsync at turn end, transcripts on, 2 dispatcher threads, runtime.cpu = auto"
            + (" (the runtime's threads on one CPU)" if auto_candidates() else " (places nothing here)")
        ),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    print()
    write_results(NAME, rows, meta, table=False)
    _print_tables(rows)
    for key, ok in met.items():
        print(
            f"runtime / bare turns/s, {key}: {ratios[key]:.3f} (target >= {TARGET_RATIO}): {'met' if ok else 'NOT met'}"
        )
    for key, figures in native.items():
        print(
            f"native transport / bare litellm, {key}: turns/s {figures['turns_vs_bare']:.3f},"
            f" CPU per turn {figures['cpu_vs_bare']:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
