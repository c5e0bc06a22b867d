"""Compaction, the pure part (design §5.2-5.8): where to cut, what to ask the summarizer, what comes out.

Sans-I/O in three steps, so the compactor actor only moves data:

1. :func:`plan_compaction` picks the cut (:func:`find_cut_point`), splits the history into the summarized
   and the kept part, and builds the isolated summarizer calls (:class:`SummaryRequest`), each clipped so
   that it fits the summarizer model's own window.
2. The actor sends the requests to the model and collects the answers (``None`` for a failed call).
3. :func:`finish_compaction` turns the answers into the summary message and the new context, falls back to
   a deterministic summary where allowed, and applies the progress guard (design §5.6).

``messages`` everywhere is the model-facing conversation without the system prompt, oldest first; when the
session was compacted before, it starts with the previous summary message. Token counts come only from the
caller's ``count`` (a message counter, e.g. the usage tracker's cached tiktoken counter); messages hidden
from the model (``agent_visible=False``) cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final, Literal

import msgspec

from runtime.config import CompactionConfig
from runtime.context.estimate import effective_limit, prompt_room
from runtime.context.file_ops import FileOps, extract_file_ops
from runtime.context.prompts import (
    SPLIT_TURN_HEADING,
    SUMMARIZER_SYSTEM,
    TranscriptPiece,
    cached_summary_prompt,
    clip_head_tail,
    join_pieces,
    render_message,
    summary_body,
    summary_message_text,
    summary_request_prompt,
    transcript_pieces,
)
from runtime.events import CompactionMode, CompactionTrigger
from runtime.messages import (
    KIND_COMPACTION_SUMMARY,
    KIND_TOOL_SUMMARY,
    Message,
    TextPart,
    ToolCallPart,
)

__all__ = [
    "CHARS_PER_OUTPUT_TOKEN",
    "FALLBACK_REQUEST_CHARS",
    "OPEN_REQUEST_CHARS",
    "WINDOW_MARGIN_FRACTION",
    "WINDOW_MARGIN_TOKENS",
    "CompactionFailure",
    "CompactionPlan",
    "CompactionResult",
    "CountText",
    "CountTokens",
    "CutPoint",
    "NothingToCompact",
    "RequestKind",
    "SummaryRequest",
    "approx_tokens",
    "fallback_summary",
    "find_cut_point",
    "finish_compaction",
    "is_summary",
    "is_turn_start",
    "keep_recent_budget",
    "plan_compaction",
    "summary_room",
]


CountTokens = Callable[[Message], int]
CountText = Callable[[str], int]
RequestKind = Literal["history", "turn_prefix", "update", "tool_summary"]

# A model asked for N output tokens rarely writes more than ~4 chars each; allow 6 before clipping, so a
# provider that ignores max_tokens cannot hand us a summary that defeats the point of compacting.
CHARS_PER_OUTPUT_TOKEN: Final = 6
# Room left in the summarizer's window for the chat format's overhead, for the sum of a transcript's parts
# differing from its whole, and for some of the difference between tokenizers: the margin's floor; when the
# server counts more than we do, the counted prompt's excess at the count ratio (estimate.prompt_room).
WINDOW_MARGIN_TOKENS: Final = 32
WINDOW_MARGIN_FRACTION: Final = 0.03
# A deterministic (fallback) summary quotes the last user request and the previous summary, clipped.
FALLBACK_REQUEST_CHARS: Final = 600
# The request of a turn the cut falls inside is carried into the summary verbatim, up to this many chars.
OPEN_REQUEST_CHARS: Final = 4_000
# A summary is never bounded below this many tokens, however little room the context leaves it: below it
# a summary says nothing, and the request it would go in cannot be sent anyway.
MIN_SUMMARY_TOKENS: Final = 64
# Below this many characters a clipped summary body says nothing: the whole summary is clipped instead.
MIN_SUMMARY_BODY_CHARS: Final = 200

_NOT_TURN_STARTS: Final = frozenset({KIND_TOOL_SUMMARY, KIND_COMPACTION_SUMMARY})


# ---------------------------------------------------------------------------------------------------
# Data


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


class SummaryRequest(msgspec.Struct, frozen=True):
    """One summarizer call: send ``system`` and ``prompt``, allow ``max_tokens``.

    ``omitted`` counts the oldest messages left out so the call fits the summarizer's window. With
    ``prefix`` (a call that rides the conversation's cache, design §5.4), the call sends the session's own
    system prompt and tools, the first ``prefix`` summarized messages as they are, and ``prompt`` as the
    final user message; ``system`` is then empty.
    """

    kind: RequestKind
    system: str
    prompt: str
    max_tokens: int
    omitted: int = 0
    prefix: int = 0


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
# The cut (design §5.2, 5.3)


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
        builder = _RequestBuilder(
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


def approx_tokens(text: str) -> int:
    """A deliberately high token estimate: ~3 ASCII chars per token, 1.5 tokens per other character."""
    other = min(len(text.encode("utf-8")) - len(text), len(text))
    return (len(text) - other) // 3 + (3 * other) // 2 + 1


class _RequestBuilder:
    """Builds summarizer requests that fit the summarizer's window.

    The transcript is filled newest message first until the budget is spent. A message's block is valued
    at the caller's (cached) count of the message plus its labels, so fitting costs no tokenizing of the
    history; only blocks that clipping shortened, the instructions and the previous summary are measured
    with ``count_text``. The margin absorbs the difference between the sum of the parts and the whole, and
    some of the difference between our tokenizer and the summarizer model's.
    """

    def __init__(
        self,
        config: CompactionConfig,
        window: int | None,
        count: CountTokens,
        measure: CountText,
        instructions: str | None,
        summary_tokens: int | None,
        count_ratio: float,
    ) -> None:
        self.config = config
        self.count_ratio = count_ratio
        self.window = window
        self.count = count
        self.measure = measure
        self.instructions = instructions
        out = config.summary_max_output_tokens
        self.max_tokens = min(out, window // 4) if window else out
        if summary_tokens is not None:
            self.max_tokens = min(self.max_tokens, summary_tokens)
        self._label_tokens: dict[str, int] = {}

    def cached(self, kind: RequestKind, msgs: list[Message], fixed: int | None) -> list[SummaryRequest]:
        """One request that sends ``msgs`` as they are, after the session's system prompt and tools
        (``fixed`` tokens), with the final instruction; empty without ``fixed`` or when it does not fit."""
        if fixed is None:
            return []
        max_tokens = max(1, self.max_tokens // 2) if kind == "turn_prefix" else self.max_tokens
        prompt = cached_summary_prompt(kind, instructions=self.instructions)
        if self.window is not None:
            size = fixed + sum(self.count(m) for m in msgs if m.agent_visible) + self.measure(prompt)
            if size > self._prompt_room(max_tokens):
                return []
        return [SummaryRequest(kind, "", prompt, max_tokens, prefix=len(msgs))]

    def build(self, kind: RequestKind, msgs: list[Message], previous: str | None) -> list[SummaryRequest]:
        """One request for ``msgs`` (as a list, empty when even an empty transcript cannot fit)."""
        max_tokens = max(1, self.max_tokens // 2) if kind == "turn_prefix" else self.max_tokens
        visible = [m for m in msgs if m.agent_visible]
        chars = self.config.summary_tool_result_chars
        if self.window is None:
            blocks = [render_message(m, tool_result_chars=chars) for m in visible]
            return [self._request(kind, blocks, previous, max_tokens, omitted=0)]

        room = self._prompt_room(max_tokens) - self.measure(SUMMARIZER_SYSTEM)
        if previous is not None:
            previous = self._clip_to(previous, room // 2)
        skeleton = self._prompt(kind, [], previous, omitted=len(visible))
        budget = room - self.measure(skeleton)
        if budget <= 0:
            return []
        taken = self._take(reversed(visible), budget)
        omitted = len(visible) - len(taken)
        return [self._request(kind, taken[::-1], previous, max_tokens, omitted=omitted)]

    def _prompt_room(self, max_tokens: int) -> int:
        """The tokens counted here a request asking for ``max_tokens`` may send: its server's count, the
        answer and the margin (:data:`WINDOW_MARGIN_TOKENS` + :data:`WINDOW_MARGIN_FRACTION` of the window,
        or the ratio's excess when more) fit the summarizer's window."""
        assert self.window is not None
        fixed = WINDOW_MARGIN_TOKENS + int(self.window * WINDOW_MARGIN_FRACTION)
        return prompt_room(self.window, max_tokens, self.count_ratio, fixed=fixed)

    def _take(self, newest_first: Iterable[Message], budget: int) -> list[str]:
        chars = self.config.summary_tool_result_chars
        taken: list[str] = []
        used = 0
        for msg in newest_first:
            pieces = transcript_pieces(msg, tool_result_chars=chars)
            block = join_pieces(pieces)
            tokens = self._block_tokens(msg, pieces, block) + 1  # + the blank line between blocks
            if used + tokens <= budget:
                taken.append(block)
                used += tokens
                continue
            if not taken:  # the newest message alone is too big: keep its head and tail
                taken.append(self._clip_to(block, budget - 1))
            break
        return taken

    def _block_tokens(self, msg: Message, pieces: list[TranscriptPiece], block: str) -> int:
        if any(p.clipped for p in pieces):
            return self.measure(block)
        labels = 0
        for piece in pieces:
            tokens = self._label_tokens.get(piece.label)
            if tokens is None:
                tokens = self._label_tokens[piece.label] = self.measure(piece.label) + 1  # + its newline
            labels += tokens
        return self.count(msg) + labels

    def _clip_to(self, text: str, tokens: int) -> str:
        """``text`` clipped head and tail until it measures at most ``tokens``."""
        size = self.measure(text)
        while size > tokens and text:
            chars = max(0, min(len(text) - 1, int(len(text) * tokens / size * 0.9)))
            text = clip_head_tail(text, chars) if chars > 64 else text[:chars]
            size = self.measure(text)
        return text

    def _prompt(self, kind: RequestKind, blocks: list[str], previous: str | None, *, omitted: int) -> str:
        return summary_request_prompt(
            "\n\n".join(blocks),
            kind=kind,
            previous_summary=previous,
            instructions=self.instructions,
            omitted=omitted,
        )

    def _request(
        self, kind: RequestKind, blocks: list[str], previous: str | None, max_tokens: int, *, omitted: int
    ) -> SummaryRequest:
        prompt = self._prompt(kind, blocks, previous, omitted=omitted)
        return SummaryRequest(kind, SUMMARIZER_SYSTEM, prompt, max_tokens, omitted=omitted)


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
