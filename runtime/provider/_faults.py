"""How an injected fault plays out on the wire (design §7.3): an error answer, a request held until its client
goes (``hang``), a stream that stops (``stall``) or sends only keep-alives (``keepalive``), one that breaks off
with an error event (``stream_error``), a connection cut by a TCP reset (``reset``); each said in the words of
the endpoint's dialect (:class:`runtime.provider.errors.FaultWords`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from runtime.provider import errors
from runtime.provider._http import SSE_HEADERS, error_response, sse
from runtime.provider.script import Fault
from runtime.provider.usage import PromptCount

_log = logging.getLogger("agentcell.provider")


class FaultPlayer:
    """Plays injected faults for a provider: ``stopping`` lets every held request go; ``connections`` lists the
    server's open connections (a ``reset`` aborts the request's own)."""

    def __init__(self, stopping: threading.Event, connections: Callable[[], Iterable[Any]]) -> None:
        self._stopping = stopping
        self._connections = connections
        self.hanging = 0
        """Requests a ``hang``, ``stall`` or ``keepalive`` fault holds now (only the server's loop thread
        changes it)."""

    async def respond(
        self,
        request: Request,
        fault: Fault,
        count: PromptCount,
        stream: bool,
        words: errors.FaultWords,
        *,
        context_window: int,
    ) -> Response:
        """The answer of an injected ``fault``, in the words of an endpoint's dialect."""
        match fault.kind:
            case "rate_limit":
                return error_response(words.rate_limit())
            case "server_error":
                return error_response(words.server_error(fault.status))
            case "overloaded":
                return error_response(words.overloaded(fault.status))
            case "auth":
                return error_response(words.auth())
            case "overflow":
                return error_response(words.overflow(max(count.prompt_tokens, context_window + 1)))
            case "hang":
                await self._hang(request)
                return Response(status_code=504)
            case "stall":
                if not stream:
                    await self._hang(request)
                    return Response(status_code=504)
                frames = words.frames("This reply stops and stays silent ")
                return sse(self._stall_after(request, frames, fault.after_chunks))
            case "keepalive":
                if not stream:
                    await self._hang(request)
                    return Response(status_code=504)
                frames = words.frames("This reply waits forever ")
                return sse(self._keep_alive_after(request, frames, fault.after_chunks, words.keepalive))
            case "stream_error":
                if not stream:
                    return error_response(words.server_error(None))
                pieces = list(words.frames("This reply breaks off "))
                head = pieces[: max(0, fault.after_chunks)]
                return Response(
                    b"".join([*head, words.error_event]), media_type="text/event-stream", headers=SSE_HEADERS
                )
            case "reset":
                if not stream or fault.after_chunks <= 0:
                    self._reset_connection(request)
                    return Response(status_code=500)
                frames = words.frames("This reply is cut off in the middle ")
                return sse(self._cut_after(request, frames, fault.after_chunks))
        raise AssertionError(f"unhandled fault {fault.kind}")  # pragma: no cover

    async def _hang(self, request: Request) -> None:
        self.hanging += 1
        try:
            while not self._stopping.is_set():
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.05)
        finally:
            self.hanging -= 1

    async def _stall_after(
        self, request: Request, frames: Iterator[bytes], count: int
    ) -> AsyncIterator[bytes]:
        for i, frame in enumerate(frames):
            if i >= count:
                break
            yield frame
        await self._hang(request)

    async def _keep_alive_after(
        self, request: Request, frames: Iterator[bytes], count: int, keepalive: bytes
    ) -> AsyncIterator[bytes]:
        for i, frame in enumerate(frames):
            if i >= count:
                break
            yield frame
        self.hanging += 1
        try:
            while not self._stopping.is_set() and not await request.is_disconnected():
                yield keepalive
                await asyncio.sleep(0.1)
        finally:
            self.hanging -= 1

    async def _cut_after(self, request: Request, frames: Iterator[bytes], count: int) -> AsyncIterator[bytes]:
        for i, frame in enumerate(frames):
            if i >= count:
                break
            yield frame
            await asyncio.sleep(0.01)  # let the chunk reach the client before the cut
        self._reset_connection(request)
        await asyncio.sleep(0.01)  # let uvicorn notice the lost connection before the response ends

    def _reset_connection(self, request: Request) -> None:
        """Abort the request's TCP connection with an RST (SO_LINGER 0), as a crashed peer would."""
        client = request.scope.get("client")
        for connection in list(self._connections()):
            if getattr(connection, "client", None) == tuple(client or ()):
                transport = connection.transport
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
                return
        _log.warning("reset fault: no connection found for client %s", client)
