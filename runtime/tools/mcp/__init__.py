"""Tools from Model Context Protocol servers (design §3.9), through the official ``mcp`` SDK.

- :mod:`.servers`: server definitions (config, command lines, what a session log keeps of them);
- :mod:`.convert`: tool names, schemas and results as the model sees them (pure);
- :mod:`.session`: a session's servers and their tools in its registry; the runtime's hub;
- :mod:`.client`: connections on the runtime's I/O loop (the only module that imports ``mcp``).

Importing this package does not import ``mcp``: that happens the first time a server is connected.
"""

from __future__ import annotations

from runtime.tools.mcp.servers import parse_command_line, parse_servers
from runtime.tools.mcp.session import McpHub, McpServers

__all__ = ["McpHub", "McpServers", "parse_command_line", "parse_servers"]
