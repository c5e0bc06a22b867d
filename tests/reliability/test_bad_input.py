"""Bad input (design §9): each is a clear error or a handled result, nothing is lost, the session goes on.

Malformed tool-call JSON, unknown tools, 100 MB of tool output, binary and invalid UTF-8, path traversal
and symlink escape, hostile session ids, prompts larger than the window, invalid configuration.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config, ConfigError, load_config
from runtime.context.integrity import check_integrity
from runtime.host import SessionNotFound
from runtime.ids import InvalidSessionId
from runtime.messages import Message
from runtime.provider.script import ToolCallSpec, Turn
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript
from runtime.tools.builtin import builtin_registry
from runtime.tools.registry import ToolContext, ToolRegistry
from tests.reliability.support import EventLog, check_log

_names = iter(range(1, 1_000_000))


@pytest.fixture
def rt_events(sessions_dir: Path) -> Iterator[tuple[Runtime, EventLog]]:
    events = EventLog()
    config = Config().with_overrides({"retry.base_delay": 0.01, "bus.subscriber_queue": 100_000})
    with Runtime(config, sessions_dir=sessions_dir) as rt:
        rt.subscribe("*", callback=events)
        yield rt, events


def script(provider: Any, *turns: Turn) -> str:
    name = f"bad-input-{next(_names)}"
    provider.add_script(name, list(turns))
    return f"openai/{name}"


def calls(*specs: tuple[str, str]) -> Turn:
    return Turn(tool_calls=tuple(ToolCallSpec(name=n, arguments=a) for n, a in specs))


def tool_results(rt: Runtime, sid: str) -> list[Message]:
    return [m for m in rt.messages(sid) if m.role == "tool"]


def sent_tool_messages(provider: Any, model: str) -> list[list[dict[str, Any]]]:
    """The tool messages of each request the provider got for ``model``."""
    name = model.split("/", 1)[1]
    return [[m for m in r.messages if m["role"] == "tool"] for r in provider.request_log if r.model == name]


def run_tools(
    rt: Runtime, provider: Any, turn: Turn, *, tools: Any = "builtin", workspace: Path | None = None
) -> tuple[str, list[Message]]:
    """One run: the model makes ``turn``'s calls, then answers; returns the session and the results."""
    model = script(provider, turn, Turn(text="handled"), Turn(text="still here"))
    sid = rt.start_session(
        model=model, api_base=provider.url, api_key="sk-local", tools=tools, workspace=workspace
    )
    result = rt.prompt(sid, "use the tools").result(timeout=60)
    assert result.status == "ok", result.error
    assert result.text == "handled"
    results = tool_results(rt, sid)
    assert len(results) == len(turn.tool_calls)  # exactly one result per call...
    assert check_integrity(rt.messages(sid, view="model")).ok
    assert len(sent_tool_messages(provider, model)[1]) == len(turn.tool_calls)  # ... and the model saw them
    assert rt.prompt(sid, "and now?").result(timeout=60).text == "still here"  # the session goes on
    return sid, results


# -- malformed tool calls -------------------------------------------------------------------------------

MALFORMED = [
    '{"path": "notes.txt"',  # cut off
    "[1, 2]",  # not an object
    "null",
    '"notes.txt"',
    "",
    "{'path': 'notes.txt'}",  # Python, not JSON
    '{"path": "notes.txt"} trailing',
    '{"path": 5}',  # wrong type
    '{"path": "notes.txt", "nope": 1}',  # unknown argument
    "{}",  # missing argument
    '{"path": "\\x"}',  # invalid escape
    "[" * 5_000,  # deeply nested
    '{"path": "' + "a" * 100_000 + '"}',  # 100 kB
]


def test_malformed_tool_call_arguments_are_error_results(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path
) -> None:
    rt, _ = rt_events
    (workspace / "notes.txt").write_text("hello\n")
    turn = calls(*[("read_file", args) for args in MALFORMED], ("read_file", '{"path": "notes.txt"}'))
    _, results = run_tools(rt, provider, turn, workspace=workspace)
    *bad, good = results
    refused = [r for r in bad if r.is_error]
    assert refused == bad, [r.text[:80] for r in bad if not r.is_error]
    limit = Config().tool_output.max_bytes + 500  # the limits apply to error results too (design §3.5)
    assert all(len(r.text.encode()) <= limit for r in bad)
    assert not good.is_error and "hello" in good.text


def test_unknown_tools_are_error_results_naming_the_real_ones(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path
) -> None:
    rt, _ = rt_events
    names = ["teleport", "", " read_file", "read_file\u200b", "../read_file", "x" * 300, "shell"]
    _, results = run_tools(rt, provider, calls(*[(n, "{}") for n in names]), workspace=workspace)
    for result in results:
        assert result.is_error and "no tool named" in result.text and "read_file" in result.text


def test_a_tool_call_id_reused_within_one_turn_still_gets_one_result_each(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path
) -> None:
    rt, _ = rt_events
    (workspace / "a.txt").write_text("A\n")
    turn = Turn(
        tool_calls=(
            ToolCallSpec(name="read_file", arguments='{"path": "a.txt"}', id="call_same"),
            ToolCallSpec(name="list_dir", arguments="{}", id="call_same"),
        )
    )
    run_tools(rt, provider, turn, workspace=workspace)


# -- huge, binary and undecodable output ----------------------------------------------------------------


def test_a_100_mb_tool_output_is_spilled_to_a_file_not_the_log(
    rt_events: tuple[Runtime, EventLog], provider: Any, sessions_dir: Path
) -> None:
    rt, events = rt_events
    line = "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ output\n"
    output = line * (100_000_000 // len(line))
    registry = ToolRegistry()

    @registry.tool
    def flood() -> str:
        """Print 100 MB."""
        return output

    sid, (result,) = run_tools(rt, provider, calls(("flood", "{}")), tools=registry)
    assert result.metadata["truncated"] and result.metadata["original_chars"] == len(output)
    spill = Path(result.metadata["spill_path"])
    digest = hashlib.sha256(spill.read_bytes()).hexdigest()
    assert digest == result.metadata["spill_sha256"] == hashlib.sha256(output.encode()).hexdigest()
    assert str(spill) in result.text and digest in result.text  # the notice says where and what
    assert len(result.text) < 10_000
    assert spill.is_relative_to(sessions_dir)
    (end,) = events.of(sid, "tool_execution_end")
    assert end.truncated and end.output_chars == len(result.text)
    assert SessionDirectory(sessions_dir).log_path(sid).stat().st_size < 1_000_000  # not in the log


def test_binary_and_undecodable_output_becomes_clean_text(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path, sessions_dir: Path
) -> None:
    rt, events = rt_events
    (workspace / "image.bin").write_bytes(bytes(range(256)) * 40)
    (workspace / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    os.close(os.open(os.fsencode(workspace) + b"/name-\xff\xfe.txt", os.O_CREAT | os.O_WRONLY, 0o600))
    registry = builtin_registry()

    @registry.tool
    def raw_bytes() -> bytes:
        """Return raw bytes."""
        return b"\x00\x01binary\xff\xfe\x80 and \xc3\x28 invalid utf-8"

    @registry.tool
    def surrogates(*, ctx: ToolContext) -> str:
        """Stream and return text with lone surrogates (as os.fsdecode gives for undecodable names)."""
        ctx.emit_output("streamed \udcff chunk")
        ctx.emit_output(b"streamed \xff bytes")  # type: ignore[arg-type]  # a careless tool
        return "returned \udcfe text"

    turn = calls(
        ("raw_bytes", "{}"),
        ("surrogates", "{}"),
        ("read_file", '{"path": "image.bin"}'),
        ("read_file", '{"path": "latin1.txt"}'),
        ("list_dir", "{}"),
        ("grep", '{"pattern": "caf"}'),
    )
    sid, (raw, sur, image, latin, listing, grep) = run_tools(
        rt, provider, turn, tools=registry, workspace=workspace
    )
    assert "binary output" in raw.text and "\ufffd" in raw.text and "binary" in raw.text
    assert "returned" in sur.text and not sur.is_error
    assert image.is_error and "binary file" in image.text
    assert "caf\ufffd cr\ufffdme" in latin.text
    assert "name-" in listing.text and not listing.is_error
    assert "latin1.txt:1:" in grep.text
    for message in (raw, sur, image, latin, listing, grep):
        message.text.encode("utf-8")  # every result can be stored and sent
    chunks = [e.chunk for e in events.of(sid, "tool_output")]
    assert len(chunks) == 2 and all("streamed" in c for c in chunks)
    transcript = read_transcript(SessionDirectory(sessions_dir).transcript_path(sid))
    assert len([e for e in transcript if e.type == "tool_output"]) == 2  # no event lost on the way to disk


def test_shell_output_that_is_not_text(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path
) -> None:
    rt, _ = rt_events
    command = "head -c 20000 /dev/urandom; printf '\\377\\376 tail'"
    model = script(provider, calls(("shell", f'{{"command": "{command}"}}')), Turn(text="done"))
    sid = rt.start_session(
        model=model,
        api_base=provider.url,
        api_key="sk-local",
        tools="builtin",
        workspace=workspace,
        config={"agent.shell_enabled": True},
    )
    assert rt.prompt(sid, "run it").result(timeout=60).status == "ok"
    (result,) = tool_results(rt, sid)
    assert "tail" in result.text
    result.text.encode("utf-8")


def test_prompts_with_lone_surrogates_are_refused_and_control_characters_kept(
    rt_events: tuple[Runtime, EventLog], provider: Any, sessions_dir: Path
) -> None:
    rt, _ = rt_events
    model = script(provider, Turn(text="one"), Turn(text="two"))
    sid = rt.start_session(model=model, api_base=provider.url, api_key="sk-local")
    with pytest.raises(ValueError, match="not valid Unicode"):
        rt.prompt(sid, "file name: report-\udcff.txt")
    with pytest.raises(ValueError, match="not valid Unicode"):
        rt.start_session(model=model, system_prompt="\ud800")
    weird = "nul \x00 bell \x07 escape \x1b[31m rtl \u202e emoji \U0001f600 end"
    assert rt.prompt(sid, weird).result(timeout=30).text == "one"
    assert rt.prompt(sid, "plain").result(timeout=30).text == "two"
    rt.stop()
    check = check_log(SessionDirectory(sessions_dir), sid)
    assert not check.problems
    assert [m.text for m in check.tree.messages()] == [weird, "one", "plain", "two"]


# -- paths that leave the workspace ---------------------------------------------------------------------


@pytest.fixture
def escape_routes(tmp_path: Path, workspace: Path) -> Path:
    """A secret outside the workspace, and links inside it that lead there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET\n")
    (workspace / "link_dir").symlink_to(outside, target_is_directory=True)
    (workspace / "link_file").symlink_to(outside / "secret.txt")
    (workspace / "dangling").symlink_to(outside / "created-by-the-model.txt")
    (workspace / "loop").symlink_to(workspace / "loop")
    (workspace / "inside.txt").write_text("fine\n")
    return outside


def test_path_traversal_and_symlink_escapes_are_refused(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path, escape_routes: Path
) -> None:
    rt, _ = rt_events
    outside = escape_routes
    before = {p: p.read_bytes() for p in outside.iterdir()}
    secret = str(outside / "secret.txt")
    attempts = [
        ("read_file", '{"path": "../outside/secret.txt"}'),
        ("read_file", f'{{"path": "{secret}"}}'),
        ("read_file", '{"path": "inside.txt/../../outside/secret.txt"}'),
        ("read_file", '{"path": "link_file"}'),
        ("read_file", '{"path": "link_dir/secret.txt"}'),
        ("read_file", '{"path": "loop"}'),
        ("read_file", '{"path": "inside.txt\\u0000.png"}'),
        ("write_file", '{"path": "../outside/evil.txt", "content": "x"}'),
        ("write_file", '{"path": "link_dir/evil.txt", "content": "x"}'),
        ("write_file", '{"path": "dangling", "content": "x"}'),
        ("write_file", '{"path": "link_file", "content": "overwritten"}'),
        ("edit_file", '{"path": "link_file", "old": "TOPSECRET", "new": "gone"}'),
        ("list_dir", '{"path": ".."}'),
        ("list_dir", '{"path": "link_dir"}'),
        ("grep", '{"pattern": "TOPSECRET", "path": ".."}'),
        ("grep", '{"pattern": "TOPSECRET", "path": "link_dir"}'),
    ]
    turn = calls(*attempts, ("grep", '{"pattern": "TOPSECRET|fine"}'), ("list_dir", "{}"))
    _, results = run_tools(rt, provider, turn, workspace=workspace)
    *refused, grep_all, listing = results
    for (name, args), result in zip(attempts, refused, strict=True):
        assert result.is_error, f"{name} {args[:60]} was allowed: {result.text[:200]}"
        assert "TOPSECRET" not in result.text
    assert "TOPSECRET" not in grep_all.text and "inside.txt:1: fine" in grep_all.text
    assert "outside the workspace" in listing.text
    assert {p: p.read_bytes() for p in outside.iterdir()} == before  # nothing written or changed out there


def test_special_files_in_the_workspace_do_not_hang_a_tool(
    rt_events: tuple[Runtime, EventLog], provider: Any, workspace: Path
) -> None:
    rt, _ = rt_events
    os.mkfifo(workspace / "pipe")
    assert stat.S_ISFIFO((workspace / "pipe").stat().st_mode)
    attempts = [
        ("read_file", '{"path": "pipe"}'),
        ("edit_file", '{"path": "pipe", "old": "a", "new": "b"}'),
        ("write_file", '{"path": "pipe", "content": "x"}'),
    ]
    model = script(provider, calls(*attempts, ("grep", '{"pattern": "x"}')), Turn(text="done"))
    sid = rt.start_session(
        model=model,
        api_base=provider.url,
        api_key="sk-local",
        tools="builtin",
        workspace=workspace,
        config={"agent.tool_timeout": 5.0},
    )
    assert rt.prompt(sid, "go").result(timeout=30).status == "ok"
    *refused, grep = tool_results(rt, sid)
    for result in refused:
        assert result.is_error and "regular file" in result.text, result.text
    assert not grep.is_error


# -- hostile session ids ------------------------------------------------------------------------------------

HOSTILE_IDS: list[Any] = [
    "",
    ".",
    "..",
    "../escape",
    "a/../../b",
    "/etc/passwd",
    "a\\b",
    "nul\x00byte",
    "new\nline",
    "x" * 129,
    "-rf",
    ".hidden",
    "ünïcode",
    "spaced out",
    "other.events",  # its log would be the transcript of session "other"
    42,
    None,
    b"bytes",
]


@pytest.mark.parametrize("bad", HOSTILE_IDS, ids=repr)
def test_hostile_session_ids_are_refused_by_every_method(
    rt_events: tuple[Runtime, EventLog], tmp_path: Path, bad: Any
) -> None:
    rt, _ = rt_events
    before = sorted(tmp_path.rglob("*"))
    attempts = [
        lambda: rt.start_session(bad, model="openai/x"),
        lambda: rt.resume_session(bad),
        lambda: rt.prompt(bad, "hi"),
        lambda: rt.abort(bad),
        lambda: rt.compact(bad),
        lambda: rt.context_stats(bad),
        lambda: rt.messages(bad),
        lambda: rt.usage(bad),
        lambda: rt.set_model(bad, "openai/y"),
        lambda: rt.branch(bad, None),
        lambda: rt.hibernate(bad),
        lambda: rt.stop_session(bad),
        lambda: rt.delete_session(bad),
    ]
    if bad is None:
        attempts = attempts[1:]  # start_session(None) picks a fresh id
    for attempt in attempts:
        with pytest.raises(InvalidSessionId):
            attempt()
    assert sorted(tmp_path.rglob("*")) == before  # not a file anywhere


def test_valid_but_unknown_session_ids_are_clear_errors(rt_events: tuple[Runtime, EventLog]) -> None:
    rt, _ = rt_events
    for attempt in (
        lambda: rt.prompt("nobody", "hi"),
        lambda: rt.resume_session("nobody"),
        lambda: rt.delete_session("nobody"),
        lambda: rt.compact("nobody"),
    ):
        with pytest.raises(SessionNotFound, match="nobody"):
            attempt()


# -- prompts larger than the window ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_provider() -> Iterator[Any]:
    from runtime.provider import LocalProvider

    with LocalProvider(context_window=3_000) as p:
        yield p


@pytest.mark.parametrize("believed_window", [3_000, 8_000], ids=["window-known", "window-overestimated"])
def test_a_prompt_larger_than_the_window_is_an_error_and_the_session_goes_on(
    rt_events: tuple[Runtime, EventLog], small_provider: Any, sessions_dir: Path, believed_window: int
) -> None:
    rt, events = rt_events
    name = f"small-{next(_names)}"
    small_provider.add_script(name, [Turn(text="a short answer")], loop=True)
    model = f"openai/{name}"
    config = {
        "models.context_windows": {model: believed_window, "openai/summarizer": 3_000},
        "compaction.reserve_tokens": 500,
        "compaction.summarizer_model": "openai/summarizer",
    }
    sid = rt.start_session(model=model, api_base=small_provider.url, api_key="sk-local", config=config)
    assert rt.prompt(sid, "hello").result(timeout=30).status == "ok"
    huge = "inventory " * 6_000  # twice the provider's window by itself
    failed = rt.prompt(sid, huge).result(timeout=60)
    assert failed.status == "error" and "hidden from the model" in (failed.error or "")
    requests = [r for r in small_provider.request_log if r.model == name]
    assert len(requests) <= 3  # hello, and at most one try and one retry of the huge one: no loop
    for i in range(3):  # the session is still usable
        result = rt.prompt(sid, f"small question {i}").result(timeout=30)
        assert result.status == "ok", result.error
    assert not events.of(sid, "session_dead")
    assert huge in [m.text for m in rt.messages(sid)]  # nothing lost: still in the user's view ...
    assert huge not in [m.text for m in rt.messages(sid, view="model")]  # ... not in the model's
    rt.stop()
    check = check_log(SessionDirectory(sessions_dir), sid)
    assert not check.problems and huge in [m.text for m in check.tree.messages()]


# -- invalid configuration ----------------------------------------------------------------------------------

BAD_OVERRIDES: list[dict[Any, Any]] = [
    {"compaction.threshold": 1.5},
    {"compaction.threshold": "high"},
    {"compaction.mode": "shred"},
    {"compaction.nope": True},
    {"nope": 1},
    {"compaction": 5},
    {"compaction": 5, "compaction.mode": "truncate"},
    {5: "x"},
    {"retry.max_attempts": 0},
    {"models.context_windows": {"m": -1}},
    {"agent.tool_timeout": -1},
    {"persistence.fsync": "sometimes"},
]


@pytest.mark.parametrize("overrides", BAD_OVERRIDES, ids=repr)
def test_invalid_session_config_is_a_config_error_and_creates_nothing(
    rt_events: tuple[Runtime, EventLog], sessions_dir: Path, overrides: dict[Any, Any]
) -> None:
    rt, _ = rt_events
    before = sorted(sessions_dir.iterdir())
    with pytest.raises(ConfigError, match="invalid config"):
        rt.start_session("configured", model="openai/x", config=overrides)
    assert sorted(sessions_dir.iterdir()) == before
    assert "configured" not in rt.hosted_sessions()


@pytest.mark.parametrize(
    "content",
    [
        b"[compaction\nthreshold = 0.5",
        b"\xff\xfe\x00garbage",
        b"compaction = 5",
        b"[retry]\nmax_attempts = -3",
    ],
    ids=["bad-toml", "not-utf8", "wrong-shape", "out-of-range"],
)
def test_an_invalid_config_file_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "agentcell.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path, environ={})
    with pytest.raises(ConfigError):
        Runtime(config_path=path)


@pytest.mark.parametrize(
    "environ",
    [
        {"AGENTCELL_COMPACTION__THRESHOLD": "2"},
        {"AGENTCELL_COMPACTION__AUTO": "maybe"},
        {"AGENTCELL_NOPE__X": "1"},
        {"AGENTCELL_CONFIG": "/nonexistent/agentcell.toml"},
    ],
    ids=repr,
)
def test_invalid_config_in_the_environment_is_a_config_error(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        load_config(environ=environ)
