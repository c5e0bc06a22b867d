"""The overhead benchmark's replay: it must stand in for litellm on the runtime's real path, and only
inside its block, or the benchmark would measure the wrong thing (or leave litellm patched)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.bench_overhead import (
    ON_LITELLM,
    REPLAY_URL,
    Replay,
    record_stream,
    record_tool_turn,
    replaying,
)
from benchmarks.bench_throughput import ANSWER, API_KEY, MOCK_MODEL, MOCK_REPLY, _registry


def test_the_replayed_stream_answers_every_turn_and_litellm_is_restored_afterwards(rt: Any) -> None:
    from runtime.gateway import load_litellm

    litellm = load_litellm()
    real = litellm.acompletion
    replay = Replay(asyncio.run(record_stream(litellm)))
    with replaying(litellm, replay):
        # litellm's own mock would answer with this text; the replay answers with the recorded one
        sid = rt.start_session(model=MOCK_MODEL, api_key=API_KEY, config={"agent.mock_response": "not this"})
        first = rt.prompt(sid, "one").result(timeout=30)
        second = rt.prompt(sid, "two").result(timeout=30)
    assert litellm.acompletion is real
    assert (first.status, second.status) == ("ok", "ok")
    assert first.text == second.text == MOCK_REPLY
    assert first.usage.output_tokens > 0  # the recorded usage chunk came through the gateway too
    assert replay.calls == 2


def test_the_replayed_tool_turn_runs_the_tool_and_answers_turn_after_turn(rt: Any) -> None:
    from runtime.gateway import load_litellm

    litellm = load_litellm()
    tool_call, answer = asyncio.run(record_tool_turn(litellm))
    replay = Replay(answer, tool_call=tool_call)
    with replaying(litellm, replay):
        sid = rt.start_session(
            model="openai/replayed",
            tools=_registry(),
            api_base=REPLAY_URL,
            api_key=API_KEY,
            config=ON_LITELLM,  # the replay stands in for litellm.acompletion
        )
        turns = [rt.prompt(sid, f"turn {i}").result(timeout=30) for i in range(2)]
    assert [(t.status, t.steps, t.text) for t in turns] == [("ok", 2, ANSWER)] * 2
    assert replay.calls == 4  # a tool call and an answer a turn, nothing sent to the unreachable URL
    results = [m for m in rt.messages(sid) if m.role == "tool"]
    assert [m.text for m in results] == ["5", "5"]  # the add tool ran on the replayed arguments


def test_litellm_is_restored_when_the_block_fails() -> None:
    class Module:
        async def acompletion(self, **_kwargs: Any) -> None:
            return None

    module = Module()
    real = module.acompletion
    with pytest.raises(RuntimeError), replaying(module, Replay(["chunk"])):
        raise RuntimeError("a slice failed")
    assert module.acompletion == real


def test_an_empty_recording_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        Replay([])
    with pytest.raises(ValueError, match="empty"):
        Replay(["answer chunk"], tool_call=[])
