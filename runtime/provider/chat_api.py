"""The local provider's chat completions (design §7.3): ``POST /v1/chat/completions``, streamed as OpenAI's SSE
chunks or not. The request's window, limits, faults and reply (a script, a responder or the policy) come from
the :class:`~runtime.provider.server.LocalProvider`; here they are said in OpenAI's shape, with exact usage
(``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``), OpenAI's errors
(:mod:`runtime.provider.errors`) and ``x-ratelimit-*`` headers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runtime.provider import errors
from runtime.provider._http import (
    SSE_DONE,
    SSE_HEADERS,
    bearer,
    error_response,
    fault_status,
    json_response,
    pieces,
    sse_frames,
    within_slot,
)
from runtime.provider.limits import Decision, ProviderLimiter
from runtime.provider.script import Fault, ToolCallSpec, Turn
from runtime.provider.usage import PromptCount, TokenCounter

if TYPE_CHECKING:
    from runtime.provider._provider import Provider

DEFAULT_MODEL: Final = "agentcell-local"
"""The model a request that names none is answered as (listed by ``GET /v1/models``)."""

_json = msgspec.json.Encoder()
_decode_body = msgspec.json.Decoder(dict[str, Any])


class ChatEndpoint:
    """``POST /v1/chat/completions`` of a :class:`~runtime.provider.server.LocalProvider` (its scripts, faults,
    limits, window and log)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    async def handle(self, request: Request) -> Response:
        provider = self.provider
        received = time.time()
        authorized = provider._authorized(request)
        try:
            body = _decode_body.decode(await request.body())
        except msgspec.DecodeError as exc:
            return error_response(
                errors.bad_request(f"We could not parse the JSON body of your request: {exc}")
            )
        model = _model_name(body.get("model"))
        stream = bool(body.get("stream"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return error_response(
                errors.bad_request("'messages' must be an array of objects", param="messages")
            )

        def log(status: int, outcome: str, count: PromptCount | None = None, source: str = "-") -> None:
            provider._record(
                request, body, model, stream, count, status, outcome, source, authorized, received
            )

        if not authorized:
            log(401, "auth")
            return error_response(errors.auth_error())
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        count = provider._counter.prompt(messages, tools, model=model).scaled(provider.prompt_ratio)
        limiter = provider.limiter
        if not limiter.active:
            return await self._answer(request, body, model, stream, messages, tools, count, log, {})
        key = bearer(request)
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        tokens = count.prompt_tokens + (cap if isinstance(cap, int) and cap > 0 else 0)
        decision = limiter.admit(key, tokens, time.monotonic())
        if not decision.admitted:
            log(429, "rate_limit", count)
            return error_response(_limit_error(model, decision, limiter))
        answer = self._answer(request, body, model, stream, messages, tools, count, log, decision.headers)
        return await within_slot(limiter, key, answer)

    async def _answer(
        self,
        request: Request,
        body: dict[str, Any],
        model: str,
        stream: bool,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        count: PromptCount,
        log: Callable[..., None],
        limit_headers: dict[str, str],
    ) -> Response:
        provider = self.provider
        fault = provider._take_fault()
        window = provider._window_of(model)
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        completion = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else 0
        answer = completion if provider.refuse_answer_overflow else 0
        if fault is None and count.prompt_tokens + answer > window:
            error = errors.overflow_error(provider.overflow_format, count.prompt_tokens, window, completion)
            log(error.status, "overflow", count)
            return error_response(error)
        source = "policy"
        if fault is None:
            turn, source, problem = provider._next_turn(model, messages, tools)
            if problem is not None:
                log(problem.status, "error", count, source)
                return error_response(problem)
            fault = turn.fault
        else:
            turn = Turn()
        if fault is not None:
            log(fault_status(fault, overloaded=503), fault.kind, count, source)
            return await self._fault(request, fault, model, count, stream)
        delay = provider.latency if turn.latency is None else turn.latency
        if delay > 0:
            await asyncio.sleep(delay)
        log(200, "ok", count, source)
        turn = provider._counter.cut(turn, body.get("max_completion_tokens") or body.get("max_tokens"))
        reply = ChatReply(turn, model, count, provider._counter, provider.reasoning_field)
        if not stream:
            return json_response(200, reply.completion(), limit_headers or None)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        frames = reply.sse_frames(provider.chunk_chars, include_usage)
        headers = {**SSE_HEADERS, **limit_headers} if limit_headers else SSE_HEADERS
        return sse_frames(frames, provider.chunk_delay, headers)

    async def _fault(
        self, request: Request, fault: Fault, model: str, count: PromptCount, stream: bool
    ) -> Response:
        provider = self.provider

        def overflow(prompt: int) -> errors.ErrorResponse:
            return errors.overflow_error(provider.overflow_format, prompt, provider.context_window)

        error = b"data: " + _json.encode(errors.server_error().body) + b"\n\n"
        words = errors.FaultWords(
            rate_limit=lambda: errors.rate_limit_error(model, fault.retry_after, limit_value=fault.rpm or 60),
            server_error=errors.server_error,
            overloaded=errors.overloaded_error,
            auth=errors.auth_error,
            overflow=overflow,
            frames=lambda phrase: self._fault_frames(phrase, model, count),
            error_event=error,
        )
        return await provider.faults.respond(
            request, fault, count, stream, words, context_window=provider.context_window
        )

    def _fault_frames(self, phrase: str, model: str, count: PromptCount) -> Iterator[bytes]:
        """The SSE frames of a reply that a mid-stream fault breaks into (``phrase`` four times over)."""
        reply = ChatReply(Turn(text=phrase * 4), model, count, self.provider._counter)
        return reply.sse_frames(max(1, self.provider.chunk_chars // 2), include_usage=True)


def _limit_error(model: str, decision: Decision, limiter: ProviderLimiter) -> errors.ErrorResponse:
    return errors.rate_limit_error(
        model,
        decision.retry_after,
        limit=decision.limit,
        limit_value=limiter.limit_of(decision.limit),
        headers=decision.headers,
    )


def _model_name(raw: Any) -> str:
    name = raw if isinstance(raw, str) and raw else DEFAULT_MODEL
    return name.removeprefix("openai/")


class ChatReply:
    """One reply rendered as a chat completion or as SSE chunks, with exact usage."""

    def __init__(
        self,
        turn: Turn,
        model: str,
        count: PromptCount,
        counter: TokenCounter,
        reasoning_field: str = "reasoning_content",
    ) -> None:
        self.turn = turn
        self.reasoning_field = reasoning_field
        self.model = model
        self.id = "chatcmpl-" + os.urandom(12).hex()
        self.created = int(time.time())
        self.calls = [(spec.id or f"call_{os.urandom(12).hex()}", spec) for spec in turn.tool_calls]
        completion, reasoning = counter.completion(
            turn.text, turn.reasoning, [(spec.name, spec.arguments) for spec in turn.tool_calls]
        )
        prompt_tokens = count.prompt_tokens if turn.prompt_tokens is None else turn.prompt_tokens
        self.usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": count.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _thinking_blocks(self) -> list[dict[str, Any]] | None:
        if not self.turn.reasoning or self.turn.reasoning_signature is None:
            return None
        return [
            {"type": "thinking", "thinking": self.turn.reasoning, "signature": self.turn.reasoning_signature}
        ]

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.turn.text or None}
        if self.turn.reasoning:
            message[self.reasoning_field] = self.turn.reasoning
        blocks = self._thinking_blocks()
        if blocks:
            message["thinking_blocks"] = blocks
        if self.calls:
            message["tool_calls"] = [_tool_call(call_id, spec) for call_id, spec in self.calls]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_agentcell",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.turn.effective_finish_reason,
                }
            ],
            "usage": self.usage,
        }

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_agentcell",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        return b"data: " + _json.encode(chunk) + b"\n\n"

    def sse_frames(self, size: int, include_usage: bool) -> Iterator[bytes]:
        """The reply as SSE frames: role, reasoning, content, tool calls (arguments split), finish, usage."""
        yield self._chunk({"role": "assistant", "content": ""})
        thoughts = pieces(self.turn.reasoning, size)
        blocks = self._thinking_blocks()
        for i, piece in enumerate(thoughts):
            delta: dict[str, Any] = {self.reasoning_field: piece}
            if blocks and i == len(thoughts) - 1:
                delta["thinking_blocks"] = [{**blocks[0], "thinking": ""}]
            yield self._chunk(delta)
        for piece in pieces(self.turn.text, size):
            yield self._chunk({"content": piece})
        for index, (call_id, spec) in enumerate(self.calls):
            head = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": spec.name, "arguments": ""},
            }
            yield self._chunk({"tool_calls": [head]})
            for piece in pieces(spec.arguments, size):
                yield self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield self._chunk({}, self.turn.effective_finish_reason)
        if include_usage:
            usage_chunk = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": "fp_agentcell",
                "choices": [],
                "usage": self.usage,
            }
            yield b"data: " + _json.encode(usage_chunk) + b"\n\n"
        yield SSE_DONE


def _tool_call(call_id: str, spec: ToolCallSpec) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": spec.name, "arguments": spec.arguments}}
