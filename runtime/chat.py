"""``agentcell chat``: an interactive session with any litellm model (SPEC 7.1).

Replies stream as they arrive. Ctrl-C during a turn aborts the turn (the session stays usable); Ctrl-C
or Ctrl-D at the prompt leaves. Commands: ``/compact [focus]``, ``/context``, ``/sessions``,
``/branch [n]``, ``/help``, ``/quit``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from runtime import events as ev

HELP = """commands:
  /compact [focus]  compact the conversation now, optionally focusing the summary
  /context          the context window: a bar and the breakdown
  /sessions         stored sessions
  /branch [n]       list your messages; /branch n continues from before message n
  /help             this text
  /quit             leave (Ctrl-D works too)"""


def context_bar(used: int, window: int, width: int = 40) -> str:
    """``[#########.......]  12,345 / 128,000 tokens (10%)``."""
    frac = 0.0 if window <= 0 else min(1.0, max(0.0, used / window))
    filled = round(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {used:,} / {window:,} tokens ({frac:.0%})"


def format_stats(stats: Any) -> str:
    """The SPEC 4.6 breakdown as aligned lines."""

    def label(actual: bool) -> str:
        return "actual" if actual else "estimated"

    lines = [
        context_bar(stats.total, stats.window),
        f"  total            {stats.total:>10,}  ({label(not stats.estimated)})",
        f"  system prompt    {stats.system_prompt:>10,}  (estimated)",
        f"  tools            {stats.tools:>10,}  (estimated)",
        f"  messages         {stats.messages:>10,}  (back-calculated)",
        f"  reserve/output   {stats.reserve:>10,}",
        f"  free             {stats.free:>10,}",
    ]
    if stats.compaction_threshold is not None:
        lines.append(f"  compacts at      {stats.compaction_threshold:>10,}")
    if stats.last_estimate_error is not None:
        lines.append(f"  last estimate error {stats.last_estimate_error:+.1%}")
    if stats.messages_floored:
        lines.append("  warning: the messages figure was negative and is shown as 0")
    return "\n".join(lines)


class ChatPrinter:
    """Prints a session's events as a chat transcript (thread-safe; called from the bus)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._lock = threading.Lock()
        self._in_text = False

    def __call__(self, event: ev.Event) -> None:
        with self._lock:
            self._print(event)
            self.out.flush()

    def _print(self, event: ev.Event) -> None:
        match event:
            case ev.TextDelta(delta=delta):
                self.out.write(delta)
                self._in_text = True
            case ev.ReasoningDelta(delta=delta):
                self.out.write(f"\x1b[2m{delta}\x1b[0m" if self.out.isatty() else "")
            case ev.ToolExecutionStart(name=name, arguments=args):
                self._newline()
                self.out.write(f"  -> {name}({args[:120]})\n")
            case ev.ToolExecutionEnd(name=name, is_error=is_error, duration=duration):
                self.out.write(f"  <- {name} {'failed' if is_error else 'ok'} in {duration:.2f}s\n")
            case ev.CompactionStart(trigger=trigger, tokens_before=tokens):
                self._newline()
                self.out.write(f"  [compacting ({trigger}) at {tokens:,} tokens...]\n")
            case ev.CompactionEnd(tokens_before=before, tokens_after=after, messages_after=count):
                self.out.write(f"  [compacted {before:,} -> {after:,} tokens, {count} messages kept]\n")
            case ev.CompactionFailed(error=error):
                self.out.write(f"  [compaction failed: {error}]\n")
            case ev.ProviderRetry(attempt=attempt, delay=delay, error=error):
                self.out.write(f"  [retry {attempt} in {delay:.1f}s: {error}]\n")
            case ev.Error(message=message):
                self._newline()
                self.out.write(f"error: {message}\n")
            case ev.AgentAbort():
                self._newline()
                self.out.write("[aborted]\n")
            case ev.AgentEnd():
                self._newline()
            case _:
                pass

    def _newline(self) -> None:
        if self._in_text:
            self.out.write("\n")
            self._in_text = False


def run_chat(
    *,
    model: str | None,
    session_id: str | None,
    api_base: str | None = None,
    config_path: str | None = None,
    local: bool = False,
    input_fn: Callable[[str], str] = input,
    out: TextIO | None = None,
) -> int:
    from runtime.config import load_config
    from runtime.host import Runtime

    out = out or sys.stdout
    cfg = load_config(config_path)
    provider = None
    if local or (model is None and api_base is None):
        from runtime.provider import LocalProvider

        provider = LocalProvider().start()
        api_base = provider.url
        model = model or "openai/agentcell-local"
    model = model or cfg.agent.model
    api_key = os.environ.get("AGENTCELL_API_KEY") or ("sk-local" if provider else None)
    try:
        with Runtime(cfg) as rt:
            sid = _open_session(rt, session_id, model, api_base, api_key)
            out.write(f"session {sid} · model {model} · /help for commands\n")
            printer = ChatPrinter(out)
            with rt.subscribe(sid, callback=printer):
                _loop(rt, sid, input_fn, out)
    finally:
        if provider is not None:
            provider.stop()
    return 0


def _open_session(rt: Any, session_id: str | None, model: str, api_base: str | None, api_key: str | None) -> str:
    if session_id is not None and rt.services.directory.exists(session_id):
        return str(rt.resume_session(session_id, tools="builtin", api_key=api_key, api_base=api_base))
    return str(
        rt.start_session(session_id, model=model, tools="builtin", workspace=os.getcwd(), api_base=api_base, api_key=api_key)
    )


def _loop(rt: Any, sid: str, input_fn: Callable[[str], str], out: TextIO) -> None:
    while True:
        try:
            line = input_fn("> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return
        if not line:
            continue
        if line.startswith("/"):
            if not _command(rt, sid, line, out):
                return
            continue
        handle = rt.prompt(sid, line)
        while True:
            try:
                result = handle.result(timeout=0.1)
                break
            except TimeoutError:
                continue
            except KeyboardInterrupt:
                rt.abort(sid).result(timeout=10)
                continue
        if result.status == "ok" and result.message is not None and not result.message.text:
            out.write("(no text)\n")


def _command(rt: Any, sid: str, line: str, out: TextIO) -> bool:
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    try:
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            out.write(HELP + "\n")
        elif name == "/compact":
            result = rt.compact(sid, instructions=arg or None).result(timeout=600)
            if not result.compacted:
                out.write(f"not compacted: {result.reason}\n")
        elif name == "/context":
            out.write(format_stats(rt.context_stats(sid)) + "\n")
        elif name == "/sessions":
            for info in rt.list_sessions():
                mark = "*" if info.id == sid else " "
                out.write(f"{mark} {info.id}  {info.messages:>5} messages  {info.model}\n")
        elif name == "/branch":
            _branch(rt, sid, arg, out)
        else:
            out.write(f"unknown command {name}; /help lists them\n")
    except (ValueError, KeyError, TimeoutError) as exc:
        out.write(f"error: {exc}\n")
    return True


def _branch(rt: Any, sid: str, arg: str, out: TextIO) -> None:
    prompts = [m for m in rt.messages(sid) if m.role == "user" and m.kind is None]
    if not arg:
        for n, msg in enumerate(prompts, 1):
            out.write(f"  {n}. {msg.text[:70]}\n")
        out.write("/branch n continues from just before message n\n")
        return
    with contextlib.suppress(ValueError):
        n = int(arg)
        if 1 <= n <= len(prompts):
            parent = _parent_of(rt, sid, prompts[n - 1].id)
            rt.branch(sid, parent)
            out.write(f"branched: the next message continues from before message {n}\n")
            return
    out.write(f"no message {arg}; /branch lists them\n")


def _parent_of(rt: Any, sid: str, message_id: str) -> str | None:
    history = rt.messages(sid)
    for prev, msg in zip([None, *history], history, strict=False):
        if msg.id == message_id:
            return prev.id if prev is not None else None
    return None
