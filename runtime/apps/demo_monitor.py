"""What ``agentcell demo`` knows about each session, fed by its events only: a view per session, the
monitor that keeps them (a bus callback), one line per notable event, and the run's outcome."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime import events as ev
from runtime.wording import plural

__all__ = ["DemoMonitor", "DemoOutcome", "SessionView", "describe"]


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
        case ev.CompactionStart(trigger=trigger, cause=cause):
            view.state = f"compacting ({trigger})"
            if trigger == "overflow" and cause != "counted":  # the provider refused: a retry follows
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
        case ev.CompactionStart(trigger="overflow", cause="counted", tokens_before=tokens):
            return (
                f"EMERGENCY COMPACTION: the next request (~{tokens:,} tokens) is over the limit; not sent yet"
            )
        case ev.CompactionStart(trigger="overflow", tokens_before=tokens):
            return f"OVERFLOW: the provider refused ~{tokens:,} tokens; emergency compaction, then a retry"
        case ev.CompactionStart(trigger=trigger, messages_before=count, tokens_before=tokens):
            return f"COMPACTION ({trigger}) of {plural(count, 'message')}, {tokens:,} tokens..."
        case ev.CompactionEnd(
            trigger=trigger,
            tokens_before=before,
            tokens_after=after,
            messages_after=kept,
            summary_chars=chars,
        ):
            return (
                f"COMPACTED ({trigger}): {before:,} -> {after:,} tokens, "
                f"{plural(kept, 'message')} now, summary of {chars:,} chars"
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
