"""Shared helpers of the reliability suite (tests/reliability/).

They check what the suite promises a user: a session's log replays into a consistent tree in which every
tool call has exactly one result, the events of each session arrive in order, and a runtime leaves no
thread or file descriptor behind once stopped.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.context.integrity import check_integrity
from runtime.events import Event
from runtime.messages import Message
from runtime.store.log import read_log, replay
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript
from runtime.store.tree import SessionTree
from runtime.tools.registry import ToolRegistry


def soak_scale() -> float:
    """``AGENTCELL_SOAK_SCALE`` (default 1.0 = full size); ``.ci/run`` runs the soak tests at 0.1."""
    raw = os.environ.get("AGENTCELL_SOAK_SCALE", "1.0")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"AGENTCELL_SOAK_SCALE must be a number, not {raw!r}") from None
    if not 0 < scale <= 10:
        raise ValueError(f"AGENTCELL_SOAK_SCALE must be in (0, 10], not {scale}")
    return scale


# -- logs on disk ---------------------------------------------------------------------------------------


@dataclass
class LogCheck:
    """What replaying one session's log found."""

    session_id: str
    tree: SessionTree
    torn_bytes: int
    problems: list[str] = field(default_factory=list)


def check_log(directory: SessionDirectory, session_id: str, *, allow_torn: bool = False) -> LogCheck:
    """Replay ``session_id``'s log and list every inconsistency a user would be hurt by.

    The log must open and replay into a tree (``replay`` raises on an entry that does not fit). On the
    model's path every tool call must have exactly one result (no orphan, duplicate or stray), and so
    must the user's view; every tool result in the whole log must answer a call made before it.
    """
    path = directory.log_path(session_id)
    entries, info = read_log(path, repair=False)
    tree = replay(path, entries)
    check = LogCheck(session_id, tree, info.torn_bytes)
    if info.torn and not allow_torn:
        check.problems.append(f"torn last line ({info.torn_bytes} bytes) after a clean shutdown")
    for view_name, view in (("model", tree.context()), ("user", tree.messages())):
        report = check_integrity(view)
        if not report.ok:
            check.problems.append(
                f"{view_name} view: {len(report.orphans)} orphaned calls "
                f"{[r.call.id for r in report.orphans]}, {len(report.duplicates)} duplicate and "
                f"{len(report.strays)} stray results"
            )
    seen_calls: set[str] = set()
    for message in all_messages(tree):
        if message.role == "assistant":
            seen_calls.update(call.id for call in message.tool_calls)
        elif message.role == "tool" and message.tool_call_id not in seen_calls:
            check.problems.append(f"tool result {message.id} answers a call never made")
    return check


def all_messages(tree: SessionTree) -> list[Message]:
    """Every message of the log (every branch), in log order."""
    from runtime.store.entries import MessageEntry

    return [e.message for e in tree.entries() if isinstance(e, MessageEntry)]


def message_ids(tree: SessionTree) -> set[str]:
    return {m.id for m in all_messages(tree)}


# -- events ---------------------------------------------------------------------------------------------


class EventLog:
    """A bus callback that keeps every event per session and checks their order as they come."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.by_session: dict[str, list[Event]] = defaultdict(list)
        self.count = 0

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.by_session[event.session_id].append(event)
            self.count += 1
            self._cond.notify_all()

    def events(self, session_id: str) -> list[Event]:
        with self._lock:
            return list(self.by_session.get(session_id, ()))

    def types(self, session_id: str) -> list[str]:
        return [e.type for e in self.events(session_id)]

    def of(self, session_id: str, kind: str) -> list[Any]:
        return [e for e in self.events(session_id) if e.type == kind]

    def all(self) -> list[Event]:
        with self._lock:
            return [e for events in self.by_session.values() for e in events]

    def wait_for(self, session_id: str, kind: str, count: int = 1, timeout: float = 20.0) -> list[Any]:
        """Block until ``session_id`` has emitted ``count`` events of ``kind``; returns them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.by_session.get(session_id, ()) if e.type == kind]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [e.type for e in self.by_session.get(session_id, ())]
                    raise AssertionError(f"no {count}x {kind} for {session_id} within {timeout}s; saw {seen}")
                self._cond.wait(left)


def order_problems(events: Sequence[Event], *, contiguous: bool = True) -> list[str]:
    """What is out of order in one session's events (empty: nothing).

    ``seq`` strictly increases (by one when ``contiguous``); runs nest properly (``agent_start`` …
    ``agent_end``, one at a time); a tool call's ``tool_execution_start`` precedes its end and each ends
    once; compactions do not overlap; a message is appended once.
    """
    problems: list[str] = []
    seqs = [e.seq for e in events]
    for before, after in itertools.pairwise(seqs):
        if after <= before or (contiguous and after != before + 1):
            problems.append(f"seq {after} after {before}")
            break
    in_run: str | None = None
    started_tools: set[str] = set()
    ended_tools: set[str] = set()
    compacting = False
    appended: set[str] = set()
    for e in events:
        kind = e.type
        if kind == "agent_start":
            if in_run is not None:
                problems.append(f"agent_start of {e.turn_id} inside run {in_run}")  # type: ignore[attr-defined]
            in_run = e.turn_id  # type: ignore[attr-defined]
        elif kind == "agent_end":
            if in_run != e.turn_id:  # type: ignore[attr-defined]
                problems.append(f"agent_end of {e.turn_id} outside its run ({in_run})")  # type: ignore[attr-defined]
            in_run = None
        elif kind in ("request_start", "turn_end", "tool_execution_start") and in_run is None:
            problems.append(f"{kind} outside a run")
        if kind == "tool_execution_start":
            call_id = e.call_id  # type: ignore[attr-defined]
            if call_id in started_tools or call_id in ended_tools:
                problems.append(f"tool call {call_id} started twice or after its end")
            started_tools.add(call_id)
        elif kind == "tool_execution_end":
            call_id = e.call_id  # type: ignore[attr-defined]
            if call_id in ended_tools:
                problems.append(f"tool call {call_id} ended twice")
            ended_tools.add(call_id)
        elif kind == "compaction_start":
            if compacting:
                problems.append("compaction_start while a compaction runs")
            compacting = True
        elif kind in ("compaction_end", "compaction_failed", "compaction_skipped"):
            compacting = False
        elif kind == "message_appended":
            mid = e.message_id  # type: ignore[attr-defined]
            if mid in appended:
                problems.append(f"message {mid} appended twice")
            appended.add(mid)
    return problems


def transcript_problems(directory: SessionDirectory, session_id: str) -> list[str]:
    """The order problems of the session's event transcript on disk (numbered 1, 2, 3, …; a new session's
    ``session_started``, seq 1, is left out: a transcript starts with the first event worth a file)."""
    events = read_transcript(directory.transcript_path(session_id))
    if not events:
        return ["the transcript is empty"]
    problems = order_problems(events)
    if events[0].seq not in (1, 2):
        problems.append(f"the transcript starts at seq {events[0].seq}")
    return problems


# -- tools ----------------------------------------------------------------------------------------------


class Gate:
    """A tool that blocks until released: it holds a turn in ``executing_tools``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def registry(self, name: str = "wait_here") -> ToolRegistry:
        registry = ToolRegistry()
        gate = self

        def wait_here() -> str:
            """Block until the test releases the gate."""
            gate.calls += 1
            gate.entered.set()
            gate.release.wait(30)
            return "released"

        wait_here.__name__ = name
        registry.register(wait_here)
        return registry


# -- resources ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """The threads and file descriptors of this process at one moment."""

    threads: frozenset[tuple[str, int]]
    fds: dict[int, str]

    @classmethod
    def now(cls) -> Resources:
        threads = frozenset((t.name, t.ident or 0) for t in threading.enumerate() if t.is_alive())
        fds: dict[int, str] = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue  # the descriptor listdir itself used, closed since
        return cls(threads, fds)

    def leaked_since(self, before: Resources) -> tuple[list[str], list[str]]:
        """Threads and descriptors alive now that were not at ``before``."""
        threads = sorted(name for name, _ in self.threads - before.threads)
        fds = sorted(f"{fd} -> {target}" for fd, target in self.fds.items() if before.fds.get(fd) != target)
        return threads, fds


def wait_for_no_leaks(
    before: Resources, timeout: float = 10.0, ignore: Callable[[str], bool] = lambda _: False
) -> tuple[list[str], list[str]]:
    """Poll until nothing leaked since ``before`` (threads take a moment to end); return what is left."""
    deadline = time.monotonic() + timeout
    while True:
        threads, fds = Resources.now().leaked_since(before)
        threads = [t for t in threads if not ignore(t)]
        fds = [f for f in fds if not ignore(f)]
        if (not threads and not fds) or time.monotonic() > deadline:
            return threads, fds
        time.sleep(0.05)


def grep_tree(root: Path, needles: Iterable[bytes]) -> list[str]:
    """Every file under ``root`` containing one of ``needles`` (raw bytes, any encoding of the file)."""
    wanted = [n for n in needles if n]
    hits: list[str] = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits.extend(f"{path}: {needle!r}" for needle in wanted if needle in data)
    return hits
