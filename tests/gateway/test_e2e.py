"""The agent end to end on each gateway transport (design §3.2): the same turns, events, usage, retries,
overflow recovery, compaction and abort over ``litellm`` and the native ``openai_compat``.

The rest of the agent suite runs on whichever ``--gateway-transport`` pytest is given (``auto``, the
default, sends the local provider's ``openai/`` models natively); this file runs a representative set on
each, side by side, and checks that each call went where it was sent (``request_start.transport``, usage).
``anthropic`` runs the sessions on ``anthropic/`` models against the local provider's Messages API (the native
Anthropic transport, which ``auto`` picks for them).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.conftest import RPM, Recorder

TRANSPORTS = ("litellm", "openai_compat", "anthropic")
_names = itertools.count(1)
_DIALECT = {"prefix": "openai"}


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param
    _DIALECT["prefix"] = "anthropic" if name == "anthropic" else "openai"
    yield name
    _DIALECT["prefix"] = "openai"


def base(provider: Any) -> str:
    """The provider's base URL in the dialect of the test's transport."""
    return str(provider.base_url if _DIALECT["prefix"] == "anthropic" else provider.url)


@pytest.fixture
def rt_on(sessions_dir: Path, transport: str) -> Iterator[Any]:
    from runtime import Runtime
    from runtime.config import Config

    config = Config().with_overrides(
        {
            "retry.base_delay": 0.01,
            "retry.max_delay": 0.05,
            "gateway.transport": "auto" if transport == "anthropic" else transport,
        }
    )
    with Runtime(config, sessions_dir=sessions_dir) as r:
        yield r


@pytest.fixture
def events(rt_on: Any) -> Iterator[Recorder]:
    rec = Recorder()
    sub = rt_on.subscribe(callback=rec)
    yield rec
    sub.close()


def scripted(provider: Any, *turns: Turn, loop: bool = False) -> str:
    name = f"e2e-{next(_names)}"
    provider.add_script(name, list(turns), loop=loop)
    return f"{_DIALECT['prefix']}/{name}"


def start(rt: Any, provider: Any, model: str, workspace: Path | None = None, **kw: Any) -> str:
    if workspace is not None:
        kw.update(tools="builtin", workspace=workspace)
    return str(rt.start_session(model=model, api_base=base(provider), api_key="sk-local", **kw))


def went_over(recorder: Recorder, sid: str, transport: str) -> None:
    starts = recorder.of("request_start", sid)
    assert starts and all(e.transport == transport for e in starts), [e.transport for e in starts]


def test_a_coding_turn_with_tools_and_reasoning(
    rt_on: Any, events: Recorder, provider: Any, workspace: Path, transport: str
) -> None:
    (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    model = scripted(
        provider,
        Turn(
            text="Let me look.",
            reasoning="Read the file first.",
            tool_calls=(ToolCallSpec(name="read_file", arguments='{"path": "calc.py"}'),),
        ),
        Turn(
            tool_calls=(
                ToolCallSpec(
                    name="edit_file", arguments='{"path": "calc.py", "old": "a - b", "new": "a + b"}'
                ),
            )
        ),
        Turn(text="Fixed: add now adds."),
    )
    sid = start(rt_on, provider, model, workspace)
    result = rt_on.prompt(sid, "Fix the bug in calc.py").result(timeout=30)
    assert result.status == "ok", result.error
    assert (result.text, result.steps) == ("Fixed: add now adds.", 3)
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    events.wait_type("agent_end")
    went_over(events, sid, transport)
    assert len(events.of("request_start", sid)) == 3
    assert "".join(e.delta for e in events.of("reasoning_delta", sid)) == "Read the file first."
    assert "".join(e.delta for e in events.of("text_delta", sid)) == "Let me look.Fixed: add now adds."
    assert [e.name for e in events.of("tool_call_delta", sid) if e.name] == ["read_file", "edit_file"]
    assistants = [m for m in rt_on.messages(sid) if m.role == "assistant"]
    assert [m.usage.transport for m in assistants] == [transport] * 3
    sent = [r for r in provider.request_log if r.model == model.split("/", 1)[1]]
    assert result.usage.input_tokens == sum(r.prompt_tokens for r in sent), "the provider's exact count"
    updates = events.of("usage_update", sid)
    assert updates and updates[-1].usage.transport == transport


def test_retries_and_clear_errors(rt_on: Any, events: Recorder, provider: Any, transport: str) -> None:
    model = scripted(
        provider,
        Turn(fault=Fault(kind="rate_limit", retry_after=0.05, rpm=RPM)),
        Turn(fault=Fault(kind="server_error")),
        Turn(text="after two retries"),
        Turn(fault=Fault(kind="auth")),
    )
    sid = start(rt_on, provider, model)
    result = rt_on.prompt(sid, "hi").result(timeout=20)
    assert result.status == "ok" and result.text == "after two retries"
    failed = rt_on.prompt(sid, "again").result(timeout=20)
    assert failed.status == "error" and "401" in (failed.error or "")
    events.wait_type("agent_end", 2)
    # a 429 pauses the key's pool and the call waits again for capacity, using no attempt (design §3.11):
    # the first 429 of its allowance of capacity.max_refusals, then the 500 is attempt 1 of retry.max_attempts
    retries = events.of("provider_retry", sid)
    assert [(r.attempt, r.max_attempts, r.status_code) for r in retries] == [(1, 8, 429), (1, 3, 500)]
    assert events.of("error", sid)[-1].code == "provider_auth"
    went_over(events, sid, transport)


@pytest.mark.parametrize("fmt", ["openai", "ollama", "anthropic", "request_too_large"])
def test_overflow_compacts_and_retries_once(rt_on: Any, events: Recorder, transport: str, fmt: str) -> None:
    from runtime.provider import LocalProvider

    with LocalProvider(context_window=3_000, overflow_format=fmt) as tight:
        name = f"overflow-{next(_names)}"
        tight.add_script(name, [Turn(text="Noted. " + " ".join(f"fact{i}" for i in range(120)))], loop=True)
        model = f"{_DIALECT['prefix']}/{name}"
        summarizer = f"{_DIALECT['prefix']}/summarizer"
        config = {
            "models.context_windows": {model: 8_000, summarizer: 3_000},
            "compaction.reserve_tokens": 500,
            "compaction.summarizer_model": summarizer,
        }
        sid = start(rt_on, tight, model, config=config)
        for i in range(30):
            result = rt_on.prompt(sid, f"Record item {i} of the inventory, with its details.").result(
                timeout=60
            )
            assert result.status == "ok", result.error
            events.wait_type("agent_end", i + 1)
            if events.of("compaction_start", sid):
                break
        else:
            raise AssertionError("the provider never overflowed")
        events.wait_type("compaction_end")
        (end,) = events.of("compaction_end", sid)
        assert end.trigger == "overflow" and end.tokens_after < end.tokens_before
        outcomes = [r.outcome for r in tight.request_log if r.model == name]
        assert outcomes.count("overflow") == 1 and outcomes[-1] == "ok"
        summaries = [r for r in tight.request_log if r.model == "summarizer"]
        assert summaries and not summaries[-1].stream, "the summary is a call that is not streamed"
        went_over(events, sid, transport)


def test_abort_mid_stream(rt_on: Any, events: Recorder, provider: Any, transport: str) -> None:
    model = scripted(provider, Turn(text="a very slow answer", latency=5.0), Turn(text="second answer"))
    sid = start(rt_on, provider, model)
    handle = rt_on.prompt(sid, "slow please")
    name = model.split("/", 1)[1]
    deadline = time.monotonic() + 10
    while provider.remaining_turns(name) == 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rt_on.abort(sid).result(timeout=5) is True
    assert handle.result(timeout=5).status == "aborted"
    after = rt_on.prompt(sid, "again").result(timeout=20)
    assert after.status == "ok" and after.text == "second answer"
    went_over(events, sid, transport)


def test_a_session_picks_its_own_transport(
    rt_on: Any, events: Recorder, provider: Any, transport: str
) -> None:
    other = "litellm" if transport in ("openai_compat", "anthropic") else "openai_compat"
    model = scripted(provider, Turn(text="mine"), loop=True)
    own = start(rt_on, provider, model, config={"gateway.transport": other})
    default = start(rt_on, provider, model)
    assert rt_on.prompt(own, "hi").result(timeout=20).text == "mine"
    assert rt_on.prompt(default, "hi").result(timeout=20).text == "mine"
    events.wait_type("agent_end", 2)
    went_over(events, own, other)
    went_over(events, default, transport)
