"""``agentcell chat``: driven under a pseudo-terminal against the built-in local provider, plus the pieces
it prints with."""

from __future__ import annotations

import io
import os
import re
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runtime import events as ev
from runtime.apps.chat import ChatPrinter, context_bar, format_stats, format_usage, run_chat
from runtime.context.estimate import ContextStats
from runtime.store.sessions import SessionDirectory

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


class Terminal:
    """A child process on a pseudo-terminal: type into it, read what it prints."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        import fcntl
        import pty
        import termios

        env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
        pid, fd = pty.fork()
        if pid == 0:  # the child: only exec (the parent has threads)
            os.chdir(cwd)
            # A foreground job of a terminal's shell: Ctrl-C interrupts it, even when these tests run in a
            # background job that ignores SIGINT (an ignored signal stays ignored across exec).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(argv[0], argv, env)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.pid, self.fd = pid, fd
        self.seen = ""  # everything printed so far, ANSI codes removed
        self._cursor = 0  # expect() searches from here
        self.status: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not data:
            return False
        self.seen += ANSI.sub("", data.decode("utf-8", errors="replace"))
        return True

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """Wait until ``pattern`` (a regular expression) appears in new output; returns the match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.seen, self._cursor)
            if match:
                self._cursor = match.end()
                return match
            if time.monotonic() > deadline or not self._read(min(0.2, max(0.0, deadline - time.monotonic()))):
                if match := regex.search(self.seen, self._cursor):
                    self._cursor = match.end()
                    return match
                raise AssertionError(
                    f"{pattern!r} not printed; the screen since the last match:\n{self.seen[self._cursor :]}"
                )

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def line(self, text: str) -> None:
        self.type(text + "\r")

    def wait_reading(self, timeout: float = 30.0) -> None:
        """Wait until the child's main thread sleeps waiting for a key (readline polling the terminal)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                wchan = Path(f"/proc/{self.pid}/wchan").read_text()
            except OSError:
                wchan = ""
            if wchan in ("", "0"):  # the kernel does not say here: give it a moment, as a person would
                time.sleep(0.5)
                return
            if any(word in wchan for word in ("poll", "select", "tty_read", "wait_woken")):
                return
            assert time.monotonic() < deadline, f"the chat is not reading the terminal (in {wchan})"
            time.sleep(0.01)

    def wait(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
        raise AssertionError(f"the chat did not exit; the screen:\n{self.seen[-2000:]}")

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        os.close(self.fd)


@pytest.fixture
def chat(tmp_path: Path) -> Iterator[Any]:
    """Start ``agentcell chat --local`` with extra arguments in a pseudo-terminal; cwd is a workspace."""
    terminals: list[Terminal] = []
    workspace = tmp_path / "project"
    workspace.mkdir()
    sessions = tmp_path / "sessions"

    def start(*args: str) -> Terminal:
        argv = [sys.executable, "-m", "runtime.apps.cli", "chat", "--local", "--dir", str(sessions), *args]
        terminal = Terminal(argv, workspace)
        terminals.append(terminal)
        return terminal

    start.workspace = workspace  # type: ignore[attr-defined]
    start.sessions = sessions  # type: ignore[attr-defined]
    yield start
    for terminal in terminals:
        terminal.close()


PROMPT = r"\n> "


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow  # an agentcell chat process: seconds even on an idle machine
def test_a_chat_streams_replies_and_runs_every_command(chat: Any) -> None:
    notes = "\n".join(
        f"Line {i}: the migration must keep customer ids stable across shards." for i in range(60)
    )
    (chat.workspace / "notes.txt").write_text(notes + "\n")
    term = chat("--session", "talk")
    term.expect(r"starting…")  # at once: the runtime and the provider take seconds to start
    term.expect(r"new session talk · model openai/agentcell-local · /help for commands")

    term.line("Please read notes.txt and tell me what it says.")
    term.expect(r"-> read_file\(\{\"path\": \"notes.txt\"\}\)")
    term.expect(r"<- read_file ok")
    term.expect(r"Here is what I did:\s+- I read `notes.txt` \(60 lines")
    term.expect(PROMPT)
    term.line("Thanks, that is clear.")
    term.expect(r'You asked: "Thanks, that is clear\."')
    term.expect(PROMPT)

    term.line("/context")
    bar = term.expect(r"\[(#*)(\.*)\] ([\d,]+) / 128,000 tokens \((\d+)%\)")
    assert len(bar.group(1)) + len(bar.group(2)) == 40
    used = int(bar.group(3).replace(",", ""))
    assert used > 1_000  # the file is in the context
    term.expect(r"window\s+128,000")
    term.expect(r"tools\s+[\d,]+\s+\(estimated\)")
    term.expect(r"messages \(6\)\s+[\d,]+\s+\(back-calculated\)")
    term.expect(r"compacts at\s+[\d,]+\s+\(configured\)")
    term.expect(PROMPT)

    term.line("/compact the migration rules")
    term.expect(r"\[compacting \(manual\) at [\d,]+ tokens\.\.\.\]")
    after = term.expect(r"\[compacted: ([\d,]+) -> ([\d,]+) tokens")
    assert int(after.group(2).replace(",", "")) < int(after.group(1).replace(",", ""))
    term.expect(PROMPT)

    term.line("/sessions")
    term.expect(r"\* talk\s+\d{4}-\d\d-\d\d \d\d:\d\d\s+\d+ messages\s+openai/agentcell-local")
    term.expect(PROMPT)

    term.line("/branch")
    term.expect(r"1\. Please read notes\.txt and tell me what it says\.")
    term.expect(r"2\. Thanks, that is clear\.")
    term.expect(PROMPT)
    term.line("/branch 2")
    term.expect(r"branched: your next message replaces message 2")
    term.expect(PROMPT)
    term.line("Something else entirely.")
    term.expect(r'You asked: "Something else entirely\."')
    term.expect(PROMPT)
    term.line("/branch")
    term.expect(r"1\. Please read notes\.txt")
    listing = term.expect(r"2\. (.*)\n")
    assert listing.group(1).strip() == "Something else entirely."

    term.line("/quit")
    assert term.wait() == 0


@pytest.mark.slow  # an agentcell chat process: seconds even on an idle machine
def test_ctrl_c_aborts_the_turn_not_the_chat(chat: Any, tmp_path: Path) -> None:
    # A session stored by an earlier chat (run in process, without a terminal) is resumed.
    out = io.StringIO()
    lines = iter(["remember the blue door", "/quit"])
    assert (
        run_chat(
            model=None,
            session_id="resume-me",
            sessions_dir=str(chat.sessions),
            input_fn=lambda _: next(lines),
            out=out,
        )
        == 0
    )
    assert 'You asked: "remember the blue door"' in out.getvalue()

    # Every reply takes 120 s: a turn that ends well before that was aborted, not answered.
    term = chat("--session", "resume-me", "--latency", "120")
    term.expect(r"resumed session resume-me")
    # A recap of where the conversation stopped.
    term.expect(
        r"last exchange:\n  you: remember the blue door\n  assistant: You asked: \"remember the blue door\""
    )
    term.line("/branch")
    term.expect(r"1\. remember the blue door")
    term.expect(PROMPT)

    transcript = SessionDirectory(chat.sessions).transcript_path("resume-me")
    requests = transcript.read_bytes().count(b'"type":"request_start"')
    term.line("this reply will be slow")
    # Ctrl-C once the request is waiting on the provider (its request_start is in the transcript), not
    # after a fixed pause: on a loaded machine the line may not even be read yet, and a Ctrl-C then
    # discards it in the terminal and leaves nothing to abort.
    wait_until(lambda: transcript.read_bytes().count(b'"type":"request_start"') > requests, timeout=60)
    term.expect(r"waiting for the model… \d+s")  # something on screen while the model is silent
    started = time.monotonic()
    term.type("\x03")
    term.expect(r"\[aborted\]", timeout=60)
    term.expect(PROMPT)
    assert time.monotonic() - started < 60  # half the reply's latency: the abort, not the answer
    # At the prompt Ctrl-C only clears the line. (Wait until input() is reading: a SIGINT in the instant
    # between readline printing the prompt and waiting for a key is only seen at the next key.)
    term.wait_reading()
    term.type("\x03")
    term.expect(r"Ctrl-C aborts a running turn")
    term.line("/sessions")
    term.expect(r"\* resume-me")
    term.expect(PROMPT)
    term.wait_reading()  # as above: a key typed before readline reads is handled by the line discipline
    term.type("\x04")  # Ctrl-D leaves
    assert term.wait() == 0
    assert 'You asked: "this reply will be slow"' not in term.seen  # it was never answered


@pytest.mark.slow  # an agentcell chat process: seconds even on an idle machine
def test_a_new_prompt_is_drawn_after_a_queued_turn_ends(chat: Any) -> None:
    term = chat("--session", "queue", "--latency", "2")
    term.expect(r"new session queue")
    term.wait_reading()
    term.line("first question")
    term.expect(r"waiting for the model")
    term.line("/queue second question")
    term.expect(r"\(queued: it runs when this turn ends\)")
    term.expect(r'You asked: "first question"')
    term.expect(r'You asked: "second question"[^\n]*\n')
    term.expect(r"> ")  # a prompt, drawn after the queued turn's reply
    term.wait_reading()
    assert term.seen.endswith("> "), term.seen[-300:]
    term.wait_reading()
    term.line("/quit")
    assert term.wait() == 0


def stats(**overrides: Any) -> ContextStats:
    fields: dict[str, Any] = {
        "window": 8_000,
        "total": 2_000,
        "estimated": False,
        "basis": "usage",
        "system_prompt": 100,
        "tools": 400,
        "messages": 1_500,
        "messages_floored": False,
        "last_input_tokens": 1_900,
        "last_output_tokens": 100,
        "new_messages_tokens": 0,
        "reserve": 1_000,
        "limit": 7_000,
        "free": 5_000,
        "compaction_threshold": 5_600,
        "will_compact": False,
        "message_count": 12,
        "last_estimate_error": 0.042,
        "sources": {"total": "actual", "tools": "estimated", "messages": "back_calculated"},
    }
    fields.update(overrides)
    return ContextStats(**fields)


def test_context_breakdown_names_every_figure_and_its_source() -> None:
    text = format_stats(stats())
    first, *rest = text.splitlines()
    assert first == "[##########..............................] 2,000 / 8,000 tokens (25%)"
    assert "  window                   8,000" in rest
    assert "  in context               2,000  (actual)" in rest
    assert "    tools                    400  (estimated)" in rest
    assert "    messages (12)          1,500  (back-calculated)" in rest
    assert any(line.split()[:2] == ["compacts", "at"] and "5,600" in line for line in rest)
    assert any("last estimate error" in line and "+4.2%" in line for line in rest)
    floored = format_stats(stats(messages=0, messages_floored=True, will_compact=True))
    assert "the next turn compacts first" in floored and "messages shown as 0" in floored


def test_context_shows_the_cached_share_and_the_cost_by_kind_of_token() -> None:
    from runtime.messages import CostSplit, Usage

    costs = CostSplit(input=0.003, cache_read=0.0027, cache_write=0.0, output=0.015, without_cache=0.0453)
    usage = Usage(
        input_tokens=10_000, output_tokens=1_000, cache_read_tokens=9_000, cost=costs.total, costs=costs
    )
    text = format_usage(usage)
    assert "  input                   10,000  (90% read from the cache: 9,000 read, 0 written)" in text
    assert "cache read $0.0027" in text and "output $0.0150" in text
    assert "$0.0246 saved by the cache" in text and "$0.0207" in text  # the total, then what was saved
    assert "cost" not in format_usage(Usage(input_tokens=10))  # a model without prices: no cost line


def test_context_bar_is_clamped() -> None:
    assert context_bar(0, 100, width=10) == "[..........] 0 / 100 tokens (0%)"
    assert context_bar(250, 100, width=10).startswith("[##########] 250 / 100 tokens")
    assert context_bar(5, 0, width=4) == "[....] 5 / 0 tokens (0%)"


def test_printer_writes_a_transcript_and_tracks_what_it_printed() -> None:
    out = io.StringIO()
    printer = ChatPrinter(out)
    events: list[ev.Event] = [
        ev.TextDelta(session_id="s", seq=1, turn_id="t", delta="Let me "),
        ev.TextDelta(session_id="s", seq=2, turn_id="t", delta="look."),
        ev.ToolExecutionStart(
            session_id="s", seq=3, turn_id="t", call_id="c", name="read_file", arguments='{"path": "a.py"}'
        ),
        ev.ToolExecutionEnd(
            session_id="s",
            seq=4,
            turn_id="t",
            call_id="c",
            name="read_file",
            is_error=False,
            duration=0.5,
            output_chars=10,
        ),
        ev.ErrorOccurred(session_id="s", seq=5, message="aborted by the user", code="aborted"),
        ev.AgentAbort(session_id="s", seq=6, turn_id="t", repaired_calls=1),
    ]
    assert not printer.catch_up(6, timeout=0.01)
    for event in events:
        printer(event)
    assert printer.catch_up(6, timeout=0.01)
    assert out.getvalue() == (
        "Let me look.\n"
        '  -> read_file({"path": "a.py"})\n'
        "  <- read_file ok in 0.50s\n"
        "[aborted (1 unfinished tool calls closed)]\n"
    )


def test_a_stream_reset_says_the_broken_text_is_void() -> None:
    out = io.StringIO()
    printer = ChatPrinter(out)
    for seq, event in enumerate(
        [
            ev.TextDelta(session_id="s", turn_id="t", delta="This reply b"),
            ev.StreamReset(session_id="s", turn_id="t", attempt=1, message_id="m2"),
            ev.TextDelta(session_id="s", turn_id="t", delta="This reply is whole."),
        ],
        start=1,
    ):
        printer(msgspec.structs.replace(event, seq=seq))
    assert out.getvalue() == (
        "This reply b\n[attempt 1 broke off: the text above is void, the reply starts again]\nThis reply is whole."
    )


def test_reasoning_is_shown_apart_from_the_answer() -> None:
    out = io.StringIO()
    printer = ChatPrinter(out, color=True)  # a terminal: reasoning is shown, dimmed
    for seq, event in enumerate(
        [
            ev.TextDelta(session_id="s", turn_id="t", delta="Reading it."),
            ev.ReasoningDelta(session_id="s", turn_id="t", delta="All 2 tool calls have results; "),
            ev.ReasoningDelta(session_id="s", turn_id="t", delta="time to report back."),
            ev.TextDelta(session_id="s", turn_id="t", delta="Here is what I did:"),
            ev.AgentEnd(session_id="s", turn_id="t", status="ok"),
        ],
        start=1,
    ):
        printer(msgspec.structs.replace(event, seq=seq))
    dim, plain = "\x1b[2m", "\x1b[0m"
    assert out.getvalue() == (
        "Reading it.\n"
        f"{dim}thinking: {plain}{dim}All 2 tool calls have results; {plain}{dim}time to report back.{plain}\n"
        "Here is what I did:\n"
    )
    hidden = io.StringIO()  # not a terminal: the answer alone
    printer = ChatPrinter(hidden)
    printer(ev.ReasoningDelta(session_id="s", seq=1, turn_id="t", delta="time to report back."))
    printer(ev.TextDelta(session_id="s", seq=2, turn_id="t", delta="Here is what I did:"))
    assert hidden.getvalue() == "Here is what I did:"


def test_a_compact_with_nothing_to_reduce_says_so_once_with_one_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lines = iter(["hello there", "/compact", "/quit"])
    out = io.StringIO()
    assert (
        run_chat(
            model=None,
            session_id="once",
            sessions_dir=str(tmp_path / "s"),
            input_fn=lambda _: next(lines),
            out=out,
        )
        == 0
    )
    text = out.getvalue()
    assert "compaction failed" not in text  # a short conversation has nothing to compact: no failure
    started = re.search(r"\[compacting \(manual\) at ([\d,]+) tokens\.\.\.\]", text)
    assert started, text
    said = f"[nothing to compact: a summary would take the context from {started.group(1)} to"
    assert text.count(said) == 1, text  # one figure, said once


def test_context_lists_the_capacity_pools_and_the_chat_shows_the_wait() -> None:
    from runtime import events as ev
    from runtime.apps.chat import format_capacity
    from runtime.gateway import PoolSnapshot

    pool = PoolSnapshot(
        name="http://127.0.0.1:8400/v1 (key 1a2b3c4d)",
        queued=12,
        running=3,
        paused_for=1.5,
        rpm=600.0,
        tpm=None,
        input_tpm=None,
        output_tpm=None,
        max_concurrent=None,
        learned=True,
        admitted=1_234,
        admitted_input_tokens=0,
        admitted_output_tokens=0,
        refused=2,
        waited=40,
    )
    text = format_capacity([pool])
    assert "http://127.0.0.1:8400/v1 (key 1a2b3c4d): rpm 600 (learned)" in text
    assert "3 running, 12 queued, paused 1.5s; 1,234 sent, 2 refused (429)" in text
    out = io.StringIO()
    printer = ChatPrinter(out, color=False)
    printer(
        ev.RequestQueued(session_id="s", seq=1, turn_id="t", pool=pool.name, position=4, estimated_wait=2.0)
    )
    printer(ev.RequestAdmitted(session_id="s", seq=2, turn_id="t", pool=pool.name, waited=1.8))
    assert f"[waiting for capacity of {pool.name}: 4 in the queue, about 2.0s]" in out.getvalue()
    assert "[capacity after 1.8s]" in out.getvalue()
