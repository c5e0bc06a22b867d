"""The dashboard in a real headless browser: Debian's Chromium driven by Playwright's Python API.

One server for the module hosts 20 sessions on the local provider, told a 4,000-token window so that a
couple of file-reading prompts reach the compaction threshold; one browser for the module. The tests run
in order, as a person would: log in, watch the table update live, sort and filter it, open a session,
send prompts from the page until a compaction shows, compact by hand, start a slow turn, steer it and
abort it; then a page fed a thousand sessions and twenty thousand events. Screenshots go to the pytest
temporary directory (``dashboard-screenshots*``); the run's summary lists them (tests/app/conftest.py).

Without Chromium or Playwright the tests fail and say what to install: ``.ci/run`` installs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runtime.apps import demo
from runtime.apps.dashboard import STREAM_TYPES
from runtime.apps.server import ApiServer, ServerPolicy
from runtime.config import Config
from runtime.host import Runtime
from runtime.provider import LocalProvider
from runtime.provider.script import ToolCallSpec, Turn
from runtime.tools.registry import tool

TOKEN = "browser-test-token"
SLOW_MODEL = "openai/agentcell-slow"
"""The model of the session the abort test uses: its first reply takes a minute, its next is at once."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READS = [
    "Read inventory.py, pricing.py and reports.py and tell me what they do.",
    "Read README.md and test_inventory.py.",
    "Read inventory.py and pricing.py once more.",
    "Read reports.py and README.md again.",
]


@dataclass
class Stack:
    rt: Any
    provider: LocalProvider
    server: ApiServer
    screenshots: Path
    shots: list[Path]
    workspaces: Path
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # the module's tab's: url, auth
    errors: list[str] = field(default_factory=list)  # its script errors

    @property
    def url(self) -> str:
        return self.server.url


def _chromium() -> str:
    """The Chromium to drive: ``AGENTCELL_CHROMIUM``, else the system's ``chromium``."""
    for candidate in (
        os.environ.get("AGENTCELL_CHROMIUM"),
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        "/usr/bin/chromium",
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    pytest.fail(
        "the dashboard's browser test needs Chromium and found none: install Debian's chromium package "
        "(apt-get install chromium; .ci/run does) or set AGENTCELL_CHROMIUM to a Chrome or Chromium binary",
        pytrace=False,
    )


def _config(model: str) -> dict[str, Any]:
    """The demo's session config: told 4,000 tokens (the provider has 6,000), the session compacts at
    2,400, within two reads; its summarizer is told the provider's window."""
    config = demo._session_config(4_000, 6_000)
    config["models.context_windows"] = {**config["models.context_windows"], model: 4_000}
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, screenshots: list[Path]) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("dashboard")
    folder = tmp_path_factory.mktemp("dashboard-screenshots")
    provider = LocalProvider(context_window=6_000)
    provider.add_script(
        SLOW_MODEL.split("/", 1)[1],
        [Turn(text="That took a while.", latency=60), Turn(text="Steered, and done.")],
        loop=True,
    )
    config = Config().with_overrides({"persistence.fsync": "never"})
    with provider, Runtime(config, sessions_dir=root / "sessions") as rt:
        for n in range(20):
            workspace = root / "workspaces" / f"s{n:02d}"
            demo.write_project(workspace)  # the demo's little project: files to read
            model = SLOW_MODEL if n == 19 else demo.DEMO_MODEL
            rt.start_session(
                f"s{n:02d}",
                model=model,
                tools="builtin",
                workspace=workspace,
                api_base=provider.url,
                api_key="sk-local",
                config=_config(model),
            )
        # (as under `agentcell serve --local`: a session created from the page runs on the local provider)
        policy = ServerPolicy(workspace_root=str(root / "workspaces"), local_provider=provider.url)
        with ApiServer(rt, TOKEN, policy=policy) as server:
            yield Stack(rt, provider, server, folder, screenshots, root / "workspaces")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the dashboard's browser test needs the playwright package: pip install -e '.[dev]'",
            pytrace=False,
        )
    executable = _chromium()
    with sync_playwright() as playwright:
        try:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path_factory.mktemp("chromium-profile")),
                executable_path=executable,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 900},
            )
        except Exception as exc:
            pytest.fail(f"cannot start Chromium ({executable}) for the dashboard test: {exc}", pytrace=False)
        context.set_default_timeout(20_000)
        yield context
        context.close()


@pytest.fixture(scope="module")
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    """One tab for the module, with every request it makes and every script error it has."""
    tab = browser.new_page()
    tab.on("request", lambda r: stack.requests.append((r.url, r.headers.get("authorization"))))
    tab.on("pageerror", lambda exc: stack.errors.append(str(exc)))
    yield tab
    tab.close()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    playwright_expect.set_options(timeout=20_000)  # a loaded machine: turns take longer than 5 s
    return playwright_expect(locator)


def shot(page: Any, stack: Stack, name: str) -> None:
    path = stack.screenshots / f"{name}.png"
    page.screenshot(path=str(path))
    stack.shots.append(path)
    print(f"screenshot: {path}")


def login(page: Any, url: str) -> None:
    page.goto(url + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", TOKEN)
    page.click("#login-form button")
    expect(page.locator("#sessions-view")).to_be_visible()


def row(page: Any, sid: str) -> Any:
    return page.locator(f'tr.row[data-id="{sid}"]')


# -- the tests, in the order a person would go ------------------------------------------------------


def test_the_page_asks_for_the_token_once_and_keeps_it_in_the_tab(page: Any, stack: Stack) -> None:
    page.goto(stack.url + "/")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", "not-the-token")
    page.click("#login-form button")
    expect(page.locator("#login-error")).to_have_text("The server refused the token.")
    assert page.evaluate("sessionStorage.getItem('agentcell.token')") is None

    page.fill("#token", TOKEN)
    page.click("#login-form button")
    expect(page.locator("tr.row")).to_have_count(20)
    expect(page.locator("#conn")).to_have_text("live")
    assert page.evaluate("sessionStorage.getItem('agentcell.token')") == TOKEN

    page.reload()  # the same tab: no question asked again
    expect(page.locator("tr.row")).to_have_count(20)
    assert page.locator("#login").is_hidden()

    urls = [url for url, _ in stack.requests]
    assert all(url.startswith(stack.url + "/") for url in urls), urls  # nothing from elsewhere
    assert not [url for url in urls if TOKEN in url]
    streams = [(url, auth) for url, auth in stack.requests if "/events" in url]
    assert streams and all(auth == f"Bearer {TOKEN}" for _, auth in streams)
    assert not stack.errors


def test_the_table_shows_every_session_and_follows_them_live(page: Any, stack: Stack) -> None:
    for sid in ("s00", "s05", "s19"):
        expect(row(page, sid).locator(".c-model")).to_have_text(
            SLOW_MODEL if sid == "s19" else demo.DEMO_MODEL
        )
    expect(row(page, "s05").locator(".c-state")).to_have_text("new")
    expect(row(page, "s05").locator(".c-ctx .label")).to_have_text("– / 2.4k / 4.0k")

    # Turns run outside the page; the page follows them from the event stream, without a reload.
    handles = [stack.rt.prompt(sid, READS[0]) for sid in ("s03", "s05", "s07")]
    assert all(h.result(timeout=60).status == "ok" for h in handles)
    for sid in ("s03", "s05", "s07"):
        cells = row(page, sid)
        expect(cells.locator(".c-turns")).to_have_text("1")
        expect(cells.locator(".c-state")).to_have_text("idle")
        expect(cells.locator(".c-in")).not_to_have_text("0")
        expect(cells.locator(".c-last")).to_contain_text(" ago")
        expect(cells.locator(".c-ctx .label")).to_have_text(re.compile(r"^[\d.]+k? / 2\.4k / 4\.0k$"))
    assert page.evaluate("window.agentcell.stats.events") > 30

    # A turn caught in the middle: the provider takes two seconds to answer.
    stack.provider.latency = 2.0
    try:
        handle = stack.rt.prompt("s10", "Hello?")
        expect(row(page, "s10").locator(".c-state")).to_have_text("streaming")
        expect(page.locator("#counts")).to_have_text("20 sessions · 1 active")
        expect(row(page, "s10").locator(".c-last")).to_contain_text("status_update")
    finally:
        stack.provider.latency = 0.0
    assert handle.result(timeout=60).status == "ok"
    expect(row(page, "s10").locator(".c-state")).to_have_text("idle")
    expect(page.locator("#counts")).to_have_text("20 sessions · 0 active")

    # Sort by tokens in (largest first), then filter by text and by state.
    page.click('th[data-key="input_tokens"]')
    expect(page.locator('th[data-key="input_tokens"]')).to_have_attribute("aria-sort", "descending")
    # (expect waits for the table's next render: read at once, the first row may be from before the sort)
    expect(page.locator("tr.row").first).to_have_attribute("data-id", re.compile(r"^s0[357]$"))
    page.fill("#filter", "s1")
    expect(page.locator("tr.row")).to_have_count(10)
    expect(page.locator("#shown")).to_have_text("10 of 20 shown")
    page.fill("#filter", "")
    page.select_option("#state-filter", "idle")
    expect(page.locator("tr.row")).to_have_count(4)  # s03, s05, s07, s10
    shot(page, stack, "1-sessions-sorted-idle")
    page.select_option("#state-filter", "all")
    page.click('th[data-key="id"]')
    expect(page.locator("tr.row")).to_have_count(20)
    shot(page, stack, "2-sessions")
    assert not stack.errors


def test_a_session_shows_its_events_context_and_messages_and_takes_prompts(page: Any, stack: Stack) -> None:
    row(page, "s00").click()
    expect(page.locator("#session-view")).to_be_visible()
    expect(page.locator("#s-title")).to_have_text("s00")
    expect(page.locator("#ctx-bar .seg")).to_have_count(5)
    expect(page.locator("#ctx-bar .threshold")).to_have_count(1)
    expect(page.locator("#ctx-caption")).to_contain_text("of 4,000 tokens")

    # Prompts typed into the page, until the session compacts at its threshold.
    turns = page.locator('.tl-item[data-kind="turn"]')
    for n, text in enumerate(READS, start=1):
        page.fill("#prompt-text", text)
        page.click("#prompt-send")
        expect(page.locator("#prompt-status")).to_contain_text("sent (")
        expect(page.locator('.tl-item[data-status="ok"]')).to_have_count(n)
        if page.locator('.tl-child[data-kind="compaction"]').count():
            break
    else:
        raise AssertionError("no compaction after four prompts")
    assert turns.count() == n and n >= 2

    compaction = page.locator('.tl-child[data-kind="compaction"]').first
    expect(compaction.locator(".tl-text")).to_have_text(
        re.compile(
            r"^at the threshold: [\d,]+ → [\d,]+ tokens, \d+ → \d+ messages?, summarize, summary [\d,]+ chars"
        )
    )
    expect(compaction.locator(".tl-dur")).to_have_text(re.compile(r"\d+(\.\d+)? (ms|s)$"))
    tools = page.locator('.tl-child[data-kind="tool"]')
    assert tools.count() >= 3
    expect(tools.first.locator(".tl-kind")).to_have_text("read_file")
    expect(tools.first.locator(".tl-text")).to_have_text(re.compile(r'^path="[\w.]+" → [\d,]+ chars$'))
    expect(tools.first.locator(".tl-dur")).to_have_text(re.compile(r"\d+(\.\d+)? ms$"))
    expect(turns.first.locator(".tl-detail")).to_contain_text(" in / ")

    # Messages: the summary is marked, and what it replaced is marked as out of the model's context.
    expect(page.locator('.msg[data-kind="compaction_summary"]').first).to_contain_text("compaction summary")
    assert page.locator('.msg[data-in-context="0"]').count() >= 2
    expect(page.locator("#msg-caption")).to_contain_text("in the model's context")
    expect(page.locator(".msg.r-tool").first).to_contain_text("compacted away")
    expect(page.locator("#ctx-caption")).not_to_contain_text(" 0 messages")  # refreshed after the turns
    assert (
        page.locator('#ctx-bar [data-part="messages"]').evaluate("e => e.getBoundingClientRect().width") > 0
    )
    # The session's title is its first prompt; its context over time is drawn, the compaction marked.
    expect(page.locator("#s-subtitle")).to_have_text(READS[0])
    expect(page.locator("#ctx-chart polyline")).to_have_count(1)
    assert page.locator("#ctx-chart line.compaction").count() >= 1
    expect(page.locator("#ctx-chart line.threshold")).to_have_count(1)
    expect(page.locator("#chart-caption")).to_contain_text("compaction")
    # Figures in words, with thousands separators; a cost no price is known for says so.
    expect(page.locator("#ctx-legend")).not_to_contain_text("_")  # no raw back_calculated
    expect(page.locator("#ctx-legend")).to_contain_text(re.compile(r"reserve [\d,]+\s*configured"))
    expect(page.locator("#s-meta")).to_contain_text("(no price known)")
    shot(page, stack, "3-session-compaction")

    # The compact button: a manual compaction, shown in the timeline as one.
    page.fill("#prompt-text", READS[-1])
    page.click("#prompt-send")
    expect(page.locator('.tl-item[data-status="ok"]')).to_have_count(n + 1)
    page.click("#s-compact")
    expect(page.locator("#toast")).to_have_text(re.compile(r"^Compacted: [\d,]+ → [\d,]+ tokens$"))
    expect(page.locator('.tl-child[data-kind="compaction"]').last.locator(".tl-text")).to_contain_text(
        "asked for:"
    )
    expect(page.locator("#s-compact")).to_be_enabled()
    assert not stack.errors


def test_a_slow_turn_can_be_steered_and_aborted_from_the_page(page: Any, stack: Stack) -> None:
    page.click(".brand")
    expect(page.locator("#sessions-view")).to_be_visible()
    row(page, "s19").click()
    expect(page.locator("#s-title")).to_have_text("s19")

    page.fill("#prompt-text", "Take your time.")
    page.click("#prompt-send")
    running = page.locator('.tl-item[data-status="running"]')
    expect(running).to_have_count(1)
    expect(page.locator("#s-state")).to_have_text("streaming")
    expect(running.locator(".tl-detail")).to_have_text(re.compile(r"^\d+(\.\d+)? (ms|s)"))
    expect(page.locator("#counts")).to_have_text("20 sessions · 1 active")  # counted in this view too

    page.check("#prompt-steer")
    page.fill("#prompt-text", "Actually, wrap it up.")
    page.click("#prompt-send")
    expect(page.locator("#prompt-status")).to_contain_text("steering message sent")
    expect(running.locator('.tl-child[data-kind="queue"] .tl-kind')).to_have_text("steer")
    shot(page, stack, "4-slow-turn-running")

    page.click("#s-abort")
    expect(page.locator("#toast")).to_have_text("Turn aborted")
    aborted = page.locator('.tl-item[data-status="aborted"]')
    expect(aborted).to_have_count(1)
    expect(aborted.locator('.tl-child[data-kind="abort"]')).to_have_count(1)
    # The steering message found no step boundary before the abort: it runs next, as its own turn.
    expect(page.locator('.tl-item[data-status="ok"]')).to_have_count(1)
    expect(page.locator(".msg.r-assistant").last).to_contain_text("Steered, and done.")
    expect(page.locator("#s-state")).to_have_text("idle")
    expect(page.locator("#ctx-caption")).to_contain_text(" 3 messages")
    shot(page, stack, "5-aborted")
    assert not stack.errors


def test_the_table_reads_at_900_and_600_px_with_titles_totals_and_sub_agents(page: Any, stack: Stack) -> None:
    # A lead session delegates to a sub-agent: the sub-agent's row comes right under its parent's.
    lead = stack.rt.start_session(
        "lead",
        model=demo.DEMO_MODEL,
        tools="builtin",
        workspace=stack.workspaces / "s00",
        api_base=stack.provider.url,
        api_key="sk-local",
        config=_config(demo.DEMO_MODEL),
        agents={"reader": {"description": "reads files", "tools": "builtin"}},
    )
    assert stack.rt.prompt(lead, demo.DELEGATION).result(timeout=60).status == "ok"
    (child,) = stack.rt.children(lead)
    page.click(".brand")
    expect(row(page, child)).to_have_count(1)
    expect(row(page, child).locator(".c-id .sub")).to_contain_text("↳")  # once the page knows its parent
    ids = page.locator("tr.row").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert ids[ids.index("lead") + 1] == child, ids
    expect(row(page, "lead").locator(".c-id .title")).to_have_text(demo.DELEGATION)
    # Totals of the rows shown; a cost no price is known for says why.
    expect(page.locator("#totals")).to_have_text(
        re.compile(r"^total: [\d,]+ in \(\d+% cached\) · [\d,]+ out · –$")
    )
    assert "no price known" in (page.locator("#totals").get_attribute("title") or "")
    assert "no price known" in (row(page, "s00").locator(".c-cost").get_attribute("title") or "")
    expect(row(page, "s00").locator(".c-in")).to_have_text(re.compile(r"^\d{1,3}(,\d{3})+$"))

    try:
        for width in (900, 600):
            page.set_viewport_size({"width": width, "height": 800})
            expect(page.locator('th[data-key="model"]')).to_be_hidden()
            for sid in ("s00", "lead", child):
                cell = row(page, sid).locator(".c-id .sid")
                expect(cell).to_have_text(sid)
                box = row(page, sid).locator(".c-id").bounding_box()
                text = cell.bounding_box()
                assert box and text and box["width"] >= 120, (width, box)
                assert text["x"] + text["width"] <= box["x"] + box["width"], (width, sid)  # not cut off
            shot(page, stack, f"6-sessions-{width}px")
    finally:
        page.set_viewport_size({"width": 1400, "height": 900})
    assert not stack.errors


def test_a_priced_session_shows_its_cache_hits_its_cost_split_and_what_the_cache_saved(
    page: Any, stack: Stack
) -> None:
    model = "openai/gpt-4.1"  # litellm prices it; the local provider answers it and caches automatically
    sid = stack.rt.start_session(
        "priced",
        model=model,
        api_base=stack.provider.url,
        api_key="sk-local",
        system_prompt="You answer briefly and precisely. " * 150,
        config={"models.context_windows": {model: 32_000}},
    )
    for i in range(3):
        assert stack.rt.prompt(sid, f"Question {i}: what is {i} + {i}?").result(timeout=60).status == "ok"
    usage = stack.rt.usage(sid)
    assert usage.cache_read_tokens > 0 and usage.costs is not None
    page.click(".brand")
    share = round(100 * usage.cache_read_tokens / usage.input_tokens)
    expect(row(page, sid).locator(".c-cache")).to_have_text(f"{share}%")
    title = row(page, sid).locator(".c-cache").get_attribute("title") or ""
    assert f"{usage.cache_read_tokens:,} of {usage.input_tokens:,} input tokens read from the cache" in title
    expect(row(page, sid).locator(".c-cost")).to_have_text(re.compile(r"^\$0\.\d{4}$"))
    cost_title = row(page, sid).locator(".c-cost").get_attribute("title") or ""
    assert "cache read $" in cost_title and "output $" in cost_title and "saved by the cache" in cost_title
    # The totals count the priced session: a cost (no longer "–") and what the cache saved.
    expect(page.locator("#totals")).to_have_text(
        re.compile(r"% cached\) · [\d,]+ out · \$[\d.]+ · \$[\d.]+ saved")
    )
    page.reload()  # the table's first rows come from the server's snapshot: the same figures
    expect(row(page, sid).locator(".c-cache")).to_have_text(f"{share}%")
    assert "saved by the cache" in (row(page, sid).locator(".c-cost").get_attribute("title") or "")
    shot(page, stack, "8-cache-and-cost")
    assert not stack.errors


def test_a_long_tool_name_leaves_the_timeline_room(page: Any, stack: Stack) -> None:
    name = "fetch_customer_records_from_the_warehouse_inventory_database"

    @tool(name=name)
    def fetch(query: str) -> str:
        """Fetch records."""
        return "a record\n" * 5

    stack.provider.add_script(
        "long-tool",
        [
            Turn(tool_calls=(ToolCallSpec(name=name, arguments='{"query": "customers in the north-east"}'),)),
            Turn(text="Fetched them."),
        ],
    )
    sid = stack.rt.start_session(
        "long-tool", model="openai/long-tool", tools=[fetch], api_base=stack.provider.url, api_key="sk-local"
    )
    assert stack.rt.prompt(sid, "fetch the customers").result(timeout=60).status == "ok"
    page.goto(stack.url + "/#/s/long-tool")
    entry = page.locator('.tl-child[data-kind="tool"]').first
    expect(entry.locator(".tl-text")).to_contain_text("customers in the north-east")
    try:
        for width in (1400, 600):
            page.set_viewport_size({"width": width, "height": 800})
            kind = entry.locator(".tl-kind").bounding_box()
            text = entry.locator(".tl-text").bounding_box()
            whole = entry.bounding_box()
            assert kind and text and whole
            assert kind["width"] <= 0.4 * whole["width"], (width, kind, whole)
            assert text["width"] >= 0.35 * whole["width"], (width, text, whole)  # not a letter a line
            shot(page, stack, f"7-long-tool-{width}px")
    finally:
        page.set_viewport_size({"width": 1400, "height": 900})


def test_sessions_are_created_and_deleted_from_the_page(page: Any, stack: Stack) -> None:
    page.click(".brand")
    page.click("#new-session")
    page.fill("#new-model", "openai/agentcell-local")
    page.fill("#new-system", "Be brief.")
    page.click("#new-create")
    expect(page.locator("#session-view")).to_be_visible()
    sid = page.locator("#s-title").inner_text()
    assert sid and stack.rt.services.directory is not None
    assert sid in stack.rt.hosted_sessions()
    page.fill("#prompt-text", "Hello from the page")
    page.click("#prompt-send")
    expect(page.locator('.tl-item[data-status="ok"]')).to_have_count(1)
    expect(page.locator("#s-subtitle")).to_have_text("Hello from the page")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#s-delete")
    expect(page.locator("#sessions-view")).to_be_visible()
    expect(page.locator("#toast")).to_have_text(f"Session {sid} deleted")
    expect(row(page, sid)).to_have_count(0)
    assert sid not in stack.rt.hosted_sessions()
    assert not stack.errors


@pytest.fixture
def tab(browser: Any) -> Iterator[Any]:
    """A tab of its own (its own sessionStorage: it asks for the token again)."""
    fresh = browser.new_page()
    yield fresh
    fresh.close()


def test_a_thousand_sessions_and_a_burst_of_events_stay_smooth(tab: Any, stack: Stack) -> None:
    """The page's own data paths (the overview, the event stream) fed a thousand sessions and 20,000
    events by the browser's request routing: the DOM holds only the rows in view, and events are drawn
    in a few frames, not one frame (or one redraw) each."""
    sessions, rounds = 1_000, 10
    now = time.time()
    snapshot = {
        "now": now,
        "event_types": list(STREAM_TYPES),
        "sessions": [
            {
                "id": f"load-{n:04d}",
                "model": "openai/agentcell-demo",
                "state": "idle",
                "window": 128_000,
                "threshold": 89_600,
                "context_tokens": 0,
                "last_type": "session_started",
                "last_ts": now,
                "created": now - n,
                "seq": 1,
            }
            for n in range(sessions)
        ],
    }
    frames: list[str] = []
    for r in range(rounds):
        for n in range(sessions):
            sid, seq = f"load-{n:04d}", 2 + r * 2
            totals = {"input_tokens": (r + 1) * (n + 1), "output_tokens": r + 1}
            for event in (
                {"type": "status_update", "state": "running", "previous": "idle", "turn_id": "t", "seq": seq},
                {
                    "type": "usage_update",
                    "usage": totals,
                    "totals": totals,
                    "context_window": 128_000,
                    "context_tokens": (r + 1) * 100 + n,
                    "seq": seq + 1,
                },
            ):
                event.update(session_id=sid, ts=now)
                frames.append(
                    f"id: {sid}:{event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"
                )
    body = ": connected\n\n" + "".join(frames)
    served = []

    def events(route: Any) -> None:
        if served:  # once: later reconnects find the server gone
            route.fulfill(status=503, content_type="application/json", body='{"error": "gone"}')
            return
        served.append(route.request.headers.get("authorization"))
        route.fulfill(status=200, content_type="text/event-stream", body=body)

    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.route(
        re.compile(r".*/overview$"),
        lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(snapshot)),
    )
    tab.route(re.compile(r".*/events\?.*"), events)
    login(tab, stack.url)
    deadline = (
        time.monotonic() + 60
    )  # (polled from here: the page's CSP allows no eval for wait_for_function)
    while tab.evaluate("window.agentcell.stats.events") < sessions * rounds * 2:
        assert time.monotonic() < deadline, "the page did not take the events in within 60 s"
        time.sleep(0.1)
    tab.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    stats = tab.evaluate("window.agentcell.stats")
    assert served == [f"Bearer {TOKEN}"]
    expect(tab.locator("#counts")).to_have_text(re.compile(r"^1,000 sessions · 1,000 active$"))
    rendered = tab.locator("tr.row").count()
    assert 20 <= rendered <= 60, rendered  # the rows in view and a few more, not a thousand
    assert stats["frames"] < 100, stats  # 20,000 events, a handful of frames
    assert stats["maxFlushMs"] < 250, stats
    expect(tab.locator('tr.row[data-id="load-0000"] .c-in')).to_have_text(str(rounds))

    # Sorting a thousand rows and scrolling to the end: one frame each.
    took = tab.evaluate(
        """async () => {
            const t = performance.now();
            document.querySelector('th[data-key="input_tokens"]').click();
            await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            return performance.now() - t;
        }"""
    )
    assert took < 500, took
    expect(tab.locator("tr.row").first).to_have_attribute("data-id", "load-0999")
    tab.evaluate("document.getElementById('table-wrap').scrollTop = 1e9")
    expect(tab.locator("tr.row").last).to_have_attribute("data-id", "load-0000")

    # Live load: 300 events a frame for sixty frames, through the page's ingest path.
    timing = tab.evaluate(
        """async ([sessions, rounds]) => {
            const flushes = [];
            const now = Date.now() / 1000;
            let seq = 2 + rounds * 2;
            for (let f = 0; f < 60; f++) {
                const batch = [];
                for (let i = 0; i < 300; i++) {
                    const n = (f * 300 + i) % sessions;
                    const id = 'load-' + String(n).padStart(4, '0');
                    batch.push({type: 'status_update', session_id: id, seq: seq + f, ts: now,
                                state: f % 2 ? 'streaming' : 'executing_tools', previous: 'running'});
                }
                window.agentcell.ingestEvents(batch);
                await new Promise(r => requestAnimationFrame(r));
                flushes.push(window.agentcell.stats.flushMs);
            }
            flushes.sort((a, b) => a - b);
            return {median: flushes[30], p95: flushes[57], max: flushes[59]};
        }""",
        [sessions, rounds],
    )
    assert timing["median"] < 16, timing  # well inside a 60 Hz frame
    assert timing["p95"] < 50, timing
    shot(tab, stack, "6-thousand-sessions")
    assert not errors
