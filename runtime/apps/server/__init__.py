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
    GET    /sessions/{id}/turns/{prompt_id}  ?wait=true: that turn's result (202 while it runs without wait): a
                                         prompt this server took, or a turn it took up on resuming the session
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

One concern a module: :mod:`~runtime.apps.server.serve` (:class:`ApiServer`, :func:`run_server`),
:mod:`~runtime.apps.server.app` (:func:`create_app`: the routes behind their guards),
:mod:`~runtime.apps.server.sessions` (the session routes), :mod:`~runtime.apps.server.sse` (the event
stream), :mod:`~runtime.apps.server.policy` (:class:`ServerPolicy`), :mod:`~runtime.apps.server.guards`
(the token and the body limit) and :mod:`~runtime.apps.server.bodies` (request bodies, :class:`HttpError`).
"""

from runtime.apps.server.app import create_app
from runtime.apps.server.bodies import HttpError
from runtime.apps.server.policy import ServerPolicy
from runtime.apps.server.serve import ApiServer, run_server
from runtime.apps.server.sse import HEARTBEAT_SECONDS, MAX_CURSOR_SESSIONS, format_cursor, parse_cursor

__all__ = [
    "HEARTBEAT_SECONDS",
    "MAX_CURSOR_SESSIONS",
    "ApiServer",
    "HttpError",
    "ServerPolicy",
    "create_app",
    "format_cursor",
    "parse_cursor",
    "run_server",
]
