"""``agentcell serve``: the HTTP API and Server-Sent Events, exercised with httpx against a real uvicorn
server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.apps.server import ApiServer, ServerPolicy, parse_cursor
from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.conftest import Recorder
from tests.serve import serve_process

TOKEN = "test-token-123"


@pytest.fixture
def server(rt: Any, workspace: Path) -> Iterator[ApiServer]:
    with ApiServer(rt, TOKEN, policy=ServerPolicy(workspace_root=str(workspace))) as s:
        yield s


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


def create(client: httpx.Client, provider: Any, model: str, **fields: Any) -> str:
    response = client.post(
        "/sessions", json={"model": model, "api_base": provider.url, "api_key": "sk-local", **fields}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


class SseEvent:
    def __init__(self, id: str | None, type: str, data: dict[str, Any]) -> None:
        self.id, self.type, self.data = id, type, data


def read_events(response: httpx.Response, until: Any, limit: int = 10_000) -> list[SseEvent]:
    """Parse Server-Sent Events from a streaming response until ``until(event)`` is true."""
    out: list[SseEvent] = []
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if "data" in fields:
            event = SseEvent(fields.get("id"), fields["event"], json.loads(fields["data"]))
            out.append(event)
            if until(event) or len(out) >= limit:
                return out
        fields = {}
    raise AssertionError(f"the stream ended after {[e.type for e in out]}")


def test_every_request_needs_the_bearer_token(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        for method, path in [
            ("GET", "/sessions"),
            ("POST", "/sessions"),
            ("GET", "/events"),
            ("GET", "/nope"),
        ]:
            response = anonymous.request(method, path)
            assert response.status_code == 401, (method, path)
            assert response.json() == {"error": "missing or wrong bearer token"}
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.get("/sessions", headers={"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401
        basic = anonymous.get("/sessions", headers={"Authorization": f"Basic {TOKEN}"})
        assert basic.status_code == 401


def test_answers_on_a_kept_alive_connection_are_not_held_back_by_nagle(
    server: ApiServer, client: httpx.Client
) -> None:
    """Every connection the server accepts has Nagle's algorithm off: with it on, the second answer on a
    kept-alive connection waited ~40 ms for the client's delayed ACK (its head and body go out separately)."""
    for _ in range(2):
        assert client.get("/sessions").status_code == 200
    connections = server._server.server_state.connections
    sockets = [conn.transport.get_extra_info("socket") for conn in connections]
    assert sockets
    assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_bad_requests_get_clear_4xx_errors(client: httpx.Client, provider: Any, script: Any) -> None:
    sid = create(client, provider, script(Turn(text="hi")))

    def error(response: httpx.Response, status: int) -> str:
        assert response.status_code == status, response.text
        return str(response.json()["error"])

    assert "not valid JSON" in error(client.post(f"/sessions/{sid}/prompt", content=b"{nope"), 400)
    assert "Expected `object`, got `array`" in error(client.post(f"/sessions/{sid}/prompt", json=[1]), 400)
    assert "`$.text`" in error(client.post(f"/sessions/{sid}/prompt", json={"text": 5}), 400)
    assert "Object missing required field `text`" in error(
        client.post(f"/sessions/{sid}/prompt", json={}), 400
    )
    assert "unknown field `txt`" in error(client.post(f"/sessions/{sid}/prompt", json={"txt": "x"}), 400)
    assert "must not be empty" in error(client.post(f"/sessions/{sid}/prompt", json={"text": "  "}), 400)
    assert "`$.keep_recent_tokens`" in error(
        client.post(f"/sessions/{sid}/compact", json={"keep_recent_tokens": -1}), 400
    )
    assert "compaction.threshold" in error(
        client.post("/sessions", json={"model": "m", "config": {"compaction.threshold": 7}}), 400
    )
    assert "unknown tools ['teleport']" in error(client.post("/sessions", json={"tools": ["teleport"]}), 400)
    assert "already exists" in error(client.post("/sessions", json={"session_id": sid}), 409)
    assert "view must be" in error(client.get(f"/sessions/{sid}/messages", params={"view": "all"}), 400)
    # Unknown and invalid sessions.
    for method, path in [
        ("GET", "/sessions/ghost"),
        ("DELETE", "/sessions/ghost"),
        ("POST", "/sessions/ghost/abort"),
        ("GET", "/sessions/ghost/context"),
    ]:
        assert "ghost" in error(client.request(method, path), 404)
    assert "ghost" in error(client.post("/sessions/ghost/prompt", json={"text": "hi"}), 404)
    assert "ghost" in error(client.get("/events", params={"session": f"{sid},ghost"}), 404)
    assert "may only use letters" in error(client.get("/sessions/bad%20id/context"), 400)
    assert "Last-Event-ID" in error(client.get("/events", headers={"Last-Event-ID": "garbage"}), 400)
    assert "unknown event types" in error(client.get("/events", params={"type": "agent_end,nonsense"}), 400)
    assert error(client.get("/no/such/route"), 404) == "no such route"
    assert client.put("/sessions").status_code == 405


def test_session_lifecycle_over_http(
    client: httpx.Client, provider: Any, script: Any, rt: Any, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("remember the blue door\n" * 40)
    model = script(
        Turn(text="Hello from the provider."),
        Turn(text="Second answer " + "detail " * 200),
        Turn(text="Third answer."),
        Turn(text="## Goal\nKeep notes.\n## Progress\nDone: greeted."),  # the summary of /compact
        Turn(text="After compaction."),
    )
    response = client.post(
        "/sessions",
        json={
            "session_id": "web-1",
            "model": model,
            "system_prompt": "Be brief.",
            "tools": "builtin",
            "workspace": str(workspace),
            "config": {"models.context_windows": {model: 50_000}},
            "api_base": provider.url,
            "api_key": "sk-local",
        },
    )
    assert response.status_code == 201, response.text
    assert response.json() == {"id": "web-1", "model": model, "context_window": 50_000}

    listed = client.get("/sessions").json()["sessions"]
    assert [(s["id"], s["hosted"], s["model"]) for s in listed] == [("web-1", True, model)]

    result = client.post("/sessions/web-1/prompt", json={"text": "Say hello", "wait": True})
    assert result.status_code == 200
    body = result.json()
    assert body["status"] == "ok" and body["message"]["parts"][0]["text"] == "Hello from the provider."
    assert body["usage"]["input_tokens"] > 0

    queued = client.post("/sessions/web-1/prompt", json={"text": "More please"})
    assert queued.status_code == 202 and queued.json()["prompt_id"]
    client.post(
        "/sessions/web-1/prompt", json={"text": "And more", "wait": True}
    )  # runs after the queued one

    texts = [m["parts"][0]["text"] for m in client.get("/sessions/web-1/messages").json()["messages"]]
    assert texts[0] == "Say hello" and texts[2] == "More please" and texts[-1] == "Third answer."

    stats = client.get("/sessions/web-1/context").json()
    assert stats["window"] == 50_000 and stats["message_count"] == 6
    assert stats["total"] == stats["system_prompt"] + stats["tools"] + stats["messages"] > 0

    compacted = client.post("/sessions/web-1/compact", json={"instructions": "keep the greeting"}).json()
    assert compacted["compacted"] is True and compacted["messages_after"] < 6
    after = client.get("/sessions/web-1/context").json()
    assert after["message_count"] == compacted["messages_after"] and after["total"] < stats["total"]
    model_view = client.get("/sessions/web-1/messages", params={"view": "model"}).json()["messages"]
    assert model_view[0]["kind"] == "compaction_summary"
    # paged from the newest; what the compaction summarized is read back from the log (design §2.2)
    whole = client.get("/sessions/web-1/messages").json()
    paged = client.get("/sessions/web-1/messages", params={"offset": 1, "limit": 2}).json()
    assert whole["total"] == paged["total"] == len(whole["messages"]) == 7  # six, and the summary's marker
    assert paged["messages"] == whole["messages"][-3:-1]
    oldest = client.get("/sessions/web-1/messages", params={"offset": 5}).json()["messages"]
    assert [m["parts"][0]["text"] for m in oldest] == texts[:2]
    bad = client.get("/sessions/web-1/messages", params={"limit": "-1"})
    assert bad.status_code == 400 and "limit must be" in bad.json()["error"]

    info = client.get("/sessions/web-1").json()
    assert info["model"] == model and info["context_window"] == 50_000 and info["usage"]["output_tokens"] > 0

    switched = client.post("/sessions/web-1/model", json={"model": "openai/gpt-4o-mini"}).json()
    assert switched == {"model": "openai/gpt-4o-mini", "context_window": 128_000}

    first_answer = texts[1]
    first_answer_id = next(
        m["id"]
        for m in client.get("/sessions/web-1/messages").json()["messages"]
        if m["parts"][0]["text"] == first_answer
    )
    assert client.post("/sessions/web-1/branch", json={"leaf_id": first_answer_id}).status_code == 200
    on_branch = client.get("/sessions/web-1/messages").json()["messages"]
    assert [m["parts"][0]["text"] for m in on_branch] == ["Say hello", first_answer]
    assert client.post("/sessions/web-1/branch", json={"leaf_id": "no-such-message"}).status_code == 400

    deleted = client.delete("/sessions/web-1")
    assert deleted.status_code == 200 and deleted.json() == {"deleted": "web-1"}
    assert client.get("/sessions").json() == {"sessions": []}
    assert client.get("/sessions/web-1/context").status_code == 404


def test_a_stored_session_is_resumed_on_first_use(
    sessions_dir: Path,
    provider: Any,
    script: Any,
    rt: Any,
    client: httpx.Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime import Runtime

    model = script(Turn(text="stored answer"), Turn(text="served answer"), Turn(text="third answer"))
    with Runtime(sessions_dir=sessions_dir / "elsewhere") as other:
        for sid in ("kept", "keyed"):
            other.start_session(sid, model=model, api_base=provider.url, api_key="sk-local")
        other.prompt("kept", "first").result(timeout=30)
    for path in (sessions_dir / "elsewhere").iterdir():
        path.rename(sessions_dir / path.name)
    assert not rt.hosted_sessions()

    # API keys are never stored: a session resumed on first use would get the provider's key from the
    # server's environment (litellm reads it) and send it to the stored api_base, so that takes the
    # operator's leave (server.allow_api_base; see tests/app/test_server_api_base.py) ...
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    refused = client.post("/sessions/kept/prompt", json={"text": "second", "wait": True})
    assert refused.status_code == 403 and "POST /sessions/kept/resume" in refused.json()["error"]
    with (
        ApiServer(rt, TOKEN, policy=ServerPolicy(allow_api_base=True)) as allowing,
        httpx.Client(base_url=allowing.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as ok,
    ):
        answer = ok.post("/sessions/kept/prompt", json={"text": "second", "wait": True}).json()
    assert answer["status"] == "ok" and answer["message"]["parts"][0]["text"] == "served answer"
    texts = [m["parts"][0]["text"] for m in client.get("/sessions/kept/messages").json()["messages"]]
    assert texts == ["first", "stored answer", "second", "served answer"]
    # ... or from an explicit resume.
    monkeypatch.delenv("OPENAI_API_KEY")
    resumed = client.post("/sessions/keyed/resume", json={"api_key": "sk-local"})
    assert resumed.status_code == 200 and resumed.json()["id"] == "keyed"
    answer = client.post("/sessions/keyed/prompt", json={"text": "hello", "wait": True}).json()
    assert answer["status"] == "ok", answer["error"]
    assert client.post("/sessions/ghost/resume", json={}).status_code == 404


def test_abort_stops_a_running_turn(
    client: httpx.Client, provider: Any, script: Any, rt: Any, recorder: Recorder
) -> None:
    hang = Turn(fault=Fault(kind="hang"))  # the provider answers only when the client goes away
    model = script(hang, Turn(text="next"))
    sid = create(client, provider, model)
    assert client.post(f"/sessions/{sid}/abort").json() == {"aborted": False}  # nothing running
    assert client.post(f"/sessions/{sid}/prompt", json={"text": "slow"}).status_code == 202
    recorder.wait_type("request_start")
    # request_start comes before the call is sent: aborted then, the call would never reach the provider,
    # and the next prompt's request would be the one the script hangs. Abort once the provider holds it.
    deadline = time.monotonic() + 30
    while not any(r.model == model.split("/", 1)[1] for r in provider.request_log):
        assert time.monotonic() < deadline, "the turn's request never reached the provider"
        time.sleep(0.01)
    assert client.post(f"/sessions/{sid}/abort").json() == {"aborted": True}
    recorder.wait_type("agent_abort")
    assert recorder.of("agent_end", sid)[-1].status == "aborted"
    answer = client.post(f"/sessions/{sid}/prompt", json={"text": "again", "wait": True}).json()
    assert answer["status"] == "ok"
    while provider.hanging:  # the aborted call's connection closed: the provider let its request go
        assert time.monotonic() < deadline, "the provider still holds the aborted request"
        time.sleep(0.01)


def test_event_stream_filters_by_session_and_type(
    server: ApiServer, client: httpx.Client, provider: Any, script: Any
) -> None:
    watched = create(client, provider, script(Turn(text="watched reply")))
    other = create(client, provider, script(Turn(text="other reply")))
    wanted = {"agent_start", "text_delta", "agent_end"}
    with client.stream(
        "GET", "/events", params={"session": watched, "type": ",".join(sorted(wanted))}
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        client.post(f"/sessions/{other}/prompt", json={"text": "noise", "wait": True})
        client.post(f"/sessions/{watched}/prompt", json={"text": "hello"})
        events = read_events(stream, until=lambda e: e.type == "agent_end")
    assert {e.data["session_id"] for e in events} == {watched}
    assert {e.type for e in events} == wanted and events[0].type == "agent_start"
    assert "".join(e.data["delta"] for e in events if e.type == "text_delta") == "watched reply"
    seqs = [e.data["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert [parse_cursor(e.id or "") for e in events] == [{watched: seq} for seq in seqs]


def test_last_event_id_resumes_from_the_transcript(client: httpx.Client, provider: Any, script: Any) -> None:
    a = create(client, provider, script(Turn(text="a one"), Turn(text="a two")))
    b = create(client, provider, script(Turn(text="b one"), Turn(text="b two")))
    with client.stream("GET", "/events", params={"session": f"{a},{b}"}) as stream:
        client.post(f"/sessions/{a}/prompt", json={"text": "first a", "wait": True})
        client.post(f"/sessions/{b}/prompt", json={"text": "first b", "wait": True})
        seen = read_events(stream, until=lambda e: e.type == "agent_end" and e.data["session_id"] == b)
    cursor = seen[-1].id
    assert cursor is not None and set(parse_cursor(cursor)) == {a, b}

    # While no one listens, both sessions go on.
    client.post(f"/sessions/{a}/prompt", json={"text": "second a", "wait": True})
    client.post(f"/sessions/{b}/prompt", json={"text": "second b", "wait": True})

    with client.stream(
        "GET", "/events", params={"session": f"{a},{b}"}, headers={"Last-Event-ID": cursor}
    ) as stream:
        replayed = read_events(
            stream, until=lambda e: e.type == "agent_end" and e.data["session_id"] == b and e.data["seq"] > 0
        )
    for sid in (a, b):
        mine = [e.data for e in seen + replayed if e.data["session_id"] == sid]
        seqs = [e["seq"] for e in mine]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{sid}: a gap or a repeat in {seqs}"
    deltas = "".join(e.data["delta"] for e in replayed if e.type == "text_delta")
    assert "a two" in deltas and "b two" in deltas and "one" not in deltas
    # The same works with the query parameter, and a type filter applies to the replay too.
    with client.stream(
        "GET", "/events", params={"session": a, "type": "agent_end", "last_event_id": f"{a}:0"}
    ) as stream:
        ends = read_events(stream, until=lambda e: False, limit=2)
    assert [e.type for e in ends] == ["agent_end", "agent_end"] and ends[0].data["seq"] < ends[1].data["seq"]


@pytest.mark.slow  # an agentcell serve process: seconds even on an idle machine
def test_serve_command_binds_localhost_and_generates_a_token(tmp_path: Path) -> None:
    with serve_process(tmp_path / "sessions") as served:
        token = re.search(r"generated bearer token: (\S+)", served.banner)
        assert token, served.banner
        assert httpx.get(f"{served.url}/sessions", timeout=10).status_code == 401
        headers = {"Authorization": f"Bearer {token.group(1)}"}
        ok = httpx.get(f"{served.url}/sessions", headers=headers, timeout=10)
        assert ok.status_code == 200 and ok.json() == {"sessions": []}


@pytest.mark.slow  # an agentcell serve process: seconds even on an idle machine
def test_serve_local_answers_a_session_that_names_nothing(tmp_path: Path) -> None:
    with serve_process(tmp_path / "sessions", "--local", "--token", TOKEN) as served:
        assert re.search(r"built-in local provider at http://127\.0\.0\.1:\d+/v1 answers", served.banner)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=served.url, headers=headers, timeout=60) as client:
            created = client.post("/sessions", json={})
            assert created.status_code == 201, created.text
            assert created.json()["model"] == "openai/agentcell-local"
            sid = created.json()["id"]
            reply = client.post(f"/sessions/{sid}/prompt", json={"text": "Hello there", "wait": True}).json()
            assert reply["status"] == "ok" and "'Hello there'" in reply["message"]["parts"][0]["text"]
            # A session naming its own endpoint still goes there (and needs its own key for it).
            other = client.post("/sessions", json={"api_base": "http://127.0.0.1:9/v1"})
            assert other.status_code == 403


def test_the_model_reads_a_clipped_output_back_in_parts(
    client: httpx.Client, provider: Any, script: Any, workspace: Path, sessions_dir: Path
) -> None:
    # A file whose read_file result (2,000 numbered lines of 130 characters) is too large for the context.
    lines = [f"row {i:05d} " + "x" * 120 for i in range(1, 2_001)]
    (workspace / "big.txt").write_text("\n".join(lines) + "\n")
    shown = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, 1))
    saved = f"read_file-{hashlib.sha256(shown.encode()).hexdigest()[:16]}.txt"
    read_saved = lambda **args: ToolCallSpec(name="read_saved", arguments=json.dumps(args))  # noqa: E731
    model = script(
        Turn(tool_calls=(ToolCallSpec(name="read_file", arguments='{"path": "big.txt"}'),)),
        Turn(tool_calls=(read_saved(id=saved, offset=21, limit=30),)),
        Turn(tool_calls=(read_saved(id=saved, offset=1_990, limit=30),)),
        Turn(text="I read all of it."),
    )
    sid = create(client, provider, model, tools="builtin", workspace=str(workspace))
    result = client.post(f"/sessions/{sid}/prompt", json={"text": "read big.txt", "wait": True}).json()
    assert result["status"] == "ok", result
    tools = [m for m in client.get(f"/sessions/{sid}/messages").json()["messages"] if m["role"] == "tool"]
    texts = [m["parts"][0]["text"] for m in tools]
    assert len(texts) == 3 and not any(m.get("is_error") for m in tools), texts
    # (the preview's 2,000 characters end inside line 15: the notice says to go on from there)
    assert f'read it in parts with read_saved(id="{saved}", offset=15, limit=200)' in texts[0]
    assert str(sessions_dir) not in texts[0]  # no path the model cannot use
    first = texts[1].splitlines()
    assert first[0] == f"    21\t    21\t{lines[20]}" and first[29] == f"    50\t    50\t{lines[49]}"
    assert first[30] == "[lines 21-50 of 2,000; continue with offset=51]"
    assert texts[2].splitlines()[-1] == f"  2000\t  2000\t{lines[-1]}"  # the end, and nothing after it
