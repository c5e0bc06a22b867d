"""Tool output limits and spill (design §3.5, reference 001) — pure functions.

Every tool result, successful or not, goes through :func:`limit_output` before it is stored:

1. Output over ``spill_threshold_chars`` is not put in the context at all. It is handed back as a
   :class:`SpillRequest` (content, SHA-256, file path) for the caller to write with :func:`write_spill`,
   and the result text becomes a notice naming the file and its checksum, plus a short preview.
2. Otherwise it is truncated by lines (``max_lines``), then by characters (``max_chars``), then by UTF-8
   bytes (``max_bytes``, never splitting a character). ``head_tail`` keeps the beginning and the end with a
   marker saying how much was omitted in between (the marker counts towards the limit); ``head`` keeps the
   beginning. With fewer than 4 lines allowed, line truncation keeps the head whatever the mode.
3. When anything was cut, a notice is appended stating the lines, characters and bytes before and after.
   The limits bound the kept content; the notice (under 200 bytes) comes on top.

:func:`decode_output` turns raw bytes (binary, invalid UTF-8) into text first.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from runtime.config import ToolOutputConfig

__all__ = ["LimitedOutput", "SpillRequest", "count_lines", "decode_output", "limit_output", "write_spill"]


_HASH_CHUNK: Final = 1 << 20  # characters hashed (and written) per step: memory stays flat on 100 MB
_PREVIEW_LINES: Final = 20
_PREVIEW_CHARS: Final = 2_000
_BINARY_SNIFF: Final = 8 * 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class SpillRequest(msgspec.Struct, frozen=True):
    """Output too large for the context: what to write, where, and its checksum."""

    content: str
    sha256: str
    path: Path
    chars: int
    bytes: int

    @property
    def file_name(self) -> str:
        return self.path.name


class LimitedOutput(msgspec.Struct, frozen=True):
    """The text to put in the tool result, and what happened to the original."""

    text: str
    truncated: bool
    spill: SpillRequest | None
    original_chars: int
    original_bytes: int
    original_lines: int
    notice: str | None = None


def limit_output(
    text: str,
    config: ToolOutputConfig | None = None,
    *,
    spill_dir: str | os.PathLike[str] | None = None,
    label: str = "tool",
    allow_spill: bool = True,
    reader: str | None = None,
) -> LimitedOutput:
    """Apply the tool output limits of ``config`` to ``text`` (see the module docstring for the order).

    ``spill_dir`` is where a spill file would go (else ``config.spill_dir``, else the system temp
    directory); nothing is written here. ``label`` (a tool or call name) prefixes the spill file's name.
    ``allow_spill=False`` truncates instead of spilling (for when the spill file cannot be written).
    ``reader`` names the tool the model reads a saved output with (``read_saved``): the notice then tells
    it how, by the file's name (its id), in parts.
    """
    cfg = config or ToolOutputConfig()
    chars = len(text)
    lines = count_lines(text)
    if allow_spill and chars > cfg.spill_threshold_chars:
        return _spill(text, cfg, lines, spill_dir, label, reader)

    text = _encodable(text)
    size = _utf8_len(text)
    if lines <= cfg.max_lines and chars <= cfg.max_chars and size <= cfg.max_bytes:
        return LimitedOutput(text, False, None, chars, size, lines)

    head_tail = cfg.mode == "head_tail"
    kept = text
    if lines > cfg.max_lines:
        kept = _cut_lines(kept, cfg.max_lines, head_tail and cfg.max_lines >= 4)
    if len(kept) > cfg.max_chars:
        kept = _cut_chars(kept, cfg.max_chars, head_tail)
    if _utf8_len(kept) > cfg.max_bytes:
        kept = _cut_bytes(kept, cfg.max_bytes, head_tail)

    notice = (
        f"[Output truncated ({'head and tail kept' if head_tail else 'head kept'}): "
        f"lines {lines:,} → {count_lines(kept):,}; chars {chars:,} → {len(kept):,}; "
        f"bytes {size:,} → {_utf8_len(kept):,}]"
    )
    separator = "" if kept.endswith("\n") or not kept else "\n"
    return LimitedOutput(f"{kept}{separator}{notice}", True, None, chars, size, lines, notice)


def write_spill(spill: SpillRequest) -> Path:
    """Write a spill file at ``spill.path`` (the path the notice names), atomically; return the path.

    The content is written in chunks, so a 100 MB output never exists twice in memory. Files are named
    by content hash: writing the same output twice keeps one file.
    """
    path = spill.path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size == spill.bytes:
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".spill-")
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in _encoded_chunks(spill.content):
                fh.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def decode_output(data: bytes | bytearray | memoryview) -> str:
    """Raw process or file output as text: invalid UTF-8 becomes U+FFFD; binary data gets a notice.

    Output counts as binary when its first 8 KiB hold a NUL byte; control characters are then shown as
    U+FFFD too, so the model (and JSON encoders downstream) see clean text.
    """
    raw = bytes(data)
    text = raw.decode("utf-8", errors="replace")
    if b"\x00" not in raw[:_BINARY_SNIFF]:
        return text
    bad = text.count("\ufffd") + len(_CONTROL.findall(text[:_BINARY_SNIFF]))
    clean = _CONTROL.sub("\ufffd", text)
    return (
        f"[binary output: {len(raw):,} bytes, not valid text (about {bad:,} non-text bytes in the first "
        f"{min(len(raw), _BINARY_SNIFF):,}); non-text bytes are shown as \ufffd]\n{clean}"
    )


def count_lines(text: str) -> int:
    """Lines as a reader counts them: a trailing newline does not start a new line; '' has 0 lines."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


# ---------------------------------------------------------------------------------------------------


def _spill(
    text: str,
    cfg: ToolOutputConfig,
    lines: int,
    spill_dir: str | os.PathLike[str] | None,
    label: str,
    reader: str | None,
) -> LimitedOutput:
    digest = hashlib.sha256()
    size = 0
    for chunk in _encoded_chunks(text):
        digest.update(chunk)
        size += len(chunk)
    sha = digest.hexdigest()
    directory = Path(spill_dir) if spill_dir is not None else _default_spill_dir(cfg)
    path = directory / f"{_safe_label(label)}-{sha[:16]}.txt"
    spill = SpillRequest(text, sha, path, len(text), size)
    preview = _preview(text)
    shown = count_lines(preview)
    if reader is not None:
        whole = text.startswith(preview + "\n") or len(preview) == len(text)  # its last line uncut
        saved = (
            f'The full output is saved as "{path.name}" (SHA-256 {sha}): read it in parts with '
            f'{reader}(id="{path.name}", offset={shown + 1 if whole else max(1, shown)}, limit=200). '
        )
    else:
        saved = f"The full output was saved to {path} (SHA-256 {sha}). "
    notice = (
        f"[Output too large for the context: {len(text):,} chars, {size:,} bytes, {lines:,} lines. "
        f"{saved}Showing the first {shown:,} lines.]"
    )
    return LimitedOutput(f"{notice}\n{preview}", True, spill, len(text), size, lines, notice)


def _preview(text: str) -> str:
    head = text[: _PREVIEW_CHARS * 2]
    kept = head.split("\n", _PREVIEW_LINES)[:_PREVIEW_LINES]
    preview = _encodable("\n".join(kept)[:_PREVIEW_CHARS])
    return preview


def _default_spill_dir(cfg: ToolOutputConfig) -> Path:
    if cfg.spill_dir:
        return Path(cfg.spill_dir).expanduser()
    return Path(tempfile.gettempdir()) / "agentcell_tool_outputs"


def _safe_label(label: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("._")
    return safe[:48] or "tool"


def _encoded_chunks(text: str) -> Iterator[bytes]:
    """UTF-8 encoding of ``text`` in 1 Mi-character pieces (lone surrogates become '?')."""
    for start in range(0, len(text), _HASH_CHUNK):
        yield text[start : start + _HASH_CHUNK].encode("utf-8", errors="replace")


def _encodable(text: str) -> str:
    """``text`` with lone surrogates (e.g. from ``surrogateescape``) replaced, so it encodes as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def _utf8_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", errors="replace"))


def _marker(amount: int, unit: str) -> str:
    return f"\n[... {amount:,} {unit} omitted ...]\n"


def _cut_lines(text: str, limit: int, head_tail: bool) -> str:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if not head_tail:
        return "\n".join(lines[:limit]) + "\n"
    keep = limit - 1  # the marker takes a line
    head, tail = (keep + 1) // 2, keep // 2
    marker = f"[... {len(lines) - head - tail:,} lines omitted ...]"
    return "\n".join([*lines[:head], marker, *lines[len(lines) - tail :]]) + "\n"


def _halves(total: int, limit: int, unit: str) -> tuple[int, int] | None:
    """Head and tail sizes for head_tail cutting, leaving room for the marker; None if it cannot fit."""
    room = limit - len(_marker(total, unit))  # the marker can only be shorter than this one
    if room < 2:
        return None
    return (room + 1) // 2, room // 2


def _cut_chars(text: str, limit: int, head_tail: bool) -> str:
    halves = _halves(len(text), limit, "chars") if head_tail else None
    if halves is None:
        return text[:limit]
    head, tail = halves
    return text[:head] + _marker(len(text) - head - tail, "chars") + text[len(text) - tail :]


def _cut_bytes(text: str, limit: int, head_tail: bool) -> str:
    data = text.encode("utf-8")
    halves = _halves(len(data), limit, "bytes") if head_tail else None
    if halves is None:
        return data[:limit].decode("utf-8", errors="ignore")
    # 'ignore' drops a character split by the cut: the head loses its last, the tail its first.
    head = data[: halves[0]].decode("utf-8", errors="ignore")
    tail = data[len(data) - halves[1] :].decode("utf-8", errors="ignore")
    omitted = len(data) - _utf8_len(head) - _utf8_len(tail)
    return head + _marker(omitted, "bytes") + tail
