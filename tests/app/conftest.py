"""Fixtures of the application tests: ``agentcell serve`` for the Responses API tests (``server``, and the
official ``openai`` SDK's ``client`` of it); the dashboard tests' screenshots, collected while the tests run
and listed at the end of the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import openai

    from runtime.apps.server import ApiServer

_SCREENSHOTS = pytest.StashKey[list[Path]]()


@pytest.fixture(scope="session")
def screenshots(pytestconfig: pytest.Config) -> list[Path]:
    """Paths of the screenshots taken so far; the terminal summary lists them."""
    return pytestconfig.stash.setdefault(_SCREENSHOTS, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    taken = config.stash.get(_SCREENSHOTS, [])
    if taken:
        terminalreporter.section("dashboard screenshots")
        for path in taken:
            terminalreporter.write_line(str(path))


@pytest.fixture
def server(
    request: pytest.FixtureRequest, rt: Any, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ApiServer]:
    """``agentcell serve`` on ``rt``, its bearer token the test module's ``TOKEN``; the server's own provider
    settings send models named ``openai/...`` to the local ``provider``."""
    from runtime.apps.server import ApiServer

    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    with ApiServer(rt, request.module.TOKEN) as s:
        yield s


@pytest.fixture
def client(server: ApiServer) -> Iterator[openai.OpenAI]:
    """The official ``openai`` SDK's client of ``server``'s Responses API (no retries of its own)."""
    import openai

    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token, max_retries=0, timeout=60) as c:
        yield c
