"""Scale-out (design §8, 10): turns/s of a cluster runtime with 1 and 2 shards against one plain ``Runtime``,
the latency the extra hop adds to a turn, and how fast streamed events reach subscribers through the cluster.

Sides, all driven from this process (which is also the cluster's front):

- ``runtime``: a default :class:`runtime.Runtime` in this process.
- ``cluster-1``, ``cluster-2``: a :class:`runtime.cluster.ClusterRuntime` with 1 or 2 shards on a local Ray
  cluster, each shard a process of its own hosting a default ``Runtime``.

The workload is litellm's in-process mock (``agent.mock_response``): a turn is one streamed call and
costs 10-13 ms of CPU in litellm alone, so a turn's rate is bound by the CPU of the process that hosts
the session. One process runs Python on one core at a time; two shards run on two.

Every side is started and warmed once and kept open; then they take turns. A slice is ``sessions`` new
sessions (started before the clock runs), each with a callback subscription of its own to all its events
(every turn's ``agent_end`` must reach it: checked), each in a closed loop of turns; after a second's warm-up, the
turns answered in a window of ``window`` seconds give its rate (steady state: see ``_drive`` for why not a
fixed number of turns). The sides alternate slices (A B C C B A),
and each cluster side's rate is compared with the ``runtime`` slice next to it in time. The ratio reported
is the median of those pairwise ratios (target for ``cluster-2``: >= 1.7), as in ``bench_throughput``.
The table also gives the front's own CPU per turn (this process: submitting turns, their answers) and the
shards' (their processes, read with psutil).

Latency: one session, one turn at a time, ``latency_turns`` turns on each side; the extra hop is the
median turn of ``cluster-1`` minus that of ``runtime``.

Streaming (the subscribed run): ``stream_sessions`` sessions (1,000) mid-turn at once on ``runtime`` and on
``cluster-2``, against the local provider in a process of its own (it answers after 2 s, then streams ~200
chunks an answer), subscribed three ways in turn (``--modes``): a callback subscription per session
(``callback``), an async iterator per session on an event loop of its own as the SSE server reads them
(``async``), one callback subscription to every session as a dashboard or a metrics collector (``all``).
Delivery is the delay from each ``text_delta``'s creation (its ``ts``, stamped by the bus of the process
that runs the session) to its subscriber; every delta must arrive (each session's deltas make its answer:
checked). The CPU per turn is this process's (for ``runtime`` everything; for ``cluster-2`` the front alone).
The sessions are stopped after each run (a front hosts none). The full garbage collections of this process
during a run are counted and timed: one stops the front for 0.1-0.5 s while the shards go on streaming, which
a plain runtime's subscribers never see (its publishers stop too). ``--hops`` cuts each delay of the cluster
at the front: shard to the front's read of the batch, decoding and queueing, queue to subscriber.
Target: delivery p99 <= 50 ms.

Run: ``python -m benchmarks.bench_cluster`` (``--quick`` for a short run). Needs the ray extra.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

import runtime  # first: the offline litellm/tiktoken environment before either loads
from benchmarks._common import format_table, write_results
from runtime.config import Config

NAME = "cluster"
TARGET = 1.7
DELIVERY_TARGET_MS = 50.0
STREAM_WORDS = 200
STREAM_TEXT = " ".join(f"tok{n:03d}" for n in range(STREAM_WORDS))
STREAM_LATENCY = 2.0
MOCK_MODEL = "openai/gpt-4o-mini"
MOCK_REPLY = "Two and three make five; the sum is checked and correct."
SYSTEM = "You are a careful calculator."


@dataclass
class Slice:
    side: str
    turns: int
    seconds: float
    front_cpu: float
    shard_cpu: float

    @property
    def rate(self) -> float:
        return self.turns / self.seconds


@dataclass
class Side:
    """One runtime under test: a plain ``Runtime`` (``shards`` 0) or a cluster of ``shards``."""

    name: str
    shards: int
    cpu: int | None = None  # runtime.cpu for its shards (None: the default, "auto")
    rt: Any = None
    folder: str = ""
    slices: list[Slice] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def open(self) -> None:
        self.folder = tempfile.mkdtemp(prefix=f"agentcell-bench-{self.name}-")
        if self.shards == 0:
            self.rt = runtime.Runtime(Config(), sessions_dir=self.folder).start()
        else:
            from runtime.cluster import ClusterRuntime

            config = Config() if self.cpu is None else Config().with_overrides({"runtime.cpu": self.cpu})
            self.rt = ClusterRuntime(config, sessions_dir=self.folder, shards=self.shards).start()

    def shard_processes(self) -> list[psutil.Process]:
        if self.shards == 0:
            return []
        return [psutil.Process(self.rt.shard_info(name).pid) for name in self.rt.shards]

    def start_streaming(self, count: int, url: str) -> list[str]:
        sids = [
            self.rt.start_session(model="openai/streamed", api_base=url, api_key="sk-bench")
            for _ in range(count)
        ]
        for sid in sids:
            self.rt.usage(sid)
        return sids

    def start_sessions(self, count: int) -> list[str]:
        sids = [
            self.rt.start_session(
                model=MOCK_MODEL,
                system_prompt=SYSTEM,
                api_key="sk-bench",
                config={"agent.mock_response": MOCK_REPLY},
            )
            for _ in range(count)
        ]
        for sid in sids:
            self.rt.usage(sid)  # starts the session's actors (they start on first use), off the clock
        return sids

    def close(self) -> None:
        if self.rt is not None:
            self.rt.stop()
            self.rt = None
        shutil.rmtree(self.folder, ignore_errors=True)


async def _drive(side: Side, sids: list[str], warmup: float, window: float) -> Slice:
    """Every session in a closed loop (a prompt, its answer, the next prompt) for ``warmup + window``
    seconds; the turns answered within the window, and the CPU spent in it, make the slice.

    A steady-state window, not "N turns each then stop": sessions are placed on shards by hash, so one
    shard usually holds more of them than the other (by 11% on average with 48 sessions on 2 shards), and a
    fixed amount of work per session would leave the other shard idle for the slice's tail.
    """
    shards = side.shard_processes()
    me = psutil.Process()
    loop = asyncio.get_running_loop()
    done: list[float] = []
    stop = False

    async def conversation(sid: str) -> None:
        turn = 0
        while not stop:
            result = await side.rt.prompt(sid, f"What is {turn} + 3?")
            if result.status != "ok":
                raise RuntimeError(f"session {sid}: turn {turn} ended {result.status}: {result.error}")
            done.append(loop.time())
            turn += 1

    def cpu() -> tuple[float, float]:
        front = me.cpu_times()
        shard = sum(t.user + t.system for t in (p.cpu_times() for p in shards))
        return front.user + front.system, shard

    ended_seen = [0]
    lock = threading.Lock()

    def count(event: Any) -> None:
        if event.type == "agent_end":
            with lock:
                ended_seen[0] += 1

    subs = [side.rt.subscribe(sid, callback=count) for sid in sids]
    tasks = [asyncio.ensure_future(conversation(sid)) for sid in sids]
    try:
        await asyncio.sleep(warmup)
        began, cpu0 = loop.time(), cpu()
        await asyncio.sleep(window)
        ended, cpu1 = loop.time(), cpu()
    finally:
        stop = True
        await asyncio.gather(*tasks)
    for sub in subs:
        sub.flush(timeout=30)
        sub.close()
    if ended_seen[0] != len(done):
        raise RuntimeError(f"{side.name}: {len(done)} turns answered, {ended_seen[0]} agent_end delivered")
    turns = sum(1 for t in done if began <= t < ended)
    return Slice(side.name, turns, ended - began, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])


def run_slice(side: Side, sessions: int, warmup: float, window: float) -> Slice:
    sids = side.start_sessions(sessions)
    done = asyncio.run(_drive(side, sids, warmup, window))
    side.slices.append(done)
    return done


def measure_latency(side: Side, turns: int) -> None:
    (sid,) = side.start_sessions(1)
    for turn in range(turns + 3):
        began = time.perf_counter()
        result = side.rt.prompt(sid, f"What is {turn} + 3?").result(timeout=60)
        elapsed = time.perf_counter() - began
        if result.status != "ok":
            raise RuntimeError(f"{side.name}: a latency turn ended {result.status}: {result.error}")
        if turn >= 3:  # the first turns warm the session
            side.latencies.append(elapsed)


def _serve_stream(conn: Any) -> None:
    """The provider process of the streaming run: every answer after 2 s, in ~200 chunks."""
    from runtime.provider import LocalProvider
    from runtime.provider.script import Turn

    provider = LocalProvider(context_window=1_000_000, chunk_chars=len(STREAM_TEXT) // STREAM_WORDS + 1)
    provider.add_script("streamed", [Turn(text=STREAM_TEXT, latency=STREAM_LATENCY)], loop=True)
    provider.start()
    conn.send(provider.url)
    conn.recv()
    provider.stop()


MODES = ("callback", "async", "all")
"""How the streaming run subscribes: a callback subscription per session (the bus's own idiom, each with a
thread of its own on one ``Runtime``), an async iterator per session on one event loop (the SSE server's
way), or one callback subscription to every session (a dashboard, a metrics collector)."""


@dataclass
class Streamed:
    side: str
    mode: str
    sessions: int
    delays: list[float]
    seconds: float
    front_cpu: float
    shard_cpu: float
    delivered_chars: int
    lagged: int
    hops: dict[str, list[float]] | None = None
    collections: list[tuple[float, float]] = field(default_factory=list)  # the front's gen-2: (at, seconds)


class _Hops:
    """Per-hop timestamps at the front (``--hops``): when ``Inbound.push`` took each event's batch off the
    connection and when it had queued it for its subscribers, beside the event's creation (its ``ts``, on
    the shard) and its subscriber's callback. Kept in lists of floats and strings, which the garbage
    collector does not track (tuples per event would set it going, and stall the front they measure)."""

    def __init__(self) -> None:
        self.pushed: tuple[list[str], list[int], list[float], list[float]] = ([], [], [], [])
        self._original: Any = None

    def install(self) -> None:
        from runtime.cluster._events import Inbound

        original = self._original = Inbound.push
        sids, seqs, read, queued = self.pushed

        def push(inbound: Any, data: bytes) -> bool:
            began = time.time()
            fresh = bool(original(inbound, data))
            if fresh:
                from runtime.cluster._stream import decode_push

                now = time.time()
                for event in decode_push(data).events:
                    sids.append(event.session_id)
                    seqs.append(event.seq)
                    read.append(began)
                    queued.append(now)
            return fresh

        Inbound.push = push  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._original is not None:
            from runtime.cluster._events import Inbound

            Inbound.push = self._original  # type: ignore[method-assign]
            self._original = None

    def split(self, got: tuple[list[str], list[int], list[float], list[float]]) -> dict[str, list[float]]:
        """Each delivered delta's delay cut at the front's read and queueing: three lists of seconds."""
        sids, seqs, read, queued = self.pushed
        at = {(sid, seq): i for i, (sid, seq) in enumerate(zip(sids, seqs))}
        hops: dict[str, list[float]] = {
            "shard_to_front_read": [],
            "front_decode_queue": [],
            "to_subscriber": [],
        }
        for sid, seq, ts, now in zip(*got):
            i = at.get((sid, seq))
            if i is None:
                continue
            hops["shard_to_front_read"].append(read[i] - ts)
            hops["front_decode_queue"].append(queued[i] - read[i])
            hops["to_subscriber"].append(now - queued[i])
        return hops


def measure_streaming(
    side: Side, sessions: int, url: str, mode: str = "callback", hops: bool = False
) -> Streamed:
    """Every session mid-turn at once, subscribed as ``mode`` says; the delay of every delta."""
    import gc

    sids = side.start_streaming(sessions, url)
    shards = side.shard_processes()
    me = psutil.Process()
    delays: list[float] = []
    got: tuple[list[str], list[int], list[float], list[float]] = ([], [], [], [])
    chars = [0]
    lagged = [0]
    lock = threading.Lock()

    def on_event(event: Any) -> None:
        if event.type == "text_delta":
            now = time.time()
            with lock:
                delays.append(now - event.ts)
                chars[0] += len(event.delta)
                if hops:
                    got[0].append(event.session_id)
                    got[1].append(event.seq)
                    got[2].append(event.ts)
                    got[3].append(now)
        elif event.type == "subscriber_lagged":
            with lock:
                lagged[0] += event.dropped

    probe = _Hops() if hops and side.shards else None
    if probe is not None:
        probe.install()
    collections: list[tuple[float, float]] = []
    began_gc = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                began_gc[0] = time.time()
            else:
                collections.append((began_gc[0], time.time() - began_gc[0]))

    loop: asyncio.AbstractEventLoop | None = None
    readers: list[Any] = []
    if mode == "callback":
        subs = [side.rt.subscribe(sid, callback=on_event) for sid in sids]
    elif mode == "all":
        subs = [side.rt.subscribe("*", callback=on_event)]
    else:  # "async": an event loop of its own, as the HTTP server's, one reader task a session
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="bench-sse-loop", daemon=True).start()
        subs = [side.rt.subscribe(sid) for sid in sids]

        async def read(sub: Any) -> None:
            async for event in sub:
                on_event(event)

        readers = [asyncio.run_coroutine_threadsafe(read(sub), loop) for sub in subs]
    gc.callbacks.append(on_gc)
    try:
        cpu0 = me.cpu_times()
        shard0 = sum(t.user + t.system for t in (p.cpu_times() for p in shards))
        began, sent = time.perf_counter(), time.time()
        handles = [side.rt.prompt(sid, "Stream to me.") for sid in sids]
        results = [h.result(timeout=300) for h in handles]
        deadline = time.monotonic() + 60
        while chars[0] < sessions * len(STREAM_TEXT) and not lagged[0] and time.monotonic() < deadline:
            time.sleep(0.001)  # (an async reader has no flush(): wait for its deltas)
        for sub in subs:
            sub.flush(timeout=60)
        seconds = time.perf_counter() - began
        cpu1 = me.cpu_times()
        shard1 = sum(t.user + t.system for t in (p.cpu_times() for p in shards))
    finally:
        gc.callbacks.remove(on_gc)
        if probe is not None:
            probe.uninstall()
        for sub in subs:
            sub.close()
        for reader in readers:
            reader.result(10)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        # A front hosts no sessions: the plain side's would only weigh on the cluster's run.
        for sid in sids:
            side.rt.stop_session(sid)
    bad = [r for r in results if r.status != "ok" or r.text != STREAM_TEXT]
    if bad:
        raise RuntimeError(
            f"{side.name}: {len(bad)} streamed turns went wrong: {bad[0].status} {bad[0].error}"
        )
    return Streamed(
        side.name,
        mode,
        sessions,
        delays,
        seconds,
        (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
        shard1 - shard0,
        chars[0],
        lagged[0],
        probe.split(got) if probe is not None else None,
        [(at - sent, took) for at, took in collections],
    )


def _spin(seconds: float, out: Any) -> None:
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10_000):
            count += 1
    out.put(count)


def parallelism(seconds: float = 2.0) -> float:
    """How many times the work of one busy Python process two of them get done now on this machine: 2.0
    on an idle 2-core machine, less while other programs take CPU. The turn rates are read against it."""
    import multiprocessing

    done = []
    for processes in (1, 2):
        out: Any = multiprocessing.Queue()
        workers = [multiprocessing.Process(target=_spin, args=(seconds, out)) for _ in range(processes)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        done.append(sum(out.get() for _ in workers))
    return done[1] / done[0]


def _stream_side(name: str, shards: int, gcs_address: str | None, url: str, conn: Any) -> None:
    """A process of its own for one side of the streaming run (a front hosts nothing else: in the
    benchmark's own process the plain side's litellm and sessions are ~400,000 objects more, which a full
    garbage collection walks in 0.25-0.65 s on this machine, where a front's ~100,000 take a fifth of that).
    Measures what the parent asks, one mode at a time, until it says stop."""
    if gcs_address is not None:
        import ray

        ray.init(address=gcs_address, log_to_driver=False)
    side = Side(name, shards)
    side.open()
    try:
        conn.send("ready")
        while True:
            asked = conn.recv()
            if asked is None:
                break
            mode, sessions, hops = asked
            try:
                measure_streaming(side, min(sessions, 20), url, mode)  # warm: the provider, the connections
                conn.send(measure_streaming(side, sessions, url, mode, hops))
            except Exception as exc:
                conn.send(RuntimeError(f"{name} {mode}: {type(exc).__name__}: {exc}"))
    finally:
        side.close()


def run_streaming(sessions: int, modes: Sequence[str] = MODES, hops: bool = False) -> list[Streamed]:
    """Each mode on a plain ``Runtime`` then on 2 shards, each side in a process of its own."""
    import multiprocessing

    import ray

    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    process = ctx.Process(target=_serve_stream, args=(child,), name="bench-stream-provider", daemon=True)
    process.start()
    url = conn.recv()
    gcs = ray.get_runtime_context().gcs_address
    sides: dict[str, tuple[Any, Any]] = {}
    try:
        for name, shards in (("runtime", 0), ("cluster-2", 2)):
            near, far = ctx.Pipe()
            worker = ctx.Process(
                target=_stream_side,
                args=(name, shards, gcs if shards else None, url, far),
                name=f"bench-stream-{name}",
                daemon=True,
            )
            worker.start()
            if near.recv() != "ready":
                raise RuntimeError(f"{name}: the streaming side did not start")
            sides[name] = (worker, near)
        done = []
        for mode in modes:
            for name in sides:
                near = sides[name][1]
                near.send((mode, sessions, hops))
                streamed = near.recv()
                if isinstance(streamed, Exception):
                    raise streamed
                print(
                    f"  streaming {name:<10} {mode:<8} p50 {1000 * _percentile(streamed.delays, 0.5):7.1f} ms, "
                    f"p99 {1000 * _percentile(streamed.delays, 0.99):7.1f} ms, {streamed.seconds:.1f} s",
                    flush=True,
                )
                for hop, values in (streamed.hops or {}).items():
                    print(
                        f"    {hop:<20} p50 {1000 * _percentile(values, 0.5):7.1f}  p90 "
                        f"{1000 * _percentile(values, 0.9):7.1f}  p99 {1000 * _percentile(values, 0.99):7.1f} ms",
                        flush=True,
                    )
                for at, took in streamed.collections:
                    print(
                        f"    a full garbage collection at {at:+.2f} s took {1000 * took:.0f} ms", flush=True
                    )
                done.append(streamed)
        return done
    finally:
        for worker, near in sides.values():
            with contextlib.suppress(Exception):
                near.send(None)
            worker.join(60)
        conn.send("stop")
        process.join(10)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _stream_row(s: Streamed) -> dict[str, Any]:
    row = {
        "side": s.side,
        "subscribed": s.mode,
        "sessions": s.sessions,
        "deltas": len(s.delays),
        "delivery_p50_ms": round(1000 * _percentile(s.delays, 0.5), 1),
        "delivery_p99_ms": round(1000 * _percentile(s.delays, 0.99), 1),
        "delivery_max_ms": round(1000 * max(s.delays), 1) if s.delays else None,
        "wall_s": round(s.seconds, 2),
        "front_cpu_ms_per_turn": round(1000 * s.front_cpu / s.sessions, 2),
        "shard_cpu_ms_per_turn": round(1000 * s.shard_cpu / s.sessions, 2) if s.side != "runtime" else None,
        "every_delta": s.delivered_chars == s.sessions * len(STREAM_TEXT) and not s.lagged,
        "full_gcs": len(s.collections),
    }
    for hop, values in (s.hops or {}).items():
        row[f"{hop}_p99_ms"] = round(1000 * _percentile(values, 0.99), 1)
    return row


def _pairwise(sides: dict[str, Side], name: str) -> list[float]:
    """Each slice of ``name`` over the ``runtime`` slice next to it in time (its order in the plan)."""
    base, other = sides["runtime"].slices, sides[name].slices
    return [o.rate / b.rate for o, b in zip(other, base)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--sessions", type=int, default=None, help="concurrent sessions per slice")
    parser.add_argument("--window", type=float, default=None, help="seconds each slice is measured")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of A B C C B A slices")
    parser.add_argument(
        "--stream-sessions", type=int, default=None, help="sessions mid-turn in the streaming run"
    )
    parser.add_argument("--only-streaming", action="store_true", help="the streaming run alone")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"how the streaming run subscribes, comma-separated among {', '.join(MODES)}",
    )
    parser.add_argument(
        "--hops", action="store_true", help="cut each delta's delay at the front's read and queueing"
    )
    args = parser.parse_args(argv)
    stream_sessions = args.stream_sessions or (200 if args.quick else 1000)
    sessions = args.sessions or (16 if args.quick else 48)
    window = args.window or (2.0 if args.quick else 6.0)
    warmup = 1.0
    rounds = args.rounds or (1 if args.quick else 4)
    latency_turns = 20 if args.quick else 60
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes: among {', '.join(MODES)} (not {', '.join(unknown) or 'none'})")

    try:
        import ray
    except ImportError:
        print("bench_cluster needs Ray: pip install -e '.[ray]'")
        return 2

    # Logical CPUs for Ray's bookkeeping: three shards at once (one side of 1, one of 2) on this machine.
    ray.init(num_cpus=max(3, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    sides = {
        name: Side(name, shards) for name, shards in (("runtime", 0), ("cluster-1", 1), ("cluster-2", 2))
    }
    free = [parallelism()]
    print(f"two busy processes get {free[0]:.2f}x the work of one done on this machine now", flush=True)
    try:
        if not args.only_streaming:
            print(f"starting: {', '.join(sides)} ...", flush=True)
        # cluster-2 first: its two shards claim the two CPUs (runtime.cpu = "auto"); the sides opened after
        # it share theirs, which costs nothing while they wait for their turn. A plain runtime shares a
        # claimed CPU by itself; a shard finding every CPU claimed runs unplaced instead (so that two busy
        # shards never share one CPU while another idles), which cost it 6-18% more CPU a turn in the runs of
        # 13:20 and 13:32 on 2026-11-25 (against the plain runtime), so the
        # 1-shard side is placed on a CPU of cluster-2's shards, as a lone shard claims one by default.
        for side in () if args.only_streaming else (sides["cluster-2"], sides["cluster-1"], sides["runtime"]):
            if side.name == "cluster-1":
                claimed = [
                    c
                    for name in sides["cluster-2"].rt.shards
                    for c in sides["cluster-2"].rt.shard_info(name).cpus or []
                ]
                side.cpu = claimed[0] if claimed else None
            side.open()
            run_slice(side, min(sessions, 8), 0.5, 0.5)  # warm: imports, connections, first sessions
            side.slices.clear()
            if side.shards:
                cpus = [side.rt.shard_info(name).cpus for name in side.rt.shards]
                print(f"  {side.name}: shards on CPUs {cpus}", flush=True)
        order = ["runtime", "cluster-1", "cluster-2", "cluster-2", "cluster-1", "runtime"]
        for n in range(0 if args.only_streaming else rounds):
            for name in order if n % 2 == 0 else list(reversed(order)):
                done = run_slice(sides[name], sessions, warmup, window)
                print(f"  round {n + 1} {name:<10} {done.rate:7.1f} turns/s", flush=True)
        if not args.only_streaming:
            for side in sides.values():
                measure_latency(side, latency_turns)
        for side in sides.values():  # (their CPUs are claimed for the streaming run's shards)
            side.close()
        streamed = run_streaming(stream_sessions, modes, args.hops)
        free.append(parallelism())
    finally:
        for side in sides.values():
            side.close()
        ray.shutdown()
    stream_rows = [_stream_row(s) for s in streamed]
    print()
    print(format_table(stream_rows))
    clustered = [r for r in stream_rows if r["side"] == "cluster-2"]
    worst = max(r["delivery_p99_ms"] for r in clustered)
    print(
        f"\nstreaming, {stream_sessions} sessions mid-turn: cluster-2 delivers at "
        + "; ".join(
            f"{r['subscribed']} p50 {r['delivery_p50_ms']} ms, p99 {r['delivery_p99_ms']} ms"
            for r in clustered
        )
        + f" (target p99 <= {DELIVERY_TARGET_MS:g} ms); every delta delivered: "
        f"{all(r['every_delta'] for r in stream_rows)}"
    )
    stream_meta = {
        "stream_sessions": stream_sessions,
        "stream_chunks_per_answer": STREAM_WORDS,
        "stream_provider_latency_s": STREAM_LATENCY,
        "delivery_target_ms": DELIVERY_TARGET_MS,
        "delivery_met": worst <= DELIVERY_TARGET_MS,
        "streaming": stream_rows,
    }
    if args.only_streaming:
        write_results(f"{NAME}_streaming", stream_rows, {**stream_meta, "parallelism": free}, table=False)
        return 0

    base = statistics.median(s.rate for s in sides["runtime"].slices)
    base_latency = statistics.median(sides["runtime"].latencies)
    rows: list[dict[str, Any]] = []
    for side in sides.values():
        slices = side.slices
        turns_total = sum(s.turns for s in slices)
        ratios = _pairwise(sides, side.name) if side.name != "runtime" else [1.0]
        latency = statistics.median(side.latencies)
        rows.append(
            {
                "side": side.name,
                "shards": side.shards,
                "sessions": sessions,
                "turns_per_s": round(statistics.median(s.rate for s in slices), 1),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                "front_cpu_ms_per_turn": round(1000 * sum(s.front_cpu for s in slices) / turns_total, 2),
                "shard_cpu_ms_per_turn": round(1000 * sum(s.shard_cpu for s in slices) / turns_total, 2)
                if side.shards
                else None,
                "turn_latency_ms": round(1000 * latency, 2),
                "extra_hop_ms": round(1000 * (latency - base_latency), 2) if side.shards else None,
            }
        )
    two = next(r for r in rows if r["side"] == "cluster-2")
    meta = {
        "sessions": sessions,
        "window_s": window,
        "warmup_s": warmup,
        "rounds": rounds,
        "latency_turns": latency_turns,
        "runtime_turns_per_s": round(base, 1),
        "ratio": two["ratio"],
        "target_ratio": TARGET,
        "met": two["ratio"] >= TARGET,
        "extra_hop_ms": next(r for r in rows if r["side"] == "cluster-1")["extra_hop_ms"],
        "quick": args.quick,
        "parallelism": [round(x, 2) for x in free],
        **stream_meta,
    }
    print()
    print(format_table(rows))
    print(
        f"\n2 shards: {two['ratio']:.2f}x the turn rate of one plain Runtime (target >= {TARGET}); "
        f"the extra hop adds {meta['extra_hop_ms']} ms to a turn; two busy processes got "
        f"{' and '.join(f'{x:.2f}x' for x in free)} the work of one done (before, after)"
    )
    write_results(NAME, rows, meta, table=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
