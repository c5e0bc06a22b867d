"""Taking up a turn a crash cut off (design §3.12): the pure decision of runtime/durable.py, and the step
records a log keeps for it."""

from __future__ import annotations

from runtime.durable import (
    OUTCOME_UNKNOWN_KEY,
    recover_turn,
    step_record,
    turn_prompt,
)
from runtime.messages import Message, TextPart, ToolCallPart, tool_result, user
from runtime.store.entries import StepEntry, decode_entry, encode_entry, new_header
from runtime.store.tree import SessionTree

IDEMPOTENT = {"read_file": True, "grep": True}


def idempotent(name: str) -> bool:
    return IDEMPOTENT.get(name, False)


def answer(*calls: tuple[str, str]) -> Message:
    return Message(
        role="assistant", parts=tuple(ToolCallPart(id=i, name=n, arguments="{}") for i, n in calls)
    )


def steps(*records: tuple[str, str]) -> list[StepEntry]:
    out = [step_record("t1", "turn", prompt_id="p1")]
    for kind, call in records:
        out.append(
            step_record("t1", kind, call_id=call) if kind == "tool_started" else step_record("t1", kind)
        )  # type: ignore[arg-type]
    return out


def test_a_started_call_of_a_tool_with_effects_is_not_run_again() -> None:
    messages = [user("go"), answer(("a", "read_file"), ("b", "write_file"), ("c", "write_file"))]
    records = steps(("request", ""), ("tool_started", "a"), ("tool_started", "b"))
    decision = recover_turn(messages, records, idempotent=idempotent)
    assert [m.tool_call_id for m in decision.unknown] == ["b"]  # started, not idempotent: outcome unknown
    assert decision.unknown[0].is_error and decision.unknown[0].metadata[OUTCOME_UNKNOWN_KEY]
    assert [c.id for c in decision.rerun] == ["a", "c"]  # idempotent; never started
    assert (decision.turn_id, decision.prompt_id, decision.steps) == ("t1", "p1", 1)
    assert decision.resume_from == "tool_started"


def test_logged_results_are_reused_and_a_finished_step_goes_on_to_the_next_request() -> None:
    messages = [user("go"), answer(("a", "write_file")), tool_result("a", "write_file", "done")]
    decision = recover_turn(messages, steps(("request", ""), ("tool_started", "a")), idempotent=idempotent)
    assert decision.unknown == () and decision.rerun == ()
    assert decision.resume_from == "tool_result"


def test_a_request_whose_answer_was_not_logged_is_made_again() -> None:
    decision = recover_turn([user("go")], steps(("request", "")), idempotent=idempotent)
    assert (decision.resume_from, decision.rerun, decision.unknown) == ("request", (), ())
    assert recover_turn([user("go")], steps(), idempotent=idempotent).resume_from == "prompt"
    compacting = recover_turn([user("go")], steps(("request", ""), ("compaction", "")), idempotent=idempotent)
    assert compacting.resume_from == "compaction"


def test_an_answer_whose_calls_never_started_runs_them_all() -> None:
    messages = [user("go"), answer(("a", "write_file"), ("b", "shell"))]
    decision = recover_turn(messages, steps(("request", "")), idempotent=idempotent)
    assert [c.id for c in decision.rerun] == ["a", "b"] and decision.resume_from == "answer"


def test_calls_of_older_answers_and_the_clients_calls_are_not_its_to_run() -> None:
    messages = [user("go"), answer(("old", "write_file")), user("again"), answer(("x", "write_file"))]
    decision = recover_turn(
        messages, steps(("tool_started", "x")), idempotent=idempotent, awaited=frozenset({"x"})
    )
    assert decision.rerun == () and decision.unknown == ()


def test_a_log_without_step_records_is_taken_up_too() -> None:
    decision = recover_turn([user("go"), answer(("a", "write_file"))], [], idempotent=idempotent)
    assert (decision.turn_id, decision.prompt_id, decision.steps) == (None, None, 0)
    assert [c.id for c in decision.rerun] == ["a"]  # no record says it started: it never did


def test_turns_taken_up_are_counted() -> None:
    records = [*steps(("request", "")), step_record("t1", "resumed"), step_record("t1", "resumed")]
    assert recover_turn([user("go")], records, idempotent=idempotent).resumed == 2


def test_the_turns_prompt_is_its_newest_user_message() -> None:
    messages = [user("first"), Message(role="assistant", parts=(TextPart("hi"),)), user("second")]
    prompt = turn_prompt(messages)
    assert prompt is not None and prompt.text == "second"
    assert turn_prompt([]) is None


def test_the_tree_keeps_the_newest_turns_step_records_through_a_replay() -> None:
    tree = SessionTree(new_header("s", model="m"))
    tree.append(user("go"))
    for record in [step_record("t0", "turn"), step_record("t0", "request"), step_record("t1", "turn")]:
        tree.apply(record)
    tree.apply(step_record("t1", "tool_started", call_id="a", name="write_file"))
    assert [(s.turn_id, s.kind) for s in tree.turn_steps] == [("t1", "turn"), ("t1", "tool_started")]
    replayed = SessionTree.from_entries(decode_entry(encode_entry(e)) for e in tree.entries())
    assert replayed.turn_steps == tree.turn_steps
    assert replayed.turn_steps[-1].process == tree.turn_steps[-1].process != ""
    assert replayed.leaf_id == tree.leaf_id  # a step record is no node: it moves no leaf
