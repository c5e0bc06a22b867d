"""runtime.context.recovery: what a context overflow leads to, word for word (the user reads these)."""

from __future__ import annotations

from runtime.context.recovery import (
    OverflowDecision,
    compaction_did_not_help,
    decide_overflow,
    prompt_caused_overflow,
)


def decide(**kw: object) -> OverflowDecision:
    args: dict[str, object] = {
        "recoveries_this_turn": 0,
        "auto_compact": True,
        "has_store": True,
        "context_window": 128_000,
        "estimated_tokens": 131_072,
    }
    args.update(kw)
    return decide_overflow(**args)  # type: ignore[arg-type]


def test_the_first_overflow_of_a_turn_is_compacted_and_retried() -> None:
    assert decide() == OverflowDecision(
        "compact_and_retry", "context overflow: emergency compaction, then one retry", "context_overflow"
    )


def test_without_a_store_the_overflow_is_an_error_naming_the_size() -> None:
    assert decide(has_store=False) == OverflowDecision(
        "fail",
        "The request exceeded the model's context window of 128,000 tokens (about 131,072 tokens), and "
        "there is no session store to compact. Send a shorter request or start a session.",
    )
    assert decide(has_store=False, estimated_tokens=None).message.startswith(
        "The request exceeded the model's context window of 128,000 tokens, and there is"
    )
    assert "about 0 tokens" not in decide(has_store=False, estimated_tokens=0).message


def test_with_compaction_off_the_error_says_how_to_go_on() -> None:
    assert decide(auto_compact=False) == OverflowDecision(
        "fail",
        "The request exceeded the model's context window of 128,000 tokens (about 131,072 tokens). "
        "Automatic compaction is disabled for this session: run compact() (or /compact) and retry, "
        "or enable compaction.auto.",
    )


def test_a_second_overflow_in_a_turn_ends_it() -> None:
    assert decide(recoveries_this_turn=1) == OverflowDecision(
        "fail",
        "The request still exceeded the model's context window of 128,000 tokens (about 131,072 tokens) "
        "after an emergency compaction. The newest messages alone are too large for this model: "
        "shorten the last prompt or tool output, switch to a model with a larger window, or start a "
        "new session. Nothing was lost; the full history is in the session log.",
        "context_overflow_after_compaction",
    )


def test_a_compaction_that_could_not_make_room_is_explained() -> None:
    assert compaction_did_not_help(context_window=8_000, reason="nothing to summarize") == OverflowDecision(
        "fail",
        "The request exceeded the model's context window of 8,000 tokens and an emergency compaction "
        "could not make room (nothing to summarize). The newest messages alone are too large for this "
        "model: shorten the last prompt or tool output, switch to a model with a larger window, or start "
        "a new session. Nothing was lost; the full history is in the session log.",
        "context_overflow",
    )


def test_the_prompt_is_to_blame_when_unanswered_and_at_least_half_the_request() -> None:
    assert prompt_caused_overflow(prompt_tokens=500, request_tokens=1_000, answered=False)  # exactly half
    assert not prompt_caused_overflow(prompt_tokens=499, request_tokens=1_000, answered=False)
    assert prompt_caused_overflow(prompt_tokens=900, request_tokens=1_000, answered=False)
    assert not prompt_caused_overflow(prompt_tokens=900, request_tokens=1_000, answered=True)
    assert not prompt_caused_overflow(prompt_tokens=0, request_tokens=1_000, answered=True)
    # a third is not half: a different factor would say otherwise
    assert not prompt_caused_overflow(prompt_tokens=340, request_tokens=1_000, answered=False)
