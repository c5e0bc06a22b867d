"""The answer cap against a server that refuses prompt + ``max_tokens`` > window (design §4.5), as vLLM,
SGLang and OpenAI do, and whose tokenizer counts more than ours (SmolLM2's counts ~1.2 × cl100k).

A session on a 2,048-token window it knows, long enough to compact, through the public API. Right after a
compaction (and at the first request) the estimate is a full count with cl100k; a cap that kept only a
sixteenth of the window for the count's error asked for room the prompt had already taken: the server
refused (vLLM: "maximum context length is 2048 tokens. However, you requested 2059 tokens (980 in the
messages, 1079 in the completion)"), the runtime compacted in an emergency and retried.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime.provider import LocalProvider
from tests.conftest import Recorder

WINDOW = 2_048
MODEL = "openai/agentcell-local"  # an unknown model: counted with cl100k standing in for its tokenizer

_TOPICS = ("the harbour", "the mill", "the orchard", "the bridge", "the archive", "the lighthouse")


def note(i: int) -> str:
    """A prompt of ~350 tokens of prose, different each turn."""
    topic = _TOPICS[i % len(_TOPICS)]
    sentences = [
        f"Note {i}, sentence {j}: the survey of {topic} recorded {17 * i + j} crates, {3 * j + i} workers "
        f"and a ledger entry numbered {1000 + 31 * i + j}, which the clerk copied twice before the evening bell."
        for j in range(8)
    ]
    return " ".join(sentences) + " Please keep these notes and answer briefly."


@pytest.fixture
def vllm_like() -> Iterator[LocalProvider]:
    with LocalProvider(
        context_window=WINDOW, overflow_format="vllm", prompt_ratio=1.25, refuse_answer_overflow=True
    ) as provider:
        yield provider


def test_a_compacting_session_is_never_refused_for_its_answer_cap(
    rt: Any, vllm_like: LocalProvider, recorder: Recorder
) -> None:
    sid = rt.start_session(
        model=MODEL,
        api_base=vllm_like.url,
        api_key="sk-local",
        tools=None,
        config={"models.context_windows": {MODEL: WINDOW}},
    )
    for i in range(10):
        result = rt.prompt(sid, note(i)).result(timeout=60)
        assert result.status == "ok", (i, result.error)
    log = vllm_like.request_log
    refused = [(r.outcome, r.prompt_tokens) for r in log if r.outcome != "ok"]
    assert refused == [], f"{len(refused)} of {len(log)} requests refused: {refused}"
    recorder.wait_type("agent_end", 10)  # the callback's thread has every turn's events
    compactions = [e for e in recorder.events if e.session_id == sid and e.type == "compaction_end"]
    assert len(compactions) >= 2  # the session compacted, then went on
    asked = [r.body.get("max_tokens") or r.body.get("max_completion_tokens") for r in log]
    assert all(isinstance(n, int) and n > 0 for n in asked)  # every request capped its answer
