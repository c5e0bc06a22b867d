"""The agent actor end to end over the local provider (design §3): tools, approval, abort, queueing, recovery."""

from __future__ import annotations

import gc
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from runtime.context.integrity import check_integrity
from runtime.provider.script import Fault, ToolCallSpec, Turn
from runtime.tools.registry import ToolRegistry, tool
from tests.conftest import RPM, Recorder


def call(name: str, arguments: str = "{}", id: str | None = None) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments=arguments, id=id)


def requests_for(provider: Any, model: str) -> list[Any]:
    name = model.split("/", 1)[1]
    return [r for r in provider.request_log if r.model == name]


def tool_messages(rt: Any, sid: str) -> list[Any]:
    return [m for m in rt.messages(sid) if m.role == "tool"]


def test_multi_turn_coding_task(
    rt: Any, recorder: Recorder, script: Any, session: Any, workspace: Path
) -> None:
    (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    model = script(
        Turn(text="Let me look.", tool_calls=(call("read_file", '{"path": "calc.py"}'),)),
        Turn(tool_calls=(call("edit_file", '{"path": "calc.py", "old": "a - b", "new": "a + b"}'),)),
        Turn(text="Fixed: add now adds."),
    )
    sid = session(model)
    result = rt.prompt(sid, "Fix the bug in calc.py").result(timeout=30)

    assert result.status == "ok", result.error
    assert result.text == "Fixed: add now adds."
    assert result.steps == 3
    recorder.wait_type("agent_end")  # subscribers get events asynchronously
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    roles = [m.role for m in rt.messages(sid)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    read_result = tool_messages(rt, sid)[0]
    assert "return a - b" in read_result.text and not read_result.is_error
    # The turn's events, in order, for this session.
    types = [t for t in recorder.types(sid) if t not in ("text_delta", "tool_call_delta", "message_appended")]
    assert types[0] == "session_started" and types[1] == "agent_start"
    assert types[-1] == "agent_end"
    assert types.count("request_start") == 3 and types.count("turn_end") == 3
    assert types.count("tool_execution_start") == 2 == types.count("tool_execution_end")
    seqs = [e.seq for e in recorder.events if e.session_id == sid]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    end = recorder.of("agent_end", sid)[-1]
    assert end.status == "ok" and end.usage.input_tokens > 0 and end.context_window == 128_000


def test_usage_is_the_providers_exact_count(rt: Any, script: Any, session: Any, provider: Any) -> None:
    model = script(Turn(tool_calls=(call("list_dir"),)), Turn(text="done"))
    sid = session(model)
    result = rt.prompt(sid, "list").result(timeout=30)
    sent = requests_for(provider, model)
    assert result.usage.input_tokens == sum(r.prompt_tokens for r in sent)
    assert rt.usage(sid).input_tokens == result.usage.input_tokens


def test_each_turn_makes_the_log_durable_once_at_its_end(rt: Any, script: Any, session: Any) -> None:
    model = script(Turn(text="plain"), Turn(tool_calls=(call("list_dir"),)), Turn(text="done"))
    sid = session(model)
    writer = rt.services.writer
    for prompt in ("no tools", "with a tool"):
        writer.flush()
        before = writer.stats.fsyncs
        assert rt.prompt(sid, prompt).result(timeout=30).status == "ok"
        writer.flush()
        assert writer.stats.fsyncs == before + 1, prompt


def slow_registry(delay: float, log: list[tuple[str, str, float]]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def slow(tag: str) -> str:
        """Sleep, then echo the tag."""
        log.append(("start", tag, time.monotonic()))
        time.sleep(delay)
        log.append(("end", tag, time.monotonic()))
        return f"done {tag}"

    return registry


def test_parallel_tool_calls_run_concurrently(rt: Any, script: Any, session: Any) -> None:
    log: list[tuple[str, str, float]] = []
    model = script(
        Turn(tool_calls=tuple(call("slow", f'{{"tag": "{t}"}}') for t in "abc")),
        Turn(text="all done"),
    )
    sid = session(model, tools=slow_registry(0.3, log))
    assert rt.prompt(sid, "go").result(timeout=30).status == "ok"
    starts = [t for kind, _, t in log if kind == "start"]
    ends = [t for kind, _, t in log if kind == "end"]
    assert len(starts) == 3 and max(starts) < min(ends), "every call started before any finished"
    results = tool_messages(rt, sid)
    assert [m.text for m in results] == ["done a", "done b", "done c"]  # in call order


def test_hanging_tool_times_out_and_the_turn_goes_on(rt: Any, script: Any, session: Any) -> None:
    registry = ToolRegistry()
    release = threading.Event()

    @registry.tool
    def hang() -> str:
        """Never returns on its own."""
        release.wait(30)
        return "late"

    model = script(Turn(tool_calls=(call("hang"),)), Turn(text="moved on"))
    sid = session(model, tools=registry, config={"agent.tool_timeout": 0.3})
    try:
        result = rt.prompt(sid, "hang please").result(timeout=20)
    finally:
        release.set()
    assert result.status == "ok" and result.text == "moved on"
    (timed_out,) = tool_messages(rt, sid)
    assert timed_out.is_error and "timed out" in timed_out.text.lower()


def test_raising_tool_becomes_an_error_the_model_sees(
    rt: Any, script: Any, session: Any, provider: Any
) -> None:
    registry = ToolRegistry()

    @registry.tool
    def explode(n: int) -> str:
        """Always fails."""
        raise RuntimeError(f"boom {n}")

    model = script(Turn(tool_calls=(call("explode", '{"n": 7}'),)), Turn(text="it failed"))
    sid = session(model, tools=registry)
    assert rt.prompt(sid, "try it").result(timeout=20).status == "ok"
    (result,) = tool_messages(rt, sid)
    assert result.is_error and "RuntimeError" in result.text and "boom 7" in result.text
    second_request = requests_for(provider, model)[1]
    assert any(m["role"] == "tool" and "boom 7" in m["content"] for m in second_request.messages)


def test_malformed_arguments_and_unknown_tools_are_error_results(rt: Any, script: Any, session: Any) -> None:
    model = script(
        Turn(tool_calls=(call("read_file", '{"path": "x.py"'), call("teleport", '{"to": "mars"}'))),
        Turn(text="ok"),
    )
    sid = session(model)
    assert rt.prompt(sid, "go").result(timeout=20).status == "ok"
    malformed, unknown = tool_messages(rt, sid)
    assert malformed.is_error and "JSON" in malformed.text
    assert unknown.is_error and "teleport" in unknown.text and "read_file" in unknown.text


def test_denied_approval_becomes_an_error_result(
    rt: Any, recorder: Recorder, script: Any, session: Any, workspace: Path
) -> None:
    asked: list[str] = []

    def policy(session_id: str, call: Any) -> bool | str:
        asked.append(call.name)
        return call.name != "write_file" or "writing is not allowed here"

    model = script(
        Turn(tool_calls=(call("write_file", '{"path": "x.txt", "content": "hi"}'),)),
        Turn(text="could not write"),
    )
    sid = session(model, approval=policy)
    assert rt.prompt(sid, "write").result(timeout=20).status == "ok"
    recorder.wait_type("agent_end")
    assert asked == ["write_file"]
    assert not (workspace / "x.txt").exists()
    (denied,) = tool_messages(rt, sid)
    assert denied.is_error and "writing is not allowed here" in denied.text
    (response,) = recorder.of("approval_response", sid)
    assert response.approved is False and recorder.of("approval_request", sid)[0].name == "write_file"


def test_approval_answered_by_a_subscriber(rt: Any, script: Any, session: Any, workspace: Path) -> None:
    model = script(
        Turn(tool_calls=(call("write_file", '{"path": "ok.txt", "content": "yes"}'),)), Turn(text="ok")
    )
    sid = session(model, require_approval=True)

    def answer(event: Any) -> None:
        threading.Thread(target=rt.approve, args=(event.session_id, event.call_id, True)).start()

    with rt.subscribe(sid, {"approval_request"}, callback=answer):
        assert rt.prompt(sid, "write").result(timeout=20).status == "ok"
    assert (workspace / "ok.txt").read_text() == "yes"


def test_abort_mid_stream_leaves_the_session_usable(
    rt: Any, recorder: Recorder, script: Any, session: Any, provider: Any
) -> None:
    model = script(Turn(text="a very slow answer", latency=5.0), Turn(text="second answer"))
    sid = session(model)
    handle = rt.prompt(sid, "slow please")
    name = model.split("/", 1)[1]
    deadline = time.monotonic() + 10
    while provider.remaining_turns(name) == 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # until the provider is answering (slowly)
    assert rt.abort(sid).result(timeout=5) is True
    result = handle.result(timeout=5)
    assert result.status == "aborted"
    recorder.wait_type("agent_end")
    assert recorder.of("agent_abort", sid)
    assert recorder.of("agent_end", sid)[-1].status == "aborted"
    after = rt.prompt(sid, "again").result(timeout=20)
    assert after.status == "ok" and after.text == "second answer"


def blocking_registry() -> tuple[ToolRegistry, threading.Event]:
    """A ``wait_here`` tool that blocks until the returned event is set."""
    registry = ToolRegistry()
    release = threading.Event()

    @registry.tool
    def wait_here() -> str:
        """Blocks until released."""
        release.wait(30)
        return "released"

    return registry, release


def test_abort_during_tools_repairs_the_orphaned_call(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    registry, release = blocking_registry()
    model = script(Turn(tool_calls=(call("wait_here", id="call_stuck"),)), Turn(text="fine"))
    sid = session(model, tools=registry)
    handle = rt.prompt(sid, "go")
    recorder.wait_type("tool_execution_start")
    rt.abort(sid).result(timeout=5)
    release.set()
    assert handle.result(timeout=5).status == "aborted"
    context = rt.messages(sid, view="model")
    assert check_integrity(context).ok
    (repaired,) = [m for m in context if m.role == "tool"]
    assert repaired.tool_call_id == "call_stuck" and repaired.is_error
    assert rt.prompt(sid, "next").result(timeout=20).status == "ok"


def test_prompt_while_busy_is_queued_and_runs_next(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    model = script(Turn(text="first", latency=0.5), Turn(text="second"))
    sid = session(model)
    first = rt.prompt(sid, "one")
    second = rt.prompt(sid, "two")
    assert first.result(timeout=20).text == "first"
    assert second.result(timeout=20).text == "second"
    recorder.wait_type("agent_end", 2)
    (queued,) = recorder.of("message_queued", sid)
    assert queued.prompt_id == second.id and queued.position == 1
    users = [m.text for m in rt.messages(sid) if m.role == "user"]
    assert users == ["one", "two"]


def test_transient_provider_errors_are_retried(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    model = script(
        Turn(fault=Fault(kind="rate_limit", retry_after=0.05, rpm=RPM)), Turn(text="after the retry")
    )
    sid = session(model)
    result = rt.prompt(sid, "hi").result(timeout=20)
    assert result.status == "ok" and result.text == "after the retry"
    recorder.wait_type("agent_end")
    (retry,) = recorder.of("provider_retry", sid)
    assert retry.status_code == 429 and retry.attempt == 1


def test_auth_errors_end_the_turn_with_a_clear_error(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    model = script(Turn(fault=Fault(kind="auth")), Turn(text="unused"))
    sid = session(model)
    result = rt.prompt(sid, "hi").result(timeout=20)
    assert result.status == "error" and "401" in (result.error or "")
    recorder.wait_type("agent_end")
    assert not recorder.of("provider_retry", sid)
    assert recorder.of("error", sid)[-1].code == "provider_auth"


def test_agent_crash_mid_turn_recovers_from_the_store_and_goes_on(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    """An agent that crashes mid-turn is restarted; its successor repairs the interrupted tool call and
    takes the turn up from the log (the next step), and the prompt queued behind it still runs."""
    registry, release = blocking_registry()
    model = script(
        Turn(tool_calls=(call("wait_here", id="call_crash"),)), Turn(text="recovered fine"), Turn(text="next")
    )
    sid = session(model, tools=registry)
    handle = rt.prompt(sid, "go")
    recorder.wait_type("tool_execution_start")
    queued = rt.prompt(sid, "and then this")
    recorder.wait_type("message_queued")
    rt._session(sid).refs.agent.tell(object())  # an unexpected message: the handler raises, the actor dies
    resumed = handle.result(timeout=10)
    assert resumed.status == "ok" and resumed.text == "recovered fine"
    release.set()
    recorder.wait_type("agent_end")  # the subscriber's thread has the turn's events (restart, recovery) then
    (restart,) = recorder.of("actor_restarted", sid)
    assert restart.actor == "agent"
    (recovered,) = recorder.of("agent_recovered", sid)
    assert recovered.repaired_calls == 1 and recovered.interrupted_turn and recovered.continued
    assert queued.result(timeout=10).text == "next"
    assert check_integrity(rt.messages(sid, view="model")).ok
    recorder.wait_type("agent_end", 2)
    starts, ends = recorder.of("agent_start", sid), recorder.of("agent_end", sid)
    assert [e.turn_id for e in starts] == [e.turn_id for e in ends]  # one end per turn, crash or not


def test_a_second_crash_of_a_continued_turn_ends_it(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    """A turn is taken up once: crashing again in it ends it with an error instead of looping."""
    registry, release = blocking_registry()
    wait = Turn(tool_calls=(call("wait_here"),))
    model = script(wait, wait, Turn(text="later"))
    sid = session(model, tools=registry)
    handle = rt.prompt(sid, "go")
    recorder.wait_type("tool_execution_start")
    rt._session(sid).refs.agent.tell(object())
    recorder.wait_type("tool_execution_start", 2)  # the successor went on: the next step runs the tool again
    rt._session(sid).refs.agent.tell(object())
    result = handle.result(timeout=10)
    release.set()
    assert result.status == "error" and "crashed" in (result.error or "")
    recorder.wait_type("agent_recovered", 2)
    assert not recorder.of("agent_recovered", sid)[-1].continued
    assert rt.prompt(sid, "again").result(timeout=20).text == "later"


def test_tool_decorator_functions_can_be_passed_directly(rt: Any, script: Any, session: Any) -> None:
    @tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    model = script(Turn(tool_calls=(call("shout", '{"text": "hey"}'),)), Turn(text="ok"))
    sid = session(model, tools=[shout])
    assert rt.prompt(sid, "shout").result(timeout=20).status == "ok"
    assert tool_messages(rt, sid)[0].text == "HEY"


def test_a_turn_leaves_no_reference_cycles(rt: Any, script: Any, session: Any) -> None:
    # Every turn makes several calls between a session's actors. Garbage they leave in reference cycles
    # is freed only by the cycle collector, whose passes grow with the number of sessions hosted.
    model = script(
        Turn(tool_calls=(call("read_file", '{"path": "none.txt"}'),)), Turn(text="done"), Turn(text="again")
    )
    sid = session(model)
    assert rt.prompt(sid, "warm up").result(timeout=20).status == "ok"
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable is kept in gc.garbage
    try:
        assert rt.prompt(sid, "once more").result(timeout=20).status == "ok"
        gc.collect()
        ours = [
            o
            for o in gc.garbage
            if isinstance(o, types.FunctionType) and o.__module__.startswith(("actors.", "runtime."))
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert [f.__qualname__ for f in ours] == []


@pytest.mark.parametrize("bad", [None, 42])
def test_prompt_rejects_non_text(rt: Any, script: Any, session: Any, bad: Any) -> None:
    sid = session(script(Turn(text="x")))
    with pytest.raises(TypeError, match="must be a string"):
        rt.prompt(sid, bad)


def test_a_silent_stream_is_reported_as_stalled(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    model = script(Turn(text="finally", latency=0.8))
    sid = session(model, config={"agent.stream_stall_seconds": 0.2})
    result = rt.prompt(sid, "take your time").result(timeout=20)
    assert result.status == "ok" and result.text == "finally"
    recorder.wait_type("agent_end")
    stalls = recorder.of("stream_stalled", sid)
    assert stalls and stalls[0].seconds >= 0.2
    assert recorder.types(sid).index("stream_stalled") < recorder.types(sid).index("text_delta")


def test_the_state_machine_reports_every_move(rt: Any, recorder: Recorder, script: Any, session: Any) -> None:
    """Every state change is a ``status_update`` along the table's edges: a tool turn goes
    running → streaming → running → executing_tools → running → streaming → running → idle."""
    from actors.agent import TRANSITIONS, AgentState

    model = script(Turn(tool_calls=(call("read_file", '{"path": "a.txt"}'),)), Turn(text="done"))
    sid = session(model)
    assert rt.prompt(sid, "go").result(timeout=20).status == "ok"
    recorder.wait_type("agent_end")
    updates = recorder.of("status_update", sid)
    assert [u.state for u in updates] == [
        "running",
        "streaming",
        "running",
        "executing_tools",
        "running",
        "streaming",
        "running",
        "idle",
    ]
    (start,) = recorder.of("agent_start", sid)
    assert all(u.turn_id == start.turn_id for u in updates)
    for update in updates:
        assert AgentState(update.state) in TRANSITIONS[AgentState(update.previous)]
    # every state can be left and reached
    assert set(TRANSITIONS) == set(AgentState) == {s for targets in TRANSITIONS.values() for s in targets}


def test_a_steering_message_joins_the_running_turn_after_its_tools(
    rt: Any, recorder: Recorder, script: Any, session: Any, provider: Any
) -> None:
    """``prompt(steer=True)`` while tools run: the message is applied at the next step boundary (right
    after the tools' results, before the next request) and its handle resolves with that turn."""
    registry, release = blocking_registry()
    model = script(Turn(tool_calls=(call("wait_here"),)), Turn(text="done, with the change"))
    sid = session(model, tools=registry)
    handle = rt.prompt(sid, "go")
    recorder.wait_type("tool_execution_start")
    steer = rt.prompt(sid, "also check the tests", steer=True)
    release.set()
    result = handle.result(timeout=20)
    assert result.text == "done, with the change"
    assert steer.result(timeout=5).text == "done, with the change"
    last = requests_for(provider, model)[-1].messages
    assert [m["role"] for m in last[-3:]] == ["assistant", "tool", "user"]
    assert last[-1]["content"] == "also check the tests"
    recorder.wait_type("message_queued")  # (a callback subscriber's thread may still be delivering it)
    (queued,) = recorder.of("message_queued", sid)
    assert queued.steer
    assert len(recorder.of("agent_start", sid)) == 1  # one turn, not two


def test_a_steering_message_that_finds_no_step_boundary_runs_next(
    rt: Any, recorder: Recorder, script: Any, session: Any
) -> None:
    """When the turn answers without another tool step, the steering message runs as the next turn."""
    model = script(Turn(text="first", latency=0.5), Turn(text="second"))
    sid = session(model)
    handle = rt.prompt(sid, "go")
    recorder.wait_type("request_start")
    steer = rt.prompt(sid, "and another thing", steer=True)
    assert handle.result(timeout=20).text == "first"
    assert steer.result(timeout=20).text == "second"
    recorder.wait_type("agent_start", 2)  # (a callback subscriber's thread may still be delivering it)
    assert len(recorder.of("agent_start", sid)) == 2


def test_a_crashed_turn_nobody_takes_up_ends_for_subscribers_too() -> None:
    """A crashed agent's turn that no successor takes up (its session's actors kept crashing) is answered
    with an error, and its ``agent_start`` gets its ``error`` and ``agent_end`` as any turn's does (the
    spans end it from them, design §7.5); before, the handle was answered and the events said nothing."""
    from actors.agent import abandon
    from runtime.bus import EventBus
    from runtime.turn.state import Handover, TurnState
    from tests.turn.world import prompt

    bus = EventBus()
    seen = bus.subscribe()
    run = TurnState(prompt=prompt("hi"))
    run.step = 2
    queued = prompt("next")
    abandon(Handover(run, [queued]), "the session's actors kept crashing", bus, "s1")
    error, end = seen.drain()
    assert (error.type, error.code, error.turn_id) == ("error", "agent_crashed", run.turn_id)
    assert (end.type, end.turn_id, end.status, end.steps) == ("agent_end", run.turn_id, "error", 2)
    assert run.prompt.handle.result(timeout=1).status == "error"
    assert queued.handle.result(timeout=1).status == "error"
