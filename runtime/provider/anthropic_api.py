"""The local provider's Anthropic Messages API: ``POST /v1/messages``, streamed as Anthropic's SSE events or not
(design §7.3). The same scripts, responders, policy, faults and limits as chat completions, in Anthropic's words.
This module is the endpoint and its replies; the request is checked and read in
:mod:`runtime.provider.anthropic_request`.

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
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runtime.dialects import anthropic
from runtime.dialects._base import ErrorResponse
from runtime.provider import errors
from runtime.provider._http import (
    SSE_HEADERS,
    bearer,
    error_response,
    fault_status,
    json_response,
    pieces,
    sse_frames,
    within_slot,
)
from runtime.provider.anthropic_request import Parsed, Signer, as_chat, parse, prompt_blocks
from runtime.provider.prompt_cache import Block, CacheUse, PromptCache
from runtime.provider.script import Fault, Turn
from runtime.provider.usage import REPLY_PRIMING, PromptCount

if TYPE_CHECKING:
    from runtime.provider._provider import Provider


_json = msgspec.json.Encoder()
_decode_body = msgspec.json.Decoder(dict[str, Any])
_STOP_REASONS: Final = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


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
            for piece in pieces(self.turn.reasoning, size):
                yield _delta(index, {"type": "thinking_delta", "thinking": piece})
            yield _delta(index, {"type": "signature_delta", "signature": self.signature or ""})
            yield _block_stop(index)
            index += 1
        if self.turn.text:
            yield _block_start(index, {"type": "text", "text": ""})
            for piece in pieces(self.turn.text, size):
                yield _delta(index, {"type": "text_delta", "text": piece})
            yield _block_stop(index)
            index += 1
        for call_id, spec in self.calls:
            yield _block_start(index, {"type": "tool_use", "id": call_id, "name": spec.name, "input": {}})
            for piece in pieces(spec.arguments, size):
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

    def __init__(self, provider: Provider, clock: Callable[[], float] = time.monotonic) -> None:
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
        parsed = parse(body, self.signer)
        if isinstance(parsed, ErrorResponse):
            log(parsed.status, "error")
            return error_response(parsed)
        chat, tools = as_chat(parsed)
        blocks = prompt_blocks(parsed, provider._counter)
        prompt_tokens = sum(b.tokens for b in blocks) + REPLY_PRIMING
        limiter = provider.limiter
        key = request.headers.get("x-api-key") or bearer(request)
        levels: dict[str, str] = {}
        if limiter.active:
            decision = limiter.admit(key, prompt_tokens + parsed.max_tokens, time.monotonic())
            levels = self._limit_headers(decision.levels)
            if not decision.admitted:
                log(429, "rate_limit", PromptCount(prompt_tokens, 0))
                return error_response(
                    anthropic.rate_limit_error(
                        model,
                        decision.retry_after,
                        limit=decision.limit,
                        limit_value=limiter.limit_of(decision.limit),
                        headers=levels,
                    )
                )
        answer = self._answer(request, parsed, model, chat, tools, blocks, prompt_tokens, log, levels)
        return await within_slot(limiter, key, answer) if limiter.active else await answer

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
        frames = reply.events(provider.chunk_chars)
        return sse_frames(frames, provider.chunk_delay, {**SSE_HEADERS, **headers})

    @staticmethod
    def _rate_limited(model: str, fault: Fault) -> ErrorResponse:
        """A ``rate_limit`` fault's 429: with ``fault.rpm``, the request limit in the headers too."""
        if fault.rpm is None:
            return anthropic.rate_limit_error(model, fault.retry_after)
        reported = anthropic.rate_limit_headers("requests", fault.rpm, 0, 60 / fault.rpm, time.time())
        return anthropic.rate_limit_error(model, fault.retry_after, limit_value=fault.rpm, headers=reported)

    async def _fault(
        self, request: Request, fault: Fault, model: str, parsed: Parsed, count: PromptCount
    ) -> Response:
        provider = self.provider
        window = provider._window_of(model)
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        words = errors.FaultWords(
            rate_limit=lambda: self._rate_limited(model, fault),
            server_error=anthropic.api_error,
            overloaded=lambda status: anthropic.error("overloaded_error", "Overloaded", status or 529),
            auth=anthropic.auth_error,
            overflow=lambda prompt: anthropic.overflow(prompt, window, parsed.max_tokens),
            frames=lambda phrase: self._fault_events(phrase, model, count),
            error_event=event("error", error),
            keepalive=event("ping", {"type": "ping"}),
        )
        return await provider.faults.respond(
            request, fault, count, parsed.stream, words, context_window=provider.context_window
        )

    def _fault_events(self, phrase: str, model: str, count: PromptCount) -> Iterator[bytes]:
        reply = Reply(Turn(text=phrase * 4), model, usage_of(count.prompt_tokens, CacheUse(0, 0, 0), 1), None)
        return reply.events(max(1, self.provider.chunk_chars // 2))
