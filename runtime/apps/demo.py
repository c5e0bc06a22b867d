"""``agentcell demo``: several concurrent agent sessions against the built-in local provider (design §7.1).

Offline and without an API key. The demo starts :class:`~runtime.provider.LocalProvider`, whose replies are
scripted, not a model's (its built-in policy reads and edits the files a prompt mentions, and answers
summarization requests), copies a small
Python project into one temporary workspace per session, and runs the same coding task in every session
at once. Each session is told a small context window, so the context management is visible:

- the *steady* sessions are told the provider's real window: they compact automatically when the
  estimate reaches the threshold (``compaction_end{trigger: threshold}``);
- the *overflow* session (the last one) is told a window twice the real one, so it never reaches its
  threshold first: the provider refuses a request with its overflow error, the session compacts as an
  emergency (``compaction_start{trigger: overflow}``) and the retried request succeeds.

The event stream is shown live (rich), or as plain lines with ``--plain`` or when the output is not a
terminal, and the demo ends with a table per session (``demo-lead``, which delegates a task to a sub-agent,
too): turns, tokens, compactions and a context bar, then the throughput. It exits non-zero if it did not see
at least one threshold compaction and one overflow recovery. The modules beside it: the project and the
task (``demo_project``), the sessions as the events show them (``demo_monitor``), the output
(``demo_output``).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from runtime.apps import LOCAL_API_KEY
from runtime.apps.demo_monitor import DemoMonitor, DemoOutcome, SessionView, describe
from runtime.apps.demo_output import LiveView, PlainView, header, summary, throughput, verdict
from runtime.apps.demo_project import DELEGATION, PROJECT, TASK, write_project
from runtime.wording import plural

DEMO_MODEL = "openai/agentcell-demo"
"""The sessions' model: no script has this name, so the local provider's built-in policy answers."""
SUMMARIZER_MODEL = "openai/agentcell-summarizer"
MIN_SESSIONS = 2
MIN_WINDOW = 4_000
MAX_WINDOW = 16_000  # larger windows take longer to fill than a demo should
MAX_PROMPTS = 40
"""Prompts per session at most: the task, then more file reads until the session has shown its part."""
LEAD = "demo-lead"
"""The session that delegates a task to a sub-agent, after the others' work."""

__all__ = [
    "DELEGATION",
    "DEMO_MODEL",
    "PROJECT",
    "TASK",
    "DemoMonitor",
    "DemoOutcome",
    "SessionView",
    "describe",
    "run_demo",
    "throughput",
    "verdict",
    "write_project",
]

# -- running the demo -------------------------------------------------------------------------------------


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
    ``agentcell serve`` is up from the start and stays up after the demo, until Ctrl-C or SIGTERM."""
    out = out if out is not None else sys.stdout
    if sessions < MIN_SESSIONS:
        print(f"agentcell demo: --sessions must be at least {MIN_SESSIONS}", file=sys.stderr)
        return 2
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        print(f"agentcell demo: --window must be {MIN_WINDOW:,} to {MAX_WINDOW:,} tokens", file=sys.stderr)
        return 2
    live = not plain and out.isatty()
    try:
        with _sigterm_interrupts():
            outcome = _run(sessions, window, out, live, serve, shards=shards)
    except KeyboardInterrupt:
        print("agentcell demo: interrupted", file=sys.stderr)
        return 130
    problems = outcome.problems
    for problem in problems:
        print(f"agentcell demo: {problem}", file=sys.stderr)
    return 1 if problems else 0


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (``kill``, a container stopping) ends the demo as Ctrl-C does: its temporary folder is
    removed and, once the demo is done (``--serve`` keeps serving), its summary is printed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    driven = list(views)
    if shards is None:  # sub-agents run on a plain Runtime
        views[LEAD] = SessionView(session_id=LEAD, role="lead", told_window=window)
    console: Any = None
    if live:
        from rich.console import Console

        console = Console(file=out)
    monitor = DemoMonitor(views, None if live else PlainView(views, out).emit)
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
        header(console, out, views, window, root)
        with (
            provider,
            _runtime(config, shards) as rt,
            rt.subscribe(list(views), callback=monitor),
            _Dashboard(rt, serve, console, out) as dashboard,
        ):
            with LiveView(monitor, console) if live else contextlib.nullcontext():
                for sid in driven:
                    workspace = root / "workspaces" / sid
                    write_project(workspace)
                    rt.start_session(
                        sid,
                        model=DEMO_MODEL,
                        tools="builtin",
                        workspace=workspace,
                        api_base=provider.url,
                        api_key=LOCAL_API_KEY,
                        config=_session_config(views[sid].told_window, window),
                    )
                if shards is not None:
                    _placement(console, out, rt, views)
                sent = dict.fromkeys(driven, 0)
                workers = [
                    threading.Thread(target=_drive, args=(rt, monitor, sid, sent), name=sid, daemon=True)
                    for sid in driven
                ]
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
                monitor.wait_for_turns(sent, timeout=10)
                if LEAD in views:
                    _delegate(rt, root, provider.url, window, out, console, monitor)
                for sid, view in views.items():
                    total = rt.context_stats(sid).total  # the same estimate the compaction trigger uses
                    with monitor.lock:
                        view.context_tokens, view.state = total, "done"
            outcome = DemoOutcome(list(views.values()), time.monotonic() - started)
            summary(console, out, outcome)  # before serving on: an interrupted wait loses nothing
            dashboard.wait()
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
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C, or SIGTERM (see _sigterm_interrupts)
            self._say(f"the demo is done; its sessions stay up at {self.server.url}/ until Ctrl-C")
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


def _delegate(
    rt: Any, root: Path, url: str, window: int, out: TextIO, console: Any, monitor: DemoMonitor
) -> None:
    """One delegation (design §3.10): a lead session hands a reading task to a ``reader`` sub-agent, which
    works in its own session and context, and the lead gets its answer as one tool result."""
    workspace = root / "workspaces" / LEAD
    write_project(workspace)
    reader = {"description": "reads files and reports what they hold", "tools": "builtin"}
    lead = rt.start_session(
        LEAD,
        model=DEMO_MODEL,
        tools="builtin",
        workspace=workspace,
        api_base=url,
        api_key=LOCAL_API_KEY,
        config=_session_config(window, window),
        agents={"reader": reader},
    )

    def say(line: str) -> None:
        if console is not None:
            console.print(line, markup=False, highlight=False)
        else:
            out.write(f"{line}\n")

    monitor.sending(lead, DELEGATION)
    result = _prompt(rt, monitor, lead, DELEGATION, 1)
    monitor.wait_for_turns({lead: 1}, timeout=10)  # its reply's line, from the subscription's thread
    (child,) = rt.children(lead) or ("?",)
    steps = sum(m.role == "assistant" for m in rt.messages(child)) if child != "?" else 0
    if result is not None and result.status == "ok":  # (its reply is among its events' lines)
        say(f"[{LEAD}] sub-agent {child}: its own session, {plural(steps, 'model call')} in its own context")


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


def _drive(rt: Any, monitor: DemoMonitor, sid: str, sent: dict[str, int]) -> None:
    """Send the task's prompts one after the other, each once the previous one has finished. After the
    task, keep asking to read files (a larger window takes longer to fill) until the session has shown
    what it is there for, up to :data:`MAX_PROMPTS`. Stop at the first turn that does not end well."""
    view = monitor.views[sid]
    rereads = itertools.cycle([text for text in TASK if text.startswith("Read ")] or TASK)
    for n in range(1, MAX_PROMPTS + 1):
        if n > len(TASK):  # decided on the last turn's events, which arrive after its handle resolved
            monitor.wait_for_turns({sid: n - 1}, timeout=10)
            with monitor.lock:
                if _shown(view):
                    return
        text = TASK[n - 1] if n <= len(TASK) else next(rereads)
        monitor.sending(sid, text)
        sent[sid] = n
        result = _prompt(rt, monitor, sid, text, n)
        if result is None or result.status != "ok":
            return


def _prompt(rt: Any, monitor: DemoMonitor, sid: str, text: str, n: int) -> Any:
    """Prompt ``text`` as turn ``n`` and wait for its result (None after 120 s). A turn that does not end
    well is one failure: its error event's, or else one saying how it ended."""
    view = monitor.views[sid]
    with monitor.lock:
        failures, turns = len(view.failures), view.turns
    try:
        result = rt.prompt(sid, text).result(timeout=120)
    except TimeoutError:
        result = None
    if result is None or result.status != "ok":
        monitor.wait_for_turns({sid: turns + 1}, timeout=5)  # its error event, if it has one
        with monitor.lock:
            if result is None:
                view.failures.append(f"stopped: turn {n} did not end within 120 s")
            elif len(view.failures) == failures:
                view.failures.append(f"stopped: turn {n} ended {result.status}")
    return result


def _shown(view: SessionView) -> bool:
    """Whether the session has shown its part: a threshold compaction, or an overflow recovery."""
    return view.recoveries > 0 if view.role == "overflow" else view.threshold_compactions > 0
