"""agentcell's exceptions.

Tool errors live here rather than in :mod:`runtime.tools.registry` so that the registry and the workspace
(whose :class:`WorkspaceError` is a :class:`ToolError`) both import them without importing each other.
"""

from __future__ import annotations

__all__ = ["ToolError", "WorkspaceError"]


class ToolError(Exception):
    """A failure a tool reports on purpose: its message is shown to the model as it is."""


class WorkspaceError(ToolError):
    """A path that is not allowed: the message says which and why."""
