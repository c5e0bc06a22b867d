"""What the durable-turn tests share (design §3.12): a tool-heavy scripted model, counting tools, the child
process that runs a turn until it is killed, and the checks a taken-up turn must pass.

The model (:class:`PlanModel`, a responder of the local provider) answers from the request itself, as a
real model does: the newest tool step in the request and whether all its calls have results decide the
next step, so a request made again after a crash gets the same answer. Its calls have ids
``<tag>-s<step>c<index>``. ``bump`` is not idempotent, ``peek`` is; each call appends a line to a counter
file of the session's workspace (``counters/<session>--<call id>``), so the tests can tell how many times
each call ran, in whatever process it ran. A call named ``<session>--<call id>`` in the workspace's
``kill-in`` file kills its own process (SIGKILL) right after counting (its effect is done, its result not
recorded); one named in ``hold-in`` waits there half a minute (for a test to kill its process).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from runtime.context.prompts import SUMMARIZER_SYSTEM, TOOL_SUMMARIZER_SYSTEM
from runtime.provider.script import ToolCallSpec, Turn
from runtime.tools.registry import Tool, ToolContext, tool

ROOT: Final = Path(__file__).resolve().parents[2]

PLAN: Final[tuple[tuple[tuple[str, str], ...], ...]] = (
    (("peek", "alpha"), ("bump", "beta")),
    (("bump", "gamma"),),
    (("peek", "delta"), ("bump", "epsilon"), ("peek", "zeta")),
    (("bump", "eta"),),
)
"""The turn's steps: the calls (tool, note) the model makes at each, in parallel within a step."""

FINAL_TEXT: Final = "All steps are done. " + " ".join(f"word{i}" for i in range(60))
OUTPUT_CHARS: Final = 1_500  # each tool's output: a few steps fill the small window, and it compacts
IDEMPOTENT: Final = {"peek": True, "bump": False}
HOLD: dict[str, Callable[[], None]] = {}
"""In-process tests: ``HOLD[key]()`` runs inside the call ``<session>--<call id>`` right after its effect."""


def _count(ctx: ToolContext, note: str) -> str:
    root = ctx.require_workspace().root
    key = f"{ctx.session_id}--{ctx.call_id}"
    (root / "counters").mkdir(exist_ok=True)
    with (root / "counters" / key).open("a") as counter:
        counter.write(f"{os.getpid()} {ctx.idempotency_key}\n")
    if _marked(root / "kill-in", key):
        os.kill(os.getpid(), signal.SIGKILL)
    if _marked(root / "hold-in", key):
        time.sleep(30)
    if key in HOLD:
        HOLD[key]()
    time.sleep(0.03)  # a moment between the effect and the result: kill points land here too
    return f"{note}: " + "x" * OUTPUT_CHARS


def _marked(path: Path, key: str) -> bool:
    try:
        return path.read_text().strip() == key
    except FileNotFoundError:
        return False


def change(note: str, *, ctx: ToolContext) -> str:
    """Change something outside (not idempotent): counted once per run."""
    return _count(ctx, note)


def look(note: str, *, ctx: ToolContext) -> str:
    """Read something (idempotent): counted once per run."""
    return _count(ctx, note)


# (functions of their own names: a Ray shard unpickles them from this module)
bump = tool(change, name="bump")
peek = tool(look, name="peek", idempotent=True)


TOOLS: Final[tuple[Tool, ...]] = (bump, peek)


class PlanModel:
    """The local provider's responder for a session that works through :data:`PLAN` and then answers
    :data:`FINAL_TEXT`; a summarizer's request gets a summary."""

    def __init__(self, summary_latency: float = 0.2) -> None:
        self.summary_latency = summary_latency

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Turn:
        system = str(messages[0].get("content") or "") if messages else ""
        if system.startswith((SUMMARIZER_SYSTEM[:40], TOOL_SUMMARIZER_SYSTEM[:40])) or not tools:
            return Turn(text="Goal: run the plan. Progress: steps so far done.", latency=self.summary_latency)
        tag = _tag(messages)
        step = _next_step(messages)
        if step >= len(PLAN):
            return Turn(text=FINAL_TEXT)
        calls = tuple(
            ToolCallSpec(name=name, arguments=json.dumps({"note": note}), id=f"{tag}-s{step}c{i}")
            for i, (name, note) in enumerate(PLAN[step])
        )
        return Turn(tool_calls=calls)


def _tag(messages: Sequence[dict[str, Any]]) -> str:
    for message in messages:
        text = str(message.get("content") or "")
        if message.get("role") == "user" and "task " in text:
            return text.split("task ", 1)[1].split()[0]
    return "t"


def _next_step(messages: Sequence[dict[str, Any]]) -> int:
    """After the newest step whose calls all have results, the next; 0 when the request has none."""
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    for message in reversed(messages):
        calls = message.get("tool_calls") or []
        if message.get("role") != "assistant" or not calls:
            continue
        ids = [c["id"] for c in calls]
        step = int(ids[0].rsplit("-s", 1)[1].split("c")[0])
        return step + 1 if all(i in answered for i in ids) else step
    return 0


def session_config(model: str, window: int = 1_800) -> dict[str, Any]:
    """A per-session config whose small window makes a turn of ``model`` (its name at the provider)
    compact midway."""
    return {
        "compaction": {"reserve_tokens": 512, "keep_recent_tokens": 600, "tool_call_cutoff": 100},
        "agent": {"tool_timeout": 30.0},
        "models": {"context_windows": {model: window}},
    }


def counts(workspace: Path, session_id: str) -> dict[str, int]:
    """How many times each call of ``session_id`` ran: call id -> runs."""
    out: dict[str, int] = {}
    for path in (workspace / "counters").glob(f"{session_id}--*"):
        out[path.name.split("--", 1)[1]] = len(path.read_text().splitlines())
    return out


def check_turn(
    result: Any, messages: Sequence[Any], runs: dict[str, int], requests: Sequence[Any]
) -> dict[str, int]:
    """The promises of a durable turn, whatever point it was killed at: it ended with the real answer;
    each call has exactly one result; no call of a tool that is not idempotent ran twice; and no request
    the model got held two results for one call. Returns figures (``reruns``: idempotent calls run twice,
    ``unknown``: calls whose result says the outcome is unknown)."""
    from runtime.durable import OUTCOME_UNKNOWN_KEY

    assert result.status == "ok", result.error
    assert result.text == FINAL_TEXT
    results: dict[str, int] = {}
    names: dict[str, str] = {}
    unknown = 0
    for message in messages:
        if message.role == "assistant":
            names.update({c.id: c.name for c in message.tool_calls})
        if message.role == "tool":
            results[message.tool_call_id] = results.get(message.tool_call_id, 0) + 1
            unknown += bool(message.metadata.get(OUTCOME_UNKNOWN_KEY))
    assert set(results) == set(names), (results, names)
    assert all(n == 1 for n in results.values()), results
    for call_id, ran in runs.items():
        if not IDEMPOTENT[names[call_id]]:  # (0: it started, and its process died before its effect)
            assert ran <= 1, f"{call_id} ({names[call_id]}) ran {ran} times"
    for request in requests:
        seen = [m.get("tool_call_id") for m in request.messages if m.get("role") == "tool"]
        assert len(seen) == len(set(seen)), f"a request held two results for one call: {seen}"
    return {"reruns": sum(1 for c, n in runs.items() if n > 1), "unknown": unknown}


CHILD: Final = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from runtime import Runtime
from tests.reliability.durable_support import TOOLS, session_config
sessions, url, model, sid, kill_at, workspace = sys.argv[2:6] + [int(sys.argv[6]), sys.argv[7]]
seen = [0, 0]
def count(event):
    seen[0] += 1
    seen[1] += event.type == "compaction_end"
    if seen[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
with Runtime(sessions_dir=sessions) as rt:
    rt.start_session(sid, model=model, api_base=url, api_key="sk-local", tools=list(TOOLS),
                     config=session_config(model.split("/", 1)[1]), workspace=workspace)
    rt.subscribe(sid, callback=count)
    result = rt.prompt(sid, "task " + sid + " run the plan").result(timeout=120)
    print("finished", result.status, seen[0], seen[1], flush=True)
"""
"""The child: a session that runs one turn of :class:`PlanModel`, killing itself (SIGKILL) at its
``kill_at``-th event (0: never); prints ``finished <status> <events> <compactions>`` if it lives to the
end."""
