"""Exact, deterministic usage for the local provider, counted with tiktoken.

Prompt tokens follow OpenAI's published chat-format accounting, extended to tools and reasoning:

- ``tools`` (when present): the tokens of their compact JSON encoding;
- every message: 3 tokens of framing, plus the tokens of its role, its text content (images count
  :data:`IMAGE_TOKENS` each), its ``name`` (+1), each tool call's function name and arguments, and any
  ``reasoning_content`` sent back (or, without it, the text of its ``thinking_blocks``);
- 3 tokens priming the reply.

Completion tokens are the tokens of the reply text, of each tool call's name and arguments, and of the
reasoning; ``reasoning_tokens`` are the reasoning's share (OpenAI counts reasoning inside completion tokens).

Cached tokens imitate prompt caching: the prompt is a chain of prefixes (tools, then one message at a time);
``cached_tokens`` is the size of the longest prefix that an earlier request to the same model already sent.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import tiktoken

from runtime.provider.script import Turn

MESSAGE_OVERHEAD: Final = 3
REPLY_PRIMING: Final = 3
NAME_OVERHEAD: Final = 1
IMAGE_TOKENS: Final = 1_200

_encode_json = msgspec.json.Encoder(order="deterministic").encode


class PromptCount(msgspec.Struct, frozen=True):
    """Tokens of one request's prompt and how many of them a previous request already sent."""

    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int = 0
    """Tokens written to the cache (Anthropic's Messages API; automatic caching writes nothing billed)."""

    def scaled(self, ratio: float) -> PromptCount:
        """This count as a tokenizer that counts ``ratio`` × ours would give it (rounded up)."""
        if ratio == 1.0:
            return self
        return PromptCount(
            prompt_tokens=math.ceil(self.prompt_tokens * ratio),
            cached_tokens=math.ceil(self.cached_tokens * ratio),
            cache_write_tokens=math.ceil(self.cache_write_tokens * ratio),
        )


class TokenCounter:
    """Counts prompts and replies with one tiktoken encoding; remembers prefixes for cached tokens.

    Per-message counts are memoized (keyed by the message's canonical JSON), so a growing conversation
    costs O(new messages) per request. Not thread-safe: the provider calls it from its event loop only.
    """

    def __init__(self, encoding: str = "o200k_base", *, max_entries: int = 100_000) -> None:
        self._enc = tiktoken.get_encoding(encoding)
        self._max_entries = max_entries
        self._message_tokens: OrderedDict[bytes, int] = OrderedDict()
        self._seen_prefixes: OrderedDict[bytes, None] = OrderedDict()

    @property
    def encoding_name(self) -> str:
        return str(self._enc.name)

    def text(self, text: str) -> int:
        """Tokens of ``text`` (special-token markers are counted as plain text)."""
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))

    def message(self, message: dict[str, Any]) -> int:
        """Tokens of one chat message, framing included."""
        return self._message_cached(_encode_json(message), message)

    def _message_cached(self, key: bytes, message: dict[str, Any]) -> int:
        cached = self._message_tokens.get(key)
        if cached is not None:
            self._message_tokens.move_to_end(key)
            return cached
        tokens = self._count_message(message)
        self._message_tokens[key] = tokens
        if len(self._message_tokens) > self._max_entries:
            self._message_tokens.popitem(last=False)
        return tokens

    def _count_message(self, message: dict[str, Any]) -> int:
        tokens = MESSAGE_OVERHEAD + self.text(str(message.get("role", "")))
        tokens += self.content(message.get("content"))
        name = message.get("name")
        if isinstance(name, str) and name:
            tokens += self.text(name) + NAME_OVERHEAD
        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            fn = call.get("function") or {}
            tokens += self.text(str(fn.get("name") or "")) + self.text(str(fn.get("arguments") or ""))
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            tokens += self.text(reasoning)
        else:
            for block in message.get("thinking_blocks") or ():
                if isinstance(block, dict):
                    tokens += self.text(str(block.get("thinking") or ""))
        return tokens

    def content(self, content: Any) -> int:
        """Tokens of a message's ``content``: a string, or a list of text and image parts."""
        if isinstance(content, str):
            return self.text(content)
        if not isinstance(content, list):
            return 0
        tokens = 0
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                tokens += self.text(str(part.get("text") or ""))
            elif part.get("type") in ("image_url", "image", "input_image"):
                tokens += IMAGE_TOKENS
        return tokens

    def tools(self, tools: Sequence[dict[str, Any]] | None) -> int:
        """Tokens of the tool definitions (their compact JSON)."""
        if not tools:
            return 0
        return self.text(_encode_json(list(tools)).decode())

    def prompt(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        model: str = "",
    ) -> PromptCount:
        """Count a request's prompt and its cached prefix, then remember its prefixes for later requests.
        Prefixes are cached per ``model``, as providers cache them (another model reads nothing)."""
        tools_json = _encode_json(list(tools)) if tools else b""
        digest = hashlib.blake2b(model.encode() + b"\0", digest_size=16)
        digest.update(tools_json)
        running = self.text(tools_json.decode()) if tools_json else 0
        prefixes: list[tuple[bytes, int]] = [(digest.digest(), running)]
        for message in messages:
            key = _encode_json(message)
            running += self._message_cached(key, message)
            digest.update(len(key).to_bytes(8, "little"))
            digest.update(key)
            prefixes.append((digest.digest(), running))
        cached = 0
        for prefix, tokens in reversed(prefixes):
            if tokens and prefix in self._seen_prefixes:
                cached = tokens
                break
        for prefix, _ in prefixes:
            self._seen_prefixes[prefix] = None
            self._seen_prefixes.move_to_end(prefix)
        while len(self._seen_prefixes) > self._max_entries:
            self._seen_prefixes.popitem(last=False)
        return PromptCount(prompt_tokens=running + REPLY_PRIMING, cached_tokens=cached)

    def head(self, text: str, tokens: int) -> str:
        """The first ``tokens`` tokens of ``text``."""
        if tokens <= 0:
            return ""
        encoded = self._enc.encode(text, disallowed_special=())
        return text if len(encoded) <= tokens else self._enc.decode(encoded[:tokens])

    def cut(self, turn: Turn, max_tokens: object) -> Turn:
        """``turn`` as a model stopped at ``max_tokens`` (a positive int; anything else: no cap) gives it:
        unchanged when it fits or ignores the cap (:attr:`Turn.ignore_max_tokens`); else its reasoning, then its text, to the cap, no tool calls (a call cut
        midway is no call) and the finish reason ``length``, as llama.cpp, vLLM and OpenAI stop."""
        if turn.ignore_max_tokens or not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return turn
        if max_tokens <= 0:
            return turn
        calls = [(spec.name, spec.arguments) for spec in turn.tool_calls]
        if self.completion(turn.text, turn.reasoning, calls)[0] <= max_tokens:
            return turn
        reasoning = self.head(turn.reasoning, max_tokens)
        text = self.head(turn.text, max_tokens - self.text(reasoning))
        return msgspec.structs.replace(
            turn, reasoning=reasoning, text=text, tool_calls=(), finish_reason="length"
        )

    def completion(self, text: str, reasoning: str, tool_calls: Sequence[tuple[str, str]]) -> tuple[int, int]:
        """``(completion_tokens, reasoning_tokens)`` of a reply; ``tool_calls`` are (name, arguments) pairs."""
        reasoning_tokens = self.text(reasoning)
        tokens = self.text(text) + reasoning_tokens
        for name, arguments in tool_calls:
            tokens += self.text(name) + self.text(arguments)
        return tokens, reasoning_tokens
