"""``agentcell chat``: an interactive session with any litellm model, or the built-in local provider
(design §7.1).

Replies stream as they arrive, with the tool calls the agent makes in the current directory. Ctrl-C
during a turn aborts the turn (the session stays usable); at the prompt it only clears the line. Ctrl-D
or ``/quit`` leaves. Commands: ``/compact [focus]``, ``/context``, ``/sessions``, ``/branch [n]``,
``/help``, ``/quit``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from runtime import events as ev
from runtime.apps import LOCAL_API_KEY, LOCAL_MODEL
from runtime.wording import plural

HELP = """commands:
  /compact [focus]  compact the conversation now, optionally telling the summary what to focus on
  /context          how full the context window is: a bar and the breakdown; the provider keys' pools
  /sessions         the stored sessions (* marks this one)
  /branch [n]       list your messages; /branch n continues the conversation from just before message n
  /help             this text
  /quit             leave (Ctrl-D works too); Ctrl-C aborts a running turn
while a turn runs, a line you type steers it (applied after the running tools); /queue TEXT runs next"""


_QUIET = (ev.RequestStart, ev.StatusUpdate, ev.MessageAppended, ev.UsageUpdate, ev.Calibration)
"""Events that print nothing: the waiting indicator stays up through them."""


def context_bar(used: int, window: int, width: int = 40) -> str:
    """``[#########...............] 12,345 / 128,000 tokens (10%)``."""
    frac = 0.0 if window <= 0 else min(1.0, max(0.0, used / window))
    filled = round(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {used:,} / {window:,} tokens ({frac:.0%})"


def format_capacity(pools: Any) -> str:
    """The provider keys' capacity pools (design §3.11): limits in force, calls running and waiting."""
    lines = ["provider keys (capacity pools):"]
    for pool in pools:
        limits = [
            f"{label} {value:,.0f}"
            for label, value in (
                ("rpm", pool.rpm),
                ("tpm", pool.tpm),
                ("input tpm", pool.input_tpm),
                ("output tpm", pool.output_tpm),
                ("at once", pool.max_concurrent),
            )
            if value is not None
        ]
        known = (
            ", ".join(limits) + (" (learned)" if pool.learned else " (configured)")
            if limits
            else "no limit known"
        )
        paused = f", paused {pool.paused_for:.1f}s" if pool.paused_for else ""
        lines.append(
            f"  {pool.name}: {known}; {pool.running} running, {pool.queued} queued{paused}; "
            f"{pool.admitted:,} sent, {pool.refused:,} refused (429)"
        )
    return "\n".join(lines)


def format_stats(stats: Any) -> str:
    """The design §4.6 breakdown of a :class:`~runtime.context.estimate.ContextStats`: a bar, then one
    aligned line per figure saying whether it is actual, estimated, back-calculated or configured."""
    sources: dict[str, str] = stats.sources

    def line(label: str, value: int, key: str | None = None) -> str:
        source = f"  ({sources[key].replace('_', '-')})" if key is not None and key in sources else ""
        return f"  {label:<20}{value:>10,}{source}"

    lines = [
        context_bar(stats.total, stats.window),
        line("window", stats.window),
        line("in context", stats.total, "total"),
        line("  system prompt", stats.system_prompt, "system_prompt"),
        line("  tools", stats.tools, "tools"),
        line(f"  messages ({stats.message_count})", stats.messages, "messages"),
        line("reserve for output", stats.reserve, "reserve"),
        line("free", stats.free),
    ]
    if stats.compaction_threshold is not None:
        lines.append(line("compacts at", stats.compaction_threshold, "compaction_threshold"))
    if stats.last_input_tokens is not None:
        lines.append(line("last prompt", stats.last_input_tokens, "last_input_tokens"))
    if stats.last_estimate_error is not None:
        lines.append(f"  {'last estimate error':<20}{stats.last_estimate_error:>+10.1%}")
    if stats.will_compact:
        lines.append("  the next turn compacts first")
    if stats.messages_floored:
        lines.append("  warning: the estimates of the other parts exceed the total; messages shown as 0")
    return "\n".join(lines)


def format_usage(usage: Any) -> str:
    """The session's usage (design §4.1, §4.7): its prompt tokens and the share read from the cache, and
    its cost by kind of token with what the cache saved, where the model's prices are known."""
    share = usage.cache_read_tokens / usage.input_tokens if usage.input_tokens else 0.0
    lines = [
        f"  {'input':<20}{usage.input_tokens:>10,}  ({share:.0%} read from the cache: "
        f"{usage.cache_read_tokens:,} read, {usage.cache_write_tokens:,} written)",
        f"  {'output':<20}{usage.output_tokens:>10,}",
    ]
    costs = usage.costs
    if costs is not None:
        lines.append(
            f"  {'cost':<20}{'$' + format(costs.total, ',.4f'):>10}  (input ${costs.input:,.4f}, cache read "
            f"${costs.cache_read:,.4f}, cache write ${costs.cache_write:,.4f}, output ${costs.output:,.4f}; "
            f"${costs.saved:,.4f} saved by the cache)"
        )
    elif usage.cost is not None:
        lines.append(f"  {'cost':<20}{'$' + format(usage.cost, ',.4f'):>10}")
    return "\n".join(lines)


def recap(messages: list[Any], chars: int = 300) -> str:
    """The last exchange of a resumed conversation: the last prompt and the reply to it, clipped."""
    prompts = [i for i, m in enumerate(messages) if m.role == "user" and m.kind is None]
    if not prompts:
        return ""
    last = prompts[-1]
    replies = [m.text for m in messages[last + 1 :] if m.role == "assistant" and m.text.strip()]

    def clip(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= chars else text[: chars - 1] + "…"

    lines = ["last exchange:", f"  you: {clip(messages[last].text)}"]
    lines.append(f"  assistant: {clip(replies[-1])}" if replies else "  (no reply)")
    return "\n".join(lines) + "\n"


class ChatPrinter:
    """Prints one session's events as a chat transcript. A bus callback (it runs on the subscription's
    thread): the REPL waits with :meth:`catch_up` until it has printed a turn's last event before it
    shows the next prompt."""

    def __init__(self, out: TextIO, *, color: bool = False) -> None:
        self.out = out
        self.color = color
        self._cond = threading.Condition()
        self._seen = 0
        self._open: str | None = None  # the line being streamed: "text", "reasoning", or None
        self._waiting: float | None = None  # when the model was asked (None: not waiting for it)
        self._indicator = False  # the waiting indicator is on the screen (its line)
        self._frames = itertools.cycle("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
        self.compactions_reported = 0
        """``compaction_failed`` and ``compaction_skipped`` events printed so far (the REPL does not
        repeat their reason)."""

    def __call__(self, event: ev.Event) -> None:
        with self._cond:
            if not isinstance(event, _QUIET):
                self._stop_waiting()
            self._print(event)
            self.out.flush()
            self._seen = max(self._seen, event.seq)
            self._cond.notify_all()

    def catch_up(self, seq: int, timeout: float = 5.0) -> bool:
        """Wait until the event numbered ``seq`` (and every one before it) has been printed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._seen >= seq, timeout)

    def tick(self) -> None:
        """While the model has not answered yet: redraw the indicator (a spinner and the seconds waited), on a
        terminal. Called by the REPL a few times a second during a turn."""
        with self._cond:
            if self._waiting is None or not self.color:
                return
            waited = time.monotonic() - self._waiting
            self.out.write(
                f"\r\x1b[K{self._dim(f'{next(self._frames)} waiting for the model… {waited:.0f}s')}"
            )
            self.out.flush()
            self._indicator = True

    def _stop_waiting(self) -> None:
        self._waiting = None
        if self._indicator:
            self.out.write("\r\x1b[K")  # the indicator's line, blank again
            self._indicator = False

    def skip_to(self, seq: int) -> None:
        """Events up to ``seq`` were published before the subscription: do not wait for them."""
        with self._cond:
            self._seen = max(self._seen, seq)

    def _dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.color else text

    def dimmed(self, text: str) -> str:
        """``text`` dimmed on a terminal, line by line."""
        return "".join(self._dim(line) + "\n" for line in text.splitlines())

    def _note(self, text: str) -> None:
        self._newline()
        self.out.write(self._dim(text) + "\n")

    def _print(self, event: ev.Event) -> None:
        match event:
            case ev.RequestStart():
                self._newline()
                self._waiting = time.monotonic()
            case ev.TextDelta(delta=delta):
                if self._open == "reasoning":  # the answer starts on a line of its own
                    self._newline()
                self.out.write(delta)
                self._open = "text"
            case ev.ReasoningDelta(delta=delta) if self.color:  # on a terminal: dimmed, on its own lines
                if self._open != "reasoning":
                    self._newline()
                    self.out.write(self._dim("thinking: "))
                self.out.write(self._dim(delta))
                self._open = "reasoning"
            case ev.ToolExecutionStart(name=name, arguments=args):
                self._note(f"  -> {name}({args if len(args) <= 120 else args[:119] + '…'})")
            case ev.ToolExecutionEnd(name=name, is_error=is_error, duration=duration):
                self._note(f"  <- {name} {'failed' if is_error else 'ok'} in {duration:.2f}s")
            case ev.CompactionStart(trigger=trigger, tokens_before=tokens):
                self._note(f"[compacting ({trigger}) at {tokens:,} tokens...]")
            case ev.CompactionEnd(tokens_before=before, tokens_after=after, messages_after=count):
                self._note(
                    f"[compacted: {before:,} -> {after:,} tokens, {plural(count, 'message')} in context]"
                )
            case ev.CompactionFailed(error=error):
                self._note(f"[compaction failed: {error}]")
                self.compactions_reported += 1
            case ev.CompactionSkipped(message=message):
                self._note(f"[{message}]")
                self.compactions_reported += 1
            case ev.ToolResultsArchived(archived=count):
                self._note(f"[archived {count} old tool results]")
            case ev.WindowLearned(old=old, new=new, source=source):
                self._note(f"[the model's window is {new:,} tokens (not {old:,}): the {source} said so]")
            case ev.RequestQueued(pool=pool, position=position, estimated_wait=wait):
                about = f", about {wait:.1f}s" if wait else ""
                self._note(f"[waiting for capacity of {pool}: {position} in the queue{about}]")
            case ev.RequestAdmitted(waited=waited):
                self._note(f"[capacity after {waited:.1f}s]")
            case ev.StreamReset(attempt=attempt):  # what attempt streamed is void: the reply starts again
                self._note(f"[attempt {attempt} broke off: the text above is void, the reply starts again]")
            case ev.ProviderRetry(attempt=attempt, max_attempts=most, delay=delay, error=error):
                self._note(f"[retry {attempt}/{most} in {delay:.1f}s: {error}]")
            case ev.ErrorOccurred(code="aborted"):
                pass  # agent_abort says it
            case ev.ErrorOccurred(message=message):
                self._newline()
                self.out.write(f"error: {message}\n")
            case ev.McpServerStarted(server=server, tools=tools, restarts=restarts):
                again = f" (restart {restarts})" if restarts else ""
                self._note(f"[MCP server {server} ready{again}: {len(tools)} tools]")
            case ev.McpServerFailed(message=message):
                self._note(f"[MCP: {message}]")
            case ev.AgentAbort(repaired_calls=repaired):
                extra = f" ({repaired} unfinished tool calls closed)" if repaired else ""
                self._note(f"[aborted{extra}]")
            case ev.AgentEnd():
                self._newline()
            case _:
                pass

    def _newline(self) -> None:
        if self._open is not None:
            self.out.write("\n")
            self._open = None


def run_chat(
    *,
    model: str | None,
    session_id: str | None = None,
    api_base: str | None = None,
    config_path: str | None = None,
    sessions_dir: str | None = None,
    local: bool = False,
    latency: float = 0.0,
    mcp: list[str] | None = None,
    input_fn: Callable[[str], str] = input,
    out: TextIO | None = None,
) -> int:
    """Run the REPL until ``/quit`` or end of input; returns the exit status.

    ``local`` (or no ``model`` and no ``api_base``) starts the built-in local provider and talks to it
    (``latency`` seconds before each of its replies). The API key comes from ``AGENTCELL_API_KEY`` or
    the provider's usual environment variable (litellm reads it); it is never stored. ``mcp``: MCP servers
    the session takes tools from, as ``[NAME=]COMMAND ARGS`` or ``[NAME=]URL`` (design §3.9).
    """
    out = out if out is not None else sys.stdout
    tty = out.isatty()
    out.write("starting…" if tty else "starting…\n")  # the runtime and the provider take seconds to start
    out.flush()
    from runtime.config import ConfigError, load_config
    from runtime.host import Runtime, SessionNotFound
    from runtime.ids import InvalidSessionId
    from runtime.tools.mcp import parse_servers

    try:
        cfg = load_config(config_path)
        if sessions_dir is not None:
            cfg = cfg.with_overrides({"persistence.sessions_dir": sessions_dir})
        servers = parse_servers(list(mcp or ()))
    except ConfigError as exc:
        print(f"agentcell chat: {exc}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        with _ctrl_c_for_this_thread_only():
            provider = None
            if local or (model is None and api_base is None):
                from runtime.provider import LocalProvider

                provider = LocalProvider(latency=latency, chunk_delay=0.01 if out.isatty() else 0.0).start()
                stack.callback(_stop_quietly, provider)
                api_base = provider.url
                model = model or LOCAL_MODEL
            model = model or cfg.agent.model
            api_key = os.environ.get("AGENTCELL_API_KEY") or (LOCAL_API_KEY if provider is not None else None)
            rt = stack.enter_context(Runtime(cfg))
            try:
                sid, resumed = _open_session(rt, session_id, model, api_base, api_key, servers)
            except (InvalidSessionId, SessionNotFound, ValueError, OSError) as exc:
                print(f"agentcell chat: {exc}", file=sys.stderr)
                return 2
            printer = ChatPrinter(out, color=out.isatty())
            stack.enter_context(rt.subscribe(sid, callback=printer))
            printer.skip_to(rt.bus.last_seq(sid))
        verb = "resumed" if resumed else "new"
        erase = "\r\x1b[K" if tty else ""
        out.write(f"{erase}{verb} session {sid} · model {_session_model(rt, sid)} · /help for commands\n")
        if resumed:
            out.write(printer.dimmed(recap(rt.messages(sid))))
        _Repl(rt, sid, printer, input_fn, out).run()
    return 0


@contextlib.contextmanager
def _ctrl_c_for_this_thread_only() -> Iterator[None]:
    """Block SIGINT while the runtime and the provider start their threads, so that they inherit the
    block: Ctrl-C then always reaches this (the main) thread. A SIGINT delivered to another thread
    would leave the prompt waiting in ``input()`` until the next key."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _typed_line() -> str | None:
    """A line typed on standard input, if one is ready (never waits)."""
    import select

    try:
        ready, _, _ = select.select([sys.stdin], [], [], 0)
    except (OSError, ValueError):  # no selectable stdin (a closed stream, Windows)
        return None
    return sys.stdin.readline() if ready else None


def _stop_quietly(provider: Any) -> None:
    """Stop the local provider. A reply still waiting out ``--latency`` for an aborted turn is cancelled
    at shutdown, which uvicorn would log as an application error: expected here, so not shown."""
    import logging

    logger = logging.getLogger("uvicorn.error")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        provider.stop()
    finally:
        logger.setLevel(level)


def _open_session(
    rt: Any,
    session_id: str | None,
    model: str,
    api_base: str | None,
    api_key: str | None,
    mcp_servers: dict[str, Any] | None = None,
) -> tuple[str, bool]:
    """Resume ``session_id`` if it is stored, else start it (or a new session) in the current directory."""
    if session_id is not None and rt.services.directory.exists(session_id):
        sid = rt.resume_session(
            session_id, tools="builtin", api_key=api_key, api_base=api_base, mcp_servers=mcp_servers or None
        )
        return str(sid), True
    sid = rt.start_session(
        session_id,
        model=model,
        tools="builtin",
        workspace=os.getcwd(),
        api_base=api_base,
        api_key=api_key,
        mcp_servers=mcp_servers or None,
    )
    return str(sid), False


def _session_model(rt: Any, sid: str) -> str:
    return str(rt._hosted(sid).model)


class _Repl:
    """The read-eval-print loop of one session."""

    def __init__(
        self,
        rt: Any,
        sid: str,
        printer: ChatPrinter,
        input_fn: Callable[[str], str],
        out: TextIO,
        typed: Callable[[], str | None] | None = None,
    ) -> None:
        self.rt = rt
        self.sid = sid
        self.printer = printer
        self.input = input_fn
        self.out = out
        self.pending: list[Any] = []  # handles of the running prompt and those queued behind it
        # a line typed while a turn runs (None: none yet); reads the terminal when the REPL reads it
        self.typed = typed if typed is not None else (_typed_line if input_fn is input else lambda: None)

    def run(self) -> None:
        if self.input is input and sys.stdin.isatty():
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:  # pragma: no cover - not every platform has it
                pass
        while True:
            try:
                line = self.input("> ").strip()
            except EOFError:
                self.out.write("\n")
                return
            except KeyboardInterrupt:  # at the prompt: a fresh line, like a shell
                self.out.write("\n(Ctrl-C aborts a running turn; /quit or Ctrl-D leaves)\n")
                continue
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not self.command(line):
                        return
                else:
                    self.turn(line)
                self.printer.catch_up(self.rt.bus.last_seq(self.sid))
            except KeyboardInterrupt:  # between the steps that handle it themselves
                self.out.write("\n(interrupted)\n")

    def turn(self, text: str) -> None:
        """Send one prompt and wait for its run to end, and for the runs of the prompts queued meanwhile
        (``/queue``), so the next prompt is drawn after the last of them; Ctrl-C aborts the running one."""
        self.pending.append(self.rt.prompt(self.sid, text))
        while self.pending:
            handle = self.pending[0]
            try:
                result = handle.result(timeout=0.2)
            except TimeoutError:
                self.printer.tick()
                self.while_running()
                continue
            except KeyboardInterrupt:
                try:
                    self.rt.abort(self.sid).result(timeout=10)
                except (KeyboardInterrupt, TimeoutError):
                    pass
                continue
            self.pending.pop(0)
            if result.status == "ok" and not result.text and result.message is not None:
                self.printer.catch_up(self.rt.bus.last_seq(self.sid))
                self.out.write("(no text in the reply)\n")

    def while_running(self) -> None:
        """A line typed during a turn steers it; ``/queue TEXT`` queues TEXT as the next turn."""
        line = (self.typed() or "").strip()
        if not line:
            return
        if line.startswith("/queue "):
            self.pending.append(self.rt.prompt(self.sid, line.removeprefix("/queue ").strip()))
            self.out.write("(queued: it runs when this turn ends)\n")
            return
        self.rt.prompt(self.sid, line, steer=True)
        self.out.write("(steering: applied after the running step)\n")

    def command(self, line: str) -> bool:
        """Run a slash command; returns False when the REPL should end."""
        from runtime.host import SessionNotFound

        name, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if name in ("/quit", "/exit"):
                return False
            if name == "/help":
                self.out.write(HELP + "\n")
            elif name == "/compact":
                self.compact(arg or None)
            elif name == "/context":
                self.out.write(format_stats(self.rt.context_stats(self.sid)) + "\n")
                self.out.write(format_usage(self.rt.usage(self.sid)) + "\n")
                pools = self.rt.capacity()
                if pools:
                    self.out.write(format_capacity(pools) + "\n")
            elif name == "/sessions":
                self.sessions()
            elif name == "/branch":
                self.branch(arg)
            else:
                self.out.write(f"unknown command {name}; /help lists them\n")
        except KeyboardInterrupt:
            self.out.write("\n(interrupted)\n")
        except (ValueError, SessionNotFound, TimeoutError, OSError) as exc:
            self.out.write(f"error: {exc}\n")
        return True

    def compact(self, focus: str | None) -> None:
        reported = self.printer.compactions_reported
        result = self.rt.compact(self.sid, instructions=focus).result(timeout=600)
        self.printer.catch_up(self.rt.bus.last_seq(self.sid))
        if not result.compacted and self.printer.compactions_reported == reported:  # else its event said why
            self.out.write(f"not compacted: {result.reason}\n")

    def sessions(self) -> None:
        import time

        infos = self.rt.list_sessions()
        for info in infos:
            mark = "*" if info.id == self.sid else " "
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated_at))
            self.out.write(
                f"{mark} {info.id:<28} {when}  {plural(info.messages, 'message'):>14}  {info.model or '?'}\n"
            )

    def branch(self, arg: str) -> None:
        history = self.rt.messages(self.sid)
        prompts = [(i, m) for i, m in enumerate(history) if m.role == "user" and m.kind is None]
        if not arg:
            if not prompts:
                self.out.write("no messages yet\n")
                return
            for n, (_, message) in enumerate(prompts, 1):
                text = " ".join(message.text.split())
                self.out.write(f"  {n}. {text if len(text) <= 70 else text[:69] + '…'}\n")
            self.out.write("/branch n continues from just before message n (the old branch is kept)\n")
            return
        if not arg.isdigit() or not 1 <= int(arg) <= len(prompts):
            self.out.write(f"no message {arg}; /branch lists them\n")
            return
        n = int(arg)
        index, _ = prompts[n - 1]
        parent = history[index - 1].id if index > 0 else None
        self.rt.branch(self.sid, parent)
        self.out.write(f"branched: your next message replaces message {n} and what followed it\n")
