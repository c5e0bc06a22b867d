"""``read_saved``: the model reads its own saved outputs and artifacts, read-only, by id, in parts.

A tool result too large for the context is saved in the session's spill folder (``<id>.spill/``, beside
the log, with the shell's full logs) and a compaction's summarizer input and summary in its artifacts
folder (``<id>.artifacts/``); a clipped result names the file by its id, its plain file name. Those folders
are under the sessions folder, outside the workspace (always so under ``agentcell serve``), where the file
tools cannot go and should not: this tool reads the two folders of the running session and nothing else.
An id is a plain file name (no separator, no leading dot); symbolic links and files with other hard links
are refused, so nothing placed there can lead outside.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Final

from runtime.tools._lines import numbered_lines
from runtime.tools.registry import ToolContext, ToolError, tool

__all__ = ["READ_SAVED", "read_saved", "saved_ids"]

READ_SAVED: Final = "read_saved"
_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_LISTED: Final = 40  # ids an error lists at most


@tool(name=READ_SAVED, idempotent=True)
def read_saved(id: str, offset: int = 1, limit: int = 200, *, ctx: ToolContext) -> str:
    """Read, in numbered lines, a saved output of this session (a clipped result's full text, a shell log,
    a compaction summary) by the id its notice gives.

    Args:
        id: The id the notice gives.
        offset: Line number to start from (1 = first line).
        limit: Maximum number of lines to return.
    """
    if not ctx.saved_dirs:
        raise ToolError("this session keeps no saved outputs")
    if not _ID.fullmatch(id):
        raise ToolError(f"{id!r} is not the id of a saved output (ids are plain file names){_known(ctx)}")
    for folder in ctx.saved_dirs:
        try:
            fd = os.open(folder / id, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(f"{id} is a symbolic link; read_saved reads saved files only") from None
            raise ToolError(f"{id} cannot be read: {exc.strerror or exc}") from None
        with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                raise ToolError(f"{id} is not a saved file")
            return numbered_lines(fh, id, offset, limit)
    raise ToolError(f"no saved output {id!r}{_known(ctx)}")


def saved_ids(folders: tuple[Path, ...]) -> list[str]:
    """The ids of the saved outputs in ``folders``, sorted."""
    ids: set[str] = set()
    for folder in folders:
        try:
            ids.update(n for n in os.listdir(folder) if _ID.fullmatch(n))
        except OSError:
            continue
    return sorted(ids)


def _known(ctx: ToolContext) -> str:
    ids = saved_ids(ctx.saved_dirs)
    if not ids:
        return "; this session has no saved outputs yet"
    more = f" and {len(ids) - _LISTED:,} more" if len(ids) > _LISTED else ""
    return "; saved: " + ", ".join(ids[:_LISTED]) + more
