"""The guards in front of ``agentcell serve``'s routes (ASGI middleware, design §9): the bearer token and
the bodies' size limit; and the error body every refusal answers with."""

from __future__ import annotations

import hmac
from typing import Any

import msgspec

from runtime.apps.server.bodies import HttpError

__all__ = ["BearerAuth", "BodyLimit", "error_body", "send_error"]


class BearerAuth:
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
                body = error_body(scope, 401, "missing or wrong bearer token")
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


class BodyLimit:
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
                await send_error(send, scope, 400, "Content-Length must be a number of bytes")
                return
            if int(declared) > self.limit:
                await send_error(send, scope, 413, _BodyTooLarge(self.limit).message, close=True)
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


def error_body(scope: Any, status: int, message: str) -> bytes:
    """``{"error": message}``; under ``/v1/`` (the OpenAI-compatible routes) the OpenAI API's error shape."""
    if not str(scope.get("path", "")).startswith("/v1/"):
        return msgspec.json.encode({"error": message})
    kind = {401: "authentication_error", 413: "invalid_request_error"}.get(status, "invalid_request_error")
    code = {401: "invalid_api_key", 413: "request_too_large"}.get(status)
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": None, "code": code}})


async def send_error(send: Any, scope: Any, status: int, message: str, *, close: bool = False) -> None:
    body = error_body(scope, status, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the unread body stays behind: this connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
