"""The events of ``agentcell serve`` as Server-Sent Events (``GET /events``, design §7.2): cursors, frames, the
replay from transcripts and the live stream.

Each event is a frame with ``event: <type>``, ``data: <the event as JSON>`` and an ``id`` that is a cursor,
``session:seq`` for every session the stream covers (``a:12,b:7``); a client that reconnects with it
(``Last-Event-ID``) first gets what it missed, replayed from each session's transcript.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from runtime import events as ev
from runtime.apps.server.bodies import HttpError
from runtime.errors import SessionNotFound
from runtime.ids import InvalidSessionId, validate_session_id
from runtime.served import served

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from runtime.apps import AnyRuntime

__all__ = [
    "HEARTBEAT_SECONDS",
    "MAX_CURSOR_SESSIONS",
    "advance",
    "events_endpoint",
    "format_cursor",
    "parse_cursor",
]

HEARTBEAT_SECONDS = 15.0
"""An SSE comment is sent after this long without events, so proxies and clients keep the stream."""
MAX_CURSOR_SESSIONS = 256
"""The most sessions an event stream covers in its cursor (and a ``session`` filter may name)."""


def parse_cursor(value: str) -> dict[str, int]:
    """``"a:12,b:7"`` → ``{"a": 12, "b": 7}``; raises :class:`HttpError` (400) for anything else."""
    cursor: dict[str, int] = {}
    if value.count(",") >= MAX_CURSOR_SESSIONS:
        raise HttpError(400, f"Last-Event-ID names more than {MAX_CURSOR_SESSIONS} sessions")
    for part in value.split(","):
        session_id, _, seq = part.strip().rpartition(":")
        try:
            cursor[validate_session_id(session_id)] = int(seq)
        except (InvalidSessionId, ValueError):
            raise HttpError(
                400, "Last-Event-ID must look like '<session id>:<seq>[,<session id>:<seq>...]'"
            ) from None
        if cursor[session_id] < 0:
            raise HttpError(400, "Last-Event-ID: a seq is never negative")
    return cursor


def format_cursor(cursor: dict[str, int]) -> str:
    return ",".join(f"{sid}:{seq}" for sid, seq in cursor.items())


def _frame(event: ev.Event, cursor: dict[str, int]) -> bytes:
    data = ev.encode_event(event).decode()
    return f"id: {format_cursor(cursor)}\nevent: {event.type}\ndata: {data}\n\n".encode()


def advance(cursor: dict[str, int], session_id: str, seq: int) -> None:
    """Move the session's place in ``cursor`` to ``seq``; the cursor keeps the sessions most recently
    moved, at most :data:`MAX_CURSOR_SESSIONS` (an event id names every session of it)."""
    cursor.pop(session_id, None)
    cursor[session_id] = seq
    if len(cursor) > MAX_CURSOR_SESSIONS:
        del cursor[next(iter(cursor))]


async def _event_stream(
    subscription: Any,
    backlog: list[ev.Event],
    cursor: dict[str, int],
    stopping: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """The SSE body: the replayed backlog, then live events not already sent, with keep-alives."""
    try:
        yield (f"id: {format_cursor(cursor)}\n" if cursor else "").encode() + b": connected\n\n"
        for event in backlog:
            advance(cursor, event.session_id, event.seq)
            yield _frame(event, cursor)
        iterator = subscription.__aiter__()
        idle = 0.0
        while not stopping():
            try:
                async with asyncio.timeout(1.0):  # not wait_for: a task per event, and it may drop a cancel
                    event = await iterator.__anext__()
            except TimeoutError:
                idle += 1.0
                if idle >= HEARTBEAT_SECONDS:
                    idle = 0.0
                    yield b": keep-alive\n\n"
                continue
            except StopAsyncIteration:
                return
            idle = 0.0
            if event.seq and event.seq <= cursor.get(event.session_id, 0):
                continue  # replayed from the transcript already
            if event.seq:
                advance(cursor, event.session_id, event.seq)
            yield _frame(event, cursor)
    finally:
        subscription.close()


def _replay(
    runtime: AnyRuntime,
    sessions: list[str] | None,
    types: Iterable[str] | None,
    resume: dict[str, int] | None,
) -> tuple[dict[str, int], list[ev.Event]]:
    """The stream's starting cursor, and the events to replay from the transcripts before live ones.

    Without ``resume`` the stream starts now: each filtered session at its current position, nothing
    replayed. With it, each session of the cursor (that the filter lets through) replays from where the
    cursor says, and a filtered session missing from the cursor from its beginning.
    """
    view = served(runtime)
    if resume is None:
        return ({sid: view.last_seq(sid) for sid in sessions} if sessions else {}), []
    cursor = {  # sessions of the cursor that exist and that the stream covers; made-up ones are dropped
        sid: seq
        for sid, seq in resume.items()
        if (sessions is None or sid in sessions) and (view.is_hosted(sid) or view.is_stored(sid))
    }
    for sid in sessions or ():
        cursor.setdefault(sid, 0)
    backlog: list[ev.Event] = []
    for sid, seq in cursor.items():  # (replay first writes what was published before we subscribed)
        backlog.extend(view.replay(sid, seq, types))
    return cursor, backlog


def events_endpoint(
    runtime: AnyRuntime, stopping: Callable[[], bool]
) -> Callable[[Request], Awaitable[Response]]:
    """``GET /events``: the stream of ``runtime``'s events, filtered and resumed as the request says; open
    streams end once ``stopping()`` says so."""
    from starlette.responses import StreamingResponse

    async def events(request: Request) -> Response:
        params = request.query_params
        sessions: list[str] | None = None
        if params.get("session"):
            sessions = [validate_session_id(s.strip()) for s in params["session"].split(",") if s.strip()]
            if len(sessions) > MAX_CURSOR_SESSIONS:
                raise HttpError(
                    400, f"a stream covers at most {MAX_CURSOR_SESSIONS} sessions; omit 'session' for all"
                )
            view = served(runtime)
            unknown = [s for s in sessions if not view.is_hosted(s) and not view.is_stored(s)]
            if unknown:
                raise SessionNotFound(f"no session {', '.join(map(repr, unknown))}")
        types = [t.strip() for t in params["type"].split(",") if t.strip()] if params.get("type") else None
        last_id = request.headers.get("last-event-id") or params.get("last_event_id")
        resume = parse_cursor(last_id) if last_id else None
        # first: nothing published from now is missed (off the loop: a cluster asks every shard)
        subscription = await asyncio.to_thread(runtime.subscribe, sessions or "*", types)
        try:
            cursor, backlog = await asyncio.to_thread(_replay, runtime, sessions, types, resume)
        except BaseException:
            subscription.close()
            raise
        return StreamingResponse(
            _event_stream(subscription, backlog, cursor, stopping),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return events
