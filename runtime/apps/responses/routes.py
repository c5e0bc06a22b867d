"""The HTTP routes of the Responses API front door (Starlette), mounted by ``agentcell serve``.

Errors are answered in the API's shape (``{"error": {"message", "type", "param", "code"}}``); a streamed
response is Server-Sent Events (``event: <type>`` and ``data: <the event>``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from runtime.apps.responses import catalog, compaction
from runtime.apps.responses import items as it
from runtime.apps.responses.api import (
    ApiError,
    CreateResponse,
    decode_error,
    error_type,
    list_page,
    not_found,
)
from runtime.apps.responses.door import FrontDoor
from runtime.apps.responses.records import ConversationRecord, new_conversation_id
from runtime.apps.responses.runs import STREAM_END, Run

log = logging.getLogger("agentcell.responses")

NOT_OFFERED = "x-agentcell-tools-not-offered"
"""The response header naming the hosted tools a request declared that were not offered to the model."""


class _ConversationBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None


class _ItemsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: list[dict[str, Any]]


def responses_routes(
    runtime: Any,
    hosted: Callable[[str], Awaitable[str]],
    check_config: Callable[[dict[str, Any]], None],
) -> list[Any]:
    """The ``/v1/responses`` and ``/v1/conversations`` routes over ``runtime``."""
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from runtime.host import SessionNotFound

    door = FrontDoor(runtime, hosted, check_config)

    def api(fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                result = await fn(request)
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except ClientDisconnect:
                return Response(status_code=499)
            except SessionNotFound as exc:
                return JSONResponse(ApiError(404, str(exc)).body(), status_code=404)
            except Exception as exc:
                status = getattr(exc, "status", None)  # the server's HttpError: 413 for a body too large
                if isinstance(status, int):
                    error = ApiError(status, getattr(exc, "message", str(exc)), type=error_type(status))
                    return JSONResponse(error.body(), status_code=status)
                if isinstance(exc, ValueError):
                    return JSONResponse(ApiError(400, str(exc)).body(), status_code=400)
                log.exception("%s %s failed", request.method, request.url.path)
                error = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
                return JSONResponse(error.body(), status_code=500)
            if isinstance(result, Response):
                return result
            return Response(msgspec.json.encode(result), media_type="application/json")

        return wrapped

    def decode(raw: bytes, kind: type[Any]) -> Any:
        try:
            return msgspec.json.decode(raw or b"{}", type=kind)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise decode_error(exc) from None
        except RecursionError:
            raise ApiError(400, "The request body is nested too deeply.") from None

    def page(request: Request, items: list[dict[str, Any]]) -> dict[str, Any]:
        params = request.query_params
        try:
            limit = int(params.get("limit", "20"))
        except ValueError:
            raise ApiError(400, "limit must be a number", param="limit") from None
        if not 1 <= limit <= 100:
            raise ApiError(400, "limit must be between 1 and 100", param="limit")
        order = params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "order must be 'asc' or 'desc'", param="order")
        return list_page(items, after=params.get("after"), limit=limit, order=order)

    # -- responses --------------------------------------------------------------------------------------
    async def create(request: Request) -> Any:
        body: CreateResponse = decode(await request.body(), CreateResponse)
        run = await door.create(body, owner_of(request))
        headers = {NOT_OFFERED: ", ".join(run.not_offered)} if run.not_offered else {}
        if run.queue is not None:
            return StreamingResponse(
                _sse(run, door.abandon),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", **headers},
            )
        assert run.task is not None
        await asyncio.shield(run.task)  # (a client that goes away does not cut the run short)
        record = run.record
        if record.status == "failed" and record.error is not None and run.http_status != 200:
            raise ApiError(
                run.http_status,
                str(record.error.get("message")),
                type=error_type(run.http_status),
                param=record.error.get("param"),
                code=str(record.error.get("code")),
            )
        return JSONResponse(record.to_api(), headers=headers)

    async def count_input_tokens(request: Request) -> Any:
        body: CreateResponse = decode(await request.body(), CreateResponse)
        return {
            "object": "response.input_tokens",
            "input_tokens": await catalog.count_input_tokens(door, body),
        }

    async def compact(request: Request) -> Any:
        body: CreateResponse = decode(await request.body(), CreateResponse)
        return await compaction.compact(door, body, owner_of(request))

    async def models(request: Request) -> Any:
        return {"object": "list", "data": catalog.models(door)}

    async def model(request: Request) -> Any:
        name = request.path_params["model"]
        for entry in catalog.models(door):
            if entry["id"] == name:
                return entry
        raise ApiError(404, f"The model '{name}' does not exist on this server.", code="model_not_found")

    async def retrieve(request: Request) -> Any:
        if request.query_params.get("stream") in ("true", "1"):
            raise ApiError(400, "stream: a stored response cannot be streamed again here", param="stream")
        return (await door.response(request.path_params["response_id"])).to_api()

    async def delete(request: Request) -> Any:
        response_id = request.path_params["response_id"]
        await door.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(request: Request) -> Any:
        return (await door.cancel(request.path_params["response_id"])).to_api()

    async def input_items(request: Request) -> Any:
        record = await door.response(request.path_params["response_id"])
        return page(request, record.input_items)

    # -- conversations ----------------------------------------------------------------------------------
    def parse_items(items: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
        """Items as a conversation keeps them until they are sent: checked, with ids of their own."""
        try:
            parsed = it.parse_input(items, param=param)
        except it.InputError as exc:
            raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from None
        if parsed.instructions:
            raise ApiError(400, f"{param}: system and developer messages go in instructions", param=param)
        return it.to_items(parsed.messages)

    async def create_conversation(request: Request) -> Any:
        body: _ConversationBody = decode(await request.body(), _ConversationBody)
        record = ConversationRecord(
            id=new_conversation_id(),
            metadata=body.metadata or {},
            pending=parse_items(body.items or [], "items"),
        )
        await asyncio.to_thread(door.records.save_conversation, record)
        return record.to_api()

    async def get_conversation(request: Request) -> Any:
        return (await door.conversation(request.path_params["conversation_id"])).to_api()

    async def update_conversation(request: Request) -> Any:
        record = await door.conversation(request.path_params["conversation_id"])
        body: _ConversationBody = decode(await request.body(), _ConversationBody)
        if body.items is not None:
            raise ApiError(400, "items: add items with POST /v1/conversations/{id}/items", param="items")
        record.metadata = body.metadata or {}
        await asyncio.to_thread(door.records.save_conversation, record)
        return record.to_api()

    async def delete_conversation(request: Request) -> Any:
        conversation_id = request.path_params["conversation_id"]
        record = await door.conversation(conversation_id)
        await asyncio.to_thread(door.records.delete_conversation, conversation_id)
        if record.session_id is not None:
            try:
                await runtime.adelete_session(record.session_id)
            except SessionNotFound:
                pass
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def list_items(request: Request) -> Any:
        record = await door.conversation(request.path_params["conversation_id"])
        return page(request, await door.conversation_items(record))

    async def add_items(request: Request) -> Any:
        record = await door.conversation(request.path_params["conversation_id"])
        body: _ItemsBody = decode(await request.body(), _ItemsBody)
        added = parse_items(body.items, "items")
        door.check_added_outputs(record, added)
        record.pending.extend(added)
        await asyncio.to_thread(door.records.save_conversation, record)
        return list_page(added, after=None, limit=len(added) or 1, order="asc")

    async def get_item(request: Request) -> Any:
        record = await door.conversation(request.path_params["conversation_id"])
        item_id = request.path_params["item_id"]
        for item in await door.conversation_items(record):
            if item.get("id") == item_id:
                return item
        raise not_found("Item", item_id)

    async def delete_item(request: Request) -> Any:
        conversation_id = request.path_params["conversation_id"]
        async with door.conversation_lock(conversation_id):
            record = await door.conversation(conversation_id)
            await door.delete_item(record, request.path_params["item_id"])
        return record.to_api()

    return [
        Route("/v1/models", api(models), methods=["GET"]),
        Route("/v1/models/{model:path}", api(model), methods=["GET"]),
        Route("/v1/responses", api(create), methods=["POST"]),
        Route("/v1/responses/input_tokens", api(count_input_tokens), methods=["POST"]),
        Route("/v1/responses/compact", api(compact), methods=["POST"]),
        Route("/v1/responses/{response_id}", api(retrieve), methods=["GET"]),
        Route("/v1/responses/{response_id}", api(delete), methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", api(cancel), methods=["POST"]),
        Route("/v1/responses/{response_id}/input_items", api(input_items), methods=["GET"]),
        Route("/v1/conversations", api(create_conversation), methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", api(get_conversation), methods=["GET"]),
        Route("/v1/conversations/{conversation_id}", api(update_conversation), methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", api(delete_conversation), methods=["DELETE"]),
        Route("/v1/conversations/{conversation_id}/items", api(list_items), methods=["GET"]),
        Route("/v1/conversations/{conversation_id}/items", api(add_items), methods=["POST"]),
        Route("/v1/conversations/{conversation_id}/items/{item_id}", api(get_item), methods=["GET"]),
        Route("/v1/conversations/{conversation_id}/items/{item_id}", api(delete_item), methods=["DELETE"]),
    ]


def owner_of(request: Any) -> str:
    """Whose request it is, as far as the front door's stateless threads go: a digest of its credentials
    (one token never goes on with another's thread)."""
    credentials = request.headers.get("authorization", "").encode()
    return hashlib.sha256(b"agentcell owner\0" + credentials).hexdigest()


async def _sse(run: Run, abandon: Callable[[Run], None]) -> AsyncIterator[bytes]:
    """The stream of ``run``: its events as they come. A client that goes away leaves a run that has
    started going (it is kept), and cancels one still waiting for its session (``abandon``)."""
    queue = run.queue
    assert queue is not None
    try:
        async for frames in _frames(queue):
            yield frames
    finally:
        if run.task is not None and not run.task.done():  # (the client went away before the end)
            abandon(run)


async def _frames(queue: asyncio.Queue[Any]) -> AsyncIterator[bytes]:
    while True:
        events = [await queue.get()]
        while not queue.empty():  # what is there already goes out in one write
            events.append(queue.get_nowait())
        frames = [
            b"event: " + e["type"].encode() + b"\ndata: " + msgspec.json.encode(e) + b"\n\n"
            for e in events
            if e is not STREAM_END
        ]
        if frames:
            yield b"".join(frames)
        if events[-1] is STREAM_END:
            return


class RequestIds:
    """ASGI middleware: every answer under ``/v1/`` carries an ``x-request-id`` (``req_<32 hex>``), as the
    OpenAI API's do (the SDKs show it as ``response._request_id`` and in their errors)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        request_id = f"req_{secrets.token_hex(16)}".encode()

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, stamped)
