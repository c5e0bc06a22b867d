"""Tool output limits and spill (design §3.5): each limit, each mode, multi-byte text, the spill file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from runtime.config import ToolOutputConfig
from runtime.context.tool_output import count_lines, decode_output, limit_output, write_spill


def numbered(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


def test_output_within_limits_is_untouched() -> None:
    text = numbered(10)
    out = limit_output(text, ToolOutputConfig())
    assert out.text == text
    assert not out.truncated and out.spill is None and out.notice is None
    assert (out.original_lines, out.original_chars, out.original_bytes) == (10, len(text), len(text))


def test_default_limits_are_the_specs() -> None:
    cfg = ToolOutputConfig()
    assert (cfg.max_lines, cfg.max_bytes, cfg.max_chars, cfg.spill_threshold_chars, cfg.mode) == (
        2_000,
        50 * 1024,
        200 * 1024,
        200 * 1024,
        "head_tail",
    )


def test_line_limit_head_tail_keeps_both_ends_with_a_marker() -> None:
    out = limit_output(numbered(100), ToolOutputConfig(max_lines=10, mode="head_tail"))
    kept = out.text.split("\n")
    assert out.truncated
    assert kept[:5] == [f"line {i}" for i in range(1, 6)]
    assert kept[5] == "[... 91 lines omitted ...]"
    assert kept[6:10] == [f"line {i}" for i in range(97, 101)]
    assert count_lines(out.text[: out.text.index("[Output truncated")]) == 10
    assert "lines 100 → 10" in out.text


def test_line_limit_head_mode_keeps_the_head() -> None:
    out = limit_output(numbered(100), ToolOutputConfig(max_lines=10, mode="head"))
    body = out.text[: out.text.index("[Output truncated")]
    assert body == numbered(10)
    assert "omitted" not in out.text and "head kept" in out.text


def test_head_tail_with_fewer_than_four_lines_falls_back_to_head() -> None:
    out = limit_output(numbered(50), ToolOutputConfig(max_lines=3, mode="head_tail"))
    assert out.text.startswith("line 1\nline 2\nline 3\n[Output truncated")


@pytest.mark.parametrize("mode", ["head_tail", "head"])
def test_char_limit(mode: str) -> None:
    text = "a" * 5_000 + "Z" * 5_000
    cfg = ToolOutputConfig(max_chars=1_000, max_bytes=100_000, mode=mode)  # type: ignore[arg-type]
    out = limit_output(text, cfg)
    body = out.text[: out.text.index("\n[Output truncated")]
    assert len(body) <= 1_000
    assert body.startswith("a" * 400)
    assert body.endswith("Z" * 400) == (mode == "head_tail")
    assert "chars 10,000 → " in out.notice  # type: ignore[operator]


@pytest.mark.parametrize("mode", ["head_tail", "head"])
def test_byte_limit_never_splits_a_multibyte_character(mode: str) -> None:
    text = "€" * 10_000  # 3 bytes each: 30,000 bytes in 10,000 chars, under the char limit
    cfg = ToolOutputConfig(max_bytes=1_000, mode=mode)  # type: ignore[arg-type]
    out = limit_output(text, cfg)
    body = out.text[: out.text.index("\n[Output truncated")]
    assert len(body.encode("utf-8")) <= 1_000
    assert "\ufffd" not in body
    assert set(body.replace("\n", "").split("[")[0]) == {"€"}
    assert out.original_bytes == 30_000 and out.original_chars == 10_000
    assert "bytes 30,000 → " in out.text
    # an odd budget that falls inside a character still yields whole characters
    odd = limit_output("é" * 1_000, ToolOutputConfig(max_bytes=101, mode=mode))  # type: ignore[arg-type]
    odd_body = odd.text[: odd.text.index("\n[Output truncated")]
    assert len(odd_body.encode()) <= 101 and "\ufffd" not in odd_body


def test_limits_apply_in_order_lines_then_chars_then_bytes() -> None:
    text = "".join(f"{'ü' * 50}\n" for _ in range(5_000))  # 5,000 lines, 255,000 chars, 505,000 bytes
    cfg = ToolOutputConfig(spill_threshold_chars=1_000_000)
    out = limit_output(text, cfg)
    body = out.text[: out.text.index("[Output truncated")]
    assert count_lines(body) <= cfg.max_lines
    assert len(body) <= cfg.max_chars
    assert len(body.encode()) <= cfg.max_bytes
    assert "lines 5,000 → " in out.text and "bytes 505,000 → " in out.text


def test_spill_over_threshold(tmp_path: Path) -> None:
    text = "".join(f"row {i} ✓ ünïcödé\n" for i in range(20_000))
    cfg = ToolOutputConfig(spill_threshold_chars=100_000)
    out = limit_output(text, cfg, spill_dir=tmp_path, label="grep")
    assert out.truncated and out.spill is not None
    expected_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert out.spill.sha256 == expected_sha
    assert out.spill.bytes == len(text.encode("utf-8")) and out.spill.chars == len(text)
    assert not out.spill.path.exists()  # limit_output is pure: it writes nothing
    assert str(out.spill.path) in out.text and expected_sha in out.text
    assert out.text.count("\n") < 30  # a notice and a short preview, not the output
    assert "row 0 ✓" in out.text
    path = write_spill(out.spill)
    assert path == tmp_path / out.spill.file_name and path.name.startswith("grep-")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected_sha
    assert path.read_text(encoding="utf-8") == text
    assert write_spill(out.spill) == path  # same content: same file


def test_spill_can_be_refused_then_output_is_truncated() -> None:
    text = "x" * 300_000
    out = limit_output(text, ToolOutputConfig(), allow_spill=False)
    assert out.spill is None and out.truncated
    assert len(out.text) < 60 * 1024


def test_errors_and_odd_text_are_limited_too() -> None:
    error = "Error: Traceback\n" + "  frame\n" * 10_000
    out = limit_output(error, ToolOutputConfig())
    assert out.truncated and out.text.startswith("Error: Traceback")
    lone_surrogate = "bad \udcff byte" * 3
    cleaned = limit_output(lone_surrogate, ToolOutputConfig())
    cleaned.text.encode("utf-8")  # encodable: a lone surrogate would make every JSON encoder fail
    assert "bad " in cleaned.text


def test_empty_output() -> None:
    out = limit_output("", ToolOutputConfig())
    assert out.text == "" and out.original_lines == 0 and not out.truncated


def test_decode_output_invalid_utf8_and_binary() -> None:
    assert decode_output("héllo".encode()) == "héllo"
    assert decode_output(b"ok \xff\xfe end") == "ok \ufffd\ufffd end"
    binary = decode_output(b"\x7fELF\x02\x01\x00\x00\x00" + bytes(range(256)))
    assert binary.startswith("[binary output: 265 bytes")
    assert "\x00" not in binary and "\x01" not in binary
    binary.encode("utf-8")
