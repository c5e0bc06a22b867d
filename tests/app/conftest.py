"""The dashboard tests' screenshots: collected while the tests run, listed at the end of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

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
