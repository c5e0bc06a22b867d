"""Compaction, the pure part (design §5.2-5.8): where to cut, what to ask the summarizer, what comes out.

Sans-I/O in three steps, so the compactor actor only moves data:

1. :func:`plan_compaction` picks the cut (:func:`~runtime.context.cut.find_cut_point`), splits the history
   into the summarized and the kept part, and has the isolated summarizer calls built
   (:mod:`runtime.context.summary_requests`), each clipped so that it fits the summarizer model's own window.
2. The actor sends the requests to the model and collects the answers (``None`` for a failed call).
3. :func:`finish_compaction` turns the answers into the summary message and the new context, falls back to
   a deterministic summary where allowed, and applies the progress guard (design §5.6).

``messages`` everywhere is the model-facing conversation without the system prompt, oldest first; when the
session was compacted before, it starts with the previous summary message. Token counts come only from the
caller's ``count`` (a message counter, e.g. the usage tracker's cached tiktoken counter); messages hidden
from the model (``agent_visible=False``) cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from runtime.config import CompactionConfig
from runtime.context.cut import CountTokens, CutPoint, find_cut_point, is_summary, is_turn_start
from runtime.context.estimate import effective_limit
from runtime.context.file_ops import FileOps, extract_file_ops
from runtime.context.prompts import SPLIT_TURN_HEADING, clip_head_tail, summary_body, summary_message_text
from runtime.context.summary_requests import (
    WINDOW_MARGIN_FRACTION,
    WINDOW_MARGIN_TOKENS,
    CountText,
    RequestKind,
    SummaryRequest,
    SummaryRequestBuilder,
    approx_tokens,
)
from runtime.events import CompactionMode, CompactionTrigger
from runtime.messages import KIND_COMPACTION_SUMMARY, Message, TextPart

__all__ = [
    "CHARS_PER_OUTPUT_TOKEN",
    "FALLBACK_REQUEST_CHARS",
    "OPEN_REQUEST_CHARS",
    "CompactionFailure",
    "CompactionPlan",
    "CompactionResult",
    "NothingToCompact",
    "fallback_summary",
    "finish_compaction",
    "keep_recent_budget",
    "plan_compaction",
    "summary_room",
]

# A model asked for N output tokens rarely writes more than ~4 chars each; allow 6 before clipping, so a
# provider that ignores max_tokens cannot hand us a summary that defeats the point of compacting.
CHARS_PER_OUTPUT_TOKEN: Final = 6
# A deterministic (fallback) summary quotes the last user request and the previous summary, clipped.
FALLBACK_REQUEST_CHARS: Final = 600
# The request of a turn the cut falls inside is carried into the summary verbatim, up to this many chars.
OPEN_REQUEST_CHARS: Final = 4_000
# A summary is never bounded below this many tokens, however little room the context leaves it: below it
# a summary says nothing, and the request it would go in cannot be sent anyway.
MIN_SUMMARY_TOKENS: Final = 64
# Below this many characters a clipped summary body says nothing: the whole summary is clipped instead.
MIN_SUMMARY_BODY_CHARS: Final = 200


# ---------------------------------------------------------------------------------------------------
# Data


class CompactionPlan(msgspec.Struct, frozen=True):
    """What a compaction will do, before the summarizer runs.

    ``history`` + ``turn_prefix`` are the summarized messages (``history`` starts with the previous summary
    when there is one) and ``kept`` the rest: together they are the input, in order. ``requests`` are the
    summarizer calls to make, in order; :func:`finish_compaction` takes one answer per request.
    """

    mode: CompactionMode
    trigger: CompactionTrigger
    cut: CutPoint | None
    history: list[Message]
    turn_prefix: list[Message]
    kept: list[Message]
    requests: list[SummaryRequest]
    previous_summary: Message | None
    file_ops: FileOps
    config: CompactionConfig
    open_request: Message | None = None  # the prompt of a turn the cut falls inside, carried verbatim
    summary_tokens: int | None = None  # the most the summary may take in the context (None: no bound)

    @property
    def summarized(self) -> list[Message]:
        """Every message the summary replaces, in order."""
        return self.history + self.turn_prefix

    @property
    def first_kept_id(self) -> str | None:
        """Id of the first kept message; ``None`` when the summary replaces everything (hard reset)."""
        return self.kept[0].id if self.kept else None

    @property
    def messages_before(self) -> int:
        return len(self.history) + len(self.turn_prefix) + len(self.kept)

    @property
    def summarizer_input(self) -> str:
        """Every request's prompt, for the summarizer-input artifact (design §2.3)."""
        return "\n\n".join(f"=== {r.kind} ===\n{r.prompt}" for r in self.requests)


class CompactionResult(msgspec.Struct, frozen=True):
    """A compaction to record: ``summary`` replaces every message before ``first_kept_id``.

    ``messages`` is the new model-facing conversation (the summary, then the kept messages).
    ``fallback`` says a deterministic summary stood in for a failed summarizer call.
    """

    summary: Message
    first_kept_id: str | None
    messages: list[Message]
    mode: CompactionMode
    trigger: CompactionTrigger
    messages_before: int
    tokens_before: int
    tokens_after: int
    summarized_count: int
    fallback: bool
    file_ops: FileOps
    # The summary as written, when it had to be clipped to fit the context (``summary`` holds the clipped
    # text): it is what the compaction's summary artifact keeps.
    unclipped_summary: str | None = None

    @property
    def messages_after(self) -> int:
        return len(self.messages)

    @property
    def summary_chars(self) -> int:
        return len(self.summary.text)


class CompactionFailure(msgspec.Struct, frozen=True):
    """A compaction that must be discarded. The history is unchanged.

    ``reason`` is ``no_progress`` (the progress guard, design §5.6) or ``summarizer_failed`` (no answer and no
    fallback allowed). ``context_exceeded`` says the context is already over the limit, so the session
    cannot continue as it is (in hard-reset mode it is dead: design §5.8).
    """

    reason: Literal["no_progress", "summarizer_failed"]
    message: str
    context_exceeded: bool
    mode: CompactionMode
    trigger: CompactionTrigger
    tokens_before: int
    tokens_after: int | None = None


class NothingToCompact(msgspec.Struct, frozen=True):
    """The history offers nothing worth compacting (e.g. it all fits in the kept budget)."""

    reason: str


# ---------------------------------------------------------------------------------------------------
# Budgets


def summary_room(limit: int | None, fixed_tokens: int) -> int | None:
    """The most tokens a summary and the messages kept after it may take so that the next request still
    fits ``limit`` (the effective context limit) beside the system prompt and tools (``fixed_tokens``),
    with the margin the summarizer's requests also keep. ``None`` when the context has no limit."""
    if limit is None:
        return None
    return limit - fixed_tokens - WINDOW_MARGIN_TOKENS - int(limit * WINDOW_MARGIN_FRACTION)


def keep_recent_budget(
    window: int | None,
    config: CompactionConfig,
    *,
    emergency: bool = False,
    override: int | None = None,
) -> int:
    """The token budget of the kept recent messages (design §5.2, 6.3).

    ``override`` (manual compaction) wins; otherwise ``config.keep_recent_tokens``, else window/4, else
    ``default_keep_recent_tokens`` when the window is unknown. An emergency keeps at most
    window/``emergency_keep_divisor``. The result is clamped to half the effective limit.
    """
    if override is not None:
        keep = override
    elif config.keep_recent_tokens is not None:
        keep = config.keep_recent_tokens
    elif window:
        keep = window // 4
    else:
        keep = config.default_keep_recent_tokens
    if emergency and window:
        keep = min(keep, window // config.emergency_keep_divisor)
    limit = effective_limit(window, config)
    if limit:
        keep = min(keep, limit // 2)
    return max(1, keep)


# ---------------------------------------------------------------------------------------------------
# Planning (design §5.4, 5.8)


def plan_compaction(
    messages: Sequence[Message],
    *,
    trigger: CompactionTrigger,
    keep_tokens: int,
    count: CountTokens,
    config: CompactionConfig,
    mode: CompactionMode | None = None,
    force: bool = False,
    previous_file_ops: FileOps | None = None,
    instructions: str | None = None,
    summarizer_window: int | None = None,
    count_text: CountText | None = None,
    keep_from: int | None = None,
    room: int | None = None,
    cached_prefix: int | None = None,
    count_ratio: float = 1.0,
) -> CompactionPlan | NothingToCompact:
    """Plan a compaction of ``messages`` (see the module docstring for the three steps).

    ``mode`` defaults to ``config.mode``. ``summarize`` and ``truncate`` keep the newest ``keep_tokens``
    (:func:`find_cut_point`, with ``force``); ``hard_reset`` summarizes everything. ``truncate`` makes no
    requests. ``previous_file_ops`` defaults to the previous summary's metadata. ``instructions`` are the
    focus of a manual compaction. With ``summarizer_window``, every request is clipped so that its system
    prompt, prompt and ``max_tokens`` fit in it, with a margin. Transcript blocks are valued with ``count``
    (plus their labels), so ``count`` must cover a message's text, reasoning and tool calls in the same
    tokenizer as ``count_text`` (the usage tracker's counter does); instructions and clipped blocks are
    measured with ``count_text`` (default: a conservative character-based estimate). ``keep_from`` is the
    start of the working set, never summarized (design §5.13): automatic compactions pass it, in every mode
    (a ``hard_reset`` then summarizes everything before it). ``room`` (see :func:`summary_room`) bounds the
    summary: what the kept messages leave of it, at least :data:`MIN_SUMMARY_TOKENS`, caps the summarizer's
    ``max_tokens``, and :func:`finish_compaction` clips a longer answer to it, so a compaction never makes
    the next request too large to send. ``cached_prefix`` (the tokens of the session's system prompt and
    tools) says the summarizer is the session's own model: each request then sends the conversation itself
    and a final instruction (:func:`cached_summary_prompt`), so the provider reads it from its cache, where
    it fits the summarizer's window; a request that does not fit is a transcript as without it.
    ``count_ratio`` is what the summarizer's server counts per token counted here (the session's learned
    :class:`~runtime.context.estimate.CountRatio` for its own model): a request fits when that count of its
    prompt, its ``max_tokens`` and the margin do (:func:`~runtime.context.estimate.prompt_room`), the rule
    the turn's requests keep (design §4.5).
    """
    mode = mode or config.mode
    msgs = list(messages)
    cut: CutPoint | None = None
    if mode == "hard_reset":
        end = len(msgs) if keep_from is None else keep_from
        if all(is_summary(m) for m in msgs[:end]):
            return NothingToCompact("nothing to summarize besides the previous summary and the working set")
        history, prefix, kept = msgs[:end], [], msgs[end:]
    else:
        cut = find_cut_point(
            msgs,
            keep_tokens=keep_tokens,
            count=count,
            force=force,
            force_keep=config.force_keep_messages,
            split_turn_min_messages=config.split_turn_min_messages,
            keep_from=keep_from,
        )
        if cut is None:
            what = "the working set" if keep_from is not None else f"the newest {keep_tokens} tokens"
            return NothingToCompact(f"nothing to compact outside {what}")
        kept = msgs[cut.index :]
        if cut.split_turn_start is not None:
            history, prefix = msgs[: cut.split_turn_start], msgs[cut.split_turn_start : cut.index]
        else:
            history, prefix = msgs[: cut.index], []

    previous = history[0] if history and is_summary(history[0]) else None
    if previous_file_ops is None:
        previous_file_ops = FileOps.from_metadata(previous.metadata) if previous else FileOps()
    file_ops = previous_file_ops.merge(extract_file_ops(history + prefix))

    summary_tokens = None
    if room is not None:
        kept_tokens = sum(count(m) for m in kept if m.agent_visible)
        summary_tokens = max(MIN_SUMMARY_TOKENS, room - kept_tokens)
    requests: list[SummaryRequest] = []
    if mode != "truncate":
        builder = SummaryRequestBuilder(
            config,
            summarizer_window,
            count,
            count_text or approx_tokens,
            instructions,
            summary_tokens,
            count_ratio,
        )
        new_history = history[1:] if previous else history
        if new_history:
            kind: RequestKind = "update" if previous else "history"
            previous_text = summary_body(previous.text) if previous else None
            requests += builder.cached(kind, history, cached_prefix) or builder.build(
                kind, new_history, previous_text
            )
        if prefix:
            requests += builder.cached("turn_prefix", history + prefix, cached_prefix) or builder.build(
                "turn_prefix", prefix, None
            )
    return CompactionPlan(
        mode=mode,
        trigger=trigger,
        cut=cut,
        history=history,
        turn_prefix=prefix,
        kept=kept,
        requests=requests,
        previous_summary=previous,
        file_ops=file_ops,
        config=config,
        open_request=_open_request(history + prefix, kept),
        summary_tokens=summary_tokens,
    )


def _open_request(summarized: list[Message], kept: list[Message]) -> Message | None:
    """The prompt of the turn the kept part begins inside, when it is summarized: the model must still
    read the request it is working on (a split turn's summary alone loses its wording)."""
    if not kept or is_turn_start(kept[0]):
        return None
    prompt = next((m for m in reversed(summarized) if is_turn_start(m)), None)
    return prompt if prompt is not None and prompt.agent_visible else None


# ---------------------------------------------------------------------------------------------------
# Finishing (design §5.3-5.6, 5.8)


def finish_compaction(
    plan: CompactionPlan,
    answers: Sequence[str | None],
    *,
    count: CountTokens,
    tokens_before: int | None = None,
    limit: int | None = None,
    kept_at: str | None = None,
) -> CompactionResult | CompactionFailure:
    """Turn the summarizer's ``answers`` (one per request, ``None`` when a call failed) into the result.

    Split-turn summaries are joined; a missing answer becomes the deterministic ``[Compacted N messages:
    ...]`` summary of its part when fallback is allowed (never in ``hard_reset``). ``tokens_before`` is the
    caller's estimate of the context (default: the messages' count); the new estimate is that minus the
    summarized messages plus the summary. A result that does not reduce it by ``config.min_reduction`` is a
    ``no_progress`` failure. ``limit`` (the effective context limit) decides ``context_exceeded``.

    Each part is clipped to what its request's ``max_tokens`` allowed, and the whole to the plan's
    ``summary_tokens`` (its body first, head and tail kept); ``unclipped_summary`` then holds the summary
    as written, and the clips' markers name ``kept_at``, where the caller saves it.
    """
    if len(answers) != len(plan.requests):
        raise ValueError(f"expected {len(plan.requests)} answers (one per request), got {len(answers)}")
    config = plan.config
    summarized = plan.summarized
    removed = sum(count(m) for m in summarized if m.agent_visible)
    if tokens_before is None:
        tokens_before = removed + sum(count(m) for m in plan.kept if m.agent_visible)
    over_limit = limit is not None and tokens_before > limit

    def fail(
        reason: Literal["no_progress", "summarizer_failed"], why: str, after: int | None
    ) -> CompactionFailure:
        if over_limit:
            # Only hard_reset ends a session (design §5.8); otherwise the turn ends and the session goes on.
            end = " Please start a new session." if plan.mode == "hard_reset" else " The session goes on."
            why = f"Context limit exceeded and compaction failed: {why}{end}"
        return CompactionFailure(reason, why, over_limit, plan.mode, plan.trigger, tokens_before, after)

    by_kind: dict[str, str | None] = {r.kind: a for r, a in zip(plan.requests, answers)}
    allow_fallback = plan.mode == "truncate" or (config.fallback and plan.mode != "hard_reset")
    used_fallback = False
    where = f"; all of it is in {kept_at}" if kept_at else ""
    label = f"characters of the summary (cut to fit the context{where})"
    parts: list[str] = []  # as the summarizer wrote them
    fitted: list[str] = []  # each clipped to what its request allowed
    for kind, msgs in _parts(plan):
        if kind == "carry":
            assert plan.previous_summary is not None
            answer: str | None = summary_body(plan.previous_summary.text)
        else:
            answer = summary_body(by_kind.get(kind) or "") or None
        if answer is None:
            if not allow_fallback:
                off = "hard_reset mode has no fallback" if plan.mode == "hard_reset" else "fallback is off"
                return fail("summarizer_failed", f"the summarizer gave no summary ({off}).", None)
            used_fallback = used_fallback or plan.mode != "truncate"
            answer = fallback_summary(msgs, plan.previous_summary if kind != "turn_prefix" else None)
        heading = f"{SPLIT_TURN_HEADING}\n\n" if kind == "turn_prefix" else ""
        parts.append(heading + answer)
        fitted.append(heading + clip_head_tail(answer, _part_chars(plan, kind), label=label))

    request = plan.open_request
    current = clip_head_tail(request.text.strip(), OPEN_REQUEST_CHARS) if request is not None else ""
    body, files = "\n\n".join(fitted), plan.file_ops.render()
    metadata = plan.file_ops.to_metadata()

    def message(text: str) -> Message:
        return Message(role="user", parts=(TextPart(text),), kind=KIND_COMPACTION_SUMMARY, metadata=metadata)

    written = summary_message_text("\n\n".join(parts), files, current)
    if plan.summary_tokens is None:
        text = summary_message_text(body, files, current)
    else:
        measure = lambda t: count(message(t))  # noqa: E731
        text = _fit_summary(body, files, current, plan.summary_tokens, measure, label=label)
    summary = message(text)
    tokens_after = max(0, tokens_before - removed + count(summary))
    if tokens_after > (1.0 - config.min_reduction) * tokens_before:
        why = (
            f"the compaction would only take the context from {tokens_before} to {tokens_after} tokens "
            f"(less than the required {config.min_reduction:.0%} reduction), so it was discarded."
        )
        return fail("no_progress", why, tokens_after)
    return CompactionResult(
        summary=summary,
        first_kept_id=plan.first_kept_id,
        messages=[summary, *plan.kept],
        mode=plan.mode,
        trigger=plan.trigger,
        messages_before=plan.messages_before,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        summarized_count=len(summarized),
        fallback=used_fallback,
        file_ops=plan.file_ops,
        unclipped_summary=written if text != written else None,
    )


def _fit_summary(body: str, files: str, current: str, tokens: int, measure: CountText, *, label: str) -> str:
    """The summary message's text in at most ``tokens`` (as ``measure`` counts it): the body is clipped
    head and tail first, the file blocks and the current request kept; only when the body has too little
    left to say anything is the whole text clipped."""
    full = summary_message_text(body, files, current)
    text, size = full, measure(full)
    body_chars, chars = len(body), len(full)
    while size > tokens and chars > 0:
        drop = max(1, len(text) - int(len(text) * tokens / size * 0.9))
        body_chars, chars = body_chars - drop, chars - drop
        if body_chars >= MIN_SUMMARY_BODY_CHARS:
            text = summary_message_text(clip_head_tail(body, body_chars, label=label), files, current)
        else:
            text = clip_head_tail(full, max(0, chars), label=label)
        size = measure(text)
    return text


def _parts(plan: CompactionPlan) -> list[tuple[str, list[Message]]]:
    """The summary's parts in order: the history (a request kind, or ``carry`` when only the previous
    summary is there to carry over) and the beginning of a split turn."""
    parts: list[tuple[str, list[Message]]] = []
    new_history = plan.history[1:] if plan.previous_summary is not None else plan.history
    if new_history:
        parts.append(("update" if plan.previous_summary is not None else "history", new_history))
    elif plan.previous_summary is not None:
        parts.append(("carry", []))
    if plan.turn_prefix:
        parts.append(("turn_prefix", plan.turn_prefix))
    return parts


def _part_chars(plan: CompactionPlan, kind: str) -> int:
    """The most characters a part of the summary may have: what its request's ``max_tokens`` allows."""
    request = next((r for r in plan.requests if r.kind == kind), None)
    tokens = request.max_tokens if request else plan.config.summary_max_output_tokens
    return tokens * CHARS_PER_OUTPUT_TOKEN


def fallback_summary(messages: Sequence[Message], previous: Message | None = None) -> str:
    """The deterministic summary (design §5.5): ``[Compacted N messages: ...]`` with role counts, the last
    user request and the previous summary, clipped. (File lists are appended to every summary.)"""
    new = [m for m in messages if not is_summary(m)]
    roles = {"user": 0, "assistant": 0, "tool": 0, "system": 0}
    for msg in new:
        roles[msg.role] += 1
    counts = ", ".join(
        f"{n} {label}"
        for label, n in (
            ("user", roles["user"]),
            ("assistant", roles["assistant"]),
            ("tool results", roles["tool"]),
            ("system", roles["system"]),
        )
        if n
    )
    lines = [f"[Compacted {len(new)} messages: {counts or 'none'}]"]
    last_request = next((m for m in reversed(new) if is_turn_start(m) and m.text.strip()), None)
    if last_request is not None:
        quoted = clip_head_tail(last_request.text.strip(), FALLBACK_REQUEST_CHARS)
        lines.append(f"Last user request in the compacted part:\n{quoted}")
    if previous is not None:
        earlier = summary_body(previous.text)
        if earlier:
            lines.append(f"Earlier summary:\n{earlier}")
    return "\n\n".join(lines)
