"""The assistant message built from a streamed (or a whole) response, and its stop reason."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from runtime.gateway._models import Delta
from runtime.gateway._usage import field
from runtime.messages import (
    Message,
    Part,
    ReasoningPart,
    StopReason,
    TextPart,
    ToolCallPart,
    Usage,
    message_from_openai,
    new_id,
)

_STOP_REASONS: Final[dict[str, StopReason]] = {
    "stop": "stop",
    "end_turn": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",  # Anthropic: the output ran into the end of the window
    "content_filter": "content_filter",
    "refusal": "content_filter",  # Anthropic: the model declined
}


def stop_reason(finish_reason: str | None, has_tool_calls: bool) -> StopReason:
    """Our stop reason for a provider's ``finish_reason``."""
    reason = _STOP_REASONS.get(finish_reason or "", "stop")
    if has_tool_calls and reason == "stop":
        return "tool_calls"
    return reason


class StreamAssembler:
    """Builds the assistant message from streamed pieces.

    A transport feeds it either whole chunks in any shape (:meth:`add`: litellm's objects, dicts) or the
    pieces it decoded itself (:meth:`text_piece`, :meth:`reasoning_piece`, :meth:`tool_call_piece`,
    :meth:`thinking_block`); each returns the :class:`Delta` to report. Tool-call fragments are joined by
    index; the id and name come from the first fragment that has them. Reasoning signatures arrive as
    ``thinking_blocks`` deltas (litellm's carrier for Anthropic's ``signature_delta``); redacted thinking
    blocks are kept as redacted reasoning parts.
    """

    __slots__ = ("calls", "finish_reason", "model", "reasoning", "redacted", "signature", "text", "usage")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.signature: str | None = None
        self.redacted: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # index -> [id, name, argument fragments]
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.model: str | None = None

    # -- pieces -------------------------------------------------------------------------------------------

    def text_piece(self, text: str) -> Delta:
        self.text.append(text)
        return Delta(kind="text", text=text)

    def reasoning_piece(self, text: str) -> Delta:
        self.reasoning.append(text)
        return Delta(kind="reasoning", text=text)

    def tool_call_piece(self, index: int, call_id: str | None, name: str | None, fragment: str) -> Delta:
        entry = self.calls.get(index)
        if entry is None:
            entry = self.calls[index] = [None, None, []]
        if call_id and not entry[0]:
            entry[0] = call_id
        if name and not entry[1]:
            entry[1] = name
        entry[2].append(fragment)
        return Delta(kind="tool_call", text=fragment, index=index, call_id=call_id or None, name=name or None)

    def thinking_block(self, kind: object, signature: object, data: object) -> None:
        if kind == "redacted_thinking":
            self.redacted.append(str(data or ""))
        elif signature:
            self.signature = str(signature)

    # -- whole chunks of any shape ------------------------------------------------------------------------

    def add(self, chunk: Any) -> list[Delta]:
        usage = field(chunk, "usage")
        if usage is not None:
            self.usage = usage
        self.model = self.model or field(chunk, "model")
        deltas: list[Delta] = []
        for choice in field(chunk, "choices") or ():
            finish = field(choice, "finish_reason")
            if finish:
                self.finish_reason = finish
            delta = field(choice, "delta")
            if delta is None:
                continue
            reasoning = field(delta, "reasoning_content")
            if reasoning:
                deltas.append(self.reasoning_piece(reasoning))
            for block in field(delta, "thinking_blocks") or ():
                self.thinking_block(field(block, "type"), field(block, "signature"), field(block, "data"))
            content = field(delta, "content")
            if content:
                deltas.append(self.text_piece(content))
            for call in field(delta, "tool_calls") or ():
                fn = field(call, "function")
                deltas.append(
                    self.tool_call_piece(
                        field(call, "index") or 0,
                        field(call, "id"),
                        field(fn, "name"),
                        field(fn, "arguments") or "",
                    )
                )
        return deltas

    def message(self, *, model: str | None, usage: Usage) -> Message:
        parts: list[Part] = []
        reasoning = "".join(self.reasoning)
        if reasoning:
            parts.append(ReasoningPart(reasoning, signature=self.signature))
        parts.extend(ReasoningPart("", redacted=True, provider_metadata={"data": d}) for d in self.redacted)
        text = "".join(self.text)
        if text:
            parts.append(TextPart(text))
        for index in sorted(self.calls):
            call_id, name, fragments = self.calls[index]
            parts.append(
                ToolCallPart(id=call_id or f"call_{new_id()}", name=name or "", arguments="".join(fragments))
            )
        has_calls = bool(self.calls)
        return Message(
            role="assistant",
            parts=tuple(parts),
            model=model or self.model,
            usage=usage,
            stop_reason=stop_reason(self.finish_reason, has_calls),
        )


def message_from_response(response: Any, *, model: str | None, usage: Usage) -> Message:
    """The assistant message of a non-streamed response (litellm's ``ModelResponse``, or a decoded dict)."""
    choices = field(response, "choices") or ()
    if not choices:
        return Message(role="assistant", model=model, usage=usage, stop_reason="stop")
    choice = choices[0]
    data = field(choice, "message")
    message = message_from_openai(data) if data is not None else Message(role="assistant")
    return msgspec.structs.replace(
        message,
        model=model or field(response, "model"),
        usage=usage,
        stop_reason=stop_reason(field(choice, "finish_reason"), bool(message.tool_calls)),
    )
