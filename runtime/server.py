"""``agentcell serve``: the HTTP API and Server-Sent Events (SPEC 7.2).

Every request needs ``Authorization: Bearer <token>``. Binds 127.0.0.1 unless told otherwise.

    POST   /sessions                      {"model", "system_prompt", "session_id", "tools", "config", "api_base"}
    GET    /sessions                      stored sessions
    GET    /sessions/{id}                 one session: model, window, usage
    DELETE /sessions/{id}
    POST   /sessions/{id}/resume
    POST   /sessions/{id}/prompt          {"text", "wait": false}  → 202 {"prompt_id"} or 200 the result
    POST   /sessions/{id}/abort
    POST   /sessions/{id}/compact         {"keep_recent_tokens", "instructions"}
    GET    /sessions/{id}/context         the SPEC 4.6 breakdown
    GET    /sessions/{id}/messages?view=user|model
    GET    /events?session=a,b&type=x,y   Server-Sent Events; ``Last-Event-ID: <session>:<seq>`` resumes
                                          from the session's transcript
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from runtime import events as ev
from runtime.config import ConfigError
from runtime.host import Runtime, SessionNotFound
from runtime.ids import InvalidSessionId, validate_session_id

JSON = dict[str, Any]
HEARTBEAT_SECONDS = 15.0


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def create_app(runtime: Runtime, token: str) -> Any:
    """The Starlette application serving ``runtime``; every route requires ``token``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    expected = f"Bearer {token}".encode()

    def authorized(request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, expected)

    def endpoint(fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            if not authorized(request):
                return JSONResponse(
                    {"error": "missing or wrong bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            try:
                result = await fn(request)
            except HttpError as exc:
                return JSONResponse({"error": exc.message}, status_code=exc.status)
            except (SessionNotFound, FileNotFoundError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=404)
            except (InvalidSessionId, ConfigError, ValueError, TypeError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except TimeoutError as exc:
                return JSONResponse({"error": str(exc)}, status_code=504)
            if isinstance(result, Response):
                return result
            return Response(msgspec.json.encode(result), media_type="application/json")

        return wrapped

    async def body(request: Request) -> JSON:
        raw = await request.body()
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HttpError(400, "request body must be a JSON object")
        return data

    def sid(request: Request) -> str:
        return validate_session_id(request.path_params["session_id"])

    def hosted(session_id: str) -> str:
        if session_id not in runtime.hosted_sessions():
            if runtime.services.directory.exists(session_id):
                runtime.resume_session(session_id)
            else:
                raise SessionNotFound(f"no session {session_id!r}")
        return session_id

    def field(data: JSON, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = data.get(name, default)
        if value is not None and not isinstance(value, kind):
            expected_name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise HttpError(400, f"field {name!r} must be {expected_name}")
        return value

    async def create_session(request: Request) -> Response:
        data = await body(request)
        new = await asyncio.to_thread(
            runtime.start_session,
            field(data, "session_id", str),
            model=field(data, "model", str),
            system_prompt=field(data, "system_prompt", str, ""),
            tools=field(data, "tools", (str, list)),
            workspace=field(data, "workspace", str),
            config=field(data, "config", dict),
            api_base=field(data, "api_base", str),
        )
        return JSONResponse({"id": new}, status_code=201)

    async def list_sessions(request: Request) -> Any:
        return [msgspec.to_builtins(i) for i in await asyncio.to_thread(runtime.list_sessions)]

    async def get_session(request: Request) -> Any:
        session_id = hosted(sid(request))
        usage = await asyncio.to_thread(runtime.usage, session_id)
        session = runtime._session(session_id)
        return {
            "id": session_id,
            "model": session.spec.model,
            "context_window": session.context_window,
            "usage": msgspec.to_builtins(usage),
        }

    async def delete_session(request: Request) -> Any:
        session_id = sid(request)
        await asyncio.to_thread(runtime.delete_session, session_id)
        return {"deleted": session_id}

    async def resume(request: Request) -> Any:
        return {"id": await asyncio.to_thread(runtime.resume_session, sid(request))}

    async def prompt(request: Request) -> Any:
        session_id = hosted(sid(request))
        data = await body(request)
        text = field(data, "text", str)
        if not text:
            raise HttpError(400, "field 'text' is required")
        handle = runtime.prompt(session_id, text)
        if not field(data, "wait", bool, False):
            return JSONResponse({"prompt_id": handle.id}, status_code=202)
        result = await handle
        return msgspec.to_builtins(result)

    async def abort(request: Request) -> Any:
        aborted = await runtime.abort(hosted(sid(request)))
        return {"aborted": aborted}

    async def compact(request: Request) -> Any:
        session_id = hosted(sid(request))
        data = await body(request)
        result = await runtime.compact(
            session_id,
            keep_recent_tokens=field(data, "keep_recent_tokens", int),
            instructions=field(data, "instructions", str),
        )
        return msgspec.to_builtins(result)

    async def context(request: Request) -> Any:
        stats = await asyncio.to_thread(runtime.context_stats, hosted(sid(request)))
        return msgspec.to_builtins(stats)

    async def messages(request: Request) -> Any:
        view = request.query_params.get("view", "user")
        found = await asyncio.to_thread(runtime.messages, hosted(sid(request)), view=view)
        return [msgspec.to_builtins(m) for m in found]

    async def events(request: Request) -> Response:
        sessions_param = request.query_params.get("session")
        types_param = request.query_params.get("type")
        sessions: Any = "*"
        if sessions_param:
            sessions = [validate_session_id(s) for s in sessions_param.split(",") if s]
        types = [t for t in types_param.split(",") if t] if types_param else None
        resume_from = _parse_last_event_id(request.headers.get("last-event-id"))
        subscription = runtime.subscribe(sessions, types)
        backlog: list[ev.Event] = []
        if resume_from is not None:
            last_sid, last_seq = resume_from
            if sessions == "*" or last_sid in sessions:
                from runtime.store.transcript import read_transcript

                path = runtime.services.directory.transcript_path(last_sid)
                backlog = await asyncio.to_thread(read_transcript, path, last_seq)
                if types:
                    backlog = [e for e in backlog if e.type in types]
        return StreamingResponse(
            _sse(subscription, backlog, resume_from),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/sessions", endpoint(create_session), methods=["POST"]),
        Route("/sessions", endpoint(list_sessions), methods=["GET"]),
        Route("/sessions/{session_id}", endpoint(get_session), methods=["GET"]),
        Route("/sessions/{session_id}", endpoint(delete_session), methods=["DELETE"]),
        Route("/sessions/{session_id}/resume", endpoint(resume), methods=["POST"]),
        Route("/sessions/{session_id}/prompt", endpoint(prompt), methods=["POST"]),
        Route("/sessions/{session_id}/abort", endpoint(abort), methods=["POST"]),
        Route("/sessions/{session_id}/compact", endpoint(compact), methods=["POST"]),
        Route("/sessions/{session_id}/context", endpoint(context), methods=["GET"]),
        Route("/sessions/{session_id}/messages", endpoint(messages), methods=["GET"]),
        Route("/events", endpoint(events), methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse({"error": getattr(exc, "detail", "not found")}, status_code=status)

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


def _parse_last_event_id(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    session_id, _, seq = value.rpartition(":")
    try:
        return validate_session_id(session_id), int(seq)
    except (InvalidSessionId, ValueError):
        raise HttpError(400, "Last-Event-ID must look like '<session id>:<seq>'") from None


def _frame(event: ev.Event) -> bytes:
    data = ev.encode_event(event).decode()
    return f"id: {event.session_id}:{event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


async def _sse(subscription: Any, backlog: list[ev.Event], resume_from: tuple[str, int] | None) -> AsyncIterator[bytes]:
    sent: dict[str, int] = {}
    if resume_from is not None:
        sent[resume_from[0]] = resume_from[1]
    try:
        yield b": connected\n\n"
        for event in backlog:
            sent[event.session_id] = event.seq
            yield _frame(event)
        iterator = subscription.__aiter__()
        while True:
            try:
                event = await asyncio.wait_for(iterator.__anext__(), HEARTBEAT_SECONDS)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            except StopAsyncIteration:
                return
            if event.seq and event.seq <= sent.get(event.session_id, 0):
                continue  # already sent from the transcript
            yield _frame(event)
    finally:
        subscription.close()


def run_server(
    *, host: str | None = None, port: int | None = None, token: str | None = None, config_path: str | None = None
) -> int:
    import uvicorn

    from runtime.config import load_config

    cfg = load_config(config_path)
    token = token or cfg.server.token
    if not token:
        token = secrets.token_urlsafe(24)
        print(f"agentcell serve: generated bearer token: {token}", file=sys.stderr, flush=True)
    bind_host = host or cfg.server.host
    bind_port = cfg.server.port if port is None else port
    with Runtime(cfg) as rt:
        app = create_app(rt, token)
        print(f"agentcell serve: listening on http://{bind_host}:{bind_port}", file=sys.stderr, flush=True)
        uvicorn.run(app, host=bind_host, port=bind_port, log_level="warning")
    return 0
