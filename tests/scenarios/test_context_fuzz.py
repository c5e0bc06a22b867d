"""The workload fuzzer of the context core (design §5.13): sessions of every shape, through the public API.

Hypothesis draws a session (window 2k-200k, compaction mode, a summarizer that works, fails or answers
nothing, a provider whose real window may be smaller than the one configured, a turn budget) and its turns
(prompt sizes from a line to more than the window, steps of 1-6 parallel tool calls whose results go from a
few characters to several times the kept-recent budget), with manual compactions, aborts and a switch to a
model with half the window between turns. Every turn runs against the local provider over real HTTP, and
:class:`~tests.scenarios.workload.TurnCheck` checks what a user relies on after it.

The default run tries a fixed handful of examples; ``python -m pytest -m soak`` runs many more
(``AGENTCELL_FUZZ_EXAMPLES``, default 300, scaled by ``AGENTCELL_SOAK_SCALE``).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.provider.script import Turn
from tests.reliability.support import soak_scale
from tests.scenarios.workload import EventLog, TurnCheck, blob, prompt_text, record_problems, respond

WINDOWS = (2_000, 3_000, 5_000, 8_000, 16_000, 60_000, 200_000)
_names = itertools.count(1)


@dataclass(frozen=True)
class TurnSpec:
    steps: list[list[int]]
    pad_chars: int
    after: str  # what the user does after the turn: nothing, compact, abort (during it), set_model
    abort_after: float


@dataclass(frozen=True)
class Workload:
    window: int
    mode: str
    summarizer: str  # ok | fail | empty
    provider_ratio: float  # the provider's real window, as a fraction of the configured one
    budget_windows: int | None
    turns: list[TurnSpec]


@st.composite
def workloads(draw: Any) -> Workload:
    window = draw(st.sampled_from(WINDOWS))
    keep_chars = window  # the kept-recent budget (window/4 tokens) is about `window` characters
    size = st.one_of(
        st.integers(1, 200), st.integers(200, keep_chars), st.integers(keep_chars, 4 * keep_chars)
    )
    steps = st.lists(st.lists(size, min_size=1, max_size=6), max_size=3)
    pad = st.one_of(st.just(0), st.integers(0, 2 * window), st.integers(4 * window, 6 * window))
    turn = st.builds(
        TurnSpec,
        steps=steps,
        pad_chars=pad,
        after=st.sampled_from(["none", "none", "none", "compact", "abort", "set_model"]),
        abort_after=st.floats(0.0, 0.05),
    )
    return Workload(
        window=window,
        mode=draw(st.sampled_from(["summarize", "summarize", "summarize", "truncate", "hard_reset"])),
        summarizer=draw(st.sampled_from(["ok", "ok", "fail", "empty"])),
        provider_ratio=draw(st.sampled_from([1.0, 1.0, 0.8])),
        budget_windows=draw(st.sampled_from([None, None, 2, 5])),
        turns=draw(st.lists(turn, min_size=1, max_size=4)),
    )


def _summarizer(kind: str) -> Any:
    def answer(messages: list[dict[str, Any]], tools: Any) -> Turn:
        if kind == "fail":
            raise RuntimeError("the summarizer is down")
        if kind == "empty":
            return Turn(text="")
        return respond(messages, tools)

    return answer


def run_workload(rt: Any, provider: Any, work: Workload) -> list[str]:
    """Run ``work`` in a new session; every broken promise, as a list of sentences."""
    n = next(_names)
    model, small, summarizer = f"wl{n}", f"wl{n}-small", f"wl{n}-sum"
    window = work.window
    provider.add_responder(model, respond, context_window=int(window * work.provider_ratio))
    provider.add_responder(small, respond, context_window=int(window // 2 * work.provider_ratio))
    provider.add_responder(summarizer, _summarizer(work.summarizer), context_window=window)
    config: dict[str, Any] = {
        "models.context_windows": {
            f"openai/{model}": window,
            f"openai/{small}": window // 2,
            f"openai/{summarizer}": window,
        },
        "compaction.summarizer_model": f"openai/{summarizer}",
        "compaction.mode": work.mode,
    }
    if work.budget_windows is not None:
        config["agent.max_turn_input_tokens"] = work.budget_windows * window
    sid = rt.start_session(
        model=f"openai/{model}", api_base=provider.url, api_key="sk-local", tools=[blob], config=config
    )
    log = EventLog()
    subscription = rt.subscribe(sid, callback=log)
    problems: list[str] = []
    prompts: list[str] = []
    call_ids: list[str] = []
    models = frozenset({model})
    try:
        for index, spec in enumerate(work.turns):
            text = prompt_text(index, spec.steps, spec.pad_chars)
            position = len(log)
            provider.clear_log()
            handle = rt.prompt(sid, text)
            if spec.after == "abort":
                time.sleep(spec.abort_after)
                rt.abort(sid).result(timeout=30)
            result = handle.result(timeout=120)
            log.wait_settled(position)
            events = log.since(position)
            budget = config.get("agent.max_turn_input_tokens") or 20 * window
            check = TurnCheck(
                models=models,
                summarizer=summarizer,
                planned_steps=len(spec.steps),
                budget=budget,
                hard_reset=work.mode == "hard_reset",
            )
            check.check(result, events, provider.request_log)
            problems += [f"turn {index}: {p}" for p in check.problems]
            prompts.append(text)
            call_ids += [e.call_id for e in events if e.type == "tool_execution_start"]
            if spec.after == "compact":
                position = len(log)
                rt.compact(sid).result(timeout=60)
                log.wait_settled(position, turn=False)
            elif spec.after == "set_model" and window == work.window:
                rt.set_model(sid, f"openai/{small}")
                models, window = frozenset({small}), window // 2
        problems += record_problems(rt.messages(sid), prompts, call_ids)
    finally:
        subscription.close()
        rt.delete_session(sid)
    return problems


@pytest.fixture(scope="module")
def fuzz_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from runtime import Runtime
    from runtime.config import Config

    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    with Runtime(config, sessions_dir=tmp_path_factory.mktemp("fuzz-sessions")) as rt:
        yield rt


def _fuzz(rt: Any, provider: Any, work: Workload) -> None:
    problems = run_workload(rt, provider, work)
    assert not problems, "\n".join(problems)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(work=workloads())
def test_workloads_keep_the_context_invariants(fuzz_runtime: Any, provider: Any, work: Workload) -> None:
    """Any workload: compactions paired and bounded, turns end clearly, calls and results never split,
    nothing the user sent or a tool returned is lost, and no turn spends past its budget."""
    _fuzz(fuzz_runtime, provider, work)


@pytest.mark.soak
@pytest.mark.timeout(0)  # many examples in one test: each turn has its own timeouts
@settings(
    max_examples=max(10, int(int(os.environ.get("AGENTCELL_FUZZ_EXAMPLES", "300")) * soak_scale())),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(work=workloads())
def test_workloads_keep_the_context_invariants_soak(fuzz_runtime: Any, provider: Any, work: Workload) -> None:
    """The same, at a large example count."""
    _fuzz(fuzz_runtime, provider, work)
