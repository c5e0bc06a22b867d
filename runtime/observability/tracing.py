"""OpenTelemetry spans of the runtime's work (design §7.5), after the GenAI semantic conventions, made from
the event bus.

One ``invoke_agent`` span per turn, with a ``chat`` span per provider call, an ``execute_tool`` span per tool
call and a ``compaction`` span per compaction under it (a compaction's summarizer calls are ``chat`` spans
under the compaction). A manual compaction outside a turn is a root span; a sub-agent's turn is a child of
the ``execute_tool`` span of the delegation that started it.

The spans are derived from the events, as the metrics are: :class:`Tracing` subscribes once to every
session's events of the types it has a rule for (:data:`SPAN_TYPES`; a rule is a method marked
``@_traces(EventClass)``), and a thread of its own reads them and opens and ends spans at the events' own
timestamps. Nothing on the turn's path knows of spans: the turn machine, the agent, the compactor, the
gateway and the tools publish their events as they do without tracing. The facts a span needs are fields
of its events (the turn's ``model`` and ``steps``, a call's ``provider``, ``server_address``, ``attempts``,
``pool``, a tool error's kind, ...); the spans' parents are the events' own links (a turn's session and
``turn_id``, a sub-agent's ``parent_call_id``). Where a sub-agent's events can come before its delegating
call's (a cluster front: events of two shards), ``hold`` keeps them back until that call's span is open,
for a bounded time.

Delivery is the bus's (design §1.4): publishing never waits for the spans. The subscription's queue holds
:data:`QUEUE_SIZE` events (it takes no deltas); its thread applies the rules as they come. If it falls that
far behind, the bus drops the oldest and says so (``subscriber_lagged``): the spans of that session open at that
moment get an ``agentcell.events_lost`` event, a span whose end was lost is ended at the session's next turn
or its ``session_stopped`` with ``agentcell.span.incomplete``, and the rest of the trace goes on. The
runtime's ``stop`` waits for the spans of its last events (:meth:`Tracing.close`) and ends those left open
at the stop's time: the spans take no ``session_stopped`` of the runtime's stop (``bulk=False``), which
would be one event per hosted session, a million for a million idle ones, to end the few spans still open.

Prompt and completion text (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions``, ``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``) are recorded
only with ``telemetry.record_content = true``; the events do not carry it, so it comes through
:class:`~runtime.observability.content.ContentTap` (see there).

This module imports ``opentelemetry``; :func:`runtime.observability.tracing_for` decides whether it is
needed at all, so a runtime without tracing never imports it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from runtime import events as ev
from runtime.messages import Message
from runtime.observability.content import ContentTap
from runtime.observability.genai import (
    AGENT_NAME,
    CONVERSATION,
    ERROR_TYPE,
    FINISH_REASONS,
    INPUT_MESSAGES,
    INSTRUMENTATION,
    OPERATION,
    OUTPUT_MESSAGES,
    PROVIDER,
    REQUEST_MAX_TOKENS,
    REQUEST_MODEL,
    SESSION_ID,
    SYSTEM_INSTRUCTIONS,
    TOOL_ARGUMENTS,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOL_RESULT,
    TOOL_TYPE,
    TURN_ID,
    messages_json,
    provider_name,
    usage_attributes,
)

if TYPE_CHECKING:
    from runtime.bus import Subscription

__all__ = ["QUEUE_SIZE", "SPAN_TYPES", "Tracing"]

log = logging.getLogger("agentcell.tracing")

QUEUE_SIZE = 100_000
"""The events the spans' subscription holds before the bus drops its oldest (design §1.4)."""
LINGER = 0.05
"""Seconds the spans' thread waits before it sleeps on an empty queue (``EventBus.subscribe``'s ``linger``):
woken for each event, it was woken 5-8 times a turn, each a thread switch (``benchmarks.bench_spans``)."""

HELD_EVENTS = 10_000
"""Events of one sub-agent held at most; past that they are made at once (the turn a root span)."""

INCOMPLETE = "agentcell.span.incomplete"

_Rule = TypeVar("_Rule", bound=Callable[..., None])
_RULES: dict[type[ev.Event], Callable[[Any, Any], None]] = {}
"""Each event type the spans are made from -> its rule (a method of :class:`Tracing`)."""


def _traces(kind: type[ev.Event]) -> Callable[[_Rule], _Rule]:
    """Declares a method of :class:`Tracing` the rule for events of ``kind``: the spans subscribe to the
    types that have a rule (:data:`SPAN_TYPES`), so a new span of an event is its rule alone."""

    def register(rule: _Rule) -> _Rule:
        _RULES[kind] = rule
        return rule

    return register


def _ns(ts: float) -> int:
    """An event's timestamp (seconds) as OpenTelemetry's (nanoseconds)."""
    return int(ts * 1e9)


@dataclass
class _Turn:
    span: Span
    turn_id: str
    error: tuple[str, str] | None = None  # the (code, message) of the error event that ends it
    answer: Message | None = None  # its latest answer (recorded content only)


@dataclass
class _Chat:
    span: Span
    request_id: str | None
    started: float  # its start event's ts
    transport: str | None = None

    def end(self, ts: float, latency: float) -> None:
        """End it when the call ended: ``latency`` after its start (the gateway's count), else at ``ts``
        (its end event's time, which may come later: a turn's comes once the answer is recorded)."""
        self.span.end(end_time=_ns(min(ts, self.started + latency) if latency > 0 else ts))


@dataclass
class _Held:
    """A sub-agent's events that came before the span of the call that delegated to it."""

    call: tuple[str, str]  # (parent session, call id)
    until: float  # time.monotonic() past which they are made without it
    events: list[ev.Event]


@dataclass
class _Session:
    """The open spans of one session."""

    turn: _Turn | None = None
    chat: _Chat | None = None  # the turn's provider call in flight
    tools: dict[str, Span] = field(default_factory=dict)  # call id -> its execute_tool span
    compaction: Span | None = None
    summaries: dict[str, _Chat] = field(default_factory=dict)  # request id -> a summarizer call's span

    @property
    def turn_span(self) -> Span | None:
        """The running turn's span: the parent of what the session does inside a turn."""
        return self.turn.span if self.turn is not None else None

    @property
    def idle(self) -> bool:
        """Nothing of it is open."""
        return (
            self.turn is None
            and self.chat is None
            and not self.tools
            and self.compaction is None
            and not self.summaries
        )

    def spans(self) -> Iterable[Span]:
        if self.chat is not None:
            yield self.chat.span
        yield from self.tools.values()
        yield from (chat.span for chat in self.summaries.values())
        if self.compaction is not None:
            yield self.compaction
        if self.turn is not None:
            yield self.turn.span


class Tracing:
    """The runtime's spans on ``tracer``, made from its events (see the module's docstring).

    :meth:`attach` subscribes to a bus and starts the thread that reads it; :meth:`handle` applies the rules
    to one event (that thread's work, callable directly on events from elsewhere). ``content`` is where
    actors put what spans record of prompts and answers: None unless ``record_content``.
    """

    def __init__(self, tracer: trace.Tracer, *, record_content: bool = False, hold: float = 0.0) -> None:
        """``hold`` (seconds): where a sub-agent's ``agent_start`` may come before the ``tool_execution_start``
        of the call that delegated to it (events of two shards: a cluster front), its events wait that long
        at most for that call's span, so its turn is that call's child, not a root span. One bus publishes
        the call's start first: 0 there (a call not open by then is over, and the turn a root span)."""
        self.tracer = tracer
        self.record_content = record_content
        self.content: ContentTap | None = ContentTap() if record_content else None
        self.lost = 0
        """Events the subscription lost by falling behind (each ``subscriber_lagged``'s ``dropped``)."""
        self._sessions: dict[str, _Session] = {}
        self._held: dict[str, _Held] = {}  # sub-agent session id -> its events waiting for their parent
        self._hold = hold
        self._subscription: Subscription | None = None
        self._lock = threading.Lock()  # (the subscription's thread applies the rules; close ends the rest)

    @classmethod
    def for_provider(
        cls, provider: trace.TracerProvider | None, *, record_content: bool = False, hold: float = 0.0
    ) -> Tracing:
        """Spans on ``provider``'s tracer (None: the global provider, resolved when spans start)."""
        from runtime._version import __version__

        if provider is None:
            tracer = trace.get_tracer(INSTRUMENTATION, __version__)
        else:
            tracer = provider.get_tracer(INSTRUMENTATION, __version__)
        return cls(tracer, record_content=record_content, hold=hold)

    # -- the subscription -------------------------------------------------------------------------------
    def attach(self, subscribe: Callable[..., Subscription], *, queue_size: int = QUEUE_SIZE) -> None:
        """Make spans of the events from now on, on the subscription's own thread. ``subscribe``: a
        runtime's ``EventBus.subscribe``, or a cluster front's subscription to every shard's events."""
        self._subscription = subscribe(
            "*", SPAN_TYPES, callback=self.handle, queue_size=queue_size, bulk=False, linger=LINGER
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the spans of every event published so far are made (False if ``timeout`` passed
        first). Every event of a turn is published before its handle resolves, so after
        ``handle.result()`` a flush sees the turn's spans ended (and handed to the span processors)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._subscription is not None and not self._subscription.flush(timeout):
            return False
        while True:  # what is held is made within its hold
            with self._lock:
                self._release(time.monotonic())
                if not self._held:
                    return True
                until = min(held.until for held in self._held.values())
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            time.sleep(max(0.001, min(until, deadline if deadline is not None else until) - now))

    def close(self, timeout: float = 10.0, *, at: float | None = None) -> None:
        """Make the spans of the events published so far, stop reading, and end the spans left open (their
        end was never published: a turn cut off by the runtime's stop) as incomplete, at the time ``at``
        (the runtime stopped its sessions; None: now)."""
        if self._subscription is not None:
            if not self.flush(timeout):
                log.warning("tracing: the spans of some events were not made within %s s", timeout)
            self._subscription.close()
        with self._lock:
            self._release(None)
            for sid in list(self._sessions):
                self._end_session(sid, at)

    def handle(self, event: ev.Event) -> None:
        """Apply the rule of ``event``'s type (if any); a rule that fails is logged, never raised."""
        with self._lock:
            if self._held:
                self._release(time.monotonic())
            held = self._held.get(event.session_id)
            if held is not None:  # (after the ones before it)
                held.events.append(event)
                if len(held.events) >= HELD_EVENTS:
                    self._release_held(event.session_id)
                return
            if self._hold and isinstance(event, ev.AgentStart) and self._orphan(event):
                call = (event.parent_session_id or "", event.parent_call_id or "")
                self._held[event.session_id] = _Held(call, time.monotonic() + self._hold, [event])
                return
            self._apply(event)

    def _apply(self, event: ev.Event) -> None:
        """The rule of ``event``'s type, then the sub-agents held for the call it starts; lock held."""
        self._apply_rule(event)
        if self._held and isinstance(event, ev.ToolExecutionStart):
            call = (event.session_id, event.call_id)
            for sid in [sid for sid, held in self._held.items() if held.call == call]:
                self._release_held(sid)

    def _apply_rule(self, event: ev.Event) -> None:
        try:
            if isinstance(event, ev.SubscriberLagged):  # (sent whatever the filter)
                self._lagged(event)
                return
            rule = _RULES.get(type(event))
            if rule is not None:
                rule(self, event)
                session = self._sessions.get(event.session_id)
                if session is not None and session.idle:  # (a million sessions leave no trace here)
                    del self._sessions[event.session_id]
        except Exception:  # a span must never stop the spans of the rest
            log.exception("tracing: could not apply the span rule of a %s event", event.type)

    def _orphan(self, event: ev.AgentStart) -> bool:
        """Whether a sub-agent's turn names a delegating call whose span is not open."""
        if event.parent_session_id is None or event.parent_call_id is None:
            return False
        delegating = self._sessions.get(event.parent_session_id)
        return delegating is None or event.parent_call_id not in delegating.tools

    def _release(self, now: float | None) -> None:
        """Make the held events whose hold ended by ``now`` (None: all of them); lock held."""
        for sid in [sid for sid, held in self._held.items() if now is None or held.until <= now]:
            self._release_held(sid)

    def _release_held(self, sid: str) -> None:
        held = self._held.pop(sid)
        for event in held.events:
            self._apply(event)

    @property
    def open_sessions(self) -> int:
        """The sessions with a span open (a session whose spans all ended is forgotten)."""
        return len(self._sessions)

    def _session(self, sid: str) -> _Session:
        session = self._sessions.get(sid)
        if session is None:
            session = self._sessions[sid] = _Session()
        return session

    def _start(
        self, name: str, parent: Span | None, kind: SpanKind, attributes: dict[str, Any], ts: float
    ) -> Span:
        """A span under ``parent`` (a root span when None), begun at an event's time ``ts``: never made
        current, so the parent is always explicit."""
        return self.tracer.start_span(
            name, context=_context(parent), kind=kind, attributes=attributes, start_time=_ns(ts)
        )

    def _content(self, sid: str, kind: Any, key: str | None) -> Any:
        return None if self.content is None else self.content.take(sid, kind, key)

    def _lagged(self, event: ev.SubscriberLagged) -> None:
        self.lost += event.dropped
        session = self._sessions.get(event.session_id)
        if session is not None:
            for span in session.spans():
                span.add_event("agentcell.events_lost", {"dropped": event.dropped}, timestamp=_ns(event.ts))

    def _end_session(self, sid: str, ts: float | None) -> None:
        """End every span of ``sid`` still open (their ends were lost, or never published)."""
        session = self._sessions.pop(sid, None)
        if session is not None:
            for span in session.spans():
                _incomplete(span, ts)
        if self.content is not None:
            self.content.forget(sid)

    # -- turns ------------------------------------------------------------------------------------------
    @_traces(ev.AgentStart)
    def _agent_start(self, event: ev.AgentStart) -> None:
        sid = event.session_id
        session = self._session(sid)
        if session.turn is not None:  # the end of the one before was lost: its open spans end here
            chat, session.chat = session.chat, None
            for span in [
                *([chat.span] if chat is not None else []),
                *session.tools.values(),
                session.turn.span,
            ]:
                _incomplete(span, event.ts)
            session.tools.clear()
        parent: Span | None = None
        if event.parent_session_id is not None and event.parent_call_id is not None:
            delegating = self._sessions.get(event.parent_session_id)
            if delegating is not None:
                parent = delegating.tools.get(event.parent_call_id)
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            PROVIDER: provider_name(None, event.model),
            AGENT_NAME: INSTRUMENTATION,
            CONVERSATION: sid,
            REQUEST_MODEL: event.model,
            SESSION_ID: sid,
            TURN_ID: event.turn_id,
        }
        inputs = self._content(sid, "prompt", event.prompt_id)
        if inputs:
            attributes[INPUT_MESSAGES] = messages_json(inputs)
        span = self._start(f"invoke_agent {INSTRUMENTATION}", parent, SpanKind.INTERNAL, attributes, event.ts)
        session.turn = _Turn(span, event.turn_id)

    @_traces(ev.ErrorOccurred)
    def _error(self, event: ev.ErrorOccurred) -> None:
        session = self._sessions.get(event.session_id)
        if session is not None and session.turn is not None and session.turn.turn_id == event.turn_id:
            session.turn.error = (event.code, event.message)

    @_traces(ev.AgentAbort)
    def _agent_abort(self, event: ev.AgentAbort) -> None:
        session = self._sessions.get(event.session_id)
        if session is not None:
            self._cancel_chat(session, event.ts)

    @_traces(ev.AgentEnd)
    def _agent_end(self, event: ev.AgentEnd) -> None:
        session = self._sessions.get(event.session_id)
        if session is None:
            return
        self._cancel_chat(session, event.ts)
        turn = session.turn
        if turn is None or turn.turn_id != event.turn_id:
            return
        session.turn = None
        span = turn.span
        if span.is_recording():
            span.set_attributes(
                {
                    **usage_attributes(event.usage),
                    "agentcell.turn.status": event.status,
                    "agentcell.turn.steps": event.steps,
                }
            )
            if self.record_content and turn.answer is not None and event.status == "ok":
                answer = turn.answer
                span.set_attribute(OUTPUT_MESSAGES, messages_json([answer], finish_reason=answer.stop_reason))
            if event.status == "error":
                code, message = turn.error or (None, None)
                span.set_attribute(ERROR_TYPE, code or "_OTHER")
                span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=_ns(event.ts))

    # -- a turn's provider calls ------------------------------------------------------------------------
    @_traces(ev.RequestStart)
    def _request_start(self, event: ev.RequestStart) -> None:
        sid = event.session_id
        session = self._session(sid)
        self._cancel_chat(session, event.ts)  # one still open was cut off (an agent crash mid-call)
        attributes = self._chat_attributes(
            sid, event.model, event.provider, event.max_tokens, event.server_address, event.server_port
        )
        attributes[TURN_ID] = event.turn_id
        self._request_content(attributes, sid, event.message_id)
        span = self._start(f"chat {event.model}", session.turn_span, SpanKind.CLIENT, attributes, event.ts)
        session.chat = _Chat(span, event.message_id, event.ts, event.transport)

    @_traces(ev.ProviderRetry)
    def _provider_retry(self, event: ev.ProviderRetry) -> None:
        session = self._sessions.get(event.session_id)
        if session is None:
            return
        chat = session.chat if event.turn_id is not None else session.summaries.get(event.request_id or "")
        if chat is None:
            return
        attributes: dict[str, Any] = {
            "agentcell.retry.attempt": event.attempt,
            "agentcell.retry.max_attempts": event.max_attempts,
            "agentcell.retry.delay": event.delay,
            ERROR_TYPE: event.kind or "_OTHER",
            "exception.message": event.error,
        }
        if event.status_code is not None:
            attributes["http.response.status_code"] = event.status_code
        chat.span.add_event("retry", attributes, timestamp=_ns(event.ts))

    @_traces(ev.TurnEnd)
    def _turn_end(self, event: ev.TurnEnd) -> None:
        session = self._sessions.get(event.session_id)
        if session is None or session.chat is None:
            return
        chat, session.chat = session.chat, None
        answer = self._content(event.session_id, "response", chat.request_id)
        if answer is not None and session.turn is not None:
            session.turn.answer = answer
        _answered(chat, event, answer, self.record_content)

    @_traces(ev.RequestFailed)
    def _request_failed(self, event: ev.RequestFailed) -> None:
        session = self._sessions.get(event.session_id)
        if session is None:
            return
        if event.turn_id is not None:
            chat, session.chat = session.chat, None
        else:
            chat = session.summaries.pop(event.request_id or "", None)
        if chat is None:
            return
        span = chat.span
        if span.is_recording():
            span.set_attribute("agentcell.attempts", event.attempts)
            transport = event.transport or chat.transport
            if transport:
                span.set_attribute("agentcell.transport", transport)
            _pool_attributes(span, event.pool, event.waited)
            span.set_attribute(ERROR_TYPE, event.kind)
            if event.status_code is not None:
                span.set_attribute("http.response.status_code", event.status_code)
            span.set_status(Status(StatusCode.ERROR, event.message))
        chat.end(event.ts, event.latency)

    def _cancel_chat(self, session: _Session, ts: float) -> None:
        """End the turn's provider call in flight, if any, as cancelled (the turn ended or moved on)."""
        chat, session.chat = session.chat, None
        if chat is not None:
            if chat.span.is_recording():
                if chat.transport:
                    chat.span.set_attribute("agentcell.transport", chat.transport)
                chat.span.set_attribute(ERROR_TYPE, "cancelled")
            chat.span.end(end_time=_ns(ts))

    def _chat_attributes(
        self,
        sid: str,
        model: str,
        provider: str | None,
        max_tokens: int | None,
        address: str | None,
        port: int | None,
    ) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            OPERATION: "chat",
            PROVIDER: provider_name(provider, model),
            REQUEST_MODEL: model,
            CONVERSATION: sid,
            SESSION_ID: sid,
        }
        if max_tokens is not None:
            attributes[REQUEST_MAX_TOKENS] = max_tokens
        if address:
            attributes["server.address"] = address
            if port is not None:
                attributes["server.port"] = port
        return attributes

    def _request_content(self, attributes: dict[str, Any], sid: str, request_id: str | None) -> None:
        """A request's system instructions and input messages, when content is recorded."""
        messages = self._content(sid, "request", request_id)
        if messages is None:
            return
        system = [m for m in messages if isinstance(m, Message) and m.role == "system"]
        rest = [m for m in messages if isinstance(m, Message) and m.role != "system"]
        if system:
            attributes[SYSTEM_INSTRUCTIONS] = json.dumps(
                [{"type": "text", "content": m.text} for m in system], ensure_ascii=False
            )
        attributes[INPUT_MESSAGES] = messages_json(rest)

    # -- tool calls -------------------------------------------------------------------------------------
    @_traces(ev.ToolExecutionStart)
    def _tool_start(self, event: ev.ToolExecutionStart) -> None:
        session = self._session(event.session_id)
        session.tools[event.call_id] = self._tool_span(session, event, event.ts, event.arguments)

    def _tool_span(
        self, session: _Session, event: ev.ToolExecutionStart | ev.ToolExecutionEnd, ts: float, arguments: str
    ) -> Span:
        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: event.name,
            TOOL_CALL_ID: event.call_id,
            TOOL_TYPE: "function",
            CONVERSATION: event.session_id,
            SESSION_ID: event.session_id,
            TURN_ID: event.turn_id,
        }
        if self.record_content and arguments:
            attributes[TOOL_ARGUMENTS] = arguments
        return self._start(f"execute_tool {event.name}", session.turn_span, SpanKind.INTERNAL, attributes, ts)

    @_traces(ev.ToolExecutionEnd)
    def _tool_end(self, event: ev.ToolExecutionEnd) -> None:
        session = self._session(event.session_id)
        span = session.tools.pop(event.call_id, None)
        if span is None:  # a call aborted before a worker took it up: its span is its result
            span = self._tool_span(session, event, event.ts, "")
        result = self._content(event.session_id, "result", event.call_id)
        if span.is_recording():
            span.set_attribute("agentcell.tool.output_chars", event.output_chars)
            if event.truncated:
                span.set_attribute("agentcell.tool.truncated", True)
            if result is not None:
                span.set_attribute(TOOL_RESULT, result)
            if event.is_error:
                kind = event.error or "tool_error"
                span.set_attribute(ERROR_TYPE, kind)
                span.set_status(Status(StatusCode.ERROR, result[:200] if result is not None else kind))
        span.end(end_time=_ns(event.ts))

    # -- compactions ------------------------------------------------------------------------------------
    @_traces(ev.CompactionStart)
    def _compaction_start(self, event: ev.CompactionStart) -> None:
        session = self._session(event.session_id)
        if session.compaction is not None:
            _incomplete(session.compaction, event.ts)
        session.compaction = self._compaction_span(
            session, event, event.trigger, event.mode, event.messages_before, event.tokens_before, event.cause
        )

    def _compaction_span(
        self,
        session: _Session,
        event: ev.Event,
        trigger: str | None,
        mode: str | None,
        messages: int,
        tokens: int,
        cause: str | None,
    ) -> Span:
        """A ``compaction`` span, a child of the session's running turn (a root span outside a turn); an
        overflow compaction's ``cause`` (``refused``, ``counted``) as its events say it."""
        sid = event.session_id
        span = self._start(
            "compaction",
            session.turn_span,
            SpanKind.INTERNAL,
            {
                CONVERSATION: sid,
                SESSION_ID: sid,
                "agentcell.compaction.trigger": trigger or "unknown",
                "agentcell.compaction.mode": mode or "summarize",
                "agentcell.compaction.messages_before": messages,
                "agentcell.compaction.tokens_before": tokens,
            },
            event.ts,
        )
        if cause is not None:
            span.set_attribute("agentcell.compaction.cause", cause)
        return span

    def _end_compaction(
        self, event: ev.CompactionEnd | ev.CompactionFailed | ev.CompactionSkipped
    ) -> tuple[_Session, Span]:
        """The compaction's span (one made now if it never started), taken from its session; the summarizer
        calls it cut short are ended as cancelled."""
        session = self._session(event.session_id)
        for chat in session.summaries.values():
            chat.span.set_attribute(ERROR_TYPE, "cancelled")
            chat.span.end(end_time=_ns(event.ts))
        session.summaries.clear()
        span, session.compaction = session.compaction, None
        if span is None:  # it ended before it started (nothing to compact): a span says so all the same
            if isinstance(event, ev.CompactionEnd):
                span = self._compaction_span(
                    session,
                    event,
                    event.trigger,
                    event.mode,
                    event.messages_before,
                    event.tokens_before,
                    event.cause,
                )
            else:
                span = self._compaction_span(
                    session, event, event.trigger, event.mode, event.messages, event.tokens, event.cause
                )
        return session, span

    @_traces(ev.CompactionEnd)
    def _compaction_end(self, event: ev.CompactionEnd) -> None:
        _, span = self._end_compaction(event)
        if span.is_recording():
            span.set_attributes(
                {
                    "agentcell.compaction.messages_after": event.messages_after,
                    "agentcell.compaction.tokens_after": event.tokens_after,
                    "agentcell.compaction.summary_chars": event.summary_chars,
                    "agentcell.compaction.fallback": event.fallback,
                }
            )
        span.end(end_time=_ns(event.ts))

    @_traces(ev.CompactionFailed)
    def _compaction_failed(self, event: ev.CompactionFailed) -> None:
        _, span = self._end_compaction(event)
        if span.is_recording():
            span.set_attribute(ERROR_TYPE, event.reason or "_OTHER")
            span.set_status(Status(StatusCode.ERROR, event.error))
        span.end(end_time=_ns(event.ts))

    @_traces(ev.CompactionSkipped)
    def _compaction_skipped(self, event: ev.CompactionSkipped) -> None:
        _, span = self._end_compaction(event)
        if span.is_recording():  # nothing to reduce: no error
            span.set_attribute("agentcell.compaction.skipped", event.reason)
        span.end(end_time=_ns(event.ts))

    @_traces(ev.SummaryRequest)
    def _summary_request(self, event: ev.SummaryRequest) -> None:
        """A summarizer call: under its compaction, or under the running turn (a tool archive's)."""
        sid = event.session_id
        session = self._session(sid)
        attributes = self._chat_attributes(
            sid, event.model, None, event.max_tokens, event.server_address, event.server_port
        )
        attributes["agentcell.call.purpose"] = event.purpose
        self._request_content(attributes, sid, event.request_id)
        parent = session.compaction if event.purpose == "summary" else None
        if parent is None:
            parent = session.turn_span
        span = self._start(f"chat {event.model}", parent, SpanKind.CLIENT, attributes, event.ts)
        session.summaries[event.request_id] = _Chat(span, event.request_id, event.ts)

    @_traces(ev.SummaryResponse)
    def _summary_response(self, event: ev.SummaryResponse) -> None:
        session = self._sessions.get(event.session_id)
        chat = session.summaries.pop(event.request_id, None) if session is not None else None
        if chat is None:
            return
        chat.transport = event.transport
        answer = self._content(event.session_id, "response", event.request_id)
        _answered(chat, event, answer, self.record_content)

    # -- sessions ---------------------------------------------------------------------------------------
    @_traces(ev.SessionStopped)
    def _session_stopped(self, event: ev.SessionStopped) -> None:
        self._end_session(event.session_id, event.ts)


SPAN_TYPES: frozenset[str] = frozenset(kind.wire_name() for kind in _RULES)
"""The event types the spans are made from: those with a rule."""


def _answered(
    chat: _Chat, event: ev.TurnEnd | ev.SummaryResponse, answer: Message | None, record_content: bool
) -> None:
    """End a ``chat`` span with the call's answer: its usage, finish reason, attempts and capacity wait."""
    span = chat.span
    if span.is_recording():
        span.set_attribute("agentcell.attempts", event.attempts)
        if chat.transport:
            span.set_attribute("agentcell.transport", chat.transport)
        _pool_attributes(span, event.pool, event.waited)
        span.set_attributes(usage_attributes(event.usage))
        span.set_attribute(FINISH_REASONS, [event.stop_reason])
        if record_content and answer is not None:
            span.set_attribute(OUTPUT_MESSAGES, messages_json([answer], finish_reason=event.stop_reason))
    chat.end(event.ts, event.latency)


def _pool_attributes(span: Span, pool: str | None, waited: float) -> None:
    if pool:  # admission control (design §3.11): the key's pool and the wait for its capacity
        span.set_attribute("agentcell.capacity.pool", pool)
        span.set_attribute("agentcell.capacity.waited_seconds", round(waited, 3))


def _incomplete(span: Span, ts: float | None) -> None:
    """End a span whose end event never came (lost, or never published)."""
    if span.is_recording():
        span.set_attribute(INCOMPLETE, True)
    span.end(end_time=None if ts is None else _ns(ts))


def _context(parent: Span | None) -> Any:
    """The context to start a child of ``parent`` in (an empty one: a root span). Never the current one."""
    if parent is None:
        return trace.set_span_in_context(trace.INVALID_SPAN)
    return trace.set_span_in_context(parent)
