"""Sessions in Anthropic's dialect through the public API (issue 44): ``anthropic/`` models against the local
provider's Messages API, over the native Anthropic transport.

The provider signs every thinking block it gives out and refuses a request whose thinking blocks came back
changed (as Anthropic does), so a session that goes on answering proves its signatures went back unchanged:
across tool steps, across compactions (kept messages and the summarizer's own request), for many turns. It
also refuses a 5th cache breakpoint, so a long session also proves the runtime's placement stays within
Anthropic's rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.messages import ReasoningPart
from runtime.provider import LocalProvider, Turn
from runtime.tools.registry import tool
from tests.scenarios import workload

MODEL = "anthropic/claude-local-workload"


@tool
def blob(chars: int, tag: str) -> str:
    """Return ``chars`` characters of text labelled ``tag``."""
    return workload.blob(chars, tag)


def thinking_workload(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Turn:
    """The workload model, thinking aloud before every step and answer (the provider signs each thought)."""
    turn = workload.respond(messages, tools)
    if turn.tool_calls:
        ids = ",".join(call.id or "" for call in turn.tool_calls)
        return Turn(reasoning=f"Next I call blob for {ids}.", tool_calls=turn.tool_calls)
    return Turn(reasoning=f"{turn.text.split('.')[0]}: all steps are done, I answer.", text=turn.text)


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        p.add_responder(MODEL.split("/", 1)[1], thinking_workload)
        yield p


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    with Runtime(config, sessions_dir=tmp_path / "sessions") as r:
        yield r


def _agent_requests(provider: LocalProvider) -> list[Any]:
    return [r for r in provider.request_log if r.model == MODEL.split("/", 1)[1]]


def _thinking_sent(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (block["thinking"], block["signature"])
        for message in body["messages"]
        if message["role"] == "assistant"
        for block in message["content"]
        if block.get("type") == "thinking"
    ]


def test_signed_thinking_goes_back_unchanged_across_tool_steps_and_compactions(
    rt: Runtime, provider: LocalProvider, tmp_path: Path
) -> None:
    seen: list[Any] = []
    sub = rt.subscribe(callback=seen.append)
    sid = rt.start_session(
        model=MODEL,
        api_base=provider.base_url,
        api_key="sk-local",
        tools=[blob],
        config={"models.context_windows": {MODEL: 6_000}, "compaction.reserve_tokens": 1_000},
    )
    for turn in range(8):
        prompt = workload.prompt_text(turn, [[1500, 1200], [1600]], pad_chars=1200)
        result = rt.prompt(sid, prompt).result(timeout=120)
        assert result.status == "ok", result.error
    manual = rt.compact(sid).result(timeout=120)
    assert manual is not None
    after = rt.prompt(sid, workload.prompt_text(8, [[200]])).result(timeout=120)
    assert after.status == "ok", after.error
    sub.close()

    requests = _agent_requests(provider)
    refused = [(r.status, r.outcome) for r in requests if r.status != 200]
    assert not refused, f"the provider refused requests (a changed signature is a 400): {refused}"
    compactions = [e for e in seen if e.type == "compaction_end" and e.session_id == sid]
    assert len(compactions) >= 2, "a compaction by the trigger and the manual one"
    assert all(e.transport == "anthropic" for e in seen if e.type == "request_start")
    stored = {
        (p.text, p.signature)
        for message in rt.messages(sid, view="user")
        for p in message.parts
        if isinstance(p, ReasoningPart) and p.signature
    }
    sent_after_compaction = [pair for r in requests[-3:] for pair in _thinking_sent(r.body)]
    assert sent_after_compaction, "thinking of the kept steps goes back after the compactions"
    everything_sent = {pair for r in requests for pair in _thinking_sent(r.body)}
    assert everything_sent <= stored, "each thinking block goes back with its own signature, unchanged"
    assert len(stored) >= 9 * 2, "every turn's steps and answer kept their thinking"


def test_a_long_tool_heavy_session_stays_within_anthropics_caching_rules(
    rt: Runtime, provider: LocalProvider
) -> None:
    sid = rt.start_session(
        model=MODEL,
        api_base=provider.base_url,
        api_key="sk-local",
        tools=[blob],
        config={"models.context_windows": {MODEL: 32_000}},
    )
    turns = 24
    for turn in range(turns):
        steps = [[600, 300], [800], [200, 200, 200]] if turn % 3 == 0 else [[500], [300]]
        result = rt.prompt(sid, workload.prompt_text(turn, steps, pad_chars=300)).result(timeout=120)
        assert result.status == "ok", result.error
    requests = _agent_requests(provider)
    assert all(r.status == 200 for r in requests), [
        (r.status, r.outcome) for r in requests if r.status != 200
    ]
    marks = [json.dumps(r.body).count('"cache_control"') for r in requests]
    assert max(marks) <= 4, marks
    # the session's own steps (not the one-message calls that summarize archived tool results)
    steps = [n for r, n in zip(requests, marks, strict=True) if len(r.body["messages"]) > 2]
    assert all(n >= 1 for n in steps[len(steps) // 4 :]), f"a long enough prefix is marked: {steps}"
    read = sum(r.cached_tokens for r in requests)
    assert read > 0, "marked prefixes were read back from the cache"
    usage = rt.usage(sid)
    assert 0 < usage.cache_read_tokens <= read and usage.cache_write_tokens > 0
    assert usage.cache_read_tokens + usage.cache_write_tokens < usage.input_tokens
    answers = [m for m in rt.messages(sid) if m.role == "assistant"]
    assert answers and all(m.usage is not None and m.usage.transport == "anthropic" for m in answers)
