"""The summarizer's request against a server that refuses prompt + ``max_tokens`` > window (vLLM, SGLang,
OpenAI) and whose tokenizer counts more than ours (design §4.5, §5.4).

The turn's requests keep a margin for the server's count of what was counted here, at the ratio the session
learned from its replies; the summarizer's request (a compaction) is fitted to the window by the same rule
(``estimate.prompt_room``). Before, it kept only its own fixed margin over our count: a compaction of a large
history asked for prompt + answer the server counted over the window, was refused, and the compaction fell
back to a deterministic summary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime.context.estimate import STAND_IN_COUNT_RATIO
from runtime.provider import LocalProvider
from tests.conftest import Recorder
from tests.scenarios.test_answer_cap import note

WINDOW = 4_096
MODEL = "openai/agentcell-local"  # an unknown model: counted with cl100k standing in for its tokenizer
SERVER_RATIO = 1.5  # more than the stand-in's default: only the ratio the session learned covers it


@pytest.fixture
def vllm_like() -> Iterator[LocalProvider]:
    with LocalProvider(
        context_window=WINDOW, overflow_format="vllm", prompt_ratio=SERVER_RATIO, refuse_answer_overflow=True
    ) as provider:
        yield provider


def test_a_compaction_s_summarizer_request_fits_the_server_s_count(
    rt: Any, vllm_like: LocalProvider, recorder: Recorder
) -> None:
    assert SERVER_RATIO > STAND_IN_COUNT_RATIO
    sid = rt.start_session(
        model=MODEL,
        api_base=vllm_like.url,
        api_key="sk-local",
        tools=None,
        # the newest ~200 tokens kept: the summarizer gets most of the history, its request is large
        config={
            "models.context_windows": {MODEL: WINDOW},
            "compaction.keep_recent_tokens": 200,
            "compaction.threshold": 0.9,
        },
    )
    for i in range(9):
        result = rt.prompt(sid, note(i)).result(timeout=60)
        assert result.status == "ok", (i, result.error)
    log = vllm_like.request_log
    refused = [(r.outcome, r.prompt_tokens, r.body.get("max_tokens")) for r in log if r.outcome != "ok"]
    assert refused == [], f"{len(refused)} of {len(log)} requests refused: {refused}"
    ends = [e for e in recorder.events if e.session_id == sid and e.type == "compaction_end"]
    assert ends, "the session compacted"
    assert [e.fallback for e in ends] == [False] * len(ends)  # every summary the summarizer's own
    # the summarizer's requests took what the window allowed: most of it, as the server counts
    summaries = [r for r in log if "<summary-request>" in str(r.body) or "<conversation>" in str(r.body)]
    assert summaries
    for r in summaries:
        assert r.prompt_tokens + r.body["max_tokens"] <= WINDOW
