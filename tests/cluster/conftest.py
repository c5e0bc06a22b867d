"""One local Ray cluster with 2 CPUs for every cluster test of the run (starting one takes seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip(
        "ray", reason="the cluster tests need the ray extra: pip install -e '.[dev,ray]'"
    )
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
