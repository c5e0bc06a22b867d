"""The context estimate (design §4.2), the compaction trigger (5.1) and the context breakdown (4.6). Pure.

One formula serves the compaction decision and the display, so the two can never disagree::

    estimate = last_input_tokens + last_output_tokens + count(messages added since that response)

"That response" is the newest assistant message in the model-facing context that carries usage, was
appended after the latest compaction (index >= ``usage_floor``) and did not end in ``aborted`` or
``error``. Without one (a new session, right after a compaction, only failed turns), the estimate is a
full count of system prompt + tools + messages, labelled estimated.

Everything here is a function of its arguments: no actors, no I/O. ``count`` is usually
``TokenCounter.count_message``, whose per-message cache makes a turn's estimate cost O(new messages).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

import msgspec

from runtime.config import CompactionConfig
from runtime.messages import Message

__all__ = [
    "ACTUAL",
    "ACTUAL_PLUS_ESTIMATE",
    "BACK_CALCULATED",
    "BASIS_FULL",
    "BASIS_LAST_RESPONSE",
    "CONFIGURED",
    "ESTIMATED",
    "MAX_COUNT_RATIO",
    "MIN_ANSWER_TOKENS",
    "MIN_RATIO_SAMPLE",
    "MIN_RESERVE_TOKENS",
    "RESERVE_TOKENS",
    "RESERVE_WINDOW_DIVISOR",
    "STAND_IN_COUNT_RATIO",
    "UNTRUSTED_STOP_REASONS",
    "ContextEstimate",
    "ContextStats",
    "CountRatio",
    "answer_cap",
    "answer_margin",
    "compaction_threshold",
    "context_stats",
    "effective_limit",
    "estimate_context",
    "last_response_index",
    "prompt_room",
    "reserve_tokens",
    "should_compact",
    "usable_response",
]


BASIS_LAST_RESPONSE: Final = "last_response"
BASIS_FULL: Final = "full"

# Stop reasons whose usage does not describe the context (design §4.2).
UNTRUSTED_STOP_REASONS: Final = frozenset({"aborted", "error"})

# Where each figure of ContextStats comes from.
ACTUAL: Final = "actual"  # the provider's own usage numbers
ESTIMATED: Final = "estimated"  # counted here
ACTUAL_PLUS_ESTIMATE: Final = "actual+estimated"  # the last actual usage plus counted new messages
BACK_CALCULATED: Final = "back_calculated"  # total minus the estimated parts
CONFIGURED: Final = "configured"  # from the compaction config and the model's window


class ContextEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """The estimated size of the next request's input, and how it was reached."""

    tokens: int
    estimated: bool  # True: a full count; False: anchored on the last response's actual usage
    last_input_tokens: int | None = None
    last_output_tokens: int | None = None
    new_messages_tokens: int = 0  # counted: the messages after the last response (all of them if none)
    basis: str = BASIS_FULL

    @property
    def anchored_tokens(self) -> int:
        """The part of :attr:`tokens` that is the provider's own count (the anchor's input and output); the
        rest was counted here, with a tokenizer that may not be the server's. 0 for a full count."""
        return 0 if self.estimated else max(0, self.tokens - self.new_messages_tokens)


def usable_response(msg: Message) -> bool:
    """Whether ``msg`` is a response whose usage can anchor the estimate."""
    return (
        msg.role == "assistant"
        and msg.usage is not None
        and msg.usage.input_tokens > 0
        and msg.stop_reason not in UNTRUSTED_STOP_REASONS
    )


def last_response_index(messages: Sequence[Message], usage_floor: int = 0) -> int | None:
    """Index of the newest usable response at or after ``usage_floor``; None when there is none.

    Scans backwards, so the cost is the number of messages since that response.
    """
    floor = max(0, usage_floor)
    for i in range(len(messages) - 1, floor - 1, -1):
        if usable_response(messages[i]):
            return i
    return None


def estimate_context(
    messages: Sequence[Message],
    *,
    count: Callable[[Message], int],
    system_tokens: int,
    tools_tokens: int,
    usage_floor: int = 0,
) -> ContextEstimate:
    """The estimated input size of a request made now (design §4.2).

    ``messages`` is the model-facing context (a compaction summary first when there is one);
    ``usage_floor`` the index of its first message appended after the latest compaction. Messages that
    are not agent-visible are not sent, so they are not counted.
    """
    anchor = last_response_index(messages, usage_floor)
    if anchor is None:
        body = sum(count(m) for m in messages if m.agent_visible)
        return ContextEstimate(
            tokens=system_tokens + tools_tokens + body,
            estimated=True,
            new_messages_tokens=body,
            basis=BASIS_FULL,  # pragma: no mutate (the field's default: said for the reader)
        )
    usage = messages[anchor].usage
    assert usage is not None  # usable_response checked it
    new = 0
    for i in range(anchor + 1, len(messages)):
        if messages[i].agent_visible:
            new += count(messages[i])
    return ContextEstimate(
        tokens=usage.input_tokens + usage.output_tokens + new,
        estimated=False,
        last_input_tokens=usage.input_tokens,
        last_output_tokens=usage.output_tokens,
        new_messages_tokens=new,
        basis=BASIS_LAST_RESPONSE,
    )


# ---------------------------------------------------------------------------------------------------
# The compaction trigger (design §5.1)


RESERVE_TOKENS: Final = 16_384
"""The automatic reserve (design §5.1) of a large window: room for a long answer (an eighth of 131,072)."""
RESERVE_WINDOW_DIVISOR: Final = 8
"""The automatic reserve is at most this fraction of the window: a small window keeps the same share for its
answer as a large one, instead of giving half of itself to it (a 32,000 window compacting at 12,800)."""
MIN_RESERVE_TOKENS: Final = 1_024
"""... and at least this (at most half the window): room for one answer or tool call whatever the window,
and for the error of a count made with another model's tokenizer (a tiny window's reserve is as before)."""


def reserve_tokens(window: int, config: CompactionConfig) -> int:
    """The output buffer kept free below the window (design §5.1): automatically :data:`RESERVE_TOKENS`, at
    most an eighth of the window but at least :data:`MIN_RESERVE_TOKENS`; a configured ``reserve_tokens`` as
    it is. Either at most half the window (so a small model still has room for a conversation)."""
    if config.reserve_tokens is None:
        reserve = max(MIN_RESERVE_TOKENS, min(RESERVE_TOKENS, window // RESERVE_WINDOW_DIVISOR))
    else:
        reserve = config.reserve_tokens
    return min(reserve, window // 2)


MIN_ANSWER_TOKENS: Final = 32
"""The smallest answer a request asks for: a prompt that leaves less is the overflow path's business."""


STAND_IN_COUNT_RATIO: Final = 1.25
"""What a server's tokenizer is assumed to count per token counted here until the session has measured it,
when the count is a stand-in (cl100k for a model that is not OpenAI's). Measured: SmolLM2's tokenizer counts
1.14-1.26 × cl100k (llama.cpp's usage against our estimates, real tier); other tokenizers were not measured
here, and a session learns its own ratio from its first reply (:class:`CountRatio`)."""
MIN_RATIO_SAMPLE: Final = 256
"""A reply teaches the count ratio only when at least this many tokens of its request were counted here: a
few counted tokens beside the provider's anchor say nothing about the tokenizer (framing noise)."""
MAX_COUNT_RATIO: Final = 2.0
"""The highest ratio learned (a provider that adds a hidden prompt must not shrink answers to nothing)."""


class CountRatio:
    """A session's learned ratio of the server's prompt count to ours (design §4.5), for the answer cap.

    Each reply with usage tells what the server counted for a request whose estimate had ``counted`` tokens
    counted here on top of an ``anchored`` part that was the provider's own: (actual − anchored) ÷ counted.
    The highest seen is kept (between 1/2 and :data:`MAX_COUNT_RATIO`): the ratio varies with the text (prose,
    code, JSON), and an answer cap too large is refused where one a little short only stops early.
    ``default`` stands until a reply has taught it (:data:`STAND_IN_COUNT_RATIO` for a stand-in tokenizer).
    """

    __slots__ = ("_learned", "default")

    def __init__(self, default: float = 1.0, *, learned: float | None = None) -> None:
        self.default = default
        self._learned: float | None = learned  # (a ratio learned before, as a restarted agent had it)

    @property
    def value(self) -> float:
        """The ratio to apply: the learned one, or the default while nothing was learned."""
        return self.default if self._learned is None else self._learned

    @property
    def learned(self) -> bool:
        """Whether a reply has taught the ratio."""
        return self._learned is not None

    def observe(self, *, actual_input: int, estimate: int, counted: int) -> None:
        """A reply's ``usage.input_tokens`` (``actual_input``) for a request estimated at ``estimate``
        tokens, ``counted`` of them counted here (the rest the provider's own count)."""
        if counted < MIN_RATIO_SAMPLE or actual_input <= 0 or counted > estimate:
            return
        ratio = (actual_input - (estimate - counted)) / counted
        ratio = min(MAX_COUNT_RATIO, max(0.5, ratio))
        self._learned = ratio if self._learned is None else max(self._learned, ratio)


def answer_margin(
    window: int, counted_tokens: int = 0, count_ratio: float = 1.0, *, fixed: int | None = None
) -> int:
    """The tokens a request keeps free below the window for the estimate's error (design §4.5): a sixteenth
    of the window (at least 16; ``fixed`` instead, for a request with a margin of its own), or, when more,
    what the server's tokenizer is expected to count beyond ours over the ``counted_tokens`` counted here
    (× ``count_ratio`` − 1), plus a 64th of the window (at least 16) for the ratio's own drift. The
    provider's own part of the estimate has no such error."""
    floor = max(16, window // 16) if fixed is None else fixed
    excess = max(0, math.ceil(max(0, counted_tokens) * (count_ratio - 1.0)))  # (a server counting less: 0)
    return max(floor, excess + max(16, window // 64))


def prompt_room(
    window: int, answer_tokens: int, count_ratio: float = 1.0, *, fixed: int | None = None
) -> int:
    """The most tokens, all counted here, a request's prompt may take when it asks for ``answer_tokens``:
    the prompt, the answer and :func:`answer_margin` over that prompt fit ``window`` (the server counting
    the prompt ``count_ratio`` × ours). The converse of :func:`answer_cap` for a prompt counted here in
    full (the summarizer's, design §5.4); when even an empty prompt does not fit, how far short it is (< 0)."""
    free = window - answer_tokens

    def over(prompt: int) -> int:
        return prompt + answer_margin(window, prompt, count_ratio, fixed=fixed) - free

    if over(0) > 0:  # pragma: no mutate (at over(0) == 0 the search gives the same 0)
        return -over(0)
    low, high = 0, free  # over(low) <= 0 < over(free): the margin is at least 16
    while low < high:  # the prompt plus its margin grows with the prompt: the largest that fits
        mid = (low + high + 1) // 2  # pragma: no mutate (any mid in (low, high] finds the same)
        if over(mid) <= 0:
            low = mid
        else:
            high = mid - 1
    return low


def answer_cap(
    *,
    window: int | None,
    prompt_tokens: int,
    configured: int | None = None,
    model_max: int | None = None,
    counted_tokens: int = 0,
    count_ratio: float = 1.0,
) -> int | None:
    """The ``max_tokens`` of a request (design §4.5): the configured or the model's output limit, and never
    more than the room the window leaves after the prompt, so a model stops with ``length`` instead of
    running into the end of its context, and a server that refuses prompt + ``max_tokens`` > window (vLLM,
    SGLang, OpenAI, Anthropic) never refuses it. The room keeps :func:`answer_margin` for the estimate's
    error: ``counted_tokens`` of ``prompt_tokens`` were counted here, with a tokenizer that need not be the
    server's (it counts ``count_ratio`` × ours). ``window`` None (unknown): only the output limits. None: ask
    for nothing (the provider's default)."""
    limits = [n for n in (configured, model_max) if n is not None and n > 0]
    if window is not None and window > 0:
        margin = answer_margin(window, min(counted_tokens, max(0, prompt_tokens)), count_ratio)
        room = window - max(0, prompt_tokens) - margin
        limits.append(max(MIN_ANSWER_TOKENS, room))
    return min(limits) if limits else None


def effective_limit(window: int | None, config: CompactionConfig) -> int | None:
    """The context size compaction keeps below: window − reserve; ``max_tokens`` when the window is
    unknown. A configured ``max_tokens`` also caps a known window's limit. None: no token limit."""
    if window is None or window <= 0:
        return config.max_tokens
    limit = window - reserve_tokens(window, config)
    if config.max_tokens is not None:
        limit = min(limit, config.max_tokens)
    return limit


def compaction_threshold(window: int | None, config: CompactionConfig) -> int | None:
    """The estimate, in tokens, at which automatic compaction triggers: ``threshold × limit``."""
    limit = effective_limit(window, config)
    return None if limit is None else int(limit * config.threshold)


def should_compact(
    estimate: int | ContextEstimate, window: int | None, config: CompactionConfig, message_count: int = 0
) -> bool:
    """Whether automatic compaction is due: auto is on and the estimate reached the threshold, or the
    context holds at least ``max_messages`` messages (the message-count trigger, off by default)."""
    if not config.auto:
        return False
    tokens = estimate.tokens if isinstance(estimate, ContextEstimate) else estimate
    threshold = compaction_threshold(window, config)
    if threshold is not None and tokens >= threshold:
        return True
    return config.max_messages is not None and message_count >= config.max_messages


# ---------------------------------------------------------------------------------------------------
# The breakdown (design §4.6)


class ContextStats(msgspec.Struct, frozen=True, kw_only=True):
    """How full a session's context is, and what it is made of (design §4.6).

    ``total`` is the same estimate the compaction trigger uses. The system prompt and tools are always
    estimated; ``messages`` is back-calculated (total − system − tools) so the parts add up to the total,
    floored at 0 with ``messages_floored`` set when the estimates of the other parts exceed the total.
    ``sources`` says for each figure whether it is actual, estimated, back-calculated or configured.
    """

    window: int
    total: int
    estimated: bool
    basis: str
    system_prompt: int
    tools: int
    messages: int
    messages_floored: bool
    last_input_tokens: int | None
    last_output_tokens: int | None
    new_messages_tokens: int
    reserve: int
    limit: int | None
    free: int
    compaction_threshold: int | None
    will_compact: bool
    message_count: int
    last_estimate_error: float | None = None
    calibration_ratio: float | None = None
    sources: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def percent(self) -> float:
        """The total as a percentage of the window."""
        return 100.0 * self.total / self.window if self.window > 0 else 0.0


def context_stats(
    messages: Sequence[Message],
    *,
    count: Callable[[Message], int],
    system_tokens: int,
    tools_tokens: int,
    window: int,
    config: CompactionConfig,
    usage_floor: int = 0,
    last_error: float | None = None,
    calibration_ratio: float | None = None,
) -> ContextStats:
    """The breakdown of design §4.6, built on :func:`estimate_context` and :func:`should_compact`.

    ``last_error`` is the relative error of the last estimate ((estimated − actual) ÷ actual) and
    ``calibration_ratio`` the running actual ÷ estimated ratio, both from the usage tracker.
    """
    est = estimate_context(
        messages, count=count, system_tokens=system_tokens, tools_tokens=tools_tokens, usage_floor=usage_floor
    )
    back = est.tokens - system_tokens - tools_tokens
    reserve = max(0, reserve_tokens(window, config))  # (none for an unknown window of 0)
    if est.estimated:
        total_source = ESTIMATED
    else:
        total_source = ACTUAL if est.new_messages_tokens == 0 else ACTUAL_PLUS_ESTIMATE
    return ContextStats(
        window=window,
        total=est.tokens,
        estimated=est.estimated,
        basis=est.basis,
        system_prompt=system_tokens,
        tools=tools_tokens,
        messages=max(0, back),
        messages_floored=back < 0,
        last_input_tokens=est.last_input_tokens,
        last_output_tokens=est.last_output_tokens,
        new_messages_tokens=est.new_messages_tokens,
        reserve=reserve,
        limit=effective_limit(window, config),
        free=max(0, window - est.tokens - reserve),
        compaction_threshold=compaction_threshold(window, config),
        will_compact=should_compact(est, window, config, len(messages)),
        message_count=len(messages),
        last_estimate_error=last_error,
        calibration_ratio=calibration_ratio,
        sources={
            "total": total_source,
            "system_prompt": ESTIMATED,
            "tools": ESTIMATED,
            "messages": ESTIMATED if est.estimated else BACK_CALCULATED,
            "last_input_tokens": ACTUAL,
            "last_output_tokens": ACTUAL,
            "new_messages_tokens": ESTIMATED,
            "reserve": CONFIGURED,
            "compaction_threshold": CONFIGURED,
        },
    )
