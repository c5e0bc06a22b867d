"""Fuzz (design §9, hypothesis): the JSONL log reader and the overflow classifier on hostile input.

The log reader: whatever is on disk, it returns the entries that were written whole, cuts a torn tail,
and otherwise names the bad line — never another exception, never a silently missing entry. The
overflow classifier: every vendor's overflow error is recognised however it arrives (message, body,
JSON text, wrapped exception) and whatever surrounds it; rate limits and other errors never are; and it
never raises.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runtime.context.overflow import is_context_overflow
from runtime.messages import Message, TextPart, ToolCallPart, tool_result
from runtime.provider import errors
from runtime.store.entries import Entry, MessageEntry, encode_entry, new_header
from runtime.store.log import CorruptLogError, read_log, replay
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# -- the JSONL log reader -------------------------------------------------------------------------------

texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)  # any text a message can hold


@st.composite
def messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "assistant", "tool"]))
    text = draw(texts)
    if kind == "user":
        return Message(role="user", parts=(TextPart(text),))
    if kind == "assistant":
        call = ToolCallPart(
            id=draw(st.text("abc123", min_size=1, max_size=8)), name="t", arguments=draw(texts)
        )
        return Message(role="assistant", parts=(TextPart(text), call))
    return tool_result(draw(st.text("abc123", min_size=1, max_size=8)), "t", text)


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[Entry], bytes]:
    """A valid log: a header and a chain of messages, as the store writes it."""
    entries: list[Entry] = [new_header("fuzzed", model="m", system_prompt=draw(texts))]
    parent = None
    for message in draw(st.lists(messages(), max_size=8)):
        entries.append(MessageEntry(id=message.id, parent_id=parent, message=message))
        parent = message.id
    return entries, b"".join(encode_entry(e) for e in entries)


def write(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> Path:
    path = tmp_path_factory.mktemp("log") / "fuzzed.jsonl"
    path.write_bytes(data)
    return path


@FUZZ
@given(log=logs(), cut=st.integers(min_value=0))
def test_a_log_cut_anywhere_reads_back_every_whole_line(
    tmp_path_factory: pytest.TempPathFactory, log: tuple[list[Entry], bytes], cut: int
) -> None:
    entries, data = log
    cut %= len(data) + 1
    path = write(tmp_path_factory, data[:cut])
    whole_lines = data[:cut].count(b"\n")
    found, info = read_log(path)
    assert found == entries[:whole_lines]
    assert info.torn == (cut > 0 and data[cut - 1 : cut] != b"\n")
    assert path.read_bytes() == data[: data.rfind(b"\n", 0, cut) + 1]  # the torn tail is cut off
    again, info_again = read_log(path)
    assert again == found and not info_again.torn
    if found:
        replay(path, found)  # and what is left is a consistent tree


@FUZZ
@given(log=logs(), tail=st.binary(min_size=1, max_size=200))
def test_garbage_after_the_last_line_is_a_torn_tail(
    tmp_path_factory: pytest.TempPathFactory, log: tuple[list[Entry], bytes], tail: bytes
) -> None:
    entries, data = log
    tail = tail.replace(b"\n", b"")
    assume(tail)
    path = write(tmp_path_factory, data + tail)
    found, info = read_log(path)
    assert found == entries and info.torn_bytes == len(tail)


@FUZZ
@given(log=logs(), position=st.integers(min_value=0), byte=st.integers(min_value=0, max_value=255))
def test_a_damaged_line_is_named_never_skipped(
    tmp_path_factory: pytest.TempPathFactory, log: tuple[list[Entry], bytes], position: int, byte: int
) -> None:
    entries, data = log
    position %= len(data)
    assume(data[position : position + 1] != b"\n" and byte != ord("\n"))
    damaged = data[:position] + bytes([byte]) + data[position + 1 :]
    line = data.count(b"\n", 0, position) + 1
    path = write(tmp_path_factory, damaged)
    try:
        found, info = read_log(path)
    except CorruptLogError as exc:
        assert exc.line == line and str(path) in str(exc)
        return
    # Still readable: the byte changed a value, not the structure — or the damaged last line was dropped
    # as torn (a crash can only ever tear the last line).
    if len(found) == len(entries):
        assert not info.torn
    else:
        assert line == len(entries) and found == entries[:-1] and info.torn


@FUZZ
@given(
    data=st.binary(max_size=2_000) | st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_arbitrary_bytes_are_entries_or_a_clear_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = write(tmp_path_factory, data)
    try:
        found, _ = read_log(path, repair=False)
        if found:
            replay(path, found)
    except CorruptLogError:
        pass
    try:
        read_transcript(path)
    except CorruptLogError:
        pass
    directory = SessionDirectory(path.parent)
    (info,) = directory.list()  # listing never fails on a bad log: it reports it
    assert info.id == "fuzzed"
    try:
        directory.read_header("fuzzed")
    except CorruptLogError:
        pass


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
def test_deeply_nested_lines_are_a_clear_error(tmp_path: Path, depth: int) -> None:
    header = encode_entry(new_header("deep", model="m"))
    path = tmp_path / "deep.jsonl"
    path.write_bytes(header + b"[" * depth + b"]" * depth + b"\n" + header)
    with pytest.raises(CorruptLogError, match="line 2"):
        read_log(path)


def test_an_empty_or_missing_log() -> None:
    with pytest.raises(FileNotFoundError):
        read_log(os.devnull + ".missing")


# -- the overflow classifier ------------------------------------------------------------------------------

noise = st.text(alphabet="0123456789 .,:;-_#()[]{}<>/=+*\n\t", max_size=300)  # cannot spell any phrase
sizes = st.integers(min_value=1, max_value=10_000_000)
OVERFLOWS = sorted(errors.OVERFLOW_FORMATS)


class ProviderHTTPError(Exception):
    """Shaped like litellm's and openai's exceptions: a message, a status code and the parsed body."""

    def __init__(self, message: str, status_code: int, body: object) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.body = body


def error_text(body: Any) -> str:
    inner = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(inner, dict):
        return str(inner.get("message") or json.dumps(body))
    return str(inner)


@st.composite
def overflows(draw: st.DrawFn) -> tuple[int, dict[str, Any]]:
    fmt = draw(st.sampled_from(OVERFLOWS))
    window = draw(sizes)
    # the output asked for leaves room for some prompt: a smaller prompt could fit (when the output alone
    # fills the window, it is a max_tokens problem no compaction fixes, and not an overflow: test_overflow)
    completion = draw(st.integers(0, max(0, window - 1)))
    response = errors.overflow_error(fmt, window + draw(sizes), window, completion)
    return response.status, response.body


@FUZZ
@given(error=overflows(), before=noise, after=noise, shape=st.integers(min_value=0, max_value=5))
def test_every_vendors_overflow_is_recognised_however_it_arrives(
    error: tuple[int, dict[str, Any]], before: str, after: str, shape: int
) -> None:
    status, body = error
    raw = json.dumps(body)
    text = error_text(body)
    wrapped = ProviderHTTPError(f"litellm.BadRequestError: OpenAIException - {raw}", status, body)
    chained = RuntimeError("the provider call failed")
    chained.__cause__ = wrapped
    ways = [
        lambda: is_context_overflow(message=before + text + after, status_code=status),
        lambda: is_context_overflow(body=body, status_code=status),
        lambda: is_context_overflow(body=before + raw + after, status_code=status),
        lambda: is_context_overflow(body=(before + raw).encode()),
        lambda: is_context_overflow(wrapped),
        lambda: is_context_overflow(chained),
    ]
    assert ways[shape](), f"not recognised: {status} {raw[:300]}"


@st.composite
def not_overflows(draw: st.DrawFn) -> tuple[int, Any]:
    which = draw(st.sampled_from(["rate_limit", "server", "overloaded", "auth", "bad_request", "tpm"]))
    if which == "rate_limit":
        response = errors.rate_limit_error(
            draw(st.sampled_from(["gpt-4o", "m"])), draw(st.none() | st.floats(0, 60))
        )
    elif which == "server":
        response = errors.server_error(draw(st.sampled_from([None, 500, 502, 503])))
    elif which == "overloaded":
        response = errors.overloaded_error(draw(st.sampled_from([None, 503, 529])))
    elif which == "auth":
        response = errors.auth_error()
    elif which == "bad_request":
        response = errors.bad_request(
            draw(st.sampled_from(["max_tokens is too large: 999999", "invalid model"]))
        )
    else:  # a per-minute token budget: "too large" for the quota, not for the window
        tokens = draw(sizes)
        message = (
            f"Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested {tokens}. "
            "The input or output tokens must be reduced in order to run successfully."
        )
        response = errors.ErrorResponse(429, {"error": {"message": message, "code": "rate_limit_exceeded"}})
    return response.status, response.body


@FUZZ
@given(error=not_overflows(), before=noise, after=noise)
def test_rate_limits_and_other_errors_are_never_overflows(
    error: tuple[int, Any], before: str, after: str
) -> None:
    status, body = error
    text = before + error_text(body) + after
    assert not is_context_overflow(message=text, status_code=status, body=body)
    assert not is_context_overflow(ProviderHTTPError(text, status, body))


class _Hostile(Exception):
    """An exception whose every attribute misbehaves."""

    def __init__(self, depth: int) -> None:
        super().__init__("hostile")
        self.depth = depth

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __getattribute__(self, name: str) -> Any:
        if name in ("message", "body", "status_code", "code", "response", "detail"):
            raise MemoryError(name) if object.__getattribute__(self, "depth") % 2 else ValueError(name)
        return object.__getattribute__(self, name)


def nested(depth: int, leaf: object) -> object:
    value: object = leaf
    for i in range(depth):
        value = {"error": value} if i % 2 else [value]
    return value


@FUZZ
@given(
    depth=st.integers(min_value=0, max_value=5_000),
    leaf=st.sampled_from(["prompt is too long", b"\xff\xfe", 413, None, float("nan"), "x" * 100_000]),
    status=st.none() | st.integers() | st.text(max_size=5),
    code=st.none() | st.text(max_size=300) | st.integers(),
)
def test_the_classifier_never_raises_on_hostile_input(
    depth: int, leaf: object, status: Any, code: Any
) -> None:
    body = nested(depth, leaf)
    cycle: dict[str, Any] = {"error": {}}
    cycle["error"]["error"] = cycle
    looped = ValueError("a")
    looped.__cause__ = ValueError("b")
    looped.__cause__.__cause__ = looped
    for error in (_Hostile(depth), looped, None):
        for candidate in (body, cycle, json.dumps(body, default=repr) if depth < 500 else "[" * depth):
            result = is_context_overflow(error, message=None, status_code=status, code=code, body=candidate)
            assert isinstance(result, bool)


def test_encoded_log_lines_have_no_raw_newlines() -> None:
    """The reader relies on one entry per line: no text can smuggle a newline into a line."""
    message = Message(role="user", parts=(TextPart("a\nb\r\nc\u2028d\x00"),))
    line = encode_entry(MessageEntry(id=message.id, parent_id=None, message=message))
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert msgspec.json.decode(line)["message"]["parts"][0]["text"] == "a\nb\r\nc\u2028d\x00"
