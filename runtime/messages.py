"""The message model (design §2.1) and its conversion to and from the OpenAI chat format litellm speaks.

Every message is a frozen msgspec Struct. An assistant message is a sequence of parts (text, reasoning,
tool calls, images); a tool result is a ``tool`` message that names the call it answers. Visibility
metadata decides what the model sees (``agent_visible``) and what a user sees (``user_visible``), and
``kind`` marks the messages context management creates (summaries, archived tool results, ...).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

__all__ = [
    "KIND_COMPACTION_SUMMARY",
    "KIND_STEER",
    "KIND_TOOL_CALL_ARCHIVED",
    "KIND_TOOL_OUTPUT_CLEARED",
    "KIND_TOOL_RESULT",
    "KIND_TOOL_RESULT_ARCHIVED",
    "KIND_TOOL_SUMMARY",
    "KIND_TURN_INTERRUPTED",
    "CostSplit",
    "ImagePart",
    "Message",
    "Part",
    "ReasoningPart",
    "Role",
    "StopReason",
    "TextPart",
    "ToolCallPart",
    "Usage",
    "assistant",
    "decode_message",
    "encode_message",
    "message_from_openai",
    "message_to_openai",
    "new_id",
    "reasoning_parts_from_openai",
    "system",
    "to_openai",
    "tool_result",
    "user",
]


Role = Literal["system", "user", "assistant", "tool"]

# Kinds of message that context management creates or marks (design §2.1, 5.9).
KIND_TOOL_RESULT: Final = "tool_result"
KIND_TOOL_RESULT_ARCHIVED: Final = "tool_result_archived"
KIND_TOOL_CALL_ARCHIVED: Final = "tool_call_archived"  # the assistant half of an archived tool step (5.9)
KIND_TOOL_SUMMARY: Final = "tool_summary"
KIND_COMPACTION_SUMMARY: Final = "compaction_summary"
KIND_TOOL_OUTPUT_CLEARED: Final = "tool_output_cleared"
KIND_STEER: Final = "steer"  # a user message that steered a running turn at a step boundary
KIND_TURN_INTERRUPTED: Final = "turn_interrupted"  # the note a turn cut off by a crash gets in the log

# How an assistant message ended. Usage of "aborted" and "error" responses is not trusted (design §4.2).
StopReason = Literal["stop", "tool_calls", "length", "content_filter", "aborted", "error"]


def new_id() -> str:
    """A short random id (16 hex chars): unique enough per session, cheap to make and to store.

    The bits come from a generator of our own, seeded from ``os.urandom`` and reseeded in a forked child:
    ``os.urandom`` itself is a system call that gives up the GIL, and a turn makes several ids. (Not the
    ``random`` module's shared generator: a program or test framework may seed that one.)
    """
    return f"{_random_bits(64):016x}"


_ids = random.Random()
_random_bits = _ids.getrandbits
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


class TextPart(msgspec.Struct, frozen=True, tag="text"):
    text: str


class ReasoningPart(msgspec.Struct, frozen=True, tag="reasoning"):
    """Reasoning text with what the provider needs to accept it back (e.g. Anthropic's signature)."""

    text: str
    signature: str | None = None
    redacted: bool = False
    provider_metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolCallPart(msgspec.Struct, frozen=True, tag="tool_call"):
    """A tool call as the model made it. ``arguments`` is the raw JSON text, kept even when malformed."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as an object; raises ``ValueError`` with a readable reason when they are not."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call arguments are not valid JSON: {exc.msg} at char {exc.pos}") from None
        except RecursionError:
            raise ValueError("tool call arguments are nested too deeply to parse") from None
        if not isinstance(value, dict):
            raise ValueError(f"tool call arguments must be a JSON object, got {type(value).__name__}")
        return value


class ImagePart(msgspec.Struct, frozen=True, tag="image"):
    """An image by URL (``data:`` URLs included). ``tokens`` is set when measured."""

    url: str
    detail: str | None = None
    tokens: int | None = None


Part = TextPart | ReasoningPart | ToolCallPart | ImagePart


class CostSplit(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a response cost in USD, by kind of token (design §4.1, §4.7): ``input`` (the prompt's tokens
    neither read from nor written to the cache), ``cache_read``, ``cache_write`` and ``output`` (reasoning
    included); ``without_cache``: what the same tokens would have cost with no cache at all (the prompt at
    the input rate), so that ``without_cache - total`` is what the cache saved."""

    input: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    output: float = 0.0
    without_cache: float = 0.0

    @property
    def total(self) -> float:
        return self.input + self.cache_read + self.cache_write + self.output

    @property
    def saved(self) -> float:
        """What the cache saved (negative when writes cost more than reads saved)."""
        return self.without_cache - self.total

    def __add__(self, other: CostSplit) -> CostSplit:
        return CostSplit(
            input=self.input + other.input,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            output=self.output + other.output,
            without_cache=self.without_cache + other.without_cache,
        )


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Token usage of one provider response, normalized across providers.

    ``input_tokens`` is the whole prompt; ``cache_read_tokens`` and ``cache_write_tokens`` are the parts of
    it read from and written to the provider's cache, ``cache_write_1h_tokens`` the part of the writes kept
    for an hour (Anthropic's ``ttl: "1h"``, billed at its own rate; the rest for 5 minutes). ``cost`` is the response's cost in USD (what the
    provider stamped, else priced from litellm's map), ``costs`` its split by kind of token (priced from the
    map; None when the model has no prices there).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    cost: float | None = None
    transport: str | None = None
    """The gateway transport that made the call (``litellm``, ``openai_compat``); kept by a sum only when
    every usage in it came from the same one."""
    costs: CostSplit | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cached_share(self) -> float:
        """The share of the prompt read from the cache (0 without a prompt)."""
        return self.cache_read_tokens / self.input_tokens if self.input_tokens else 0.0

    def __add__(self, other: Usage) -> Usage:
        cost: float | None = None
        if self.cost is not None or other.cost is not None:
            cost = (self.cost or 0.0) + (other.cost or 0.0)
        costs: CostSplit | None = None
        if self.costs is not None or other.costs is not None:
            costs = (self.costs or CostSplit()) + (other.costs or CostSplit())
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_write_1h_tokens=self.cache_write_1h_tokens + other.cache_write_1h_tokens,
            cost=cost,
            transport=self.transport if self.transport == other.transport else None,
            costs=costs,
        )


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, weakref=True):
    """One message of a conversation (weakly referenceable: a cached token count lives as long as it does).

    ``tool`` messages are tool results: ``tool_call_id`` and ``name`` say which call they answer,
    ``is_error`` whether the tool failed, and ``parts`` hold the content.
    """

    role: Role
    parts: tuple[Part, ...] = ()
    id: str = msgspec.field(default_factory=new_id)
    created_at: float = msgspec.field(default_factory=time.time)
    # tool results
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    # visibility (design §2.1)
    agent_visible: bool = True
    user_visible: bool = True
    kind: str | None = None
    # assistant responses
    model: str | None = None
    usage: Usage | None = None
    stop_reason: StopReason | None = None
    # free-form metadata (e.g. a compaction summary's read/modified files)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def text(self) -> str:
        """The concatenated text parts."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, ReasoningPart))

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCallPart))

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ImagePart))


# ---------------------------------------------------------------------------------------------------
# Constructors


def system(text: str, **kw: Any) -> Message:
    return Message(role="system", parts=(TextPart(text),), **kw)


def user(text: str, *images: str, **kw: Any) -> Message:
    parts: tuple[Part, ...] = (TextPart(text), *(ImagePart(url) for url in images))
    return Message(role="user", parts=parts, **kw)


def assistant(
    text: str = "", *, tool_calls: Sequence[ToolCallPart] = (), reasoning: str = "", **kw: Any
) -> Message:
    parts: list[Part] = []
    if reasoning:
        parts.append(ReasoningPart(reasoning))
    if text:
        parts.append(TextPart(text))
    parts.extend(tool_calls)
    return Message(role="assistant", parts=tuple(parts), **kw)


def tool_result(call_id: str, name: str, content: str, *, is_error: bool = False, **kw: Any) -> Message:
    kw.setdefault("kind", KIND_TOOL_RESULT)
    return Message(
        role="tool", parts=(TextPart(content),), tool_call_id=call_id, name=name, is_error=is_error, **kw
    )


# ---------------------------------------------------------------------------------------------------
# OpenAI chat format (what litellm takes and returns)


def to_openai(messages: Iterable[Message], *, include_reasoning: bool = True) -> list[dict[str, Any]]:
    """Convert the agent-visible messages to OpenAI chat messages.

    Reasoning goes back as ``reasoning_content`` plus ``thinking_blocks`` (litellm's carrier for
    Anthropic-style signed thinking) when ``include_reasoning`` is true and the provider accepts it.
    """
    out: list[dict[str, Any]] = []
    for msg in messages:
        if not msg.agent_visible:
            continue
        out.append(message_to_openai(msg, include_reasoning=include_reasoning))
    return out


def message_to_openai(msg: Message, *, include_reasoning: bool = True) -> dict[str, Any]:
    if msg.role == "tool":
        return {"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": msg.text}
    if msg.role == "assistant":
        d: dict[str, Any] = {"role": "assistant", "content": msg.text or None}
        calls = msg.tool_calls
        if calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        reasoning = [p for p in msg.parts if isinstance(p, ReasoningPart)]
        if include_reasoning and reasoning:
            d["reasoning_content"] = "".join(p.text for p in reasoning if not p.redacted)
            blocks = [_thinking_block(p) for p in reasoning if p.signature or p.redacted]
            if blocks:
                d["thinking_blocks"] = blocks
        return d
    images = msg.images
    if not images:
        return {"role": msg.role, "content": msg.text}
    content: list[dict[str, Any]] = []
    for p in msg.parts:
        if isinstance(p, TextPart):
            content.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            image: dict[str, Any] = {"url": p.url}
            if p.detail:
                image["detail"] = p.detail
            content.append({"type": "image_url", "image_url": image})
    return {"role": msg.role, "content": content}


def _thinking_block(p: ReasoningPart) -> dict[str, Any]:
    if p.redacted:
        return {"type": "redacted_thinking", "data": p.provider_metadata.get("data", p.text)}
    return {"type": "thinking", "thinking": p.text, "signature": p.signature}


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def message_from_openai(data: Any, **kw: Any) -> Message:
    """Build a Message from an OpenAI chat message (a dict, or litellm's ``Message`` object)."""
    role: Role = _get(data, "role") or "assistant"
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"unknown message role {role!r}")
    content = _get(data, "content")
    parts: list[Part] = []
    if role == "assistant":
        parts.extend(reasoning_parts_from_openai(data))
    if isinstance(content, str):
        if content:
            parts.append(TextPart(content))
    elif isinstance(content, list):
        for item in content:
            kind = _get(item, "type")
            if kind == "text":
                parts.append(TextPart(_get(item, "text", "")))
            elif kind == "image_url":
                image = _get(item, "image_url")
                url = image if isinstance(image, str) else _get(image, "url", "")
                detail = None if isinstance(image, str) else _get(image, "detail")
                parts.append(ImagePart(url, detail=detail))
    for call in _get(data, "tool_calls") or ():
        fn = _get(call, "function")
        parts.append(
            ToolCallPart(
                id=_get(call, "id") or new_id(),
                name=_get(fn, "name") or "",
                arguments=_get(fn, "arguments") or "{}",
            )
        )
    if role == "tool":
        kw.setdefault("kind", KIND_TOOL_RESULT)
        kw.setdefault("tool_call_id", _get(data, "tool_call_id"))
        kw.setdefault("name", _get(data, "name"))
    return Message(role=role, parts=tuple(parts), **kw)


def reasoning_parts_from_openai(data: Any) -> list[ReasoningPart]:
    """Reasoning of a response: signed ``thinking_blocks`` when present, else ``reasoning_content``."""
    blocks = _get(data, "thinking_blocks") or ()
    parts: list[ReasoningPart] = []
    for block in blocks:
        kind = _get(block, "type")
        if kind == "thinking":
            parts.append(ReasoningPart(_get(block, "thinking") or "", signature=_get(block, "signature")))
        elif kind == "redacted_thinking":
            parts.append(ReasoningPart("", redacted=True, provider_metadata={"data": _get(block, "data")}))
    if not parts:
        text = _get(data, "reasoning_content")
        if text:
            parts.append(ReasoningPart(text))
    return parts


# ---------------------------------------------------------------------------------------------------
# Encoding: one encoder and decoder, reused.

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)


def encode_message(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode_message(data: bytes | str) -> Message:
    return _decoder.decode(data)
