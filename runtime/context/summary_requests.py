"""The summarizer's requests (design §5.4): a compaction's summarized messages as isolated calls that fit
the summarizer model's window.

Pure: :class:`SummaryRequestBuilder` turns a list of messages into a :class:`SummaryRequest` (a transcript
filled newest first, clipped to the window with a margin, the server's count ratio included), or into one
that rides the conversation's cache. Token counts come from the caller's ``count`` (a message) and
``measure`` (a text).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, Literal

import msgspec

from runtime.config import CompactionConfig
from runtime.context.cut import CountTokens
from runtime.context.estimate import prompt_room
from runtime.context.prompts import (
    SUMMARIZER_SYSTEM,
    TranscriptPiece,
    cached_summary_prompt,
    clip_head_tail,
    join_pieces,
    render_message,
    summary_request_prompt,
    transcript_pieces,
)
from runtime.messages import Message

__all__ = [
    "WINDOW_MARGIN_FRACTION",
    "WINDOW_MARGIN_TOKENS",
    "CountText",
    "RequestKind",
    "SummaryRequest",
    "SummaryRequestBuilder",
    "approx_tokens",
]

CountText = Callable[[str], int]
RequestKind = Literal["history", "turn_prefix", "update", "tool_summary"]

# Room left in the summarizer's window for the chat format's overhead, for the sum of a transcript's parts
# differing from its whole, and for some of the difference between tokenizers: the margin's floor; when the
# server counts more than we do, the counted prompt's excess at the count ratio (estimate.prompt_room).
WINDOW_MARGIN_TOKENS: Final = 32
WINDOW_MARGIN_FRACTION: Final = 0.03


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


def approx_tokens(text: str) -> int:
    """A deliberately high token estimate: ~3 ASCII chars per token, 1.5 tokens per other character."""
    other = min(len(text.encode("utf-8")) - len(text), len(text))
    return (len(text) - other) // 3 + (3 * other) // 2 + 1


class SummaryRequestBuilder:
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
