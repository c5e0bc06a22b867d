"""Compaction end to end over the local provider (design §5): automatic, manual, modes, archiving, events."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from runtime import Runtime
from runtime.context.integrity import check_integrity
from runtime.context.prompts import TOOL_SUMMARIZER_SYSTEM, TOOL_SUMMARY_PREFIX
from runtime.messages import KIND_COMPACTION_SUMMARY, KIND_TOOL_OUTPUT_CLEARED, KIND_TOOL_SUMMARY
from runtime.provider.script import Fault, ToolCallSpec, Turn
from runtime.store.sessions import SessionDirectory
from tests.conftest import Recorder, wait_until
from tests.reliability.support import check_log

_names = itertools.count(1)
WINDOW = 4_000


def chatty_model(provider: Any, words: int = 180) -> str:
    """A looping script whose every answer is ~``words`` words: the context grows every turn."""
    name = f"chatty-{next(_names)}"
    text = " ".join(f"detail{i}" for i in range(words))
    provider.add_script(name, [Turn(text=f"Noted. {text}")], loop=True)
    return f"openai/{name}"


def small_window(model: str, **extra: Any) -> dict[str, Any]:
    """Per-session config: a 4,000-token window and a summarizer answered by the provider's policy."""
    config: dict[str, Any] = {
        "models.context_windows": {model: WINDOW, "openai/summarizer": 32_000},
        "compaction.reserve_tokens": 500,
        "compaction.summarizer_model": "openai/summarizer",
    }
    config.update(extra)
    return config


def summarizer_requests(provider: Any) -> list[Any]:
    return [r for r in provider.request_log if r.model == "summarizer"]


def test_long_session_compacts_automatically_and_keeps_answering(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider)
    sid = session(model, tools=None, config=small_window(model))
    provider.clear_log()
    prompts = [f"Step {i}: please record fact number {i} about the project." for i in range(16)]
    for text in prompts:
        result = rt.prompt(sid, text).result(timeout=60)
        assert result.status == "ok", result.error
    recorder.wait_type("agent_end", len(prompts))

    ends = recorder.of("compaction_end", sid)
    starts = recorder.of("compaction_start", sid)
    assert len(ends) >= 2, recorder.types(sid)
    assert len(starts) == len(ends) and not recorder.of("compaction_failed", sid)
    for start, end in zip(starts, ends, strict=True):
        assert start.seq < end.seq
        assert start.trigger == end.trigger == "threshold"
        assert end.tokens_after < end.tokens_before == start.tokens_before
        assert end.messages_after < end.messages_before == start.messages_before
        assert end.mode == "summarize" and end.summary_chars > 0
    # Every start is followed by its end before the next start: events are in order.
    kinds = [t for t in recorder.types(sid) if t.startswith("compaction_")]
    assert kinds == ["compaction_start", "compaction_end"] * len(ends)

    # The second summary is an update of the first.
    requests = summarizer_requests(provider)
    assert len(requests) >= 2
    assert "<previous-summary>" not in requests[0].messages[-1]["content"]
    assert "<previous-summary>" in requests[1].messages[-1]["content"]

    # The model sees the summary first; the log still holds every message ever added.
    context = rt.messages(sid, view="model")
    assert context[0].kind == KIND_COMPACTION_SUMMARY
    assert context[0].text.startswith("[Previous conversation summary]")
    history = rt.messages(sid)
    assert [m.text for m in history if m.role == "user" and m.kind is None] == prompts
    stats = rt.context_stats(sid)
    assert stats.total < stats.compaction_threshold
    # Summarizer input and output are saved beside the session (design §2.3).
    artifacts = sorted(p.name for p in rt.services.directory.artifacts_dir(sid).iterdir())
    assert len(artifacts) == 2 * len(ends)


def test_manual_compaction_with_focus_and_hard_reset(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=40)
    sid = session(model, tools=None, config=small_window(model, **{"compaction.mode": "hard_reset"}))
    for i in range(4):
        assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
    provider.clear_log()
    result = rt.compact(sid, instructions="the database migration").result(timeout=30)
    assert result.compacted, result.reason
    recorder.wait_type("compaction_end")
    (end,) = recorder.of("compaction_end", sid)
    assert end.trigger == "manual" and end.mode == "hard_reset" and end.messages_after == 1
    (request,) = summarizer_requests(provider)
    assert "the database migration" in request.messages[-1]["content"]
    (summary,) = rt.messages(sid, view="model")
    assert summary.kind == KIND_COMPACTION_SUMMARY
    assert rt.prompt(sid, "go on").result(timeout=30).status == "ok"


def test_artifacts_of_every_compaction_survive_hibernation_and_resume(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=60)
    sid = session(model, tools=None, config=small_window(model))
    folder = rt.services.directory.artifacts_dir(sid)

    def compact_once(note: str) -> None:
        for i in range(3):
            assert rt.prompt(sid, f"{note}, part {i}").result(timeout=30).status == "ok"
        result = rt.compact(sid, keep_recent_tokens=100).result(timeout=30)
        assert result.compacted, result.reason

    compact_once("first note")
    rt.services.writer.flush()
    first = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(first) == ["compaction-1-input.md", "compaction-1-summary.md"]
    # The session's actors stop (their state stays in the log) and start again on the next prompt: the
    # next compaction is number 2, not a second number 1 written over the first.
    assert rt.hibernate(sid)
    compact_once("second note")
    rt.stop_session(sid)
    rt.resume_session(sid, api_key="sk-local")  # keys live in memory only
    compact_once("third note")
    rt.services.writer.flush()
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"compaction-{n}-{kind}.md" for n in (1, 2, 3) for kind in ("input", "summary")]
    assert {name: (folder / name).read_bytes() for name in first} == first


def test_truncate_mode_needs_no_model(rt: Any, recorder: Recorder, provider: Any, session: Any) -> None:
    model = chatty_model(provider, words=60)
    sid = session(model, tools=None, config=small_window(model, **{"compaction.mode": "truncate"}))
    for i in range(6):
        assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
    provider.clear_log()
    result = rt.compact(sid, keep_recent_tokens=200).result(timeout=30)
    assert result.compacted
    assert not summarizer_requests(provider)
    summary = rt.messages(sid, view="model")[0]
    assert summary.text.startswith("[Previous conversation summary]") and "[Compacted" in summary.text


def test_summarizer_failure_falls_back_to_a_deterministic_summary(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=60)
    config = small_window(model, **{"compaction.summarizer_model": "openai/broken-summarizer"})
    config["models.context_windows"]["openai/broken-summarizer"] = 32_000
    provider.add_script("broken-summarizer", [Turn(text="")], loop=True)  # answers with nothing
    sid = session(model, tools=None, config=config)
    for i in range(5):
        assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
    result = rt.compact(sid, keep_recent_tokens=200).result(timeout=30)
    assert result.compacted
    recorder.wait_type("compaction_end")
    assert recorder.of("compaction_end", sid)[0].fallback is True
    assert "[Compacted" in rt.messages(sid, view="model")[0].text


def test_hard_reset_marks_a_session_dead_when_it_cannot_get_under_its_window(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=200)
    broken = "openai/dead-end-summarizer"
    provider.add_script("dead-end-summarizer", [Turn(text="")], loop=True)  # no summary, ever
    config = small_window(model, **{"compaction.mode": "hard_reset", "compaction.summarizer_model": broken})
    config["models.context_windows"][broken] = 32_000
    sid = session(model, tools=None, config=config)
    # Each turn adds ~300 tokens; every compaction fails and hard_reset has no fallback, so the context
    # grows past the 4,000-token window and the session dies, with a clear message.
    for i in range(30):
        result = rt.prompt(sid, f"note {i}").result(timeout=30)
        if result.status != "ok":
            break
    assert result.status == "error" and "The session is marked dead" in (result.error or "")
    recorder.wait_type("session_dead")
    (dead,) = recorder.of("session_dead", sid)
    assert "hard_reset" in dead.message and "start a new session" in dead.message

    # It stays dead: the next prompt is refused without a call to the model (and is still recorded) ...
    provider.clear_log()
    refused = rt.prompt(sid, "are you there?").result(timeout=30)
    assert refused.status == "error" and "marked dead" in (refused.error or "")
    assert not [r for r in provider.request_log if r.model != "dead-end-summarizer"]
    assert rt.messages(sid)[-1].text == "are you there?"
    # ... across a restart of the session, since the mark is in its log.
    rt.stop_session(sid)
    rt.resume_session(sid, api_key="sk-local")  # keys live in memory only
    assert "marked dead" in (rt.prompt(sid, "still there?").result(timeout=30).error or "")

    # A manual compaction that succeeds brings it back.
    provider.add_script("dead-end-summarizer", [Turn(text="## Goal\nKeep notes.")], loop=True)
    assert rt.compact(sid).result(timeout=30).compacted
    assert rt.prompt(sid, "and now?").result(timeout=30).status == "ok"


def test_a_summarizer_call_is_retried_and_each_retry_is_an_event(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=60)
    sid = session(model, tools=None, config=small_window(model))
    for i in range(4):
        assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
    provider.inject_fault("server_error")  # the summarizer's first request fails with a 500
    assert rt.compact(sid, keep_recent_tokens=100).result(timeout=30).compacted
    recorder.wait_type("compaction_end")
    (retry,) = recorder.of("provider_retry", sid)
    assert retry.turn_id is None and retry.attempt == 1 and retry.status_code == 500
    # (the provider logs a streamed request when its answer ends: order them by when they came in)
    received = sorted(provider.request_log, key=lambda r: r.received_at)
    assert [(r.model, r.status) for r in received][-2:] == [("summarizer", 500), ("summarizer", 200)]


def test_a_compaction_that_frees_nothing_is_discarded_and_never_loops(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=30)
    echo = "openai/echo-summarizer"
    # A "summary" as long as everything it replaces: no progress.
    provider.add_script("echo-summarizer", [Turn(text=" ".join(["blah"] * 2_500))], loop=True)
    config = small_window(model, **{"compaction.summarizer_model": echo, "compaction.fallback": False})
    config["models.context_windows"][echo] = 32_000
    sid = session(model, tools=None, config=config)
    for i in range(4):
        assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
    result = rt.compact(sid, keep_recent_tokens=100).result(timeout=30)
    # Nothing to reduce is said as such, not as a failure, with one figure from start to end.
    assert not result.compacted and result.skipped
    assert result.reason is not None and result.reason.startswith("nothing to compact")
    recorder.wait_type("compaction_skipped")
    (skipped,) = recorder.of("compaction_skipped", sid)
    (start,) = recorder.of("compaction_start", sid)
    assert skipped.reason == "no_progress" and skipped.trigger == "manual"
    assert skipped.tokens == start.tokens_before == result.tokens_before > 0
    assert f"from {start.tokens_before:,} to" in skipped.message
    assert not recorder.of("compaction_end", sid) and not recorder.of("compaction_failed", sid)
    assert rt.messages(sid, view="model")[0].kind != KIND_COMPACTION_SUMMARY


def test_what_a_discarded_compactions_summarizer_spent_is_counted_and_the_next_summary_logs_it(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    """design §4.1: a compaction whose summary is discarded (no progress) still paid for its summarizer call:
    the session's usage counts it at once, and the next summary written to the log carries it, so the
    totals rebuilt from the log count it too (the summary's usage = both compactions' summarizer calls)."""
    model = chatty_model(provider, words=30)
    echo = "openai/spend-summarizer"
    long, short = " ".join(["blah"] * 2_500), "## Goal\nNotes.\n\n## Progress\nNoted each note."
    provider.add_script("spend-summarizer", [Turn(text=long), Turn(text=short)])
    config = small_window(model, **{"compaction.summarizer_model": echo, "compaction.fallback": False})
    config["models.context_windows"][echo] = 32_000
    sid = session(model, tools=None, config=config)
    for i in range(4):
        assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
    before = rt.usage(sid)
    assert rt.compact(sid, keep_recent_tokens=100).result(timeout=30).skipped
    calls = [r for r in provider.request_log if r.model == "spend-summarizer" and r.outcome == "ok"]
    assert len(calls) == 1
    after = rt.usage(sid)
    assert after.input_tokens - before.input_tokens == calls[0].prompt_tokens > 0
    first_output = after.output_tokens - before.output_tokens
    assert first_output > 2_000  # the discarded summary's ~2,500 words
    # the next compaction succeeds; its summary carries both calls' spend, counted once in the totals
    assert rt.prompt(sid, "note 4").result(timeout=30).status == "ok"
    mid = rt.usage(sid)
    assert rt.compact(sid, keep_recent_tokens=100).result(timeout=30).compacted
    calls = [r for r in provider.request_log if r.model == "spend-summarizer" and r.outcome == "ok"]
    assert len(calls) == 2
    final = rt.usage(sid)
    assert final.input_tokens - mid.input_tokens == calls[1].prompt_tokens
    (summary,) = [m for m in rt.messages(sid, view="model") if m.kind == KIND_COMPACTION_SUMMARY]
    assert summary.usage is not None
    assert summary.usage.input_tokens == sum(c.prompt_tokens for c in calls)
    assert summary.usage.output_tokens == first_output + final.output_tokens - mid.output_tokens


def test_a_discarded_compactions_spend_is_in_the_log_and_counted_after_a_restart(
    sessions_dir: Path, provider: Any
) -> None:
    """design §4.1: what a compaction that wrote no summary paid for is recorded in the log (a metadata entry:
    no message, so the model's view and the leaf the no-progress guard keys on stay as they were), so the
    totals rebuilt from the log by a restarted runtime count it. Before, it lived in the compactor's memory
    until the next summary: the restart lost it. The next summary carries it and the entry is cleared."""
    model = chatty_model(provider, words=30)
    provider.add_script("restart-summarizer", [Turn(text=" ".join(["blah"] * 2_500))], loop=True)
    config = small_window(
        model, **{"compaction.summarizer_model": "openai/restart-summarizer", "compaction.fallback": False}
    )
    config["models.context_windows"]["openai/restart-summarizer"] = 32_000
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local", config=config)
        for i in range(4):
            assert rt.prompt(sid, f"note {i}").result(timeout=30).status == "ok"
        before, view = rt.usage(sid), [m.id for m in rt.messages(sid, view="model")]
        assert rt.compact(sid, keep_recent_tokens=100).result(timeout=30).skipped
        counted = rt.usage(sid)
        assert [m.id for m in rt.messages(sid, view="model")] == view  # no message added
    assert counted.output_tokens - before.output_tokens > 2_000  # the discarded summary's ~2,500 words
    with Runtime(sessions_dir=sessions_dir) as rt:
        rt.resume_session(sid, api_key="sk-local")
        assert rt.resumed_turn(sid) is None  # (its log is read: the totals are rebuilt from it)
        wait_until(lambda: rt.usage(sid).input_tokens >= counted.input_tokens, "the spend is not counted")
        restored = rt.usage(sid)
        assert (restored.input_tokens, restored.output_tokens) == (
            counted.input_tokens,
            counted.output_tokens,
        )
    directory = SessionDirectory(sessions_dir)
    tree = check_log(directory, sid).tree
    assert tree.unlogged_spend is not None
    assert tree.unlogged_spend.output_tokens == counted.output_tokens - before.output_tokens
    directory.close()


def test_a_manual_compaction_of_a_short_conversation_is_nothing_to_compact(
    rt: Any, recorder: Recorder, provider: Any, session: Any
) -> None:
    model = chatty_model(provider, words=5)
    sid = session(model, tools=None)
    assert rt.prompt(sid, "hi").result(timeout=30).status == "ok"
    result = rt.compact(sid).result(timeout=30)
    assert not result.compacted and result.skipped
    assert result.reason is not None and result.reason.startswith("nothing to compact")
    recorder.wait_type("compaction_skipped")
    (skipped,) = recorder.of("compaction_skipped", sid)
    assert skipped.reason in ("no_progress", "nothing_to_compact") and skipped.tokens > 0
    assert not recorder.of("compaction_failed", sid)
    assert rt.prompt(sid, "and now?").result(timeout=30).status == "ok"


def test_old_tool_results_are_archived_with_a_summary(
    rt: Any, recorder: Recorder, provider: Any, session: Any, workspace: Any
) -> None:
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    name = f"tools-{next(_names)}"
    read = ToolCallSpec(name="read_file", arguments='{"path": "notes.txt"}')
    provider.add_script(name, [Turn(tool_calls=(read,)) for _ in range(5)] + [Turn(text="read it all")])
    model = f"openai/{name}"
    config = {
        "compaction.tool_call_cutoff": 2,
        "compaction.tool_summary_strategy": "heuristic",
        "compaction.archive_min_freed_tokens": 0,  # archive however little it frees (design §4.7)
    }
    sid = session(model, config=config)
    assert rt.prompt(sid, "read notes five times").result(timeout=30).status == "ok"
    recorder.wait_type("agent_end")
    archived = recorder.of("tool_results_archived", sid)
    assert archived and all(a.strategy == "heuristic" for a in archived)
    context = rt.messages(sid, view="model")
    assert sum(m.role == "tool" for m in context) <= 2
    assert any(m.kind == "tool_summary" for m in context)
    assert check_integrity(context).ok
    everything = rt.messages(sid)
    assert sum(m.role == "tool" for m in everything) == 5  # archived, not deleted


def test_a_tool_loop_that_fills_the_context_compacts_between_its_steps(
    rt: Any, recorder: Recorder, provider: Any, session: Any, workspace: Any
) -> None:
    """The threshold is checked before every provider call of a turn, not only at the prompt."""
    (workspace / "big.txt").write_text("\n".join(f"line {i} " + "x" * 40 for i in range(120)))
    name = f"reader-{next(_names)}"
    read = ToolCallSpec(name="read_file", arguments='{"path": "big.txt"}')
    provider.add_script(name, [Turn(tool_calls=(read,)), Turn(tool_calls=(read,)), Turn(text="done")])
    model = f"openai/{name}"
    config = small_window(model)
    config["models.context_windows"][model] = 5_000
    sid = session(model, config=config)
    assert rt.prompt(sid, "read big.txt twice").result(timeout=60).status == "ok"
    recorder.wait_type("agent_end")
    types = recorder.types(sid)
    starts = recorder.of("compaction_start", sid)
    assert starts and all(s.trigger == "threshold" for s in starts), types
    assert recorder.of("compaction_end", sid) and not recorder.of("compaction_failed", sid)
    # It ran inside the turn, between a tool's result and the next provider call.
    first = types.index("compaction_start")
    assert "tool_execution_end" in types[:first] and "request_start" in types[first:]
    assert types.index("agent_end") > first
    context = rt.messages(sid, view="model")
    assert context[0].kind == KIND_COMPACTION_SUMMARY and check_integrity(context).ok


def test_a_failed_automatic_compaction_is_not_retried_in_the_same_turn(
    rt: Any, recorder: Recorder, provider: Any, session: Any, workspace: Any
) -> None:
    (workspace / "big.txt").write_text("\n".join(f"line {i} " + "x" * 40 for i in range(120)))
    name = f"loop-{next(_names)}"
    read = ToolCallSpec(name="read_file", arguments='{"path": "big.txt"}')
    provider.add_script(
        name,
        [Turn(tool_calls=(read,)), Turn(tool_calls=(read,)), Turn(tool_calls=(read,)), Turn(text="done")],
    )
    provider.add_script("mute-summarizer", [Turn(text="")], loop=True)
    model = f"openai/{name}"
    config = small_window(
        model, **{"compaction.mode": "hard_reset", "compaction.summarizer_model": "openai/mute-summarizer"}
    )
    config["models.context_windows"]["openai/mute-summarizer"] = 32_000
    config["models.context_windows"][model] = 5_000
    sid = session(model, config=config)
    result = rt.prompt(sid, "read big.txt three times").result(timeout=60)
    recorder.wait_type("agent_end")
    failures = recorder.of("compaction_failed", sid)
    # One threshold attempt, not one per step; the request it left over the limit gets the turn's one
    # emergency (overflow) compaction instead of being sent, and that failing ends the turn (design §5.13).
    assert [f.trigger for f in failures] == ["threshold", "overflow"], recorder.types(sid)
    assert all(f.reason == "summarizer_failed" for f in failures)
    assert result.status == "error"
    # A manual retry is always allowed.
    assert rt.compact(sid).result(timeout=30).compacted is False
    recorder.wait_type("compaction_failed", 3)


def test_old_tool_results_are_archived_with_a_summary_the_summarizer_wrote(
    rt: Any, recorder: Recorder, provider: Any, session: Any, workspace: Any
) -> None:
    """The ``llm`` strategy (design §5.9): the archived steps go to the summarizer as a digest, no tools; its
    answer, clipped to ``tool_summary_output_chars``, is what the model reads instead of them."""
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    name = f"tools-{next(_names)}"
    read = ToolCallSpec(name="read_file", arguments='{"path": "notes.txt"}')
    provider.add_script(name, [Turn(tool_calls=(read,)) for _ in range(5)] + [Turn(text="read it all")])
    summarizer = f"tool-summarizer-{next(_names)}"
    written = "The agent read notes.txt (alpha, beta) again and again. " + "Nothing changed. " * 100
    provider.add_script(summarizer, [Turn(text=written)], loop=True)
    config = {
        "compaction.tool_call_cutoff": 2,
        "compaction.tool_summary_strategy": "llm",
        "compaction.archive_min_freed_tokens": 0,
        "compaction.tool_summary_output_chars": 300,
        "compaction.summarizer_model": f"openai/{summarizer}",
    }
    sid = session(f"openai/{name}", config=config)
    provider.clear_log()
    assert rt.prompt(sid, "read notes five times").result(timeout=60).status == "ok"
    recorder.wait_type("agent_end")

    archived = recorder.of("tool_results_archived", sid)
    assert len(archived) >= 2 and all(a.strategy == "llm" for a in archived)
    requests = [r for r in provider.request_log if r.model == summarizer]
    assert len(requests) == len(archived)
    for request in requests:  # an isolated call: the digest as data, no tools, a small output budget
        system, prompt = request.messages[0], request.messages[-1]
        assert system["role"] == "system" and system["content"] == TOOL_SUMMARIZER_SYSTEM
        assert "<tool-results>" in prompt["content"] and "alpha" in prompt["content"]
        assert "tools" not in request.body and request.body.get("max_tokens") == 100
    assert "The agent read notes.txt" in requests[-1].messages[-1]["content"]  # the earlier summary folded in

    context = rt.messages(sid, view="model")
    (summary,) = [m for m in context if m.kind == KIND_TOOL_SUMMARY]
    assert summary.metadata["strategy"] == "llm"
    assert summary.text.startswith(f"{TOOL_SUMMARY_PREFIX}\nThe agent read notes.txt")
    assert len(summary.text) < len(TOOL_SUMMARY_PREFIX) + 300 + 100  # clipped (head and tail, and a notice)
    assert sum(m.role == "tool" for m in context) <= 2 and check_integrity(context).ok
    last_turn = [r for r in provider.request_log if r.model == name][-1]
    assert any(summary.text == m.get("content") for m in last_turn.messages)  # what the model read
    everything = rt.messages(sid)
    assert sum(m.role == "tool" for m in everything) == 5  # archived, not deleted


def test_a_failed_tool_summarizer_falls_back_to_the_heuristic_summary(
    rt: Any, recorder: Recorder, provider: Any, session: Any, workspace: Any
) -> None:
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    name = f"tools-{next(_names)}"
    read = ToolCallSpec(name="read_file", arguments='{"path": "notes.txt"}')
    provider.add_script(name, [Turn(tool_calls=(read,)) for _ in range(4)] + [Turn(text="done")])
    summarizer = f"tool-summarizer-{next(_names)}"
    provider.add_script(summarizer, [Turn(fault=Fault(kind="auth"))], loop=True)
    config = {
        "compaction.tool_call_cutoff": 2,
        "compaction.tool_summary_strategy": "llm",
        "compaction.archive_min_freed_tokens": 0,
        "compaction.summarizer_model": f"openai/{summarizer}",
    }
    sid = session(f"openai/{name}", config=config)
    provider.clear_log()
    assert rt.prompt(sid, "read notes four times").result(timeout=60).status == "ok"
    recorder.wait_type("agent_end")
    archived = recorder.of("tool_results_archived", sid)
    assert archived and all(a.strategy == "heuristic" for a in archived)
    assert any(r.model == summarizer and r.outcome == "auth" for r in provider.request_log)  # it was asked
    (summary,) = [m for m in rt.messages(sid, view="model") if m.kind == KIND_TOOL_SUMMARY]
    assert summary.metadata["strategy"] == "heuristic" and "read_file" in summary.text


def test_old_tool_outputs_are_cleared_to_a_placeholder(
    rt: Any, recorder: Recorder, provider: Any, session: Any, workspace: Any, sessions_dir: Any
) -> None:
    """``compaction.clear_old_tool_outputs`` (design §5.9): outputs older than the newest
    ``clear_protect_tokens`` become a placeholder once that frees ``clear_min_freed_tokens``; the newest
    step's are kept, calls keep their results, and the log keeps the outputs."""
    lines = [f"line {i}: " + " ".join(f"w{i}x{j}" for j in range(12)) for i in range(150)]
    (workspace / "big.txt").write_text("\n".join(lines) + "\n")
    name = f"clearer-{next(_names)}"
    read = ToolCallSpec(name="read_file", arguments='{"path": "big.txt"}')
    provider.add_script(name, [Turn(tool_calls=(read,)) for _ in range(4)] + [Turn(text="done")])
    config = {
        "compaction.tool_summary_strategy": "off",
        "compaction.clear_old_tool_outputs": True,
        "compaction.clear_protect_tokens": 5_000,
        "compaction.clear_min_freed_tokens": 2_000,
        "compaction.auto": False,  # only the clearing shrinks this context
    }
    sid = session(f"openai/{name}", config=config)
    provider.clear_log()
    assert rt.prompt(sid, "read big.txt four times").result(timeout=60).status == "ok"
    recorder.wait_type("agent_end")

    cleared_events = recorder.of("tool_outputs_cleared", sid)
    assert cleared_events and all(e.tokens_freed >= 2_000 for e in cleared_events)
    context = rt.messages(sid, view="model")
    results = [m for m in context if m.role == "tool"]
    assert len(results) == 4 and check_integrity(context).ok  # every call keeps its (cleared) result
    cleared = [m for m in results if m.kind == KIND_TOOL_OUTPUT_CLEARED]
    kept = [m for m in results if m.kind != KIND_TOOL_OUTPUT_CLEARED]
    assert cleared and kept and results[-1] in kept  # the oldest cleared, the newest step's kept
    assert results.index(cleared[-1]) < results.index(kept[0])
    for message in cleared:
        assert message.text.startswith("[Old tool output cleared to save context:")
        assert message.metadata["cleared_chars"] > 5_000
    count = rt._session(sid).counter.count_message
    assert len(kept) == 1 or sum(count(m) for m in kept) <= 5_000  # the newest outputs within the protection
    one_output = count(results[-1])
    last = [r for r in provider.request_log if r.model == name][-1]
    sent = [m.get("content") or "" for m in last.messages if m.get("role") == "tool"]
    assert sum("Old tool output cleared" in text for text in sent) == len(cleared)  # what the model read
    assert last.prompt_tokens < (len(kept) + 1) * one_output  # not four whole files
    log = SessionDirectory(sessions_dir).log_path(sid).read_text()
    assert log.count("line 149: w149x0") >= 4  # every output is still in the log
