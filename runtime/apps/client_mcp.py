"""The MCP servers a client of ``agentcell serve`` gives its session (design §9): what the server makes of them.

A client's server is the client's, not the host's: ``${NAME}`` in its ``env`` and ``headers`` is refused
(the host's environment holds its provider keys) and never expanded (``expand_env`` off, whatever the
client wrote); its ``url`` must be one the server's policy lists (``server.mcp_allowed_urls``), and unless
the policy names its host, every address it resolves to must be public (``public_only`` on: checked again
at every connection). A server identical to one of the runtime's own (``[mcp.servers]``) is the host's.

Pure logic but for the DNS look-up, which the caller passes in (``resolve``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from runtime.config import McpServerConfig
from runtime.errors import AddressRefused
from runtime.outbound import check_public, match_url, url_host
from runtime.tools.mcp.servers import has_reference, redact_url

__all__ = ["client_server"]

Resolve = Callable[[str, int], list[str]]

_FORBIDDEN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def client_server(
    name: str,
    server: McpServerConfig,
    *,
    own: Mapping[str, McpServerConfig],
    allowed: list[str] | tuple[str, ...],
    allow_commands: bool,
    resolve: Resolve,
) -> McpServerConfig | str:
    """``server`` as the client's session gets it, or why it is refused (a message for a 403)."""
    if own.get(name) == server:
        return server  # the runtime's own, given by name: the host's
    where = f"mcp_servers.{name}"
    if server.command is not None and not allow_commands:
        return (
            f"{where}: this server does not let sessions run commands (MCP servers over stdio); give a url, "
            "or its operator can allow commands with server.allow_mcp_commands"
        )
    for kind, values in (("env", server.env), ("headers", server.headers)):
        for key, value in values.items():
            if has_reference(value):
                return (
                    f"{where}.{kind}.{key}: this server does not expand ${{NAME}} in a client's MCP servers (it "
                    "would send the server's own environment, its keys, to the MCP server); give the value itself"
                )
    for key in server.headers:
        if key.lower() in _FORBIDDEN_HEADERS:
            return f"{where}.headers.{key}: a client's MCP server may not set this header"
    public_only = False
    if server.url is not None:
        shown = redact_url(server.url)
        rule = match_url(server.url, allowed)
        if rule is None:
            hint = (
                "this server lets sessions reach no MCP server at a URL (its operator can allow some with "
                "server.mcp_allowed_urls)"
                if not allowed
                else "it is not among the URLs this server allows (server.mcp_allowed_urls)"
            )
            return f"{where}: {shown}: {hint}"
        if rule == "open":
            host, port = url_host(server.url)
            try:
                check_public(host, resolve(host, port))
            except AddressRefused as exc:
                return (
                    f"{where}: {shown}: {exc}; this server connects to loopback, private or link-local "
                    "addresses for a client only where its operator names the host in server.mcp_allowed_urls"
                )
            public_only = True
    return msgspec.structs.replace(server, expand_env=False, public_only=public_only)
