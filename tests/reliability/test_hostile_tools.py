"""Hostile input to the built-in tools: what a model (or a prompt injection in a file it reads) can send.

A tool call can never stop the runtime, outlive its timeout, read outside the workspace, or hand the shell
the host's secrets.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.messages import ToolCallPart
from runtime.provider.script import ToolCallSpec, Turn
from runtime.tools.builtin import GREP_LONG_LINE_BYTES, builtin_registry
from runtime.tools.executor import ToolExecutor, ToolRunResult
from runtime.tools.registry import ToolContext, ToolError, ToolRegistry
from runtime.tools.workspace import Workspace

_names = iter(range(1, 1_000_000))


def script(provider: Any, *turns: Turn) -> str:
    name = f"hostile-tools-{next(_names)}"
    provider.add_script(name, list(turns))
    return f"openai/{name}"


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    root = tmp_path / "ws"
    root.mkdir()
    return ToolContext(workspace=Workspace(root), call_id="call_1", logs_dir=tmp_path / "logs")


def run(name: str, ctx: ToolContext, **args: object) -> str:
    result = builtin_registry(shell=True)[name].invoke(args, ctx)
    assert isinstance(result, str)
    return result


@pytest.fixture
def executor() -> Iterator[ToolExecutor]:
    pool = ToolExecutor(workers=2, name="hostile-tool")
    yield pool
    pool.shutdown()


def call(name: str, arguments: str, call_id: str = "c1") -> ToolCallPart:
    return ToolCallPart(call_id, name, arguments)


# -- regular expressions --------------------------------------------------------------------------------


def test_a_catastrophic_regex_does_not_stop_other_sessions(
    sessions_dir: Path, provider: Any, workspace: Path
) -> None:
    """A regular expression chosen by the model cannot freeze the process: other sessions keep answering."""
    (workspace / "bait.txt").write_text("a" * 26 + "\n")
    config = Config().with_overrides({"agent.tool_timeout": 1.0})
    grep = Turn(tool_calls=(ToolCallSpec(name="grep", arguments='{"pattern": "(a+)+b"}'),))
    with Runtime(config, sessions_dir=sessions_dir) as rt:
        started = threading.Event()
        hostile = rt.start_session(
            model=script(provider, grep, Turn(text="searched")),
            api_base=provider.url,
            api_key="sk-local",
            tools="builtin",
            workspace=workspace,
        )
        bystander = rt.start_session(
            model=script(provider, Turn(text="still answering")), api_base=provider.url, api_key="sk-local"
        )
        watcher = rt.subscribe(hostile, {"tool_execution_start"}, callback=lambda _: started.set())
        began = time.monotonic()
        handle = rt.prompt(hostile, "search for the pattern")
        assert started.wait(30)
        answered = rt.prompt(bystander, "hello").result(timeout=30)
        bystander_done = time.monotonic() - began
        result = handle.result(timeout=30)
        hostile_done = time.monotonic() - began
        watcher.close()
        assert answered.status == "ok" and answered.text == "still answering"
        assert result.status == "ok" and result.text == "searched"
        assert bystander_done < 3.0, f"the other session waited {bystander_done:.1f} s"
        assert hostile_done < 3.0, f"the grep turn took {hostile_done:.1f} s"


def test_a_long_grep_ends_at_its_timeout_and_stops_working(
    executor: ToolExecutor, ctx: ToolContext, tmp_path: Path
) -> None:
    """A grep that runs past the tool timeout is an error result at the deadline, and its thread stops."""
    root = ctx.require_workspace().root
    table = bytes.maketrans(bytes(range(256)), b"ac" * 128)
    with (root / "noise.txt").open("wb") as fh:  # 8 MB of random a/c lines, and a run of a's now and then
        for number in range(8_000):
            fh.write((b"a" * 22 if number % 100 == 5 else os.urandom(1_000).translate(table)) + b"\n")
    began = time.monotonic()
    handle = executor.run(
        [call("grep", '{"pattern": "a.{200}b.{40}c|(a+)+b"}')],
        builtin_registry(),
        lambda _call: ctx,
        timeout=0.5,
        spill_dir=tmp_path / "spill",
    )
    [result] = handle.wait(10)
    took = time.monotonic() - began
    assert result.is_error and "timed out" in result.message.text
    assert took < 2.0, f"the timeout fired after {took:.1f} s"

    def workers() -> int:  # the pool's two, plus the abandoned one until it returns
        return sum(1 for t in threading.enumerate() if re.fullmatch(r"hostile-tool-\d+", t.name))

    deadline = time.monotonic() + 3.0
    while workers() > 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers() == 2, "the abandoned grep is still running"


def test_a_grep_of_one_huge_line_stops_at_its_timeout(
    executor: ToolExecutor, ctx: ToolContext, tmp_path: Path
) -> None:
    """One 8 MB line, a pattern RE2 cannot run as a DFA: the line was searched in one RE2 call, which nothing
    interrupts (seconds of work after the timeout); now no call runs over more than GREP_LONG_LINE_BYTES."""
    root = ctx.require_workspace().root
    table = bytes.maketrans(bytes(range(256)), b"ab" * 128)
    (root / "minified.js").write_bytes(os.urandom(8 * 1024 * 1024).translate(table) + b"\n")
    handle = executor.run(
        [call("grep", '{"pattern": "a\\\\w{40}\\\\d"}')],
        builtin_registry(),
        lambda _call: ctx,
        timeout=0.3,
        spill_dir=tmp_path / "spill",
    )
    [result] = handle.wait(10)  # searched in its first part: done, or timed out and stopping

    def workers() -> int:  # the pool's two, plus an abandoned one until it returns
        return sum(1 for t in threading.enumerate() if re.fullmatch(r"hostile-tool-\d+", t.name))

    deadline = time.monotonic() + 3.0
    while workers() > 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers() == 2, "the abandoned grep is still in one RE2 call over the whole line"
    assert result.is_error or "searched in their first" in result.message.text


def test_grep_searches_a_huge_line_in_its_first_part_and_says_so(ctx: ToolContext) -> None:
    root = ctx.require_workspace().root
    long = "x" * (GREP_LONG_LINE_BYTES // 2) + " early " + "é" * GREP_LONG_LINE_BYTES + " late\n"
    (root / "big.txt").write_text("first\n" + long + "last early\n")
    found = run("grep", ctx, pattern="early")
    kb = GREP_LONG_LINE_BYTES // 1024
    assert found.splitlines()[0].startswith("big.txt:2: xxx")
    assert found.splitlines()[1] == "big.txt:3: last early"
    assert found.splitlines()[2] == (
        f"[1 line(s) longer than {kb} KB searched in their first {kb} KB only: big.txt:2; "
        "read_file shows them in parts]"
    )
    missed = run("grep", ctx, pattern="late$")
    assert missed.startswith("No matches") and "big.txt:2" in missed


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(\w+) \1", "backreference"),
        (r"foo(?=bar)", "lookahead"),
        (r"(?<!x)foo", "lookbehind"),
        (r"a++", "possessive"),
    ],
)
def test_grep_explains_what_its_regex_syntax_lacks(ctx: ToolContext, pattern: str, why: str) -> None:
    """A pattern grep cannot run (a backreference, lookaround) is an error result that says why."""
    (ctx.require_workspace().root / "f.txt").write_text("foo bar foo\n")
    with pytest.raises(ToolError, match="RE2") as caught:
        run("grep", ctx, pattern=pattern)
    assert "invalid regular expression" in str(caught.value), why


def test_grep_finds_what_it_found_before(ctx: ToolContext) -> None:
    """grep matches each line on its own: anchors, classes, case flags and invalid UTF-8 behave per line."""
    root = ctx.require_workspace().root
    (root / "a.py").write_text("def main():\n    return 1\nclass Foo:\n  pass\r\n")
    (root / "latin1.txt").write_bytes("café\nnaïve\n".encode("latin-1"))
    assert run("grep", ctx, pattern=r"^class \w+:$") == "a.py:3: class Foo:"
    assert run("grep", ctx, pattern=r"(?i)RETURN \d$") == "a.py:2:     return 1"
    assert run("grep", ctx, pattern=r"pass$") == "a.py:4:   pass"  # a CRLF line ends before its CR
    assert run("grep", ctx, pattern=r"^\s+pass") == "a.py:4:   pass"
    assert run("grep", ctx, pattern=r"caf.$") == "latin1.txt:1: caf\ufffd"
    assert run("grep", ctx, pattern=r"main\(\)\s+return").startswith("No matches")  # never across lines
    assert run("grep", ctx, pattern=r"\Areturn|^\s+return").startswith("a.py:2:")


# -- the watchdog ---------------------------------------------------------------------------------------


def test_a_huge_timeout_does_not_kill_the_watchdog(executor: ToolExecutor, tmp_path: Path) -> None:
    """One call's absurd timeout (1e308 s) leaves every other call's timeout working."""
    registry = ToolRegistry()

    @registry.tool
    def nap(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return "rested"

    ctx = ToolContext(workspace=None)
    first = executor.run([call("nap", '{"seconds": 0}')], registry, lambda _c: ctx, timeout=1e308)
    assert [r.message.text for r in first.wait(10)] == ["rested"]
    began = time.monotonic()
    second = executor.run([call("nap", '{"seconds": 5}', "c2")], registry, lambda _c: ctx, timeout=0.3)
    [result] = second.wait(10)
    assert result.is_error and "timed out" in result.message.text
    assert time.monotonic() - began < 2.0


def test_the_watchdog_survives_an_exception(
    executor: ToolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception while one deadline fires leaves the watchdog firing every later one."""
    from runtime.tools import executor as module

    registry = ToolRegistry()

    @registry.tool
    def nap(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return "rested"

    expire = module._Batch.expire
    failures = iter([SystemExit("a bug in a batch")])

    def flaky(self: Any, index: int, timeout: float) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        expire(self, index, timeout)

    monkeypatch.setattr(module._Batch, "expire", flaky)
    ctx = ToolContext(workspace=None)
    first = executor.run([call("nap", '{"seconds": 0.6}')], registry, lambda _c: ctx, timeout=0.1)
    assert [r.message.text for r in first.wait(10)] == ["rested"]  # its deadline hit the bug: it ran on
    began = time.monotonic()
    second = executor.run([call("nap", '{"seconds": 5}', "c2")], registry, lambda _c: ctx, timeout=0.3)
    [result] = second.wait(10)
    assert result.is_error and "timed out" in result.message.text
    assert time.monotonic() - began < 2.0


# -- the shell ------------------------------------------------------------------------------------------


def test_the_shell_gets_only_allowed_environment_variables(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell tool passes an allow-list of environment variables, never the host's credentials."""
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY",
        "GITHUB_PAT": "ghp_examplepat",
        "DATABASE_URL": "postgres://app:hunter2@db/prod",
        "SOME_RANDOM_SETTING": "random-value",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_EXAMPLE", "lc-value")
    monkeypatch.setenv("MY_TOOL_HOME", "/opt/my-tool")
    out = run("shell", replace(ctx, shell_enabled=True, shell_env=("MY_TOOL_*",)), command="env")
    for value in secrets.values():
        assert value not in out
    assert f"PATH={os.environ['PATH']}" in out and "LC_EXAMPLE=lc-value" in out
    assert "MY_TOOL_HOME=/opt/my-tool" in out  # named by the session's agent.shell_env


def test_shell_logs_are_readable_by_their_owner_only(ctx: ToolContext) -> None:
    """The shell's log files are private to their owner (0600), like every other session file."""
    run("shell", replace(ctx, shell_enabled=True), command="echo secret output")
    [log] = list(ctx.logs_dir.glob("shell-*.log"))
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


# -- the workspace --------------------------------------------------------------------------------------


def test_file_tools_refuse_hard_links(ctx: ToolContext, tmp_path: Path) -> None:
    """A hard link inside the workspace does not let file tools read or change a file outside it."""
    outside = tmp_path / "outside.txt"
    outside.write_text("TOPSECRET\n")
    root = ctx.require_workspace().root
    os.link(outside, root / "innocent.txt")
    (root / "fine.txt").write_text("fine\n")
    for name, args in [
        ("read_file", {"path": "innocent.txt"}),
        ("edit_file", {"path": "innocent.txt", "old": "TOPSECRET", "new": "changed"}),
        ("write_file", {"path": "innocent.txt", "content": "overwritten"}),
    ]:
        with pytest.raises(ToolError, match="hard link"):
            run(name, ctx, **args)
    found = run("grep", ctx, pattern="TOPSECRET|fine")
    assert "TOPSECRET" not in found and "fine.txt:1: fine" in found
    assert outside.read_text() == "TOPSECRET\n"


def test_results_of_hostile_calls_are_results(executor: ToolExecutor, ctx: ToolContext) -> None:
    """Every hostile call above still ends with exactly one result the model can read."""
    (ctx.require_workspace().root / "f.txt").write_text("x\n")
    calls = [call("grep", '{"pattern": "(a)\\\\1"}', "c1"), call("grep", '{"pattern": "x"}', "c2")]
    results: list[ToolRunResult] = executor.run(calls, builtin_registry(), lambda _c: ctx).wait(10)
    assert [r.is_error for r in results] == [True, False]
