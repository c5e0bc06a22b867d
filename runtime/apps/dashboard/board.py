"""The dashboard's picture of every hosted session, kept from the event bus (design §7.4).

:class:`SessionBoard` subscribes to the runtime's events (every type but the deltas) and folds each into a
small row per session: the agent's state, tokens in and out, the share of input read from the cache, cost, context size, compactions, turns, the
last event. :meth:`SessionBoard.snapshot` joins those rows with what the runtime knows of its hosted
sessions (model, window, compaction threshold, parked or not) without asking a single actor, so a page
can open on a thousand sessions at once and then follow the same events live: each row carries the
``seq`` of the last event folded into it, and a client applies only events after it.

A local :class:`~runtime.host.Runtime` is read directly (its session table); any other runtime with the
same public API (``hosted_sessions``, ``subscribe``, ``config``) is described from its events alone.

The page (``static/app.js``, ``applyEvent``) folds events into its rows by the same rules as
:meth:`_Row.apply`; change them together.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from runtime import events as ev
from runtime.context.estimate import compaction_threshold
from runtime.messages import CostSplit

__all__ = ["STREAM_TYPES", "SessionBoard"]

STREAM_TYPES: tuple[str, ...] = tuple(sorted(ev.EVENT_TYPES - ev.FRAGMENT_TYPES))
"""The event types the page subscribes to; the board folds the same ones. Not the fragments of what is
streamed (``Event.fragment``: a few per streamed token), too fine-grained for the board and the page."""


class _Row:
    """One session as the events tell it."""

    __slots__ = (
        "cache_read_tokens",
        "cache_saved",
        "compacting",
        "compactions",
        "context_tokens",
        "cost",
        "costs",
        "created",
        "errors",
        "input_tokens",
        "last_error",
        "last_ts",
        "last_type",
        "model",
        "output_tokens",
        "seq",
        "state",
        "title",
        "turns",
        "window",
    )

    def __init__(self, created: float | None) -> None:
        self.state: str | None = None  # None: no status_update seen; the session's own flags decide
        self.model: str | None = None  # what the events said (a local runtime's session table says more)
        self.window = 0
        self.seq = 0
        self.created = created
        self.context_tokens: int | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost: float | None = None
        self.cache_read_tokens = 0
        self.cache_saved: float | None = None  # what the cache saved, where the model's prices are known
        self.costs: CostSplit | None = None
        self.compactions = 0
        self.compacting = False
        self.turns = 0
        self.errors = 0
        self.last_error: str | None = None
        self.last_type: str | None = None
        self.last_ts: float | None = None
        self.title: str | None = None  # the session's first prompt (its start)

    def apply(self, event: ev.Event) -> None:
        if event.seq:
            self.seq = max(self.seq, event.seq)
        self.last_type, self.last_ts = event.type, event.ts
        match event:
            case ev.StatusUpdate(state=state):
                self.state = state
            case ev.SessionStarted(model=model, context_window=window, resumed=resumed):
                self.model, self.window = model, window
                if not resumed:
                    self.created = event.ts
            case ev.ModelChanged(model=model, context_window=window):
                self.model, self.window = model, window
            case ev.SessionHibernated():
                self.state = "parked"
            case ev.SessionDead(message=message):
                self.state, self.last_error = "dead", message
                self.errors += 1
            case ev.UsageUpdate(totals=totals, context_tokens=tokens, context_window=window):
                self.input_tokens, self.output_tokens = totals.input_tokens, totals.output_tokens
                self.cost = totals.cost
                self.cache_read_tokens = totals.cache_read_tokens
                self.costs = totals.costs
                self.cache_saved = totals.costs.saved if totals.costs is not None else None
                self.context_tokens = tokens
                self.window = window or self.window
            case ev.AgentEnd(context_tokens=tokens):  # (a failed turn's error event counted it)
                self.turns += 1
                if tokens:
                    self.context_tokens = tokens
            case ev.MessageAppended(preview=preview) if preview and self.title is None:
                self.title = preview
            case ev.CompactionStart():
                self.compacting = True
            case ev.CompactionEnd(tokens_after=after):
                self.compacting = False
                self.compactions += 1
                self.context_tokens = after
            case ev.CompactionFailed(error=error):
                self.compacting = False
                self.last_error = error
            case ev.CompactionSkipped():
                self.compacting = False
            case ev.ErrorOccurred(message=message):
                self.errors += 1
                self.last_error = message
            case _:
                pass


class SessionBoard:
    """Rows for the hosted sessions of ``runtime``, folded from its events on a subscription's thread.

    One board per runtime (:meth:`for_runtime`); it lives as long as the runtime's event bus.
    """

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.started = time.time()
        self._rows: dict[str, _Row] = {}
        self._lock = threading.Lock()
        self._subscription: Any = None

    @classmethod
    def for_runtime(cls, runtime: Any) -> SessionBoard:
        """The runtime's board, made and subscribed on first use (when the runtime is running)."""
        with _boards_lock:
            board = _boards.get(runtime)
            if board is None:
                board = _boards[runtime] = cls(runtime)
        board._subscribe()
        return board

    def _subscribe(self) -> None:
        with self._lock:
            if self._subscription is not None:
                if not getattr(self._subscription, "closed", False):
                    return
                # it ended: the runtime stopped, and its sessions with it (bulk=False below: its stop
                # tells no session_stopped of each idle session to the board)
                self._subscription = None
                self._rows.clear()
            if not getattr(self.runtime, "running", False):
                return
            self._subscription = self.runtime.subscribe(
                "*", STREAM_TYPES, callback=self._on_event, bulk=False
            )

    def close(self) -> None:
        with self._lock:
            if self._subscription is not None:
                self._subscription.close()

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.SubscriberLagged):
            return  # the rows' totals come back with the next usage_update; state with the next status
        sid = event.session_id
        with self._lock:
            if isinstance(event, ev.SessionStopped):
                self._rows.pop(sid, None)
                return
            row = self._rows.get(sid)
            if row is None:
                row = self._rows[sid] = _Row(None)
            row.apply(event)

    def snapshot(self) -> dict[str, Any]:
        """Every hosted session as the page shows it, and the event types to follow it with.

        Reads the runtime's session table and the rows; a session created before the board has no
        ``created`` time until its header is read (once, here: call it off the event loop).
        """
        self._subscribe()
        # a local Runtime's session table: model, window, config, parked
        hosting = getattr(self.runtime, "_hosting", None)
        if hosting is not None:
            hosted: list[tuple[str, Any]] = list(hosting.sessions.items())
        else:
            hosted = [(sid, None) for sid in self.runtime.hosted_sessions()]
        out = []
        unknown_created: list[tuple[str, _Row]] = []
        with self._lock:
            for sid, session in hosted:
                row = self._rows.get(sid)
                if row is None:
                    row = self._rows[sid] = _Row(None)
                if row.created is None:
                    unknown_created.append((sid, row))
                out.append(self._describe(sid, session, row))
        if unknown_created:
            self._read_created(unknown_created)
            created = {sid: row.created for sid, row in unknown_created}
            for item in out:
                if item["id"] in created:
                    item["created"] = created[item["id"]]
        return {"now": time.time(), "event_types": list(STREAM_TYPES), "sessions": out}

    def _describe(self, sid: str, session: Any, row: _Row) -> dict[str, Any]:
        if session is None:  # known from its events only
            model, window, config = row.model, row.window, self.runtime.config
            running, fresh, parent = row.state != "parked", row.seq == 0, None
        else:
            # (a parked session's spec is not rebuilt for the page: a million of them would stay rebuilt)
            spec = session.spec if getattr(session, "_spec", True) is not None else None
            model, window = session.model, session.context_window
            config = spec.config if spec is not None else self.runtime.config
            running, fresh = session.running, session.fresh
            parent = spec.parent[0] if spec is not None and getattr(spec, "parent", None) else None
        if row.state is not None and row.state != "parked":
            state = row.state
        elif not running:
            state = "new" if fresh else "parked"
        else:
            state = "idle"
        return {
            "id": sid,
            "model": model,
            "state": state,
            "compacting": row.compacting,
            "window": window,
            "threshold": compaction_threshold(window, config.compaction) if window else None,
            "context_tokens": row.context_tokens,
            "input_tokens": row.input_tokens,
            "output_tokens": row.output_tokens,
            "cost": row.cost,
            "cache_read_tokens": row.cache_read_tokens,
            "cache_hit": row.cache_read_tokens / row.input_tokens if row.input_tokens else None,
            "cache_saved": row.cache_saved,
            "costs": row.costs,
            "compactions": row.compactions,
            "turns": row.turns,
            "title": row.title,
            "errors": row.errors,
            "last_error": row.last_error,
            "last_type": row.last_type,
            "last_ts": row.last_ts,
            "created": row.created,
            "parent": parent,
            "seq": row.seq,
        }

    def _read_created(self, rows: list[tuple[str, _Row]]) -> None:
        services = getattr(self.runtime, "services", None)
        for sid, row in rows:
            try:
                header = services.directory.read_header(sid) if services is not None else None
            except Exception:  # a damaged log: the session is hosted anyway; its age counts from now
                header = None
            created = header.created_at if header is not None else self.started
            with self._lock:
                if row.created is None:
                    row.created = created


_boards: weakref.WeakKeyDictionary[Any, SessionBoard] = weakref.WeakKeyDictionary()  # one per runtime
_boards_lock = threading.Lock()
