"""``agentcell demo``: several concurrent agent sessions against the built-in local provider (design §7.1).

Offline and without an API key. The demo starts :class:`~runtime.provider.LocalProvider` (its built-in
policy reads and edits the files a prompt mentions, and answers summarization requests), copies a small
Python project into one temporary workspace per session, and runs the same coding task in every session
at once. Each session is told a small context window, so the context management is visible:

- the *steady* sessions are told the provider's real window: they compact automatically when the
  estimate reaches the threshold (``compaction_end{trigger: threshold}``);
- the *overflow* session (the last one) is told a window twice the real one, so it never reaches its
  threshold first: the provider refuses a request with its overflow error, the session compacts as an
  emergency (``compaction_start{trigger: overflow}``) and the retried request succeeds.

The event stream is shown live (rich), or as plain lines with ``--plain`` or when the output is not a
terminal, and the demo ends with a table per session: turns, tokens, compactions and a context bar. It
exits non-zero if it did not see at least one threshold compaction and one overflow recovery.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runtime import events as ev
from runtime.wording import plural

DEMO_MODEL = "openai/agentcell-demo"
"""The sessions' model: no script has this name, so the local provider's built-in policy answers."""
SUMMARIZER_MODEL = "openai/agentcell-summarizer"
MIN_SESSIONS = 2
MIN_WINDOW = 4_000
MAX_WINDOW = 16_000  # larger windows take longer to fill than a demo should
MAX_PROMPTS = 40
"""Prompts per session at most: the task, then more file reads until the session has shown its part."""

# The project every session works on: an inventory module with a bug, its tests, pricing and reports.
PROJECT: dict[str, str] = {
    "README.md": """\
# stockroom

A tiny inventory library: items with a quantity and a unit price, restocking, and a value report.

- `inventory.py`: the `Item` and `Inventory` classes
- `pricing.py`: bulk discounts and tax
- `reports.py`: the text report
- `test_inventory.py`: the tests (run them with `python -m pytest`)

Bulk orders of at least `BULK_THRESHOLD` units get `BULK_DISCOUNT` off.
""",
    "inventory.py": '''\
"""Items and the inventory that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Item:
    """One stock-keeping unit."""

    sku: str
    name: str
    quantity: int
    unit_price: float

    def value(self) -> float:
        """What the units in stock are worth."""
        return self.quantity - self.unit_price

    def restock(self, units: int) -> None:
        """Add ``units`` to the stock; a negative number is a mistake, not a sale."""
        if units < 0:
            raise ValueError(f"cannot restock {units} units of {self.sku}")
        self.quantity += units

    def sell(self, units: int) -> None:
        """Take ``units`` out of the stock."""
        if units > self.quantity:
            raise ValueError(f"only {self.quantity} units of {self.sku} left, asked for {units}")
        self.quantity -= units


@dataclass
class Inventory:
    """All the items of one stockroom, by SKU."""

    items: dict[str, Item] = field(default_factory=dict)

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            raise KeyError(f"duplicate SKU {item.sku}")
        self.items[item.sku] = item

    def get(self, sku: str) -> Item:
        try:
            return self.items[sku]
        except KeyError:
            raise KeyError(f"unknown SKU {sku}") from None

    def low_stock(self, below: int = 5) -> list[Item]:
        """Items with fewer than ``below`` units, fewest first."""
        return sorted((i for i in self.items.values() if i.quantity < below), key=lambda i: i.quantity)

    def total_value(self) -> float:
        return sum(item.value() for item in self.items.values())
''',
    "pricing.py": '''\
"""Prices for orders: bulk discounts and tax."""

from __future__ import annotations

BULK_THRESHOLD = 100
BULK_DISCOUNT = 0.05
TAX_RATE = 0.2


def order_price(unit_price: float, units: int) -> float:
    """The price of ``units`` units before tax, with the bulk discount when it applies."""
    if units <= 0:
        raise ValueError("an order has at least one unit")
    price = unit_price * units
    if units >= BULK_THRESHOLD:
        price *= 1 - BULK_DISCOUNT
    return round(price, 2)


def with_tax(amount: float) -> float:
    """``amount`` with tax added, rounded to cents."""
    return round(amount * (1 + TAX_RATE), 2)


def quote(unit_price: float, units: int) -> dict[str, float]:
    """A quote a customer can read: net, tax and gross."""
    net = order_price(unit_price, units)
    gross = with_tax(net)
    return {"net": net, "tax": round(gross - net, 2), "gross": gross}
''',
    "reports.py": '''\
"""The stock report."""

from __future__ import annotations

from inventory import Inventory
from pricing import with_tax


def stock_report(inventory: Inventory) -> str:
    """One line per item, the low-stock warnings, and the total value with tax."""
    lines = []
    for item in sorted(inventory.items.values(), key=lambda i: i.sku):
        lines.append(f"{item.sku:<8} {item.name:<20} {item.quantity:>5} x {item.unit_price:>8.2f}")
    low = inventory.low_stock()
    if low:
        lines.append("")
        lines.append("low stock: " + ", ".join(f"{i.sku} ({i.quantity})" for i in low))
    lines.append("")
    lines.append(f"total value (with tax): {with_tax(inventory.total_value()):.2f}")
    return "\\n".join(lines)
''',
    "test_inventory.py": """\
import pytest

from inventory import Inventory, Item
from pricing import order_price, quote


def make() -> Inventory:
    inventory = Inventory()
    inventory.add(Item("A-1", "bolt", 40, 0.25))
    inventory.add(Item("B-2", "bracket", 3, 4.00))
    return inventory


def test_value_is_quantity_times_price() -> None:
    assert make().get("A-1").value() == 10.0


def test_total_value() -> None:
    assert make().total_value() == 22.0


def test_restock_and_sell() -> None:
    item = make().get("B-2")
    item.restock(7)
    item.sell(4)
    assert item.quantity == 6
    with pytest.raises(ValueError):
        item.sell(100)


def test_low_stock() -> None:
    assert [i.sku for i in make().low_stock()] == ["B-2"]


def test_bulk_discount() -> None:
    assert order_price(1.0, 100) == 95.0
    assert quote(1.0, 10) == {"net": 10.0, "tax": 2.0, "gross": 12.0}
""",
}

# The coding task, one prompt at a time. The policy reads every file a prompt names, edits when asked
# (``replace "old" with "new"`` is an exact edit), and answers with what it did.
TASK: tuple[str, ...] = (
    "List the directory so we know what the project holds.",
    "Read inventory.py and test_inventory.py: why does test_value_is_quantity_times_price fail?",
    'Fix inventory.py: replace "quantity - self" with "quantity * self".',
    "Read pricing.py and reports.py and tell me how the bulk discount reaches the report.",
    'In pricing.py replace "BULK_DISCOUNT = 0.05" with "BULK_DISCOUNT = 0.08".',
    "Update README.md to mention that the bulk discount is now 8 percent.",
    "Read test_inventory.py again: which assertion of test_bulk_discount needs a new number?",
    'Fix test_inventory.py: replace "order_price(1.0, 100) == 95.0" with "order_price(1.0, 100) == 92.0".',
    "Read inventory.py and reports.py once more and check the report uses the value method.",
    "Edit reports.py to note that item values come from the value method of each item.",
)


# -- what the demo knows about each session, fed by its events ------------------------------------------


@dataclass
class SessionView:
    """One session as the demo shows it; updated from the event stream only."""

    session_id: str
    role: str
    told_window: int
    state: str = "waiting"
    turns: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    context_tokens: int = 0
    threshold_compactions: int = 0
    overflow_compactions: int = 0
    other_compactions: int = 0
    recoveries: int = 0
    failures: list[str] = field(default_factory=list)
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    prompts: deque[str] = field(default_factory=deque)  # sent, not yet started
    prompt: str = ""  # the running turn's prompt
    reply: str = ""
    _overflow_pending: bool = False

    @property
    def compactions(self) -> int:
        return self.threshold_compactions + self.overflow_compactions + self.other_compactions


class DemoMonitor:
    """A bus callback: keeps a :class:`SessionView` per session and passes one line per notable event
    to ``emit`` (``emit(session_id, line)``). Thread-safe."""

    def __init__(self, views: dict[str, SessionView], emit: Callable[[str, str], None] | None = None) -> None:
        self.views = views
        self.emit = emit
        self.lock = threading.Condition()

    def sending(self, session_id: str, text: str) -> None:
        """Say that ``text`` is about to be prompted: it is shown when its turn starts."""
        with self.lock:
            self.views[session_id].prompts.append(text)

    def __call__(self, event: ev.Event) -> None:
        with self.lock:
            view = self.views.get(event.session_id)
            if view is None:
                return
            _update(view, event)
            line = describe(event, view)
            if line is not None:
                self._line(view, line)
            self.lock.notify_all()

    def wait_for_turns(self, turns: dict[str, int], timeout: float) -> bool:
        """Wait until each session has ended at least ``turns[session]`` turns (events arrive on the
        subscription's own thread, a little after the prompt handles resolve)."""
        with self.lock:
            return self.lock.wait_for(
                lambda: all(self.views[sid].turns >= n for sid, n in turns.items()), timeout
            )

    def _line(self, view: SessionView, line: str) -> None:
        view.lines.append(line)
        if self.emit is not None:
            self.emit(view.session_id, line)


def _update(view: SessionView, event: ev.Event) -> None:
    match event:
        case ev.AgentStart():
            view.state, view.reply = "thinking", ""
            view.prompt = view.prompts.popleft() if view.prompts else ""
        case ev.TextDelta(delta=delta):
            view.state = "answering"
            view.reply += delta
        case ev.ToolExecutionStart():
            view.state = "running tools"
            view.tool_calls += 1
        case ev.UsageUpdate(totals=totals, context_tokens=tokens):
            view.input_tokens, view.output_tokens = totals.input_tokens, totals.output_tokens
            view.context_tokens = tokens
        case ev.CompactionStart(trigger=trigger):
            view.state = f"compacting ({trigger})"
            if trigger == "overflow":
                view._overflow_pending = True
        case ev.CompactionEnd(trigger=trigger, tokens_after=after):
            view.context_tokens = after
            if trigger == "threshold":
                view.threshold_compactions += 1
            elif trigger == "overflow":
                view.overflow_compactions += 1
            else:
                view.other_compactions += 1
        case ev.ErrorOccurred(message=message):
            view.failures.append(message)
        case ev.AgentEnd(status=status, context_tokens=tokens):
            view.turns += 1
            view.state = "idle"
            if tokens:
                view.context_tokens = tokens
            if view._overflow_pending and status == "ok":
                view.recoveries += 1  # the turn that overflowed was retried and succeeded
            view._overflow_pending = False
        case _:
            pass


def describe(event: ev.Event, view: SessionView | None = None) -> str | None:
    """One line for a notable event, None for the rest (deltas, appends)."""
    match event:
        case ev.SessionStarted(model=model, context_window=window):
            return f"session started: model {model}, window {window:,} tokens"
        case ev.AgentStart():
            return f"> {view.prompt}" if view is not None and view.prompt else None
        case ev.ToolExecutionStart(name=name, arguments=arguments):
            return f"tool {name}({_clip(arguments, 70)})"
        case ev.ToolExecutionEnd(name=name, is_error=failed, duration=seconds, output_chars=chars):
            return f"tool {name} {'FAILED' if failed else 'ok'}: {chars:,} chars in {seconds * 1000:.0f} ms"
        case ev.TurnEnd(stop_reason="stop"):
            reply = view.reply if view is not None else ""
            return f"assistant: {_clip(' '.join(reply.split()), 110)}" if reply else None
        case ev.UsageUpdate(estimated=True, context_tokens=tokens, context_window=window):
            return f"context now ~{tokens:,} of {window:,} tokens (estimated)"
        case ev.UsageUpdate(usage=usage, context_tokens=tokens, context_window=window):
            return (
                f"usage: {usage.input_tokens:,} in / {usage.output_tokens:,} out; "
                f"context {tokens:,} of {window:,}"
            )
        case ev.CompactionStart(trigger="overflow", tokens_before=tokens):
            return f"OVERFLOW: the provider refused ~{tokens:,} tokens; emergency compaction, then a retry"
        case ev.CompactionStart(trigger=trigger, messages_before=count, tokens_before=tokens):
            return f"COMPACTION ({trigger}) of {count} messages, {tokens:,} tokens..."
        case ev.CompactionEnd(
            trigger=trigger,
            tokens_before=before,
            tokens_after=after,
            messages_after=kept,
            summary_chars=chars,
        ):
            return (
                f"COMPACTED ({trigger}): {before:,} -> {after:,} tokens, "
                f"{kept} messages now, summary of {chars:,} chars"
            )
        case ev.CompactionFailed(error=error):
            return f"compaction failed: {error}"
        case ev.CompactionSkipped(message=message):
            return message
        case ev.ToolResultsArchived(archived=count, strategy=strategy):
            return f"archived {count} old tool results ({strategy} summary)"
        case ev.UsageOverflow(input_tokens=tokens, context_window=window):
            return f"usage overflow: {tokens:,} input tokens > window {window:,}"
        case ev.ProviderRetry(attempt=attempt, max_attempts=most, error=error):
            return f"retry {attempt}/{most}: {_clip(error, 80)}"
        case ev.ErrorOccurred(message=message):
            return f"ERROR: {_clip(message, 140)}"
        case ev.AgentEnd(status=status, context_tokens=tokens, context_window=window):
            return f"turn {status}; context {tokens:,} of {window:,} tokens"
        case _:
            return None


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- running the demo -------------------------------------------------------------------------------------


@dataclass
class DemoOutcome:
    """What a demo run saw, per session."""

    views: list[SessionView]
    seconds: float

    @property
    def threshold_compactions(self) -> int:
        return sum(v.threshold_compactions for v in self.views)

    @property
    def overflow_recoveries(self) -> int:
        return sum(v.recoveries for v in self.views)

    @property
    def problems(self) -> list[str]:
        """Why the demo did not show what it should (empty when it did)."""
        out = []
        if not self.threshold_compactions:
            out.append("no automatic compaction at the threshold happened")
        if not self.overflow_recoveries:
            out.append("no overflow was recovered (emergency compaction, then a successful retry)")
        for view in self.views:
            out.extend(f"{view.session_id}: {failure}" for failure in view.failures)
        return out


def run_demo(
    sessions: int = 3,
    window: int = 6_000,
    plain: bool = False,
    *,
    out: TextIO | None = None,
    serve: int | None = None,
    shards: int | None = None,
) -> int:
    """Run the demo; returns the exit status (0 when every session did its work and both a threshold
    compaction and an overflow recovery happened). ``plain`` prints lines instead of a live view; output
    that is not a terminal is always plain. With ``serve`` (a port; 0: any free one) the dashboard of
    ``agentcell serve`` is up from the start and stays up after the demo, until Ctrl-C."""
    out = out if out is not None else sys.stdout
    if sessions < MIN_SESSIONS:
        print(f"agentcell demo: --sessions must be at least {MIN_SESSIONS}", file=sys.stderr)
        return 2
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        print(f"agentcell demo: --window must be {MIN_WINDOW:,} to {MAX_WINDOW:,} tokens", file=sys.stderr)
        return 2
    live = not plain and out.isatty()
    try:
        outcome = _run(sessions, window, out, live, serve, shards=shards)
    except KeyboardInterrupt:
        print("agentcell demo: interrupted", file=sys.stderr)
        return 130
    problems = outcome.problems
    for problem in problems:
        print(f"agentcell demo: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _run(
    sessions: int,
    window: int,
    out: TextIO,
    live: bool,
    serve: int | None = None,
    *,
    shards: int | None = None,
) -> DemoOutcome:
    from runtime.config import Config
    from runtime.provider import LocalProvider

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="agentcell-demo-"))
    views = {
        f"demo-{n}": SessionView(
            session_id=f"demo-{n}",
            role="overflow" if n == sessions else "steady",
            told_window=2 * window if n == sessions else window,
        )
        for n in range(1, sessions + 1)
    }
    console: Any = None
    if live:
        from rich.console import Console

        console = Console(file=out)
    monitor = DemoMonitor(views, None if live else _PlainView(views, out).emit)
    # Live: a little latency and chunked streaming so the eye can follow; plain: as fast as it goes.
    provider = LocalProvider(
        context_window=window,
        latency=0.05 if live else 0.0,
        chunk_chars=12 if live else 200,
        chunk_delay=0.004 if live else 0.0,
    )
    config = Config().with_overrides(
        {"persistence.sessions_dir": str(root / "sessions"), "persistence.fsync": "never"}
    )
    try:
        _header(console, out, sessions, window, root)
        with (
            provider,
            _runtime(config, shards) as rt,
            rt.subscribe(list(views), callback=monitor),
            _Dashboard(rt, serve, console, out) as dashboard,
            _LiveView(monitor, console) if live else contextlib.nullcontext(),
        ):
            for sid, view in views.items():
                workspace = root / "workspaces" / sid
                _write_project(workspace)
                rt.start_session(
                    sid,
                    model=DEMO_MODEL,
                    tools="builtin",
                    workspace=workspace,
                    api_base=provider.url,
                    api_key="sk-local",
                    config=_session_config(view.told_window, window),
                )
            if shards is not None:
                _placement(console, out, rt, views)
            sent = dict.fromkeys(views, 0)
            workers = [
                threading.Thread(target=_drive, args=(rt, monitor, sid, sent), name=sid, daemon=True)
                for sid in views
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            monitor.wait_for_turns(sent, timeout=10)
            if hasattr(rt, "delegations"):  # sub-agents run on a plain Runtime
                _delegate(rt, root, provider.url, window, out, console)
            for sid, view in views.items():
                total = rt.context_stats(sid).total  # the same estimate the compaction trigger uses
                with monitor.lock:
                    view.context_tokens, view.state = total, "done"
            dashboard.wait()
        outcome = DemoOutcome(list(views.values()), time.monotonic() - started)
        _summary(console, out, outcome)
        return outcome
    finally:
        shutil.rmtree(root, ignore_errors=True)


class _Dashboard:
    """``demo --serve``: the dashboard (and API) of ``agentcell serve`` on the demo's runtime. It is up
    while the demo runs and, after it, until Ctrl-C: the demo's sessions stay hosted, so a newcomer can
    open them and send prompts from the page."""

    def __init__(self, rt: Any, port: int | None, console: Any, out: TextIO) -> None:
        self.server: Any = None
        self._say: Callable[[str], object] = (
            (lambda line: console.print(line, markup=False, highlight=False))
            if console is not None
            else (lambda line: print(line, file=out, flush=True))
        )
        if port is None:
            return
        import secrets

        from runtime.apps.server import ApiServer

        token = secrets.token_urlsafe(18)
        try:
            self.server = ApiServer(rt, token, port=port).start()
        except OSError as exc:
            print(f"agentcell demo: cannot serve the dashboard on port {port}: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
        self._say(f"dashboard: {self.server.url}/  (bearer token: {token})")

    def __enter__(self) -> _Dashboard:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()

    def wait(self) -> None:
        """With a dashboard: keep serving until Ctrl-C. Without: return at once."""
        if self.server is None:
            return
        self._say(f"the demo is done; its sessions stay up at {self.server.url}/ until Ctrl-C")
        with contextlib.suppress(KeyboardInterrupt):
            self.block()

    def block(self) -> None:
        while True:
            time.sleep(3600)


def _runtime(config: Any, shards: int | None) -> Any:
    """The demo's runtime: a local one, or with ``shards`` a cluster of that many shards on a local Ray
    cluster (``agentcell demo --shards N``, design §10). A cluster that cannot start ends the demo."""
    if shards is None:
        from runtime.host import Runtime

        return Runtime(config)
    import logging

    from runtime.cluster import ClusterError, ClusterRuntime

    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}  # Ray's own lines stay in its logs
    try:
        return ClusterRuntime(config, shards=shards, ray_init=quiet).start()
    except ClusterError as exc:
        print(f"agentcell demo: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _placement(console: Any, out: TextIO, rt: Any, views: dict[str, SessionView]) -> None:
    """Which shard each session was placed on (by its id)."""
    where = ", ".join(f"{sid} on {rt.shard_of(sid)}" for sid in views)
    line = f"  {len(rt.shards)} shards (Ray actors, one process each): {where}"
    if console is None:
        out.write(line + "\n\n")
        out.flush()
    else:
        console.print(line, highlight=False, markup=False)


DELEGATION = "Delegate to a sub-agent: read inventory.py and say which classes it defines."


def _delegate(rt: Any, root: Path, url: str, window: int, out: TextIO, console: Any) -> None:
    """One delegation (design §3.10): a lead session hands a reading task to a ``reader`` sub-agent, which
    works in its own session and context, and the lead gets its answer as one tool result."""
    workspace = root / "workspaces" / "demo-lead"
    _write_project(workspace)
    reader = {"description": "reads files and reports what they hold", "tools": "builtin"}
    lead = rt.start_session(
        "demo-lead",
        model=DEMO_MODEL,
        tools="builtin",
        workspace=workspace,
        api_base=url,
        api_key="sk-local",
        config=_session_config(window, window),
        agents={"reader": reader},
    )

    def say(line: str) -> None:
        if console is not None:
            console.print(line, markup=False, highlight=False)
        else:
            out.write(f"{line}\n")

    say(f"[demo-lead] > {DELEGATION}")
    result = rt.prompt(lead, DELEGATION).result(timeout=120)
    (child,) = rt.children(lead) or ("?",)
    steps = sum(m.role == "assistant" for m in rt.messages(child)) if child != "?" else 0
    say(f"[demo-lead] sub-agent {child}: its own session, {steps} model calls in its own context")
    say(f"[demo-lead] {' '.join(result.text.split())[:160] if result.status == 'ok' else result.error}")


def _session_config(told_window: int, real_window: int) -> dict[str, Any]:
    """Per-session overrides: the window the session believes in, a reserve that fits it, and a
    summarizer whose window is (a little under) the provider's real one, so its requests always fit.

    Tool-result archiving (design §5.9) is set out of reach: what the demo shows is compaction and overflow
    recovery, and the local policy decides its next step from the tool results it can see."""
    return {
        "models.context_windows": {DEMO_MODEL: told_window, SUMMARIZER_MODEL: int(real_window * 0.9)},
        "compaction.reserve_tokens": real_window // 6,
        "compaction.summarizer_model": SUMMARIZER_MODEL,
        "compaction.tool_call_cutoff": 1_000,
    }


def _write_project(workspace: Path) -> None:
    workspace.mkdir(parents=True)
    for name, text in PROJECT.items():
        (workspace / name).write_text(text, encoding="utf-8")


def _drive(rt: Any, monitor: DemoMonitor, sid: str, sent: dict[str, int]) -> None:
    """Send the task's prompts one after the other, each once the previous one has finished. After the
    task, keep asking to read files (a larger window takes longer to fill) until the session has shown
    what it is there for, up to :data:`MAX_PROMPTS`. Stop at the first turn that does not end well."""
    view = monitor.views[sid]
    rereads = itertools.cycle([text for text in TASK if text.startswith("Read ")] or TASK)
    for n in range(1, MAX_PROMPTS + 1):
        with monitor.lock:
            if n > len(TASK) and _shown(view):
                return
        text = TASK[n - 1] if n <= len(TASK) else next(rereads)
        monitor.sending(sid, text)
        sent[sid] = n
        try:
            result = rt.prompt(sid, text).result(timeout=120)
        except TimeoutError:
            result = None
        if result is None or result.status != "ok":
            with monitor.lock:
                ended = "did not end within 120 s" if result is None else f"ended {result.status}"
                view.failures.append(f"stopped: turn {n} {ended}")
            return


def _shown(view: SessionView) -> bool:
    """Whether the session has shown its part: a threshold compaction, or an overflow recovery."""
    return view.recoveries > 0 if view.role == "overflow" else view.threshold_compactions > 0


# -- output ----------------------------------------------------------------------------------------------


def _header(console: Any, out: TextIO, sessions: int, window: int, root: Path) -> None:
    lines = [
        f"agentcell demo: {sessions} concurrent sessions, local provider with a {window:,}-token window",
        f"  workspaces and sessions in {root} (removed at the end)",
        f"  demo-1..demo-{sessions - 1}: told the real window, they compact at the threshold",
        f"  demo-{sessions}: told {2 * window:,} tokens, so the provider overflows first and it recovers",
    ]
    if console is None:
        out.write("\n".join(lines) + "\n\n")
        out.flush()
    else:
        console.print("\n".join(lines), highlight=False, markup=False)


class _PlainView:
    """``[demo-1] line`` for every notable event, as it happens."""

    def __init__(self, views: dict[str, SessionView], out: TextIO) -> None:
        self.out = out
        self.width = max(len(sid) for sid in views)
        self._lock = threading.Lock()

    def emit(self, session_id: str, line: str) -> None:
        with self._lock:
            self.out.write(f"[{session_id:<{self.width}}] {line}\n")
            self.out.flush()


class _LiveView:
    """A rich live display: one panel per session with its latest events, its streaming reply and a
    context bar; redrawn ten times a second from the session views."""

    def __init__(self, monitor: DemoMonitor, console: Any) -> None:
        from rich.live import Live

        self.monitor = monitor
        self.console = console
        self.live = Live(console=console, refresh_per_second=10, get_renderable=self._render)

    def __enter__(self) -> _LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def _render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.text import Text

        views = list(self.monitor.views.values())
        rows = max(2, (self.console.size.height - 6) // len(views) - 2)
        panels = []
        with self.monitor.lock:
            for view in views:
                lines = [_styled(line) for line in list(view.lines)[-rows:]]
                if view.state == "answering" and view.reply:
                    lines = [
                        *lines[1 - rows :],
                        Text("… " + " ".join(view.reply.split())[-200:], style="italic"),
                    ]
                body = Text("\n", no_wrap=True, overflow="ellipsis").join(lines)
                title = Text.assemble(
                    (view.session_id, "bold"),
                    f" ({view.role}) · {view.state} · turns {view.turns} · compactions {view.compactions}",
                )
                subtitle = Text.assemble("context ", _bar(view.context_tokens, view.told_window))
                panels.append(
                    Panel(body, title=title, subtitle=subtitle, title_align="left", height=rows + 2)
                )
        return Group(*panels)


def _styled(line: str) -> Any:
    from rich.text import Text

    style = ""
    if line.startswith(("COMPACT", "OVERFLOW")):
        style = "bold yellow"
    elif line.startswith(("ERROR", "compaction failed")):
        style = "bold red"
    elif line.startswith(">"):
        style = "bold cyan"
    elif line.startswith("tool"):
        style = "green"
    elif line.startswith(("usage", "context")):
        style = "dim"
    return Text(line, style=style, no_wrap=True, overflow="ellipsis")


def _bar(used: int, window: int, width: int = 24) -> Any:
    """A coloured context bar: green, yellow from 60%, red from 85%."""
    from rich.text import Text

    frac = 0.0 if window <= 0 else min(1.0, used / window)
    filled = round(frac * width)
    colour = "green" if frac < 0.6 else "yellow" if frac < 0.85 else "red"
    return Text.assemble(
        ("█" * filled, colour), ("░" * (width - filled), "dim"), f" {frac:>4.0%} {used:,}/{window:,}"
    )


_COLUMNS = ("session", "role", "turns", "tools", "in", "out", "compactions", "context")


def _compactions(view: SessionView) -> str:
    parts = [
        f"{count} {kind}"
        for count, kind in (
            (view.threshold_compactions, "threshold"),
            (view.overflow_compactions, "overflow"),
            (view.other_compactions, "other"),
        )
        if count
    ]
    return ", ".join(parts) or "none"


def _rows(outcome: DemoOutcome) -> list[tuple[str, ...]]:
    return [
        (
            v.session_id,
            v.role,
            str(v.turns),
            str(v.tool_calls),
            f"{v.input_tokens:,}",
            f"{v.output_tokens:,}",
            _compactions(v),
        )
        for v in outcome.views
    ]


def _verdict(outcome: DemoOutcome) -> str:
    return (
        f"{plural(outcome.threshold_compactions, 'threshold compaction')}, "
        f"{plural(outcome.overflow_recoveries, 'overflow recovery', 'overflow recoveries')}, "
        f"{outcome.seconds:.1f} s"
    )


def _summary(console: Any, out: TextIO, outcome: DemoOutcome) -> None:
    """The closing table: one row per session."""
    if console is not None:
        from rich import box
        from rich.table import Table

        table = Table(
            title="agentcell demo",
            caption=_verdict(outcome),
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            collapse_padding=True,
        )
        for name in _COLUMNS:
            numeric = name in ("turns", "tools", "in", "out")
            table.add_column(name, justify="right" if numeric else "left", no_wrap=True)
        for view, row in zip(outcome.views, _rows(outcome), strict=True):
            table.add_row(*row, _bar(view.context_tokens, view.told_window, 10))
        console.print(table)
        return
    from runtime.apps.chat import context_bar

    rows = [
        (*row, context_bar(v.context_tokens, v.told_window, 20))
        for v, row in zip(outcome.views, _rows(outcome), strict=True)
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_COLUMNS)]
    out.write("\n" + "  ".join(h.ljust(w) for h, w in zip(_COLUMNS, widths, strict=True)).rstrip() + "\n")
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    out.write(_verdict(outcome) + "\n")
    out.flush()
