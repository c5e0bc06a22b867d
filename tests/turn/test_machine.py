"""The turn machine driven by scripted events, without actors or threads (design §3.1).

Each test plays the part of the agent's collaborators (:class:`tests.turn.world.World`): it answers the
machine's effects one by one, and checks what the machine asked for, the events it published and the
result each prompt got.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from actors.protocol import ContextView, Outcome, Verdict
from runtime.handles import Handle
from runtime.messages import KIND_STEER, Usage, assistant, user
from runtime.store.entries import StepEntry
from runtime.turn import AgentState, IllegalTransition, TurnMachine
from runtime.turn import effects as fx
from tests.turn.world import (
    WINDOW,
    Counter,
    Measure,
    Spec,
    World,
    answer,
    calls,
    config,
    failure,
    machine,
    prompt,
)


def test_a_plain_answer_is_one_request_and_the_turn_ends_ok() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    w.run([answer("hello")])
    assert w.types() == [
        "agent_start",
        "status_update",
        "request_start",
        "status_update",
        "status_update",
        "turn_end",
        "status_update",
        "agent_end",
    ]
    states = [e.state for e in w.events if e.type == "status_update"]
    assert states == ["running", "streaming", "running", "idle"]
    result = w.result(p)
    assert result.status == "ok" and result.text == "hello" and result.steps == 1
    assert result.usage.input_tokens == 100
    assert [m.role for m in w.log] == ["user", "assistant"]
    # the answer ends the turn with its append: no SyncTurn after it
    assert not any(isinstance(e, fx.SyncTurn) for e in w.seen)
    (record,) = [e for e in w.seen if isinstance(e, fx.RecordAnswer)]
    assert record.end_turn and record.check_usage
    assert w.m.state is AgentState.IDLE and w.m.run is None


def test_a_session_without_mcp_servers_asks_for_no_tools_refresh_and_no_turn_asks_for_a_span() -> None:
    """Spans are made from the events (design §7.5): a turn waits for nothing of them, traced or not."""
    plain = World(machine())
    plain.prompt(prompt("hi"))
    plain.run([answer("hello")])
    bare = World(
        TurnMachine(
            Spec(config(), mcp=None),
            counter=Counter(),
            measure=Measure(),
            model="openai/gpt-4o-mini",
            context_window=WINDOW,
            spill_dir=Path("/nonexistent/s1.spill"),
        )
    )
    p = prompt("hi")
    bare.prompt(p)
    bare.run([answer("hello")])
    asked = [type(e).__name__ for e in bare.seen if isinstance(e, fx.Awaited)]
    assert asked == ["Persist", "Route", "CallModel", "RecordAnswer"]
    assert "RefreshTools" in {type(e).__name__ for e in plain.seen}
    assert not [name for name in fx.__all__ if "Span" in name]
    assert bare.types() == plain.types() and bare.result(p).text == "hello"


def test_the_events_carry_what_the_spans_of_a_turn_are_made_from() -> None:
    """The turn's model and steps, where each call went, its attempts and capacity wait, and a failed
    call's error: fields of the turn's events (design §7.5), not a second account kept beside them."""
    from runtime.gateway import CompletionResult, ProviderError
    from runtime.messages import Usage, assistant

    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    overflow = CompletionResult(
        message=None,
        error=ProviderError(kind="context_overflow", message="too long", status_code=400),
        attempts=1,
        transport="openai_compat",
        pool="http://h:1|k",
        waited=0.25,
    )
    busy = CompletionResult(
        message=assistant("fits now", usage=Usage(input_tokens=50, output_tokens=5)),
        attempts=3,
        pool="http://h:1|k",
        waited=1.5,
        latency=2.5,
    )
    routed = fx.Routed(transport="openai_compat", provider="openai", server_address="h", server_port=1)
    w.run([overflow, busy], Route=routed)
    (start,) = w.of("agent_start")
    assert start.model == "openai/gpt-4o-mini"
    first, _ = w.of("request_start")
    assert (first.provider, first.server_address, first.server_port) == ("openai", "h", 1)
    assert first.max_tokens is not None and first.max_tokens > 0
    (failed,) = w.of("request_failed")
    assert (failed.turn_id, failed.request_id) == (start.turn_id, first.message_id)
    assert (failed.kind, failed.status_code, failed.attempts) == ("context_overflow", 400, 1)
    assert (failed.transport, failed.pool, failed.waited) == ("openai_compat", "http://h:1|k", 0.25)
    (end,) = w.of("turn_end")
    assert (end.attempts, end.pool, end.waited, end.latency) == (3, "http://h:1|k", 1.5, 2.5)
    (agent_end,) = w.of("agent_end")
    assert agent_end.steps == 2 == w.result(p).steps


def test_the_request_carries_the_system_prompt_the_view_and_the_answer_gets_the_announced_id() -> None:
    w = World(machine())
    w.prompt(prompt("hi"))
    route = w.run_until(fx.Route, [])
    assert isinstance(route, fx.Route)
    spec = route.request
    assert [m.role for m in spec.messages] == ["system", "user"] and spec.first
    w.give(fx.Routed(transport="native"))
    (start,) = [e for e in w.events if e.type == "request_start"]
    assert start.transport == "native" and start.attempt == 1
    call = w.pending
    assert isinstance(call, fx.CallModel) and call.message_id == start.message_id
    w.give(fx.ModelReply(answer("x"), "retried-id"))  # a retried stream announced a new id
    w.run([])
    assert w.log[-1].id == "retried-id"


def test_tool_rounds_run_the_calls_record_their_results_and_ask_again() -> None:
    w = World(machine())
    p = prompt("read two files")
    w.prompt(p)
    w.run([calls("read_file", "grep"), calls("read_file"), answer("all read")])
    result = w.result(p)
    assert result.status == "ok" and result.steps == 3 and result.text == "all read"
    runs = [e for e in w.seen if isinstance(e, fx.RunTools)]
    assert [len(r.calls) for r in runs] == [2, 1]
    assert [m.role for m in w.log] == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    states = [e.state for e in w.events if e.type == "status_update"]
    assert states == ["running", "streaming", "running", "executing_tools", "running"] * 1 + [
        "streaming",
        "running",
        "executing_tools",
        "running",
        "streaming",
        "running",
        "idle",
    ]
    routes = [e.request for e in w.seen if isinstance(e, fx.Route)]
    assert [r.first for r in routes] == [True, False, False]
    assert w.orphans() == []


def test_overflow_compacts_in_an_emergency_and_retries_once() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    w.run([failure("context_overflow"), answer("fits now")])
    compactions = [e for e in w.seen if isinstance(e, fx.Compact)]
    assert [(c.trigger, c.emergency) for c in compactions] == [("overflow", True)]
    (classify,) = [e for e in w.seen if isinstance(e, fx.Classify)]
    assert classify.recoveries_this_turn == 0
    assert w.result(p).status == "ok" and w.result(p).text == "fits now"
    assert [e.attempt for e in w.events if e.type == "request_start"] == [1, 2]


def test_a_second_overflow_is_the_detectors_error_not_a_loop() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    verdicts = iter(
        [
            Verdict("compact_and_retry", "overflow", overflow=True),
            Verdict("fail", "still too big", code="context_overflow_after_compaction", overflow=True),
        ]
    )
    w.run([failure(), failure()], Classify=lambda _: next(verdicts))
    classify = [e.recoveries_this_turn for e in w.seen if isinstance(e, fx.Classify)]
    assert classify == [0, 1]
    result = w.result(p)
    # (the prompt is small beside what was sent: it is not the cause, so it stays visible)
    assert result.status == "error" and result.error == "still too big"
    assert w.types()[-3:] == ["error", "status_update", "agent_end"]


def test_a_reply_that_raises_the_learned_count_ratio_is_told_for_the_compactor() -> None:
    """The server counts 1.5 x ours (design §4.5): the machine says so once (the compactor fits the session's
    own summarizer requests at it); a later reply that teaches nothing higher says nothing."""
    w = World(machine())
    text = "a" * 1_200  # 304 tokens, + 20 fixed: a request counted here in full
    w.prompt(prompt(text))
    w.run([answer(input_tokens=486)])
    assert w.m.count_ratio.value == 1.5
    w.prompt(prompt(text))
    w.run([answer(input_tokens=700)])
    assert w.m.count_ratio.value == 1.5
    learned = [(e.ratio, e.model) for e in w.seen if isinstance(e, fx.LearnCountRatio)]
    assert learned == [(1.5, "openai/gpt-4o-mini")]


def test_a_restarted_agent_s_machine_keeps_the_count_ratio_the_session_learned() -> None:
    """A machine started with the ratio its session learned before the agent restarted (1.5) fits its
    requests at it, and a reply that teaches less (1.25) says nothing: the compactor keeps 1.5. A machine
    that had started over from the default would tell the compactor 1.25, below what the server counts."""
    text = "a" * 1_200  # 304 tokens, + 20 fixed: a request counted here in full
    for told, said in ((1.5, []), (None, [1.25])):
        w = World(machine(count_ratio=told))
        assert w.m.count_ratio.value == (1.5 if told else 1.0)
        w.prompt(prompt(text))
        w.run([answer(input_tokens=405)])  # 1.25 x 324
        assert w.m.count_ratio.value == (told or 1.25)
        assert [e.ratio for e in w.seen if isinstance(e, fx.LearnCountRatio)] == said


def test_a_learned_window_is_taken_and_told() -> None:
    w = World(machine())
    w.prompt(prompt("hi"))
    verdict = Verdict("compact_and_retry", "overflow", overflow=True, learned_window=4_000)
    w.run([failure(), answer()], Classify=verdict)
    assert w.m.context_window == 4_000
    (learn,) = [e for e in w.seen if isinstance(e, fx.LearnWindow)]
    assert learn.window == 4_000
    (learned,) = [e for e in w.events if e.type == "window_learned"]
    assert (learned.old, learned.new, learned.source) == (WINDOW, 4_000, "overflow")


def test_an_emergency_compaction_that_cannot_help_ends_the_turn_hiding_a_prompt_that_is_the_cause() -> None:
    w = World(machine())
    p = prompt("x" * 20_000)  # about 5,000 tokens: the prompt is most of the request
    w.prompt(p)
    nothing = Outcome(messages=(), estimate=6_000, attempted=True, compacted=False, message="nothing to cut")
    w.run([failure()], Compact=nothing)
    result = w.result(p)
    assert result.status == "error" and "emergency compaction could not make room" in (result.error or "")
    assert "hidden from the model" in (result.error or "")
    (hide,) = [e for e in w.seen if isinstance(e, fx.Hide)]
    assert hide.message_ids == (p.message.id,)
    assert not w.log[0].agent_visible


def test_a_threshold_compaction_before_a_request_and_only_one_per_turn() -> None:
    w = World(machine())
    w.log.extend(prompt("old " * 2_000).inputs)  # ~2,000 tokens of history
    p = prompt("more " * 5_000)  # with it, over the threshold (7,200) but under the limit (9,000)
    w.prompt(p)
    w.run([calls("read_file"), answer()], Compact=Outcome(messages=(), estimate=8_000, attempted=True))
    compactions = [(c.trigger, c.emergency) for c in w.seen if isinstance(c, fx.Compact)]
    assert compactions == [("threshold", False)]  # not again at the second step, though still over it
    assert w.result(p).status == "ok"


def test_a_compaction_that_leaves_the_session_dead_ends_the_turn() -> None:
    w = World(machine())
    w.log.extend(prompt("old " * 2_000).inputs)
    p = prompt("more " * 5_000)
    w.prompt(p)
    dead = Outcome(dead=True, message="the context cannot fit", attempted=True)
    w.run([], Compact=dead)
    result = w.result(p)
    assert result.status == "error" and result.error == "the context cannot fit"
    assert "session_dead" in w.types()
    (err,) = [e for e in w.events if e.type == "error"]
    assert err.code == "session_dead"
    assert [e for e in w.seen if isinstance(e, fx.Route)] == []


def test_a_prompt_that_cannot_fit_is_refused_before_any_request_and_kept_hidden() -> None:
    w = World(machine())
    p = prompt("y" * 60_000)
    w.prompt(p)
    w.run([])
    result = w.result(p)
    assert result.status == "error" and "does not fit" in (result.error or "")
    assert [m.agent_visible for m in w.log] == [False]
    assert not any(isinstance(e, fx.Route) for e in w.seen)


def test_steps_run_out_with_calls_pending_the_turn_ends_and_the_calls_get_results() -> None:
    w = World(machine(config(**{"agent.max_steps_per_turn": 2})))
    p = prompt("loop")
    w.prompt(p)
    w.run([calls("read_file"), calls("read_file", "grep")])
    result = w.result(p)
    assert result.status == "error" and "max_steps_per_turn (2)" in (result.error or "")
    assert len([e for e in w.seen if isinstance(e, fx.CallModel)]) == 2
    assert w.orphans() == []  # the second step's two calls were answered with error results
    sync = [e for e in w.seen if isinstance(e, fx.SyncTurn)]
    assert sync == [fx.SyncTurn(ended=True)]


def test_the_spend_guard_ends_a_turn_before_a_request_past_its_input_budget() -> None:
    w = World(machine(config(**{"agent.max_turn_input_tokens": 5_000})))
    p = prompt("go")
    w.prompt(p)
    w.run([calls("read_file", input_tokens=3_000), calls("read_file", input_tokens=3_000), answer()])
    result = w.result(p)
    assert (
        result.status == "error" and result.error and "turn stopped before its next request" in result.error
    )
    err = [e for e in w.events if e.type == "error"]
    assert [e.code for e in err] == ["turn_budget"]
    assert len([e for e in w.seen if isinstance(e, fx.CallModel)]) == 2


def test_an_abort_mid_stream_cancels_the_call_ends_the_turn_and_drops_the_late_answer() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    call = w.run_until(fx.CallModel, [])
    handle: Handle[bool] = Handle()
    w.abort(handle)
    assert [type(e) for e in w.seen[-3:]] == [fx.CancelIO, fx.CancelApprovals, fx.ReadContext]
    w.run([])
    assert w.abort_answers == [True]
    assert w.result(p).status == "aborted"
    assert w.types()[-3:] == ["agent_abort", "status_update", "agent_end"]
    assert w.events[-1].status == "aborted"
    assert w.m.answer(call.ticket, fx.ModelReply(answer("late"), call.message_id)) == []  # dropped
    assert w.m.abort() == []  # nothing runs any more
    assert fx.SyncTurn(ended=True) in w.seen


def test_an_abort_mid_tools_gives_the_running_calls_results() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    tools = w.run_until(fx.RunTools, [calls("read_file", "grep")])
    w.abort()
    w.run([])
    (abort,) = [e for e in w.events if e.type == "agent_abort"]
    assert abort.repaired_calls == 2
    assert w.orphans() == []
    assert w.result(p).status == "aborted"
    assert w.m.answer(tools.ticket, []) == []


def test_a_log_that_cannot_be_written_ends_the_turn_persistence_failed() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    w.run([], Persist=fx.Failed("OSError: disk full", OSError(28, "No space left on device")))
    result = w.result(p)
    assert result.status == "error" and (result.error or "").startswith("persistence_failed")
    (err,) = [e for e in w.events if e.type == "error"]
    assert err.code == "persistence_failed"


def test_a_collaborator_that_is_gone_ends_the_turn_internal() -> None:
    w = World(machine())
    p = prompt("hi")
    w.prompt(p)
    w.run([failure()], Classify=fx.Failed("ActorDeadError: gone"))
    result = w.result(p)
    assert result.status == "error" and result.error == "session actor unavailable: ActorDeadError: gone"


def test_prompts_queue_behind_a_turn_and_steering_joins_at_the_next_step_boundary() -> None:
    w = World(machine())
    first, queued, steer = prompt("first"), prompt("next"), prompt("also this", steer=True)
    w.prompt(first)
    w.run_until(fx.RunTools, [calls("read_file")])
    w.prompt(queued)
    w.prompt(steer)
    queued_events = [e for e in w.events if e.type == "message_queued"]
    assert [(e.position, e.steer) for e in queued_events] == [(1, False), (1, True)]
    w.run([answer("first done"), answer("next done")])
    assert w.result(first).text == "first done" and w.result(steer).text == "first done"
    assert w.result(queued).text == "next done"
    kinds = [(m.role, m.kind) for m in w.log]
    assert ("user", KIND_STEER) in kinds
    assert kinds.index(("user", KIND_STEER)) == [r for r, _ in kinds].index("tool") + 1
    assert w.types().count("agent_start") == 2 == w.types().count("agent_end")


def test_waiting_for_capacity_is_the_queued_state() -> None:
    w = World(machine())
    w.prompt(prompt("hi"))
    call = w.run_until(fx.CallModel, [])
    w.take(w.m.queued(call.ticket, "pool-a", 3, 1.5))
    assert w.m.state is AgentState.QUEUED
    assert w.m.queued(call.ticket - 1, "pool-a", 3, 1.5) == []  # another call's news
    w.take(w.m.admitted(call.ticket, 2.0))
    assert w.m.state is AgentState.STREAMING
    (admitted,) = [e for e in w.events if e.type == "request_admitted"]
    assert admitted.pool == "pool-a" and admitted.waited == 2.0
    w.run([answer()])


def test_a_silent_overflow_compacts_before_the_next_request() -> None:
    w = World(machine())
    w.prompt(prompt("hi"))
    w.run([answer()])
    w.m.usage_overflowed()
    p = prompt("again")
    w.prompt(p)
    w.run([answer()], Compact=Outcome(messages=(), estimate=50, attempted=True))
    assert [c.trigger for c in w.seen if isinstance(c, fx.Compact)] == ["usage_overflow"]
    assert w.m.pending_trigger is None


def test_a_crash_hands_the_turn_over_and_the_successor_takes_it_up_from_the_log() -> None:
    w = World(machine())
    p, waiting = prompt("hi"), prompt("later")
    w.prompt(p)
    w.run_until(fx.RunTools, [calls("read_file")])
    w.prompt(waiting)
    handover, effects = w.m.crash("boom")
    assert handover is not None and handover.run is not None and handover.queue == [waiting]
    assert any(isinstance(e, fx.CancelIO) for e in effects) and not any(
        isinstance(e, fx.Resolve) for e in effects
    )
    successor = machine(recovering=True)
    w.m, w.pending = successor, None
    w.take(successor.prompt(prompt("while recovering")))  # waits, silently
    w.take(successor.recover())
    w.run([answer("taken up"), answer("later done"), answer("third")], TakeHandover=handover)
    assert w.result(p).text == "taken up" and w.result(waiting).text == "later done"
    (recovered,) = [e for e in w.events if e.type == "agent_recovered"]
    # the call never started (no step record says so): it runs again, and the turn goes on (design §3.12)
    assert recovered.continued and recovered.repaired_calls == 0
    (resumed,) = [e for e in w.events if e.type == "turn_resumed"]
    assert resumed.rerun_calls == 1 and resumed.turn_id == handover.run.turn_id
    assert len([e for e in w.seen if isinstance(e, fx.RunTools)]) == 2
    assert w.orphans() == []


def test_a_turn_taken_up_from_the_log_is_decided_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """design §3.12: a turn the process stopped in (no handover: the log's step records) is taken up at its
    next step, under the prompt id it was sent with; how it goes on (``recover_turn``) is decided once."""
    from runtime.turn import recovery

    decided: list[int] = []
    real = recovery.recover_turn

    def counted(*args: Any, **kwargs: Any) -> Any:
        decided.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(recovery, "recover_turn", counted)
    m = machine(recovering=True)
    w = World(m)
    w.log[:] = [user("hi"), calls("read_file").message]
    steps = (
        StepEntry(turn_id="t-cut", kind="turn", prompt_id="p-cut"),
        StepEntry(turn_id="t-cut", kind="request", step=1),
    )

    def read(_effect: Any) -> ContextView:
        return ContextView(session_id="s1", leaf_id=None, messages=tuple(w.log), steps=steps)

    w.take(m.recover())
    w.run([answer("taken up")], TakeHandover=None, ReadContext=read)
    (resumed,) = [e for e in w.events if e.type == "turn_resumed"]
    assert resumed.turn_id == "t-cut" and resumed.prompt_id == "p-cut" and resumed.rerun_calls == 1
    assert w.log[-1].text == "taken up" and w.orphans() == []
    assert len(decided) == 1


def test_recovery_restores_the_usage_the_log_records_and_releases_it_when_the_log_cannot_be_read() -> None:
    """design §4.1: the totals a recovered session reports are what its log records it paid for (the view's
    ``spent``), not the sum over the model's view; a log that cannot be read still releases a usage tracker
    waiting for the totals (``read=False``), rather than leave ``usage()`` unanswered."""

    def recovered(read_context: Any) -> fx.RestoreUsage:
        m = machine(recovering=True)
        w = World(m)
        w.take(m.recover())
        w.run([], TakeHandover=None, ReadContext=read_context)
        (restore,) = [e for e in w.seen if isinstance(e, fx.RestoreUsage)]
        return restore

    spent = Usage(input_tokens=5_000, output_tokens=70)
    turn = (user("hi"), assistant("hello", usage=Usage(input_tokens=9, output_tokens=1)))
    restore = recovered(ContextView(session_id="s1", leaf_id=None, messages=turn, spent=spent))
    assert restore.read and restore.spent == spent and restore.messages == turn
    unread = recovered(fx.Failed("ActorDeadError: gone"))
    assert not unread.read and unread.spent is None


def test_an_illegal_move_raises() -> None:
    m = machine()
    with pytest.raises(IllegalTransition):
        m._enter(AgentState.STREAMING)


def test_the_answer_cap_learns_how_much_more_the_server_counts() -> None:
    # design §4.5: a stand-in tokenizer's count (an unknown model: cl100k) keeps a margin of its expected
    # excess, 1.25 × until a reply says how much the server really counted; the fake measure counts in full
    cfg = config(**{"models.context_windows": {"openai/smollm2": 2_048}})
    m = TurnMachine(
        Spec(cfg),
        counter=Counter(),
        measure=Measure(),
        model="openai/smollm2",
        context_window=2_048,
        spill_dir=Path("/nonexistent/s1.spill"),
    )
    w = World(m)
    text = "a fairly long note about the harbour and its ledgers " * 40  # ~540 tokens as counted here
    w.prompt(prompt(text))
    first = w.run_until(fx.CallModel, [])
    assert isinstance(first, fx.CallModel)
    estimate = first.request.estimated_tokens
    assert first.request.max_tokens == 2_048 - estimate - max(128, math.ceil(estimate * 0.25) + 32)
    w.run([answer("noted", input_tokens=round(estimate * 1.5))])  # the server counted 1.5 × ours
    w.prompt(prompt(text))
    second = w.run_until(fx.CallModel, [])
    assert isinstance(second, fx.CallModel)
    estimate = second.request.estimated_tokens
    assert second.request.max_tokens == 2_048 - estimate - (math.ceil(estimate * 0.5) + 32)
