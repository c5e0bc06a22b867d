"""What ``agentcell demo`` prints: its header, the event lines (plain) or a live panel per session (rich),
and the closing table with the verdict and the throughput."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, TextIO

from runtime.apps.demo_monitor import DemoMonitor, DemoOutcome, SessionView
from runtime.wording import plural


def header(console: Any, out: TextIO, views: dict[str, SessionView], window: int, root: Path) -> None:
    """What the demo is about to show, and where its files are."""
    steady = [sid for sid, v in views.items() if v.role == "steady"]
    names = (
        steady[0]
        if len(steady) == 1
        else " and ".join(steady)
        if len(steady) == 2
        else (f"{steady[0]} to {steady[-1]}")
    )
    lines = [
        f"agentcell demo: {plural(len(steady) + 1, 'concurrent session')} against the built-in local provider "
        f"with a {window:,}-token window",
        "  its replies are scripted (a policy reads and edits the files a prompt names), not a model's: offline",
        f"  workspaces and sessions in {root} (removed at the end)",
        f"  {names}: told the real window, {'it compacts' if len(steady) == 1 else 'they compact'} at the threshold",
    ]
    lines += [
        f"  {sid}: told {v.told_window:,} tokens, so the provider overflows first and it recovers"
        for sid, v in views.items()
        if v.role == "overflow"
    ]
    lines += [
        f"  {sid}: afterwards, hands a task to a sub-agent" for sid, v in views.items() if v.role == "lead"
    ]
    if console is None:
        out.write("\n".join(lines) + "\n\n")
        out.flush()
    else:
        console.print("\n".join(lines), highlight=False, markup=False)


class PlainView:
    """``[demo-1] line`` for every notable event, as it happens."""

    def __init__(self, views: dict[str, SessionView], out: TextIO) -> None:
        self.out = out
        self.width = max(len(sid) for sid, view in views.items() if view.role != "lead")
        self._lock = threading.Lock()

    def emit(self, session_id: str, line: str) -> None:
        with self._lock:
            self.out.write(f"[{session_id:<{self.width}}] {line}\n")
            self.out.flush()


class LiveView:
    """A rich live display: one panel per session with its latest events, its streaming reply and a
    context bar; redrawn ten times a second from the session views."""

    def __init__(self, monitor: DemoMonitor, console: Any) -> None:
        from rich.live import Live

        self.monitor = monitor
        self.console = console
        self.live = Live(console=console, refresh_per_second=10, get_renderable=self._render)

    def __enter__(self) -> LiveView:
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


def verdict(outcome: DemoOutcome) -> str:
    return (
        f"{plural(outcome.threshold_compactions, 'threshold compaction')}, "
        f"{plural(outcome.overflow_recoveries, 'overflow recovery', 'overflow recoveries')}, "
        f"{outcome.seconds:.1f} s"
    )


def throughput(outcome: DemoOutcome) -> str:
    """``3 sessions, 31 turns in 12.7 s: 2.4 turns/s``."""
    turns = sum(v.turns for v in outcome.views)
    rate = turns / outcome.seconds if outcome.seconds > 0 else 0.0
    return (
        f"{plural(len(outcome.views), 'session')}, {plural(turns, 'turn')} in {outcome.seconds:.1f} s: "
        f"{rate:.1f} turns/s"
    )


def summary(console: Any, out: TextIO, outcome: DemoOutcome) -> None:
    """The closing table, one row per session, and the throughput."""
    if console is not None:
        from rich import box
        from rich.table import Table

        table = Table(
            title="agentcell demo",
            caption=verdict(outcome),
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
        console.print(throughput(outcome), highlight=False, markup=False)
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
    out.write(verdict(outcome) + "\n" + throughput(outcome) + "\n")
    out.flush()
