"""The turn machine over random event sequences (hypothesis), without actors or threads.

The world answers each effect with a drawn outcome (an answer, tool calls, an overflow or another provider
error, a compaction that works, does nothing or kills the session, a window learned, a log that cannot be
written) and, between effects, may abort, send a prompt, steer, report a silent overflow or a capacity
wait. Whatever happens:

- every turn ends exactly once (one ``agent_end`` per ``agent_start``, nothing of the turn after it), and
  every prompt sent gets exactly one result;
- every request the machine sends has one result for each tool call, and no turn leaves a call without
  its result in the log (unless the log itself failed);
- the budgets hold: at most ``max_steps_per_turn`` requests a turn (and one retry after each emergency
  compaction), none past the turn's input budget, at
  most one threshold compaction a turn and one emergency one (more only after a window was learned);
- every compaction asked for is answered before its turn ends, unless the turn was aborted;
- the machine settles idle.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.protocol import Outcome, Verdict
from runtime.context.integrity import repair_tool_calls
from runtime.context.working_set import turn_input_budget
from runtime.gateway import CompletionResult
from runtime.messages import Message
from runtime.turn import AgentState
from runtime.turn import effects as fx
from tests.turn.world import FakePrompt, World, answer, calls, config, failure, machine, prompt

MAX_STEPS = 4
BUDGET = 30_000


def _reply(data: st.DataObject) -> CompletionResult:
    kind = data.draw(st.sampled_from(["answer", "tools", "tools", "overflow", "rate_limit"]))
    tokens = data.draw(st.integers(10, 9_000))
    if kind == "answer":
        return answer("ok", input_tokens=tokens)
    if kind == "tools":
        names = data.draw(st.lists(st.sampled_from(["read_file", "grep"]), min_size=1, max_size=3))
        return calls(*names, input_tokens=tokens)
    if kind == "overflow":
        return failure("context_overflow")
    return failure("rate_limit", "slow down")


def _split_pairs(messages: tuple[Message, ...]) -> bool:
    """Whether a request's messages leave a tool call without its one result right after it."""
    for i, message in enumerate(messages):
        if message.role != "assistant" or not message.tool_calls:
            continue
        results = []
        for later in messages[i + 1 :]:
            if later.role != "tool":
                break
            results.append(later.tool_call_id)
        if Tally(results) != Tally(c.id for c in message.tool_calls):
            return True
    return bool(repair_tool_calls(messages))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_event_sequences_keep_every_promise(data: st.DataObject) -> None:
    w = World(
        machine(config(**{"agent.max_steps_per_turn": MAX_STEPS, "agent.max_turn_input_tokens": BUDGET}))
    )
    sent: list[FakePrompt] = []
    persistence_failed = False
    aborted: set[str] = set()
    learned: Tally[str] = Tally()
    steps: Tally[str] = Tally()
    spent: Tally[str] = Tally()
    compactions: dict[str, list[fx.Compact]] = defaultdict(list)
    answered: set[int] = set()  # the tickets of the compactions answered

    def send(p: FakePrompt) -> None:
        sent.append(p)
        w.prompt(p)

    send(prompt("x" * data.draw(st.integers(1, 40_000))))
    for _ in range(120):
        turn = w.m.run.turn_id if w.m.run is not None else None
        # something may happen between effects
        event = data.draw(
            st.sampled_from(["none"] * 6 + ["abort", "prompt", "steer", "overflowed", "capacity"])
        )
        if event == "abort":
            if turn is not None:
                aborted.add(turn)
            w.abort()
        elif event == "prompt":
            send(prompt("y" * data.draw(st.integers(1, 8_000))))
        elif event == "steer":
            send(prompt("steer", steer=True))
        elif event == "overflowed":
            w.m.usage_overflowed()
        elif event == "capacity" and isinstance(w.pending, fx.CallModel):
            w.take(w.m.queued(w.pending.ticket, "p", 1, 0.5))
            w.take(w.m.admitted(w.pending.ticket, 0.5))
        effect = w.pending
        if effect is None:
            if w.m.queue:
                continue
            break
        turn = w.m.run.turn_id if w.m.run is not None else turn
        value: Any
        if isinstance(effect, fx.CallModel):
            assert turn is not None
            steps[turn] += 1  # (a retry after an emergency compaction is a request of its own)
            assert steps[turn] <= MAX_STEPS + sum(c.emergency for c in compactions[turn])
            assert not _split_pairs(effect.request.messages)
            assert spent[turn] + effect.request.estimated_tokens <= turn_input_budget(
                BUDGET, w.m.context_window
            )
            reply = _reply(data)
            if reply.message is not None and reply.message.usage is not None:
                spent[turn] += reply.message.usage.input_tokens
            value = fx.ModelReply(reply, effect.message_id)
        elif isinstance(effect, fx.Classify):
            overflow = effect.error.kind == "context_overflow"
            window = None
            if overflow and data.draw(st.booleans()) and w.m.context_window > 3_000:
                window = data.draw(st.integers(3_000, w.m.context_window - 1))
                assert turn is not None
                learned[turn] += 1
            if overflow and (effect.recoveries_this_turn == 0 or window is not None):
                value = Verdict("compact_and_retry", "overflow", overflow=True, learned_window=window)
            else:
                value = Verdict("fail", "no", code="x", overflow=overflow, learned_window=window)
        elif isinstance(effect, fx.Compact):
            assert turn is not None
            compactions[turn].append(effect)
            outcome = data.draw(st.sampled_from(["compacted", "compacted", "nothing", "dead"]))
            if outcome == "compacted":
                value = w.compacted()
            elif outcome == "nothing":
                value = Outcome(messages=tuple(w.log), estimate=9_500, attempted=True, message="nothing")
            else:
                value = Outcome(dead=True, message="dead", attempted=True)
            answered.add(effect.ticket)
        elif isinstance(effect, fx.Persist) and not effect.optional and data.draw(st.integers(0, 30)) == 0:
            persistence_failed = True
            value = fx.Failed("OSError: disk full", OSError(28, "No space left on device"))
        elif isinstance(effect, fx.RunTools):
            w.tool_output = "z" * data.draw(st.integers(1, 30_000))
            value = w.auto(effect)
        else:
            value = w.auto(effect)
        w.give(value)
    else:  # the budget of events ran out: abort and drain
        w.abort()
    for attempt in range(400):  # drain: answer what is left (a final answer to every request), then abort
        effect = w.pending
        if effect is None:
            if w.m.run is None and not w.m.queue:
                break
            w.abort()  # (a turn waiting for nothing: a capacity wait, say)
        elif attempt > 60 and w.m.run is not None:
            w.abort()  # (a last long queue: abort each turn)
        elif isinstance(effect, fx.CallModel):
            w.give(fx.ModelReply(answer("end", input_tokens=10), effect.message_id))
        elif isinstance(effect, fx.Classify):
            w.give(Verdict("fail", "no"))
        else:
            w.give(w.auto(effect))

    # every prompt, exactly one result; every turn, exactly one end, its last event
    for p in sent:
        assert len(w.results.get(p.handle.id, [])) == 1, (
            p.message.text[:10],
            w.results.get(p.handle.id),
            (len(w.m.steering), len(w.m.queue), w.m.state, w.m.run is None, w.pending),
            [(type(e).__name__, getattr(getattr(e, "event", None), "type", "")) for e in w.seen][-30:],
        )
    events = w.events
    starts = [e.turn_id for e in events if e.type == "agent_start"]
    ends = [e.turn_id for e in events if e.type == "agent_end"]
    assert sorted(starts) == sorted(ends) and len(set(ends)) == len(ends), [
        (e.type, getattr(e, "turn_id", "")[:4], getattr(e, "state", "")) for e in events
    ]
    for turn in ends:
        last = max(i for i, e in enumerate(events) if getattr(e, "turn_id", None) == turn)
        assert events[last].type == "agent_end"
    # every call gets its result, in the log too
    if not persistence_failed:
        assert repair_tool_calls(w.log) == []
    # compactions: one threshold one a turn, one emergency one (more after a learned window)
    for turn, asked in compactions.items():
        assert sum(not c.emergency for c in asked) <= 1
        assert sum(c.emergency for c in asked) <= 1 + learned[turn]
        for compaction in asked:
            assert compaction.ticket in answered or turn in aborted
    assert w.m.state is AgentState.IDLE and w.m.run is None and w.pending is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["answer", "tools", "abort", "late"]), min_size=1, max_size=25))
def test_a_late_answer_never_reaches_a_turn_it_does_not_belong_to(moves: list[str]) -> None:
    """Answers carried by an old ticket (an aborted turn's provider call or tools) are dropped: they change
    nothing and say nothing."""
    w = World(machine())
    old: list[fx.Awaited] = []
    w.prompt(prompt("go"))
    for move in moves:
        effect = w.pending
        if effect is None:
            w.prompt(prompt("again"))
            continue
        if move == "abort":
            if w.m.run is not None:  # (before its agent_start a turn cannot be aborted yet)
                old.append(effect)
            w.abort()
        elif move == "late" and old:
            stale = old[-1]
            before = (w.m.state, len(w.seen), tuple(w.log))
            assert w.m.answer(stale.ticket, fx.ModelReply(answer("late"), "x")) == []
            assert (w.m.state, len(w.seen), tuple(w.log)) == before
        elif isinstance(effect, fx.CallModel):
            reply = calls("grep") if move == "tools" else answer()
            w.give(fx.ModelReply(reply, effect.message_id))
        else:
            w.give(w.auto(effect))
