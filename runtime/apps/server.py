"""``agentcell serve``: the Runtime over HTTP, and its events as Server-Sent Events (design §7.2).

Every request needs ``Authorization: Bearer <token>`` (the scheme in any case). The server binds 127.0.0.1
unless told otherwise. Bodies are JSON objects of at most ``server.max_body_bytes`` (4 MiB; 413 beyond,
judged from ``Content-Length`` before anything is read, or while the body streams in); unknown fields,
wrong types, malformed or too deeply nested JSON are answered with 400 and a message naming the problem; an
unknown session with 404; what the server's policy forbids with 403; errors always as ``{"error": "..."}``.

The policy (:class:`ServerPolicy`, from ``server.*``): a session's workspace must lie under
``server.workspace_root`` (a relative one is taken relative to it; without a root, sessions get no
workspace), a session may turn the shell tool on only when ``server.allow_shell`` is set, a session's
``config`` holds per-session keys only (see :data:`runtime.config.SESSION_KEYS`), and a session may name an
``api_base`` only with an ``api_key`` of its own, unless ``server.allow_api_base`` is set (else the
server's own provider keys would go to the client's URL), and may start MCP servers over stdio (commands)
only when ``server.allow_mcp_commands`` is set, and at URLs only where ``server.mcp_allowed_urls`` allows
(never with ``${VAR}`` from the server's environment, never at an internal address the list does not name:
:mod:`runtime.apps.client_mcp`). A stored session is resumed only if its workspace, config, endpoint and
MCP servers pass the same policy. With ``server.tenants_file`` the token is the admin's and tenants have
their own (:mod:`runtime.apps.tenant_gate`: each sees only what it created; quotas; ``/usage``, ``/audit``).

    POST   /sessions                     {"session_id", "model", "system_prompt", "tools": "builtin",
                                          "workspace", "config", "api_base", "api_key",
                                          "agents": {name: profile}, "mcp_servers": {name: server}} → 201
    GET    /sessions                     the stored sessions, newest first
    GET    /sessions/{id}                one session: model, window, usage totals
    DELETE /sessions/{id}                stop it and delete its files
    POST   /sessions/{id}/resume         {"api_key", "api_base", "tools", "workspace", "mcp_servers"}: host a stored
                                         session (any other call resumes it too, without a key)
    POST   /sessions/{id}/prompt         {"text", "images", "wait": false, "steer": false} → 202 {"prompt_id"},
                                         or with "wait": true → 200 the turn's result
    POST   /sessions/{id}/abort          → {"aborted": true|false}
    POST   /sessions/{id}/compact        {"keep_recent_tokens", "instructions"} → what it did
    GET    /sessions/{id}/context        the context breakdown of design §4.6
    GET    /sessions/{id}/messages       ?view=user|model&offset=&limit=  (paged from the newest)
    POST   /sessions/{id}/branch         {"leaf_id": "<message id>" | null}
    POST   /sessions/{id}/model          {"model"} → {"model", "context_window"}
    GET    /events                       Server-Sent Events; ?session=a,b&type=x,y filter them
    GET    /overview                     every hosted session at a glance (the dashboard's table)
    GET    /metrics                      Prometheus metrics (runtime/observability/metrics.py); without
                                         the token too with server.metrics_public (--metrics-public)
    *      /v1/responses, /v1/conversations  the OpenAI Responses API (runtime/apps/responses), on a local
                                         Runtime; errors under /v1/ in the API's shape
    GET    /                             the live dashboard (runtime/apps/dashboard): its files need no token
    GET    /healthz, /readyz             alive; ready to take turns (503 while draining): no token needed

On SIGTERM or SIGINT ``agentcell serve`` drains (runtime/apps/drain.py): new turns get 503 with
``Retry-After``, running ones get ``server.drain_timeout`` to finish, then the rest are aborted; exit 0.

A stored session that this server does not host yet is resumed on first use. Each SSE event carries
``event: <type>``, ``data: <the event as JSON>`` and an ``id`` that is a cursor: ``session:seq`` for
every session of the stream (``a:12,b:7``). Reconnecting with it in ``Last-Event-ID`` (or the
``last_event_id`` query parameter) first replays, from each session's transcript, what came after it.
In a stream of all sessions (no ``session`` filter) the cursor covers the sessions the stream has most
recently delivered events of, at most :data:`MAX_CURSOR_SESSIONS`; a ``Last-Event-ID`` may name at most as
many, and its sessions that do not exist or that the stream does not cover are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from runtime import events as ev
from runtime.apps import LOCAL_API_KEY, LOCAL_MODEL, serve_log
from runtime.apps.connections import guarded_protocol
from runtime.apps.dashboard import DashboardFiles, SessionBoard
from runtime.apps.drain import Drain, DrainGate
from runtime.config import AgentProfile, Config, ConfigError, McpServerConfig, ServerConfig
from runtime.errors import AgentcellError
from runtime.host import Runtime, RuntimeStopped, SessionNotFound
from runtime.ids import InvalidSessionId, validate_session_id
from runtime.served import served
from runtime.store.log import CorruptLogError
from runtime.tools.mcp.servers import parse_servers, restored

if TYPE_CHECKING:
    from runtime.apps import AnyRuntime

log = logging.getLogger("agentcell.server")

HEARTBEAT_SECONDS = 15.0
"""An SSE comment is sent after this long without events, so proxies and clients keep the stream."""
MAX_CURSOR_SESSIONS = 256
"""The most sessions an event stream covers in its cursor (and a ``session`` filter may name)."""


class ServerPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the clients of a server may ask for (design §9): it is the host's, not theirs.

    ``workspace_root``: session workspaces must lie under it (None: sessions get no workspace).
    ``allow_shell``: a session's config may turn the shell tool on (``agent.shell_enabled``); with the
    shell on in the server's own config, every session has it anyway.
    ``allow_api_base``: a session may name an ``api_base`` without an ``api_key`` of its own. Without a key,
    litellm (and the native transport, which reads keys where litellm does) sends the provider key from the
    server's environment to that URL: allow it only when every token holder may have that key.
    ``allow_mcp_commands``: a session may start MCP servers over stdio, i.e. run a command of its choosing on
    the server's machine (the runtime's own ``[mcp.servers]`` are always allowed).
    ``mcp_allowed_urls``: the URLs a session's MCP servers may have (see :mod:`runtime.apps.client_mcp`:
    never ``${NAME}`` from the server's environment, never an internal address the list does not name).
    ``local_provider``: the URL of the built-in local provider (``serve --local``): a session that names no
    ``api_base`` runs against it (with its key), new sessions and resumed ones alike.
    """

    workspace_root: str | None = None
    allow_shell: bool = False
    allow_api_base: bool = False
    allow_mcp_commands: bool = False
    mcp_allowed_urls: tuple[str, ...] = ()
    api_base_allowed_urls: tuple[str, ...] = ("*",)
    api_base_private: bool = True
    local_provider: str | None = None

    def endpoint(self, api_base: str | None, api_key: str | None) -> tuple[str | None, str | None]:
        """The ``api_base`` and ``api_key`` a session runs with: the local provider's when the server has
        one and the request names no ``api_base``; else the request's."""
        if self.local_provider is not None and api_base is None:
            return self.local_provider, api_key or LOCAL_API_KEY
        return api_base, api_key

    @classmethod
    def from_config(cls, server: ServerConfig) -> ServerPolicy:
        root = server.workspace_root
        if root is not None:
            resolved = Path(root).expanduser().resolve()
            if not resolved.is_dir():
                raise ConfigError(f"invalid config: server.workspace_root: {resolved} is not a directory")
            root = str(resolved)
        return cls(
            workspace_root=root,
            allow_shell=server.allow_shell,
            allow_api_base=server.allow_api_base,
            allow_mcp_commands=server.allow_mcp_commands,
            mcp_allowed_urls=tuple(server.mcp_allowed_urls),
            api_base_allowed_urls=tuple(server.api_base_allowed_urls),
            api_base_private=server.api_base_private,
        )

    def workspace(self, requested: str | None) -> str | None:
        """The real workspace for a requested one (relative: under the root); 403 if the policy forbids it."""
        if requested is None:
            return None
        if self.workspace_root is None:
            raise HttpError(
                403,
                "this server gives sessions no workspace (its operator can allow workspaces under a "
                "directory with server.workspace_root or --workspace-root)",
            )
        root = Path(self.workspace_root)
        if "\x00" in requested:
            raise HttpError(400, "workspace: the path contains a NUL byte")
        real = (root / Path(requested).expanduser()).resolve()
        if real != root and not real.is_relative_to(root):
            raise HttpError(403, f"workspace {requested!r} is outside this server's workspace root ({root})")
        return str(real)

    def check_config(self, config: Config, runtime: Config) -> None:
        """403 when a session's effective ``config`` asks for more than the ``runtime``'s and the policy allow."""
        if config.agent.shell_enabled and not runtime.agent.shell_enabled and not self.allow_shell:
            raise HttpError(
                403,
                "agent.shell_enabled: this server does not let sessions run shell commands "
                "(its operator can allow it with server.allow_shell or --allow-shell)",
            )

    def check_mcp(
        self, servers: Mapping[str, McpServerConfig], runtime: Config
    ) -> dict[str, McpServerConfig]:
        """A client's MCP servers as its session gets them (``${NAME}`` never expanded, internal addresses
        refused: :func:`runtime.apps.client_mcp.client_server`); 403 for one the policy does not allow. The
        runtime's own servers (``[mcp.servers]``) are the operator's and always allowed. Blocking (DNS)."""
        from runtime.apps.client_mcp import client_server
        from runtime.outbound import resolve

        out: dict[str, McpServerConfig] = {}
        for name, server in servers.items():
            vetted = client_server(
                name,
                server,
                own=runtime.mcp.servers,
                allowed=self.mcp_allowed_urls,
                allow_commands=self.allow_mcp_commands,
                resolve=resolve,
            )
            if isinstance(vetted, str):
                raise HttpError(403, vetted)
            out[name] = vetted
        return out

    def check_api_base(
        self, api_base: str | None, api_key: str | None, session_id: str | None = None
    ) -> None:
        """403 when a session would run against ``api_base`` on the server's own provider keys."""
        if api_base is None or (api_key and api_key.strip()) or self.allow_api_base:
            return
        resume = (
            f'; resume it with its key (POST /sessions/{session_id}/resume {{"api_key": ...}})'
            if session_id is not None
            else ""
        )
        raise HttpError(
            403,
            "api_base: this server sends its own provider keys only to the endpoints its operator chose; "
            f"give your own api_key with an api_base{resume} (the operator can allow any api_base with "
            "server.allow_api_base or --allow-api-base)",
        )

    def check_endpoint(self, api_base: str | None) -> None:
        """403 unless a client's ``api_base`` is one ``server.api_base_allowed_urls`` allows, at a public
        address (or, with ``api_base_private``, a loopback or private one) unless the list names its host
        (:mod:`runtime.outbound`): never a cloud metadata service on a client's say-so. Blocking (DNS)."""
        if api_base is None:
            return
        from runtime.apps.client_mcp import endpoint_refusal
        from runtime.outbound import resolve

        tolerate = frozenset({"loopback", "private"}) if self.api_base_private else frozenset()
        setting = "server.api_base_allowed_urls"
        why = endpoint_refusal(
            "api_base", api_base, self.api_base_allowed_urls, setting, resolve, tolerate=tolerate
        )
        if why is not None:
            raise HttpError(403, why)

    def check_stored(
        self,
        runtime: AnyRuntime,
        session_id: str,
        workspace: str | None,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
    ) -> str | None:
        """Check a stored session against the policy before it is resumed; the workspace to resume it with
        (``workspace`` if the request names one, else the one it was stored with). ``api_base`` and
        ``api_key`` are the request's: a session stored with an endpoint needs a key to be resumed."""
        header = served(runtime).stored_header(session_id)
        if header is None:
            raise SessionNotFound(f"no session {session_id!r}")
        self.check_config(runtime.config.with_overrides(header.config), runtime.config)
        self.check_api_base(api_base if api_base is not None else header.api_base, api_key, session_id)
        self.check_endpoint(api_base)
        # a client's server (expand_env off) is checked as if given now, and so is one stored before servers
        # said whose they were (no expand_env: it may be a client's); the host's own for commands only
        stored = restored(header.mcp_servers)
        unsure = {k for k, v in header.mcp_servers.items() if isinstance(v, dict) and "expand_env" not in v}
        checked = {
            k: v for k, v in stored.items() if not v.expand_env or v.command is not None or k in unsure
        }
        self.check_mcp(checked, runtime.config)
        if workspace is not None:
            return self.workspace(workspace)
        if header.workspace is not None:
            self.workspace(header.workspace)
        return None


# -- request bodies ---------------------------------------------------------------------------------------


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CreateSession(_Body, frozen=True):
    session_id: str | None = None
    model: str | None = None
    system_prompt: str = ""
    tools: Literal["builtin"] | list[str] | None = None
    workspace: str | None = None
    config: dict[str, Any] | None = None
    api_base: str | None = None
    api_key: str | None = None
    agents: dict[str, AgentProfile] | None = None  # sub-agent profiles: the session gets the agent tool
    mcp_servers: dict[str, Any] | list[str] | None = None  # MCP servers (design §3.9): name -> settings


class PromptBody(_Body, frozen=True):
    text: str
    images: list[str] = msgspec.field(default_factory=list)
    wait: bool = False
    steer: bool = False  # join the running turn at its next step boundary instead of queueing


class CompactBody(_Body, frozen=True):
    keep_recent_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    instructions: str | None = None


class ResumeBody(_Body, frozen=True):
    api_key: str | None = None
    api_base: str | None = None
    tools: Literal["builtin"] | list[str] | None = None
    workspace: str | None = None
    repair: Literal["truncate"] | None = None  # open a corrupt log up to its last good entry
    mcp_servers: dict[str, Any] | list[str] | None = None  # add to (or replace) its stored MCP servers


class BranchBody(_Body, frozen=True):
    leaf_id: str | None


class ModelBody(_Body, frozen=True):
    model: str  # checked by Runtime.set_model (runtime.models.validate_model_name)


class HttpError(AgentcellError):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _int_param(request: Any, name: str, default: int | None) -> int | None:
    """A query parameter that must be a whole number >= 0 (``default`` when absent); 400 otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise HttpError(400, f"{name} must be a whole number >= 0")
    return int(raw)


def _decode(raw: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise HttpError(400, f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HttpError(400, "the request body is nested too deeply") from None


# -- SSE cursors ------------------------------------------------------------------------------------------


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


def _advance(cursor: dict[str, int], session_id: str, seq: int) -> None:
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
            _advance(cursor, event.session_id, event.seq)
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
                _advance(cursor, event.session_id, event.seq)
            yield _frame(event, cursor)
    finally:
        subscription.close()


# -- the application --------------------------------------------------------------------------------------


def create_app(
    runtime: AnyRuntime,
    token: str,
    *,
    stopping: Callable[[], bool] | None = None,
    policy: ServerPolicy | None = None,
    max_body_bytes: int | None = None,
    metrics_public: bool | None = None,
    drain: Drain | None = None,
) -> Any:
    """The Starlette application serving ``runtime`` (a ``Runtime`` or a ``ClusterRuntime``); every route
    requires ``token`` (``/metrics`` too, unless ``metrics_public``).

    ``stopping`` tells open event streams to end (the server is shutting down); with ``drain``, the
    application answers ``/healthz`` and ``/readyz`` and refuses new turns while draining
    (:mod:`runtime.apps.drain`). ``policy``,
    ``max_body_bytes`` and ``metrics_public`` default to the runtime's ``server.*`` settings.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from runtime.observability.metrics import MetricsUnavailable, ServedMetrics

    if not token:
        raise ValueError("the server needs a bearer token")
    is_stopping = stopping or (lambda: False)
    policy = policy if policy is not None else ServerPolicy.from_config(runtime.config.server)
    limit = max_body_bytes if max_body_bytes is not None else runtime.config.server.max_body_bytes
    if metrics_public is None:
        metrics_public = runtime.config.server.metrics_public
    metrics = ServedMetrics(runtime)  # counting from now on
    Handler = Callable[[Request], Awaitable[Any]]

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def endpoint(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                result = await fn(request)
            except HttpError as exc:
                return error(exc.status, exc.message)
            except ClientDisconnect:  # it went away while we read its body: nobody is left to answer
                log.debug("%s %s: the client disconnected", request.method, request.url.path)
                return Response(status_code=499)
            except SessionNotFound as exc:
                return error(404, str(exc))
            except (InvalidSessionId, ConfigError) as exc:
                return error(400, str(exc))
            except CorruptLogError as exc:
                return error(409, f"the session's log is corrupt: {exc}")
            except RuntimeStopped as exc:
                return error(503, str(exc))
            except TimeoutError as exc:
                return error(504, str(exc) or "timed out")
            except Exception as exc:
                from runtime.store.sessions import SessionLockedError

                if isinstance(exc, SessionLockedError):
                    return error(409, str(exc))
                if isinstance(exc, ValueError):
                    return error(400, str(exc))
                log.exception("%s %s failed", request.method, request.url.path)
                return error(500, f"internal error: {type(exc).__name__}: {exc}")
            if isinstance(result, Response):
                return result
            return Response(msgspec.json.encode(result), media_type="application/json")

        return wrapped

    resuming = asyncio.Lock()  # one resume at a time: two first requests must not both resume a session

    async def hosted(request: Request) -> str:
        """The path's session id, hosted by this runtime (a stored one is resumed); else 404."""
        return await ensure_hosted(validate_session_id(request.path_params["session_id"]))

    async def ensure_hosted(session_id: str) -> str:
        """``session_id``, hosted by this runtime (a stored one is resumed under the policy); else 404."""
        if _is_hosted(runtime, session_id):
            return session_id
        async with resuming:
            if _is_hosted(runtime, session_id):
                return session_id
            if not await asyncio.to_thread(_is_stored, runtime, session_id):
                raise SessionNotFound(f"no session {session_id!r}")
            api_base, api_key = policy.endpoint(None, None)
            workspace = await asyncio.to_thread(
                policy.check_stored, runtime, session_id, None, api_base=api_base, api_key=api_key
            )
            await asyncio.to_thread(
                runtime.resume_session, session_id, workspace=workspace, api_base=api_base, api_key=api_key
            )
        return session_id

    async def create_session(request: Request) -> Response:
        body: CreateSession = _decode(await request.body(), CreateSession)
        if body.session_id is not None:
            validate_session_id(body.session_id)
            if _is_hosted(runtime, body.session_id) or _is_stored(runtime, body.session_id):
                raise HttpError(409, f"session {body.session_id!r} already exists")
        api_base, api_key = policy.endpoint(body.api_base, body.api_key)
        policy.check_api_base(api_base, api_key)
        await asyncio.to_thread(policy.check_endpoint, body.api_base)  # (a client's, not the local one)
        policy.check_config(runtime.config.for_session(body.config), runtime.config)
        mcp_servers = await asyncio.to_thread(
            policy.check_mcp, parse_servers(body.mcp_servers), runtime.config
        )
        for profile in (body.agents or {}).values():  # a child runs under the same policy as its parent
            policy.check_config(
                runtime.config.for_session({**(body.config or {}), **profile.config}), runtime.config
            )
        new = await asyncio.to_thread(
            runtime.start_session,
            body.session_id,
            model=body.model,
            system_prompt=body.system_prompt,
            tools=_tools(body.tools, runtime),
            workspace=policy.workspace(body.workspace),
            config=body.config,
            api_base=api_base,
            api_key=api_key,
            agents=body.agents,
            mcp_servers=mcp_servers,
        )
        session = await asyncio.to_thread(served(runtime).session_summary, new)
        payload = {"id": new, "model": session.model, "context_window": session.context_window}
        return JSONResponse(payload, status_code=201)

    async def list_sessions(request: Request) -> Any:
        hosted_ids = set(runtime.hosted_sessions())
        infos = await asyncio.to_thread(runtime.list_sessions)
        return {"sessions": [{**msgspec.to_builtins(i), "hosted": i.id in hosted_ids} for i in infos]}

    async def get_session(request: Request) -> Any:
        session_id = await hosted(request)
        usage = await asyncio.to_thread(runtime.usage, session_id)
        session = await asyncio.to_thread(served(runtime).session_summary, session_id)
        return {
            "id": session_id,
            "model": session.model,
            "context_window": session.context_window,
            "running": session.running,
            "usage": msgspec.to_builtins(usage),
        }

    async def delete_session(request: Request) -> Any:
        session_id = validate_session_id(request.path_params["session_id"])
        await asyncio.to_thread(runtime.delete_session, session_id)
        return {"deleted": session_id}

    async def resume(request: Request) -> Any:
        session_id = validate_session_id(request.path_params["session_id"])
        body: ResumeBody = _decode(await request.body(), ResumeBody)
        if _is_hosted(runtime, session_id):
            raise HttpError(409, f"session {session_id!r} is already running")
        mcp_servers = await asyncio.to_thread(
            policy.check_mcp, parse_servers(body.mcp_servers), runtime.config
        )
        api_base, api_key = policy.endpoint(body.api_base, body.api_key)
        workspace = await asyncio.to_thread(
            policy.check_stored,
            runtime,
            session_id,
            body.workspace,
            api_base=api_base,
            api_key=api_key,
        )
        await asyncio.to_thread(
            runtime.resume_session,
            session_id,
            tools=_tools(body.tools, runtime),
            workspace=workspace,
            api_key=api_key,
            api_base=api_base,
            repair=body.repair,
            mcp_servers=mcp_servers,
        )
        session = await asyncio.to_thread(served(runtime).session_summary, session_id)
        return {"id": session_id, "model": session.model, "context_window": session.context_window}

    async def prompt(request: Request) -> Any:
        session_id = await hosted(request)
        body: PromptBody = _decode(await request.body(), PromptBody)
        handle = runtime.prompt(session_id, body.text, images=body.images, steer=body.steer)
        if not body.wait:
            return JSONResponse({"prompt_id": handle.id}, status_code=202)
        return msgspec.to_builtins(await handle)

    async def abort(request: Request) -> Any:
        session_id = validate_session_id(request.path_params["session_id"])
        if not _is_hosted(runtime, session_id):  # a session this server does not host runs no turn
            if not await asyncio.to_thread(_is_stored, runtime, session_id):
                raise SessionNotFound(f"no session {session_id!r}")
            return {"aborted": False}
        return {"aborted": await runtime.abort(session_id)}

    async def compact(request: Request) -> Any:
        session_id = await hosted(request)
        body: CompactBody = _decode(await request.body(), CompactBody)
        handle = runtime.compact(
            session_id, keep_recent_tokens=body.keep_recent_tokens, instructions=body.instructions
        )
        return msgspec.to_builtins(await handle)

    async def context(request: Request) -> Any:
        stats = await asyncio.to_thread(runtime.context_stats, await hosted(request))
        return msgspec.to_builtins(stats)

    async def messages(request: Request) -> Any:
        session_id = await hosted(request)
        view = request.query_params.get("view", "user")
        if view not in ("user", "model"):
            raise HttpError(400, "view must be 'user' or 'model'")
        offset, limit = _int_param(request, "offset", 0) or 0, _int_param(request, "limit", None)

        def read() -> tuple[list[Any], int]:
            found = runtime.messages(session_id, view=view, offset=offset, limit=limit)
            total = (
                len(found) if limit is None and offset == 0 else runtime.message_count(session_id, view=view)
            )
            return found, total

        found, total = await asyncio.to_thread(read)
        return {"messages": [msgspec.to_builtins(m) for m in found], "total": total}

    async def branch(request: Request) -> Any:
        session_id = await hosted(request)
        body: BranchBody = _decode(await request.body(), BranchBody)
        await asyncio.to_thread(runtime.branch, session_id, body.leaf_id)
        return {"leaf_id": body.leaf_id}

    async def set_model(request: Request) -> Any:
        session_id = await hosted(request)
        body: ModelBody = _decode(await request.body(), ModelBody)
        window = await asyncio.to_thread(runtime.set_model, session_id, body.model)
        return {"model": body.model, "context_window": window}

    board = SessionBoard.for_runtime(runtime)

    async def overview(request: Request) -> Any:
        return await asyncio.to_thread(board.snapshot)

    async def metrics_text(request: Request) -> Any:
        try:
            body, content_type = await asyncio.to_thread(metrics.exposition)
        except MetricsUnavailable as exc:
            raise HttpError(503, str(exc)) from None
        return Response(body, media_type=content_type)

    async def events(request: Request) -> Response:
        params = request.query_params
        sessions: list[str] | None = None
        if params.get("session"):
            sessions = [validate_session_id(s.strip()) for s in params["session"].split(",") if s.strip()]
            if len(sessions) > MAX_CURSOR_SESSIONS:
                raise HttpError(
                    400, f"a stream covers at most {MAX_CURSOR_SESSIONS} sessions; omit 'session' for all"
                )
            unknown = [s for s in sessions if not _is_hosted(runtime, s) and not _is_stored(runtime, s)]
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
            _event_stream(subscription, backlog, cursor, is_stopping),
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
        Route("/sessions/{session_id}/branch", endpoint(branch), methods=["POST"]),
        Route("/sessions/{session_id}/model", endpoint(set_model), methods=["POST"]),
        Route("/events", endpoint(events), methods=["GET"]),
        Route("/overview", endpoint(overview), methods=["GET"]),
        Route("/metrics", endpoint(metrics_text), methods=["GET"]),
    ]
    if isinstance(runtime, Runtime):  # the OpenAI Responses API (runtime/apps/responses)
        from runtime.apps.responses import responses_routes

        def check_config(config: dict[str, Any]) -> None:
            policy.check_config(runtime.config.for_session(config), runtime.config)

        routes += responses_routes(runtime, ensure_hosted, check_config)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = "no such route" if exc.status_code == 404 else str(exc.detail)
        if request.url.path.startswith("/v1/"):  # the OpenAI API's error shape there
            body = _error_body(request.scope, exc.status_code, message)
            return Response(body, exc.status_code, dict(exc.headers or {}), "application/json")
        return error(exc.status_code, message, dict(exc.headers or {}))

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    public = frozenset({"/metrics"}) if metrics_public else frozenset()
    tenants_file = runtime.config.server.tenants_file
    if tenants_file is not None:  # tenants: the token is the admin's (runtime/apps/tenant_gate.py)
        from runtime.apps.tenant_gate import TenantGate
        from runtime.apps.tenants import Tenants

        tenants = Tenants(tenants_file, token, runtime)
        gate = TenantGate(
            _BodyLimit(app, limit), tenants, runtime, public=public, error_body=_error_body, limit=limit
        )
        served_app = DashboardFiles(gate)
    else:
        served_app = DashboardFiles(_BearerAuth(_BodyLimit(app, limit), token, public=public))
    from runtime.apps.responses import RequestIds

    stamped = RequestIds(served_app)  # (x-request-id on every /v1 answer)
    return stamped if drain is None else DrainGate(stamped, drain, _error_body)


class _BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>`` (401 otherwise), except
    GET requests for the ``public`` paths."""

    def __init__(self, app: Any, token: str, *, public: frozenset[str] = frozenset()) -> None:
        self.app = app
        self._expected = token.encode()
        self._public = public

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not (scope["method"] == "GET" and scope["path"] in self._public):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, credentials = given.partition(b" ")  # the scheme is case-insensitive (RFC 7235)
            valid = hmac.compare_digest(credentials, self._expected)  # (compared whatever the scheme)
            if not (valid and scheme.lower() == b"bearer"):
                body = _error_body(scope, 401, "missing or wrong bearer token")
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class _BodyTooLarge(HttpError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than this server accepts ({limit:,} bytes)")


class _BodyLimit:
    """ASGI middleware: request bodies of at most ``limit`` bytes (design §9).

    A ``Content-Length`` over the limit is answered with 413 before anything is read; a body without one
    is counted as it streams in, and the route reading it gets the 413 (an :class:`HttpError`) as soon as
    it passes the limit.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None:
            if not declared.isdigit():
                await _send_error(send, scope, 400, "Content-Length must be a number of bytes")
                return
            if int(declared) > self.limit:
                await _send_error(send, scope, 413, _BodyTooLarge(self.limit).message, close=True)
                return
        received = 0
        limit = self.limit

        async def counted() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


def _error_body(scope: Any, status: int, message: str) -> bytes:
    """``{"error": message}``; under ``/v1/`` (the OpenAI-compatible routes) the OpenAI API's error shape."""
    if not str(scope.get("path", "")).startswith("/v1/"):
        return msgspec.json.encode({"error": message})
    kind = {401: "authentication_error", 413: "invalid_request_error"}.get(status, "invalid_request_error")
    code = {401: "invalid_api_key", 413: "request_too_large"}.get(status)
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": None, "code": code}})


async def _send_error(send: Any, scope: Any, status: int, message: str, *, close: bool = False) -> None:
    body = _error_body(scope, status, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the unread body stays behind: this connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _is_hosted(runtime: AnyRuntime, session_id: str) -> bool:
    """O(1), unlike ``session_id in runtime.hosted_sessions()`` (a list of every hosted id)."""
    return served(runtime).is_hosted(session_id)


def _is_stored(runtime: AnyRuntime, session_id: str) -> bool:
    return served(runtime).is_stored(session_id)


def _tools(tools: str | list[str] | None, runtime: AnyRuntime) -> Any:
    """``"builtin"``, None, or a list of built-in tool names (a subset)."""
    if tools is None or tools == "builtin":
        return tools
    from runtime.tools.builtin import builtin_registry

    available = {t.name: t for t in builtin_registry(shell=runtime.config.agent.shell_enabled).tools()}
    unknown = [name for name in tools if name not in available]
    if unknown:
        raise HttpError(400, f"unknown tools {unknown}; available: {sorted(available)}")
    return [available[name] for name in tools]


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


# -- serving ----------------------------------------------------------------------------------------------


class ApiServer:
    """The HTTP API for ``runtime`` on uvicorn, bound to ``host:port`` at once (port 0: a free one).

    :meth:`start` serves from a background thread (tests, embedding); :meth:`run` serves in the calling
    thread until SIGINT/SIGTERM (the ``serve`` command).
    """

    def __init__(
        self,
        runtime: AnyRuntime,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        policy: ServerPolicy | None = None,
        max_body_bytes: int | None = None,
        metrics_public: bool | None = None,
    ) -> None:
        import uvicorn

        self.token = token
        self.host = host
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(2048)  # connections queue from now on, before uvicorn takes the socket over
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        limits = runtime.config.server
        self.drain = Drain(runtime)
        config = uvicorn.Config(
            create_app(
                runtime,
                token,
                stopping=lambda: self._server.should_exit,
                policy=policy,
                max_body_bytes=max_body_bytes,
                metrics_public=metrics_public,
                drain=self.drain,
            ),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            http=guarded_protocol(
                header_timeout=limits.header_timeout,
                body_timeout=limits.body_timeout,
                max_connections=limits.max_connections,
            ),
            timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]  # (a float works)
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> ApiServer:
        """Serve from a daemon thread; returns once connections are accepted."""
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="agentcell-api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the API server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def run(self) -> None:
        """Serve in this thread until interrupted."""
        self._server.run(sockets=[self._sock])

    def run_until_signalled(self, drain_timeout: float, on_ready: Callable[[], object] | None = None) -> None:
        """Serve (from a thread) until SIGTERM or SIGINT, then drain (:meth:`Drain.finish`: no new turns,
        running ones given ``drain_timeout`` seconds, a second signal cuts that short) and stop.
        ``on_ready`` runs once the signals are caught and connections accepted."""
        signalled = threading.Event()
        hurry = threading.Event()

        def on_signal(signum: int, _frame: object) -> None:
            (hurry if signalled.is_set() else signalled).set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if on_ready is not None:
                on_ready()
            while not signalled.wait(0.5):
                if self._thread is None or not self._thread.is_alive():
                    return  # uvicorn stopped on its own
            self.drain.finish(drain_timeout, hurry=hurry)
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (open event streams end) and wait for the server thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with contextlib.suppress(OSError):
            self._sock.close()
        self.drain.close()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_server(
    *,
    host: str | None = None,
    port: int | None = None,
    token: str | None = None,
    token_file: str | None = None,
    config_path: str | None = None,
    sessions_dir: str | None = None,
    workspace_root: str | None = None,
    allow_shell: bool | None = None,
    allow_api_base: bool | None = None,
    allow_mcp_commands: bool | None = None,
    metrics_public: bool | None = None,
    shards: int | None = None,
    ray_address: str | None = None,
    local: bool = False,
    drain_timeout: float | None = None,
    log_format: str | None = None,
) -> int:
    """The ``serve`` command: serve until SIGTERM or SIGINT, then drain (:mod:`runtime.apps.drain`);
    returns the exit status.

    ``local`` starts the built-in local provider (offline, scripted replies) beside the server: new
    sessions default to its model, and a session that names no ``api_base`` runs against it.

    With ``shards`` or ``ray_address`` the sessions live on shards of a Ray cluster
    (:class:`runtime.cluster.ClusterRuntime`: ``shards`` of them, 2 by default, on the cluster at
    ``ray_address`` or on a local one).

    The token comes from ``token``, else the file ``token_file``, else ``server.token`` (which
    ``AGENTCELL_SERVER__TOKEN`` sets), else the file ``server.token_file``; else one is generated.
    """
    from runtime.config import load_config

    overrides: dict[str, Any] = {}
    if sessions_dir is not None:
        overrides["persistence.sessions_dir"] = sessions_dir
    if workspace_root is not None:
        overrides["server.workspace_root"] = workspace_root
    if allow_shell is not None:
        overrides["server.allow_shell"] = allow_shell
    if allow_api_base is not None:
        overrides["server.allow_api_base"] = allow_api_base
    if allow_mcp_commands is not None:
        overrides["server.allow_mcp_commands"] = allow_mcp_commands
    if metrics_public is not None:
        overrides["server.metrics_public"] = metrics_public
    if local:
        overrides["agent.model"] = LOCAL_MODEL
    if drain_timeout is not None:
        overrides["server.drain_timeout"] = drain_timeout
    if log_format is not None:
        overrides["server.log_format"] = log_format
    try:
        cfg = load_config(config_path).with_overrides(overrides)
        policy = ServerPolicy.from_config(cfg.server)
        token = token or _read_token(token_file) or cfg.server.token or _read_token(cfg.server.token_file)
    except (ConfigError, ValueError) as exc:
        print(f"agentcell serve: {exc}", file=sys.stderr)
        return 2
    serve_log.configure(cfg.server.log_format)
    json_log = cfg.server.log_format == "json"

    def say(message: str) -> None:
        if json_log:
            log.info("%s", message)
        else:
            print(f"agentcell serve: {message}", file=sys.stderr, flush=True)

    if not token:
        token = secrets.token_urlsafe(24)
        say(f"generated bearer token: {token}")
    bind_host = host or cfg.server.host
    with contextlib.ExitStack() as stack:
        if local:
            from runtime.provider import LocalProvider

            provider = stack.enter_context(LocalProvider())
            policy = msgspec.structs.replace(policy, local_provider=provider.url)
            say(
                f"the built-in local provider at {provider.url} answers sessions that name "
                f"no api_base (model {LOCAL_MODEL} by default; its replies are scripted, offline, no key)"
            )
        return _serve(cfg, policy, token, bind_host, port, shards, ray_address, say)


def _serve(
    cfg: Config,
    policy: ServerPolicy,
    token: str,
    bind_host: str,
    port: int | None,
    shards: int | None,
    ray_address: str | None,
    say: Callable[[str], None],
) -> int:
    try:
        host_runtime = _host_runtime(cfg, shards, ray_address)
    except ValueError as exc:
        print(f"agentcell serve: {exc}", file=sys.stderr)
        return 2
    try:
        host_runtime.start()
    except RuntimeError as exc:  # a ClusterError: Ray missing, no cluster at the address, shards not started
        print(f"agentcell serve: {exc}", file=sys.stderr)
        return 1
    with host_runtime as rt:
        try:
            server = ApiServer(rt, token, bind_host, cfg.server.port if port is None else port, policy=policy)
        except ConfigError as exc:  # (a tenants file that cannot be read)
            print(f"agentcell serve: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"agentcell serve: cannot listen on {bind_host}:{port}: {exc.strerror}", file=sys.stderr)
            return 1
        where = f"workspaces under {policy.workspace_root}" if policy.workspace_root else "no workspaces"
        if shards is not None or ray_address is not None:
            where += f"; {len(getattr(rt, 'shards', ()))} shards on Ray"
        banner = (
            f"listening on {server.url} (sessions in {rt.sessions_path}; {where}; "
            f"shell {'allowed' if policy.allow_shell else 'off'}; "
            f"api_base {'allowed' if policy.allow_api_base else 'only with its own api_key'}; "
            f"MCP commands {'allowed' if policy.allow_mcp_commands else 'off'}; "
            f"/metrics {'public' if cfg.server.metrics_public else 'with the token'})"
        )
        server.run_until_signalled(cfg.server.drain_timeout, on_ready=lambda: say(banner))
    return 0


def _host_runtime(cfg: Config, shards: int | None, ray_address: str | None) -> AnyRuntime:
    """A local ``Runtime``, or a ``ClusterRuntime`` when asked for shards or a Ray address."""
    if shards is None and ray_address is None:
        return Runtime(cfg)
    from runtime.cluster import ClusterRuntime

    return ClusterRuntime(cfg, shards=shards if shards is not None else 2, address=ray_address)


def _read_token(path: str | None) -> str | None:
    """The token held in the file ``path`` (surrounding whitespace dropped); None without a path."""
    if path is None:
        return None
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path}: {exc}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token
