"""What the clients of ``agentcell serve`` may ask for (:class:`ServerPolicy`, design §9): the host's say."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from runtime.apps import LOCAL_API_KEY
from runtime.apps.server.bodies import HttpError
from runtime.config import Config, ConfigError, McpServerConfig, ServerConfig
from runtime.errors import SessionNotFound
from runtime.served import served
from runtime.tools.mcp.servers import restored

if TYPE_CHECKING:
    from runtime.apps import AnyRuntime

__all__ = ["ServerPolicy"]


class ServerPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the clients of a server may ask for (design §9): it is the host's, not theirs.

    ``workspace_root``: session workspaces must lie under it (None: sessions get no workspace).
    ``allow_shell``: a session's config may turn the shell tool on (``agent.shell_enabled``); with the
    shell on in the server's own config, every session has it anyway.
    ``allow_api_base``: a session may name an ``api_base`` without an ``api_key`` of its own. Without a key,
    litellm (and the native transport, which reads keys where litellm does) sends the provider key from the
    server's environment to that URL: allow it only when every token holder may have that key.
    ``allow_mcp_commands``: a session may start MCP servers over stdio, i.e. run a command of its choosing on
    the server's machine (the runtime's own ``[mcp.servers]`` are always allowed).
    ``mcp_allowed_urls``: the URLs a session's MCP servers may have (see :mod:`runtime.apps.client_mcp`:
    never ``${NAME}`` from the server's environment, never an internal address the list does not name).
    ``local_provider``: the URL of the built-in local provider (``serve --local``): a session that names no
    ``api_base`` runs against it (with its key), new sessions and resumed ones alike.
    """

    workspace_root: str | None = None
    allow_shell: bool = False
    allow_api_base: bool = False
    allow_mcp_commands: bool = False
    mcp_allowed_urls: tuple[str, ...] = ()
    api_base_allowed_urls: tuple[str, ...] = ("*",)
    api_base_private: bool = True
    local_provider: str | None = None

    def endpoint(self, api_base: str | None, api_key: str | None) -> tuple[str | None, str | None]:
        """The ``api_base`` and ``api_key`` a session runs with: the local provider's when the server has
        one and the request names no ``api_base``; else the request's."""
        if self.local_provider is not None and api_base is None:
            return self.local_provider, api_key or LOCAL_API_KEY
        return api_base, api_key

    @classmethod
    def from_config(cls, server: ServerConfig) -> ServerPolicy:
        root = server.workspace_root
        if root is not None:
            resolved = Path(root).expanduser().resolve()
            if not resolved.is_dir():
                raise ConfigError(f"invalid config: server.workspace_root: {resolved} is not a directory")
            root = str(resolved)
        return cls(
            workspace_root=root,
            allow_shell=server.allow_shell,
            allow_api_base=server.allow_api_base,
            allow_mcp_commands=server.allow_mcp_commands,
            mcp_allowed_urls=tuple(server.mcp_allowed_urls),
            api_base_allowed_urls=tuple(server.api_base_allowed_urls),
            api_base_private=server.api_base_private,
        )

    def workspace(self, requested: str | None) -> str | None:
        """The real workspace for a requested one (relative: under the root); 403 if the policy forbids it."""
        if requested is None:
            return None
        if self.workspace_root is None:
            raise HttpError(
                403,
                "this server gives sessions no workspace (its operator can allow workspaces under a "
                "directory with server.workspace_root or --workspace-root)",
            )
        root = Path(self.workspace_root)
        if "\x00" in requested:
            raise HttpError(400, "workspace: the path contains a NUL byte")
        real = (root / Path(requested).expanduser()).resolve()
        if real != root and not real.is_relative_to(root):
            raise HttpError(403, f"workspace {requested!r} is outside this server's workspace root ({root})")
        return str(real)

    def check_config(self, config: Config, runtime: Config) -> None:
        """403 when a session's effective ``config`` asks for more than the ``runtime``'s and the policy allow."""
        if config.agent.shell_enabled and not runtime.agent.shell_enabled and not self.allow_shell:
            raise HttpError(
                403,
                "agent.shell_enabled: this server does not let sessions run shell commands "
                "(its operator can allow it with server.allow_shell or --allow-shell)",
            )

    def check_mcp(
        self, servers: Mapping[str, McpServerConfig], runtime: Config
    ) -> dict[str, McpServerConfig]:
        """A client's MCP servers as its session gets them (``${NAME}`` never expanded, internal addresses
        refused: :func:`runtime.apps.client_mcp.client_server`); 403 for one the policy does not allow. The
        runtime's own servers (``[mcp.servers]``) are the operator's and always allowed. Blocking (DNS)."""
        from runtime.apps.client_mcp import client_server
        from runtime.outbound import resolve

        out: dict[str, McpServerConfig] = {}
        for name, server in servers.items():
            vetted = client_server(
                name,
                server,
                own=runtime.mcp.servers,
                allowed=self.mcp_allowed_urls,
                allow_commands=self.allow_mcp_commands,
                resolve=resolve,
            )
            if isinstance(vetted, str):
                raise HttpError(403, vetted)
            out[name] = vetted
        return out

    def check_api_base(
        self, api_base: str | None, api_key: str | None, session_id: str | None = None
    ) -> None:
        """403 when a session would run against ``api_base`` on the server's own provider keys."""
        if api_base is None or (api_key and api_key.strip()) or self.allow_api_base:
            return
        resume = (
            f'; resume it with its key (POST /sessions/{session_id}/resume {{"api_key": ...}})'
            if session_id is not None
            else ""
        )
        raise HttpError(
            403,
            "api_base: this server sends its own provider keys only to the endpoints its operator chose; "
            f"give your own api_key with an api_base{resume} (the operator can allow any api_base with "
            "server.allow_api_base or --allow-api-base)",
        )

    def check_endpoint(self, api_base: str | None) -> None:
        """403 unless a client's ``api_base`` is one ``server.api_base_allowed_urls`` allows, at a public
        address (or, with ``api_base_private``, a loopback or private one) unless the list names its host
        (:mod:`runtime.outbound`): never a cloud metadata service on a client's say-so. Blocking (DNS)."""
        if api_base is None:
            return
        from runtime.apps.client_mcp import endpoint_refusal
        from runtime.outbound import resolve

        tolerate = frozenset({"loopback", "private"}) if self.api_base_private else frozenset()
        setting = "server.api_base_allowed_urls"
        why = endpoint_refusal(
            "api_base", api_base, self.api_base_allowed_urls, setting, resolve, tolerate=tolerate
        )
        if why is not None:
            raise HttpError(403, why)

    def check_stored(
        self,
        runtime: AnyRuntime,
        session_id: str,
        workspace: str | None,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
    ) -> str | None:
        """Check a stored session against the policy before it is resumed; the workspace to resume it with
        (``workspace`` if the request names one, else the one it was stored with). ``api_base`` and
        ``api_key`` are the request's: a session stored with an endpoint needs a key to be resumed."""
        header = served(runtime).stored_header(session_id)
        if header is None:
            raise SessionNotFound(f"no session {session_id!r}")
        self.check_config(runtime.config.with_overrides(header.config), runtime.config)
        self.check_api_base(api_base if api_base is not None else header.api_base, api_key, session_id)
        self.check_endpoint(api_base)
        # a client's server (expand_env off) is checked as if given now, and so is one stored before servers
        # said whose they were (no expand_env: it may be a client's); the host's own for commands only
        stored = restored(header.mcp_servers)
        unsure = {k for k, v in header.mcp_servers.items() if isinstance(v, dict) and "expand_env" not in v}
        checked = {
            k: v for k, v in stored.items() if not v.expand_env or v.command is not None or k in unsure
        }
        self.check_mcp(checked, runtime.config)
        if workspace is not None:
            return self.workspace(workspace)
        if header.workspace is not None:
            self.workspace(header.workspace)
        return None
