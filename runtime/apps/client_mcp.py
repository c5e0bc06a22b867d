"""The MCP servers and endpoints a client of ``agentcell serve`` names (design §9): what the server makes of them.

A client's server is the client's, not the host's: ``${NAME}`` in its ``env`` and ``headers`` is refused
(the host's environment holds its provider keys) and never expanded (``expand_env`` off, whatever the
client wrote); its ``url`` must be one the server's policy lists (``server.mcp_allowed_urls``), and unless
the policy names its host, every address it resolves to must be public (``public_only`` on: checked again
at every connection). A server identical to one of the runtime's own (``[mcp.servers]``) is the host's.
A client's ``api_base`` is judged the same way (:func:`endpoint_refusal`, ``server.api_base_allowed_urls``),
loopback and private addresses tolerated while ``server.api_base_private`` is on (the default: local model
servers); link-local and reserved ones (cloud metadata services) never, unless named.

Pure logic but for the DNS look-up, which the caller passes in (``resolve``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from runtime.config import McpServerConfig
from runtime.errors import AddressRefused
from runtime.outbound import check_public, match_url, url_host
from runtime.tools.mcp.servers import has_reference, redact_url

__all__ = ["client_server", "endpoint_refusal"]

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
        why = endpoint_refusal(where, server.url, allowed, "server.mcp_allowed_urls", resolve, "MCP server")
        if why is not None:
            return why
        public_only = match_url(server.url, allowed) == "open"
    return msgspec.structs.replace(server, expand_env=False, public_only=public_only)


def endpoint_refusal(
    where: str,
    url: str,
    allowed: list[str] | tuple[str, ...],
    setting: str,
    resolve: Resolve,
    what: str = "endpoint",
    tolerate: frozenset[str] = frozenset(),
) -> str | None:
    """Why a client's ``url`` is refused under the allow-list ``allowed`` (the setting ``setting``), or None:
    not listed, or (allowed by ``*`` only) at an address that is not public (nor of a kind ``tolerate``
    names)."""
    shown = redact_url(url)
    rule = match_url(url, allowed)
    if rule is None:
        hint = (
            f"this server lets sessions reach no {what} at a URL of their choosing (its operator can allow "
            f"some with {setting})"
            if not allowed
            else f"it is not among the URLs this server allows ({setting})"
        )
        return f"{where}: {shown}: {hint}"
    if rule == "open":
        host, port = url_host(url)
        try:
            check_public(host, resolve(host, port), tolerate)
        except AddressRefused as exc:
            if str(exc).startswith("cannot resolve"):
                return f"{where}: {shown}: {exc}"
            kinds = "link-local or reserved" if tolerate else "loopback, private or link-local"
            return (
                f"{where}: {shown}: {exc}; this server connects to {kinds} addresses for a client only where "
                f"its operator names the host in {setting}"
            )
    return None
