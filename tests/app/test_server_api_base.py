"""A client of ``agentcell serve`` must not point a session at its own endpoint and collect the server's
provider key (design §9): litellm (and the native transport, which reads keys where litellm does) sends the
key from the server's environment to whatever ``api_base`` a session names when it has no key of its own.
Over HTTP an ``api_base`` therefore needs the request's own ``api_key``, or the operator's leave
(``server.allow_api_base`` / ``--allow-api-base``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.apps.server import ApiServer, ServerPolicy

TOKEN = "api-base-token"
SERVER_KEY = "sk-the-servers-own-openai-key"


class Collector:
    """An endpoint a token holder controls: it records the Authorization header of every request."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                collector.seen.append(self.headers.get("authorization", ""))
                body = json.dumps({"error": {"message": "no", "type": "invalid_request_error"}}).encode()
                self.send_response(401)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture
def serve(rt: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``serve(policy)``: the runtime served with ``policy``, as an httpx client; the server's environment
    holds its own OpenAI key."""
    monkeypatch.setenv("OPENAI_API_KEY", SERVER_KEY)
    servers: list[ApiServer] = []

    def start(policy: ServerPolicy) -> httpx.Client:
        server = ApiServer(rt, TOKEN, policy=policy).start()
        servers.append(server)
        return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)

    yield start
    for server in servers:
        server.stop()


def run_a_turn(client: httpx.Client, sid: str) -> dict[str, Any]:
    answer = client.post(f"/sessions/{sid}/prompt", json={"text": "hello", "wait": True})
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_an_api_base_without_a_key_would_get_the_servers_key(serve: Any, collector: Collector) -> None:
    """What the policy prevents, shown with the operator's leave: the server's key goes to the URL."""
    client = serve(ServerPolicy(allow_api_base=True))
    created = client.post("/sessions", json={"model": "openai/gpt-4o-mini", "api_base": collector.url})
    assert created.status_code == 201, created.text
    run_a_turn(client, created.json()["id"])
    assert collector.seen and all(seen == f"Bearer {SERVER_KEY}" for seen in collector.seen)


def test_an_api_base_without_its_own_key_is_refused(serve: Any, collector: Collector, rt: Any) -> None:
    client = serve(ServerPolicy())  # the default
    refused = client.post("/sessions", json={"model": "openai/gpt-4o-mini", "api_base": collector.url})
    assert refused.status_code == 403
    assert "give your own api_key with an api_base" in refused.json()["error"]
    assert "--allow-api-base" in refused.json()["error"]
    blank = client.post(
        "/sessions", json={"model": "openai/gpt-4o-mini", "api_base": collector.url, "api_key": "  "}
    )
    assert blank.status_code == 403  # a blank key is no key
    assert rt.hosted_sessions() == [] and collector.seen == []


def test_an_api_base_with_its_own_key_gets_that_key_only(serve: Any, collector: Collector) -> None:
    client = serve(ServerPolicy())
    created = client.post(
        "/sessions",
        json={"model": "openai/gpt-4o-mini", "api_base": collector.url, "api_key": "sk-the-clients-key"},
    )
    assert created.status_code == 201, created.text
    assert run_a_turn(client, created.json()["id"])["status"] == "error"  # the collector refuses every key
    assert collector.seen and set(collector.seen) == {"Bearer sk-the-clients-key"}


def test_a_stored_session_with_an_api_base_is_resumed_only_with_a_key(
    serve: Any, collector: Collector, rt: Any
) -> None:
    """Keys are never stored: once the session is no longer hosted (a restart, here a stop), naming it
    would resume it on the server's keys, sent to the stored endpoint."""
    client = serve(ServerPolicy())
    created = client.post(
        "/sessions",
        json={"model": "openai/gpt-4o-mini", "api_base": collector.url, "api_key": "sk-the-clients-key"},
    )
    sid = created.json()["id"]
    rt.stop_session(sid)
    rt.services.writer.flush()  # its header is on disk (a session never used wrote it in the background)
    for method, path, body in (
        ("POST", f"/sessions/{sid}/prompt", {"text": "hello", "wait": True}),  # resumes on first use
        ("GET", f"/sessions/{sid}/context", None),
        ("POST", f"/sessions/{sid}/resume", {}),
        ("POST", f"/sessions/{sid}/resume", {"api_base": collector.url}),
    ):
        response = client.request(method, path, json=body)
        assert response.status_code == 403, (path, response.text)
        assert f"POST /sessions/{sid}/resume" in response.json()["error"]
    assert rt.hosted_sessions() == [] and collector.seen == []
    resumed = client.post(f"/sessions/{sid}/resume", json={"api_key": "sk-a-new-key"})
    assert resumed.status_code == 200, resumed.text
    run_a_turn(client, sid)
    assert set(collector.seen) == {"Bearer sk-a-new-key"}


def test_a_stored_session_without_an_api_base_still_resumes_on_first_use(serve: Any, rt: Any) -> None:
    """The policy is about endpoints a client chose: a session on the provider's own endpoint resumes as
    before, on the server's keys."""
    sid = rt.start_session(model="openai/gpt-4o-mini")
    rt.stop_session(sid)
    rt.services.writer.flush()
    client = serve(ServerPolicy())
    assert client.get(f"/sessions/{sid}/context").status_code == 200
    assert sid in rt.hosted_sessions()


def test_the_operator_allows_it_in_the_config_or_on_the_command_line(tmp_path: Path) -> None:
    from runtime.apps.cli import build_parser
    from runtime.config import Config

    assert ServerPolicy.from_config(Config().server).allow_api_base is False
    allowed = Config().with_overrides({"server.allow_api_base": True})
    assert ServerPolicy.from_config(allowed.server).allow_api_base is True
    assert build_parser().parse_args(["serve", "--allow-api-base"]).allow_api_base is True
    assert build_parser().parse_args(["serve"]).allow_api_base is False
    with pytest.raises(ValueError, match="server"):  # a session cannot allow itself
        Config().for_session({"server.allow_api_base": True})
