"""The overhead benchmark's replay: it must stand in for litellm on the runtime's real path, and only
inside its block, or the benchmark would measure the wrong thing (or leave litellm patched)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.bench_overhead import Replay, record_stream, replaying
from benchmarks.bench_throughput import API_KEY, MOCK_MODEL, MOCK_REPLY


def test_the_replayed_stream_answers_every_turn_and_litellm_is_restored_afterwards(rt: Any) -> None:
    from runtime.llm import load_litellm

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
