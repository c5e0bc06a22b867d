"""Sub-agents (design §3.10), end to end: a parent session delegates to child sessions through its ``agent`` tool.

The parent's model is scripted to call the tool; each child runs its own scripted model through the local
provider, with its own log, usage and compaction.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

import runtime.store.sessions as sessions_module
from runtime import Runtime
from runtime.config import Config
from runtime.provider.script import ToolCallSpec, Turn
from tests.conftest import Recorder, wait_until

_names = itertools.count(1)


def delegate(profile: str, task: str, id: str | None = None) -> ToolCallSpec:
    return ToolCallSpec(name="agent", arguments=json.dumps({"profile": profile, "task": task}), id=id)


def child_model(provider: Any, *turns: Turn, loop: bool = False) -> str:
    name = f"child-{next(_names)}"
    provider.add_script(name, list(turns), loop=loop)
    return f"openai/{name}"


def profiles(model: str, **extra: Any) -> dict[str, Any]:
    return {"researcher": {"description": "reads and reports", "model": model, "tools": "none", **extra}}


def tool_results(rt: Any, sid: str) -> list[Any]:
    return [m for m in rt.messages(sid) if m.role == "tool"]


def test_a_child_answers_and_the_link_is_kept_everywhere(
    rt: Any, provider: Any, session: Any, script: Any, recorder: Recorder
) -> None:
    """The parent's tool result is the child's final answer; the child is a real session whose log,
    events, listing and usage all name its parent."""
    child = child_model(provider, Turn(text="The answer is 42."))
    parent_model = script(
        Turn(tool_calls=(delegate("researcher", "Find the answer.", "call_d1"),)), Turn(text="It is 42.")
    )
    parent = session(parent_model, tools=None, agents=profiles(child))
    events = rt.subscribe(parent, include_children=True)
    result = rt.prompt(parent, "What is the answer?").result(timeout=60)
    assert result.status == "ok" and result.text == "It is 42."

    (delegation,) = tool_results(rt, parent)
    assert delegation.text == "The answer is 42." and not delegation.is_error
    kid = delegation.metadata["child_session_id"]
    assert delegation.metadata["child_usage"]["input_tokens"] > 0
    assert [m.text for m in rt.messages(kid)] == ["Find the answer.", "The answer is 42."]
    assert rt.children(parent) == [kid]

    seen = events.drain()  # every event of the turn was queued before its handle resolved
    mine = [e for e in seen if e.session_id == kid]
    assert mine and all(e.parent_session_id == parent and e.parent_call_id == "call_d1" for e in mine)
    assert {e.session_id for e in seen} == {parent, kid}
    assert [e.seq for e in mine] == sorted(e.seq for e in mine)

    info = {i.id: i for i in rt.list_sessions()}
    assert info[kid].parent_id == parent and info[parent].parent_id is None
    report = rt.usage(parent, include_children=True)
    assert report.children[kid].input_tokens > 0
    assert report.total.input_tokens == report.own.input_tokens + report.children[kid].input_tokens
    # the child can be prompted directly
    provider.add_script(child.removeprefix("openai/"), [Turn(text="Still 42.")])
    assert rt.prompt(kid, "Sure?").result(timeout=30).text == "Still 42."


def test_three_children_run_in_parallel(rt: Any, provider: Any, session: Any, script: Any) -> None:
    """Three delegations in one step run at once: the step takes about one child's time, not three."""
    child = child_model(provider, Turn(text="done", latency=1.0), loop=True)
    calls = tuple(delegate("researcher", f"part {i}") for i in range(3))
    parent = session(
        script(Turn(tool_calls=calls), Turn(text="all done")), tools=None, agents=profiles(child)
    )
    started = time.monotonic()
    assert rt.prompt(parent, "go").result(timeout=60).text == "all done"
    assert time.monotonic() - started < 2.5
    results = tool_results(rt, parent)
    assert [r.text for r in results] == ["done"] * 3
    assert len({r.metadata["child_session_id"] for r in results}) == 3


def test_a_failing_child_is_an_error_result_not_a_failed_parent(
    rt: Any, provider: Any, session: Any, script: Any
) -> None:
    """A child whose provider refuses it gives the parent an error result; the parent's turn goes on."""
    child = child_model(provider, Turn(fault={"kind": "auth"}))  # type: ignore[arg-type]
    parent_model = script(
        Turn(tool_calls=(delegate("researcher", "try"),)), Turn(text="it failed, moving on")
    )
    parent = session(parent_model, tools=None, agents=profiles(child))
    assert rt.prompt(parent, "go").result(timeout=60).text == "it failed, moving on"
    (delegation,) = tool_results(rt, parent)
    assert delegation.is_error and "did not finish" in delegation.text


def test_aborting_the_parent_aborts_its_running_children(
    rt: Any, provider: Any, session: Any, script: Any, recorder: Recorder
) -> None:
    """abort(parent) while a child works: the child's turn is aborted too, and nothing waits forever."""
    child = child_model(provider, Turn(text="slow", latency=5.0))
    parent = session(
        script(Turn(tool_calls=(delegate("researcher", "take your time"),))),
        tools=None,
        agents=profiles(child),
    )
    handle = rt.prompt(parent, "go")
    recorder.wait_for(lambda evs: any(e.type == "agent_start" and e.session_id != parent for e in evs), 20)
    (kid,) = rt.children(parent)
    assert rt.abort(parent).result(timeout=10)
    assert handle.result(timeout=10).status == "aborted"
    recorder.wait_for(lambda evs: any(e.type == "agent_abort" and e.session_id == kid for e in evs), 20)


def test_limits_are_error_results_to_the_model(rt: Any, provider: Any, session: Any, script: Any) -> None:
    """Over subagents.max_children_per_session, a delegation is an error result that says why; a child
    whose profile does not delegate has no agent tool (depth 1)."""
    child = child_model(provider, Turn(text="ok", latency=0.5), loop=True)
    calls = (delegate("researcher", "one"), delegate("researcher", "two"))
    parent = session(script(Turn(tool_calls=calls), Turn(text="fine")), tools=None, agents=profiles(child))
    rt.config = rt.config.with_overrides({"subagents.max_children_per_session": 1})
    try:
        assert rt.prompt(parent, "go").result(timeout=60).text == "fine"
    finally:
        rt.config = rt.config.with_overrides({"subagents.max_children_per_session": 4})
    results = tool_results(rt, parent)
    assert sorted(r.is_error for r in results) == [False, True]
    refused = next(r for r in results if r.is_error)
    assert "limit reached" in refused.text and "max_children_per_session" in refused.text
    assert len(rt.children(parent)) == 1
    child_request = next(r for r in provider.request_log if r.model == child.removeprefix("openai/"))
    assert not child_request.body.get("tools")  # the child cannot delegate


def test_the_parents_spend_guard_counts_its_childrens_tokens(
    rt: Any, provider: Any, session: Any, script: Any
) -> None:
    """A parent turn whose child spent most of its input budget stops before its next request."""
    child = child_model(provider, Turn(text="a long report " * 200))
    parent_model = script(Turn(tool_calls=(delegate("researcher", "x " * 4_500),)), Turn(text="never sent"))
    parent = session(
        parent_model, tools=None, agents=profiles(child), config={"agent.max_turn_input_tokens": 5_000}
    )
    result = rt.prompt(parent, "go").result(timeout=60)
    assert result.status == "error" and "budget" in (result.error or "")
    (delegation,) = tool_results(rt, parent)
    assert 4_000 < delegation.metadata["child_usage"]["input_tokens"] < 5_000, delegation.text
    assert result.usage.input_tokens < 1_000  # the parent's own requests alone were far under it


def test_after_a_restart_the_parent_knows_its_children(
    provider: Any, sessions_dir: Path, workspace: Path
) -> None:
    """The link is in the logs: a new runtime resumes the parent, lists its children, and the child can
    be resumed and prompted directly, its events carrying its parent again."""
    child = child_model(provider, Turn(text="first"), Turn(text="second"))
    parent_model = f"openai/parent-{next(_names)}"
    provider.add_script(
        parent_model.removeprefix("openai/"),
        [Turn(tool_calls=(delegate("researcher", "work", "call_r"),)), Turn(text="done")],
    )
    fast = Config().with_overrides({"retry.base_delay": 0.01})
    with Runtime(fast, sessions_dir=sessions_dir) as rt:
        parent = rt.start_session(
            model=parent_model, api_base=provider.url, api_key="sk-local", agents=profiles(child)
        )
        assert rt.prompt(parent, "go").result(timeout=60).text == "done"
        (kid,) = rt.children(parent)
    with Runtime(fast, sessions_dir=sessions_dir) as rt:
        rt.resume_session(parent, api_base=provider.url, api_key="sk-local")

        def unread(path: Any) -> bytes:
            raise AssertionError(f"read {path}")

        with pytest.MonkeyPatch.context() as patch:  # issue 47: found in the index, no log is read
            patch.setattr(sessions_module, "read_file", unread)
            assert rt.children(parent) == [kid]
        rt.resume_session(kid, api_base=provider.url, api_key="sk-local")
        events = rt.subscribe(parent, include_children=True)
        assert rt.prompt(kid, "again").result(timeout=30).text == "second"
        # The parent's own events (an idle parent may report something meanwhile) carry no parent.
        kids = [e for e in events.drain() if e.session_id == kid]
        assert kids and {(e.parent_session_id, e.parent_call_id) for e in kids} == {(parent, "call_r")}
        assert any(t.name == "agent" for t in rt._session(parent).spec.tools.tools())


def test_after_a_restart_the_usage_with_children_is_what_it_was(provider: Any, sessions_dir: Path) -> None:
    """design §4.1: ``usage(include_children=True)`` in a new runtime resumes each child and asks it at once;
    before, a session just resumed answered zeros (its tracker answered before the agent's recovery restored
    it), so the report lost the parent's and the children's spend."""
    child = child_model(provider, Turn(text="first"))
    parent_model = f"openai/parent-{next(_names)}"
    provider.add_script(
        parent_model.removeprefix("openai/"),
        [Turn(tool_calls=(delegate("researcher", "work", "call_u"),)), Turn(text="done")],
    )
    with Runtime(Config(), sessions_dir=sessions_dir) as rt:
        parent = rt.start_session(
            model=parent_model, api_base=provider.url, api_key="sk-local", agents=profiles(child)
        )
        assert rt.prompt(parent, "go").result(timeout=60).text == "done"
        (kid,) = rt.children(parent)
        live = rt.usage(parent, include_children=True)
    assert live.own.input_tokens > 0 and live.children[kid].input_tokens > 0
    with Runtime(Config(), sessions_dir=sessions_dir) as rt:
        rt.resume_session(parent, api_base=provider.url, api_key="sk-local")
        report = rt.usage(parent, include_children=True)
    assert report.own == live.own
    assert report.children == live.children


def test_a_child_compacts_on_its_own_and_survives_a_crash(
    rt: Any, provider: Any, session: Any, script: Any, recorder: Recorder, workspace: Path
) -> None:
    """A child with a small window compacts its own context while the parent's is untouched; a crash of
    the child's agent mid-turn is recovered inside the child, and the parent still gets the answer."""
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text("".join(f"line {i} of {name}: some detail here\n" for i in range(120)))
    read = [ToolCallSpec(name="read_file", arguments=json.dumps({"path": p})) for p in ("a.txt", "b.txt")]
    child = child_model(
        provider,
        Turn(tool_calls=(read[0],)),
        Turn(tool_calls=(read[1],), latency=1.0),
        Turn(tool_calls=(read[1],)),  # after the crash, the successor asks again
        Turn(text="both files read"),
    )
    small = {
        "models.context_windows": {child: 5_000, "openai/summarizer": 32_000},
        "compaction.summarizer_model": "openai/summarizer",
    }
    agents = profiles(child, tools="builtin", config=small)
    parent = session(
        script(Turn(tool_calls=(delegate("researcher", "read a.txt then b.txt"),)), Turn(text="ok")),
        agents=agents,
    )
    handle = rt.prompt(parent, "go")
    recorder.wait_for(
        lambda evs: sum(e.type == "request_start" and e.session_id != parent for e in evs) >= 2, 30
    )
    (kid,) = rt.children(parent)
    rt._session(kid).refs.agent.tell(object())  # the child's agent crashes while its model streams
    assert handle.result(timeout=60).text == "ok"
    (delegation,) = tool_results(rt, parent)
    assert delegation.text == "both files read"
    recorder.wait_for(lambda evs: any(e.type == "agent_recovered" and e.session_id == kid for e in evs), 20)
    assert recorder.of("agent_recovered", kid)[0].continued
    assert recorder.of("compaction_end", kid) and not recorder.of("compaction_start", parent)
    assert not recorder.of("actor_restarted", parent)


def test_a_child_recovers_from_an_overflow_on_its_own(
    rt: Any, provider: Any, session: Any, script: Any, recorder: Recorder, workspace: Path
) -> None:
    """A child whose provider's real window is smaller than it was told overflows, compacts in an
    emergency and retries on its own; the parent only sees the answer."""
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text("".join(f"line {i} of {name}: some detail here\n" for i in range(150)))
    read = [ToolCallSpec(name="read_file", arguments=json.dumps({"path": p})) for p in ("a.txt", "b.txt")]
    turns = iter([Turn(tool_calls=(read[0],)), Turn(tool_calls=(read[1],)), Turn(text="read both")])
    name = f"child-{next(_names)}"
    provider.add_responder(name, lambda messages, tools: next(turns), context_window=3_500)
    child = f"openai/{name}"
    told = {"models.context_windows": {child: 32_000, "openai/summarizer": 32_000}}
    agents = profiles(
        child, tools="builtin", config={**told, "compaction.summarizer_model": "openai/summarizer"}
    )
    parent = session(
        script(Turn(tool_calls=(delegate("researcher", "read a.txt then b.txt"),)), Turn(text="ok")),
        agents=agents,
    )
    assert rt.prompt(parent, "go").result(timeout=60).text == "ok"
    (delegation,) = tool_results(rt, parent)
    assert delegation.text == "read both"
    kid = delegation.metadata["child_session_id"]
    recorder.wait_for(lambda evs: any(e.type == "compaction_end" and e.session_id == kid for e in evs), 20)
    assert [e.trigger for e in recorder.of("compaction_start", kid)] == ["overflow"]
    assert not recorder.of("compaction_start", parent) and not recorder.of("error", parent)


def test_a_parent_taken_up_after_a_crash_gets_the_answer_of_its_childs_taken_up_turn(
    sessions_dir: Path, provider: Any, script: Any, workspace: Path
) -> None:
    """The process died while a child worked for its parent (both logs and the journal of open turns as it
    left them, copied mid-turn). Resumed, the parent's turn runs the cut-off delegation again, which goes
    on with the same child: the child's own turn is taken up and its answer is the parent's tool result
    (design §3.12). No second child is started, and the child's model is asked once more, not twice."""
    child = child_model(provider, Turn(text="never delivered", latency=30), Turn(text="The answer is 42."))
    parent_model = script(  # (its answer twice: the first process, stopping, may still ask for it)
        Turn(tool_calls=(delegate("researcher", "Find the answer.", "call_x1"),)),
        Turn(text="It is 42."),
        Turn(text="It is 42."),
    )
    name = child.removeprefix("openai/")
    endpoint = {"api_base": provider.url, "api_key": "sk-local"}
    with Runtime(sessions_dir=sessions_dir) as rt:
        parent = rt.start_session(model=parent_model, workspace=workspace, agents=profiles(child), **endpoint)
        prompt_id = rt.prompt(parent, "What is the answer?").id
        wait_until(lambda: provider.remaining_turns(name) == 1, "the child never asked its model")
        rt.flush()
        (kid,) = rt.children(parent)
        saved = {p: p.read_bytes() for p in sessions_dir.rglob("*.jsonl") if "index" not in p.parts}
    for path, data in saved.items():  # as the process that died left them (its journal as a dead one's)
        path.write_bytes(data)

    with Runtime(sessions_dir=sessions_dir) as rt:
        assert rt.interrupted_sessions() == sorted([parent, kid])
        rt.resume_session(parent, **endpoint)
        handle = rt.resumed_turn(parent)
        assert handle is not None and handle.id == prompt_id
        result = handle.result(timeout=60)
        assert result.status == "ok" and result.text == "It is 42.", result.error
        (delegation,) = tool_results(rt, parent)
        assert delegation.text == "The answer is 42." and not delegation.is_error
        assert delegation.metadata["child_session_id"] == kid
        assert rt.children(parent) == [kid]  # gone on with, not started again
        assert provider.remaining_turns(name) == 0
        assert [m.text for m in rt.messages(kid)] == ["Find the answer.", "The answer is 42."]
        assert rt.interrupted_sessions() == []


def test_a_child_that_answered_before_the_crash_gives_its_answer_from_its_log(
    sessions_dir: Path, provider: Any, script: Any, workspace: Path
) -> None:
    """The child's answer was in its log but not yet in its parent's when the process died: the parent's
    turn, taken up, gets that answer as the call's result without asking the child's model again."""
    child = child_model(provider, Turn(text="Found it: 7.", latency=1.5))
    parent_model = script(  # (its answer twice: once before the copy of its log is put back, once after)
        Turn(tool_calls=(delegate("researcher", "Find the number.", "call_y1"),)),
        Turn(text="It is 7."),
        Turn(text="It is 7."),
    )
    name = child.removeprefix("openai/")
    endpoint = {"api_base": provider.url, "api_key": "sk-local"}
    with Runtime(sessions_dir=sessions_dir) as rt:
        parent = rt.start_session(model=parent_model, workspace=workspace, agents=profiles(child), **endpoint)
        handle = rt.prompt(parent, "Which number?")
        wait_until(lambda: provider.remaining_turns(name) == 0, "the child never asked its model")
        rt.flush()
        parent_log = next(sessions_dir.rglob(f"{parent}.jsonl"))
        mid_turn = parent_log.read_bytes()  # the parent waits for its child
        (journal,) = (sessions_dir / "turns").iterdir()
        journal_then = journal.read_bytes()
        assert handle.result(timeout=30).status == "ok"  # (the child's log then holds its answer)
    parent_log.write_bytes(mid_turn)
    (sessions_dir / "turns" / "1-dead.jsonl").write_bytes(journal_then)

    with Runtime(sessions_dir=sessions_dir) as rt:
        rt.resume_session(parent, **endpoint)
        resumed = rt.resumed_turn(parent)
        assert resumed is not None
        assert resumed.result(timeout=60).text == "It is 7."
        (delegation,) = tool_results(rt, parent)
        assert delegation.text == "Found it: 7." and not delegation.is_error
        assert len(rt.children(parent)) == 1


def test_a_crash_of_the_parents_agent_mid_delegation_goes_on_with_the_same_child(
    rt: Any, provider: Any, session: Any, script: Any, recorder: Recorder
) -> None:
    """The parent's agent crashes while its child works: its successor takes the turn up and runs the
    delegation again, which goes on with the same child (its answer is the tool result), not a new one."""
    child = child_model(provider, Turn(text="child answer", latency=1.5), Turn(text="child answer"))
    parent = session(
        script(Turn(tool_calls=(delegate("researcher", "Work on it."),)), Turn(text="ok"), Turn(text="ok")),
        tools=None,
        agents=profiles(child),
    )
    handle = rt.prompt(parent, "go")
    recorder.wait_for(lambda evs: any(e.type == "request_start" and e.session_id != parent for e in evs), 30)
    rt._session(parent).refs.agent.tell(object())  # the parent's agent crashes while its child works
    result = handle.result(timeout=60)
    assert result.status == "ok" and result.text == "ok", result.error
    (delegation,) = tool_results(rt, parent)
    assert delegation.text == "child answer" and not delegation.is_error
    assert len(rt.children(parent)) == 1
    recorder.wait_for(
        lambda evs: any(e.type == "agent_recovered" and e.session_id == parent for e in evs), 20
    )
