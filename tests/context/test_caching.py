"""The cache-break check (design §4.7), pure: when a response broke the cached prefix, and why."""

from __future__ import annotations

from runtime import messages as m
from runtime.context.caching import CacheWatch, request_shape

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
HISTORY = [m.user("hello"), m.assistant("hi"), m.user("more")]


def test_a_break_needs_a_provider_seen_caching_and_a_prompt_worth_caching() -> None:
    watch = CacheWatch()
    watch.sent(request_shape("openai/gpt-4.1", "sys", TOOLS, HISTORY[:1]))
    assert watch.answered(5_000, 0, minimum=1_024) is None  # the first request: nothing to compare with
    watch.sent(request_shape("openai/gpt-4.1", "sys", TOOLS, HISTORY))
    assert watch.answered(6_000, 0, minimum=1_024) is None  # the provider never cached: no break to report
    watch.sent(request_shape("openai/gpt-4.1", "sys", TOOLS, HISTORY))
    assert watch.answered(6_000, 5_990, minimum=1_024) is None  # all of it read
    watch.sent(request_shape("openai/gpt-4.1", "sys", TOOLS, HISTORY))
    broke = watch.answered(6_000, 100, minimum=1_024)  # the same prefix, not read: an entry expired
    assert broke is not None and (broke.cause, broke.expected_tokens, broke.cached_tokens) == (
        "unknown",
        6_000,
        100,
    )
    short = CacheWatch()
    for cached in (500, 0):
        short.sent(request_shape("openai/gpt-4.1", "sys", TOOLS, HISTORY))
        assert short.answered(900, cached, minimum=1_024) is None  # under the minimum: never cached anyway


def test_the_cause_is_what_changed_first_model_system_tools_history() -> None:
    def after(**changed: object) -> str | None:
        watch = CacheWatch()
        base = {"model": "openai/gpt-4.1", "system_prompt": "sys", "tools": TOOLS, "messages": HISTORY}
        watch.sent(request_shape(**base))  # type: ignore[arg-type]
        watch.answered(8_000, 7_000, minimum=1_024)
        watch.sent(request_shape(**{**base, **changed}))  # type: ignore[arg-type]
        broke = watch.answered(9_000, 50, minimum=1_024)
        return None if broke is None else broke.cause

    assert after(model="openai/gpt-4.1-mini", system_prompt="other") == "model_switch"
    assert after(system_prompt="other") == "system_prompt"
    assert after(tools=[]) == "tools"
    summary = m.user("[Previous conversation summary] ...", kind=m.KIND_COMPACTION_SUMMARY)
    assert after(messages=[summary, HISTORY[-1]]) == "compaction"
    assert after(messages=[*HISTORY, m.assistant("next")]) == "unknown"
