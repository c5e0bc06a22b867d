"""A session busy all day (design §2.2): thousands of turns at a small window keep what the context holds in
memory, not the history, and the user still sees the whole conversation.

The provider runs in a child process (``agentcell provider``), so what ``tracemalloc`` counts is the
runtime's own memory, not the provider's caches and request log.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_soak import provider as spawned_provider
from runtime import Runtime
from runtime.config import Config

MODEL = "openai/agentcell-local"
WINDOW = 2_000  # tokens: the session compacts every few turns
WARM = 300  # turns before measuring: compactions have happened, caches are full
TURNS = 2_000  # turns measured
BYTES_PER_TURN = 100  # retained per turn at most (issue 46: 2.7 KB before)


@pytest.fixture(scope="module")
def provider_url() -> Iterator[str]:
    with spawned_provider() as url:  # the local provider in a child process, as bench_soak runs it
        yield url


def _turns(rt: Any, sid: str, start: int, stop: int) -> None:
    for i in range(start, stop):
        result = rt.prompt(sid, f"prompt {i}: tell me about the number {i}").result(timeout=60)
        assert result.status == "ok", (i, result.error)


def _after_a_compaction(rt: Any, sid: str, start: int) -> int:
    """Turns from ``start`` until one compacts (the context is at its smallest then); returns the next."""
    size = len(rt.messages(sid, view="model"))
    while True:
        _turns(rt, sid, start, start + 1)
        start += 1
        now = len(rt.messages(sid, view="model"))
        if now < size:
            return start
        size = now


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_long_session_keeps_its_context_not_its_history(provider_url: str, tmp_path: Path) -> None:
    config = Config().with_overrides(
        {"models.context_windows": {MODEL: WINDOW}, "persistence.fsync": "never"}
    )
    with Runtime(config, sessions_dir=tmp_path / "sessions") as rt:
        sid = rt.start_session(model=MODEL, api_base=provider_url, api_key="sk-local", tools=())
        _turns(rt, sid, 0, WARM)
        # measured from just after a compaction to just after another (the context at its smallest both times)
        start = _after_a_compaction(rt, sid, WARM)
        tracemalloc.start()
        try:
            context_before = len(rt.messages(sid, view="model"))
            base = _traced()
            _turns(rt, sid, start, start + TURNS)
            end = _after_a_compaction(rt, sid, start + TURNS)
            grown = _traced() - base
            context_after = len(rt.messages(sid, view="model"))
        finally:
            tracemalloc.stop()
        # the context is bounded by the window, and so is what the session keeps
        print(f"{grown:,} bytes kept over {end - start:,} turns; context {context_before} -> {context_after}")
        assert context_after <= 2 * context_before + 4
        turns = end - start
        assert grown <= BYTES_PER_TURN * turns, f"{grown} bytes kept over {turns} turns"

        # nothing is lost: the user's view reads the old history back from the log, in order
        shown = rt.messages(sid)
        prompts = [m.text for m in shown if m.role == "user" and m.kind is None]
        assert prompts == [f"prompt {i}: tell me about the number {i}" for i in range(end)]
        assert rt.message_count(sid) == len(shown)
        newest = rt.messages(sid, limit=10)
        assert newest == shown[-10:]
        page = rt.messages(sid, offset=len(shown) - 30, limit=20)  # deep in the history: from the log
        assert page == shown[10:30]

        # and a branch to the very first message works, and the session goes on from there
        first = next(m for m in shown if m.role == "user")
        rt.branch(sid, first.id)
        assert [m.id for m in rt.messages(sid)] == [first.id]
        assert rt.prompt(sid, "again from the start").result(timeout=60).status == "ok"
        assert [m.text for m in rt.messages(sid) if m.role == "user"] == [first.text, "again from the start"]
