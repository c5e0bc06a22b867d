"""Bad input over HTTP (design §7.2, 9): missing or wrong tokens and malformed requests on every route.

Each is answered with a 4xx and ``{"error": ...}``, changes nothing, and leaves the server serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.apps.server import ApiServer
from runtime.provider.script import Turn

TOKEN = "reliability-token-" + "x" * 24

ROUTES = [
    ("POST", "/sessions"),
    ("GET", "/sessions"),
    ("GET", "/sessions/{sid}"),
    ("DELETE", "/sessions/{sid}"),
    ("POST", "/sessions/{sid}/resume"),
    ("POST", "/sessions/{sid}/prompt"),
    ("POST", "/sessions/{sid}/abort"),
    ("POST", "/sessions/{sid}/compact"),
    ("GET", "/sessions/{sid}/context"),
    ("GET", "/sessions/{sid}/messages"),
    ("POST", "/sessions/{sid}/branch"),
    ("POST", "/sessions/{sid}/model"),
    ("GET", "/events"),
    ("GET", "/no/such/route"),
    ("PUT", "/sessions"),
]

WRONG_AUTHORIZATION = [
    None,
    "",
    "Bearer",
    f"Bearer {TOKEN[:-1]}",
    f"Bearer {TOKEN}x",
    f"bearer {TOKEN.upper()}",
    f"Basic {TOKEN}",
    f"{TOKEN}",
    f"Bearer  {TOKEN}",
    "Bearer " + "A" * 10_000,
]


@pytest.fixture
def server(rt: Any) -> Iterator[ApiServer]:
    with ApiServer(rt, TOKEN) as s:
        yield s


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


@pytest.fixture
def sid(client: httpx.Client, provider: Any, script: Any) -> str:
    model = script(Turn(text="first"), Turn(text="second"), Turn(text="third"))
    response = client.post(
        "/sessions", json={"model": model, "api_base": provider.url, "api_key": "sk-local"}
    )
    assert response.status_code == 201, response.text
    assert (
        client.post(f"/sessions/{response.json()['id']}/prompt", json={"text": "one", "wait": True}).json()[
            "status"
        ]
        == "ok"
    )
    return str(response.json()["id"])


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_route_answers_without_the_right_token_and_nothing_changes(
    rt: Any, server: ApiServer, client: httpx.Client, sid: str, sessions_dir: Path
) -> None:
    rt.services.writer.flush()  # the turn's last transcript lines are written lazily (transcript_delay)
    before = snapshot(sessions_dir)
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        every_kind = [("GET", "/sessions"), ("POST", "/sessions/{sid}/prompt")]
        attempts = [(route, auth) for route in every_kind for auth in WRONG_AUTHORIZATION]
        attempts += [(route, auth) for route in ROUTES for auth in (None, f"Bearer {TOKEN[::-1]}")]
        for (method, path), authorization in attempts:
            headers = {} if authorization is None else {"Authorization": authorization}
            body = {"text": "sneaky", "wait": True} if method == "POST" else None
            response = anonymous.request(
                method, path.format(sid=sid), headers=headers, json=body, params={"token": TOKEN}
            )
            assert response.status_code == 401, (method, path, authorization, response.text)
            assert response.json() == {"error": "missing or wrong bearer token"}
    assert snapshot(sessions_dir) == before  # no session made, deleted, prompted or compacted
    messages = client.get(f"/sessions/{sid}/messages").json()["messages"]
    assert [m["parts"][0]["text"] for m in messages] == ["one", "first"]


HOSTILE_PATHS = [
    "/sessions/..%2F..%2Fetc%2Fpasswd/context",
    "/sessions/%2Fetc%2Fpasswd/context",
    "/sessions/a%00b/context",
    "/sessions/%2E%2E/context",
    "/sessions/x%0Ay/context",
    "/sessions/" + "x" * 200 + "/context",
    "/sessions/-rf/context",
    "/sessions/other.events/context",
    "/sessions/%C3%BC/context",
    "/sessions/%FF%FE/context",
]


def test_hostile_session_ids_in_paths_are_refused(client: httpx.Client, tmp_path: Path) -> None:
    before = sorted(tmp_path.rglob("*"))
    for path in HOSTILE_PATHS:
        for method, suffix in (("GET", "/context"), ("POST", "/prompt"), ("DELETE", "")):
            target = path.removesuffix("/context") + suffix
            response = client.request(method, target, json={"text": "hi"} if method == "POST" else None)
            assert response.status_code in (400, 404), (method, target, response.status_code, response.text)
            assert response.json()["error"]
    assert sorted(tmp_path.rglob("*")) == before


def test_malformed_bodies_and_parameters_are_400s_and_the_server_goes_on(
    client: httpx.Client, sid: str, sessions_dir: Path
) -> None:
    prompt = f"/sessions/{sid}/prompt"
    bad_bodies: list[bytes] = [
        b"{nope",
        b"\xff\xfe\x00\x01",  # not UTF-8
        b'{"text": "\xff"}',  # invalid UTF-8 inside a string
        b"[" * 100_000 + b"]" * 100_000,  # deeply nested
        b'{"text": NaN}',
        b'{"text": "hi", "text": 5}',
        b"null",
        b'"just a string"',
        b'{"text": "hi"} trailing',
        json.dumps({"text": "hi", "wait": "yes"}).encode(),
        json.dumps({"text": "hi", "images": "not-a-list"}).encode(),
    ]
    for body in bad_bodies:
        response = client.post(prompt, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, (body[:40], response.status_code, response.text[:200])
        assert response.json()["error"]
    odd_requests = [
        client.post("/sessions", content=b'{"model": 5}'),
        client.post("/sessions", json={"session_id": "../escape", "model": "m"}),
        client.post("/sessions", json={"model": "m", "config": {"compaction": 5, "compaction.mode": "x"}}),
        client.post("/sessions", json={"model": "m", "config": {"nope": 1}}),
        client.post(f"/sessions/{sid}/branch", json={"leaf_id": "no-such-message"}),
        client.post(f"/sessions/{sid}/compact", json={"keep_recent_tokens": "lots"}),
        client.get(f"/sessions/{sid}/messages", params={"view": "../../etc"}),
        client.get("/events", params={"session": "../x"}),
        client.get("/events", headers={"Last-Event-ID": "x" * 10_000}),
    ]
    for response in odd_requests:
        assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
        assert response.json()["error"]
    assert not (sessions_dir.parent / "escape.jsonl").exists()
    after = client.post(prompt, json={"text": "still there?", "wait": True})  # the server and session go on
    assert after.status_code == 200 and after.json()["status"] == "ok"
    texts = [m["parts"][0]["text"] for m in client.get(f"/sessions/{sid}/messages").json()["messages"]]
    assert texts == ["one", "first", "still there?", "second"]


def test_an_api_key_sent_to_the_server_is_never_sent_back_or_stored(
    client: httpx.Client, provider: Any, script: Any, sessions_dir: Path
) -> None:
    key = "sk-server-secret-" + "9" * 24
    model = script(Turn(text="hello"))
    response = client.post("/sessions", json={"model": model, "api_base": provider.url, "api_key": key})
    sid = response.json()["id"]
    answers = [
        response,
        client.post(f"/sessions/{sid}/prompt", json={"text": "hi", "wait": True}),
        client.get(f"/sessions/{sid}"),
        client.get("/sessions"),
        client.get(f"/sessions/{sid}/messages"),
        client.get(f"/sessions/{sid}/context"),
    ]
    for answer in answers:
        assert answer.status_code < 300, answer.text
        assert key not in answer.text
    assert all(key.encode() not in data for data in snapshot(sessions_dir).values())
