"""Tools (design §3.4): the registry, workspace confinement, the built-in tools and the executor; tools from
MCP servers (design §3.9) are in :mod:`runtime.tools.mcp`."""

from __future__ import annotations

from runtime.tools.builtin import builtin_registry
from runtime.tools.executor import ToolBatchHandle, ToolExecutor, ToolRunResult, context_factory
from runtime.tools.registry import Tool, ToolContext, ToolError, ToolRegistry, tool
from runtime.tools.workspace import Workspace, WorkspaceError

__all__ = [
    "Tool",
    "ToolBatchHandle",
    "ToolContext",
    "ToolError",
    "ToolExecutor",
    "ToolRegistry",
    "ToolRunResult",
    "Workspace",
    "WorkspaceError",
    "builtin_registry",
    "context_factory",
    "tool",
]
