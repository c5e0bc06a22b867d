"""Hostile use of the Python API: empty prompts, and sessions deleted in the middle of their work.

The Python API and HTTP follow one rule for what a prompt must hold, and deleting a session mid-turn is an
ordinary event: its provider call and tools are cancelled, and nothing is logged as an error.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from runtime import Runtime
from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.reliability.support import Gate

_names = iter(range(1, 1_000_000))


def script(provider: Any, *turns: Turn) -> str:
    name = f"hostile-api-{next(_names)}"
    provider.add_script(name, list(turns))
    return f"openai/{name}"


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_an_empty_prompt_is_refused(rt: Runtime, provider: Any, text: str) -> None:
    """A prompt with no text (and no image) is a ValueError, as it is a 400 over HTTP."""
    sid = rt.start_session(model=script(provider, Turn(text="never")), api_base=provider.url, api_key="k")
    with pytest.raises(ValueError, match="prompt text must not be empty"):
        rt.prompt(sid, text)
    assert rt.messages(sid) == []


def test_a_prompt_of_images_alone_is_accepted(rt: Runtime, provider: Any) -> None:
    """A prompt may be images without text."""
    sid = rt.start_session(model=script(provider, Turn(text="a cat")), api_base=provider.url, api_key="k")
    image = "data:image/png;base64,iVBORw0KGgo="
    assert rt.prompt(sid, "", images=[image]).result(timeout=30).text == "a cat"


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


def test_deleting_a_session_mid_stream_cancels_its_call_quietly(
    rt: Runtime, provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleting a session while its provider call streams cancels the call and logs no error."""
    caplog.set_level(logging.DEBUG)
    sid = rt.start_session(
        model=script(provider, Turn(fault=Fault(kind="hang"))), api_base=provider.url, api_key="k"
    )
    streaming = threading.Event()
    rt.subscribe(sid, {"request_start"}, callback=lambda _: streaming.set())
    handle = rt.prompt(sid, "take your time")
    assert streaming.wait(10)
    deadline = time.monotonic() + 10
    while rt.services.gateway.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    rt.delete_session(sid)
    assert handle.result(timeout=10).status == "aborted"
    deadline = time.monotonic() + 5
    while rt.services.gateway.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rt.services.gateway.in_flight == 0  # the hanging call was cancelled, not left to time out
    time.sleep(0.3)  # the cancelled call's result reaches its (stopped) agent
    assert errors_logged(caplog) == []


def test_deleting_a_session_mid_tool_logs_no_error(
    rt: Runtime, provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleting a session while its tool runs aborts the tool and logs no error."""
    caplog.set_level(logging.DEBUG)
    gate = Gate()
    model = script(provider, Turn(tool_calls=(ToolCallSpec(name="wait_here"),)), Turn(text="done"))
    sid = rt.start_session(model=model, api_base=provider.url, api_key="k", tools=gate.registry())
    handle = rt.prompt(sid, "wait")
    assert gate.entered.wait(10)
    rt.delete_session(sid)
    gate.release.set()
    assert handle.result(timeout=10).status == "aborted"
    time.sleep(0.3)
    assert errors_logged(caplog) == []
