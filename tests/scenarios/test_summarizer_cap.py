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
from runtime.provider import LocalProvider, Turn
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


def start(rt: Any, provider: LocalProvider, windows: dict[str, int] | None = None, **config: Any) -> str:
    """A session of :data:`MODEL` on ``provider``, its window (and ``windows``) known, with ``config``."""
    windows = {MODEL: WINDOW, **(windows or {})}
    config = {"models.context_windows": windows, **config}
    return str(
        rt.start_session(model=MODEL, api_base=provider.url, api_key="sk-local", tools=None, config=config)
    )


def test_a_compaction_s_summarizer_request_fits_the_server_s_count(
    rt: Any, vllm_like: LocalProvider, recorder: Recorder
) -> None:
    assert SERVER_RATIO > STAND_IN_COUNT_RATIO
    # the newest ~200 tokens kept: the summarizer gets most of the history, its request is large
    sid = start(rt, vllm_like, **{"compaction.keep_recent_tokens": 200, "compaction.threshold": 0.9})
    for i in range(9):
        result = rt.prompt(sid, note(i)).result(timeout=60)
        assert result.status == "ok", (i, result.error)
    log = vllm_like.request_log
    refused = [(r.outcome, r.prompt_tokens, r.body.get("max_tokens")) for r in log if r.outcome != "ok"]
    assert refused == [], f"{len(refused)} of {len(log)} requests refused: {refused}"
    recorder.wait_type("agent_end", 9)  # the callback's thread has every turn's events
    ends = [e for e in recorder.events if e.session_id == sid and e.type == "compaction_end"]
    assert ends, "the session compacted"
    assert [e.fallback for e in ends] == [False] * len(ends)  # every summary the summarizer's own
    # the summarizer's requests took what the window allowed: most of it, as the server counts
    summaries = [r for r in log if "<summary-request>" in str(r.body) or "<conversation>" in str(r.body)]
    assert summaries
    for r in summaries:
        assert r.prompt_tokens + r.body["max_tokens"] <= WINDOW


def _refused(provider: LocalProvider) -> list[tuple[str, int, Any]]:
    log = provider.request_log
    return [(r.outcome, r.prompt_tokens, r.body.get("max_tokens")) for r in log if r.outcome != "ok"]


def _summaries(provider: LocalProvider) -> list[Any]:
    return [
        r
        for r in provider.request_log
        if "<summary-request>" in str(r.body) or "<conversation>" in str(r.body)
    ]


def test_a_manual_compaction_before_any_automatic_one_keeps_the_ratio_the_session_learned(
    rt: Any, vllm_like: LocalProvider
) -> None:
    """The session's replies taught it the server counts 1.5 of our tokens; nothing compacted yet, so no
    compaction request carried that ratio to the compactor. A manual compaction's summarizer request (the
    session's own model) is fitted at the learned ratio all the same: before, at the stand-in default
    (1.25), its prompt and answer came to more than the window as the server counts and it was refused."""
    sid = start(rt, vllm_like, **{"compaction.auto": False})
    for i in range(6):
        result = rt.prompt(sid, note(i)).result(timeout=60)
        assert result.status == "ok", (i, result.error)
    assert _summaries(vllm_like) == []  # nothing compacted before
    compacted = rt.compact(sid, keep_recent_tokens=100).result(timeout=60)
    assert compacted.compacted and not compacted.fallback, compacted
    assert _refused(vllm_like) == []
    (summary,) = _summaries(vllm_like)
    assert summary.prompt_tokens + summary.body["max_tokens"] <= WINDOW


def test_a_summarizer_of_another_model_learns_its_ratio_from_its_own_replies(
    rt: Any, vllm_like: LocalProvider
) -> None:
    """The summarizer is another model, whose count ratio nothing but its own replies can teach: the first
    compaction's reply (a small request) teaches it, and the second compaction, of a history that takes
    the summarizer's whole window, is fitted at it. Before, every summarizer request used the stand-in
    default (1.25), and the second was refused."""
    summarizer = "openai/agentcell-summarizer"  # unknown too: cl100k stands in for its tokenizer
    config = {"compaction.auto": False, "compaction.summarizer_model": summarizer}
    sid = start(rt, vllm_like, {summarizer: WINDOW}, **config)
    for i in range(2):
        assert rt.prompt(sid, note(i)).result(timeout=60).status == "ok"
    first = rt.compact(sid, keep_recent_tokens=100).result(timeout=60)
    assert first.compacted and not first.fallback, first
    for i in range(2, 6):
        result = rt.prompt(sid, note(i)).result(timeout=60)
        assert result.status == "ok", (i, result.error)
    second = rt.compact(sid, keep_recent_tokens=100).result(timeout=60)
    assert second.compacted and not second.fallback, second
    assert _refused(vllm_like) == []
    summaries = _summaries(vllm_like)
    assert len(summaries) == 2 and {s.body["model"] for s in summaries} == {"agentcell-summarizer"}
    assert all(s.prompt_tokens + s.body["max_tokens"] <= WINDOW for s in summaries)


def test_a_restarted_compactor_keeps_the_ratio_the_session_learned(
    rt: Any, vllm_like: LocalProvider, recorder: Recorder
) -> None:
    """The session's replies taught it the server counts 1.5 of our tokens, and the agent told the
    compactor. The compactor then crashes: the supervisor restarts it (and the agent after it). A manual
    compaction right after, with no reply in between to teach the new actors anything, is fitted at the
    ratio the session learned: not refused. Before, the restarted compactor fell back to the stand-in
    default (1.25), and the server refused the summarizer's request. (The restarted agent's machine starts
    with it too: tests/turn/test_machine.py.)"""
    sid = start(rt, vllm_like, **{"compaction.auto": False})
    for i in range(6):
        result = rt.prompt(sid, note(i)).result(timeout=60)
        assert result.status == "ok", (i, result.error)
    rt._session(sid).refs.compactor.tell(object())  # an unexpected message: the handler raises, it dies
    recorder.wait_type("agent_recovered")  # rest_for_one: the compactor, then the agent, restarted
    assert [e.actor for e in recorder.of("actor_restarted", sid)] == ["compactor", "agent"]
    compacted = rt.compact(sid, keep_recent_tokens=100).result(timeout=60)
    assert compacted.compacted and not compacted.fallback, compacted
    assert _refused(vllm_like) == []
    (summary,) = _summaries(vllm_like)
    assert summary.prompt_tokens + summary.body["max_tokens"] <= WINDOW


SUMMARIZER = "openai/agentcell-summarizer"  # unknown too: cl100k stands in for its tokenizer


@pytest.mark.parametrize("wording", ["vllm", "vllm_new", "openai", "anthropic"])
def test_a_refused_summarizer_request_teaches_the_ratio_it_states_and_is_sent_again(
    wording: str, rt: Any, recorder: Recorder
) -> None:
    """A summarizer of another model, whose count ratio nothing has taught yet, is asked first for a summary
    that fills its window: fitted at the stand-in default (1.25) where the server counts 1.5 × ours, it is
    refused. The refusal states the server's count of the prompt (each server's wording): the compactor
    learns the ratio from it and sends the request once more, sized at it, and the summary is the model's.
    Before, the compaction fell back to a deterministic summary."""
    with LocalProvider(
        context_window=WINDOW, overflow_format=wording, prompt_ratio=SERVER_RATIO, refuse_answer_overflow=True
    ) as provider:
        config = {"compaction.auto": False, "compaction.summarizer_model": SUMMARIZER}
        sid = start(rt, provider, {SUMMARIZER: WINDOW}, **config)
        for i in range(6):
            result = rt.prompt(sid, note(i)).result(timeout=60)
            assert result.status == "ok", (i, result.error)
        compacted = rt.compact(sid, keep_recent_tokens=100).result(timeout=60)
        assert compacted.compacted and not compacted.fallback, compacted
        first, again = _summaries(provider)
        assert (first.outcome, again.outcome) == ("overflow", "ok")
        assert first.prompt_tokens + first.body["max_tokens"] > WINDOW  # sized at 1.25
        assert again.prompt_tokens + again.body["max_tokens"] <= WINDOW  # sized at what the refusal said
        assert len(_refused(provider)) == 1
        # the summary_request events say the ratio each was sized at: the default, then the one learned
        sized = [e.count_ratio for e in recorder.of("summary_request", sid)]
        assert sized[0] == STAND_IN_COUNT_RATIO and len(sized) == 2 and sized[1] > SERVER_RATIO - 0.1, sized


def test_a_refused_summarizer_request_teaches_the_window_it_states_and_is_sent_again(rt: Any) -> None:
    """The user gave the summarizer model a window of 8,192 tokens; its llama.cpp slot has 2,048. The
    first summary request, sized for 8,192, is refused with llama.cpp's n_ctx: the compactor takes that
    window and sends the request again, sized for it, and the summary is the model's (before: a fallback)."""
    with LocalProvider(context_window=16_384, overflow_format="llamacpp") as provider:
        provider.add_responder(
            SUMMARIZER.split("/")[1], lambda m, t: Turn(text="## Goal\nthe notes"), context_window=2_048
        )
        config = {"compaction.auto": False, "compaction.summarizer_model": SUMMARIZER}
        windows = {MODEL: 16_384, SUMMARIZER: 8_192}
        sid = str(
            rt.start_session(
                model=MODEL,
                api_base=provider.url,
                api_key="sk-local",
                tools=None,
                config={"models.context_windows": windows, **config},
            )
        )
        for i in range(8):
            result = rt.prompt(sid, note(i)).result(timeout=60)
            assert result.status == "ok", (i, result.error)
        compacted = rt.compact(sid, keep_recent_tokens=100).result(timeout=60)
        assert compacted.compacted and not compacted.fallback, compacted
        first, again = [r for r in provider.request_log if r.model == "agentcell-summarizer"]
        assert (first.outcome, again.outcome) == ("overflow", "ok")
        assert first.prompt_tokens > 2_048 >= again.prompt_tokens + again.body["max_tokens"]
