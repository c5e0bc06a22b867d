"""What to do about a context overflow (design §6.3), as a pure decision.

The overflow detector actor feeds it the facts of the turn; the agent and the compactor act on the answer.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "PROMPT_HIDDEN_NOTE",
    "OverflowAction",
    "OverflowDecision",
    "compaction_did_not_help",
    "decide_overflow",
    "prompt_caused_overflow",
]


OverflowAction = Literal["compact_and_retry", "fail"]


class OverflowDecision(msgspec.Struct, frozen=True):
    action: OverflowAction
    message: str
    code: str = "context_overflow"


def decide_overflow(
    *,
    recoveries_this_turn: int,
    auto_compact: bool,
    has_store: bool,
    context_window: int,
    estimated_tokens: int | None = None,
    window_learned: bool = False,
) -> OverflowDecision:
    """One emergency compaction and one retry per turn; anything else is a clear error, never a loop.

    An overflow that taught the session a smaller window (``window_learned``) gets its compaction and
    retry even after one this turn: the earlier one aimed at a window that was wrong, and a window only
    ever shrinks when learned, so this cannot loop."""
    size = f" (about {estimated_tokens:,} tokens)" if estimated_tokens else ""
    if not has_store:
        return OverflowDecision(
            "fail",
            f"The request exceeded the model's context window of {context_window:,} tokens{size}, and "
            "there is no session store to compact. Send a shorter request or start a session.",
        )
    if not auto_compact:
        return OverflowDecision(
            "fail",
            f"The request exceeded the model's context window of {context_window:,} tokens{size}. "
            "Automatic compaction is disabled for this session: run compact() (or /compact) and retry, "
            "or enable compaction.auto.",
        )
    if recoveries_this_turn >= 1 and not window_learned:
        return OverflowDecision(
            "fail",
            f"The request still exceeded the model's context window of {context_window:,} tokens{size} "
            "after an emergency compaction. The newest messages alone are too large for this model: "
            "shorten the last prompt or tool output, switch to a model with a larger window, or start a "
            "new session. Nothing was lost; the full history is in the session log.",
            code="context_overflow_after_compaction",
        )
    return OverflowDecision("compact_and_retry", "context overflow: emergency compaction, then one retry")


def compaction_did_not_help(*, context_window: int, reason: str) -> OverflowDecision:
    """The error when the emergency compaction itself could not make room (design §6.3)."""
    return OverflowDecision(
        "fail",
        f"The request exceeded the model's context window of {context_window:,} tokens and an emergency "
        f"compaction could not make room ({reason}). The newest messages alone are too large for this "
        "model: shorten the last prompt or tool output, switch to a model with a larger window, or start "
        "a new session. Nothing was lost; the full history is in the session log.",
    )


PROMPT_HIDDEN_NOTE = (
    " The prompt was kept in the session's record but hidden from the model, so the session goes on: "
    "send a shorter prompt, or put the content in a file for the agent to read in parts."
)


def prompt_caused_overflow(*, prompt_tokens: int, request_tokens: int, answered: bool) -> bool:
    """Whether a run's prompt is what keeps the context from fitting after compaction failed to make
    room: it has no answer yet and is at least half of what was sent. Hiding it from the model then lets
    the session go on; a context grown by the run's own tool results is left alone."""
    return not answered and prompt_tokens * 2 >= request_tokens
