"""Turn throughput: the runtime against a bare asyncio loop making the same litellm calls (SPEC 8).

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
- ``runtime``: a default :class:`runtime.Runtime` (fsync at turn end, transcripts on) with N sessions.
  Driver coroutines on one asyncio loop await each prompt's handle.
- ``threads``: the same runtime with one dispatcher thread per session actor (5 per session). This is the
  thread count and scheduling of pykka's ThreadingActor. The session actors rely on the pooled actors'
  non-blocking replies, so they cannot run on ``ThreadingActor`` itself.

Rounds alternate between the bare and runtime sides, so both sides of a round see the same machine load.
The ratio is the median of the per-round ratios of turns/s (target: >= 0.90).

Fan-out: the runtime run is repeated with 1, 100 and 1,000 subscribers to every session. The subscribers
are async iterators on a reader thread's event loop. It reports deliveries/s and the turn rate against
the run without subscribers.

Run: ``python -m benchmarks.bench_throughput`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import multiprocessing.connection
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psutil

import runtime  # first: the offline litellm/tiktoken environment before either loads
from benchmarks._common import format_table, write_results
from runtime.config import Config
from runtime.tools.registry import ToolRegistry

NAME = "throughput"
TARGET_RATIO = 0.90
API_KEY = "sk-bench"
SYSTEM = "You are a careful calculator. Use the add tool for every sum."
MOCK_MODEL = "openai/gpt-4o-mini"
MOCK_REPLY = "Two and three make five; the sum is checked and correct."
ANSWER = "The tool says 2 + 3 = 5, so the answer is five."
ROUND_TIMEOUT = 1_800.0
MAX_ATTEMPTS = 3  # the runtime's default (retry.max_attempts)
ACTORS_PER_SESSION = 5

Mode = Literal["http", "mock"]
Side = Literal["bare", "runtime", "threads"]


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


def _serve(conn: multiprocessing.connection.Connection, sessions: int) -> None:
    """The provider process: one looping two-step script (tool call, answer) per session."""
    from runtime.provider import LocalProvider, ToolCallSpec, Turn

    provider = LocalProvider(context_window=1_000_000)
    steps = [
        Turn(text="Let me add.", tool_calls=(ToolCallSpec(name="add", arguments='{"a": 2, "b": 3}'),)),
        Turn(text=ANSWER),
    ]
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

    def __init__(self, work: Workload, url: str | None, tools: list[dict[str, Any]]) -> None:
        self.work = work
        self.url = url
        self.tools = tools if work.mode == "http" else []
        self.retries = 0

    def _kwargs(self, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        # The arguments runtime.llm.build_call_kwargs gives the same request.
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

    async def _complete(self, litellm: Any, index: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One call, read to its end. A connection error is retried at once, up to ``MAX_ATTEMPTS`` in
        all, as the runtime's gateway retries it (e.g. a kept-alive connection the server has closed)."""
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

    async def conversation(self, litellm: Any, index: int, turns: int, latencies: list[float]) -> int:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        calls = 0
        for turn in range(turns):
            began = time.perf_counter()
            messages.append({"role": "user", "content": _prompt(turn)})
            while True:
                reply = await self._complete(litellm, index, messages)
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

    async def run(self, warmup: int) -> Run:
        from runtime.llm import load_litellm

        litellm = load_litellm()
        await asyncio.gather(
            *(self.conversation(litellm, i, 1, []) for i in range(min(warmup, self.work.sessions)))
        )
        latencies: list[float] = []
        gc.collect()
        cpu, began = time.process_time(), time.perf_counter()
        calls = await asyncio.gather(
            *(self.conversation(litellm, i, self.work.turns, latencies) for i in range(self.work.sessions))
        )
        seconds = time.perf_counter() - began
        run = Run("bare", self.work, seconds, time.process_time() - cpu, latencies, sum(calls), _rss_mb())
        run.extra["retries"] = self.retries
        return run


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
    ) -> None:
        self.work = work
        self.url = url
        self.subscribers = subscribers
        self.thread_per_actor = thread_per_actor
        self.overrides = dict(overrides or {})

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

    async def _drive(self, rt: Any, sids: list[str], turns: int, latencies: list[float]) -> int:
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

    async def run(self, warmup: int) -> Run:
        overrides = dict(self.overrides)
        if self.thread_per_actor:
            overrides["runtime.dispatcher_threads"] = ACTORS_PER_SESSION * (self.work.sessions + warmup)
        folder = tempfile.mkdtemp(prefix="agentcell-bench-throughput-")
        side: Side = "threads" if self.thread_per_actor else "runtime"
        try:
            rt = await asyncio.to_thread(
                lambda: runtime.Runtime(Config().with_overrides(overrides), sessions_dir=folder).start()
            )
            try:
                return await self._measure(rt, side, warmup)
            finally:
                await asyncio.to_thread(rt.stop)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def _measure(self, rt: Any, side: Side, warmup: int) -> Run:
        def start(count: int, offset: int = 0) -> list[str]:
            sids = [self._session(rt, offset + i) for i in range(count)]
            for sid in sids:
                rt.usage(sid)  # starts the session's actors (lazy), outside the timed part
            return sids

        warm = await asyncio.to_thread(start, min(warmup, self.work.sessions))
        await self._drive(rt, warm, 1, [])
        sids = await asyncio.to_thread(start, self.work.sessions)
        readers = _Readers(rt, self.subscribers) if self.subscribers else None
        latencies: list[float] = []
        gc.collect()
        cpu, began = time.process_time(), time.perf_counter()
        calls = await self._drive(rt, sids, self.work.turns, latencies)
        seconds = time.perf_counter() - began
        cpu_seconds = time.process_time() - cpu
        run = Run(side, self.work, seconds, cpu_seconds, latencies, calls, _rss_mb())
        if readers is not None:
            settled = await asyncio.to_thread(readers.settle)
            run.subscribers = self.subscribers
            run.deliveries = readers.delivered
            run.dropped = readers.dropped
            run.delivery_seconds = settled - began
            await asyncio.to_thread(readers.close)
        return run


# -- rounds, rows, main ------------------------------------------------------------------------------------


def _row(runs: list[Run], baseline: list[Run] | None) -> dict[str, Any]:
    first = runs[0]
    rates = [r.turns_per_s for r in runs]
    latencies = [x for r in runs for x in r.latencies]
    row: dict[str, Any] = {
        "bench": "fanout" if first.subscribers else "turns",
        "mode": first.work.mode,
        "side": first.side,
        "sessions": first.work.sessions,
        "turns_each": first.work.turns,
        "rounds": len(runs),
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
    rounds: int
    warmup: int
    http: tuple[tuple[int, int], ...]  # (sessions, turns each)
    mock: tuple[tuple[int, int], ...]
    threads: tuple[tuple[int, int], ...]  # mock workloads compared on one thread per actor
    fanout: tuple[int, int]  # the mock workload the fan-out runs use
    subscribers: tuple[int, ...]


QUICK = Plan(
    rounds=1,
    warmup=5,
    http=((10, 2), (100, 1)),
    mock=((10, 4), (100, 1)),
    threads=((100, 1),),
    fanout=(10, 2),
    subscribers=(1, 100, 1_000),
)
FULL = Plan(
    rounds=2,
    warmup=10,
    http=((10, 6), (100, 2), (1_000, 1)),
    mock=((10, 10), (100, 3), (1_000, 1)),
    threads=((10, 10), (100, 3), (1_000, 1)),
    fanout=(100, 2),
    subscribers=(1, 100, 1_000),
)


def _progress(run: Run) -> None:
    w = run.work
    subs = f" subscribers={run.subscribers:<5}" if run.subscribers else ""
    print(
        f"  {w.mode:4} {run.side:7} sessions={w.sessions:<5} turns={run.turns:<5}{subs}"
        f" {run.turns_per_s:8.1f} turns/s  p50 {_percentile(run.latencies, 0.5) * 1000:7.0f} ms"
        f"  cpu {run.cpu_seconds / run.turns * 1000:6.1f} ms/turn",
        flush=True,
    )


_COMMON = ("mode", "side", "sessions", "turns_each", "turns_per_s", "p50_ms", "p99_ms", "cpu_ms_per_turn")
_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "turns": ("Turn throughput, runtime against bare litellm", (*_COMMON, "calls_per_s", "vs_bare")),
    "thread_per_actor": (
        "Pooled actors against one thread per actor (ThreadingActor's thread count)",
        (*_COMMON, "rss_mb", "dispatcher_threads", "pooled_vs_threads"),
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
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (about 30 s)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds per workload")
    parser.add_argument(
        "--modes", default="http,mock", help="comma-separated workloads to run (default http,mock)"
    )
    parser.add_argument("--no-threads", action="store_true", help="skip the thread-per-actor comparison")
    parser.add_argument("--no-fanout", action="store_true", help="skip the subscriber fan-out runs")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    rounds = args.rounds or plan.rounds
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}

    from runtime.llm import load_litellm

    load_litellm()
    tools = _registry().schemas()
    loop = asyncio.new_event_loop()  # the driver loop, kept for every run (litellm caches clients per loop)

    def run(coro: Any) -> Run:
        result: Run = loop.run_until_complete(asyncio.wait_for(coro, ROUND_TIMEOUT))
        _progress(result)
        return result

    rows: list[dict[str, Any]] = []
    provider = ProviderProcess(max(s for s, _ in plan.http)) if "http" in modes else None
    try:
        for mode, sizes in (("http", plan.http), ("mock", plan.mock)):
            if mode not in modes:
                continue
            url = provider.url if provider is not None and mode == "http" else None
            for sessions, turns in sizes:
                work = Workload(mode, sessions, turns)  # type: ignore[arg-type]
                bare: list[Run] = []
                ours: list[Run] = []
                for _ in range(rounds):
                    bare.append(run(Bare(work, url, tools).run(plan.warmup)))
                    ours.append(run(OnRuntime(work, url).run(plan.warmup)))
                rows.append(_row(bare, None))
                rows.append(_row(ours, bare))
        if not args.no_threads:
            for sessions, turns in plan.threads:
                work = Workload("mock", sessions, turns)
                pooled = [run(OnRuntime(work, None).run(plan.warmup)) for _ in range(rounds)]
                threaded = [
                    run(OnRuntime(work, None, thread_per_actor=True).run(plan.warmup)) for _ in range(rounds)
                ]
                row = _row(threaded, None)
                row["bench"] = "thread_per_actor"
                row["dispatcher_threads"] = ACTORS_PER_SESSION * (sessions + plan.warmup)
                row["pooled_vs_threads"] = round(
                    statistics.median(p.turns_per_s / t.turns_per_s for p, t in zip(pooled, threaded)), 3
                )
                pooled_row = _row(pooled, None)
                pooled_row["bench"] = "thread_per_actor"
                rows.extend([pooled_row, row])
        if not args.no_fanout:
            sessions, turns = plan.fanout
            work = Workload("mock", sessions, turns)
            quiet = [run(OnRuntime(work, None).run(plan.warmup)) for _ in range(rounds)]
            rows.append({**_row(quiet, None), "bench": "fanout", "subscribers": 0})
            for count in plan.subscribers:
                loud = [run(OnRuntime(work, None, subscribers=count).run(plan.warmup)) for _ in range(rounds)]
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
        f"{r['mode']}_{r['sessions']}": r["vs_bare"] for r in rows if r["bench"] == "turns" and "vs_bare" in r
    }
    met = {key: ratio >= TARGET_RATIO for key, ratio in ratios.items()}
    meta = {
        "quick": args.quick,
        "rounds": rounds,
        "warmup_sessions": plan.warmup,
        "target_ratio": TARGET_RATIO,
        "runtime_vs_bare": ratios,
        "met": met,
        "turn": {
            "http": "prompt -> tool call (add) -> tool result -> answer: 2 streamed calls over HTTP",
            "mock": "prompt -> answer: 1 streamed litellm mock_response call, no network",
        },
        "config": "defaults: fsync at turn end, transcripts on, 2 dispatcher threads",
    }
    print()
    write_results(NAME, rows, meta, table=False)
    _print_tables(rows)
    for key, ok in met.items():
        print(
            f"runtime / bare turns/s, {key}: {ratios[key]:.3f} (target >= {TARGET_RATIO}): {'met' if ok else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
