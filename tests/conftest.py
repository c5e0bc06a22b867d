"""Shared fixtures: the local provider over real HTTP, a runtime with its own sessions directory, and
an event recorder."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime  # noqa: F401  (sets the offline environment before anything imports litellm)
from runtime.events import Event


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gateway-transport",
        choices=("auto", "litellm", "openai_compat"),
        default="auto",
        help="force gateway.transport in the `rt` fixture's runtime (the agent end-to-end tests run on it)",
    )


@pytest.fixture(scope="session")
def gateway_transport(pytestconfig: pytest.Config) -> str:
    """The gateway transport the `rt` fixture's runtime uses (``--gateway-transport``, default auto)."""
    name: str = pytestconfig.getoption("--gateway-transport")
    return name


@pytest.fixture(scope="session")
def provider() -> Iterator[Any]:
    """One local OpenAI-compatible provider for the test session; tests add their own scripts."""
    from runtime.provider import LocalProvider

    with LocalProvider() as p:
        yield p


@pytest.fixture
def sessions_dir(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def rt(sessions_dir: Path, gateway_transport: str) -> Iterator[Any]:
    from runtime import Runtime
    from runtime.config import Config

    config = Config().with_overrides(
        {"retry.base_delay": 0.01, "retry.max_delay": 0.05, "gateway.transport": gateway_transport}
    )
    with Runtime(config, sessions_dir=sessions_dir) as r:
        yield r


RPM = 6_000
"""The request limit the tests' rate-limit faults report (``Fault(kind="rate_limit", rpm=RPM)``): after a refusal
that says 60 (the default) the runtime rightly paces the key's later requests a second apart, and a test that
is about something else pays a second for each."""


class Recorder:
    """Collects every event of a runtime; waits for a condition on them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def types(self, session_id: str | None = None) -> list[str]:
        with self._cond:
            return [e.type for e in self.events if session_id is None or e.session_id == session_id]

    def of(self, kind: str, session_id: str | None = None) -> list[Any]:
        with self._cond:
            return [
                e
                for e in self.events
                if e.type == kind and (session_id is None or e.session_id == session_id)
            ]

    def wait_for(self, predicate: Callable[[list[Event]], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.events):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"condition not met within {timeout}s; events: {[e.type for e in self.events]}"
                    )
                self._cond.wait(left)

    def wait_type(self, kind: str, count: int = 1, timeout: float = 10.0) -> None:
        self.wait_for(lambda evs: sum(e.type == kind for e in evs) >= count, timeout)


class StopsSeen(list[str]):
    """A bus sink that sees every ``session_stopped`` published (the ids, in order) and asks for none in bulk:
    what a runtime's stop makes for the sessions it hosts, whoever the events are made for."""

    def __call__(self, event: Event) -> None:
        if event.type == "session_stopped":
            self.append(event.session_id)

    def wants(self, session_id: str, kind: str) -> bool:
        return False


def wait_until(check: Callable[[], object], what: str = "the condition", timeout: float = 30.0) -> None:
    """Poll ``check`` until it is true; fail saying ``what`` was not met within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.02)


@pytest.fixture
def recorder(rt: Any) -> Iterator[Recorder]:
    rec = Recorder()
    sub = rt.subscribe(callback=rec)
    yield rec
    sub.close()


_script_counter = iter(range(1, 1_000_000))


@pytest.fixture
def script(provider: Any) -> Callable[..., str]:
    """Register turns under a fresh script name and return the model name that selects them."""

    def add(*turns: Any) -> str:
        name = f"script-{next(_script_counter)}"
        provider.add_script(name, list(turns))
        return f"openai/{name}"

    return add


@pytest.fixture
def session(rt: Any, provider: Any, workspace: Path) -> Callable[..., str]:
    """Start a session against the local provider (builtin tools in ``workspace`` unless told)."""

    def start(model: str, **kw: Any) -> str:
        kw.setdefault("tools", "builtin")
        kw.setdefault("workspace", workspace)
        return str(rt.start_session(model=model, api_base=provider.url, api_key="sk-local", **kw))

    return start
