"""Where a compaction cuts (design §5.2, 5.3): the newest part of the history kept, the rest summarized.

Pure: :func:`find_cut_point` walks a conversation (without its system prompt, oldest first) with the caller's
token ``count`` and answers a :class:`CutPoint`. A cut never separates a tool call from its results, and
lands on a turn's start where it can; inside a turn, the turn's beginning may get its own summary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from runtime.messages import KIND_COMPACTION_SUMMARY, KIND_TOOL_SUMMARY, Message, ToolCallPart

__all__ = ["CountTokens", "CutPoint", "find_cut_point", "is_summary", "is_turn_start"]

CountTokens = Callable[[Message], int]

_NOT_TURN_STARTS: Final = frozenset({KIND_TOOL_SUMMARY, KIND_COMPACTION_SUMMARY})


class CutPoint(msgspec.Struct, frozen=True):
    """Where the kept part begins.

    ``index`` is the first kept message (``len(messages)`` when nothing is kept). ``split_turn_start`` is
    set when the kept part begins inside a turn and at least ``split_turn_min_messages`` of that turn are
    summarized: it is the index of the turn's user message, and that beginning gets its own summary.
    ``forced`` says the cut is the ``force`` fallback (keep the last few messages), not a turn boundary.
    """

    index: int
    split_turn_start: int | None = None
    forced: bool = False


def is_summary(msg: Message) -> bool:
    """A previous compaction summary (by its kind: a user who types the prefix does not make one)."""
    return msg.kind == KIND_COMPACTION_SUMMARY


def is_turn_start(msg: Message) -> bool:
    """A user message that opens a turn (not a summary or tool digest, which are user messages too)."""
    return msg.role == "user" and msg.kind not in _NOT_TURN_STARTS


def find_cut_point(
    messages: Sequence[Message],
    *,
    keep_tokens: int,
    count: CountTokens,
    force: bool = False,
    force_keep: int = 2,
    split_turn_min_messages: int = 5,
    keep_from: int | None = None,
) -> CutPoint | None:
    """Where to cut ``messages`` so that the newest ``keep_tokens`` worth are kept, or ``None``.

    Walks back from the newest message, adding up tokens, to the message that crosses ``keep_tokens``;
    the cut is the first turn start (user message) at or after it. A cut never separates an assistant
    tool call from its results, and never keeps a tool result without its call.

    When no turn starts at or after the crossing (the newest turn alone exceeds the budget), the cut lands
    inside that turn, at the first message at or after the crossing where the kept part may start (an
    assistant message whose tool calls' results all follow it), or the nearest one before the crossing
    when there is none after. If ``split_turn_min_messages`` or more of the turn fall before the cut, the
    turn's start is reported as ``split_turn_start``; a shorter beginning is simply summarized with the
    rest of the history.

    ``None`` when everything fits in ``keep_tokens`` or no cut would summarize anything besides a previous
    summary; with ``force``, the fallback is to keep only the last ``force_keep`` messages, moved earlier
    (so more is kept) when that would split a call from its results, or later when no earlier cut exists.

    ``keep_from`` (the working set's start, design §5.13) is kept whatever the budget: a cut after it moves
    back to it (or to the nearest valid cut before it), and when no such cut leaves anything to
    summarize, the answer is ``None``.
    """
    cut = _find_cut(messages, keep_tokens, count, force, force_keep, split_turn_min_messages)
    if cut is None or keep_from is None or cut.index <= keep_from:
        return cut
    first = next((i for i, m in enumerate(messages) if not is_summary(m)), len(messages))
    valid = _valid_cuts(messages)
    index = next((i for i in range(min(keep_from, len(messages)), first, -1) if valid[i]), None)
    if index is None:
        return None
    return _inside_turn(messages, index, split_turn_min_messages)


def _find_cut(
    messages: Sequence[Message],
    keep_tokens: int,
    count: CountTokens,
    force: bool,
    force_keep: int,
    split_turn_min_messages: int,
) -> CutPoint | None:
    n = len(messages)
    if n == 0:
        return None
    # The cut must leave something besides previous summaries to summarize.
    first = next((i for i, m in enumerate(messages) if not is_summary(m)), n)
    lowest = first + 1
    if lowest > n:
        return None
    valid = _valid_cuts(messages)

    crossing = _crossing(messages, keep_tokens, count)
    if crossing is not None:
        start = max(crossing, lowest)
        clean = next((i for i in range(start, n) if valid[i] and is_turn_start(messages[i])), None)
        if clean is not None:
            return CutPoint(clean)
        inside = next((i for i in range(start, n) if valid[i]), None)
        if inside is None:
            inside = next((i for i in range(start - 1, lowest - 1, -1) if valid[i]), None)
        if inside is not None:
            return _inside_turn(messages, inside, split_turn_min_messages)
    if not force:
        return None
    return _forced_cut(valid, n, lowest, force_keep)


def _inside_turn(messages: Sequence[Message], index: int, split_turn_min_messages: int) -> CutPoint:
    """A cut at ``index``, which may fall inside a turn: a split turn when enough of it is summarized."""
    if index >= len(messages) or is_turn_start(messages[index]):
        return CutPoint(index)
    turn = next((i for i in range(index - 1, -1, -1) if is_turn_start(messages[i])), None)
    if turn is not None and index - turn >= split_turn_min_messages:
        return CutPoint(index, split_turn_start=turn)
    return CutPoint(index)


def _valid_cuts(messages: Sequence[Message]) -> list[bool]:
    """``valid[i]``: the kept part may start at ``i`` (``valid[n]`` is true: keep nothing).

    A cut at ``i`` is invalid when a tool call before ``i`` has its result at or after ``i``, and when
    ``messages[i]`` is a tool result (its call would be summarized, or it is an orphan).
    """
    n = len(messages)
    call_at: dict[str, int] = {}
    span = [0] * (n + 2)
    for i, msg in enumerate(messages):
        if msg.role == "assistant":
            for part in msg.parts:
                if type(part) is ToolCallPart:
                    call_at[part.id] = i
        elif msg.role == "tool" and msg.tool_call_id is not None:
            c = call_at.get(msg.tool_call_id)
            if c is not None and c < i:
                span[c + 1] += 1  # cuts in c+1 .. i would separate call c from result i
                span[i + 1] -= 1
    valid = [False] * (n + 1)
    open_spans = 0
    for i in range(n + 1):
        open_spans += span[i]
        valid[i] = open_spans == 0 and (i == n or messages[i].role != "tool")
    return valid


def _crossing(messages: Sequence[Message], keep_tokens: int, count: CountTokens) -> int | None:
    """Index of the newest message whose addition makes the kept tail exceed ``keep_tokens``."""
    total = 0
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.agent_visible:
            total += count(msg)
            if total > keep_tokens:
                return i
    return None


def _forced_cut(valid: list[bool], n: int, lowest: int, force_keep: int) -> CutPoint:
    target = max(n - force_keep, lowest)
    index = next((i for i in range(target, lowest - 1, -1) if valid[i]), None)
    if index is None:
        index = next(i for i in range(target, n + 1) if valid[i])  # valid[n] is always true
    return CutPoint(index, forced=True)
