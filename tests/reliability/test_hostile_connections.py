"""Connections that hold `agentcell serve` without asking anything of it are closed on time; clients are served.

The probe that found this: 200 connections that never sent a request were all still open after 35 s, and
holding them needs no token. Here, with short limits, over real sockets: silent connections, headers sent a
byte at a time, a body that never ends and an idle keep-alive connection are closed within their deadline,
an event stream (a busy connection) is not, and past ``server.max_connections`` the oldest idle connection
makes way, so a normal client is served while the server is full of idle ones.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime import Runtime
from runtime.apps.server import ApiServer
from runtime.config import Config

TOKEN = "connections-hostile-token-" + "k" * 16
HEADERS = 1.0  # server.header_timeout
BODY = 1.5  # server.body_timeout
KEEP_ALIVE = 1.0  # server.keep_alive_timeout
MAX = 40  # server.max_connections
SLACK = 3.0  # how late a close may come on a loaded machine


@pytest.fixture
def server(sessions_dir: Path) -> Iterator[ApiServer]:
    config = Config().with_overrides(
        {
            "server.header_timeout": HEADERS,
            "server.body_timeout": BODY,
            "server.keep_alive_timeout": KEEP_ALIVE,
            "server.max_connections": MAX,
        }
    )
    with Runtime(config, sessions_dir=sessions_dir) as rt, ApiServer(rt, TOKEN) as srv:
        yield srv


def connect(server: ApiServer) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (reading whatever it sends first)."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset
            return True
    return False


def served(server: ApiServer) -> bool:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as c:
        return c.get("/sessions").status_code == 200


def open_count(server: ApiServer) -> int:
    return len(server._server.server_state.connections)


def test_silent_and_slow_connections_are_closed_on_time(server: ApiServer) -> None:
    silent = [connect(server) for _ in range(10)]
    trickling = [connect(server) for _ in range(3)]
    stop = threading.Event()

    def trickle() -> None:  # a request line a byte at a time: never a complete header block
        line = b"GET /sessions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
        for i in range(len(line)):
            for sock in trickling:
                try:
                    sock.send(line[i : i + 1])
                except OSError:
                    pass
            if stop.wait(0.1):
                return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        started = time.monotonic()
        assert served(server)  # a normal client meanwhile
        for sock in silent + trickling:
            assert closed_by_server(sock, HEADERS + SLACK - (time.monotonic() - started))
        assert served(server)
    finally:
        stop.set()
        for sock in silent + trickling:
            sock.close()


def test_a_body_that_never_ends_and_an_idle_keep_alive_connection_are_closed(server: ApiServer) -> None:
    body = connect(server)
    body.sendall(
        f"POST /sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
    )
    assert closed_by_server(body, BODY + SLACK)
    body.close()

    kept = connect(server)
    kept.sendall(f"GET /sessions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    kept.settimeout(10)
    assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    assert closed_by_server(kept, KEEP_ALIVE + SLACK)
    kept.close()


def test_an_event_stream_outlives_the_header_deadline(server: ApiServer) -> None:
    stream = connect(server)
    stream.sendall(f"GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    stream.settimeout(10)
    assert stream.recv(65536).startswith(b"HTTP/1.1 200")
    assert not closed_by_server(stream, HEADERS + BODY + 1.0)  # busy: no deadline
    stream.close()


def test_idle_connections_past_the_cap_make_way_for_clients(server: ApiServer) -> None:
    idle = [connect(server) for _ in range(MAX * 3)]
    try:
        time.sleep(0.3)
        assert open_count(server) <= MAX + 1
        for _ in range(5):  # each new client closes the oldest idle connection and is served
            assert served(server)
        assert open_count(server) <= MAX + 1
        assert closed_by_server(idle[0], SLACK)  # the oldest were closed first
    finally:
        for sock in idle:
            sock.close()
