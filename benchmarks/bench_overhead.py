"""The runtime's own cost per turn, with litellm taken out (design §8).

The throughput benchmark's ratio to bare litellm mixes two things: what the runtime adds to a turn, and
how fast this machine runs litellm at that moment (its CPU per mock turn has varied 2.5x between runs
here). This benchmark measures the first on its own. It runs the throughput benchmark's conversations on
a default runtime, but ``litellm.acompletion`` is replaced by a replay of streams recorded once:

- ``answer``: the ``mock`` turn (prompt -> answer), every call streams litellm's ``mock_response`` reply.
- ``tool``: the ``http`` turn (prompt -> call to the ``add`` tool -> its result -> answer), recorded from
  the local provider over HTTP; a call whose last message is a tool result gets the answer, any other the
  tool call. The tool really runs.

Everything else is the runtime's usual path: actors, the gateway reading the stream, events, the tool
executor, the session log (fsync at turn end) and the transcript. What a slice costs in CPU, per turn, is
then the runtime's cost alone.

Three configurations: the defaults, a lean one (no fsync, no transcript) that shows what durability
costs, and ``traced``: the defaults with an OpenTelemetry SDK tracer provider (a batch span processor and
an exporter that drops the spans), which shows what the spans of design §7.5 cost when someone collects them.
The defaults are the no-SDK case: nothing configured OpenTelemetry, so the runtime does not trace and does
not even import it. With the mock turn's CPU from the throughput benchmark, the ratio a CPU-bound process
can reach is about ``bare / (bare + overhead)``.

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
    SYSTEM,
    OnRuntime,
    Run,
    Workload,
    _close,
    _progress,
    _prompt,
    _registry,
    _row,
    tool_turn_steps,
)

NAME = "overhead"
LEAN = {"persistence.fsync": "never", "persistence.transcript": False}
# The replay stands in for litellm.acompletion: the runtime's calls must go over the litellm transport
# (the native one would not call it).
ON_LITELLM = {"gateway.transport": "litellm"}
REPLAY_URL = "http://replay.invalid/v1"  # the tool turn's sessions name a provider; the replay answers
# (turn, sessions, turns of each session per slice, slices)
FULL = (
    ("answer", 10, 5, 6),
    ("answer", 100, 1, 8),
    ("answer", 100, 5, 6),
    ("answer", 1_000, 1, 4),
    ("tool", 10, 3, 6),
    ("tool", 100, 1, 6),
    ("tool", 1_000, 1, 2),
)
QUICK = (("answer", 100, 1, 2), ("tool", 100, 1, 2))


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


async def record_tool_turn(litellm: Any) -> tuple[list[Any], list[Any]]:
    """The chunks of the tool turn's two streamed replies, the tool call and then the answer, as litellm
    yields them reading the local provider over HTTP."""
    from runtime.provider import LocalProvider

    call = {
        "id": "call_add",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
    }
    asked = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _prompt(0)}]
    answered = [
        *asked,
        {"role": "assistant", "content": "Let me add.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "5"},
    ]
    with LocalProvider(context_window=1_000_000) as provider:
        provider.add_script("record", tool_turn_steps())
        streams: list[list[Any]] = []
        for messages in (asked, answered):
            stream = await litellm.acompletion(
                model="openai/record",
                messages=messages,
                tools=_registry().schemas(),
                stream=True,
                stream_options={"include_usage": True},
                api_base=provider.url,
                api_key=API_KEY,
            )
            streams.append([chunk async for chunk in stream])
    return streams[0], streams[1]


class Replay:
    """A stand-in for ``litellm.acompletion``: every call streams the recorded ``answer`` chunks, or, given
    ``tool_call``, those for a call that offers tools and does not end with a tool result."""

    def __init__(self, answer: list[Any], tool_call: list[Any] | None = None) -> None:
        if not answer or tool_call == []:
            raise ValueError("nothing to replay: a recorded stream is empty")
        self.answer = answer
        self.tool_call = tool_call
        self.calls = 0

    async def __call__(self, **kwargs: Any) -> AsyncIterator[Any]:
        self.calls += 1
        return self._stream(self._pick(kwargs))

    def _pick(self, kwargs: dict[str, Any]) -> list[Any]:
        if self.tool_call is None or not kwargs.get("tools"):
            return self.answer
        messages = kwargs.get("messages") or [{}]
        return self.answer if messages[-1].get("role") == "tool" else self.tool_call

    @staticmethod
    async def _stream(chunks: list[Any]) -> AsyncIterator[Any]:
        for chunk in chunks:
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


def row(runs: list[Run], config: str, turn: str) -> dict[str, Any]:
    return {"config": config, "turn": turn, **_row(runs, None)}


_COLUMNS = (
    "turn",
    "config",
    "sessions",
    "turns_per_slice",
    "slices",
    "turns_per_s",
    "cpu_ms_per_turn",
    "p50_ms",
    "p99_ms",
)


def sdk_tracer_provider() -> Any:
    """An OpenTelemetry SDK tracer provider as a service would set one up (a batch span processor), its
    exporter dropping the spans: what the runtime pays for tracing, without an exporter's own work."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    return provider


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 sessions, two slices a configuration")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    warmup = 5

    from runtime.gateway import load_litellm

    litellm = load_litellm()
    loop = asyncio.new_event_loop()
    rows: list[dict[str, Any]] = []
    try:
        replays = {
            "answer": Replay(loop.run_until_complete(record_stream(litellm))),
            "tool": Replay(*reversed(loop.run_until_complete(record_tool_turn(litellm)))),
        }
        for turn, sessions, turns, slices in sizes:
            work = Workload("mock" if turn == "answer" else "http", sessions, turns)
            url = None if turn == "answer" else REPLAY_URL
            with replaying(litellm, replays[turn]):
                for config, overrides in (("default", {}), ("lean", LEAN), ("traced", {})):
                    tracer = sdk_tracer_provider() if config == "traced" else None
                    side = OnRuntime(work, url, overrides={**ON_LITELLM, **overrides}, tracer_provider=tracer)
                    rows.append(row(loop.run_until_complete(measure(side, slices, warmup)), config, turn))
        idle = [
            turn for turn, replay in replays.items() if replay.calls == 0 and turn in {s[0] for s in sizes}
        ]
        if idle:
            raise RuntimeError(
                f"the runtime never called litellm.acompletion for {idle}: nothing was measured"
            )
    finally:
        _close(loop)

    print("\nThe runtime's own cost per turn (litellm replaced by a replay of recorded streams)")
    print(format_table([{c: r[c] for c in _COLUMNS} for r in rows]))
    tool = replays["tool"]
    meta = {
        "quick": args.quick,
        "replay": {
            "answer": {
                "chunks": len(replays["answer"].answer),
                "calls": replays["answer"].calls,
                "reply": MOCK_REPLY,
            },
            "tool": {
                "chunks": [len(tool.tool_call or ()), len(tool.answer)],
                "calls": tool.calls,
            },
        },
        "turn": {
            "answer": "prompt -> answer: 1 streamed call (replayed), the throughput benchmark's mock turn",
            "tool": (
                "prompt -> add tool call -> tool result -> answer: 2 streamed calls (replayed), the throughput"
                " benchmark's http turn"
            ),
        },
        "configs": {
            "default": "fsync at turn end, transcripts on; no OpenTelemetry SDK (no spans, nothing imported)",
            "lean": LEAN,
            "traced": "the defaults with an OpenTelemetry SDK tracer provider (batch processor, spans dropped)",
        },
    }
    write_results(NAME, rows, meta, table=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
