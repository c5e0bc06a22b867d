"""Hostile HTTP clients, with the token and without it: what `agentcell serve` holds against.

Every request is answered with a status that says what went wrong (never a 500 for bad input), nothing a
client sends can make the server read without bound, and the server's policy, not the client, decides
where sessions work and whether they run shell commands.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime import Runtime
from runtime.apps.server import MAX_CURSOR_SESSIONS, ApiServer, ServerPolicy
from runtime.config import Config
from runtime.provider.script import Turn
from runtime.store.sessions import SessionDirectory
from tests.serve import serve_process

TOKEN = "hostile-token-" + "y" * 24
_names = iter(range(1, 1_000_000))


def script(provider: Any, *turns: Turn) -> str:
    name = f"hostile-server-{next(_names)}"
    provider.add_script(name, list(turns))
    return f"openai/{name}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "workspaces"
    (path / "project").mkdir(parents=True)
    return path


@pytest.fixture
def server(rt: Runtime, root: Path) -> Iterator[ApiServer]:
    with ApiServer(rt, TOKEN, policy=ServerPolicy(workspace_root=str(root)), max_body_bytes=64 * 1024) as s:
        yield s


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


def start(client: httpx.Client, provider: Any, *turns: Turn, **fields: Any) -> str:
    model = script(provider, *(turns or (Turn(text="hello"),)))
    body = {"model": model, "api_base": provider.url, "api_key": "sk-local", **fields}
    response = client.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def raw_request(server: ApiServer, head: str, body: bytes = b"", *, read: bool = True) -> bytes:
    """Send a request over a plain socket; the response (as much as arrives within 5 s)."""
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        if not read:
            return b""
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
                if b"\r\n\r\n" in data and b'"}' in data:
                    break
        except TimeoutError:
            pass
        return data


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


# -- request bodies ---------------------------------------------------------------------------------------


def test_a_declared_oversized_body_is_refused_before_it_is_read(server: ApiServer) -> None:
    """A Content-Length over the limit is answered with 413 at once, without waiting for the body."""
    head = (
        f"POST /sessions HTTP/1.1\nHost: x\nAuthorization: Bearer {TOKEN}\n"
        f"Content-Type: application/json\nContent-Length: {400 * 1024 * 1024}\n"
    )
    began = time.monotonic()
    response = raw_request(server, head, b'{"model": "')
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert b"larger than this server accepts" in response
    assert time.monotonic() - began < 2.0


def test_a_streamed_oversized_body_is_cut_off_at_the_limit(client: httpx.Client) -> None:
    """A body without Content-Length is counted as it arrives and refused with 413 past the limit, never
    held in memory whole."""
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page

    baseline, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    def body() -> Iterator[bytes]:
        yield b'{"model": "'
        for _ in range(1_000):  # 64 MB
            yield b"m" * 65_536
        yield b'"}'

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        response = client.post("/sessions", content=body())
    finally:
        done.set()
        sampler.join()
    assert response.status_code == 413, response.text[:200]
    assert "larger than this server accepts (65,536 bytes)" in response.json()["error"]
    assert peak[0] - baseline < 32 * 1024 * 1024, f"memory grew by {(peak[0] - baseline) >> 20} MB"
    assert client.get("/sessions").status_code == 200


def test_the_body_limit_is_a_setting(sessions_dir: Path, provider: Any) -> None:
    """server.max_body_bytes sets the limit (4 MiB by default)."""
    assert Config().server.max_body_bytes == 4 * 1024 * 1024
    config = Config().with_overrides({"server.max_body_bytes": 1_000})
    with Runtime(config, sessions_dir=sessions_dir) as rt, ApiServer(rt, TOKEN) as server:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        big = httpx.post(f"{server.url}/sessions", json={"system_prompt": "x" * 2_000}, headers=headers)
        assert big.status_code == 413
        small = httpx.post(f"{server.url}/sessions", json={"model": "m"}, headers=headers, timeout=30)
        assert small.status_code == 201


def test_deeply_nested_json_is_a_400(client: httpx.Client) -> None:
    """JSON nested thousands of levels deep, in any field, is a 400, not a 500."""
    deep = b'{"a": ' * 5_000 + b"1" + b"}" * 5_000
    for body in (
        b'{"model": "m", "config": ' + deep + b"}",
        b'{"model": "m", "config": {"compaction": ' + deep[:3000] + b"1" + b"}" * 500 + b"}}",
    ):
        response = client.post("/sessions", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text[:300]
        assert "nested" in response.json()["error"] or "JSON" in response.json()["error"]
    assert client.get("/sessions").json() == {"sessions": []}


def test_a_client_leaving_mid_body_is_not_an_error(
    server: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that disconnects while its body is read is not logged as an error."""
    caplog.set_level(logging.DEBUG)
    head = (
        f"POST /sessions HTTP/1.1\nHost: x\nAuthorization: Bearer {TOKEN}\n"
        "Content-Type: application/json\nContent-Length: 1000\n"
    )
    raw_request(server, head, b'{"model": "', read=False)
    time.sleep(0.5)
    assert errors_logged(caplog) == []


# -- requests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_authorization_scheme_is_case_insensitive(server: ApiServer, scheme: str) -> None:
    """`Authorization: bearer <token>` is accepted: the scheme is case-insensitive (RFC 7235)."""
    response = httpx.get(f"{server.url}/sessions", headers={"Authorization": f"{scheme} {TOKEN}"})
    assert response.status_code == 200
    wrong = httpx.get(f"{server.url}/sessions", headers={"Authorization": f"{scheme} {TOKEN.upper()}"})
    assert wrong.status_code == 401


@pytest.mark.parametrize("model", ["", " ", "gpt 4", "m\nx", "x" * 1_000, "\x00"])
def test_an_invalid_model_name_is_refused(client: httpx.Client, provider: Any, model: str) -> None:
    """POST /sessions/{id}/model with an empty or malformed model is a 400, and the session goes on."""
    sid = start(client, provider, Turn(text="one"), Turn(text="two"))
    before = client.get(f"/sessions/{sid}").json()["model"]
    response = client.post(f"/sessions/{sid}/model", json={"model": model})
    assert response.status_code == 400, response.text
    assert "model name" in response.json()["error"]
    assert client.get(f"/sessions/{sid}").json()["model"] == before
    turn = client.post(f"/sessions/{sid}/prompt", json={"text": "still fine?", "wait": True}).json()
    assert turn["status"] == "ok"
    assert client.post("/sessions", json={"model": model}).status_code == 400


def test_last_event_id_is_capped_and_keeps_only_real_covered_sessions(
    client: httpx.Client, provider: Any
) -> None:
    """A Last-Event-ID names at most 256 sessions, and made-up or uncovered ones are dropped."""
    too_many = ",".join(f"fake{i}:1" for i in range(MAX_CURSOR_SESSIONS + 1))
    response = client.get("/events", headers={"Last-Event-ID": too_many})
    assert response.status_code == 400 and "more than 256 sessions" in response.json()["error"]
    a, b = start(client, provider), start(client, provider)
    made_up = ",".join(f"fake{i}:{i}" for i in range(100))
    for params, expected in (({}, {a, b}), ({"session": a}, {a})):
        cursor = f"{a}:0,{b}:0,{made_up}"
        with client.stream("GET", "/events", params=params, headers={"Last-Event-ID": cursor}) as stream:
            first = next(stream.iter_lines())
        assert first.startswith("id: ")
        assert {part.rpartition(":")[0] for part in first[4:].split(",")} == expected
    many = ",".join(f"s{i}" for i in range(MAX_CURSOR_SESSIONS + 1))
    assert client.get("/events", params={"session": many}).status_code == 400


def test_a_stream_of_all_sessions_keeps_its_cursor_bounded() -> None:
    """An all-sessions stream's event ids name at most 256 sessions (the most recently active)."""
    from runtime.apps.server.sse import advance as _advance

    cursor: dict[str, int] = {}
    for i in range(1_000):
        _advance(cursor, f"s{i}", i + 1)
    _advance(cursor, "s500", 5_000)
    assert len(cursor) == MAX_CURSOR_SESSIONS and list(cursor)[-1] == "s500" and "s999" in cursor


def test_a_corrupt_session_log_is_a_409_that_says_how_to_open_it(
    client: httpx.Client, provider: Any, rt: Runtime, sessions_dir: Path, root: Path
) -> None:
    """A stored session with a corrupt log is a 409 naming the line; resume with repair opens it."""
    sid = start(client, provider, Turn(text="one"), Turn(text="two"), Turn(text="three"))
    assert (
        client.post(f"/sessions/{sid}/prompt", json={"text": "first", "wait": True}).json()["status"] == "ok"
    )
    assert (
        client.post(f"/sessions/{sid}/prompt", json={"text": "again", "wait": True}).json()["status"] == "ok"
    )
    rt.stop_session(sid)
    rt.services.writer.flush()
    log = SessionDirectory(sessions_dir).log_path(sid)
    lines = log.read_bytes().split(b"\n")
    second = [i for i, line in enumerate(lines) if b'"kind":"turn"' in line][1]
    lines[second] = b"{garbage"  # the second turn's first line: before it, "first" and its answer "one"
    log.write_bytes(b"\n".join(lines))
    # The session was started on an api_base: resumed without its key only where the server allows it.
    policy = ServerPolicy(workspace_root=str(root), allow_api_base=True)
    with (
        ApiServer(rt, TOKEN, policy=policy) as allowing,
        httpx.Client(
            base_url=allowing.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client,
    ):
        _corrupt_log_answers(client, sid, second + 1)


def _corrupt_log_answers(client: httpx.Client, sid: str, line: int) -> None:
    response = client.get(f"/sessions/{sid}/messages")
    assert response.status_code == 409 and f"line {line}" in response.json()["error"]
    assert "repair" in response.json()["error"]
    repaired = client.post(f"/sessions/{sid}/resume", json={"repair": "truncate"})
    assert repaired.status_code == 200, repaired.text
    texts = [m["parts"][0]["text"] for m in client.get(f"/sessions/{sid}/messages").json()["messages"]]
    assert texts == ["first", "one"]


# -- the server's policy ----------------------------------------------------------------------------------


def test_workspaces_must_lie_under_the_servers_root(client: httpx.Client, provider: Any, root: Path) -> None:
    """A client cannot give a session a workspace outside the server's workspace root."""
    for outside in ("/", "/etc", "..", "../..", str(root.parent), "project/../..", "~"):
        response = client.post("/sessions", json={"model": "m", "workspace": outside})
        assert response.status_code == 403, (outside, response.text)
        assert "outside this server's workspace root" in response.json()["error"]
    os.symlink("/", root / "escape")
    assert client.post("/sessions", json={"model": "m", "workspace": "escape"}).status_code == 403
    sid = start(client, provider, workspace="project")
    session = client.get(f"/sessions/{sid}").json()
    assert session["id"] == sid
    assert (
        client.post("/sessions", json={"model": "m", "workspace": str(root / "project")}).status_code == 201
    )


def test_without_a_root_sessions_get_no_workspace(rt: Runtime, tmp_path: Path) -> None:
    """A server without a workspace root refuses every workspace: that is the default."""
    with ApiServer(rt, TOKEN) as server:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        response = httpx.post(f"{server.url}/sessions", json={"workspace": str(tmp_path)}, headers=headers)
        assert response.status_code == 403 and "no workspace" in response.json()["error"]
        created = httpx.post(f"{server.url}/sessions", json={"model": "m"}, headers=headers, timeout=30)
        assert created.status_code == 201


@pytest.mark.parametrize(
    "config",
    [{"agent.shell_enabled": True}, {"agent": {"shell_enabled": True}}, {"agent.shell_enabled": "true"}],
)
def test_a_client_cannot_turn_the_shell_on(client: httpx.Client, config: dict[str, Any]) -> None:
    """A session's config may enable the shell tool only on a server that allows it."""
    response = client.post("/sessions", json={"model": "m", "config": config, "tools": "builtin"})
    assert response.status_code == 403 and "server.allow_shell" in response.json()["error"]
    assert client.get("/sessions").json() == {"sessions": []}


def test_a_server_that_allows_the_shell_lets_sessions_enable_it(rt: Runtime, root: Path) -> None:
    """With server.allow_shell, a session may enable the shell tool."""
    policy = ServerPolicy(workspace_root=str(root), allow_shell=True)
    with ApiServer(rt, TOKEN, policy=policy) as server:
        response = httpx.post(
            f"{server.url}/sessions",
            json={"model": "m", "config": {"agent.shell_enabled": True}, "workspace": "project"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert response.status_code == 201, response.text


@pytest.mark.parametrize("key", ["persistence.sessions_dir", "server.token", "runtime.tool_workers"])
def test_per_session_config_takes_session_keys_only(client: httpx.Client, key: str) -> None:
    """A runtime-wide key in a session's config is a 400 naming it, not silently ignored."""
    response = client.post("/sessions", json={"model": "m", "config": {key: 1}})
    assert response.status_code == 400
    assert f"{key} is not a per-session setting" in response.json()["error"]


def test_a_stored_session_is_resumed_only_within_the_policy(
    client: httpx.Client, rt: Runtime, tmp_path: Path, root: Path
) -> None:
    """A stored session whose workspace or shell the policy forbids is not resumed over HTTP."""
    rt.start_session("wide", model="m", workspace=tmp_path)
    rt.start_session("shelly", model="m", workspace=root / "project", config={"agent.shell_enabled": True})
    for sid in ("wide", "shelly"):
        rt.stop_session(sid)
    for sid, why in (("wide", "outside this server's workspace root"), ("shelly", "server.allow_shell")):
        for response in (
            client.get(f"/sessions/{sid}/context"),
            client.post(f"/sessions/{sid}/resume", json={}),
        ):
            assert response.status_code == 403 and why in response.json()["error"], response.text
    assert rt.hosted_sessions() == []
    resumed = client.post("/sessions/wide/resume", json={"workspace": "project"})
    assert resumed.status_code == 200, resumed.text  # given a workspace inside the root, it may go on


@pytest.mark.slow  # an agentcell serve process: seconds even on an idle machine
def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    """`agentcell serve --token-file F` reads the token from a file (it never shows in `ps`)."""
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-" + "z" * 20 + "\n")
    with serve_process(tmp_path / "sessions", "--token-file", str(token_file)) as served:
        assert "generated bearer token" not in served.banner
        assert httpx.get(f"{served.url}/sessions", timeout=10).status_code == 401
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert httpx.get(f"{served.url}/sessions", headers=headers, timeout=10).status_code == 200
        assert token_file.read_text().strip() not in " ".join(served.process.args)  # type: ignore[arg-type]


def test_an_empty_prompt_is_refused_with_the_python_apis_words(client: httpx.Client, provider: Any) -> None:
    """An empty prompt is a 400 with the same rule and message as the Python API's ValueError."""
    sid = start(client, provider)
    response = client.post(f"/sessions/{sid}/prompt", json={"text": " \n"})
    assert response.status_code == 400 and "prompt text must not be empty" in response.json()["error"]
    assert json.loads(client.get(f"/sessions/{sid}/messages").text) == {"messages": [], "total": 0}
