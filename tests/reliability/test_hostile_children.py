"""A token holder's prompt cannot make a session start children without end.

The probe that found this: one prompt made 105 child sessions (4 at a time, no cap on the total). Over
`agentcell serve`, a session whose model delegates 105 times gets ``subagents.max_children_per_turn``
children in that turn and ``subagents.max_total_children_per_session`` in all; every delegation past a cap
is an error result naming it, and the session goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime import Runtime
from runtime.apps.server import ApiServer
from runtime.config import Config
from runtime.provider.script import ToolCallSpec, Turn

TOKEN = "children-hostile-token-" + "c" * 20
PER_TURN = 10
PER_SESSION = 15


@pytest.fixture
def rt(sessions_dir: Path) -> Iterator[Runtime]:
    config = Config().with_overrides(
        {
            "subagents.max_children_per_turn": PER_TURN,
            "subagents.max_total_children_per_session": PER_SESSION,
            "agent.max_steps_per_turn": 50,
            "compaction.tool_summary_strategy": "heuristic",  # (no model call but the script's)
        }
    )
    with Runtime(config, sessions_dir=sessions_dir) as runtime:
        yield runtime


def delegations(count: int, per_step: int = 3) -> list[Turn]:
    """A turn of ``count`` delegations, ``per_step`` in each step (under the 4 running at once)."""
    steps = []
    for first in range(0, count, per_step):
        calls = tuple(
            ToolCallSpec(name="agent", arguments=json.dumps({"profile": "kid", "task": f"task {i}"}))
            for i in range(first, min(count, first + per_step))
        )
        steps.append(Turn(tool_calls=calls))
    return [*steps, Turn(text="all done")]


def answer(result: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in (result.get("message") or {}).get("parts", []))


@pytest.mark.slow  # 210 delegations, 15 child sessions: ~15 s
def test_one_prompt_cannot_start_105_children(rt: Runtime, provider: Any) -> None:
    provider.add_script("hostile-kid", [Turn(text="done")], loop=True)
    provider.add_script("hostile-parent", delegations(105) + delegations(105))
    profile = {"description": "does one thing", "model": "openai/hostile-kid", "tools": "none"}
    body = {
        "model": "openai/hostile-parent",
        "api_base": provider.url,
        "api_key": "sk-local",
        "agents": {"kid": profile},
    }
    with (
        ApiServer(rt, TOKEN) as server,
        httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        ) as client,
    ):
        created = client.post("/sessions", json=body)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        first = client.post(f"/sessions/{sid}/prompt", json={"text": "delegate everything", "wait": True})
        assert first.status_code == 200 and answer(first.json()) == "all done", first.text
        assert len(rt.children(sid)) == PER_TURN
        second = client.post(f"/sessions/{sid}/prompt", json={"text": "and again", "wait": True})
        assert second.status_code == 200 and answer(second.json()) == "all done", second.text
        listed = client.get("/sessions").json()["sessions"]
        messages = client.get(f"/sessions/{sid}/messages").json()["messages"]
    assert len(rt.children(sid)) == PER_SESSION
    assert sum(1 for s in listed if s.get("parent_id") == sid) == PER_SESSION
    results = [m for m in messages if m["role"] == "tool"]
    assert len(results) == 210
    refused = [m for m in results if m.get("is_error")]
    assert len(refused) == 210 - PER_SESSION
    text = [answer({"message": m}) for m in refused]
    per_turn = [t for t in text if "subagents.max_children_per_turn" in t]
    per_session = [t for t in text if "subagents.max_total_children_per_session" in t]
    assert len(per_turn) == 105 - PER_TURN
    assert len(per_session) == 105 - (PER_SESSION - PER_TURN)
    assert all("limit reached" in t for t in text)
