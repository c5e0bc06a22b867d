"""What resuming a stored session checks and takes from its files (``Runtime.resume_session``).

Its log must replay, or be cut before its first bad line when asked to (:func:`check_log`); its event
numbers go on after every number it was ever given (:func:`continue_numbering`); its own MCP servers come
back from its header (:func:`resumed_servers`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from runtime import events as ev
from runtime.bus import EventBus
from runtime.config import Config
from runtime.store.log import CorruptLogError, cut_log, load_tree, signature
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import transcript_end
from runtime.tools.mcp.servers import restored, withheld

__all__ = ["check_log", "continue_numbering", "resumed_servers"]

log = logging.getLogger("agentcell.runtime")


def check_log(directory: SessionDirectory, bus: EventBus, sid: str, repair: str | None) -> str | None:
    """Raise :class:`CorruptLogError` unless the session's log replays; with ``repair="truncate"``, cut
    it before its first bad line instead (what is cut is kept in the session's artifacts). Returns the
    session's current model as the log says it (a ``set_model`` after its header), or None.

    Call it holding the session's lock: the tree it replayed is handed over to the session's store
    (:meth:`SessionDirectory.hand_over`), which takes it instead of reading the log again when the log is
    as it was (a torn last line is left for the store to cut and report: nothing is handed over then)."""

    path = directory.log_path(sid)
    try:
        tree, info = load_tree(path, repair=False)
    except CorruptLogError as exc:
        if repair != "truncate" or exc.line < 2:
            hint = (
                "; resume_session(..., repair='truncate') opens the session up to the last good entry"
                if exc.line >= 2
                else ""
            )
            raise CorruptLogError(exc.path, exc.line, exc.reason + hint) from None
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        keep = directory.artifact_path(sid, f"log-cut-{stamp}-line-{exc.line}.jsonl")
        keep.parent.mkdir(parents=True, exist_ok=True)
        cut = cut_log(path, exc.line, keep)
        log.warning("session %s: cut its log at line %d (%s); kept in %s", sid, exc.line, exc.reason, keep)
        bus.publish(
            ev.LogRecovered(session_id=sid, path=str(path), torn_bytes=cut, line=exc.line, kept_in=str(keep))
        )
        tree, info = load_tree(path, repair=False)  # what is left must replay (an error now is not a cut)
    if not info.torn:
        directory.hand_over(sid, tree, signature(path))
    return tree.model


def continue_numbering(directory: SessionDirectory, bus: EventBus, sid: str, *, transcript: bool) -> None:
    """Make the resumed session's event numbers go on after every number it was ever given.

    A transcript that ends with an orderly stop holds every event: numbering goes on after its last.
    Otherwise (a crash, a torn line, no transcript) events may have reached subscribers without reaching
    the disk, and nobody knows how far their numbers went: numbering jumps to the clock, in microseconds
    since 1970, which no session reaches by counting (it would take a million events a second). A torn
    transcript line is reported with ``log_recovered``, like a torn log line. ``transcript``: whether the
    runtime keeps transcripts (``persistence.transcript``).
    """

    if bus.last_seq(sid):  # numbered in this process already: from a floor above all before it
        return
    path = directory.transcript_path(sid)
    end = transcript_end(path) if transcript else None
    floor = end.last_seq if end is not None else 0
    if end is None or not end.clean:
        floor = max(floor, time.time_ns() // 1_000)
    bus.set_last_seq(sid, floor)
    if end is not None and end.torn_bytes:
        bus.publish(ev.LogRecovered(session_id=sid, path=str(path), torn_bytes=end.torn_bytes))


def resumed_servers(stored: Mapping[str, Any], explicit: Mapping[str, Any], cfg: Config) -> dict[str, Any]:
    """A resumed session's own MCP servers: those of its log (one whose log withheld a secret gives way
    to the runtime's server of that name), then ``explicit`` ones."""
    out = {
        name: server
        for name, server in restored(stored).items()
        if not (withheld(server) and name in cfg.mcp.servers)
    }
    out.update(explicit)
    return out
