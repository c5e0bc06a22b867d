"""The dashboard of ``agentcell serve`` over plain HTTP: its page is public and self-contained, its one
endpoint (``GET /overview``) needs the token and tells every hosted session without waking one, and
``agentcell demo --serve`` keeps it up. The page itself is driven in a real browser in
``test_dashboard_browser.py``."""

from __future__ import annotations

import fnmatch
import io
import re
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.apps import demo
from runtime.apps.cli import build_parser
from runtime.apps.dashboard import PAGES, STREAM_TYPES, SessionBoard, read_asset
from runtime.apps.server import ApiServer
from runtime.events import EVENT_TYPES
from tests.conftest import StopsSeen

TOKEN = "dashboard-token-1"
ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "runtime" / "apps" / "dashboard" / "static"


@pytest.fixture
def server(rt: Any) -> Iterator[ApiServer]:
    with ApiServer(rt, TOKEN) as s:
        yield s


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``check()``'s first truthy value, polled until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {check.__doc__ or check}")
        time.sleep(0.05)


def rows(client: httpx.Client) -> dict[str, dict[str, Any]]:
    response = client.get("/overview")
    assert response.status_code == 200, response.text
    return {row["id"]: row for row in response.json()["sessions"]}


def test_the_page_is_public_and_everything_else_still_needs_the_token(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as anonymous:
        page = anonymous.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert '<script src="/dashboard/app.js" defer></script>' in page.text
        policy = page.headers["content-security-policy"]
        assert (
            "script-src 'self'" in policy
            and "connect-src 'self'" in policy
            and "default-src 'none'" in policy
        )
        assert page.headers["referrer-policy"] == "no-referrer"
        for path, (name, content_type) in PAGES.items():
            response = anonymous.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-type"] == content_type
            assert response.content == read_asset(name)
        assert anonymous.head("/").content == b""
        # Only those paths: the API, unknown paths and other methods on the page's paths need the token.
        for method, path in [("GET", "/overview"), ("GET", "/events"), ("GET", "/dashboard/"), ("POST", "/")]:
            assert anonymous.request(method, path).status_code == 401, (method, path)


def test_the_page_loads_nothing_from_elsewhere_and_keeps_the_token_out_of_urls() -> None:
    html, script, css = (read_asset(n).decode() for n in ("index.html", "app.js", "style.css"))
    for name, text in [("index.html", html), ("app.js", script), ("style.css", css)]:
        assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), f"{name} names another host"
        assert "@import" not in text and "<iframe" not in text
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == [
        "/dashboard/favicon.svg",
        "/dashboard/style.css",
        "/dashboard/app.js",
        "#/",
    ]
    # The token: asked for once, kept in the tab, sent in a header; streams read with fetch, not EventSource.
    assert "sessionStorage" in script and "localStorage" not in script and "document.cookie" not in script
    assert "new EventSource" not in script
    assert script.count('"Bearer " + auth.token') == 2  # the API call and the event stream, both headers
    assert not re.search(r"[?&](access_)?token=", script)


def test_the_page_ships_as_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["runtime.apps.dashboard"]
    files = sorted(p.relative_to(STATIC.parent).as_posix() for p in STATIC.iterdir())
    assert files == ["static/app.js", "static/favicon.svg", "static/index.html", "static/style.css"]
    assert all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files)
    assert {name for name, _ in PAGES.values()} == {p.name for p in STATIC.iterdir()}
    assert "playwright" in " ".join(pyproject["project"]["optional-dependencies"]["dev"])


def test_the_overview_tells_every_hosted_session_without_waking_one(
    rt: Any, client: httpx.Client, session: Any, script: Any
) -> None:
    from runtime.provider.script import Turn

    model = script(Turn(text="Hello."), Turn(text="Noted."), Turn(text="## Goal\nRemember the words."))
    busy = session(model, session_id="busy", config={"models.context_windows": {model: 8_000}})
    quiet = session(model, session_id="quiet")
    parked = session(model, session_id="parked")

    long_prompt = "Remember these words: " + " ".join(f"word{n}" for n in range(600))  # to compact later
    assert rt.prompt(busy, long_prompt).result(timeout=30).status == "ok"
    assert rt.prompt(busy, "And now?").result(timeout=30).status == "ok"
    rt.context_stats(parked)  # its actors start ...
    assert rt.hibernate(parked)  # ... and stop again

    def settled() -> dict[str, dict[str, Any]] | None:
        """busy's turn and parked's hibernation reached the board"""
        found = rows(client)
        return found if found["busy"]["turns"] == 2 and found["parked"]["state"] == "parked" else None

    found = eventually(settled)
    body = client.get("/overview").json()
    assert body["event_types"] == list(STREAM_TYPES)
    assert set(STREAM_TYPES) == EVENT_TYPES - {
        "text_delta",
        "reasoning_delta",
        "tool_call_delta",
        "tool_output",
    }
    assert abs(body["now"] - time.time()) < 5
    assert set(found) == {"busy", "quiet", "parked"}

    row = found["busy"]
    assert row["state"] == "idle" and row["model"] == model and row["window"] == 8_000
    assert row["threshold"] == rt.context_stats(busy).compaction_threshold
    assert row["input_tokens"] > 0 and row["output_tokens"] > 0 and row["context_tokens"] > 0
    assert row["last_type"] in STREAM_TYPES and row["last_ts"] >= row["created"] > 0
    assert row["seq"] >= rt.bus.last_seq(busy) - 20  # the last folded event (deltas are not folded)
    assert row["compactions"] == 0 and row["errors"] == 0
    assert row["title"] == long_prompt[:120]  # the first prompt's start titles the session

    assert found["quiet"]["state"] == "new" and found["quiet"]["turns"] == 0
    assert found["quiet"]["context_tokens"] is None
    running = {sid: rt._session(sid).running for sid in ("quiet", "parked")}
    assert running == {"quiet": False, "parked": False}  # the overview asked no actor anything

    done = rt.compact(busy, keep_recent_tokens=20).result(timeout=30)  # the long prompt goes
    assert done.compacted, done.reason
    eventually(lambda: rows(client)["busy"]["compactions"] == 1)
    assert rows(client)["busy"]["context_tokens"] == done.tokens_after

    rt.delete_session(quiet)
    eventually(lambda: "quiet" not in rows(client))


class PublicOnly:
    """A runtime seen through its public API only (as a cluster runtime is): no session table, no services."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self.config = rt.config

    @property
    def running(self) -> bool:
        return bool(self._rt.running)

    def hosted_sessions(self) -> list[str]:
        return list(self._rt.hosted_sessions())

    def subscribe(self, *args: Any, **kwargs: Any) -> Any:
        return self._rt.subscribe(*args, **kwargs)


def test_a_runtime_without_a_session_table_is_described_from_its_events(
    rt: Any, session: Any, script: Any
) -> None:
    from runtime.provider.script import Turn

    board = SessionBoard(PublicOnly(rt))
    board.snapshot()  # subscribes
    model = script(Turn(text="Hi."))
    sid = session(model, config={"models.context_windows": {model: 10_000}})
    assert rt.prompt(sid, "hello").result(timeout=30).status == "ok"

    def described() -> dict[str, Any] | None:
        """the turn reached the board"""
        rows = {r["id"]: r for r in board.snapshot()["sessions"]}
        return rows[sid] if rows[sid]["turns"] == 1 else None

    row = eventually(described)
    assert (row["model"], row["window"], row["state"]) == (model, 10_000, "idle")
    assert row["threshold"] == rt.context_stats(sid).compaction_threshold
    assert row["input_tokens"] > 0 and row["created"] > 0
    board.close()


def test_one_board_per_runtime(rt: Any, server: ApiServer) -> None:
    assert SessionBoard.for_runtime(rt) is SessionBoard.for_runtime(rt)
    with ApiServer(rt, TOKEN):  # a second server on the same runtime shares it
        assert SessionBoard.for_runtime(rt)._subscription is not None


def test_demo_serve_keeps_the_dashboard_up_after_the_demo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "TASK", demo.TASK[:1])  # one short turn: the demo itself is not under test
    monkeypatch.setattr(demo, "MAX_PROMPTS", 1)
    seen: dict[str, Any] = {}

    def visit(dashboard: Any) -> None:  # instead of waiting for Ctrl-C: what a newcomer's browser gets
        url = dashboard.server.url
        with httpx.Client(base_url=url, timeout=10) as anonymous:
            seen["page"] = anonymous.get("/").status_code
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {dashboard.server.token}"}) as c:
            seen["sessions"] = sorted(rows(c))
            seen["prompt"] = c.post("/sessions/demo-1/prompt", json={"text": "Hello", "wait": True}).json()

    monkeypatch.setattr(demo._Dashboard, "block", visit)
    out = io.StringIO()
    assert run_demo_status(out) == 1  # one short turn shows no compaction: the demo says so, as ever
    text = out.getvalue()
    match = re.search(r"dashboard: (http://127\.0\.0\.1:\d+)/  \(bearer token: (\S+)\)", text)
    assert match, text
    assert "the demo is done; its sessions stay up at" in text
    assert seen["page"] == 200
    assert {"demo-1", "demo-2"} <= set(seen["sessions"])
    assert seen["prompt"]["status"] == "ok"
    capsys.readouterr()


def run_demo_status(out: io.StringIO) -> int:
    return demo.run_demo(sessions=2, window=6_000, plain=True, out=out, serve=0)


def test_demo_serve_on_the_command_line() -> None:
    args = build_parser().parse_args(["demo", "--serve", "--port", "0"])
    assert (args.serve, args.port) == (True, 0)
    args = build_parser().parse_args(["demo"])
    assert (args.serve, args.port) == (False, 8765)


def test_one_failed_turn_is_one_error_on_the_board(
    rt: Any, client: httpx.Client, session: Any, script: Any
) -> None:
    from runtime.provider.script import Fault, Turn

    model = script(Turn(fault=Fault(kind="auth")))
    sid = session(model, session_id="fails")
    assert rt.prompt(sid, "hello").result(timeout=30).status == "error"
    found = eventually(lambda: (r := rows(client)["fails"])["turns"] == 1 and r)
    assert found["errors"] == 1, found  # its error event, not also its agent_end
    assert found["title"] == "hello"


def test_an_open_board_lets_a_runtime_stop_without_an_event_for_every_idle_session(
    rt: Any, session: Any, script: Any
) -> None:
    """The dashboard's board follows every session, yet the runtime's stop publishes no ``session_stopped``
    for each idle one (a million idle sessions would be a million events); the stop still clears its rows,
    so a session resumed after a restart shows only what happened since."""
    from runtime.provider.script import Turn

    board = SessionBoard.for_runtime(rt)
    model = script(Turn(text="Hi."), Turn(text="Again."))
    sid = session(model, session_id="talked")
    idle = [rt.start_session(model="openai/idle") for _ in range(20)]
    assert rt.prompt(sid, "hello").result(timeout=30).status == "ok"

    def counted() -> bool:
        """the turn reached the board"""
        return any(r["id"] == sid and r["turns"] == 1 for r in board.snapshot()["sessions"])

    eventually(counted)
    stops = StopsSeen()
    rt.bus.add_sink(stops)
    rt.stop()
    assert stops == [sid]  # (its transcript's clean end; on dce1364: 21)
    assert all(rt.bus.last_seq(s) <= 1 for s in idle)  # (their session_started at most)
    rt.start()
    rt.resume_session(sid)
    (row,) = (r for r in board.snapshot()["sessions"] if r["id"] == sid)
    assert (row["turns"], row["title"]) == (0, None)
