"""The local provider's Anthropic Messages API: ``POST /v1/messages``, streamed as Anthropic's SSE events or not
(design §7.3). The same scripts, responders, policy, faults and limits as chat completions, in Anthropic's words.

- **Requests** as Anthropic checks them: ``model``, ``max_tokens`` and ``messages`` (``user``/``assistant``
  turns of a string or content blocks: ``text``, ``image``, ``tool_use``, ``tool_result``, ``thinking``,
  ``redacted_thinking``), ``system`` (a string or text blocks), ``tools`` (``name``, ``input_schema``), the
  ``anthropic-version`` header, and a key in ``x-api-key`` (or ``authorization: Bearer``). Every
  ``tool_use`` needs its ``tool_result`` in the next user turn, and a ``tool_result`` its ``tool_use``.
- **Thinking** comes back as a ``thinking`` block with a ``signature``; a thinking block sent back must carry
  the signature the provider gave that very thinking, else a 400 (Anthropic rejects a changed one). With
  ``thinking`` enabled, the assistant message whose tool calls the request's last message answers must start
  with its thinking block, else a 400 (Anthropic's rule for a tool loop).
- **Caching** by Anthropic's rules (:mod:`runtime.provider.prompt_cache`): only a prefix that ends at a
  ``cache_control`` breakpoint, at most 4 (a 5th is a 400), at least the model's minimum
  (``LocalProvider.cache_min_tokens`` overrides it), for 5 minutes or an hour. Usage reports
  ``input_tokens`` (the uncached rest), ``cache_creation_input_tokens`` (with its ``cache_creation`` split by
  TTL), ``cache_read_input_tokens`` and ``output_tokens``.
- **Errors** in Anthropic's shape (:mod:`runtime.dialects.anthropic`): the overflow "prompt is too long: N
  tokens > M maximum", a 429 ``rate_limit_error`` with ``retry-after`` and ``anthropic-ratelimit-*`` headers
  (which every answer carries under limits), a 529 ``overloaded_error``, a mid-stream ``error`` event;
  ``ping`` events as the stream's keep-alives.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from runtime.dialects import anthropic
from runtime.dialects._base import ErrorResponse
from runtime.provider import errors
from runtime.provider._http import error_response, fault_status, json_response
from runtime.provider.prompt_cache import Block, CacheUse, PromptCache
from runtime.provider.script import Fault, Turn
from runtime.provider.usage import IMAGE_TOKENS, MESSAGE_OVERHEAD, REPLY_PRIMING, PromptCount, TokenCounter

if TYPE_CHECKING:
    from runtime.provider.limits import ProviderLimiter

    class LocalProvider(Protocol):
        """What the endpoint uses of its :class:`~runtime.provider.server.LocalProvider` (which builds it: the
        server module imports this one, not the other way round)."""

        limiter: ProviderLimiter
        latency: float
        chunk_chars: int
        chunk_delay: float
        cache_min_tokens: int | None
        _counter: TokenCounter

        def _authorized(self, request: Request) -> bool: ...
        def _bearer_of(self, request: Request) -> str: ...
        def _take_fault(self) -> Fault | None: ...
        def _window_of(self, model: str) -> int: ...
        def _record(
            self,
            request: Request,
            body: dict[str, Any],
            model: str,
            stream: bool,
            count: PromptCount | None,
            status: int,
            outcome: str,
            source: str,
            authorized: bool,
            received: float,
        ) -> None: ...
        def _next_turn(
            self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
        ) -> tuple[Turn, str, ErrorResponse | None]: ...
        def _paced(self, frames: Iterator[bytes]) -> AsyncIterator[bytes]: ...
        async def fault_response(
            self, request: Request, fault: Fault, count: PromptCount, stream: bool, words: errors.FaultWords
        ) -> Response: ...


_json = msgspec.json.Encoder()
_canonical = msgspec.json.Encoder(order="deterministic").encode
_decode_body = msgspec.json.Decoder(dict[str, Any])
_SSE_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_STOP_REASONS: Final = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


class _Problem(Exception):
    """A request Anthropic would refuse: the error response to send."""

    def __init__(self, error: ErrorResponse) -> None:
        super().__init__(error.body)
        self.error = error


def _bad(message: str) -> _Problem:
    return _Problem(anthropic.bad_request(message))


# -- signatures -----------------------------------------------------------------------------------------------


class Signer:
    """Signs the thinking the provider gives out, and checks what comes back: a signature is valid only for
    the very thinking it was given with (an HMAC under a secret of this provider, or a scripted signature
    recorded when it was sent)."""

    def __init__(self) -> None:
        self._secret = os.urandom(32)
        self._scripted: dict[str, bytes] = {}

    def sign(self, thinking: str, scripted: str | None = None) -> str:
        if scripted is not None:
            self._scripted[scripted] = hashlib.sha256(thinking.encode()).digest()
            return scripted
        mac = hmac.new(self._secret, thinking.encode(), hashlib.sha256).digest()
        return base64.b64encode(b"agentcell-sig:" + mac).decode()

    def valid(self, thinking: str, signature: object) -> bool:
        if not isinstance(signature, str) or not signature:
            return False
        recorded = self._scripted.get(signature)
        if recorded is not None:
            return hmac.compare_digest(recorded, hashlib.sha256(thinking.encode()).digest())
        return hmac.compare_digest(signature, self.sign(thinking))


# -- a request, checked and read ------------------------------------------------------------------------------


class Parsed(msgspec.Struct, kw_only=True):
    """A Messages request as the provider reads it."""

    model: str
    max_tokens: int
    stream: bool
    system: list[dict[str, Any]]
    messages: list[tuple[str, list[dict[str, Any]]]]
    tools: list[dict[str, Any]]


def parse(body: dict[str, Any], signer: Signer) -> Parsed:
    """``body`` checked as Anthropic checks it; raises :class:`_Problem` with the 400 it would send."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise _bad("max_tokens: Field required")
    if max_tokens < 1:
        raise _bad("max_tokens: Input should be greater than or equal to 1")
    raw_system = body.get("system")
    system: list[dict[str, Any]] = []
    if isinstance(raw_system, str):
        if raw_system:
            system = [{"type": "text", "text": raw_system}]
    elif isinstance(raw_system, list):
        for i, block in enumerate(raw_system):
            if (
                not isinstance(block, dict)
                or block.get("type") != "text"
                or not isinstance(block.get("text"), str)
            ):
                raise _bad(f"system.{i}: Input should be a valid text block")
            system.append(block)
    elif raw_system is not None:
        raise _bad("system: Input should be a valid string or a list of text blocks")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _bad(
            "messages: Field required"
            if raw_messages is None
            else "messages: at least one message is required"
        )
    messages: list[tuple[str, list[dict[str, Any]]]] = []
    for i, message in enumerate(raw_messages):
        if not isinstance(message, dict):
            raise _bad(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _bad(
                f'messages.{i}.role: Unexpected role "{role}". The Messages API accepts a top-level `system` '
                'parameter, not "system" as an input message role.'
                if role == "system"
                else f"messages.{i}.role: Input should be 'user' or 'assistant'"
            )
        content = message.get("content")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list) and all(isinstance(b, dict) for b in content):
            blocks = list(content)
        else:
            raise _bad(f"messages.{i}.content: Input should be a valid string or a list of content blocks")
        for j, block in enumerate(blocks):
            _check_block(block, role, f"messages.{i}.content.{j}", signer)
        messages.append((role, blocks))
    _check_tool_pairs(messages)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        _check_thinking_leads(messages)
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise _bad("tools: Input should be a valid list")
    for i, tool in enumerate(raw_tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise _bad(f"tools.{i}.name: Field required")
        if "type" not in tool and not isinstance(tool.get("input_schema"), dict):
            raise _bad(f"tools.{i}.input_schema: Field required")
    marks = sum(1 for t in raw_tools if isinstance(t, dict) and t.get("cache_control"))
    marks += sum(1 for b in system if b.get("cache_control"))
    marks += sum(1 for _, blocks in messages for b in blocks if b.get("cache_control"))
    marks += sum(  # a tool result's own text blocks may carry one too
        1
        for _, blocks in messages
        for b in blocks
        if b.get("type") == "tool_result" and isinstance(b.get("content"), list)
        for inner in b["content"]
        if isinstance(inner, dict) and inner.get("cache_control")
    )
    if marks > anthropic.MAX_BREAKPOINTS:
        raise _Problem(anthropic.too_many_breakpoints(marks))
    return Parsed(
        model=model,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        system=system,
        messages=messages,
        tools=list(raw_tools),
    )


_USER_BLOCKS: Final = frozenset({"text", "image", "document", "tool_result"})
_ASSISTANT_BLOCKS: Final = frozenset({"text", "tool_use", "thinking", "redacted_thinking", "server_tool_use"})


def _check_block(block: dict[str, Any], role: str, where: str, signer: Signer) -> None:
    kind = block.get("type")
    allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
    if kind not in allowed:
        raise _bad(f"{where}.type: a {role} message cannot hold a {kind!r} block")
    if kind == "text" and not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text: Field required")
    if kind == "tool_use":
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise _bad(f"{where}: tool_use blocks need an id and a name")
        if not isinstance(block.get("input"), dict):
            raise _bad(f"{where}.input: Input should be a valid dictionary")
    if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id: Field required")
    if kind == "thinking":
        thinking = block.get("thinking")
        if not isinstance(thinking, str):
            raise _bad(f"{where}.thinking: Field required")
        if not signer.valid(thinking, block.get("signature")):
            raise _bad(f"{where}: Invalid `signature` in `thinking` block")
    if block.get("cache_control") is not None:
        control = block["cache_control"]
        if not isinstance(control, dict) or control.get("type") != "ephemeral":
            raise _bad(f"{where}.cache_control.type: Input should be 'ephemeral'")
        if control.get("ttl", "5m") not in anthropic.TTL_SECONDS:
            raise _bad(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")


def _check_tool_pairs(messages: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Each ``tool_use`` answered in the very next user turn; each ``tool_result`` answering one before it."""
    for i, (role, blocks) in enumerate(messages):
        if role != "assistant":
            continue
        ids = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if not ids:
            continue
        answered: set[object] = set()
        if i + 1 < len(messages) and messages[i + 1][0] == "user":
            answered = {b.get("tool_use_id") for b in messages[i + 1][1] if b.get("type") == "tool_result"}
        missing = [x for x in ids if x not in answered]
        if missing and i + 1 < len(messages):
            raise _bad(
                f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in "
                "the next message."
            )
    for i, (_, blocks) in enumerate(messages):
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if not results:
            continue
        before = messages[i - 1] if i > 0 else None
        calls = {b.get("id") for b in before[1] if b.get("type") == "tool_use"} if before else set()
        stray = [x for x in results if x not in calls]
        if stray:
            raise _bad(
                f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {stray[0]}. Each "
                "`tool_result` block must have a corresponding `tool_use` block in the previous message."
            )


def _check_thinking_leads(messages: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """With thinking enabled, the assistant message whose tool calls the final user message answers must
    start with its thinking (the block the model gave, sent back), as Anthropic requires: else its 400."""
    if len(messages) < 2:
        return
    role, blocks = messages[-1]
    if role != "user" or not any(b.get("type") == "tool_result" for b in blocks):
        return
    index = len(messages) - 2
    before, content = messages[index]
    first = content[0].get("type") if content else None
    if before == "assistant" and first not in ("thinking", "redacted_thinking"):
        raise _bad(
            f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
            "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
            "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
            "thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
        )


# -- the same request in the chat format (for the policy, responders and the counter) ------------------------


def as_chat(parsed: Parsed) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The request's messages and tools in OpenAI's chat format, as the policy and responders read them."""
    chat: list[dict[str, Any]] = []
    if parsed.system:
        chat.append({"role": "system", "content": "\n\n".join(b["text"] for b in parsed.system)})
    for role, blocks in parsed.messages:
        if role == "user":
            texts: list[str] = []
            for block in blocks:
                if block.get("type") == "tool_result":
                    chat.append(
                        {"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result_text(block)}
                    )
                elif block.get("type") == "text":
                    texts.append(block["text"])
            if texts:
                chat.append({"role": "user", "content": "\n".join(texts)})
            continue
        message: dict[str, Any] = {"role": "assistant", "content": None}
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        if text:
            message["content"] = text
        thinking = [b for b in blocks if b.get("type") == "thinking"]
        if thinking:
            message["reasoning_content"] = "".join(b["thinking"] for b in thinking)
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        if calls:
            message["tool_calls"] = calls
        chat.append(message)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {},
            },
        }
        for t in parsed.tools
    ]
    return chat, tools or None


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


# -- the prompt as blocks: tokens and the cache ---------------------------------------------------------------


def prompt_blocks(parsed: Parsed, counter: TokenCounter) -> list[Block]:
    """The prompt as the cache sees it: tools, system blocks, then each message's blocks, with their tokens
    (a message's framing counted on its first block)."""
    blocks: list[Block] = []
    for tool in parsed.tools:
        bare = _bare(tool)
        blocks.append(Block(b"T" + _canonical(bare), counter.text(_canonical(bare).decode()), _mark(tool)))
    for block in parsed.system:
        blocks.append(Block(b"S" + _canonical(_bare(block)), counter.text(block["text"]), _mark(block)))
    for role, content in parsed.messages:
        for i, block in enumerate(content):
            overhead = MESSAGE_OVERHEAD + counter.text(role) if i == 0 else 0
            key = (b"U" if role == "user" else b"A") + (b"0" if i == 0 else b"+") + _canonical(_bare(block))
            blocks.append(Block(key, overhead + _block_tokens(block, counter), _mark(block)))
    return blocks


def _bare(block: dict[str, Any]) -> dict[str, Any]:
    """A block as the cache sees it: without its ``cache_control`` markers (a breakpoint that moves changes no
    prefix), and a ``tool_result``'s text as a list of text blocks, however it was sent (the same prompt)."""
    bare = {k: v for k, v in block.items() if k != "cache_control"} if "cache_control" in block else block
    if bare.get("type") == "tool_result":
        content = bare.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        elif isinstance(content, list):
            content = [_bare(b) if isinstance(b, dict) else b for b in content]
        bare = {**bare, "content": content}
    return bare


def _mark(block: dict[str, Any]) -> str | None:
    control = block.get("cache_control")
    if control is None and block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        inner = [b.get("cache_control") for b in block["content"] if isinstance(b, dict)]
        control = next((c for c in reversed(inner) if c is not None), None)
    if not isinstance(control, dict):
        return None
    ttl = control.get("ttl", "5m")
    return ttl if isinstance(ttl, str) else "5m"


def _block_tokens(block: dict[str, Any], counter: TokenCounter) -> int:
    kind = block.get("type")
    if kind == "text":
        return counter.text(block.get("text") or "")
    if kind == "tool_use":
        return counter.text(str(block.get("name") or "")) + counter.text(json.dumps(block.get("input") or {}))
    if kind == "tool_result":
        return counter.text(_result_text(block)) + sum(
            IMAGE_TOKENS
            for b in block.get("content") or ()
            if isinstance(b, dict) and b.get("type") == "image"
        )
    if kind == "thinking":
        return counter.text(block.get("thinking") or "")
    if kind in ("image", "document"):
        return IMAGE_TOKENS
    return counter.text(_canonical(block).decode())


# -- a reply --------------------------------------------------------------------------------------------------


class Usage(msgspec.Struct, frozen=True):
    """A reply's usage as Anthropic reports it."""

    input_tokens: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    output_tokens: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_write_5m + self.cache_write_1h,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_write_5m,
                "ephemeral_1h_input_tokens": self.cache_write_1h,
            },
            "output_tokens": self.output_tokens,
        }


def usage_of(prompt_tokens: int, cache: CacheUse, output_tokens: int) -> Usage:
    """Anthropic's usage: ``input_tokens`` is what was neither read from nor written to the cache."""
    rest = max(0, prompt_tokens - cache.read - cache.write)
    return Usage(rest, cache.read, cache.write_5m, cache.write_1h, output_tokens)


class Reply:
    """One reply rendered as a Messages response or as its SSE events."""

    def __init__(self, turn: Turn, model: str, usage: Usage, signature: str | None) -> None:
        self.turn = turn
        self.model = model
        self.usage = usage
        self.signature = signature
        self.id = "msg_" + os.urandom(12).hex()
        self.calls = [(spec.id or "toolu_" + os.urandom(12).hex(), spec) for spec in turn.tool_calls]
        self.stop_reason = _STOP_REASONS.get(turn.effective_finish_reason, turn.effective_finish_reason)

    def content(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if self.turn.reasoning:
            blocks.append({"type": "thinking", "thinking": self.turn.reasoning, "signature": self.signature})
        if self.turn.text:
            blocks.append({"type": "text", "text": self.turn.text})
        for call_id, spec in self.calls:
            blocks.append(
                {"type": "tool_use", "id": call_id, "name": spec.name, "input": _input(spec.arguments)}
            )
        return blocks

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content(),
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": self.usage.as_dict(),
        }

    def events(self, size: int) -> Iterator[bytes]:
        """The reply as Anthropic streams it: message_start, a ping, each block's start, deltas and stop,
        message_delta (stop reason, output tokens), message_stop."""
        start = {**self.message(), "content": [], "stop_reason": None}
        start["usage"] = {**self.usage.as_dict(), "output_tokens": 1}
        yield event("message_start", {"type": "message_start", "message": start})
        yield event("ping", {"type": "ping"})
        index = 0
        if self.turn.reasoning:
            yield _block_start(index, {"type": "thinking", "thinking": "", "signature": ""})
            for piece in _pieces(self.turn.reasoning, size):
                yield _delta(index, {"type": "thinking_delta", "thinking": piece})
            yield _delta(index, {"type": "signature_delta", "signature": self.signature or ""})
            yield _block_stop(index)
            index += 1
        if self.turn.text:
            yield _block_start(index, {"type": "text", "text": ""})
            for piece in _pieces(self.turn.text, size):
                yield _delta(index, {"type": "text_delta", "text": piece})
            yield _block_stop(index)
            index += 1
        for call_id, spec in self.calls:
            yield _block_start(index, {"type": "tool_use", "id": call_id, "name": spec.name, "input": {}})
            for piece in _pieces(spec.arguments, size):
                yield _delta(index, {"type": "input_json_delta", "partial_json": piece})
            yield _block_stop(index)
            index += 1
        delta = {"stop_reason": self.stop_reason, "stop_sequence": None}
        yield event(
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": self.usage.output_tokens}},
        )
        yield event("message_stop", {"type": "message_stop"})


def event(name: str, data: dict[str, Any]) -> bytes:
    """One SSE event: its name and its JSON data."""
    return b"event: " + name.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    return event(
        "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
    )


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _block_stop(index: int) -> bytes:
    return event("content_block_stop", {"type": "content_block_stop", "index": index})


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- the endpoint ---------------------------------------------------------------------------------------------


class MessagesEndpoint:
    """``POST /v1/messages`` of a :class:`~runtime.provider.server.LocalProvider` (its scripts, faults,
    limits, window and log)."""

    def __init__(self, provider: LocalProvider, clock: Callable[[], float] = time.monotonic) -> None:
        self.provider = provider
        self.signer = Signer()
        self.cache = PromptCache()
        self.clock = clock
        """The clock the cache's time to live runs on (a test may replace it)."""

    async def handle(self, request: Request) -> Response:
        provider = self.provider
        received = time.time()
        authorized = provider._authorized(request)
        try:
            body = _decode_body.decode(await request.body())
        except msgspec.DecodeError as exc:
            return error_response(anthropic.bad_request(f"There was an issue with your request body: {exc}"))
        raw_model = body.get("model")
        model = (raw_model if isinstance(raw_model, str) and raw_model else "-").removeprefix("anthropic/")
        stream = bool(body.get("stream"))

        def log(status: int, outcome: str, count: PromptCount | None = None, source: str = "-") -> None:
            provider._record(
                request, body, model, stream, count, status, outcome, source, authorized, received
            )

        if not authorized:
            log(401, "auth")
            return error_response(anthropic.auth_error())
        if not request.headers.get("anthropic-version"):
            log(400, "error")
            return error_response(anthropic.bad_request("anthropic-version: header is required"))
        try:
            parsed = parse(body, self.signer)
        except _Problem as problem:
            log(problem.error.status, "error")
            return error_response(problem.error)
        chat, tools = as_chat(parsed)
        blocks = prompt_blocks(parsed, provider._counter)
        prompt_tokens = sum(b.tokens for b in blocks) + REPLY_PRIMING
        limiter = provider.limiter
        key = request.headers.get("x-api-key") or provider._bearer_of(request)
        levels: dict[str, str] = {}
        if limiter.active:
            decision = limiter.admit(key, prompt_tokens + parsed.max_tokens, time.monotonic())
            levels = self._limit_headers(decision.levels)
            if not decision.admitted:
                log(429, "rate_limit", PromptCount(prompt_tokens, 0))
                value = {"requests": limiter.rpm, "tokens": limiter.tpm}.get(
                    decision.limit
                ) or limiter.max_concurrent
                return error_response(
                    anthropic.rate_limit_error(
                        model,
                        decision.retry_after,
                        limit=decision.limit,
                        limit_value=int(value or 0),
                        headers=levels,
                    )
                )
        try:
            response = await self._answer(
                request, parsed, model, chat, tools, blocks, prompt_tokens, log, levels
            )
        except BaseException:
            if limiter.active:
                limiter.release(key)
            raise
        if limiter.active:
            if isinstance(response, StreamingResponse):
                response.body_iterator = _released(response.body_iterator, lambda: limiter.release(key))
            else:
                limiter.release(key)
        return response

    def _limit_headers(self, levels: tuple[tuple[str, float, float, float], ...]) -> dict[str, str]:
        if not self.provider.limiter.headers:
            return {}
        now = time.time()
        out: dict[str, str] = {}
        for name, limit, remaining, reset in levels:
            out.update(anthropic.rate_limit_headers(name, limit, remaining, reset, now))
        return out

    async def _answer(
        self,
        request: Request,
        parsed: Parsed,
        model: str,
        chat: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        blocks: list[Block],
        prompt_tokens: int,
        log: Callable[..., None],
        headers: dict[str, str],
    ) -> Response:
        provider = self.provider
        fault = provider._take_fault()
        window = provider._window_of(model)
        count = PromptCount(prompt_tokens, 0)
        if fault is None and prompt_tokens > window:
            error = anthropic.overflow(prompt_tokens, window, parsed.max_tokens)
            log(error.status, "overflow", count)
            return error_response(error)
        source = "policy"
        if fault is None:
            turn, source, problem = provider._next_turn(model, chat, tools)
            if problem is not None:
                log(problem.status, "error", count, source)
                return error_response(anthropic.bad_request(str(problem.body["error"]["message"])))
            fault = turn.fault
        else:
            turn = Turn()
        if fault is not None:
            log(fault_status(fault, overloaded=529), fault.kind, count, source)
            return await self._fault(request, fault, model, parsed, count)
        min_tokens = provider.cache_min_tokens or anthropic.min_cacheable_tokens(model)
        use = self.cache.use(blocks, min_tokens=min_tokens, now=self.clock())
        if turn.prompt_tokens is not None:
            prompt_tokens = turn.prompt_tokens
        delay = provider.latency if turn.latency is None else turn.latency
        if delay > 0:
            await asyncio.sleep(delay)
        log(200, "ok", PromptCount(prompt_tokens, use.read, use.write), source)
        turn = provider._counter.cut(turn, parsed.max_tokens)
        output, _ = provider._counter.completion(
            turn.text, turn.reasoning, [(spec.name, spec.arguments) for spec in turn.tool_calls]
        )
        signature = self.signer.sign(turn.reasoning, turn.reasoning_signature) if turn.reasoning else None
        reply = Reply(turn, model, usage_of(prompt_tokens, use, output), signature)
        if not parsed.stream:
            return json_response(200, reply.message(), headers or None)
        sse = {**_SSE_HEADERS, **headers}
        frames = reply.events(provider.chunk_chars)
        if provider.chunk_delay <= 0:
            return Response(b"".join(frames), media_type="text/event-stream", headers=sse)
        return StreamingResponse(provider._paced(frames), media_type="text/event-stream", headers=sse)

    async def _fault(
        self, request: Request, fault: Fault, model: str, parsed: Parsed, count: PromptCount
    ) -> Response:
        provider = self.provider
        window = provider._window_of(model)
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        words = errors.FaultWords(
            rate_limit=lambda: anthropic.rate_limit_error(model, fault.retry_after),
            server_error=anthropic.api_error,
            overloaded=lambda status: anthropic.error("overloaded_error", "Overloaded", status or 529),
            auth=anthropic.auth_error,
            overflow=lambda prompt: anthropic.overflow(prompt, window, parsed.max_tokens),
            frames=lambda phrase: self._fault_events(phrase, model, count),
            error_event=event("error", error),
            keepalive=event("ping", {"type": "ping"}),
        )
        return await provider.fault_response(request, fault, count, parsed.stream, words)

    def _fault_events(self, phrase: str, model: str, count: PromptCount) -> Iterator[bytes]:
        reply = Reply(Turn(text=phrase * 4), model, usage_of(count.prompt_tokens, CacheUse(0, 0, 0), 1), None)
        return reply.events(max(1, self.provider.chunk_chars // 2))


def _sse(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=_SSE_HEADERS)


async def _released(body: Any, release: Callable[[], None]) -> AsyncIterator[Any]:
    try:
        async for piece in body:
            yield piece
    finally:
        release()
