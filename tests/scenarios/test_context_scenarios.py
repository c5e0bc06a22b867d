"""The context core under tool-heavy work, as a user meets it (design §5.13): the workloads that broke it.

Each test drives the public ``Runtime`` against the local provider over real HTTP: the measured compaction
loop (a small window, file reads bigger than the kept budget), the same at 60,000 tokens, one step whose
parallel results are twice the window, a prompt larger than the window, a runaway turn, and a step that
cannot fit however it is clipped.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path
from typing import Any

from runtime.messages import user
from runtime.provider.script import ToolCallSpec, Turn
from runtime.store.sessions import SessionDirectory
from runtime.tokens import TokenCounter
from tests.conftest import Recorder
from tests.scenarios.workload import pairing_problem

_names = itertools.count(1)


def small_window(model: str, window: int, **extra: Any) -> dict[str, Any]:
    """A session's config: ``window`` tokens, summaries by the provider's own summarizer (not the script)."""
    windows = {model: window, "openai/summarizer": 32_000}
    return {"models.context_windows": windows, "compaction.summarizer_model": "openai/summarizer", **extra}


def agent_requests(provider: Any, model: str) -> list[Any]:
    return [r for r in provider.request_log if r.model == model.removeprefix("openai/")]


def python_file(index: int, lines: int) -> str:
    return "".join(
        f"def function_{index}_{j}(x):\n    return x * {j} + {index}  # compute\n" for j in range(lines)
    )


def write_modules(workspace: Path, count: int, lines: int) -> int:
    """``count`` Python files of ``lines`` functions; returns the tokens of one."""
    for i in range(count):
        (workspace / f"mod{i}.py").write_text(python_file(i, lines))
    return TokenCounter("openai/gpt-4o").count_text(python_file(0, lines))


def compactions_per_turn(recorder: Recorder, sid: str) -> list[int]:
    counts: list[int] = []
    for event in recorder.events:
        if event.session_id != sid:
            continue
        if event.type == "agent_start":
            counts.append(0)
        elif event.type == "compaction_start" and counts:
            counts[-1] += 1
    return counts


def read_loop(rt: Any, provider: Any, session: Any, recorder: Recorder, window: int, turns: int) -> str:
    model = "openai/agentcell-local"  # the provider's policy: reads the files a prompt names, then answers
    sid = session(model, config={"models.context_windows": {model: window}})
    for i in range(turns):
        provider.clear_log()
        result = rt.prompt(sid, f"Please read mod{i}.py and tell me what it does.").result(timeout=60)
        assert result.status == "ok", (i, result.error)
        assert result.steps == 2, f"turn {i}: {result.steps} requests (a read, then the answer)"
        assert f"I read `mod{i}.py`" in result.text
        requests = [r for r in provider.request_log if r.model == "agentcell-local"]
        assert all(r.prompt_tokens <= window and r.outcome == "ok" for r in requests)
        assert all(pairing_problem(r.messages) is None for r in requests)
    recorder.wait_type("agent_end", turns)
    return sid


def test_file_reads_larger_than_the_kept_budget_do_not_loop(
    rt: Any, provider: Any, session: Any, recorder: Recorder, workspace: Path
) -> None:
    """The measured loop: a 5,000-token window, ~1,300-token files, 24 turns: every turn ends ok, with at
    most one compaction, and the model sees the file it read (it was never summarized away)."""
    tokens = write_modules(workspace, 24, 60)
    assert 1_100 <= tokens <= 1_500
    sid = read_loop(rt, provider, session, recorder, 5_000, 24)
    counts = compactions_per_turn(recorder, sid)
    assert len(counts) == 24 and max(counts) <= 1, counts
    assert sum(counts) >= 12  # the window is small: compaction is doing the work, not luck
    assert not recorder.of("compaction_failed", sid) or all(
        f.reason in ("no_progress", "nothing_to_compact") for f in recorder.of("compaction_failed", sid)
    )


def test_the_same_at_a_60k_window_with_13k_token_files(
    rt: Any, provider: Any, session: Any, recorder: Recorder, workspace: Path
) -> None:
    """Not a small-window artefact: 13,000-token files in a 60,000-token window, 8 turns, each ok, at most
    one compaction a turn, and no request sent larger than the window."""
    tokens = write_modules(workspace, 8, 620)
    assert 12_000 <= tokens <= 14_500
    sid = read_loop(rt, provider, session, recorder, 60_000, 8)
    counts = compactions_per_turn(recorder, sid)
    assert max(counts) <= 1 and sum(counts) >= 3, counts


def test_parallel_results_twice_the_window_are_clipped_and_kept_on_disk(
    rt: Any, provider: Any, session: Any, recorder: Recorder, workspace: Path, script: Any
) -> None:
    """Six files read in one step, together twice an 8,000-token window: the largest results are clipped
    head and tail, the full text saved beside the session with its SHA-256, and the turn ends ok."""
    write_modules(workspace, 6, 130)  # ~2,700 tokens each, ~16,000 together
    reads = tuple(ToolCallSpec(name="read_file", arguments=f'{{"path": "mod{i}.py"}}') for i in range(6))
    model = script(Turn(tool_calls=reads), Turn(text="I read all six."))
    sid = session(model, config=small_window(model, 8_000))
    result = rt.prompt(sid, "Read the six modules.").result(timeout=60)
    assert result.status == "ok", result.error
    assert result.text == "I read all six."
    recorder.wait_type("agent_end")
    assert not recorder.of("error", sid) and not recorder.of("session_dead", sid)

    results = [m for m in rt.messages(sid) if m.role == "tool"]
    assert len(results) == 6
    clipped = [m for m in results if m.metadata.get("clipped")]
    assert clipped, "the results could not all fit: some must be clipped"
    for message in clipped:
        saved = Path(message.metadata["clip_path"])
        data = saved.read_bytes()
        assert hashlib.sha256(data).hexdigest() == message.metadata["clip_sha256"]
        assert message.metadata["clip_sha256"] in message.text
        assert f'read the middle in parts with read_saved(id="{saved.name}")' in message.text
        assert len(data.decode()) == message.metadata["clipped_from_chars"] > len(message.text) - 400
        assert f"def function_{message.text.split('function_')[1].split('_')[0]}_0(x)" in data.decode()
    # the request that went out held every call with its (clipped) result, and fit the window
    last = agent_requests(provider, model)[-1]
    assert last.prompt_tokens <= 8_000 and pairing_problem(last.messages) is None


def test_a_prompt_larger_than_the_window_is_refused_before_any_call(
    rt: Any, provider: Any, session: Any, recorder: Recorder, script: Any, sessions_dir: Path
) -> None:
    """A prompt that cannot fit on its own is not sent, not summarized: refused with a clear error naming
    its size and the window, kept in the record (hidden from the model), and the session goes on."""
    model = script(Turn(text="Short answer."))
    sid = session(model, config=small_window(model, 4_000))
    provider.clear_log()
    huge = "lorem ipsum dolor sit amet " * 40_000  # ~1 MB, far over the window
    result = rt.prompt(sid, huge).result(timeout=60)
    assert result.status == "error" and result.steps == 0
    assert "4,000 tokens" in (result.error or "") and "not summarized" in (result.error or "")
    recorder.wait_type("agent_end")
    (error,) = recorder.of("error", sid)
    assert error.code == "prompt_too_large"
    assert provider.request_log == [] and not recorder.of("compaction_start", sid)
    assert [m.text for m in rt.messages(sid) if m.role == "user"] == [huge]
    assert rt.messages(sid, view="model") == [] or all(m.text != huge for m in rt.messages(sid, view="model"))
    assert rt.prompt(sid, "A short one.").result(timeout=60).status == "ok"
    rt.stop_session(sid)  # its log flushed
    log = SessionDirectory(sessions_dir).log_path(sid)
    assert len(huge) < log.stat().st_size < 1.5 * len(huge)  # stored once


def test_a_runaway_turn_stops_at_its_input_budget(
    rt: Any, provider: Any, session: Any, recorder: Recorder, workspace: Path, script: Any
) -> None:
    """A turn that keeps calling tools stops before a request would take it past
    ``agent.max_turn_input_tokens``, with ``turn_budget``; what it sent stays under the budget."""
    write_modules(workspace, 1, 40)
    read = ToolCallSpec(name="read_file", arguments='{"path": "mod0.py"}')
    model = script(*[Turn(tool_calls=(read,))] * 40)
    budget = 12_000
    sid = session(model, config=small_window(model, 50_000, **{"agent.max_turn_input_tokens": budget}))
    provider.clear_log()
    result = rt.prompt(sid, "Read mod0.py until told to stop.").result(timeout=60)
    assert result.status == "error" and "budget" in (result.error or "")
    recorder.wait_type("agent_end")
    assert recorder.of("error", sid)[-1].code == "turn_budget"
    sent = sum(r.prompt_tokens for r in agent_requests(provider, model))
    assert 0.5 * budget < sent <= budget and result.usage.input_tokens == sent


def test_a_step_that_cannot_fit_however_clipped_ends_the_turn_clearly(
    rt: Any, provider: Any, session: Any, recorder: Recorder, workspace: Path, script: Any
) -> None:
    """Six large results in a 2,000-token window cannot fit even clipped to their minimum: the turn ends
    with ``context_working_set_too_large`` and no oversized request; every result is kept; the session
    answers the next prompt."""
    write_modules(workspace, 6, 200)
    reads = tuple(ToolCallSpec(name="read_file", arguments=f'{{"path": "mod{i}.py"}}') for i in range(6))
    model = script(Turn(tool_calls=reads), Turn(text="fine"))
    sid = session(model, config=small_window(model, 2_000))
    provider.clear_log()
    result = rt.prompt(sid, "Read the six modules.").result(timeout=60)
    assert result.status == "error"
    recorder.wait_type("agent_end")
    assert recorder.of("error", sid)[-1].code == "context_working_set_too_large"
    assert re.search(r"does not fit the model's context of 2,000 tokens", result.error or "")
    assert len(agent_requests(provider, model)) == 1  # the request that made the calls; none after it
    assert len([m for m in rt.messages(sid) if m.role == "tool"]) == 6
    second = rt.prompt(sid, "Something small now.").result(timeout=60)
    assert second.status == "ok", (second.error, recorder.types(sid))


def test_a_summary_longer_than_the_room_left_is_clipped_to_fit_and_kept_whole(
    rt: Any,
    provider: Any,
    session: Any,
    recorder: Recorder,
    workspace: Path,
    sessions_dir: Path,
    script: Any,
) -> None:
    """After a step too large for a 2,000-token window, the next prompt compacts it away with a summarizer
    that ignores ``max_tokens`` and writes ~4,000 tokens: the summary in the context is clipped to the room
    the window leaves (the turn ends ok, every request fits the window), and the whole summary is in the
    compaction's artifact, which the clipped one names."""
    write_modules(workspace, 6, 200)
    reads = tuple(ToolCallSpec(name="read_file", arguments=f'{{"path": "mod{i}.py"}}') for i in range(6))
    model = script(Turn(tool_calls=reads), Turn(text="fine"))
    lines = [f"- step {i}: read module {i} and noted what each of its functions returns" for i in range(300)]
    summarizer = script(
        Turn(text="## Goal\nRead the modules.\n\n## Progress\n" + "\n".join(lines), ignore_max_tokens=True)
    )
    windows = {model: 2_000, summarizer: 32_000}
    sid = session(
        model, config={"models.context_windows": windows, "compaction.summarizer_model": summarizer}
    )
    assert rt.prompt(sid, "Read the six modules.").result(timeout=60).status == "error"
    second = rt.prompt(sid, "Something small now.").result(timeout=60)
    assert (second.status, second.text) == ("ok", "fine"), second.error
    recorder.wait_type("agent_end", 2)  # the callback's thread has both turns' events
    (end,) = recorder.of("compaction_end", sid)
    limit = rt.context_stats(sid).limit  # window - reserve
    assert end.tokens_after <= limit < end.tokens_before
    summary = next(m for m in rt.messages(sid, view="model") if m.kind == "compaction_summary")
    kept = SessionDirectory(sessions_dir).compaction_artifacts(sid, 1)[1]
    where = f'{kept}, read_saved(id="{kept.name}")'  # the model can read it back
    assert f"characters of the summary (cut to fit the context; all of it is in {where})" in summary.text
    assert "step 0:" in summary.text and "mod5.py" in summary.text  # its head, and the files read
    rt.flush()
    assert "\n".join(lines) in kept.read_text()
    assert all(r.prompt_tokens <= 2_000 and r.outcome == "ok" for r in agent_requests(provider, model))


def test_after_set_model_every_count_uses_the_new_models_tokenizer(
    rt: Any, provider: Any, session: Any, recorder: Recorder, script: Any
) -> None:
    """set_model to a model with another tokenizer: the next request's estimate (the one the compaction
    rules use) is counted with the new model's tokenizer, not the old one's."""
    old, new = script(Turn(text="one")), f"openai/gpt-4o-{next(_names)}"  # cl100k, then o200k
    provider.add_script(new.removeprefix("openai/"), [Turn(text="two")])
    system = "终端输出的每一行都要保留，不要省略任何内容。" * 40  # CJK: the two tokenizers differ by far
    sid = session(old, tools=None, system_prompt=system)
    rt.set_model(sid, new)
    prompt = "这是一个测试。" * 20
    assert rt.prompt(sid, prompt).result(timeout=60).text == "two"
    recorder.wait_type("agent_end")
    (start,) = recorder.of("request_start", sid)
    counter, before = TokenCounter(new), TokenCounter(old)
    assert counter.encoding_name != before.encoding_name
    expected = counter.count_system(system) + counter.count_message(user(prompt))
    assert (
        start.estimated_tokens == expected != before.count_system(system) + before.count_message(user(prompt))
    )
    assert rt.context_stats(sid).system_prompt == counter.count_system(system)


def test_calibration_of_one_session_leaves_the_others_counts_alone(
    rt: Any, provider: Any, session: Any, script: Any
) -> None:
    """With heuristic counting and ``tokens.apply_calibration``, each session calibrates its own counter:
    another session on the same model and settings keeps its counts."""
    config = {"tokens.exact": False, "tokens.apply_calibration": True}
    model = script(Turn(text="answer " * 50), Turn(text="again " * 50))
    calibrated = session(model, tools=None, config=config)
    bystander = session(model, tools=None, config=config, system_prompt="Be brief. " * 100)
    before = rt.context_stats(bystander).system_prompt  # an estimate, by the session's counter
    assert rt.prompt(calibrated, "x" * 3_000).result(timeout=60).status == "ok"  # a poor heuristic guess
    assert rt.context_stats(calibrated).calibration_ratio not in (None, 1.0)
    assert rt.context_stats(bystander).system_prompt == before
