"""The ``agentcell serve`` application (design §7.2): its routes (sessions, events, the dashboard's overview,
metrics and the Responses API) behind its guards, errors answered as ``{"error": ...}``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from runtime.apps.dashboard import DashboardFiles, SessionBoard
from runtime.apps.drain import Drain, DrainGate
from runtime.apps.server.bodies import HttpError
from runtime.apps.server.guards import BearerAuth, BodyLimit, error_body
from runtime.apps.server.policy import ServerPolicy
from runtime.apps.server.sessions import TakeUp, session_routes
from runtime.apps.server.sse import events_endpoint
from runtime.config import ConfigError
from runtime.errors import RuntimeStopped, SessionNotFound
from runtime.host import Runtime
from runtime.ids import InvalidSessionId
from runtime.store.log import CorruptLogError

if TYPE_CHECKING:
    from runtime.apps import AnyRuntime

__all__ = ["create_app"]

log = logging.getLogger("agentcell.server")


def create_app(
    runtime: AnyRuntime,
    token: str,
    *,
    stopping: Callable[[], bool] | None = None,
    policy: ServerPolicy | None = None,
    max_body_bytes: int | None = None,
    metrics_public: bool | None = None,
    drain: Drain | None = None,
    takes_up: Callable[[TakeUp], object] | None = None,
) -> Any:
    """The Starlette application serving ``runtime`` (a ``Runtime`` or a ``ClusterRuntime``); every route
    requires ``token`` (``/metrics`` too, unless ``metrics_public``).

    ``stopping`` tells open event streams to end (the server is shutting down); with ``drain``, the
    application answers ``/healthz`` and ``/readyz`` and refuses new turns while draining
    (:mod:`runtime.apps.drain`). ``policy``,
    ``max_body_bytes`` and ``metrics_public`` default to the runtime's ``server.*`` settings. ``takes_up``
    is handed the coroutine function that takes up the turns a stopped server cut off (run it on the
    application's event loop).
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
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

    board = SessionBoard.for_runtime(runtime)

    async def overview(request: Request) -> Any:
        return await asyncio.to_thread(board.snapshot)

    async def metrics_text(request: Request) -> Any:
        try:
            body, content_type = await asyncio.to_thread(metrics.exposition)
        except MetricsUnavailable as exc:
            raise HttpError(503, str(exc)) from None
        return Response(body, media_type=content_type)

    routes, ensure_hosted, take_up = session_routes(runtime, policy, endpoint)
    if takes_up is not None:
        takes_up(take_up)
    routes += [
        Route("/events", endpoint(events_endpoint(runtime, is_stopping)), methods=["GET"]),
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
            body = error_body(request.scope, exc.status_code, message)
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
            BodyLimit(app, limit), tenants, runtime, public=public, error_body=error_body, limit=limit
        )
        served_app = DashboardFiles(gate)
    else:
        served_app = DashboardFiles(BearerAuth(BodyLimit(app, limit), token, public=public))
    from runtime.apps.responses import RequestIds

    stamped = RequestIds(served_app)  # (x-request-id on every /v1 answer)
    return stamped if drain is None else DrainGate(stamped, drain, error_body)
