"""OpenTelemetry spans (design §7.5) through the public API against the local provider: the span tree of a turn
with parallel tool calls, of a compaction, of a provider call that is retried or fails, and what content the
spans hold (none unless the user opts in)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanKind, StatusCode

from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.conftest import RPM, StopsSeen
from tests.observability.conftest import Traced

PROMPT = "Add these three pairs for me, please: 1+2, 2+3, 3+4."
ANSWER = "The sums are 3, 5 and 7."
CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}


def adder(parallel: int) -> Callable[..., str]:
    """An ``add`` tool whose calls only finish when ``parallel`` of them run at once."""
    barrier = threading.Barrier(parallel, timeout=20)

    def add(a: int, b: int) -> str:
        """Add two integers."""
        barrier.wait()
        return f"sum={a + b}"

    return add


def tool_turn(provider: Any, name: str) -> str:
    calls = tuple(
        ToolCallSpec(name="add", arguments=f'{{"a": {i}, "b": {i + 1}}}', id=f"call_{i}") for i in (1, 2, 3)
    )
    provider.add_script(name, [Turn(text="Adding.", tool_calls=calls), Turn(text=ANSWER)])
    return f"openai/{name}"


def run_tool_turn(tr: Traced, provider: Any, name: str) -> str:
    model = tool_turn(provider, name)
    sid = tr.rt.start_session(
        model=model, system_prompt="You add.", tools=[adder(3)], api_base=provider.url, api_key="sk-local"
    )
    result = tr.rt.prompt(sid, PROMPT).result(timeout=60)
    assert result.status == "ok", result.error
    assert result.text == ANSWER
    return str(sid)


def children(spans: list[Any], parent: Any) -> list[Any]:
    return sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time,
    )


def test_a_tool_turn_is_one_invoke_agent_span_over_chat_tools_chat(
    traced: Callable[..., Traced], provider: Any
) -> None:
    tr = traced()
    sid = run_tool_turn(tr, provider, "otel-tools")
    spans = tr.spans()
    (turn,) = [s for s in spans if s.name == "invoke_agent agentcell"]
    assert turn.parent is None and turn.kind is SpanKind.INTERNAL
    (start,) = tr.recorder.of("agent_start", sid)
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.conversation.id"] == turn.attributes["agentcell.session.id"] == sid
    assert turn.attributes["agentcell.turn.id"] == start.turn_id
    assert turn.attributes["agentcell.turn.status"] == "ok"
    assert turn.status.status_code is not StatusCode.ERROR

    kids = children(spans, turn)
    assert [s.name.split(" ")[0] for s in kids] == [
        "chat",
        "execute_tool",
        "execute_tool",
        "execute_tool",
        "chat",
    ]
    assert len(spans) == 6, [s.name for s in spans]  # nothing else, nothing orphaned
    assert {s.context.trace_id for s in spans} == {turn.context.trace_id}

    first, *tools, last = kids
    turn_ends = tr.recorder.of("turn_end", sid)
    for chat, end, finish in zip((first, last), turn_ends, ("tool_calls", "stop"), strict=True):
        assert chat.kind is SpanKind.CLIENT
        assert chat.name == "chat openai/otel-tools"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.request.model"] == "openai/otel-tools"
        assert chat.attributes["gen_ai.usage.input_tokens"] == end.usage.input_tokens > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] == end.usage.output_tokens > 0
        assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == end.usage.cache_read_tokens
        assert chat.attributes["gen_ai.response.finish_reasons"] == (finish,)
        assert chat.attributes["agentcell.turn.id"] == start.turn_id
        assert chat.attributes["server.address"] == "127.0.0.1"
    total_in = sum(e.usage.input_tokens for e in turn_ends)
    assert turn.attributes["gen_ai.usage.input_tokens"] == total_in
    assert turn.attributes["agentcell.turn.steps"] == 2

    assert {t.attributes["gen_ai.tool.call.id"] for t in tools} == {"call_1", "call_2", "call_3"}
    for tool in tools:
        assert tool.name == "execute_tool add"
        assert tool.attributes["gen_ai.tool.name"] == "add"
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool.status.status_code is not StatusCode.ERROR
        assert first.end_time <= tool.start_time and tool.end_time <= last.start_time
    # the three ran at once (the tool's barrier saw to it): their spans overlap
    assert max(t.start_time for t in tools) < min(t.end_time for t in tools)

    keys = {k for s in spans for k in s.attributes}
    assert not keys & CONTENT_KEYS
    values = " ".join(str(v) for s in spans for v in s.attributes.values())
    assert "1+2" not in values and "sum=" not in values and ANSWER not in values


def test_content_is_recorded_when_the_user_opts_in(traced: Callable[..., Traced], provider: Any) -> None:
    tr = traced(record_content=True)
    run_tool_turn(tr, provider, "otel-content")
    spans = tr.spans()
    (turn,) = tr.named("invoke_agent")
    first, *tools, last = children(spans, turn)
    assert PROMPT in turn.attributes["gen_ai.input.messages"]
    assert ANSWER in turn.attributes["gen_ai.output.messages"]
    assert "You add." in first.attributes["gen_ai.system_instructions"]
    assert PROMPT in first.attributes["gen_ai.input.messages"]
    assert '"tool_call"' in first.attributes["gen_ai.output.messages"]
    assert "sum=3" in last.attributes["gen_ai.input.messages"]  # the tool results went back to the model
    assert ANSWER in last.attributes["gen_ai.output.messages"]
    results = sorted(t.attributes["gen_ai.tool.call.result"] for t in tools)
    assert results == ["sum=3", "sum=5", "sum=7"]
    assert all('"a"' in t.attributes["gen_ai.tool.call.arguments"] for t in tools)


def test_retries_are_events_of_the_chat_span_and_a_failure_is_an_error(
    traced: Callable[..., Traced], provider: Any
) -> None:
    tr = traced()
    busy = Turn(fault=Fault(kind="rate_limit", retry_after=None, rpm=RPM))
    provider.add_script("otel-retry", [busy, busy, Turn(text="Finally.")])
    sid = tr.rt.start_session(model="openai/otel-retry", api_base=provider.url, api_key="sk-local")
    assert tr.rt.prompt(sid, "hello").result(timeout=60).status == "ok"
    (chat,) = tr.named("chat")
    retries = [e for e in chat.events if e.name == "retry"]
    assert [e.attributes["agentcell.retry.attempt"] for e in retries] == [1, 2]
    assert all(e.attributes["error.type"] == "rate_limit" for e in retries)
    assert all(e.attributes["http.response.status_code"] == 429 for e in retries)
    assert len(tr.recorder.of("provider_retry", sid)) == 2
    assert chat.attributes["agentcell.attempts"] == 3
    # each 429 paused the key's pool and the call waited for its capacity again (design §3.11)
    assert chat.attributes["agentcell.capacity.pool"].startswith(provider.url)
    assert chat.attributes["agentcell.capacity.waited_seconds"] > 0
    assert chat.status.status_code is not StatusCode.ERROR and "error.type" not in chat.attributes

    down = Turn(fault=Fault(kind="server_error"))
    provider.add_script("otel-down", [down, down, down])
    sid = tr.rt.start_session(model="openai/otel-down", api_base=provider.url, api_key="sk-local")
    result = tr.rt.prompt(sid, "hello").result(timeout=60)
    assert result.status == "error"
    (turn,) = [s for s in tr.named("invoke_agent") if s.attributes["agentcell.session.id"] == sid]
    (chat,) = children(tr.spans(), turn)
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes["error.type"] == "transient"
    assert chat.attributes["http.response.status_code"] == 500
    assert len([e for e in chat.events if e.name == "retry"]) == 2
    assert turn.status.status_code is StatusCode.ERROR
    (error,) = tr.recorder.of("error", sid)
    assert turn.attributes["error.type"] == error.code == "provider_transient"


def test_a_compaction_in_a_turn_is_its_child_with_the_summarizer_call_under_it(
    traced: Callable[..., Traced], provider: Any
) -> None:
    tr = traced()
    text = " ".join(f"detail{i}" for i in range(180))
    provider.add_script("otel-chatty", [Turn(text=f"Noted. {text}")], loop=True)
    model = "openai/otel-chatty"
    config = {
        "models.context_windows": {model: 4_000, "openai/summarizer": 32_000},
        "compaction.reserve_tokens": 500,
        "compaction.summarizer_model": "openai/summarizer",
    }
    sid = tr.rt.start_session(model=model, api_base=provider.url, api_key="sk-local", config=config)
    for i in range(16):
        assert tr.rt.prompt(sid, f"Step {i}: record fact {i}.").result(timeout=60).status == "ok"
        if tr.recorder.of("compaction_end", sid):
            break
    (end,) = tr.recorder.of("compaction_end", sid)
    spans = tr.spans()
    (compaction,) = [s for s in spans if s.name == "compaction"]
    turn = next(s for s in spans if s.context.span_id == compaction.parent.span_id)
    assert turn.name == "invoke_agent agentcell"
    assert compaction.context.trace_id == turn.context.trace_id
    attrs = compaction.attributes
    assert attrs["agentcell.compaction.trigger"] == end.trigger == "threshold"
    assert attrs["agentcell.compaction.tokens_before"] == end.tokens_before
    assert attrs["agentcell.compaction.tokens_after"] == end.tokens_after < end.tokens_before
    assert attrs["agentcell.compaction.messages_after"] == end.messages_after
    assert attrs["agentcell.session.id"] == sid
    (summary,) = children(spans, compaction)
    assert summary.name == "chat openai/summarizer"
    assert summary.attributes["agentcell.call.purpose"] == "summary"
    assert summary.attributes["gen_ai.usage.output_tokens"] > 0
    # the turn's own provider call comes after the compaction, under the same turn
    (turn_chat,) = [s for s in children(spans, turn) if s.name.startswith("chat")]
    assert turn_chat.start_time >= compaction.end_time

    # a manual compaction outside any turn is a root span of its own
    handle = tr.rt.compact(sid)
    assert handle.result(timeout=60).compacted
    manual = [s for s in tr.named("compaction") if s.attributes["agentcell.compaction.trigger"] == "manual"]
    assert len(manual) == 1 and manual[0].parent is None
    assert [s.name for s in children(tr.spans(), manual[0])] == ["chat openai/summarizer"]


def test_without_an_sdk_nothing_traces_or_imports_opentelemetry_and_with_one_auto_traces() -> None:
    # What Runtime.start asks (runtime.observability.tracing_for), in a fresh process: nothing imported
    # OpenTelemetry, so the runtime does not trace and does not import it; once an SDK is set, it traces.
    code = """
import sys
import actors.agent, actors.compactor, runtime.host
from runtime.config import Config
from runtime.observability import tracing_for
assert tracing_for(Config().telemetry) is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
assert tracing_for(Config().telemetry) is not None
off = Config().with_overrides({"telemetry.tracing": "off"})
assert tracing_for(off.telemetry) is None
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "ok"], out.stdout


def test_tracing_on_uses_the_global_provider_even_before_an_sdk_is_set() -> None:
    from runtime.config import TelemetryConfig
    from runtime.observability import tracing_for

    assert tracing_for(TelemetryConfig(tracing="on")) is not None
    assert tracing_for(TelemetryConfig(tracing="off"), provider=object()) is None


def test_a_sub_agent_turn_is_a_child_of_the_delegating_tool_call(
    traced: Callable[..., Traced], provider: Any
) -> None:
    import json

    tr = traced()
    provider.add_script("otel-child", [Turn(text="The answer is 42.")])
    delegation = ToolCallSpec(
        name="agent", arguments=json.dumps({"profile": "researcher", "task": "Find it."}), id="call_d1"
    )
    provider.add_script("otel-parent", [Turn(tool_calls=(delegation,)), Turn(text="It is 42.")])
    agents = {"researcher": {"description": "finds", "model": "openai/otel-child", "tools": "none"}}
    parent = tr.rt.start_session(
        model="openai/otel-parent", api_base=provider.url, api_key="sk-local", agents=agents
    )
    assert tr.rt.prompt(parent, "What is the answer?").result(timeout=60).text == "It is 42."
    spans = tr.spans()
    (root,) = [s for s in spans if s.parent is None]
    (tool,) = tr.named("execute_tool agent")
    assert tool.parent.span_id == root.context.span_id
    (child_turn,) = children(spans, tool)
    assert child_turn.name == "invoke_agent agentcell"
    assert child_turn.attributes["agentcell.session.id"] not in (parent, "")
    assert [s.name for s in children(spans, child_turn)] == ["chat openai/otel-child"]
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}  # one trace for the whole


def test_an_aborted_turn_ends_its_spans_as_aborted_and_cancelled(
    traced: Callable[..., Traced], provider: Any
) -> None:
    tr = traced()
    provider.add_script("otel-hang", [Turn(fault=Fault(kind="hang"))])
    sid = tr.rt.start_session(model="openai/otel-hang", api_base=provider.url, api_key="sk-local")
    handle = tr.rt.prompt(sid, "hello")
    tr.recorder.wait_type("request_start", timeout=30)
    assert tr.rt.abort(sid).result(timeout=30)
    assert handle.result(timeout=30).status == "aborted"
    tr.recorder.wait_type("agent_end", timeout=30)
    (turn,) = tr.named("invoke_agent")
    assert turn.attributes["agentcell.turn.status"] == "aborted"
    assert turn.status.status_code is not StatusCode.ERROR
    # the cancelled call's result comes back from the gateway's loop, and ends its span there
    spans = tr.wait_for(lambda spans: any(s.name.startswith("chat") for s in spans))
    (chat,) = [s for s in spans if s.name.startswith("chat")]
    assert chat.parent.span_id == turn.context.span_id
    assert chat.attributes["error.type"] == "cancelled"
    assert chat.status.status_code is not StatusCode.ERROR


def test_a_turn_taken_up_after_an_agent_crash_stays_one_span(
    traced: Callable[..., Traced], provider: Any
) -> None:
    """The crashed agent hands its run to its successor: the turn's span goes with it, and the call made
    after the recovery is a child of the same turn span as the one before."""
    tr = traced()
    release, running = threading.Event(), threading.Event()

    def wait_here() -> str:
        """Wait until released."""
        running.set()
        release.wait(30)
        return "released"

    calls = (ToolCallSpec(name="wait_here", arguments="{}", id="call_crash"),)
    provider.add_script("otel-crash", [Turn(tool_calls=calls), Turn(text="recovered fine")])
    sid = tr.rt.start_session(
        model="openai/otel-crash", tools=[wait_here], api_base=provider.url, api_key="sk-local"
    )
    handle = tr.rt.prompt(sid, "go")
    tr.recorder.wait_type("tool_execution_start", timeout=30)
    # the tool runs once its start is in the log (it is not idempotent, design §3.12): a crash before that
    # would leave a call that never started, which the successor runs (and which waits here)
    assert running.wait(30)
    tr.rt._session(sid).refs.agent.tell(object())  # an unexpected message: the agent crashes
    try:
        assert handle.result(timeout=30).text == "recovered fine"
    finally:
        release.set()
    spans = tr.spans()
    (turn,) = tr.named("invoke_agent")
    assert turn.attributes["agentcell.turn.status"] == "ok"
    kids = children(spans, turn)
    assert [s.name for s in kids] == [
        "chat openai/otel-crash",
        "execute_tool wait_here",
        "chat openai/otel-crash",
    ]
    assert kids[1].attributes["error.type"] == "aborted"  # the crash cut the tool call short
    assert len(spans) == 4


def test_stop_ends_a_cut_off_turns_spans_without_an_event_for_every_idle_session(
    traced: Callable[..., Traced], provider: Any
) -> None:
    """The runtime's stop ends the spans of a turn it cuts off (the turn aborted, its call cancelled), and
    tracing makes it publish no ``session_stopped`` for the idle sessions it hosts (a million idle sessions would
    be a million events for the few spans still open)."""
    tr = traced()
    idle = [tr.rt.start_session(model="openai/idle") for _ in range(20)]
    provider.add_script("otel-stop", [Turn(fault=Fault(kind="hang"))])
    sid = tr.rt.start_session(model="openai/otel-stop", api_base=provider.url, api_key="sk-local")
    tr.rt.prompt(sid, "hello")
    tr.recorder.wait_type("request_start", timeout=30)
    tr.recorder.close()  # (an all-sessions subscriber of every event asks for every session's stop)
    stops = StopsSeen()
    tr.rt.bus.add_sink(stops)
    assert tr.spans() == []  # the turn and its call are open
    before = time.time_ns()
    tr.rt.stop()
    after = time.time_ns()
    assert stops == [sid]  # (its transcript's clean end)
    assert all(tr.rt.bus.last_seq(s) <= 1 for s in idle)  # (their session_started at most)
    chat, turn = sorted(tr.spans(), key=lambda s: s.name)
    assert chat.name == "chat openai/otel-stop" and chat.attributes["error.type"] == "cancelled"
    assert turn.name == "invoke_agent agentcell" and turn.attributes["agentcell.turn.status"] == "aborted"
    assert before <= chat.end_time <= turn.end_time <= after
