"""The runtime's own cost per turn, with litellm taken out (SPEC 8).

The throughput benchmark's ratio to bare litellm mixes two things: what the runtime adds to a turn, and
how fast this machine runs litellm at that moment (its CPU per mock turn has varied 2.5x between runs
here). This benchmark measures the first on its own. It runs the throughput benchmark's mock
conversations on a default runtime, but ``litellm.acompletion`` is replaced by a replay: every call
streams the same chunks, recorded once from litellm's ``mock_response``. Everything else is the runtime's
usual path: actors, the gateway reading the stream, events, the session log (fsync at turn end) and the
transcript. What a slice costs in CPU, per turn, is then the runtime's cost alone.

Two configurations: the defaults, and a lean one (no fsync, no transcript) that shows what durability
costs. With the mock turn's CPU from the throughput benchmark, the ratio a CPU-bound process can reach
is about ``bare / (bare + overhead)``.

Run: ``python -m benchmarks.bench_overhead`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from benchmarks._common import format_table, write_results
from benchmarks.bench_throughput import (
    API_KEY,
    MOCK_MODEL,
    MOCK_REPLY,
    OnRuntime,
    Run,
    Workload,
    _close,
    _progress,
    _row,
)

NAME = "overhead"
LEAN = {"persistence.fsync": "never", "persistence.transcript": False}
# (sessions, turns of each session per slice, slices)
FULL = ((10, 5, 6), (100, 1, 8), (100, 5, 6), (1_000, 1, 4))
QUICK = ((100, 1, 2),)


async def record_stream(litellm: Any) -> list[Any]:
    """The chunks of one streamed mock reply, as litellm yields them to the gateway."""
    stream = await litellm.acompletion(
        model=MOCK_MODEL,
        messages=[{"role": "user", "content": "Turn 0: what is 2 + 3?"}],
        stream=True,
        stream_options={"include_usage": True},
        mock_response=MOCK_REPLY,
        api_key=API_KEY,
    )
    return [chunk async for chunk in stream]


class Replay:
    """A stand-in for ``litellm.acompletion``: every call streams the recorded chunks."""

    def __init__(self, chunks: list[Any]) -> None:
        if not chunks:
            raise ValueError("nothing to replay: the recorded stream is empty")
        self.chunks = chunks
        self.calls = 0

    async def __call__(self, **_kwargs: Any) -> AsyncIterator[Any]:
        self.calls += 1
        return self._stream()

    async def _stream(self) -> AsyncIterator[Any]:
        for chunk in self.chunks:
            yield chunk


@contextlib.contextmanager
def replaying(litellm: Any, replay: Replay) -> Iterator[Replay]:
    """Route ``litellm.acompletion`` to ``replay`` inside the block; the real one is back afterwards."""
    real = litellm.acompletion
    litellm.acompletion = replay
    try:
        yield replay
    finally:
        litellm.acompletion = real


async def measure(side: OnRuntime, slices: int, warmup: int) -> list[Run]:
    runs: list[Run] = []
    try:
        await side.open(warmup)
        for _ in range(slices):
            run = await side.slice()
            _progress(run)
            runs.append(run)
    finally:
        await side.close()
    return runs


def row(runs: list[Run], config: str) -> dict[str, Any]:
    return {"config": config, **_row(runs, None)}


_COLUMNS = (
    "config",
    "sessions",
    "turns_per_slice",
    "slices",
    "turns_per_s",
    "cpu_ms_per_turn",
    "p50_ms",
    "p99_ms",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 sessions, two slices a configuration")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    warmup = 5

    from runtime.llm import load_litellm

    litellm = load_litellm()
    loop = asyncio.new_event_loop()
    rows: list[dict[str, Any]] = []
    try:
        replay = Replay(loop.run_until_complete(record_stream(litellm)))
        with replaying(litellm, replay):
            for sessions, turns, slices in sizes:
                work = Workload("mock", sessions, turns)
                for config, overrides in (("default", {}), ("lean", LEAN)):
                    side = OnRuntime(work, None, overrides=overrides)
                    rows.append(row(loop.run_until_complete(measure(side, slices, warmup)), config))
        if replay.calls == 0:
            raise RuntimeError("the runtime never called litellm.acompletion: nothing was measured")
    finally:
        _close(loop)

    print(f"\nThe runtime's own cost per turn (litellm replaced by a replay of {len(replay.chunks)} chunks)")
    print(format_table([{c: r[c] for c in _COLUMNS} for r in rows]))
    meta = {
        "quick": args.quick,
        "replay": {"chunks": len(replay.chunks), "calls": replay.calls, "reply": MOCK_REPLY},
        "turn": "prompt -> answer: 1 streamed call (replayed), the throughput benchmark's mock turn",
        "configs": {"default": "fsync at turn end, transcripts on", "lean": LEAN},
    }
    write_results(NAME, rows, meta, table=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
