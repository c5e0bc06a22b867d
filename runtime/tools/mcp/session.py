"""A session's MCP servers (design §3.9): their tools in the session's registry, their lifecycle.

:class:`McpServers` is what a session holds. Its servers' tools join the session's tool registry as
``NAME__tool`` :class:`~runtime.tools.registry.Tool` objects, so they go through the same executor as
every tool: parallel calls, the per-tool timeout (the server's ``timeout``, else ``agent.tool_timeout``),
output limits and spill files, approval (the session's hook, and every call of a server with
``require_approval``). A call runs on a tool worker thread, which hands it to the runtime's I/O loop and
waits; when the executor gives up on it (timeout, abort) the request is cancelled on the server.

When a turn starts, the agent asks :meth:`McpServers.refresh` for the tools: servers not running (never
started, stopped by hibernation, or dropped after a failure and not waiting out a restart delay) are
started and listed then, the turn waiting at most their startup timeout, so that the turn's calls do not
pay for it; a server that fails within a turn is started again by its next call. A server that cannot be
reached is reported (``mcp_server_error``) and its tools are left out or answer with errors: the session
goes on. :meth:`McpServers.stop` stops them all (the session stops or hibernates).

:class:`McpHub` knows every session's servers, so that stopping the runtime stops every server process.
Nothing here imports ``mcp`` at module level: :mod:`runtime.tools.mcp.client` is imported off the loop,
the first time a server is connected.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime import events as ev
from runtime.config import McpConfig, McpServerConfig
from runtime.tools.mcp.convert import check_schema, clip_description, convert_result, tool_names
from runtime.tools.registry import Tool, ToolContext, ToolError, ToolRegistry

if TYPE_CHECKING:
    from runtime.gateway import IoLoop
    from runtime.tools.mcp.client import ServerClient

log = logging.getLogger("agentcell.mcp")

_CTX: Final = "_agentcell_ctx"  # the keyword an MCP tool's function gets its ToolContext under
_POLL: Final = 0.1  # how often a waiting call looks whether the executor gave up on it (seconds)
_EXTENSIONS: Final = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp",
                      "audio/wav": ".wav", "audio/mpeg": ".mp3", "application/pdf": ".pdf", "text/plain": ".txt"}  # fmt: skip

Publish = Callable[[Any], Any]

_client_module: Any = None
_import_lock = threading.Lock()


def _import_client() -> Any:
    """``runtime.tools.mcp.client`` (which imports the ``mcp`` SDK: a second or more of CPU)."""
    global _client_module
    with _import_lock:
        if _client_module is None:
            try:
                _client_module = importlib.import_module("runtime.tools.mcp.client")
            except ImportError as exc:
                raise ImportError(
                    f"MCP servers need the mcp package ({exc}): pip install 'agentcell[mcp]'"
                ) from None
        return _client_module


class McpServers:
    """One session's MCP servers (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        servers: Mapping[str, McpServerConfig],
        settings: McpConfig,
        *,
        io: IoLoop,
        publish: Publish,
        base: ToolRegistry,
        workspace: Path | None,
        logs_dir: Path,
        hub: McpHub | None = None,
        cpus: frozenset[int] | None = None,
    ) -> None:
        self.session_id = session_id
        self.servers = {name: s for name, s in servers.items() if s.enabled}
        self.settings = settings
        self.io = io
        self.publish = publish
        self.base = base
        self.workspace = workspace
        self.logs_dir = logs_dir
        self.cpus = cpus  # where stdio servers run (None: where the OS puts them)
        self._clients: dict[str, ServerClient] = {}  # (touched on the I/O loop only)
        self._tools: dict[str, list[Tool]] = {}  # each server's tools as the model sees them
        self._unavailable: set[str] = set()  # servers that cannot be used at all (no mcp package)
        self._dirty = bool(self.servers)  # the registry must be rebuilt (tools listed or changed)
        self._stopping: concurrent.futures.Future[None] | None = None
        if hub is not None:
            hub.add(self)

    # -- from the agent ----------------------------------------------------------------------------------
    def needs_refresh(self) -> bool:
        """Whether the agent should call :meth:`refresh` before its turn's first request."""
        return self._dirty or any(self._connectable(name) for name in self.servers)

    def refresh(self, done: Callable[[ToolRegistry | None], None]) -> None:
        """Connect what should be, on the I/O loop; ``done(registry)`` with the session's new tool
        registry (None: unchanged). Never raises into ``done``'s caller: failures are events."""
        future = self.io.submit(self._refresh())

        def finished(f: concurrent.futures.Future[ToolRegistry | None]) -> None:
            try:
                registry = f.result()
            except BaseException:  # (cancelled as the runtime stops)
                log.debug("refreshing the MCP tools of %s failed", self.session_id, exc_info=True)
                registry = None
            done(registry)

        future.add_done_callback(finished)

    def stop(self) -> concurrent.futures.Future[None]:
        """Stop every server (a later use starts them again). Returns at once; the future says when done."""
        try:
            future = self.io.submit(self._stop_all())
        except RuntimeError:  # the I/O loop is closed: its closers stopped every connection already
            future = concurrent.futures.Future()
            future.set_result(None)
        self._stopping = future
        return future

    def wait_stopped(self, timeout: float = 15.0) -> None:
        """Wait for the last :meth:`stop` (from a plain thread)."""
        if self._stopping is not None:
            try:
                self._stopping.result(timeout)
            except Exception:
                log.warning("stopping the MCP servers of %s failed", self.session_id, exc_info=True)

    # -- on the I/O loop ---------------------------------------------------------------------------------
    def _connectable(self, name: str) -> bool:
        if name in self._unavailable:
            return False
        client = self._clients.get(name)
        if client is None:
            return True
        return (client.conn is None or client.tools_changed()) and client.backing_off() == 0

    async def _refresh(self) -> ToolRegistry | None:
        waits = []
        for name in self.servers:
            if not self._connectable(name):
                continue
            client = await self._client(name)
            if client is None:
                continue
            if client.conn is not None and client.tools_changed():
                waits.append(self._relist(client))
            else:  # never started, stopped (hibernation) or failed: start it before the turn's calls
                waits.append(self._connect(client))
        if waits:
            await asyncio.gather(*waits)
        if not self._dirty:
            return None
        self._dirty = False
        return self.registry()

    async def _client(self, name: str) -> ServerClient | None:
        client = self._clients.get(name)
        if client is not None:
            return client
        try:
            module = _client_module or await asyncio.to_thread(_import_client)
        except ImportError as exc:
            self._report(name, "start_failed", str(exc))
            self._unavailable.add(name)
            return None
        client = self._clients.get(name)  # (another refresh may have made it meanwhile)
        if client is None:
            client = self._clients[name] = module.ServerClient(
                name,
                self.servers[name],
                self.settings,
                cwd=self.workspace,
                logs_dir=self.logs_dir,
                report=lambda kind, message, **kw: self._report(name, kind, message, **kw),
                started=self._started,
                cpus=self.cpus,
            )
        return client

    async def _connect(self, client: ServerClient) -> None:
        try:
            await client.ensure()
        except Exception as exc:  # McpUnavailable: reported already
            log.debug("MCP server %s of %s: %s", client.name, self.session_id, exc)

    async def _relist(self, client: ServerClient) -> None:
        conn = client.conn
        if conn is None or conn.session is None:
            return
        conn.tools_changed = False
        try:
            module = _import_client()
            conn.tools = await asyncio.wait_for(
                module._list_tools(conn.session), self.settings.startup_timeout
            )
        except Exception as exc:
            self._report(
                client.name, "bad_result", f"MCP server {client.name!r}: listing its tools failed: {exc}"
            )
            return
        self._started(client)

    def _started(self, client: ServerClient) -> None:
        """A connection listed its tools: make them the session's (on the loop)."""
        conn = client.conn
        if conn is None:
            return
        tools = self._make_tools(client, conn.tools)
        self._tools[client.name] = tools
        self._dirty = True
        self.publish(
            ev.McpServerStarted(
                session_id=self.session_id,
                server=client.name,
                transport=client.config.transport,
                tools=[t.name for t in tools],
                restarts=client.connections - 1,
            )
        )

    def _make_tools(self, client: ServerClient, listed: list[Any]) -> list[Tool]:
        config = client.config
        wanted = set(config.tools) if config.tools is not None else None
        by_name = {t.name: t for t in listed if isinstance(t.name, str)}
        tools: list[Tool] = []
        for exposed, original in tool_names(client.name, by_name).items():
            if wanted is not None and original not in wanted:
                continue
            item = by_name[original]
            schema = check_schema(item.input_schema)
            if isinstance(schema, str):
                self._report(
                    client.name, "bad_tool", f"tool {original!r} is left out: {schema}", tool=original
                )
                continue
            tools.append(
                Tool(
                    name=exposed,
                    description=clip_description(item.description, self.settings.max_description_chars)
                    or f"{original} (a tool of the MCP server {client.name})",
                    parameters=schema,
                    fn=_Call(self, client.name, original),
                    timeout=config.timeout,
                    requires_approval=config.require_approval,
                    idempotent=item.idempotent,
                    context_param=_CTX,
                )
            )
        return tools

    def registry(self) -> ToolRegistry:
        """The base tools and every server's tools (a base tool keeps its name if a server's clashes)."""
        registry = ToolRegistry(self.base.tools())
        for name in self.servers:
            for t in self._tools.get(name, ()):
                if t.name not in registry:
                    registry.register(t)
        return registry

    async def _stop_all(self) -> None:
        clients = list(self._clients.values())
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)

    def _report(self, server: str, kind: str, message: str, **kw: Any) -> None:
        self.publish(
            ev.McpServerFailed(session_id=self.session_id, server=server, kind=kind, message=message, **kw)  # type: ignore[arg-type]
        )

    # -- a call, on a tool worker thread -----------------------------------------------------------------
    def call(self, server: str, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
        ctx.metadata.update(mcp_server=server, mcp_tool=tool)
        future = self.io.submit(self._call(server, tool, arguments, ctx.call_id))
        while True:
            try:
                result = future.result(timeout=_POLL)
                break
            except concurrent.futures.TimeoutError:
                if ctx.cancelled.is_set():  # the executor gave up (timeout, abort): cancel it on the server
                    future.cancel()
                    raise ToolError(f"the call of {tool!r} on MCP server {server!r} was cancelled") from None
            except concurrent.futures.CancelledError:
                raise ToolError(f"the call of {tool!r} on MCP server {server!r} was cancelled") from None
        converted = convert_result(result, lambda data, kind, mime: self._save(server, data, kind, mime))
        if converted.files:
            ctx.metadata["mcp_files"] = converted.files
        if converted.is_error:
            raise ToolError(converted.text or f"MCP tool {tool!r} failed (no message)")
        return converted.text

    async def _call(self, server: str, tool: str, arguments: dict[str, Any], call_id: str) -> Any:
        client = await self._client(server)
        if client is None:
            raise ToolError(f"MCP server {server!r} is not available (the mcp package is not installed)")
        module = _client_module
        try:
            return await client.call(tool, arguments, call_id)
        except module.McpUnavailable as exc:
            raise ToolError(str(exc)) from None

    def _save(self, server: str, data: bytes, kind: str, mime: str) -> tuple[str, str]:
        sha = hashlib.sha256(data).hexdigest()
        ext = _EXTENSIONS.get(mime.split(";")[0].strip().lower(), ".bin")
        path = self.logs_dir / f"mcp-{server}-{kind}-{sha[:16]}{ext}"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if not (path.exists() and path.stat().st_size == len(data)):
            tmp = path.with_name(f".{path.name}.{time.monotonic_ns()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        return str(path), sha


class _Call:
    """The function of an MCP tool: the arguments as the model gave them, checked by the server."""

    __slots__ = ("owner", "server", "tool")

    def __init__(self, owner: McpServers, server: str, tool: str) -> None:
        self.owner, self.server, self.tool = owner, server, tool

    def __call__(self, **kwargs: Any) -> str:
        ctx = kwargs.pop(_CTX)
        return self.owner.call(self.server, self.tool, kwargs, ctx)


class McpHub:
    """Every session's MCP servers in a runtime, so that :meth:`stop_all` leaves no server running."""

    def __init__(self) -> None:
        self._all: weakref.WeakSet[McpServers] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, servers: McpServers) -> None:
        with self._lock:
            self._all.add(servers)

    def stop_all(self, timeout: float = 15.0) -> None:
        """Stop every server of every session and wait (at most ``timeout`` seconds in all)."""
        with self._lock:
            every = list(self._all)
        futures = [s.stop() for s in every if s._clients]
        if futures:
            concurrent.futures.wait(futures, timeout)

    async def aclose(self) -> None:
        """:meth:`stop_all` on the I/O loop (run as it stops)."""
        with self._lock:
            every = list(self._all)
        await asyncio.gather(*(s._stop_all() for s in every if s._clients), return_exceptions=True)
