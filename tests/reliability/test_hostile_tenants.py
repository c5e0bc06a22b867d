"""Tenants of `agentcell serve`: one tenant cannot see or touch another's sessions, responses, conversations.

Two tenants (tokens in a tenants file, stored hashed) and the admin (the server's own token) over the real
server: every route tried with the other tenant's ids answers 404, listings and event streams show only the
tenant's own, ``/metrics`` is the admin's; quotas answer 429/403 naming the quota; a token is rotated by
rewriting the file, without a restart; the audit log says who created and deleted what.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime import Runtime
from runtime.apps.server import ApiServer
from runtime.apps.tenants import token_digest
from runtime.config import Config
from runtime.provider.script import Turn

ADMIN = "tenants-admin-token-" + "a" * 20
A1, A2, B = "tenant-a-token-one-" + "1" * 20, "tenant-a-token-two-" + "2" * 20, "tenant-b-token-" + "b" * 20
_names = iter(range(1, 1_000_000))


def tenants_toml(a_token: str, a_quota: str = "") -> str:
    return (
        f'[tenants.a]\ntokens = ["{token_digest(a_token)}"]\n{a_quota}\n'
        f'[tenants.b]\ntokens = ["{token_digest(B)}"]\n'
    )


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(tenants_toml(A1))
    return path


@pytest.fixture
def server(
    sessions_dir: Path, tenants_file: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ApiServer]:
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)  # (the Responses API runs on the server's settings)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    config = Config().with_overrides({"server.tenants_file": str(tenants_file)})
    with Runtime(config, sessions_dir=sessions_dir) as rt, ApiServer(rt, ADMIN) as srv:
        yield srv


def client(server: ApiServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def model(provider: Any, *turns: Turn) -> str:
    name = f"tenants-{next(_names)}"
    provider.add_script(name, list(turns) or [Turn(text="hello")] * 3)
    return f"openai/{name}"


def new_session(c: httpx.Client, provider: Any, **fields: Any) -> httpx.Response:
    body = {"model": model(provider), "api_base": provider.url, "api_key": "sk-local", **fields}
    return c.post("/sessions", json=body)


def test_two_tenants_see_nothing_of_each_other(server: ApiServer, provider: Any) -> None:
    with client(server, A1) as a, client(server, B) as b, client(server, ADMIN) as admin:
        sid = new_session(a, provider).json()["id"]
        assert a.post(f"/sessions/{sid}/prompt", json={"text": "hi", "wait": True}).status_code == 200
        pid = a.post(f"/sessions/{sid}/prompt", json={"text": "again"}).json()["prompt_id"]
        assert a.get(f"/sessions/{sid}/turns/{pid}", params={"wait": "true"}).json()["status"] == "ok"
        response = a.post("/v1/responses", json={"model": model(provider), "input": "hi"}).json()
        rid = response["id"]
        cid = a.post("/v1/conversations", json={}).json()["id"]
        mine = new_session(b, provider).json()["id"]

        # every route with a's ids, as b: 404, as if they did not exist
        tries = [
            ("GET", f"/sessions/{sid}", None),
            ("DELETE", f"/sessions/{sid}", None),
            ("POST", f"/sessions/{sid}/resume", {}),
            ("POST", f"/sessions/{sid}/prompt", {"text": "x", "wait": True}),
            ("GET", f"/sessions/{sid}/turns/{pid}", None),
            ("POST", f"/sessions/{sid}/abort", None),
            ("POST", f"/sessions/{sid}/compact", {}),
            ("GET", f"/sessions/{sid}/context", None),
            ("GET", f"/sessions/{sid}/messages", None),
            ("POST", f"/sessions/{sid}/branch", {"leaf_id": None}),
            ("POST", f"/sessions/{sid}/model", {"model": "openai/x"}),
            ("GET", f"/events?session={sid}", None),
            ("GET", f"/events?session={mine}&last_event_id={sid}:1", None),
            ("GET", f"/v1/responses/{rid}", None),
            ("GET", f"/v1/responses/{rid}/input_items", None),
            ("POST", f"/v1/responses/{rid}/cancel", None),
            ("DELETE", f"/v1/responses/{rid}", None),
            ("POST", "/v1/responses", {"model": model(provider), "input": "x", "previous_response_id": rid}),
            ("POST", "/v1/responses", {"model": model(provider), "input": "x", "conversation": cid}),
            ("POST", "/v1/responses/compact", {"model": model(provider), "previous_response_id": rid}),
            ("POST", "/v1/responses/input_tokens", {"model": "m", "input": "x", "previous_response_id": rid}),
            ("GET", f"/v1/conversations/{cid}", None),
            ("POST", f"/v1/conversations/{cid}", {"metadata": {"k": "v"}}),
            ("GET", f"/v1/conversations/{cid}/items", None),
            ("POST", f"/v1/conversations/{cid}/items", {"items": []}),
            ("DELETE", f"/v1/conversations/{cid}", None),
        ]
        for method, path, body in tries:
            answer = b.request(method, path, json=body)
            assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
        counted = a.post(
            "/v1/responses/input_tokens", json={"model": "m", "input": "x", "previous_response_id": rid}
        )
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0  # (a's own: counted)
        stream = b.get(f"/events?session={sid}", headers={"Last-Event-ID": f"{sid}:1"})
        assert stream.status_code == 404
        # listings: b sees its own only; the admin sees both
        assert [s["id"] for s in b.get("/sessions").json()["sessions"]] == [mine]
        assert sid not in b.get("/overview").text
        assert {sid, mine} <= {s["id"] for s in admin.get("/sessions").json()["sessions"]}
        assert b.get("/metrics").status_code == 403 and admin.get("/metrics").status_code == 200
        # a stream of all sessions, as b, carries nothing of a's
        seen: list[bytes] = []

        def read() -> None:
            with b.stream("GET", "/events") as events:
                for chunk in events.iter_bytes():
                    seen.append(chunk)
                    if b"agent_end" in chunk or sum(map(len, seen)) > 1_000_000:
                        return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.5)
        assert a.post(f"/sessions/{sid}/prompt", json={"text": "again", "wait": True}).status_code == 200
        assert b.post(f"/sessions/{mine}/prompt", json={"text": "mine", "wait": True}).status_code == 200
        reader.join(20)
        received = b"".join(seen)
        assert mine.encode() in received and sid.encode() not in received
        # a's own routes work, and the response's session is a's
        assert a.get(f"/sessions/{sid}/messages").status_code == 200
        assert a.get(f"/v1/responses/{rid}").status_code == 200
        assert a.get(f"/v1/conversations/{cid}").status_code == 200
        assert a.delete(f"/sessions/{sid}").status_code == 200
        audit = admin.get("/audit").json()["entries"]
        assert {"tenant": "a", "action": "create", "id": sid, "status": 201}.items() <= audit[0].items()
        assert any(e["action"] == "delete" and e["id"] == sid and e["tenant"] == "a" for e in audit)
        assert b.get("/audit").status_code == 403


def test_quotas_are_errors_naming_them(server: ApiServer, tenants_file: Path, provider: Any) -> None:
    quota = 'max_sessions = 2\nmax_tokens_per_day = 1\nmodels = ["openai/allowed-model"]\n'
    tenants_file.write_text(tenants_toml(A1, quota))
    time.sleep(1.1)  # (the file is looked at once a second)
    provider.add_script("allowed-model", [Turn(text="hello")] * 4)
    with client(server, A1) as a:
        refused = new_session(a, provider)
        assert refused.status_code == 403 and "models" in refused.json()["error"], refused.text
        body = {"model": "openai/allowed-model", "api_base": provider.url, "api_key": "sk-local"}
        first = a.post("/sessions", json=body).json()["id"]
        assert a.post("/sessions", json=body).status_code == 201
        third = a.post("/sessions", json=body)
        assert third.status_code == 429 and "max_sessions" in third.json()["error"]
        assert a.post(f"/sessions/{first}/prompt", json={"text": "hi", "wait": True}).status_code == 200
        deadline = time.monotonic() + 10
        while a.get("/usage").json()["tokens"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        usage = a.get("/usage").json()
        assert usage["tenant"] == "a" and usage["tokens"] > 0 and usage["sessions"] == 2
        over = a.post(f"/sessions/{first}/prompt", json={"text": "more", "wait": True})
        assert over.status_code == 429 and "max_tokens_per_day" in over.json()["error"]
        responses = a.post("/v1/responses", json={"model": "openai/allowed-model", "input": "x"})
        assert responses.status_code == 429 and "max_tokens_per_day" in responses.text
    with client(server, B) as b:  # a session a Responses request started counts for its tenant too
        assert b.post("/v1/responses", json={"model": model(provider), "input": "x"}).status_code == 200
        deadline = time.monotonic() + 10
        while b.get("/usage").json()["tokens"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.get("/usage").json()["tokens"] > 0


def test_spend_per_day_is_a_quota(server: ApiServer, tenants_file: Path, provider: Any) -> None:
    """A model whose prices litellm knows (gpt-4o-mini, answered here by the local provider): one turn
    spends more than a millionth of a dollar, and the next is a 429 naming ``max_spend_per_day``."""
    tenants_file.write_text(tenants_toml(A1, "max_spend_per_day = 0.000001\n"))
    time.sleep(1.1)  # (the file is looked at once a second)
    with client(server, A1) as a:
        body = {"model": "openai/gpt-4o-mini", "api_base": provider.url, "api_key": "sk-local"}
        sid = a.post("/sessions", json=body).json()["id"]
        assert a.post(f"/sessions/{sid}/prompt", json={"text": "hi", "wait": True}).status_code == 200
        deadline = time.monotonic() + 10
        while a.get("/usage").json()["spend_usd"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.get("/usage").json()["spend_usd"] > 0.000001
        over = a.post(f"/sessions/{sid}/prompt", json={"text": "more", "wait": True})
        assert over.status_code == 429 and "max_spend_per_day" in over.json()["error"], over.text
    with client(server, B) as b:  # the other tenant's day is its own
        sid = new_session(b, provider).json()["id"]
        assert b.post(f"/sessions/{sid}/prompt", json={"text": "hi", "wait": True}).status_code == 200


def test_a_rotated_token_works_at_once_and_the_old_one_does_not(
    server: ApiServer, tenants_file: Path, provider: Any
) -> None:
    with client(server, A1) as old, client(server, A2) as new:
        sid = new_session(old, provider).json()["id"]
        assert new.get("/sessions").status_code == 401
        tenants_file.write_text(tenants_toml(A2))
        time.sleep(1.1)
        assert old.get("/sessions").status_code == 401
        assert [s["id"] for s in new.get("/sessions").json()["sessions"]] == [sid]
        assert new.get(f"/sessions/{sid}").status_code == 200
    stored = tenants_file.read_text()
    assert A1 not in stored and A2 not in stored  # digests only


def test_a_broken_tenants_file_is_a_clear_error_and_a_later_one_keeps_the_tenants(
    server: ApiServer, tenants_file: Path, sessions_dir: Path, tmp_path: Path
) -> None:
    from runtime.apps.server import create_app
    from runtime.errors import ConfigError

    bad = tmp_path / "bad.toml"
    bad.write_text('[tenants.x]\ntokens = ["not-a-digest"]\n')
    config = Config().with_overrides({"server.tenants_file": str(bad)})
    with Runtime(config, sessions_dir=tmp_path / "other") as rt, pytest.raises(ConfigError, match="SHA-256"):
        create_app(rt, ADMIN)
    tenants_file.write_text("this is not toml [")
    time.sleep(1.1)
    with client(server, A1) as a:  # the tenants of before stay in force
        assert a.get("/sessions").status_code == 200


def test_concurrent_turns_and_profiles_are_quotas(
    sessions_dir: Path, tmp_path: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    path = tmp_path / "quota.toml"
    path.write_text(tenants_toml(A1, 'max_concurrent_turns = 1\nprofiles = ["allowed"]\n'))
    profile = {"description": "d", "model": model(provider)}
    config = Config().with_overrides(
        {"server.tenants_file": str(path), "agents": {"allowed": profile, "forbidden": profile}}
    )
    with Runtime(config, sessions_dir=sessions_dir) as rt, ApiServer(rt, ADMIN) as srv, client(srv, A1) as a:
        slow = new_session(a, provider, model=model(provider, Turn(text="slow", latency=3.0))).json()["id"]
        other = new_session(a, provider).json()["id"]
        assert a.post(f"/sessions/{slow}/prompt", json={"text": "take your time"}).status_code == 202
        deadline = time.monotonic() + 10
        while a.get("/usage").json()["running_turns"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        busy = a.post(f"/sessions/{other}/prompt", json={"text": "me too", "wait": True})
        assert busy.status_code == 429 and "max_concurrent_turns" in busy.json()["error"]
        forbidden = a.post("/v1/responses", json={"model": "forbidden", "input": "x"})
        assert forbidden.status_code == 403 and "profiles" in forbidden.text
        deadline = time.monotonic() + 20
        while a.get("/usage").json()["running_turns"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert a.post(f"/sessions/{other}/prompt", json={"text": "now", "wait": True}).status_code == 200
        assert a.post("/v1/responses", json={"model": "allowed", "input": "x"}).status_code == 200


def test_a_tenants_usage_counts_what_its_compactions_paid_too(server: ApiServer, provider: Any) -> None:
    """A tenant's tokens are what its sessions paid for: the summarizer call of a compaction counts as a
    turn's requests do (design §4.1), so the tenant's day equals its session's own usage."""
    summarized = model(
        provider,
        Turn(text="Hello."),
        Turn(text="Second answer " + "detail " * 200),
        Turn(text="Third answer."),
        Turn(text="## Goal\nKeep notes.\n## Progress\nDone: greeted."),  # the summary of /compact
    )
    body = {
        "model": summarized,
        "api_base": provider.url,
        "api_key": "sk-local",
        "config": {"models.context_windows": {summarized: 50_000}},
    }
    with client(server, A1) as a:
        sid = a.post("/sessions", json=body).json()["id"]
        for text in ("hi", "more", "and more"):
            assert a.post(f"/sessions/{sid}/prompt", json={"text": text, "wait": True}).status_code == 200
        compacted = a.post(f"/sessions/{sid}/compact", json={}).json()
        assert compacted["compacted"] is True, compacted
        paid = a.get(f"/sessions/{sid}").json()["usage"]
        expected = paid["input_tokens"] + paid["output_tokens"]
        deadline = time.monotonic() + 10
        while a.get("/usage").json()["tokens"] != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        usage = a.get("/usage").json()
        assert (usage["tokens"], usage["turns"]) == (expected, 3)
