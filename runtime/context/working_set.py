"""The working set of a step, and the rules each provider request of a turn must pass (design §5.13). Pure.

The *working set* is what the model needs to take its next step: the newest assistant message with tool
calls and all of its results (or, before the turn's first step, the turn's prompt). An automatic
compaction never summarizes it away (:func:`working_set_start` tells the compactor where it begins);
otherwise a tool-heavy turn loops: read a file, compact the fresh result away, read the file again.

When a step's results alone are too big for the context, the largest are clipped head and tail
(:func:`plan_clips`, :func:`clip_result`), the full text saved on disk and named in the notice with its
SHA-256, so nothing is lost and the model can read it in parts.

Before each request of a turn :func:`decide_step` says what to do: send it, compact first (at most one
threshold compaction and one overflow compaction per turn), or end the turn with a clear error (the
request cannot fit, or the turn would pass its input-token budget). Everything here is a function of its
arguments: no actors, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PureWindowsPath
from typing import Final, Literal

import msgspec

from runtime.config import CompactionConfig
from runtime.context.cut import is_turn_start
from runtime.context.estimate import effective_limit, should_compact
from runtime.events import CompactionTrigger
from runtime.messages import KIND_COMPACTION_SUMMARY, KIND_STEER, Message, TextPart

__all__ = [
    "CLIP_NOTICE_TOKENS",
    "CONTEXT_OVERFLOW",
    "MIN_CLIP_CHARS",
    "PROMPT_TOO_LARGE",
    "TURN_BUDGET",
    "TURN_BUDGET_WINDOWS",
    "WORKING_SET_TOO_LARGE",
    "Clip",
    "CountTokens",
    "StepDecision",
    "clip_result",
    "compactable_tokens",
    "decide_step",
    "plan_clips",
    "prompt_too_large",
    "turn_input_budget",
    "working_set_budget",
    "working_set_start",
]


CountTokens = Callable[[Message], int]

# Error codes a turn can end with because of its context (the README lists them all).
PROMPT_TOO_LARGE: Final = "prompt_too_large"
WORKING_SET_TOO_LARGE: Final = "context_working_set_too_large"
TURN_BUDGET: Final = "turn_budget"
CONTEXT_OVERFLOW: Final = "context_overflow"

# What a clipped tool result keeps at least (chars of head + tail), however many results share the room.
MIN_CLIP_CHARS: Final = 400
# What a clip's notice and marker cost, in tokens (a path, a SHA-256 and two sentences).
CLIP_NOTICE_TOKENS: Final = 110
# Turn budget default: this many context windows of input tokens per turn.
TURN_BUDGET_WINDOWS: Final = 20


# ---------------------------------------------------------------------------------------------------
# Where the working set begins


def compactable_tokens(messages: Sequence[Message], count: CountTokens) -> int:
    """Tokens an automatic compaction could take out of ``messages``: the agent-visible messages before
    the working set, previous summaries aside (a summary is rewritten into the next, not removed)."""
    end = working_set_start(messages)
    return sum(
        count(m)
        for m in messages[:end]  # (None: all of them)
        if m.agent_visible and m.kind != KIND_COMPACTION_SUMMARY
    )


def working_set_start(messages: Sequence[Message]) -> int | None:
    """Index of the first message of the working set in ``messages`` (the model-facing context).

    It is the newest assistant message with tool calls when that message belongs to the current turn
    (it follows the turn's prompt), else the turn's prompt: the newest agent-visible user message that
    opens a turn. ``None`` when there is neither.
    """
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if not msg.agent_visible or msg.kind == KIND_STEER:  # steering joins the step it follows
            continue
        if msg.role == "assistant" and msg.tool_calls:
            return i
        if is_turn_start(msg):
            return i
    return None


# ---------------------------------------------------------------------------------------------------
# Clipping a step's results to fit


def working_set_budget(*, limit: int, fixed_tokens: int, call_tokens: int, config: CompactionConfig) -> int:
    """Tokens a step's tool results may take together: the effective limit less the system prompt and
    tools (``fixed_tokens``), the assistant message that made the calls, and room for a compaction
    summary of everything before them (a fifth of the limit, at most the summarizer's output cap)."""
    summary_room = min(config.summary_max_output_tokens, limit // 5)
    return limit - fixed_tokens - call_tokens - summary_room


class Clip(msgspec.Struct, frozen=True):
    """Clip result ``index`` (of the step's results) to ``max_chars`` characters, head and tail."""

    index: int
    max_chars: int


def plan_clips(sizes: Sequence[tuple[int, int]], budget: int) -> list[Clip]:
    """Which results to clip, and to how many characters, so that their tokens add up to ``budget``.

    ``sizes`` holds each result's (tokens, chars). The largest are cut first, to a common cap (water
    filling): results under the cap stay whole. A clipped result keeps at least ``MIN_CLIP_CHARS``; when
    even that cannot fit, the plan clips to the minimum and the caller finds the request still too big.
    The characters kept follow each result's own chars-per-token ratio, less 10% for the notice.
    """
    total = sum(tokens for tokens, _ in sizes)
    # A fast path, and no more: without it the plan below comes out empty all the same (everything fits
    # under the cap), so its mutants change nothing a caller sees.
    if total <= budget or not sizes:  # pragma: no mutate
        return []
    tokens_of = [tokens for tokens, _ in sizes]
    # Each clipped result also carries a notice: leave room for those. The count of results over the cap
    # only grows (more notices, a lower cap, more results over it), so it settles within len(sizes)
    # rounds: then the kept tokens and every notice fit the budget. (It used to stop after three rounds,
    # which now and then left a notice or two unaccounted for.) Rounds past the settling change nothing.
    # (Counting up from 1 comes to the same: here at least one result is over any cap, or all would fit.)
    clipped = 0  # pragma: no mutate
    for _ in range(len(sizes) + 1):  # pragma: no mutate
        cap = _common_cap(tokens_of, max(0, budget - clipped * CLIP_NOTICE_TOKENS))
        over = sum(t > cap for t in tokens_of)
        if over == clipped:
            break
        clipped = over
    clips: list[Clip] = []
    for index, (tokens, chars) in enumerate(sizes):
        if tokens <= cap:  # (the cap is never negative: no result of no tokens gets here)
            continue
        keep = max(MIN_CLIP_CHARS, int(chars * cap / tokens * 0.9))
        if keep < chars:
            clips.append(Clip(index, keep))
    return clips


def _common_cap(tokens: list[int], budget: int) -> int:
    """The largest cap c with sum(min(t, c)) <= budget."""
    ordered = sorted(tokens)
    remaining = budget
    for position, size in enumerate(ordered):
        share = remaining // (len(ordered) - position)
        if size > share:
            return share
        remaining -= size
    return ordered[-1] if ordered else 0


def clip_result(
    message: Message, max_chars: int, *, saved_path: str, sha256: str, reader: str | None = None
) -> Message:
    """``message`` (a tool result) with its text clipped to about ``max_chars`` characters, head and tail,
    and a notice naming the file that holds the full text: by its id (its file name) and the tool that reads
    it (``reader``) when the model has one, else by its path. The metadata records the clip."""
    text = message.text
    if len(text) <= max_chars:
        return message
    head = (max_chars + 1) // 2
    tail = max_chars - head
    if reader is not None:
        name = PureWindowsPath(saved_path).name  # (either separator)
        where = f'saved as "{name}" (SHA-256 {sha256}); read the middle in parts with {reader}(id="{name}").'
    else:
        where = f"saved at {saved_path} (SHA-256 {sha256}); read it in parts if you need the middle."
    notice = (
        f"[Tool output clipped to fit the context window: {len(text):,} chars → {max_chars:,} "
        f"(head and tail kept). The full output is {where}]"
    )
    clipped = (
        f"{text[:head]}\n[... {len(text) - max_chars:,} chars omitted ...]\n{text[-tail:] if tail else ''}"
    )
    metadata = {
        **message.metadata,
        "clipped": True,
        "clipped_from_chars": len(text),
        "clip_path": saved_path,
        "clip_sha256": sha256,
    }
    return msgspec.structs.replace(message, parts=(TextPart(f"{notice}\n{clipped}"),), metadata=metadata)


# ---------------------------------------------------------------------------------------------------
# Before each request


class StepDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What to do before a provider request: ``send`` it, ``compact`` first (with ``trigger``; an
    ``overflow`` compaction is an emergency one), or ``fail`` the turn with ``code`` and ``message``."""

    action: Literal["send", "compact", "fail"]
    trigger: CompactionTrigger | None = None
    code: str | None = None
    message: str | None = None


def turn_input_budget(configured: int | None, window: int) -> int:
    """The most input tokens one turn may send: ``agent.max_turn_input_tokens``, else 20 × the window."""
    return configured if configured is not None else TURN_BUDGET_WINDOWS * window


def decide_step(
    *,
    estimate: int,
    message_count: int,
    window: int,
    config: CompactionConfig,
    pending: CompactionTrigger | None,
    threshold_used: bool,
    overflow_used: bool,
    turn_input_tokens: int,
    turn_budget: int,
    tool_results_in_view: bool,
    compactable: Callable[[], int] | None = None,
) -> StepDecision:
    """The rules of design §5.13 for one request of a turn whose context is ``estimate`` tokens.

    1. A threshold compaction (or one asked for by a silent overflow, ``pending``) at most once per turn:
       whether or not it got under the threshold, the turn does not try again; the request goes out when
       it fits the effective limit (window − reserve).
    2. A request over the limit gets one emergency (``overflow``) compaction per turn, the same one a
       provider's overflow error would have caused; after it the turn ends with a clear error instead
       of sending a request known not to fit.
    3. A request that would take the turn's input tokens past ``turn_budget`` ends the turn
       (``turn_budget``) before it is sent.

    ``tool_results_in_view`` says the working set is a step's tool results (the error then names them).
    ``compactable`` gives the tokens a compaction could remove (the messages before the working set, a
    previous summary aside: it is rewritten, not removed); a compaction is only tried when they are at
    least the progress guard's share of the estimate (design §5.6), else it could only fail and cost a
    summarizer call. It is asked only when a compaction is due.
    """
    limit = effective_limit(window, config) or window
    due = pending is not None or should_compact(estimate, window, config, message_count)
    over = estimate > limit
    worth = (
        config.auto
        and (due or over)
        and (compactable is None or compactable() >= config.min_reduction * estimate)
    )
    if worth and due and not threshold_used:
        return StepDecision(action="compact", trigger=pending or "threshold")
    if worth and over and not overflow_used:
        return StepDecision(action="compact", trigger="overflow")
    # Without automatic compaction the provider judges what fits its window; a request over the window
    # is never sent.
    if estimate > (limit if config.auto else window):
        return StepDecision(
            action="fail",
            code=WORKING_SET_TOO_LARGE if tool_results_in_view else CONTEXT_OVERFLOW,
            message=_does_not_fit(estimate, window, limit, config.auto, tool_results_in_view),
        )
    if turn_input_tokens + estimate > turn_budget:
        return StepDecision(
            action="fail",
            code=TURN_BUDGET,
            message=(
                f"The turn stopped before its next request: it has sent {turn_input_tokens:,} input tokens, "
                f"and the next request (about {estimate:,}) would pass its budget of {turn_budget:,} "
                "(agent.max_turn_input_tokens, by default 20 × the context window). Nothing was lost; "
                "send another prompt to go on, or raise the budget."
            ),
        )
    return StepDecision(action="send")


def _does_not_fit(estimate: int, window: int, limit: int, auto: bool, tools: bool) -> str:
    what = (
        "the newest step's tool calls and results, which compaction keeps whole (their largest outputs "
        "were clipped, the full text saved on disk)"
        if tools
        else "the newest messages"
    )
    how = (
        "even after compacting everything else"
        if auto
        else "and automatic compaction is off for this session (compaction.auto)"
    )
    return (
        f"The next request (about {estimate:,} tokens) does not fit the model's context of {window:,} tokens "
        f"(at most {limit:,} after the output reserve) {how}: what is left is {what}. Nothing was lost; "
        "ask for smaller pieces of work, use a model with a larger window, or compact by hand."
    )


def prompt_too_large(*, prompt_tokens: int, fixed_tokens: int, window: int, limit: int) -> str | None:
    """Why a prompt cannot be sent at all (it alone, with the system prompt and tools, passes the
    effective limit), or ``None`` when it can."""
    if prompt_tokens + fixed_tokens <= limit:
        return None
    return (
        f"The prompt is about {prompt_tokens:,} tokens; with the system prompt and tools "
        f"({fixed_tokens:,}) it does not fit the model's context window of {window:,} tokens (at most "
        f"{limit:,} after the output reserve). It was not sent and not summarized: it stays in the "
        "session's record, hidden from the model. Send a shorter prompt, or put the content in a file for "
        "the agent to read in parts."
    )
