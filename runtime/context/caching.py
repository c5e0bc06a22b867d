"""Prompt caching, the runtime's side (design §4.7): where a request's cacheable prefixes end, and when a
response read less of its prefix from the cache than it should have.

Pure functions over messages and counts; the gateway renders the breakpoints in each provider's terms.

- :func:`place_breakpoints`: at most :data:`MAX_BREAKPOINTS` positions in a request's messages: the system
  prompt (with the tools before it, Anthropic's order), the newest compaction summary, the end of the
  previous step's request (so that a step adding many blocks still finds it) and the last message (moved
  every step). None on a prefix shorter than the model's minimum (:func:`min_cacheable_tokens`): the
  provider would not cache it, and the breakpoint would be spent for nothing.
- :func:`cache_break`: a response whose cache read fell well below the prefix it shares with the previous
  request, and why when the request says so (the system prompt, the tools, the model, a compaction).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Final, Literal

import msgspec

from runtime.dialects import anthropic
from runtime.messages import KIND_COMPACTION_SUMMARY, Message

__all__ = [
    "MAX_BREAKPOINTS",
    "Breakpoints",
    "CacheBreak",
    "CacheBreakCause",
    "CacheWatch",
    "RequestShape",
    "cache_break",
    "min_cacheable_tokens",
    "place_breakpoints",
    "request_shape",
]

MAX_BREAKPOINTS: Final = anthropic.MAX_BREAKPOINTS
"""Anthropic's limit of ``cache_control`` breakpoints per request."""


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix ``model``'s provider caches, in tokens: Anthropic's minimums
    (:func:`runtime.dialects.anthropic.min_cacheable_tokens`), which are also OpenAI's 1,024 elsewhere."""
    return anthropic.min_cacheable_tokens(model)


class Breakpoints(msgspec.Struct, frozen=True):
    """Positions in the request's messages where a cached prefix ends; ``tools``: one on the last tool."""

    positions: tuple[int, ...] = ()
    tools: bool = False


def place_breakpoints(
    messages: Sequence[Message],
    *,
    count: Callable[[Message], int],
    tools_tokens: int,
    minimum: int,
) -> Breakpoints:
    """Where the request of ``messages`` (system prompt first, if any) should mark its cached prefixes.

    ``count`` gives a message's tokens, ``tools_tokens`` the tool definitions', ``minimum`` the shortest
    prefix worth marking. In order of worth: the system prompt (or, without one, the last tool), the
    newest compaction summary, the last message, the end of the previous step's request (the message before
    the newest assistant message); never a hidden message, never two on one position, at most
    :data:`MAX_BREAKPOINTS`, and none where the prefix up to it is shorter than ``minimum``.
    """
    running = tools_tokens
    ends: list[int] = []  # the prefix's tokens up to and including each message
    system_at: int | None = None
    summary_at: int | None = None
    last_visible: int | None = None
    newest_assistant: int | None = None
    for i, message in enumerate(messages):
        if message.agent_visible:
            running += count(message)
            last_visible = i
            if message.role == "system" and system_at is None and i == 0:
                system_at = i
            elif message.kind == KIND_COMPACTION_SUMMARY:
                summary_at = i
            elif message.role == "assistant":
                newest_assistant = i
        ends.append(running)

    def visible_before(i: int) -> int | None:
        while i >= 0 and not messages[i].agent_visible:
            i -= 1
        return i if i >= 0 else None

    previous_end = visible_before(newest_assistant - 1) if newest_assistant is not None else None
    tools = system_at is None and tools_tokens >= minimum
    chosen: list[int] = []
    for candidate in (system_at, summary_at, last_visible, previous_end):
        if candidate is None or candidate in chosen or ends[candidate] < minimum:
            continue
        if len(chosen) + int(tools) >= MAX_BREAKPOINTS:
            break
        chosen.append(candidate)
    return Breakpoints(positions=tuple(sorted(chosen)), tools=tools)


# ---------------------------------------------------------------------------------------------------
# Cache breaks

CacheBreakCause = Literal["system_prompt", "tools", "model_switch", "compaction", "unknown"]


class RequestShape(msgspec.Struct, frozen=True):
    """What of a request decides its cached prefix: the model, digests of the system prompt and the tools,
    the ids of its messages (system prompt excluded) and its prompt's size once the response said it."""

    model: str
    system: bytes
    tools: bytes
    message_ids: tuple[str, ...]
    input_tokens: int = 0


_encode: Final = msgspec.json.Encoder(order="deterministic").encode


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=12).digest()


def request_shape(
    model: str, system_prompt: str, tools: Sequence[object], messages: Sequence[Message]
) -> RequestShape:
    """The :class:`RequestShape` of a request (its messages without the system prompt)."""
    return RequestShape(
        model=model,
        system=_digest(system_prompt.encode()),
        tools=_digest(_encode(list(tools))),
        message_ids=tuple(m.id for m in messages if m.agent_visible and m.role != "system"),
    )


class CacheBreak(msgspec.Struct, frozen=True):
    """A response that read ``cached_tokens`` from the cache where ``expected_tokens`` were the prefix it
    shares with the previous request (or all of that request's, when the prefix changed)."""

    cause: CacheBreakCause
    expected_tokens: int
    cached_tokens: int


BREAK_SHARE: Final = 0.5
"""A read below this share of the expected prefix is a break."""


def cache_break(
    previous: RequestShape | None,
    current: RequestShape,
    cached_tokens: int,
    *,
    minimum: int,
    caching_seen: bool,
) -> CacheBreak | None:
    """Whether the response to ``current`` broke the cache, given the previous request's shape.

    Only once the provider has been seen caching in the session (``caching_seen``: some earlier response
    read from the cache), and only when the previous request's prompt was worth caching (``minimum``). The
    expected read is the previous prompt's size; a read under :data:`BREAK_SHARE` of it is a break. Its
    cause, in order: another model, another system prompt, other tools, the history before the previous
    request's end rewritten (a compaction or an archive); else unknown (an expired or evicted entry).
    """
    if previous is None or not caching_seen or previous.input_tokens < minimum:
        return None
    expected = previous.input_tokens
    if cached_tokens >= BREAK_SHARE * expected:
        return None
    cause: CacheBreakCause
    if current.model != previous.model:
        cause = "model_switch"
    elif current.system != previous.system:
        cause = "system_prompt"
    elif current.tools != previous.tools:
        cause = "tools"
    elif current.message_ids[: len(previous.message_ids)] != previous.message_ids:
        cause = "compaction"
    else:
        cause = "unknown"
    return CacheBreak(cause=cause, expected_tokens=expected, cached_tokens=cached_tokens)


class CacheWatch:
    """One session's cache-break check (no I/O): told each request's shape as it goes out and each
    response's figures as they come back, it answers the :class:`CacheBreak` a response shows, if any."""

    def __init__(self) -> None:
        self._previous: RequestShape | None = None
        self._pending: RequestShape | None = None
        self._seen = False

    def sent(self, shape: RequestShape) -> None:
        """A request of ``shape`` went out (a failed one is forgotten when the next goes)."""
        self._pending = shape

    def answered(self, input_tokens: int, cached_tokens: int, *, minimum: int) -> CacheBreak | None:
        """The response to the request last sent: its prompt's size and what of it was read from the cache."""
        current, self._pending = self._pending, None
        if current is None:
            return None
        found = cache_break(self._previous, current, cached_tokens, minimum=minimum, caching_seen=self._seen)
        self._previous = msgspec.structs.replace(current, input_tokens=input_tokens)
        self._seen = self._seen or cached_tokens > 0
        return found
