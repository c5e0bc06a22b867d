"""The session routes of ``agentcell serve``: ``/sessions`` and ``/sessions/{id}/...`` (design §7.2).

A stored session that the server does not host yet is resumed on first use, under the server's policy
(:meth:`~runtime.apps.server.policy.ServerPolicy.check_stored`): a turn its process stopped in is taken up
then (design §3.12), and ``GET /sessions/{id}/turns/{prompt_id}`` answers with its result, as it does for
the prompts this server took.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from runtime.apps.server.bodies import (
    BranchBody,
    CompactBody,
    CreateSession,
    HttpError,
    ModelBody,
    PromptBody,
    ResumeBody,
    decode,
    int_param,
)
from runtime.apps.server.policy import ServerPolicy
from runtime.errors import SessionNotFound
from runtime.ids import validate_session_id
from runtime.served import served
from runtime.tools.mcp.servers import parse_servers

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from runtime.apps import AnyRuntime
    from runtime.handles import PromptHandle

__all__ = ["MAX_TURNS_KEPT", "Endpoint", "EnsureHosted", "TakeUp", "session_routes"]

log = logging.getLogger("agentcell.server")

MAX_TURNS_KEPT: Final = 4_096
"""The newest turns whose handles ``GET /sessions/{id}/turns/{prompt_id}`` answers from."""

Endpoint = Callable[[Callable[["Request"], Awaitable[Any]]], Callable[["Request"], Awaitable["Response"]]]
"""Makes a route's endpoint of a handler: its result as JSON, its errors as ``{"error": ...}`` answers."""
EnsureHosted = Callable[[str], Awaitable[str]]
"""The session id, hosted by the runtime (a stored session is resumed under the policy); else 404."""
TakeUp = Callable[[Sequence[str]], Coroutine[Any, Any, list[str]]]
"""Resumes stored sessions whose turn a stopped server cut off, keeping the taken-up turns' handles for
``GET /sessions/{id}/turns/{prompt_id}``; returns the ids whose turn was taken up."""


def session_routes(
    runtime: AnyRuntime, policy: ServerPolicy, endpoint: Endpoint
) -> tuple[list[Route], EnsureHosted, TakeUp]:
    """The routes of ``runtime``'s sessions, the function that hosts a session on first use, and the one
    that takes up the turns a stopped server cut off (:meth:`~runtime.api.RuntimeAPI.interrupted_sessions`)."""
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    resuming = asyncio.Lock()  # one resume at a time: two first requests must not both resume a session
    turns: OrderedDict[tuple[str, str], PromptHandle] = OrderedDict()  # (session, prompt id): its handle

    def keep(session_id: str, handle: PromptHandle) -> None:
        turns[(session_id, handle.id)] = handle
        while len(turns) > MAX_TURNS_KEPT:
            turns.popitem(last=False)

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

    async def take_up(session_ids: Sequence[str]) -> list[str]:
        """Resume each stored session of ``session_ids`` under the policy, as its first request would: its
        agent takes its cut-off turn up (design §3.12), whose handle is kept for ``GET .../turns/...``. A
        session whose config has ``agent.resume_turns`` off is left as it is, not resumed: its turn is not
        taken up (its agent says it was interrupted when a request resumes it)."""
        taken = []
        for session_id in session_ids:
            try:
                if not await asyncio.to_thread(_resumes_turns, runtime, session_id):
                    log.info("the turn cut off in session %s is left: agent.resume_turns is off", session_id)
                    continue
                await ensure_hosted(session_id)
                handle = await asyncio.to_thread(runtime.resumed_turn, session_id)
            except Exception as exc:  # (its workspace outside the policy, a corrupt log, ...): left as it is
                log.warning("the turn cut off in session %s is not taken up: %s", session_id, exc)
                continue
            if handle is not None:
                keep(session_id, handle)
                taken.append(session_id)
        return taken

    async def create_session(request: Request) -> Response:
        body: CreateSession = decode(await request.body(), CreateSession)
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
        body: ResumeBody = decode(await request.body(), ResumeBody)
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
        body: PromptBody = decode(await request.body(), PromptBody)
        handle = runtime.prompt(session_id, body.text, images=body.images, steer=body.steer)
        keep(session_id, handle)
        if not body.wait:
            return JSONResponse({"prompt_id": handle.id}, status_code=202)
        return msgspec.to_builtins(await handle)

    async def turn(request: Request) -> Any:
        """A turn's result by its prompt id: a prompt this server took, or the turn it took up when it
        resumed the session (its prompt id the one the client got from the server that died); 202 while
        it runs, unless ``?wait=true``."""
        session_id = await hosted(request)  # (resumed here first if stored: that takes its turn up)
        prompt_id = request.path_params["prompt_id"]
        handle = turns.get((session_id, prompt_id))
        if handle is None:
            resumed = await asyncio.to_thread(runtime.resumed_turn, session_id)
            if resumed is None or resumed.id != prompt_id:
                raise HttpError(
                    404,
                    f"no turn {prompt_id!r} of session {session_id!r} is running or kept here (one that "
                    "ended before this server took the session up is in its messages)",
                )
            handle = resumed
            keep(session_id, handle)
        if not handle.done() and request.query_params.get("wait") not in ("1", "true"):
            return JSONResponse({"prompt_id": prompt_id, "status": "running"}, status_code=202)
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
        body: CompactBody = decode(await request.body(), CompactBody)
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
        offset, limit = int_param(request, "offset", 0) or 0, int_param(request, "limit", None)

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
        body: BranchBody = decode(await request.body(), BranchBody)
        await asyncio.to_thread(runtime.branch, session_id, body.leaf_id)
        return {"leaf_id": body.leaf_id}

    async def set_model(request: Request) -> Any:
        session_id = await hosted(request)
        body: ModelBody = decode(await request.body(), ModelBody)
        window = await asyncio.to_thread(runtime.set_model, session_id, body.model)
        return {"model": body.model, "context_window": window}

    routes = [
        Route("/sessions", endpoint(create_session), methods=["POST"]),
        Route("/sessions", endpoint(list_sessions), methods=["GET"]),
        Route("/sessions/{session_id}", endpoint(get_session), methods=["GET"]),
        Route("/sessions/{session_id}", endpoint(delete_session), methods=["DELETE"]),
        Route("/sessions/{session_id}/resume", endpoint(resume), methods=["POST"]),
        Route("/sessions/{session_id}/prompt", endpoint(prompt), methods=["POST"]),
        Route("/sessions/{session_id}/turns/{prompt_id}", endpoint(turn), methods=["GET"]),
        Route("/sessions/{session_id}/abort", endpoint(abort), methods=["POST"]),
        Route("/sessions/{session_id}/compact", endpoint(compact), methods=["POST"]),
        Route("/sessions/{session_id}/context", endpoint(context), methods=["GET"]),
        Route("/sessions/{session_id}/messages", endpoint(messages), methods=["GET"]),
        Route("/sessions/{session_id}/branch", endpoint(branch), methods=["POST"]),
        Route("/sessions/{session_id}/model", endpoint(set_model), methods=["POST"]),
    ]
    return routes, ensure_hosted, take_up


def _is_hosted(runtime: AnyRuntime, session_id: str) -> bool:
    """O(1), unlike ``session_id in runtime.hosted_sessions()`` (a list of every hosted id)."""
    return served(runtime).is_hosted(session_id)


def _resumes_turns(runtime: AnyRuntime, session_id: str) -> bool:
    """Whether the stored session's config (the runtime's, with the session's own settings) takes a cut-off
    turn up (``agent.resume_turns``)."""
    header = served(runtime).stored_header(session_id)
    config = runtime.config if header is None else runtime.config.with_overrides(dict(header.config or {}))
    return config.agent.resume_turns


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
