"""Numbered lines of a text file, in parts: what ``read_file`` and ``read_saved`` show."""

from __future__ import annotations

import itertools
from typing import Final, TextIO

from runtime.tools.registry import ToolError

__all__ = ["MAX_LINE_CHARS", "numbered_lines"]

MAX_LINE_CHARS: Final = 2_000  # longer lines are cut


def numbered_lines(fh: TextIO, name: str, offset: int, limit: int) -> str:
    """Lines ``offset`` to ``offset + limit - 1`` of ``fh`` (1-based), each prefixed with its number and a
    tab, and a last line saying where to continue when more follow. ``name`` names the file in messages."""
    if offset < 1 or limit < 1:
        raise ToolError("offset and limit must be at least 1")
    out: list[str] = []
    for number, line in enumerate(itertools.islice(fh, offset - 1, offset - 1 + limit), start=offset):
        line = line.rstrip("\r\n")
        if len(line) > MAX_LINE_CHARS:
            line = f"{line[:MAX_LINE_CHARS]}… [line cut at {MAX_LINE_CHARS:,} of {len(line):,} chars]"
        out.append(f"{number:>6}\t{line}")
    remaining = sum(1 for _ in fh)
    total = offset - 1 + len(out) + remaining
    if not out:
        if total == 0:
            return f"[{name} is empty]"
        raise ToolError(f"offset {offset} is past the end of {name} ({total:,} lines)")
    last = offset + len(out) - 1
    if remaining:
        out.append(f"[lines {offset:,}-{last:,} of {total:,}; continue with offset={last + 1}]")
    return "\n".join(out)
