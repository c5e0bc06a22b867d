"""File-operation tracking across compactions (SPEC 5.7).

The read/write/edit tool calls of a conversation say which files the agent has looked at and which it
changed. A summary carries both sets in its metadata (``read_files`` / ``modified_files``) and renders them
as ``<read-files>`` / ``<modified-files>`` blocks, so the thread of the work survives compaction. Sets are
merged across compactions, and a file that was read and also modified is listed as modified only.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from runtime.messages import Message

READ_TOOLS: Final = frozenset({"read_file"})
MODIFY_TOOLS: Final = frozenset({"write_file", "edit_file"})
PATH_ARGUMENTS: Final = ("path", "file_path", "filename")

READ_FILES_KEY: Final = "read_files"
MODIFIED_FILES_KEY: Final = "modified_files"

# Rendering a session that touched thousands of files would bloat every summary; the metadata keeps all.
MAX_RENDERED_FILES: Final = 200


class FileOps(msgspec.Struct, frozen=True):
    """The files a conversation read and modified. ``read`` never contains a modified file."""

    read: frozenset[str] = frozenset()
    modified: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.read or self.modified)

    def merge(self, other: FileOps) -> FileOps:
        """Both histories together; a file modified in either is modified only."""
        modified = self.modified | other.modified
        return FileOps(read=(self.read | other.read) - modified, modified=modified)

    def to_metadata(self) -> dict[str, list[str]]:
        """The summary-message metadata form: sorted lists under ``read_files`` / ``modified_files``."""
        return {READ_FILES_KEY: sorted(self.read), MODIFIED_FILES_KEY: sorted(self.modified)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> FileOps:
        """Read the sets back from a summary's metadata; missing or malformed entries count as empty."""
        read = _paths(metadata.get(READ_FILES_KEY))
        modified = _paths(metadata.get(MODIFIED_FILES_KEY))
        return cls(read=read - modified, modified=modified)

    def render(self, *, limit: int = MAX_RENDERED_FILES) -> str:
        """The ``<read-files>`` and ``<modified-files>`` blocks (each omitted when empty)."""
        blocks = []
        if self.read:
            blocks.append(_block("read-files", self.read, limit))
        if self.modified:
            blocks.append(_block("modified-files", self.modified, limit))
        return "\n\n".join(blocks)


def extract_file_ops(
    messages: Iterable[Message],
    *,
    read_tools: frozenset[str] = READ_TOOLS,
    modify_tools: frozenset[str] = MODIFY_TOOLS,
) -> FileOps:
    """The file operations of ``messages``' tool calls.

    A call counts unless its result (when present among ``messages``) is an error: a failed write did not
    modify anything. Calls with malformed arguments or without a path argument are ignored.
    """
    msgs = list(messages)
    failed = {m.tool_call_id for m in msgs if m.role == "tool" and m.is_error}
    read: set[str] = set()
    modified: set[str] = set()
    for msg in msgs:
        if msg.role != "assistant":
            continue
        for call in msg.tool_calls:
            if call.id in failed:
                continue
            target = modified if call.name in modify_tools else read if call.name in read_tools else None
            if target is None:
                continue
            path = _call_path(call.arguments)
            if path is not None:
                target.add(path)
    return FileOps(read=frozenset(read - modified), modified=frozenset(modified))


def normalize_path(path: str) -> str:
    """One spelling per file: ``./a//b/../c.py`` and ``a/c.py`` are the same entry."""
    return posixpath.normpath(path.replace("\\", "/"))


def _call_path(arguments: str) -> str | None:
    try:
        args = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return None
    if not isinstance(args, dict):
        return None
    for key in PATH_ARGUMENTS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return normalize_path(value.strip())
    return None


def _paths(value: Any) -> frozenset[str]:
    if not isinstance(value, list | tuple | set | frozenset):
        return frozenset()
    return frozenset(normalize_path(p) for p in value if isinstance(p, str) and p)


def _block(tag: str, paths: frozenset[str], limit: int) -> str:
    ordered = sorted(paths)
    lines = ordered[:limit]
    if len(ordered) > limit:
        lines.append(f"... and {len(ordered) - limit} more")
    return f"<{tag}>\n" + "\n".join(lines) + f"\n</{tag}>"
