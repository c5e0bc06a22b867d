"""Operating the server: health and readiness probes, and draining on SIGTERM/SIGINT (design §7.2).

A container platform stops a process with SIGTERM (then SIGKILL after a grace period) and routes traffic by
a readiness probe. :class:`Drain` follows the turns running in the runtime (from its ``agent_start`` and
``agent_end`` events, and prompts accepted but not started yet); :class:`DrainGate`, an ASGI middleware
in front of the whole application, answers

- ``GET /healthz``: 200 ``{"status": "alive"}`` while the process serves at all;
- ``GET /readyz``: 200 ``{"status": "ready"}``, or 503 ``{"status": "draining"}`` once draining began;

both without the bearer token (probes carry none, and they tell nothing about sessions). While draining,
every request that could start work (a ``POST``, but ``/abort``) is refused with 503 and ``Retry-After``;
reads, event streams and aborts are served, so clients see their turns end. :meth:`Drain.finish` waits
for the running turns up to ``server.drain_timeout``, then aborts what is left, each named in the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec

if TYPE_CHECKING:
    from runtime.apps import AnyRuntime
    from runtime.events import Event

__all__ = ["RETRY_AFTER", "Drain", "DrainGate"]

log = logging.getLogger("agentcell.server")

RETRY_AFTER: Final = 5
"""Seconds a refused client is asked to wait (by then another instance, or this one restarted, serves)."""
_PENDING_FOR: Final = 2.0
"""How long a prompt accepted (202) counts as running before its turn's ``agent_start`` shows."""


class Drain:
    """The turns running in ``runtime``, and whether the server drains. Thread-safe."""

    def __init__(self, runtime: AnyRuntime) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}  # session id -> when its turn started
        self._pending: dict[str, float] = {}  # session id -> when a prompt for it was accepted
        self._requests = 0  # requests that may start work, in flight
        self._draining = threading.Event()
        self._subscription = runtime.subscribe("*", types={"agent_start", "agent_end"}, callback=self._seen)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def _seen(self, event: Event) -> None:
        with self._lock:
            sid = event.session_id
            self._pending.pop(sid, None)
            if event.type == "agent_start":
                self._running[sid] = time.monotonic()
            else:
                self._running.pop(sid, None)

    def accepted(self, session_id: str) -> None:
        """A prompt for ``session_id`` was accepted (202): its turn runs soon, though not started yet."""
        with self._lock:
            self._pending[session_id] = time.monotonic()

    def request(self, delta: int) -> None:
        with self._lock:
            self._requests += delta

    def busy(self) -> list[str]:
        """The sessions with a turn running (or a prompt accepted moments ago), oldest first."""
        now = time.monotonic()
        with self._lock:
            pending = [sid for sid, t in self._pending.items() if now - t < _PENDING_FOR]
            running = sorted(self._running, key=self._running.__getitem__)
            return [*running, *(sid for sid in pending if sid not in self._running)]

    def idle(self) -> bool:
        with self._lock:
            requests = self._requests
        return requests == 0 and not self.busy()

    def begin(self) -> None:
        """Stop taking work: readiness fails, and new turns are refused with 503."""
        if not self._draining.is_set():
            self._draining.set()
            log.warning("draining: no new turns; running turns: %d", len(self.busy()))

    def finish(self, timeout: float, *, hurry: threading.Event | None = None) -> list[str]:
        """Drain: wait up to ``timeout`` seconds (or until ``hurry`` is set) for the running turns to end,
        then abort those left, each with a line in the log. Returns the sessions whose turn was aborted."""
        self.begin()
        began = time.monotonic()
        deadline = began + timeout
        while not self.idle() and time.monotonic() < deadline and not (hurry and hurry.is_set()):
            time.sleep(0.05)
        left = self.busy()
        for sid in left:
            log.warning(
                "drain: aborting the turn of session %s after %.1f s (server.drain_timeout %g s)",
                sid,
                time.monotonic() - began,
                timeout,
            )
            try:
                self._runtime.abort(sid).result(timeout=10)
            except Exception as exc:  # a session stopped meanwhile: nothing left to abort
                log.warning("drain: aborting session %s failed: %s", sid, exc)
        if not left:
            log.warning("drained in %.1f s: every turn ended", time.monotonic() - began)
        return left

    def close(self) -> None:
        self._subscription.close()


def _starts_work(method: str, path: str) -> bool:
    return method == "POST" and not path.endswith("/abort")


class DrainGate:
    """ASGI middleware: ``/healthz`` and ``/readyz`` (no token), and 503 for new work while draining."""

    def __init__(self, app: Any, drain: Drain, error_body: Callable[[Any, int, str], bytes]) -> None:
        self.app = app
        self.drain = drain
        self._error_body = error_body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "GET" and path == "/healthz":
            await _send(send, 200, msgspec.json.encode({"status": "alive"}))
            return
        if method == "GET" and path == "/readyz":
            if self.drain.draining:
                await _send(send, 503, msgspec.json.encode({"status": "draining"}), retry_after=True)
            else:
                await _send(send, 200, msgspec.json.encode({"status": "ready"}))
            return
        if not _starts_work(method, path):
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            message = "the server is shutting down and takes no new turns; retry on another instance or later"
            await _send(send, 503, self._error_body(scope, 503, message), retry_after=True, close=True)
            return
        self.drain.request(+1)
        prompt_of = _prompted_session(path)

        async def watched(message: Any) -> None:
            if prompt_of and message["type"] == "http.response.start" and message["status"] == 202:
                self.drain.accepted(prompt_of)
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self.drain.request(-1)


def _prompted_session(path: str) -> str | None:
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "sessions" and parts[3] == "prompt":
        return parts[2]
    return None


async def _send(
    send: Any, status: int, body: bytes, *, retry_after: bool = False, close: bool = False
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", str(RETRY_AFTER).encode()))
    if close:  # a refused request's body stays unread: this connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
