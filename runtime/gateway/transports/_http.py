"""A small HTTP/1.1 client for the native transport: keep-alive pools that stay O(1) at a thousand connections.

httpx's pool (httpcore's) walks every pooled connection on every request and every release, checking each
one's socket (a ``select`` call and an anyio attribute dict apiece), and counts its idle connections once
per idle connection: O(n) to O(n^2) work per call. At the thousand connections a thousand concurrent
sessions keep open, that cost more CPU than litellm's whole call. This client keeps, per origin, a
last-in-first-out stack of idle connections: taking one is a pop, giving it back a push. A connection the
server has closed meanwhile is seen from the stream's own state (no system call) and dropped, and one idle
for ``keepalive_expiry`` (5 s, as httpx's) is not reused. A connection that fails before the answer is a
``RemoteProtocolError``, as httpx's is (the gateway retries it).

What it does: ``POST`` with a JSON body over ``http`` and ``https`` (the system's or certifi's CAs,
``SSL_CERT_FILE``); answers framed by ``Content-Length``, chunked transfer encoding, or the end of the
connection; one timeout for connecting, waiting for a pooled connection and each read (as the OpenAI client
applies its ``timeout``), watched by one timer per request rather than one per read. What it leaves to
litellm: proxies (a configured proxy sends the model to litellm, see the router), HTTP/2, compression.

Failures are exceptions named as httpx names them (``ConnectError``, ``ReadError``, ``RemoteProtocolError``,
``ReadTimeout``, ``ConnectTimeout``, ``PoolTimeout``), each carrying its error ``kind`` (transient or
timeout), which the native transport hands to the shared classifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import ClassVar, Final
from urllib.parse import urlsplit

from runtime.errors import TransportError
from runtime.gateway._models import ErrorKind

_HEAD_LIMIT: Final = 64 * 1024
_READ_SIZE: Final = 64 * 1024


class HTTPTransportError(TransportError):
    """A request that failed below HTTP: no connection, a cut, a timeout, a malformed answer. ``kind`` is
    the error kind it is (each subclass's)."""

    kind: ClassVar[ErrorKind] = "transient"


class ConnectError(HTTPTransportError):
    pass


class ReadError(HTTPTransportError):
    pass


class WriteError(HTTPTransportError):
    pass


class RemoteProtocolError(HTTPTransportError):
    pass


class ConnectTimeout(HTTPTransportError):
    kind = "timeout"


class ReadTimeout(HTTPTransportError):
    kind = "timeout"


class PoolTimeout(HTTPTransportError):
    kind = "timeout"


class Endpoint:
    """A URL taken apart once: where to connect and the first lines of every request to it."""

    __slots__ = ("head", "host", "origin", "port", "tls")

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.origin = (parts.scheme, self.host, self.port)
        default_port = self.port == (443 if self.tls else 80)
        host_header = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host and not default_port:  # an IPv6 literal
            host_header = f"[{self.host}]:{self.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"POST {target} HTTP/1.1",
            f"host: {host_header}",
            "content-type: application/json",
            "accept: application/json, text/event-stream",
            "user-agent: agentcell",
        ]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        self.head = ("\r\n".join(lines) + "\r\n").encode("latin-1")


class _Connection:
    __slots__ = ("answered", "idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.answered = False  # a request on it was answered: it is a kept-alive connection

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        transport = self.writer.transport
        if not transport.is_closing():
            transport.abort()


class _Pool:
    """The connections to one origin: a stack of idle ones, a count of open ones, a queue of waiters."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def release(self, conn: _Connection | None, reusable: bool, now: float) -> None:
        if conn is not None and reusable and conn.usable():
            conn.idle_since = now
            self.idle.append(conn)
        else:
            if conn is not None:
                conn.close()
            self.open -= 1
        self.wake_one()

    def wake_one(self) -> None:
        """Tell the longest waiting request that a place (or an idle connection) is free."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break


class Response:
    """An answer's status and headers; its body read as it arrives (:meth:`chunks`) or whole (:meth:`read`).
    :meth:`close` gives the connection back (kept alive if the body was read to its end)."""

    __slots__ = ("_conn", "_done", "_framing", "_left", "_pool", "_watch", "headers", "reason", "status")

    def __init__(
        self,
        pool: _Pool,
        conn: _Connection,
        watch: _Watch,
        status: int,
        reason: str,
        headers: dict[str, str],
    ) -> None:
        self._pool = pool
        self._watch = watch
        self._conn: _Connection | None = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self._done = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing, self._left = "chunked", 0
        elif "content-length" in headers:
            try:
                self._framing, self._left = "length", int(headers["content-length"])
            except ValueError:
                raise RemoteProtocolError(f"bad content-length {headers['content-length']!r}") from None
        else:
            self._framing, self._left = "close", 0

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None or self._done:
            return
        reader = conn.reader
        watch = self._watch
        try:
            if self._framing == "length":
                left = self._left
                while left > 0:
                    data = await reader.read(min(left, _READ_SIZE))
                    if not data:
                        raise watch.failure(None)
                    watch.touch()
                    left -= len(data)
                    yield data
            elif self._framing == "chunked":
                while True:
                    line = await reader.readuntil(b"\r\n")
                    try:
                        size = int(line.split(b";", 1)[0], 16)
                    except ValueError:
                        raise RemoteProtocolError(f"bad chunk size {line[:40]!r}") from None
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    watch.touch()
                    yield data[:-2]
            else:
                while data := await reader.read(_READ_SIZE):
                    watch.touch()
                    yield data
                if watch.timed_out:
                    raise watch.failure(None)
            self._done = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
            raise watch.failure(exc) from None

    async def read(self, limit: int | None = None) -> bytes:
        """The body (its first ``limit`` bytes: then the connection is not kept)."""
        out = bytearray()
        async for data in self.chunks():
            out += data
            if limit is not None and len(out) >= limit:
                break
        return bytes(out)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            keep = (
                self._done
                and self._framing != "close"
                and self.headers.get("connection", "").lower() != "close"
            )
            self._watch.stop()
            self._pool.release(conn, keep, asyncio.get_running_loop().time())


class _Watch:
    """The timeout of the request in progress: one timer, re-armed only when it fires early."""

    __slots__ = ("_conn", "_handle", "_last", "_loop", "_timeout", "timed_out")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._conn: _Connection | None = None
        self._timeout = 0.0
        self._last = 0.0
        self.timed_out = False

    def start(self, loop: asyncio.AbstractEventLoop, conn: _Connection, timeout: float) -> None:
        self.stop()
        self._loop, self._conn, self._timeout = loop, conn, timeout
        self._last = loop.time()
        self.timed_out = False
        self._handle = loop.call_at(self._last + timeout, self._fire)

    def touch(self) -> None:
        if self._loop is not None:
            self._last = self._loop.time()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._conn = None

    def _fire(self) -> None:
        self._handle = None
        if self._loop is None or self._conn is None:
            return
        due = self._last + self._timeout
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._fire)
            return
        self.timed_out = True
        self._conn.close()  # the pending read ends; failure() says it was the timeout

    def failure(self, exc: BaseException | None) -> HTTPTransportError:
        if self.timed_out:
            return ReadTimeout(f"no data from the provider for {self._timeout:g} s")
        if exc is None:
            return RemoteProtocolError("the connection closed before the whole answer arrived")
        return ReadError(f"the connection failed while reading the answer: {exc!r}")


class HTTPClient:
    """Keep-alive connection pools, one per origin, on the running event loop (not thread-safe)."""

    def __init__(self, *, max_connections: int = 1_000, keepalive_expiry: float = 5.0) -> None:
        self._limit = max_connections
        self._expiry = keepalive_expiry
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._ssl: ssl.SSLContext | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            cafile = os.environ.get("SSL_CERT_FILE")
            if cafile is None:
                with contextlib.suppress(ImportError):
                    import certifi

                    cafile = certifi.where()
            self._ssl = ssl.create_default_context(cafile=cafile, capath=os.environ.get("SSL_CERT_DIR"))
        return self._ssl

    async def post(self, endpoint: Endpoint, extra_head: bytes, body: bytes, timeout: float) -> Response:
        """Send ``body`` to ``endpoint`` (``extra_head``: more header lines, each ending in CRLF) and return
        the answer once its status and headers arrived."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(endpoint.origin)
        if pool is None:
            pool = self._pools[endpoint.origin] = _Pool(self._limit)
        message = b"%scontent-length: %d\r\n%s\r\n%s" % (endpoint.head, len(body), extra_head, body)
        while True:
            conn = await self._acquire(pool, endpoint, timeout, loop)
            watch = _Watch()
            watch.start(loop, conn, timeout)
            try:
                conn.writer.write(message)
                await conn.writer.drain()
                head = await conn.reader.readuntil(b"\r\n\r\n")
                status, reason, headers = _parse_head(head)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                watch.stop()
                pool.release(conn, False, loop.time())
                if watch.timed_out:
                    raise ReadTimeout(f"no answer from the provider within {timeout:g} s") from None
                if conn.answered and not (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    # A kept-alive connection the server closed as the request went out (llama.cpp's server
                    # closes idle ones after a few seconds): not a word of an answer came, so the request
                    # goes again on another connection, as HTTP clients do. A fresh one is not retried.
                    continue
                raise RemoteProtocolError(f"the server disconnected without an answer: {exc!r}") from None
            except asyncio.LimitOverrunError:
                watch.stop()
                pool.release(conn, False, loop.time())
                raise RemoteProtocolError("the answer's headers are over 64 KiB") from None
            except BaseException:
                watch.stop()
                pool.release(conn, False, loop.time())
                raise
            conn.answered = True
            watch.touch()
            return Response(pool, conn, watch, status, reason, headers)

    async def _acquire(
        self, pool: _Pool, endpoint: Endpoint, timeout: float, loop: asyncio.AbstractEventLoop
    ) -> _Connection:
        now = loop.time()
        while pool.idle:
            conn = pool.idle.pop()
            if conn.usable() and now - conn.idle_since < self._expiry:
                return conn
            pool.release(conn, False, now)  # closed by the server, or expired: its place freed
        while pool.open >= pool.limit:
            if pool.idle:  # over the limit with idle ones: close the oldest to make room
                pool.release(pool.idle.pop(0), False, now)
                continue
            waiter: asyncio.Future[None] = loop.create_future()
            pool.waiters.append(waiter)
            # asyncio.timeout, not asyncio.wait_for: on Python 3.11, wait_for drops a cancel that arrives as
            # its future completes (it returns the result), and the cancelled request would go on.
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    pool.wake_one()  # woken, but leaving (cancelled, or timed out): the place goes on
                if isinstance(exc, TimeoutError):
                    raise PoolTimeout(f"no connection to {endpoint.host} free within {timeout:g} s") from None
                raise
            if pool.idle:
                conn = pool.idle.pop()
                if conn.usable():
                    return conn
                pool.release(conn, False, loop.time())
        pool.open += 1
        try:
            tls = self._ssl_context() if endpoint.tls else None
            async with asyncio.timeout(timeout):  # not wait_for, which may drop a cancel (above)
                reader, writer = await asyncio.open_connection(
                    endpoint.host, endpoint.port, ssl=tls, server_hostname=endpoint.host if tls else None
                )
        except TimeoutError:
            pool.release(None, False, loop.time())
            raise ConnectTimeout(
                f"no connection to {endpoint.host}:{endpoint.port} within {timeout:g} s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            pool.release(None, False, loop.time())
            raise ConnectError(f"cannot connect to {endpoint.host}:{endpoint.port}: {exc}") from None
        except BaseException:
            pool.release(None, False, loop.time())
            raise
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        """Close every idle connection (those in use close as their requests end)."""
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            for conn in pool.idle:
                conn.writer.close()
            pool.idle.clear()
        await asyncio.sleep(0)  # let the transports report their connections lost (the sockets close)


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
        raise RemoteProtocolError(f"not an HTTP answer: {lines[0][:80]!r}")
    try:
        status = int(status_line[1])
    except ValueError:
        raise RemoteProtocolError(f"bad status line {lines[0][:80]!r}") from None
    reason = status_line[2] if len(status_line) > 2 else ""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise RemoteProtocolError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if status_line[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return status, reason, headers
