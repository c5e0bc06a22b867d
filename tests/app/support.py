"""Helpers of the application tests (fixtures are in ``conftest.py``)."""

from __future__ import annotations

from typing import Any


def sent(provider: Any, model: str) -> list[list[dict[str, Any]]]:
    """The messages of every request the local ``provider`` got for ``model``."""
    name = model.removeprefix("openai/")
    return [list(r.body["messages"]) for r in provider.request_log if r.model == name]
