"""A turn's events and its handle: what a subscriber has seen when ``handle.result()`` returns."""

from __future__ import annotations

import threading
import time
from typing import Any

from runtime.provider.script import Turn


def test_after_the_handle_an_iterator_finds_the_turns_end_and_a_callback_catches_up_on_flush(
    rt: Any, session: Any, script: Any
) -> None:
    """The turn's events are queued to every subscriber before its handle resolves: an iterator reads the
    turn's ``agent_end`` at once; a slow callback has seen it once ``flush()`` returns."""
    seen: list[str] = []
    lock = threading.Lock()

    def slow(event: Any) -> None:
        time.sleep(0.02)
        with lock:
            seen.append(event.type)

    sid = session(script(Turn(text="a rather long answer " * 20)), tools=None)
    reader = rt.subscribe(sid)
    watcher = rt.subscribe(sid, callback=slow)
    rt.prompt(sid, "go").result(timeout=30)
    assert [e.type for e in reader.drain()][-1] == "agent_end"
    assert watcher.flush(timeout=30)
    with lock:
        assert seen[-1] == "agent_end"
    assert reader.flush(timeout=0)  # an iterator with nothing queued has caught up
    reader.close()
    watcher.close()


def test_a_turns_usage_update_comes_before_its_agent_end_when_the_tracker_lags(
    rt: Any, session: Any, script: Any, monkeypatch: Any
) -> None:
    """The usage tracker records a response on a dispatcher thread of its own time; the turn used to end
    without waiting for it, so under load its ``usage_update`` came after ``agent_end`` (and after the handle
    resolved: seen in a full run beside two busy processes). A tracker 0.3 s late shows it every time."""
    from actors.usage_tracker import UsageTracker

    record = UsageTracker._record

    def late(self: Any, response: Any, estimated: Any) -> None:
        time.sleep(0.3)
        record(self, response, estimated)

    monkeypatch.setattr(UsageTracker, "_record", late)
    sid = session(script(Turn(text="an answer")), tools=None)
    reader = rt.subscribe(sid)
    rt.prompt(sid, "go").result(timeout=30)
    types = [e.type for e in reader.drain()]
    assert "usage_update" in types and types[-1] == "agent_end", types
    reader.close()
