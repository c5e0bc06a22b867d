"""The public Runtime API (design §1.5): sessions' lifecycle, resume, branch, models, hibernation, asyncio."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.host import RuntimeStopped, SessionNotFound
from runtime.ids import InvalidSessionId
from runtime.provider.script import Turn
from tests.conftest import Recorder


def test_resume_after_a_restart_keeps_history_and_event_numbering(
    sessions_dir: Path, provider: Any, script: Any
) -> None:
    model = script(Turn(text="first answer"), Turn(text="second answer"))
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(
            "keep-me", model=model, api_base=provider.url, api_key="sk-local", system_prompt="Be brief."
        )
        assert rt.prompt(sid, "one").result(timeout=30).text == "first answer"
        last_seq = rt.bus.last_seq(sid)
    with Runtime(sessions_dir=sessions_dir) as rt:
        assert [i.id for i in rt.list_sessions()] == ["keep-me"]
        rec = Recorder()
        rt.subscribe(sid, callback=rec)
        rt.resume_session(sid, api_key="sk-local")
        assert [m.text for m in rt.messages(sid)] == ["one", "first answer"]
        assert rt.prompt(sid, "two").result(timeout=30).text == "second answer"
        rec.wait_type("agent_end")
        assert min(e.seq for e in rec.events) > last_seq  # the transcript's numbering goes on
        assert rt._session(sid).spec.system_prompt == "Be brief."


def test_a_resumed_session_goes_on_with_the_model_it_was_switched_to(
    sessions_dir: Path, provider: Any, script: Any
) -> None:
    first = script(Turn(text="from the first model"))
    second = script(Turn(text="from the second model"), Turn(text="the second model again"))
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session("switched", model=first, api_base=provider.url, api_key="sk-local")
        rt.set_model(sid, second)
        assert rt.prompt(sid, "one").result(timeout=30).text == "from the second model"
    with Runtime(sessions_dir=sessions_dir) as rt:
        rt.resume_session(sid, api_key="sk-local")
        assert rt.prompt(sid, "two").result(timeout=30).text == "the second model again"
        assert rt._session(sid).spec.model == second


def test_unknown_and_invalid_sessions_are_clear_errors(rt: Any) -> None:
    with pytest.raises(SessionNotFound, match="no running session"):
        rt.prompt("nobody", "hi")
    with pytest.raises(SessionNotFound, match="no stored session"):
        rt.resume_session("nobody")
    with pytest.raises(InvalidSessionId):
        rt.start_session("../escape", model="x")
    with pytest.raises(InvalidSessionId):
        rt.prompt("a/b", "hi")
    with pytest.raises(ValueError, match="unknown event types"):
        rt.subscribe("*", {"no_such_event"})


def test_a_session_id_cannot_be_started_twice(rt: Any) -> None:
    rt.start_session("dup", model="openai/x")
    with pytest.raises(ValueError, match="already exists"):
        rt.start_session("dup", model="openai/x")


def test_stopped_runtime_refuses_work(sessions_dir: Path) -> None:
    rt = Runtime(sessions_dir=sessions_dir)
    with pytest.raises(RuntimeStopped):
        rt.start_session(model="x")


def test_delete_removes_every_file(rt: Any, provider: Any, script: Any, sessions_dir: Path) -> None:
    sid = rt.start_session("gone", model=script(Turn(text="x")), api_base=provider.url, api_key="sk-local")
    assert rt.prompt(sid, "hi").result(timeout=30).status == "ok"
    rt.delete_session(sid)
    assert not any(p.name.startswith("gone") for p in sessions_dir.iterdir())
    assert rt.list_sessions() == []
    with pytest.raises(SessionNotFound):
        rt.delete_session(sid)


def test_branch_continues_from_an_earlier_message(rt: Any, provider: Any, script: Any) -> None:
    model = script(Turn(text="A1"), Turn(text="A2"), Turn(text="B2"))
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
    rt.prompt(sid, "q1").result(timeout=30)
    rt.prompt(sid, "q2").result(timeout=30)
    first_answer = rt.messages(sid)[1]
    rt.branch(sid, first_answer.id)
    assert rt.prompt(sid, "q2 again").result(timeout=30).text == "B2"
    assert [m.text for m in rt.messages(sid)] == ["q1", "A1", "q2 again", "B2"]
    # The abandoned branch is still in the log.
    tree = rt.services.directory.log_path(sid).read_text()
    assert '"A2"' in tree


def test_smaller_model_window_compacts_on_the_next_turn(
    rt: Any, recorder: Recorder, provider: Any, script: Any
) -> None:
    answer = " ".join(f"w{i}" for i in range(300))
    model = script(*[Turn(text=answer) for _ in range(6)])
    small = "openai/small-model"
    config = {
        "models.context_windows": {small: 2_000, "openai/summarizer": 32_000},
        "compaction.reserve_tokens": 200,
        "compaction.summarizer_model": "openai/summarizer",
    }
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local", config=config)
    for i in range(4):
        assert rt.prompt(sid, f"q{i}").result(timeout=30).status == "ok"
    assert not recorder.of("compaction_start", sid)
    provider.add_script("small-model", [Turn(text="small answer")])
    assert rt.set_model(sid, small) == 2_000
    assert rt.prompt(sid, "after the switch").result(timeout=30).text == "small answer"
    recorder.wait_type("compaction_end")
    assert recorder.of("model_changed", sid)[0].context_window == 2_000
    assert rt.context_stats(sid).window == 2_000


def test_hibernated_session_wakes_on_the_next_prompt(
    rt: Any, recorder: Recorder, provider: Any, script: Any
) -> None:
    model = script(Turn(text="before"), Turn(text="after"))
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
    assert rt.prompt(sid, "one").result(timeout=30).text == "before"
    assert rt.hibernate(sid) is True
    assert rt._session(sid).running is False
    assert rt.prompt(sid, "two").result(timeout=30).text == "after"
    assert [m.text for m in rt.messages(sid)] == ["one", "before", "two", "after"]
    recorder.wait_type("agent_recovered")
    assert recorder.of("session_hibernated", sid)


def test_idle_sessions_hibernate_by_themselves(sessions_dir: Path, provider: Any, script: Any) -> None:
    config = Config().with_overrides({"persistence.hibernate_after": 0.2})
    model = script(Turn(text="hello"))
    with Runtime(config, sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
        rt.prompt(sid, "hi").result(timeout=30)
        deadline = time.monotonic() + 10
        while rt._session(sid).running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt._session(sid).running is False


def test_a_session_is_written_by_one_runtime_at_a_time(
    sessions_dir: Path, provider: Any, script: Any
) -> None:
    from runtime.store.sessions import SessionLockedError

    model = script(Turn(text="x"), Turn(text="y"))
    with Runtime(sessions_dir=sessions_dir) as first, Runtime(sessions_dir=sessions_dir) as second:
        sid = first.start_session("shared", model=model, api_base=provider.url, api_key="sk-local")
        first.prompt(sid, "hi").result(timeout=30)  # the first runtime now holds the lock
        with pytest.raises(SessionLockedError, match="shared"):
            second.resume_session(sid)


def test_once_stop_session_returns_another_process_may_open_the_session(
    sessions_dir: Path, provider: Any, script: Any
) -> None:
    """A stopped store lets go of its lock from the writer thread, after its last writes; ``stop_session``
    waits for that, so a session moved to another process (a Ray shard) opens there at once."""
    import threading

    from runtime.store.sessions import SessionDirectory

    model = script(Turn(text="x"))
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session("moving", model=model, api_base=provider.url, api_key="sk-local")
        assert rt.prompt(sid, "hi").result(timeout=30).status == "ok"
        busy = threading.Event()  # the writer thread is busy with other sessions' writes for a moment
        rt.services.writer.call(sessions_dir / "elsewhere", lambda _path: busy.wait(10))
        threading.Timer(0.5, busy.set).start()
        rt.stop_session(sid)
        # what another process does to open it: take its lock
        SessionDirectory(sessions_dir).lock(sid).release()


def test_the_api_from_asyncio(sessions_dir: Path, provider: Any, script: Any) -> None:
    # (the provider takes 50 ms: a warm process may finish a turn in under the ticker's 5 ms)
    model = script(Turn(text="async answer", latency=0.05))

    async def main() -> tuple[str, int]:
        async with Runtime(sessions_dir=sessions_dir) as rt:
            sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.005)
                    ticks += 1

            task = asyncio.create_task(ticker())
            result = await rt.prompt(sid, "hi")  # awaiting never blocks the loop
            stats = await rt.acontext_stats(sid)
            task.cancel()
            assert stats.total > 0
            return result.text, ticks

    text, ticks = asyncio.run(main())
    assert text == "async answer" and ticks > 0


def test_every_blocking_call_has_an_async_twin_that_leaves_the_loop_free(
    sessions_dir: Path, provider: Any, script: Any
) -> None:
    model = script(Turn(text="A1"), Turn(text="A2"), Turn(text="B2"))
    provider.add_script("other-model", [])
    other = "openai/other-model"

    async def main() -> dict[str, Any]:
        async with Runtime(sessions_dir=sessions_dir) as rt:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.002)
                    ticks += 1

            task = asyncio.create_task(ticker())
            out: dict[str, Any] = {}
            sid = await rt.astart_session(
                "async-one",
                model=model,
                api_base=provider.url,
                api_key="sk-local",
                config={"models.context_windows": {other: 50_000}},
            )
            for text in ("q1", "q2"):
                await rt.prompt(sid, text)
            first_answer = (await rt.amessages(sid))[1]
            await rt.abranch(sid, first_answer.id)
            out["branched"] = [m.text for m in await rt.amessages(sid)]
            out["answer"] = (await rt.prompt(sid, "q2 again")).text
            out["usage"] = await rt.ausage(sid)
            out["window"] = await rt.aset_model(sid, other)
            out["listed"] = [i.id for i in await rt.alist_sessions()]
            out["hibernated"] = await rt.ahibernate(sid)
            await rt.astop_session(sid)
            out["hosted"] = rt.hosted_sessions()
            assert await rt.aresume_session(sid, api_key="sk-local") == sid
            out["resumed"] = [m.text for m in await rt.amessages(sid)]
            await rt.adelete_session(sid)
            out["after_delete"] = await rt.alist_sessions()
            with pytest.raises(SessionNotFound):
                await rt.ausage(sid)
            ticks_before = ticks
            await asyncio.sleep(0.05)
            task.cancel()
            out["ticking"] = ticks > ticks_before > 0
            return out

    out = asyncio.run(main())
    assert out["branched"] == ["q1", "A1"] and out["answer"] == "B2"
    assert out["usage"].input_tokens > 0 and out["window"] == 50_000
    assert out["listed"] == ["async-one"] and out["hibernated"] is True and out["hosted"] == []
    assert out["resumed"] == ["q1", "A1", "q2 again", "B2"]
    assert out["after_delete"] == [] and out["ticking"]


def test_async_subscription_receives_events_in_order(sessions_dir: Path, provider: Any, script: Any) -> None:
    model = script(Turn(text="streamed " * 20))

    async def main() -> list[Any]:
        async with Runtime(sessions_dir=sessions_dir) as rt:
            sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
            sub = rt.subscribe(sid)
            handle = rt.prompt(sid, "go")
            seen = []
            async for event in sub:
                seen.append(event)
                if event.type == "agent_end":
                    break
            await handle
            sub.close()
            return seen

    seen = asyncio.run(main())
    seqs = [e.seq for e in seen]
    assert seqs == sorted(seqs) and seen[-1].type == "agent_end"
    assert "".join(e.delta for e in seen if e.type == "text_delta").strip() == ("streamed " * 20).strip()


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
def test_a_base_exception_in_one_session_never_stops_another(
    rt: Any, recorder: Recorder, provider: Any, script: Any, exc: type[BaseException]
) -> None:
    victim = rt.start_session(model=script(Turn(text="back")), api_base=provider.url, api_key="k")
    bystander = rt.start_session(model=script(Turn(text="still here")), api_base=provider.url, api_key="k")
    refs = rt._session(victim).ensure_running()
    rt._session(bystander).ensure_running()
    agent = refs.agent._actor_weakref()  # inject the fault into this one actor instance only

    def explode(prompt: Any) -> None:
        raise exc("injected")

    agent._on_prompt = explode
    crashed = rt.prompt(victim, "boom").result(timeout=10)
    assert crashed.status == "error" and "crashed" in (crashed.error or "")
    recorder.wait_type("agent_recovered")
    assert rt.prompt(bystander, "hello").result(timeout=30).text == "still here"
    assert rt.prompt(victim, "again").result(timeout=30).text == "back"  # restarted, usable


EXIT_SCRIPT = """
import sys, tempfile
from runtime import Runtime, events as ev
rt = Runtime(sessions_dir=tempfile.mkdtemp()).start()
sid = rt.start_session(model="openai/gpt-4o-mini")
for _ in range(20_000):
    rt.bus.publish(ev.TextDelta(session_id=sid, turn_id="t", delta="word "))
rt.stop()
print("stopped", flush=True)
"""


@pytest.mark.slow  # two child processes that import litellm: seconds even on an idle machine
def test_a_program_that_stops_its_runtime_exits(tmp_path: Path) -> None:
    # litellm is imported in the background; a program that exits while that import is still going on
    # used to hang in interpreter shutdown about half the time (a frozen importing thread held a module
    # lock that a finalizer of litellm's then waited for).
    import subprocess
    import sys

    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            capture_output=True,
            text=True,
            timeout=120,  # a hang is forever; a start and stop take ~30 s on a loaded 2-CPU machine
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "stopped" in done.stdout
