"""Workspace confinement for file tools (design §3.4, 9).

A :class:`Workspace` turns a path the model wrote into a real path inside the session's workspace, or
refuses it with a :class:`WorkspaceError` that says why: a NUL byte, a ``..`` that climbs out, an
absolute path elsewhere, or a symbolic link (anywhere along the path, dangling or not) that leads out.
``..`` that stays inside (``src/../README.md``) is fine.

The check resolves symlinks and then tests containment, so it holds against links that exist when the
path is resolved. A link swapped in between the check and the use (a race with another process that can
write to the workspace) is outside what a path check can prevent.
"""

from __future__ import annotations

import os
from pathlib import Path

from runtime.errors import WorkspaceError

__all__ = ["Workspace", "WorkspaceError"]


class Workspace:
    """A directory that file tools are confined to."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise WorkspaceError(f"workspace {path} is not a directory")
        self.root = path.resolve()

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """The real path of ``path`` (relative to the root, or absolute inside it); refuses escapes."""
        text = os.fspath(path)
        if "\x00" in text:
            raise WorkspaceError("path contains a NUL byte")
        text = text.strip() or "."
        given = Path(text)
        candidate = given if given.is_absolute() else self.root / given
        lexical = Path(os.path.normpath(candidate))
        if not self._inside(lexical):
            if given.is_absolute():
                raise WorkspaceError(f"{text}: absolute path outside the workspace ({self.root})")
            raise WorkspaceError(f"{text}: path escapes the workspace with '..' (workspace: {self.root})")
        try:
            real = candidate.resolve()
        except (OSError, RuntimeError) as exc:  # symlink loops
            raise WorkspaceError(f"{text}: cannot resolve path ({exc})") from None
        if not self._inside(real):
            raise WorkspaceError(f"{text}: a symbolic link leads outside the workspace (to {real})")
        return real

    def relative(self, path: str | os.PathLike[str]) -> str:
        """``path`` (already inside) relative to the root, with '/' separators; '.' for the root."""
        rel = Path(path).relative_to(self.root) if Path(path).is_absolute() else Path(path)
        text = rel.as_posix()
        return text if text not in ("", ".") else "."

    def contains(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` resolves inside the workspace (no exception)."""
        try:
            self.resolve(path)
        except WorkspaceError:
            return False
        return True

    def _inside(self, path: Path) -> bool:
        return path == self.root or path.is_relative_to(self.root)
