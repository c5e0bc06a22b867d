"""One local Ray cluster with 2 CPUs for the cluster tests (starting one takes seconds).

Ray is started before the first test that needs it, outside that test's time limit (pytest-timeout's 120 s
covers a test's fixtures): on a loaded machine ``ray.init`` alone took 20-25 s, and the first test of a module
paid it on top of its own shards and its own work."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest


def _ray() -> Any:
    """Ray, started in this process if it is not yet (None without the ray extra)."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # tryfirst: around pytest-timeout's timer, not inside it
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    if "ray_cluster" in getattr(item, "fixturenames", ()):
        try:  # (a failure here, outside any test, would stop the run: the fixture tries again and says why)
            _ray()
        except Exception:
            pass
    yield


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    ray = _ray()
    if ray is None:
        pytest.skip("the cluster tests need the ray extra: pip install -e '.[dev,ray]'")
    yield ray
    ray.shutdown()
