"""Connection hygiene for ``agentcell serve`` (design §9): uvicorn's HTTP/1.1 protocol (h11) with deadlines
and a cap, so connections that hold the server without asking anything of it do not stay.

- **Request headers** must arrive within ``server.header_timeout`` of the connection opening, or of the
  previous response ending (a client that never sends a request, or trickles its headers, is closed).
- **A request body** must arrive within ``server.body_timeout`` of its headers.
- **An idle keep-alive connection** is closed ``server.keep_alive_timeout`` after its last response
  (uvicorn's own ``timeout_keep_alive``).
- **Open connections** are at most ``server.max_connections``: past it, a new connection makes the oldest
  idle one close (one waiting for its next request's headers), so idle connections cannot lock clients out;
  when every connection is busy (a request being read or answered, an event stream), the new one gets a
  503 and is closed.

A connection whose request was read (the route is working, or streaming events) has no deadline here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["guarded_protocol"]

log = logging.getLogger("agentcell.server")

_BUSY_BODY = b'{"error": "too many open connections; try again in a moment"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(_BUSY_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + _BUSY_BODY
)


def guarded_protocol(*, header_timeout: float, body_timeout: float, max_connections: int) -> type[Any]:
    """An HTTP protocol class for ``uvicorn.Config(http=...)`` applying the limits of the module docstring;
    each class keeps its own book of idle connections (one per server)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    idle: dict[Any, None] = {}  # connections waiting for a request's headers, oldest first

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _phase = ""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                oldest = next(iter(idle), None)
                if oldest is None:  # every connection is busy: this one is refused
                    log.warning("refused a connection: %d are open and busy", len(self.connections) - 1)
                    transport.write(_BUSY)
                    transport.close()
                    return
                oldest._expire("closed: the connection limit was reached and it was the oldest idle one")
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._follow()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            idle.pop(self, None)
            super().connection_lost(exc)

        # -- deadlines ---------------------------------------------------------------------------------
        def _follow(self) -> None:
            """Set the deadline for where the client is now: its headers, its body, or none."""
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._phase != "headers":
                    self._await_headers()
            elif state is h11.SEND_BODY:
                if self._phase != "body":
                    idle.pop(self, None)
                    self._phase = "body"
                    self._arm(
                        body_timeout, f"closed: its request body did not arrive within {body_timeout:g} s"
                    )
            else:  # the request is read: the route has it (or the connection is ending)
                idle.pop(self, None)
                self._phase = "working"
                self._cancel()

        def _await_headers(self) -> None:
            self._phase = "headers"
            idle.pop(self, None)
            idle[self] = None  # (the newest idle one)
            self._arm(header_timeout, f"closed: no request headers within {header_timeout:g} s")

        def _arm(self, seconds: float, why: str) -> None:
            self._cancel()
            self._timer = self.loop.call_later(seconds, self._expire, why)

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self, why: str) -> None:
            self._timer = None
            idle.pop(self, None)
            if not self.transport.is_closing():
                log.debug("connection from %s %s", self.client, why)
                self.transport.close()

    return GuardedH11Protocol
