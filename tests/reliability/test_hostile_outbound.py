"""A token holder cannot make `agentcell serve` send the host's secrets, or reach inside its network.

The server's environment holds a provider key. A client names MCP servers (``POST /sessions``,
``POST /sessions/{id}/resume``): ``${NAME}`` in their headers or env is refused and never expanded from the
server's environment, their URL must be one the server's policy allows (``server.mcp_allowed_urls``, none by
default), and no loopback, private or link-local address is reached unless the policy names its host. A real
HTTP listener stands in for the attacker's URL: whatever the client tries, it never receives the key or any
value of the server's environment.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime import Runtime
from runtime.apps.server import ApiServer, ServerPolicy
from runtime.config import Config, McpServerConfig
from runtime.provider.script import Turn
from tests.conftest import Recorder

pytest.importorskip("mcp")

TOKEN = "outbound-token-" + "z" * 24
KEY = "sk-hostile-outbound-0123456789abcdefSECRET"
PROBE = "probe-value-of-the-servers-environment-7c1d"
_names = iter(range(1, 1_000_000))


class Listener:
    """An HTTP server on loopback that records every request (the attacker's MCP URL)."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self._record()

            def do_GET(self) -> None:
                self._record()

            def _record(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                listener.seen.append(bytes(self.requestline, "latin-1") + b"\n" + bytes(self.headers) + body)
                self.send_response(500)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def received(self) -> bytes:
        return b"\n".join(self.seen)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    srv = Listener()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def secrets_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("AGENTCELL_TEST_PROBE", PROBE)


def serve(rt: Runtime, allowed: list[str]) -> ApiServer:
    config = rt.config.with_overrides({"server.mcp_allowed_urls": allowed})
    return ApiServer(rt, TOKEN, policy=ServerPolicy.from_config(config.server))


def http(server: ApiServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def model(provider: Any) -> str:
    name = f"hostile-outbound-{next(_names)}"
    provider.add_script(name, [Turn(text="hello")] * 4)
    return f"openai/{name}"


def attack(client: httpx.Client, provider: Any, servers: dict[str, Any]) -> httpx.Response:
    """Create a session with ``servers``; if the server takes it, run a turn (which connects them)."""
    body = {"model": model(provider), "api_base": provider.url, "api_key": "sk-local", "mcp_servers": servers}
    created = client.post("/sessions", json=body)
    if created.status_code == 201:
        sid = created.json()["id"]
        client.post(f"/sessions/{sid}/prompt", json={"text": "hi", "wait": True})
    return created


def assert_nothing_leaked(listener: Listener) -> None:
    data = listener.received()
    assert KEY.encode() not in data
    assert PROBE.encode() not in data
    assert str(Path.home()).encode() + b"\r" not in data  # (${HOME}, as the probe found it)


def test_a_clients_mcp_server_never_gets_the_servers_environment(
    rt: Runtime, provider: Any, listener: Listener
) -> None:
    leaks = [
        {"x": {"url": listener.url, "headers": {"X-Leak": "${OPENAI_API_KEY}"}}},
        {"x": {"url": listener.url, "headers": {"Authorization": "Bearer ${OPENAI_API_KEY}"}}},
        {"x": {"url": listener.url, "headers": {"X-Probe": "${AGENTCELL_TEST_PROBE}", "X-Home": "${HOME}"}}},
        {"x": {"url": listener.url, "env": {"K": "${OPENAI_API_KEY}"}}},
        {"x": {"url": listener.url, "headers": {"X-Leak": "${OPENAI_API_KEY}"}, "expand_env": True}},
    ]
    # The policy names the listener: its URL is allowed, so only the ${NAME} rule stands between them.
    with serve(rt, [listener.url]) as server, http(server) as client:
        for servers in leaks:
            refused = attack(client, provider, servers)
            assert refused.status_code == 403, refused.text
            assert "does not expand ${NAME}" in refused.json()["error"]
        # a client's own header values go as written, and nothing of the environment with them
        plain = attack(
            client, provider, {"x": {"url": listener.url, "headers": {"X-Mine": "value $HOME {x}"}}}
        )
        assert plain.status_code == 201, plain.text
        sid = plain.json()["id"]
        assert rt._session(sid).spec.mcp_servers["x"].expand_env is False
        # a sub-agent profile carries no MCP servers; Responses takes function tools only
        profile = {"description": "d", "mcp_servers": {"x": {"url": listener.url}}}
        body = {"model": model(provider), "api_base": provider.url, "api_key": "sk-local"}
        assert client.post("/sessions", json={**body, "agents": {"a": profile}}).status_code == 400
        tool = {"type": "mcp", "server_label": "x", "server_url": listener.url,
                "headers": {"X-Leak": "${OPENAI_API_KEY}"}}  # fmt: skip
        responses = client.post(
            "/v1/responses", json={"model": model(provider), "input": "hi", "tools": [tool]}
        )
        assert responses.status_code == 400
    assert any(b"value $HOME {x}" in seen for seen in listener.seen)
    assert_nothing_leaked(listener)


INTERNAL = {
    "localhost": "loopback",
    "127.1": "loopback",
    "2130706433": "loopback",  # 127.0.0.1 in decimal
    "0x7f000001": "loopback",
    "[::1]": "loopback",
    "[::ffff:127.0.0.1]": "loopback",
    "[::ffff:7f00:1]": "loopback",
    "169.254.169.254": "link-local",  # cloud metadata
    "10.1.2.3": "private",
    "192.168.0.1": "private",
    "[fd00:ec2::254]": "private",
    "100.100.100.200": "reserved",  # shared address space (a metadata service lives there)
    "0.0.0.0": "unspecified",
}


def test_internal_urls_are_refused_with_a_clear_error(rt: Runtime, provider: Any, listener: Listener) -> None:
    with serve(rt, ["*"]) as server, http(server) as client:
        for host, kind in INTERNAL.items():
            url = f"http://{host}:{listener.port}/mcp"
            refused = attack(client, provider, {"x": {"url": url}})
            assert refused.status_code == 403, (host, refused.text)
            error = refused.json()["error"]
            assert f"a {kind} address" in error and "server.mcp_allowed_urls" in error, error
    with serve(rt, []) as server, http(server) as client:  # by default no URL at all
        refused = attack(client, provider, {"x": {"url": "https://mcp.example.com/mcp"}})
        assert refused.status_code == 403
        assert "no MCP server at a URL" in refused.json()["error"]
    with serve(rt, ["https://mcp.example.com/tools/"]) as server, http(server) as client:
        for url in ("https://mcp.example.com.evil.test/tools/", "https://mcp.example.com/toolsx",
                    "http://mcp.example.com/tools/", "https://mcp.example.com@127.0.0.1/tools/"):  # fmt: skip
            refused = attack(client, provider, {"x": {"url": url}})
            assert refused.status_code == 403, url
            assert "not among the URLs" in refused.json()["error"]
    assert listener.seen == []


def test_a_client_server_is_checked_again_at_every_connection(
    sessions_dir: Path, provider: Any, listener: Listener
) -> None:
    # A name that resolved to a public address when the session was made may resolve inside later: the
    # connection itself refuses internal addresses (here given directly, as a name that changed would be).
    recorder = Recorder()
    with Runtime(Config(), sessions_dir=sessions_dir) as rt:
        rt.subscribe(callback=recorder)
        server = McpServerConfig(
            url=f"http://localhost:{listener.port}/mcp", headers={"X-Probe": PROBE}, public_only=True
        )
        sid = rt.start_session(
            model=model(provider), api_base=provider.url, api_key="sk-local", mcp_servers={"x": server}
        )
        rt.prompt(sid, "hi").result(30)
        recorder.wait_type("agent_end")  # the callback's thread has the turn's events
    errors = [e.message for e in recorder.of("mcp_server_error", sid)]
    assert errors and "loopback address" in errors[0], errors
    assert listener.seen == []


def test_a_stored_client_server_is_checked_against_the_policy_when_resumed(
    sessions_dir: Path, provider: Any, listener: Listener
) -> None:
    with (
        Runtime(Config(), sessions_dir=sessions_dir) as rt,
        serve(rt, [listener.url]) as server,
        http(server) as client,
    ):
        created = attack(client, provider, {"x": {"url": listener.url}})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
    seen = len(listener.seen)
    with (
        Runtime(Config(), sessions_dir=sessions_dir) as rt,
        serve(rt, []) as server,  # the operator took the URL off the list
        http(server) as client,
    ):
        resumed = client.post(f"/sessions/{sid}/resume", json={"api_key": "sk-local"})
        assert resumed.status_code == 403, resumed.text
        assert "mcp_servers.x" in resumed.json()["error"]
    assert len(listener.seen) == seen
    assert_nothing_leaked(listener)


def test_a_clients_api_base_never_reaches_a_metadata_service(rt: Runtime, provider: Any) -> None:
    body = {"model": model(provider), "api_key": "sk-client-own"}
    with serve(rt, []) as server, http(server) as client:
        for base, kind in (
            ("http://169.254.169.254/latest", "link-local"),
            ("http://[fe80::1]/v1", "link-local"),
            ("http://100.100.100.200/v1", "reserved"),
            ("http://[::ffff:169.254.169.254]/v1", "link-local"),
        ):
            refused = client.post("/sessions", json={**body, "api_base": base})
            assert refused.status_code == 403, (base, refused.text)
            assert f"a {kind} address" in refused.json()["error"]
            assert "server.api_base_allowed_urls" in refused.json()["error"]
        # loopback and private endpoints (local model servers) are allowed by default
        local = client.post("/sessions", json={**body, "api_base": provider.url})
        assert local.status_code == 201, local.text
    strict = rt.config.with_overrides({"server.api_base_private": False})
    with (
        ApiServer(rt, TOKEN, policy=ServerPolicy.from_config(strict.server)) as server,
        http(server) as client,
    ):
        refused = client.post("/sessions", json={**body, "api_base": provider.url})
        assert refused.status_code == 403 and "a loopback address" in refused.json()["error"]
    named = strict.with_overrides({"server.api_base_allowed_urls": ["*", provider.url]})
    with (
        ApiServer(rt, TOKEN, policy=ServerPolicy.from_config(named.server)) as server,
        http(server) as client,
    ):
        assert client.post("/sessions", json={**body, "api_base": provider.url}).status_code == 201


def test_a_session_stored_before_servers_said_whose_they_were_is_checked_as_a_clients(
    sessions_dir: Path, provider: Any, listener: Listener
) -> None:
    import json

    from runtime.store.sessions import SessionDirectory

    leak = {"x": {"url": listener.url, "headers": {"X-Leak": "${AGENTCELL_TEST_PROBE}"}}}
    with Runtime(Config(), sessions_dir=sessions_dir) as rt:  # the host's own: ${NAME} is its to use
        sid = rt.start_session(
            model=model(provider), api_base=provider.url, api_key="sk-local", mcp_servers=leak
        )
        rt.prompt(sid, "hi").result(30)
    assert PROBE.encode() in listener.received()  # (the host's server got the host's value)
    listener.seen.clear()
    path = SessionDirectory(sessions_dir).log_path(sid)
    lines = path.read_bytes().split(b"\n")
    header = json.loads(lines[0])
    assert header["mcp_servers"]["x"]["expand_env"] is True
    del header["mcp_servers"]["x"]["expand_env"]  # as a log written before this field existed
    path.write_bytes(b"\n".join([json.dumps(header).encode(), *lines[1:]]))
    with (
        Runtime(Config(), sessions_dir=sessions_dir) as rt,
        serve(rt, [listener.url]) as server,
        http(server) as client,
    ):
        resumed = client.post(f"/sessions/{sid}/resume", json={"api_key": "sk-local"})
        assert resumed.status_code == 403 and "does not expand ${NAME}" in resumed.json()["error"]
        prompted = client.post(f"/sessions/{sid}/prompt", json={"text": "again", "wait": True})
        assert prompted.status_code == 403
    assert_nothing_leaked(listener)
