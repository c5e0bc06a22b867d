"""Spans made from the events (design §7.5): the rules of :class:`runtime.observability.tracing.Tracing` fed
event streams directly (no runtime), what happens when the spans' subscription loses events, and through
the public API, the spans timed by the events and the summarizer's calls as events of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from runtime import events as ev
from runtime.messages import Usage
from runtime.observability.tracing import SPAN_TYPES, Tracing
from runtime.provider.script import Turn
from tests.observability.conftest import Traced

SID = "s1"
NS = 1_000_000_000


@pytest.fixture
def spans() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing.for_provider(provider), exporter


def feed(tracing: Tracing, *events: ev.Event) -> None:
    for event in events:
        tracing.handle(event)


def by_name(exporter: InMemorySpanExporter) -> dict[str, Any]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_the_spans_subscribe_to_the_events_their_rules_are_declared_for() -> None:
    assert SPAN_TYPES <= ev.EVENT_TYPES
    assert {
        "agent_start",
        "agent_end",
        "agent_abort",
        "error",
        "request_start",
        "request_failed",
        "provider_retry",
        "turn_end",
        "tool_execution_start",
        "tool_execution_end",
        "compaction_start",
        "compaction_end",
        "compaction_failed",
        "compaction_skipped",
        "summary_request",
        "summary_response",
        "session_stopped",
    } == SPAN_TYPES
    assert not SPAN_TYPES & ev.FRAGMENT_TYPES  # no deltas: the spans' queue takes a few events a step


def test_a_turn_is_a_tree_of_spans_timed_by_its_events(spans: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracing, exporter = spans
    turn = dict(session_id=SID, turn_id="t1")
    feed(
        tracing,
        ev.AgentStart(**turn, ts=100.0, model="openai/m", prompt_id="p1"),
        ev.RequestStart(
            **turn,
            ts=101.0,
            attempt=1,
            model="openai/m",
            messages=2,
            estimated_tokens=50,
            transport="openai_compat",
            message_id="m1",
            provider="openai",
            max_tokens=256,
            server_address="127.0.0.1",
            server_port=8080,
        ),
        ev.ProviderRetry(
            **turn,
            ts=101.5,
            attempt=1,
            max_attempts=3,
            delay=0.5,
            error="busy",
            status_code=429,
            kind="rate_limit",
        ),
        ev.TurnEnd(
            **turn,
            ts=102.0,
            stop_reason="tool_calls",
            usage=Usage(input_tokens=40, output_tokens=7),
            attempts=2,
            pool="http://127.0.0.1:8080|key",
            waited=0.75,
            latency=0.875,  # (the call ended before its turn_end: that comes once the answer is recorded)
        ),
        ev.ToolExecutionStart(**turn, ts=102.25, call_id="c1", name="sh", arguments='{"cmd": "ls"}'),
        ev.ToolExecutionEnd(
            **turn,
            ts=102.5,
            call_id="c1",
            name="sh",
            is_error=True,
            duration=0.25,
            output_chars=9,
            error="timeout",
        ),
        ev.CompactionStart(
            session_id=SID, ts=103.0, trigger="threshold", messages_before=9, tokens_before=900
        ),
        ev.SummaryRequest(session_id=SID, ts=103.25, request_id="r1", purpose="summary", model="openai/sum"),
        ev.SummaryResponse(
            session_id=SID, ts=103.75, request_id="r1", stop_reason="stop", usage=Usage(input_tokens=600)
        ),
        ev.CompactionEnd(
            session_id=SID,
            ts=104.0,
            trigger="threshold",
            messages_before=9,
            messages_after=3,
            tokens_before=900,
            tokens_after=200,
            summary_chars=120,
            mode="summarize",
        ),
        ev.RequestStart(**turn, ts=104.5, attempt=2, model="openai/m", messages=4, estimated_tokens=250),
        ev.RequestFailed(**turn, ts=105.0, request_id="m2", kind="transient", message="500", status_code=500),
        ev.ErrorOccurred(**turn, ts=105.1, message="the provider failed", code="provider_transient"),
        ev.AgentEnd(**turn, ts=106.0, status="error", usage=Usage(input_tokens=40, output_tokens=7), steps=2),
    )
    finished = exporter.get_finished_spans()
    assert len(finished) == 6
    assert tracing.open_sessions == 0  # its spans all ended: nothing of the session is kept
    named = by_name(exporter)
    root = named["invoke_agent agentcell"]
    assert root.parent is None and (root.start_time, root.end_time) == (100 * NS, 106 * NS)
    assert root.attributes["gen_ai.request.model"] == "openai/m"
    assert root.attributes["agentcell.turn.steps"] == 2
    assert root.attributes["error.type"] == "provider_transient"
    assert root.status.status_code is StatusCode.ERROR and root.status.description == "the provider failed"

    first, failed = sorted((s for s in finished if s.name == "chat openai/m"), key=lambda s: s.start_time)
    assert (first.start_time, first.end_time) == (101 * NS, int(101.875 * NS))
    assert first.kind is SpanKind.CLIENT and first.parent.span_id == root.context.span_id
    assert first.attributes["gen_ai.provider.name"] == "openai"
    assert first.attributes["server.address"] == "127.0.0.1" and first.attributes["server.port"] == 8080
    assert first.attributes["gen_ai.request.max_tokens"] == 256
    assert first.attributes["agentcell.attempts"] == 2
    assert first.attributes["agentcell.transport"] == "openai_compat"
    assert first.attributes["agentcell.capacity.waited_seconds"] == 0.75
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    (retry,) = first.events
    assert retry.name == "retry" and retry.timestamp == int(101.5 * NS)
    assert retry.attributes["error.type"] == "rate_limit"
    assert failed.attributes["error.type"] == "transient" and failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["http.response.status_code"] == 500

    tool = named["execute_tool sh"]
    assert tool.parent.span_id == root.context.span_id
    assert tool.attributes["error.type"] == "timeout" and tool.status.description == "timeout"
    assert "gen_ai.tool.call.arguments" not in tool.attributes  # (content only when recorded)

    compaction = named["compaction"]
    assert compaction.parent.span_id == root.context.span_id
    assert compaction.attributes["agentcell.compaction.tokens_after"] == 200
    summary = named["chat openai/sum"]
    assert summary.parent.span_id == compaction.context.span_id
    assert summary.attributes["agentcell.call.purpose"] == "summary"
    assert summary.attributes["gen_ai.usage.input_tokens"] == 600


def test_a_sub_agents_turn_is_a_child_of_the_delegating_call_and_a_lone_compaction_a_root(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    tracing, exporter = spans
    feed(
        tracing,
        ev.AgentStart(session_id=SID, turn_id="t1", ts=1.0, model="openai/m"),
        ev.ToolExecutionStart(
            session_id=SID, turn_id="t1", ts=2.0, call_id="d1", name="agent", arguments="{}"
        ),
        ev.AgentStart(
            session_id="child",
            turn_id="t2",
            ts=3.0,
            model="openai/c",
            parent_session_id=SID,
            parent_call_id="d1",
        ),
        ev.AgentEnd(session_id="child", turn_id="t2", ts=4.0, status="ok"),
        ev.ToolExecutionEnd(
            session_id=SID,
            turn_id="t1",
            ts=5.0,
            call_id="d1",
            name="agent",
            is_error=False,
            duration=3,
            output_chars=2,
        ),
        ev.AgentEnd(session_id=SID, turn_id="t1", ts=6.0, status="ok"),
        # a manual compaction between turns with nothing to compact: no compaction_start, a span all the same
        ev.CompactionSkipped(
            session_id=SID,
            ts=7.0,
            reason="nothing_to_compact",
            message="nothing",
            trigger="manual",
            messages=2,
        ),
    )
    tool = by_name(exporter)["execute_tool agent"]
    child = next(s for s in exporter.get_finished_spans() if s.attributes["agentcell.session.id"] == "child")
    assert child.parent.span_id == tool.context.span_id
    assert child.context.trace_id == tool.context.trace_id
    compaction = by_name(exporter)["compaction"]
    assert compaction.parent is None and compaction.start_time == compaction.end_time == 7 * NS
    assert compaction.attributes["agentcell.compaction.skipped"] == "nothing_to_compact"
    assert compaction.attributes["agentcell.compaction.messages_before"] == 2


def delegation(child: str, call: str, ts: float) -> list[ev.Event]:
    """A sub-agent's turn (with a provider call) for the parent's call ``call``, from ``ts`` on."""
    turn = dict(session_id=child, turn_id=f"t-{child}")
    return [
        ev.AgentStart(**turn, ts=ts, model="openai/c", parent_session_id=SID, parent_call_id=call),
        ev.RequestStart(**turn, ts=ts + 0.1, attempt=1, model="openai/c", messages=1, estimated_tokens=5),
        ev.TurnEnd(**turn, ts=ts + 0.2, stop_reason="stop", usage=Usage(input_tokens=5, output_tokens=1)),
        ev.AgentEnd(**turn, ts=ts + 0.3, status="ok"),
    ]


def test_a_sub_agents_events_that_come_before_the_delegating_call_wait_for_its_span() -> None:
    """On a cluster front the events of two shards can cross (a failover can put a sub-agent on another
    shard than its parent): a sub-agent's events that come before its delegating call's start wait for
    that call's span, so the turn is still its child, not a root span; a grandchild's as well. Events whose
    call never comes are made after the hold, as a root (a sub-agent prompted directly, long after)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing.for_provider(provider, hold=0.2)
    parent = dict(session_id=SID, turn_id="t1")
    grandchild = delegation("grandchild", "g1", 3.0)
    grandchild[0] = ev.AgentStart(  # (delegated by the child's call g1)
        session_id="grandchild",
        turn_id="t-grandchild",
        ts=3.0,
        model="openai/c",
        parent_session_id="child",
        parent_call_id="g1",
    )
    child = delegation("child", "d1", 2.5)
    child_call = ev.ToolExecutionStart(
        session_id="child", turn_id="t-child", ts=2.7, call_id="g1", name="agent", arguments="{}"
    )
    feed(
        tracing,
        *grandchild,  # first: two levels down
        child[0],
        child_call,
        ev.ToolExecutionEnd(
            session_id="child",
            turn_id="t-child",
            ts=3.4,
            call_id="g1",
            name="agent",
            is_error=False,
            duration=0.7,
            output_chars=2,
        ),
        *child[1:],
        *delegation("late", "gone", 9.0),  # its call never comes
        ev.AgentStart(**parent, ts=1.0, model="openai/m"),
        ev.ToolExecutionStart(**parent, ts=2.0, call_id="d1", name="agent", arguments="{}"),
        ev.ToolExecutionEnd(
            **parent, ts=5.0, call_id="d1", name="agent", is_error=False, duration=3, output_chars=2
        ),
        ev.AgentEnd(**parent, ts=6.0, status="ok"),
    )
    assert tracing.flush(5.0)  # (the late one's hold ends)
    made = exporter.get_finished_spans()

    def turn_of(sid: str) -> Any:
        return next(
            s
            for s in made
            if s.name.startswith("invoke_agent") and s.attributes["agentcell.session.id"] == sid
        )

    def tool_of(sid: str) -> Any:
        return next(
            s
            for s in made
            if s.name.startswith("execute_tool") and s.attributes["agentcell.session.id"] == sid
        )

    root = turn_of(SID)
    assert root.parent is None
    assert turn_of("child").parent.span_id == tool_of(SID).context.span_id
    assert turn_of("grandchild").parent.span_id == tool_of("child").context.span_id
    assert {s.context.trace_id for s in made if s.attributes["agentcell.session.id"] != "late"} == {
        root.context.trace_id
    }
    for sid in ("child", "grandchild", "late"):
        (chat,) = [
            s for s in made if s.name == "chat openai/c" and s.attributes["agentcell.session.id"] == sid
        ]
        assert chat.parent.span_id == turn_of(sid).context.span_id
    assert turn_of("late").parent is None and turn_of("late").start_time == 9 * NS
    assert len(made) == 9


def test_an_overflow_compaction_s_span_says_its_cause_and_no_other_compaction_s_does(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    """``agentcell.compaction.cause``: the provider ``refused`` the request, or it was ``counted`` over the
    limit before it was sent; a compaction that failed before it started says it too."""
    tracing, exporter = spans
    start = {"messages_before": 9, "tokens_before": 900}
    end = {**start, "messages_after": 3, "tokens_after": 200, "summary_chars": 80, "mode": "summarize"}
    feed(
        tracing,
        ev.AgentStart(session_id=SID, turn_id="t1", ts=1.0, model="openai/m"),
        ev.CompactionStart(session_id=SID, ts=2.0, trigger="overflow", cause="refused", **start),
        ev.CompactionEnd(session_id=SID, ts=3.0, trigger="overflow", cause="refused", **end),
        ev.CompactionStart(session_id=SID, ts=4.0, trigger="threshold", **start),
        ev.CompactionEnd(session_id=SID, ts=5.0, trigger="threshold", **end),
        ev.AgentEnd(session_id=SID, turn_id="t1", ts=6.0, status="ok"),
        ev.CompactionFailed(
            session_id=SID,
            ts=7.0,
            error="no",
            reason="nothing_to_compact",
            trigger="overflow",
            cause="counted",
        ),
    )
    compactions = sorted(
        (s for s in exporter.get_finished_spans() if s.name == "compaction"), key=lambda s: s.start_time
    )
    causes = [
        (s.attributes["agentcell.compaction.trigger"], s.attributes.get("agentcell.compaction.cause"))
        for s in compactions
    ]
    assert causes == [("overflow", "refused"), ("threshold", None), ("overflow", "counted")]


def test_spans_whose_end_was_lost_are_marked_and_ended_not_left_open(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    """The spans' subscription lost events (its queue was full): the spans open then say so, and a span
    whose end was lost is ended by the session's next turn or its stop, marked incomplete."""
    tracing, exporter = spans
    feed(
        tracing,
        ev.AgentStart(session_id=SID, turn_id="t1", ts=1.0),
        ev.RequestStart(
            session_id=SID, turn_id="t1", ts=2.0, attempt=1, model="m", messages=1, estimated_tokens=1
        ),
        ev.SubscriberLagged(
            session_id=SID, ts=3.0, dropped=7
        ),  # (the turn_end and agent_end were among them)
        ev.AgentStart(session_id=SID, turn_id="t2", ts=4.0),
        ev.SessionStopped(session_id=SID, ts=5.0),
    )
    assert tracing.lost == 7
    finished = exporter.get_finished_spans()
    assert len(finished) == 3
    for span in finished:
        assert span.attributes["agentcell.span.incomplete"] is True
    first, second = sorted(
        (s for s in finished if s.name.startswith("invoke_agent")), key=lambda s: s.start_time
    )
    assert first.end_time == 4 * NS and second.end_time == 5 * NS
    assert [e.name for e in first.events] == ["agentcell.events_lost"]
    assert first.events[0].attributes["dropped"] == 7
    (chat,) = [s for s in finished if s.name == "chat m"]
    assert chat.end_time == 4 * NS  # cut off by the next turn's start, as a call an agent crash cut off


def test_the_runtimes_stop_ends_what_is_left_open_at_its_time(
    spans: tuple[Tracing, InMemorySpanExporter],
) -> None:
    """The runtime's stop publishes no ``session_stopped`` for the spans (one a hosted session would be a
    million events for a million idle ones): closing them ends every span still open (its end was lost) at
    the time the runtime stopped its sessions, marked incomplete."""
    tracing, exporter = spans
    feed(
        tracing,
        ev.AgentStart(session_id=SID, turn_id="t1", ts=1.0),
        ev.ToolExecutionStart(session_id=SID, turn_id="t1", ts=2.0, call_id="c1", name="add", arguments="{}"),
        ev.SubscriberLagged(session_id=SID, ts=3.0, dropped=2),  # (the tool's end and the turn's)
        ev.AgentStart(session_id="s2", turn_id="t9", ts=3.5),
        ev.AgentEnd(session_id="s2", turn_id="t9", ts=3.75, status="ok"),
    )
    assert exporter.get_finished_spans()[0].name == "invoke_agent agentcell"  # s2's: ended by its events
    assert tracing.open_sessions == 1
    tracing.close(at=6.0)
    assert tracing.open_sessions == 0
    left = exporter.get_finished_spans()[1:]
    assert sorted(s.name for s in left) == ["execute_tool add", "invoke_agent agentcell"]
    for span in left:
        assert span.attributes["agentcell.span.incomplete"] is True and span.end_time == 6 * NS


def test_a_rule_that_fails_loses_that_span_only(
    spans: tuple[Tracing, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.observability import tracing as module

    def broken(self: Tracing, event: ev.Event) -> None:
        raise ValueError("a broken rule")

    monkeypatch.setitem(module._RULES, ev.ToolExecutionStart, broken)
    tracing, exporter = spans
    feed(
        tracing,
        ev.AgentStart(session_id=SID, turn_id="t1", ts=1.0),
        ev.ToolExecutionStart(session_id=SID, turn_id="t1", ts=1.5, call_id="c", name="x", arguments="{}"),
        ev.AgentEnd(session_id=SID, turn_id="t1", ts=2.0, status="ok"),
    )
    assert [s.name for s in exporter.get_finished_spans()] == ["invoke_agent agentcell"]


def test_through_the_runtime_the_spans_are_timed_by_the_events_and_summaries_are_events(
    traced: Callable[..., Traced], provider: Any
) -> None:
    tr = traced()
    provider.add_script("spans-timed", [Turn(text="Noted.")], loop=True)
    model = "openai/spans-timed"
    sid = tr.rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
    for i in range(3):
        assert tr.rt.prompt(sid, f"Step {i}: record fact {i}.").result(timeout=60).status == "ok"
    assert tr.rt.compact(sid).result(timeout=60).compacted
    starts, ends = tr.recorder.of("agent_start", sid), tr.recorder.of("agent_end", sid)
    turns = sorted(tr.named("invoke_agent"), key=lambda s: s.start_time)
    assert [(s.start_time, s.end_time) for s in turns] == [
        (int(a.ts * NS), int(b.ts * NS)) for a, b in zip(starts, ends, strict=True)
    ]
    assert all(e.steps == 1 for e in ends) and all(a.model == model for a in starts)
    requests = tr.recorder.of("request_start", sid)
    chats = sorted(
        (s for s in tr.named("chat") if "agentcell.turn.id" in s.attributes), key=lambda s: s.start_time
    )
    assert [s.start_time for s in chats] == [int(r.ts * NS) for r in requests]
    assert all((r.server_address, r.provider) == ("127.0.0.1", "openai") for r in requests)

    (asked,) = tr.recorder.of("summary_request", sid)
    (answered,) = tr.recorder.of("summary_response", sid)
    assert asked.request_id == answered.request_id and asked.purpose == "summary" and asked.model == model
    assert answered.usage.output_tokens > 0 and answered.attempts == 1
    (summary,) = [s for s in tr.named("chat") if s.attributes.get("agentcell.call.purpose") == "summary"]
    assert summary.start_time == int(asked.ts * NS) < summary.end_time <= int(answered.ts * NS)
    assert summary.end_time - summary.start_time <= answered.latency * NS + 1_000  # (ns from float seconds)
    # a turn's call ends when the gateway answered (its latency), before its turn_end recorded the answer
    for chat, end in zip(chats, tr.recorder.of("turn_end", sid), strict=True):
        assert end.latency > 0 and chat.end_time <= int(end.ts * NS)
        assert chat.end_time - chat.start_time <= end.latency * NS + 1_000
