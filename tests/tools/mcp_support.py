"""Helpers of the MCP tests: the test server's command, and a model that calls what the prompt says.

The model is a responder of the local provider (it answers from the request, as a real model does): a
prompt ``CALL [["t__echo", {"text": "hi"}], ...]`` makes it call those tools, all in one step; once the
results are in, it answers ``done``. It records the tools each request offered, so a test can check
what the model saw.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime.provider.script import ToolCallSpec, Turn

SERVER = Path(__file__).with_name("mcp_server.py")


def stdio(*args: str, **settings: Any) -> dict[str, Any]:
    """A stdio server definition running the test server."""
    return {"command": sys.executable, "args": [str(SERVER), *args], **settings}


def call(*calls: tuple[str, dict[str, Any]] | str) -> str:
    """The prompt that makes the model call ``calls`` (names, or (name, arguments)) in one step."""
    plan = [[c, {}] if isinstance(c, str) else [c[0], c[1]] for c in calls]
    return "CALL " + json.dumps(plan)


class Model:
    """The responder (see the module docstring)."""

    def __init__(self) -> None:
        self.offered: list[list[dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._serial = 0

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Turn:
        with self._lock:
            self.offered.append(list(tools or []))
            self._serial += 1
            serial = self._serial
        last = messages[-1]
        if last["role"] == "tool":
            return Turn(text="done")
        text = last.get("content") or ""
        if isinstance(text, list):
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        if not text.startswith("CALL "):
            return Turn(text="plain answer")
        plan = json.loads(text[len("CALL ") :])
        calls = tuple(
            ToolCallSpec(name=name, arguments=json.dumps(args), id=f"c{serial}_{i}")
            for i, (name, args) in enumerate(plan)
        )
        return Turn(tool_calls=calls)

    def tool(self, name: str) -> dict[str, Any] | None:
        """The newest schema offered for ``name`` (OpenAI's function format), or None."""
        with self._lock:
            for t in self.offered[-1] if self.offered else []:
                if t["function"]["name"] == name:
                    return t["function"]  # type: ignore[no-any-return]
        return None


def results(rt: Any, sid: str, prompt: str, timeout: float = 90.0) -> list[Any]:
    """Run ``prompt`` (a :func:`call` prompt) and return the tool results of its turn, in call order."""
    before = len(rt.messages(sid))
    outcome = rt.prompt(sid, prompt).result(timeout=timeout)
    assert outcome.status == "ok", outcome.error
    return [m for m in rt.messages(sid)[before:] if m.role == "tool"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    """Wait until process ``pid`` (not necessarily our child) has exited: a pidfd turns readable then."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0]) or not alive(pid)
    finally:
        os.close(fd)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def servers_in(events: Sequence[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]
