"""The native transport's HTTP/1.1 client (runtime.gateway.transports._http) against a scripted server:
keep-alive reuse, connections the server closed, every body framing, timeouts, the pool limit, TLS."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.gateway.transports._http import (
    ConnectError,
    Endpoint,
    HTTPClient,
    PoolTimeout,
    ReadTimeout,
    RemoteProtocolError,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]


class Server:
    """An asyncio server in its own thread; ``routes`` answer by path; counts connections."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.routes: dict[str, Handler] = {}
        self._loop = asyncio.new_event_loop()
        self._tls = tls
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(5)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        )
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                path = head.split(b" ")[1].decode()
                if not await self.routes[path](reader, writer, body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


async def content_length(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'
    )
    await writer.drain()
    return True


async def chunked(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    for piece in (b"data: one\n\n", b"data: two\n\n"):
        writer.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(b"0\r\nx-trailer: yes\r\n\r\n")
    await writer.drain()
    return True


async def close_delimited(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it until the end")
    await writer.drain()
    return False


async def hang_after_head(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
    await writer.drain()
    await asyncio.sleep(5)
    return False


async def hang(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
    await asyncio.sleep(5)
    return False


async def hang_up(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
    return False  # closes without a word


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.routes.update(
        {
            "/cl": content_length,
            "/chunked": chunked,
            "/close": close_delimited,
            "/stall": hang_after_head,
            "/hang": hang,
            "/hangup": hang_up,
        }
    )
    yield s
    s.stop()


def endpoint(server: Server, path: str, scheme: str = "http", host: str = "127.0.0.1") -> Endpoint:
    return Endpoint(f"{scheme}://{host}:{server.port}{path}", {"x-extra": "1"})


async def fetch(
    client: HTTPClient, point: Endpoint, timeout: float = 5.0
) -> tuple[int, bytes, dict[str, str]]:
    response = await client.post(point, b"authorization: Bearer k\r\n", b'{"q": 1}', timeout)
    try:
        return response.status, await response.read(), response.headers
    finally:
        response.close()


def test_connections_are_kept_alive_and_reused(server: Server) -> None:
    async def main() -> None:
        client = HTTPClient()
        for _ in range(5):
            status, body, _ = await fetch(client, endpoint(server, "/cl"))
            assert (status, body) == (200, b'{"ok": true}')
        assert server.connections == 1
        results = await asyncio.gather(*(fetch(client, endpoint(server, "/cl")) for _ in range(8)))
        assert all(r[1] == b'{"ok": true}' for r in results)
        assert server.connections == 8, "one per concurrent request, the idle one reused"
        await client.aclose()

    asyncio.run(main())
    request = server.requests[0]
    assert request.startswith(b"POST /cl HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"\r\nx-extra: 1\r\n" in request and b"\r\nauthorization: Bearer k\r\n" in request
    assert b"\r\ncontent-length: 8\r\n" in request and request.endswith(b'\r\n\r\n{"q": 1}')


def test_chunked_and_close_delimited_bodies(server: Server) -> None:
    async def main() -> None:
        client = HTTPClient()
        response = await client.post(endpoint(server, "/chunked"), b"", b"{}", 5.0)
        pieces = [piece async for piece in response.chunks()]
        response.close()
        assert pieces == [b"data: one\n\n", b"data: two\n\n"]
        assert (await fetch(client, endpoint(server, "/chunked")))[1] == b"data: one\n\ndata: two\n\n"
        assert server.connections == 1, "a chunked answer read to its end keeps the connection"
        status, body, headers = await fetch(client, endpoint(server, "/close"))
        assert (status, body, headers["connection"]) == (200, b"all of it until the end", "close")
        await fetch(client, endpoint(server, "/cl"))
        assert server.connections == 2, "a connection the answer's end closed is not reused"
        await client.aclose()

    asyncio.run(main())


def test_a_connection_the_server_closed_while_idle_is_not_reused(server: Server) -> None:
    async def main() -> None:
        client = HTTPClient()
        with pytest.raises(RemoteProtocolError, match="disconnected without an answer"):
            await fetch(client, endpoint(server, "/hangup"))
        await fetch(client, endpoint(server, "/cl"))
        await asyncio.sleep(0.05)
        assert server.connections == 2
        await client.aclose()

    asyncio.run(main())


def test_a_kept_alive_connection_closed_as_the_request_goes_out_is_retried_on_a_new_one(
    server: Server,
) -> None:
    """A server that closes a kept-alive connection just as a request arrives on it (llama.cpp's server does
    after a few idle seconds): the request goes again on a new connection and is answered; nothing reaches
    the caller. (A fresh connection that hangs up is an error: the test above.)"""
    calls: list[int] = []

    async def hang_up_once(reader: Any, writer: asyncio.StreamWriter, body: bytes) -> bool:
        calls.append(1)
        if len(calls) == 1:
            return False  # the request was read, and the connection closed without a word
        return await content_length(reader, writer, body)

    server.routes["/once"] = hang_up_once

    async def main() -> None:
        client = HTTPClient()
        await fetch(client, endpoint(server, "/cl"))  # a kept-alive connection, then reused
        status, body, _ = await fetch(client, endpoint(server, "/once"))
        assert (status, body) == (200, b'{"ok": true}')
        await client.aclose()

    asyncio.run(main())
    assert len(calls) == 2 and server.connections == 2


def test_idle_connections_expire(server: Server) -> None:
    async def main() -> None:
        client = HTTPClient(keepalive_expiry=0.05)
        await fetch(client, endpoint(server, "/cl"))
        await asyncio.sleep(0.1)
        await fetch(client, endpoint(server, "/cl"))
        assert server.connections == 2
        await client.aclose()

    asyncio.run(main())


def test_timeouts(server: Server) -> None:
    async def main() -> None:
        client = HTTPClient()
        with pytest.raises(ReadTimeout):
            await fetch(client, endpoint(server, "/hang"), timeout=0.2)
        with pytest.raises(ReadTimeout):
            await fetch(client, endpoint(server, "/stall"), timeout=0.2)
        with pytest.raises(ConnectError):
            await fetch(client, Endpoint("http://127.0.0.1:9/nothing", {}), timeout=1.0)
        await client.aclose()

    asyncio.run(main())


def test_the_pool_limit_queues_requests_and_times_out(server: Server) -> None:
    async def main() -> None:
        client = HTTPClient(max_connections=2)
        results = await asyncio.gather(*(fetch(client, endpoint(server, "/cl")) for _ in range(6)))
        assert len(results) == 6 and server.connections <= 2
        hung = [asyncio.ensure_future(fetch(client, endpoint(server, "/hang"), timeout=3)) for _ in range(2)]
        await asyncio.sleep(0.1)
        with pytest.raises(PoolTimeout):
            await fetch(client, endpoint(server, "/cl"), timeout=0.2)
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        assert (await fetch(client, endpoint(server, "/cl")))[0] == 200, (
            "cancelled requests gave their places back"
        )
        await client.aclose()

    asyncio.run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_with_the_certificates_ssl_cert_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = Server(tls)
    server.routes["/cl"] = content_length
    try:

        async def main() -> None:
            client = HTTPClient()
            with pytest.raises(ConnectError, match="certificate"):  # certifi does not know it
                await fetch(client, endpoint(server, "/cl", "https", "localhost"))
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            trusting = HTTPClient()
            for _ in range(2):
                assert await fetch(trusting, endpoint(server, "/cl", "https", "localhost")) == (
                    200,
                    b'{"ok": true}',
                    {"content-type": "application/json", "content-length": "12"},
                )
            await trusting.aclose()

        asyncio.run(main())
    finally:
        server.stop()
    assert server.connections == 1, "the refused handshake never got in; one connection kept alive over TLS"


def test_a_cancel_that_arrives_as_the_connection_is_made_is_not_lost(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request cancelled in the very loop iteration its connection is made must end cancelled. (On
    Python 3.11, ``asyncio.wait_for`` around the connect returned the connection and dropped the cancel: the
    request went out anyway and waited for its answer, a hung one until the read timeout.)"""
    real_connect = asyncio.open_connection
    caller: list[asyncio.Task[Any]] = []

    async def connect_then_cancel(*args: Any, **kwargs: Any) -> Any:
        connection = await real_connect(*args, **kwargs)
        caller[0].cancel()  # the cancel lands together with the connection
        return connection

    async def main() -> None:
        client = HTTPClient()
        monkeypatch.setattr(asyncio, "open_connection", connect_then_cancel)
        task = asyncio.ensure_future(fetch(client, endpoint(server, "/hang"), timeout=30))
        caller.append(task)
        done, _ = await asyncio.wait({task}, timeout=2)
        assert task in done and task.cancelled(), "the cancel was lost: the request went on"
        monkeypatch.setattr(asyncio, "open_connection", real_connect)
        assert (await fetch(client, endpoint(server, "/cl")))[0] == 200
        pool = client._pools[endpoint(server, "/cl").origin]
        assert (pool.open, len(pool.idle)) == (1, 1), "only the finished request's connection is kept"
        await client.aclose()

    asyncio.run(main())


def test_a_cancel_that_arrives_as_a_pooled_place_is_handed_over_is_not_lost(server: Server) -> None:
    """With the pool full, a waiter cancelled just as a place is handed to it ends cancelled, and passes
    the place on to the next waiter (it neither takes a connection nor swallows the wake-up)."""

    async def main() -> None:
        client = HTTPClient(max_connections=1)
        holder = asyncio.ensure_future(fetch(client, endpoint(server, "/hang"), timeout=30))
        await asyncio.sleep(0.1)
        cancelled = asyncio.ensure_future(fetch(client, endpoint(server, "/hang"), timeout=30))
        await asyncio.sleep(0.05)
        patient = asyncio.ensure_future(fetch(client, endpoint(server, "/cl"), timeout=3))
        await asyncio.sleep(0.05)
        pool = client._pools[endpoint(server, "/cl").origin]
        release = pool.release

        def release_and_cancel(*args: Any) -> None:  # the first waiter is woken and cancelled in one step
            del pool.release
            release(*args)
            cancelled.cancel()

        pool.release = release_and_cancel  # type: ignore[method-assign]
        holder.cancel()  # its connection closes: a place is free
        done, _ = await asyncio.wait({holder, cancelled}, timeout=2)
        assert holder in done and holder.cancelled()
        assert cancelled in done and cancelled.cancelled(), "the cancel was lost: the waiter went on"
        status, body, _ = await patient
        assert (status, body) == (200, b'{"ok": true}'), "the place went on to the next waiter"
        assert (pool.open, len(pool.idle), server.connections) == (1, 1, 2)
        await client.aclose()

    asyncio.run(main())
