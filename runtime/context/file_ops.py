"""File-operation tracking across compactions (design §5.7).

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

from runtime.messages import Message, ToolCallPart

__all__ = [
    "MAX_RENDERED_FILES",
    "MODIFIED_FILES_KEY",
    "MODIFY_TOOLS",
    "READ_FILES_KEY",
    "READ_TOOLS",
    "FileOps",
    "extract_file_ops",
    "normalize_path",
]


READ_TOOLS: Final = frozenset({"read_file"})
MODIFY_TOOLS: Final = frozenset({"write_file", "edit_file"})

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
    calls: list[ToolCallPart] = []
    failed: set[str | None] = set()
    for msg in messages:
        if msg.role == "assistant":
            calls += [p for p in msg.parts if type(p) is ToolCallPart]
        elif msg.role == "tool" and msg.is_error:
            failed.add(msg.tool_call_id)
    read: set[str] = set()
    modified: set[str] = set()
    for call in calls:
        target = modified if call.name in modify_tools else read if call.name in read_tools else None
        if target is None or call.id in failed:
            continue
        path = _call_path(call.arguments)
        if path is not None:
            target.add(path)
    return FileOps(read=frozenset(read - modified), modified=frozenset(modified))


def normalize_path(path: str) -> str:
    """One spelling per file: ``./a//b/../c.py`` and ``a/c.py`` are the same entry."""
    if "\\" in path or "//" in path or "/." in path or path.startswith(".") or path.endswith("/"):
        return posixpath.normpath(path.replace("\\", "/"))
    return path  # already normal: most paths, and normpath is slow enough to matter on long histories


class _PathArguments(msgspec.Struct):
    """The path-like arguments of a file tool call; every other argument is skipped while decoding."""

    path: Any = None
    file_path: Any = None
    filename: Any = None


_arguments_decoder = msgspec.json.Decoder(_PathArguments)


def _call_path(arguments: str) -> str | None:
    try:
        args = _arguments_decoder.decode(arguments or "{}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    for value in (args.path, args.file_path, args.filename):
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
