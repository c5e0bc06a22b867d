"""OpenTelemetry spans of the runtime's work (design §7.5), after the GenAI semantic conventions.

One ``invoke_agent`` span per turn, with a ``chat`` span per provider call, an ``execute_tool`` span per tool
call and a ``compaction`` span per compaction under it (a compaction's summarizer calls are ``chat`` spans
under the compaction). A manual compaction outside a turn is a root span; a sub-agent's turn is a child of
the ``execute_tool`` span of the delegation that started it.

The work of one turn hops between actor threads, the gateway's asyncio loop and the tool workers, so no span
is ever made "current" (OpenTelemetry's context is thread- and task-local): every span is started with an
explicit parent, which the agent keeps with its turn and the compactor with its job. :class:`Tracing` keeps
the open turn span of each session, which is how a compaction finds its turn, and the open tool spans by
call id, which is how a sub-agent's turn finds the call it answers.

Prompt and completion text (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions``, ``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``) are recorded
only with ``telemetry.record_content = true``.

This module imports ``opentelemetry``; :func:`runtime.observability.tracing_for` decides whether it is
needed at all, so a runtime without tracing never imports it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from runtime.messages import Message, ReasoningPart, TextPart, ToolCallPart, Usage

__all__ = ["PROVIDER_NAMES", "Tracing"]

INSTRUMENTATION = "agentcell"

# litellm's provider names -> the gen_ai.provider.name values of the conventions (others pass unchanged).
PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}

# Attribute names: the GenAI conventions' own, then agentcell's for what they do not name.
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
CONVERSATION = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
SESSION_ID = "agentcell.session.id"
TURN_ID = "agentcell.turn.id"


class Tracing:
    """Starts and ends the runtime's spans on ``tracer``; thread-safe (spans are started and ended on
    whichever thread the work is on, always with an explicit parent)."""

    def __init__(self, tracer: trace.Tracer, *, record_content: bool = False) -> None:
        self.tracer = tracer
        self.record_content = record_content
        self._turns: dict[str, Span] = {}  # session id -> its open turn span
        self._tools: dict[tuple[str, str], Span] = {}  # (session id, call id) -> open execute_tool span
        self._lock = threading.Lock()
        self.parent_of: Callable[[str], tuple[str, str] | None] = lambda session_id: None
        """A sub-agent session's (parent session, call id): the runtime sets the event bus's ``parent_of``."""

    @classmethod
    def for_provider(cls, provider: trace.TracerProvider | None, *, record_content: bool = False) -> Tracing:
        """Spans on ``provider``'s tracer (None: the global provider, resolved when spans start)."""
        from runtime._version import __version__

        if provider is None:
            tracer = trace.get_tracer(INSTRUMENTATION, __version__)
        else:
            tracer = provider.get_tracer(INSTRUMENTATION, __version__)
        return cls(tracer, record_content=record_content)

    # -- turns ----------------------------------------------------------------------------------------
    def start_turn(
        self, session_id: str, turn_id: str, *, model: str, inputs: Sequence[Message] = ()
    ) -> Span:
        """The ``invoke_agent`` span of a turn (a child of the delegating tool call's span for a sub-agent);
        ``inputs``: what the prompt records (the user's message, or a client's tool results)."""
        parent: Span | None = None
        link = self.parent_of(session_id)
        if link is not None:
            parent = self._tools.get(link)
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            PROVIDER: _provider_name(None, model),
            AGENT_NAME: INSTRUMENTATION,
            CONVERSATION: session_id,
            REQUEST_MODEL: model,
            SESSION_ID: session_id,
            TURN_ID: turn_id,
        }
        if self.record_content and inputs:
            attributes[INPUT_MESSAGES] = _messages_json(inputs)
        span = self.tracer.start_span(
            f"invoke_agent {INSTRUMENTATION}",
            context=_context(parent),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        with self._lock:
            self._turns[session_id] = span
        return span

    def end_turn(
        self,
        span: Span,
        session_id: str,
        *,
        status: str,
        usage: Usage,
        steps: int,
        error: str | None = None,
        code: str | None = None,
        answer: Message | None = None,
    ) -> None:
        with self._lock:
            if self._turns.get(session_id) is span:
                del self._turns[session_id]
        if not span.is_recording():
            span.end()
            return
        span.set_attributes(
            {**_usage_attributes(usage), "agentcell.turn.status": status, "agentcell.turn.steps": steps}
        )
        if self.record_content and answer is not None and status == "ok":
            span.set_attribute(OUTPUT_MESSAGES, _messages_json([answer], finish_reason=answer.stop_reason))
        if status == "error":
            span.set_attribute(ERROR_TYPE, code or "_OTHER")
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def turn_span(self, session_id: str) -> Span | None:
        """The session's open turn span, if a turn is running."""
        return self._turns.get(session_id)

    # -- provider calls -------------------------------------------------------------------------------
    def start_chat(
        self,
        parent: Span | None,
        session_id: str,
        request: Any,  # runtime.gateway.CompletionRequest
        *,
        turn_id: str | None = None,
        provider: str | None = None,
        purpose: str | None = None,
    ) -> Span:
        """A ``chat`` span for one provider call (its retries included), a child of ``parent``."""
        attributes: dict[str, Any] = {
            OPERATION: "chat",
            PROVIDER: _provider_name(provider, request.model),
            REQUEST_MODEL: request.model,
            CONVERSATION: session_id,
            SESSION_ID: session_id,
        }
        if turn_id is not None:
            attributes[TURN_ID] = turn_id
        if purpose is not None:
            attributes["agentcell.call.purpose"] = purpose
        if request.max_tokens is not None:
            attributes[REQUEST_MAX_TOKENS] = request.max_tokens
        if request.temperature is not None:
            attributes[REQUEST_TEMPERATURE] = request.temperature
        if request.api_base:
            parts = urlsplit(request.api_base)
            if parts.hostname:
                attributes["server.address"] = parts.hostname
                attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
        if self.record_content:
            system = [m for m in request.messages if isinstance(m, Message) and m.role == "system"]
            rest = [m for m in request.messages if isinstance(m, Message) and m.role != "system"]
            if system:
                attributes[SYSTEM_INSTRUCTIONS] = json.dumps(
                    [{"type": "text", "content": m.text} for m in system], ensure_ascii=False
                )
            attributes[INPUT_MESSAGES] = _messages_json(rest)
        return self.tracer.start_span(
            f"chat {request.model}", context=_context(parent), kind=SpanKind.CLIENT, attributes=attributes
        )

    def watch_chat(
        self, span: Span, on_result: Callable[[Any], object], on_retry: Callable[[Any], object] | None
    ) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        """``Gateway.complete`` callbacks that also record the call on ``span``: its retries as events, and
        its result (delivered exactly once, from the gateway's loop) ending it."""

        def result(value: Any) -> None:
            self.end_chat(span, value)
            on_result(value)

        def retry(info: Any) -> None:
            self.chat_retry(span, info)
            if on_retry is not None:
                on_retry(info)

        return result, retry

    def chat_retry(self, span: Span, info: Any) -> None:  # info: runtime.gateway.RetryInfo
        """A failed attempt that will be retried: an event on the call's span."""
        attributes: dict[str, Any] = {
            "agentcell.retry.attempt": info.attempt,
            "agentcell.retry.max_attempts": info.max_attempts,
            "agentcell.retry.delay": info.delay,
            ERROR_TYPE: info.kind,
            "exception.message": info.error,
        }
        if info.status_code is not None:
            attributes["http.response.status_code"] = info.status_code
        span.add_event("retry", attributes)

    def end_chat(self, span: Span, result: Any) -> None:  # result: runtime.gateway.CompletionResult
        """End a ``chat`` span with the call's usage and finish reason, or its error."""
        if not span.is_recording():
            span.end()
            return
        span.set_attribute("agentcell.attempts", result.attempts)
        if result.transport:
            span.set_attribute("agentcell.transport", result.transport)
        if result.pool:  # admission control (design §3.11): the key's pool and the wait for its capacity
            span.set_attribute("agentcell.capacity.pool", result.pool)
            span.set_attribute("agentcell.capacity.waited_seconds", round(result.waited, 3))
        error = result.error
        message: Message | None = result.message
        if error is not None:
            span.set_attribute(ERROR_TYPE, error.kind)
            if error.status_code is not None:
                span.set_attribute("http.response.status_code", error.status_code)
            if error.kind != "cancelled":
                span.set_status(Status(StatusCode.ERROR, error.message))
        elif message is not None:
            span.set_attributes(_usage_attributes(message.usage or result.usage))
            finish = message.stop_reason or ("tool_calls" if message.tool_calls else "stop")
            span.set_attribute(FINISH_REASONS, [finish])
            if self.record_content:
                span.set_attribute(OUTPUT_MESSAGES, _messages_json([message], finish_reason=finish))
        span.end()

    # -- tool calls -----------------------------------------------------------------------------------
    def start_tool(self, parent: Span | None, session_id: str, turn_id: str, call: ToolCallPart) -> Span:
        """An ``execute_tool`` span for one tool call, a child of the turn's span."""
        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: call.name,
            TOOL_CALL_ID: call.id,
            TOOL_TYPE: "function",
            CONVERSATION: session_id,
            SESSION_ID: session_id,
            TURN_ID: turn_id,
        }
        if self.record_content:
            attributes[TOOL_ARGUMENTS] = call.arguments
        span = self.tracer.start_span(
            f"execute_tool {call.name}",
            context=_context(parent),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        with self._lock:
            self._tools[(session_id, call.id)] = span
        return span

    def watch_tools(
        self,
        parent: Span | None,
        session_id: str,
        turn_id: str,
        on_start: Callable[[ToolCallPart], None],
        on_done: Callable[[Any], None],
    ) -> tuple[Callable[[ToolCallPart], None], Callable[[Any], None]]:
        """``ToolExecutor.run`` callbacks that also give each call an ``execute_tool`` span: from when a
        worker takes it up to its result (a call aborted before it started gets a span at its result)."""
        spans: dict[str, Span] = {}

        def started(call: ToolCallPart) -> None:
            spans[call.id] = self.start_tool(parent, session_id, turn_id, call)
            on_start(call)

        def done(result: Any) -> None:  # runtime.tools.executor.ToolRunResult
            span = spans.pop(result.call.id, None)
            if span is None:
                span = self.start_tool(parent, session_id, turn_id, result.call)
            self.end_tool(span, session_id, result)
            on_done(result)

        return started, done

    def end_tool(self, span: Span, session_id: str, result: Any) -> None:  # runtime.tools.ToolRunResult
        with self._lock:
            self._tools.pop((session_id, result.call.id), None)
        message: Message = result.message
        if span.is_recording():
            span.set_attribute("agentcell.tool.output_chars", len(message.text))
            if result.truncated:
                span.set_attribute("agentcell.tool.truncated", True)
            if self.record_content:
                span.set_attribute(TOOL_RESULT, message.text)
            if message.is_error:
                kind = message.metadata.get("error")
                span.set_attribute(ERROR_TYPE, kind if isinstance(kind, str) else "tool_error")
                span.set_status(Status(StatusCode.ERROR, message.text[:200]))
        span.end()

    # -- compactions ----------------------------------------------------------------------------------
    def start_compaction(
        self, session_id: str, *, trigger: str, mode: str, messages_before: int, tokens_before: int
    ) -> Span:
        """A ``compaction`` span, a child of the session's running turn (a root span outside a turn)."""
        return self.tracer.start_span(
            "compaction",
            context=_context(self._turns.get(session_id)),
            kind=SpanKind.INTERNAL,
            attributes={
                CONVERSATION: session_id,
                SESSION_ID: session_id,
                "agentcell.compaction.trigger": trigger,
                "agentcell.compaction.mode": mode,
                "agentcell.compaction.messages_before": messages_before,
                "agentcell.compaction.tokens_before": tokens_before,
            },
        )

    def end_compaction(
        self,
        span: Span,
        *,
        messages_after: int | None = None,
        tokens_after: int | None = None,
        summary_chars: int | None = None,
        fallback: bool = False,
        error: str | None = None,
        reason: str | None = None,
        skipped: str | None = None,
    ) -> None:
        if span.is_recording():
            if skipped is not None:  # nothing to reduce: no error
                span.set_attribute("agentcell.compaction.skipped", skipped)
            elif error is not None:
                span.set_attribute(ERROR_TYPE, reason or "_OTHER")
                span.set_status(Status(StatusCode.ERROR, error))
            else:
                span.set_attributes(
                    {
                        "agentcell.compaction.messages_after": messages_after or 0,
                        "agentcell.compaction.tokens_after": tokens_after or 0,
                        "agentcell.compaction.summary_chars": summary_chars or 0,
                        "agentcell.compaction.fallback": fallback,
                    }
                )
        span.end()


def _context(parent: Span | None) -> Any:
    """The context to start a child of ``parent`` in (an empty one: a root span). Never the current one."""
    if parent is None:
        return trace.set_span_in_context(trace.INVALID_SPAN)
    return trace.set_span_in_context(parent)


def _provider_name(provider: str | None, model: str) -> str:
    """``gen_ai.provider.name``: litellm's provider for the call (else the model's prefix; none: openai), in
    the conventions' spelling where they have one."""
    if not provider:
        prefix, slash, _ = model.partition("/")
        provider = prefix if slash else "openai"
    return PROVIDER_NAMES.get(provider, provider)


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        INPUT_TOKENS: usage.input_tokens,
        OUTPUT_TOKENS: usage.output_tokens,
        CACHE_READ_TOKENS: usage.cache_read_tokens,
    }
    if usage.cache_write_tokens:
        attributes[CACHE_WRITE_TOKENS] = usage.cache_write_tokens
    if usage.reasoning_tokens:
        attributes[REASONING_TOKENS] = usage.reasoning_tokens
    if usage.cost is not None:
        attributes["agentcell.usage.cost"] = usage.cost
    if usage.costs is not None:
        attributes["agentcell.usage.cost.input"] = usage.costs.input
        attributes["agentcell.usage.cost.cache_read"] = usage.costs.cache_read
        attributes["agentcell.usage.cost.cache_write"] = usage.costs.cache_write
        attributes["agentcell.usage.cost.output"] = usage.costs.output
        attributes["agentcell.usage.cost.saved"] = usage.costs.saved
    return attributes


def _messages_json(messages: Sequence[Message], finish_reason: str | None = None) -> str:
    """Messages in the conventions' input/output messages JSON form (role, parts[, finish_reason])."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        if message.role == "tool":
            parts.append({"type": "tool_call_response", "id": message.tool_call_id, "result": message.text})
        else:
            for part in message.parts:
                if isinstance(part, TextPart):
                    parts.append({"type": "text", "content": part.text})
                elif isinstance(part, ReasoningPart):
                    parts.append({"type": "reasoning", "content": part.text})
                elif isinstance(part, ToolCallPart):
                    parts.append(
                        {"type": "tool_call", "id": part.id, "name": part.name, "arguments": part.arguments}
                    )
                else:
                    parts.append({"type": "uri", "modality": "image", "uri": getattr(part, "url", "")})
        entry: dict[str, Any] = {"role": message.role, "parts": parts}
        if finish_reason is not None:
            entry["finish_reason"] = finish_reason
        out.append(entry)
    return json.dumps(out, ensure_ascii=False)
