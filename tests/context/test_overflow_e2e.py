"""Overflow recovery end to end (design §6): every imitated vendor's overflow error, one emergency
compaction and one retry, a clean error on a second overflow, silent overflow from reported usage."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.provider.errors import OVERFLOW_FORMATS
from runtime.provider.script import Turn
from runtime.store.entries import CompactionEntry
from runtime.store.log import read_log
from runtime.store.sessions import SessionDirectory
from tests.conftest import Recorder

PROVIDER_WINDOW = 3_000  # what the provider really accepts
BELIEVED_WINDOW = 8_000  # what the runtime is told: it will not compact at its threshold first
_names = itertools.count(1)


@pytest.fixture(scope="module")
def tight_provider() -> Iterator[Any]:
    from runtime.provider import LocalProvider

    with LocalProvider(context_window=PROVIDER_WINDOW) as p:
        yield p


def chatty(provider: Any, words: int = 120) -> str:
    name = f"overflow-{next(_names)}"
    provider.add_script(name, [Turn(text="Noted. " + " ".join(f"fact{i}" for i in range(words)))], loop=True)
    return f"openai/{name}"


def start(rt: Any, provider: Any, model: str, **config: Any) -> str:
    overrides: dict[str, Any] = {
        "models.context_windows": {model: BELIEVED_WINDOW, "openai/summarizer": PROVIDER_WINDOW},
        "compaction.reserve_tokens": 500,
        "compaction.summarizer_model": "openai/summarizer",
    }
    overrides.update(config)
    return str(rt.start_session(model=model, api_base=provider.url, api_key="sk-local", config=overrides))


def logged_compactions(sessions_dir: Any, sid: str) -> list[tuple[str, str | None]]:
    """Each compaction in the session's log: its trigger and its cause."""
    entries, _ = read_log(SessionDirectory(sessions_dir).log_path(sid))
    return [(e.trigger, e.cause) for e in entries if isinstance(e, CompactionEntry)]


def fill_until_overflow(rt: Any, sid: str, recorder: Recorder, limit: int = 30) -> int:
    for i in range(limit):
        result = rt.prompt(sid, f"Record item {i} of the inventory, with its details.").result(timeout=60)
        assert result.status == "ok", result.error
        recorder.wait_type("agent_end", i + 1)
        if recorder.of("compaction_start", sid):
            return i
    raise AssertionError("the provider never overflowed")


@pytest.mark.parametrize("fmt", sorted(OVERFLOW_FORMATS))
def test_overflow_in_each_vendor_format_compacts_and_retries_once(
    rt: Any, recorder: Recorder, tight_provider: Any, fmt: str, sessions_dir: Any
) -> None:
    tight_provider.overflow_format = fmt
    model = chatty(tight_provider)
    sid = start(rt, tight_provider, model)
    fill_until_overflow(rt, sid, recorder)
    recorder.wait_type("compaction_end")
    (start_event,) = recorder.of("compaction_start", sid)
    (end_event,) = recorder.of("compaction_end", sid)
    assert start_event.trigger == end_event.trigger == "overflow"
    assert start_event.cause == end_event.cause == "refused"  # the provider refused the request
    assert logged_compactions(sessions_dir, sid) == [("overflow", "refused")]  # the log says it too
    assert end_event.tokens_after < end_event.tokens_before
    assert not recorder.of("error", sid)
    statuses = [r.outcome for r in tight_provider.request_log if r.model == model.split("/", 1)[1]]
    assert statuses.count("overflow") == 1 and statuses[-1] == "ok"  # the retried turn succeeded
    # The session goes on after recovery.
    assert rt.prompt(sid, "and one more").result(timeout=60).status == "ok"


def test_a_request_counted_over_the_limit_compacts_before_it_is_sent_and_says_so(
    rt: Any, recorder: Recorder, sessions_dir: Any
) -> None:
    """The turn's own emergency compaction (design §5.13): its threshold compaction did not help (its
    summarizer failed, no fallback), the request is over the limit (window − reserve), so the runtime
    compacts again before sending it. Its events say ``cause: counted``, not ``refused``: no provider
    refused anything."""
    from runtime.provider import LocalProvider
    from runtime.provider.script import Fault

    with LocalProvider(context_window=32_000) as provider:
        model = chatty(provider, words=10)
        summarizer = f"summarizer-{next(_names)}"
        provider.add_script(
            summarizer, [Turn(fault=Fault(kind="auth")), Turn(text="## Goal\nThe inventory.")]
        )
        sid = start(
            rt,
            provider,
            model,
            **{
                "models.context_windows": {model: BELIEVED_WINDOW, f"openai/{summarizer}": BELIEVED_WINDOW},
                "compaction.summarizer_model": f"openai/{summarizer}",
                "compaction.fallback": False,
            },
        )  # limit 7,500, threshold 6,000
        for i in range(4):
            assert rt.prompt(sid, f"item {i}: " + "crate " * 1_000).result(timeout=60).status == "ok"
        assert not recorder.of("compaction_start", sid)
        result = rt.prompt(sid, "the big one: " + "pallet " * 3_500).result(timeout=60)
        assert result.status == "ok", result.error
        recorder.wait_type("agent_end", 5)  # the callback's thread has the five turns' events
        starts = [(e.trigger, e.cause) for e in recorder.of("compaction_start", sid)]
        assert starts == [("threshold", None), ("overflow", "counted")]
        (failed,) = recorder.of("compaction_failed", sid)
        (end,) = recorder.of("compaction_end", sid)
        assert (failed.trigger, failed.cause, end.trigger, end.cause) == (
            "threshold",
            None,
            "overflow",
            "counted",
        )
        assert logged_compactions(sessions_dir, sid) == [
            ("overflow", "counted")
        ]  # (the threshold one failed)
        assert [r.outcome for r in provider.request_log if r.model == model.split("/", 1)[1]] == ["ok"] * 5


def test_a_second_overflow_in_the_same_turn_ends_it_cleanly(
    rt: Any, recorder: Recorder, tight_provider: Any
) -> None:
    tight_provider.overflow_format = "groq"  # states no window: nothing to learn from it
    model = chatty(tight_provider, words=120)
    sid = start(rt, tight_provider, model)
    for i in range(5):
        assert rt.prompt(sid, f"item {i}").result(timeout=60).status == "ok"
    tight_provider.clear_log()
    huge = "inventory " * 3_100  # alone (just) larger than the provider's window
    result = rt.prompt(sid, huge).result(timeout=60)
    assert result.status == "error"
    assert "after an emergency compaction" in (result.error or "") and "new session" in (result.error or "")
    recorder.wait_type("agent_end", 6)
    (compacted,) = recorder.of("compaction_end", sid)
    assert compacted.trigger == "overflow"
    assert recorder.of("error", sid)[-1].code == "context_overflow_after_compaction"
    main = [r for r in tight_provider.request_log if r.model == model.split("/", 1)[1]]
    assert len(main) <= 2, "one try and at most one retry: never a loop"
    # The oversized prompt is kept in the log (nothing lost), and the session still answers.
    assert any(m.text == huge for m in rt.messages(sid))


def test_overflow_with_auto_compaction_disabled_is_an_error(
    rt: Any, recorder: Recorder, tight_provider: Any
) -> None:
    tight_provider.overflow_format = "anthropic"
    model = chatty(tight_provider)
    sid = start(rt, tight_provider, model, **{"compaction.auto": False})
    for i in range(30):
        result = rt.prompt(sid, f"Record item {i} of the inventory.").result(timeout=60)
        if result.status != "ok":
            break
    else:
        raise AssertionError("the provider never overflowed")
    assert "compaction is disabled" in (result.error or "").lower()
    recorder.wait_type("error")
    assert not recorder.of("compaction_start", sid)


def test_silent_overflow_in_usage_compacts_before_the_next_turn(
    rt: Any, recorder: Recorder, provider: Any
) -> None:
    # The runtime is told the window is 1,000 tokens; a response reporting more input tokens than that (a
    # provider that silently truncated, or counts differently) is a silent overflow (design §6.2).
    name = f"overflow-{next(_names)}"
    answer = "Noted. " + " ".join(f"fact{i}" for i in range(30))
    provider.add_script(name, [Turn(text=answer, prompt_tokens=1_500), Turn(text=answer)], loop=True)
    model = f"openai/{name}"
    overrides = {
        "models.context_windows": {model: 1_000, "openai/summarizer": 32_000},
        "compaction.reserve_tokens": 100,
        "compaction.threshold": 1.0,
        "compaction.summarizer_model": "openai/summarizer",
    }
    sid = str(rt.start_session(model=model, api_base=provider.url, api_key="sk-local", config=overrides))
    assert rt.prompt(sid, "word " * 200).result(timeout=60).status == "ok"
    recorder.wait_type("usage_overflow")
    (flag,) = recorder.of("usage_overflow", sid)
    assert flag.input_tokens > flag.context_window == 1_000
    assert rt.prompt(sid, "next").result(timeout=60).status == "ok"
    recorder.wait_type("compaction_start")
    assert recorder.of("compaction_start", sid)[0].trigger == "usage_overflow"


def test_an_overflow_that_states_the_window_teaches_it(
    rt: Any, recorder: Recorder, tight_provider: Any
) -> None:
    """The same prompt where the error names the window (OpenAI's wording): the session learns 3,000
    (``window_learned``), and its emergency compaction and the next check use it, so the prompt that
    cannot fit is refused before a second request, with the real window in the message."""
    tight_provider.overflow_format = "openai"
    model = chatty(tight_provider, words=120)
    sid = start(rt, tight_provider, model)
    for i in range(5):
        assert rt.prompt(sid, f"item {i}").result(timeout=60).status == "ok"
    tight_provider.clear_log()
    huge = "inventory " * 3_100
    result = rt.prompt(sid, huge).result(timeout=60)
    assert result.status == "error"
    assert "3,000 tokens" in (result.error or "")
    recorder.wait_type("agent_end", 6)
    (learned,) = recorder.of("window_learned", sid)
    assert (learned.old, learned.new, learned.source) == (BELIEVED_WINDOW, PROVIDER_WINDOW, "overflow")
    main = [r for r in tight_provider.request_log if r.model == model.split("/", 1)[1]]
    assert [r.outcome for r in main] == ["overflow"], "the learned window refuses the prompt before sending"
    assert any(m.text == huge for m in rt.messages(sid))
    # The session goes on, within the learned window, and the next turn's request asks for no more
    # output than that window leaves.
    assert rt.prompt(sid, "and one more").result(timeout=60).status == "ok"
    sent = [r for r in tight_provider.request_log if r.model == model.split("/", 1)[1]][-1]
    assert sent.outcome == "ok"
    assert 0 < sent.body["max_tokens"] <= PROVIDER_WINDOW - sent.prompt_tokens
