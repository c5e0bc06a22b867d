"""One session's connection to one MCP server (design §3.9), through the official ``mcp`` SDK's client.

Everything here runs on the runtime's I/O loop (the asyncio loop the gateway uses), never on an actor's
dispatcher thread. This module imports ``mcp``: :mod:`runtime.tools.mcp.session` imports it off the loop,
the first time a session connects a server.

A :class:`Connection` is one task that holds the transport (a stdio subprocess, or streamable HTTP) and
the SDK's ``ClientSession`` open until it is told to stop or the server goes away; calls are made from
other tasks over that session, so many run at once. The stream from the transport to the session passes
through a small pump that notices the end of the connection (the server exited, the HTTP stream broke).

A :class:`ServerClient` owns the connections of one server over time: it connects on first use, and after
a failure (it did not start, it died, it stopped answering) drops the connection and connects again on
the next use, at once after one failure and after a growing delay (``mcp.restart_backoff``, doubling up to
``mcp.max_restart_backoff``) after several in a row, so a server that crashes at every start is not
respawned at every call. Every failure is an ``mcp_server_error`` event; a call it cuts short gets an error
result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final, cast

import anyio
import httpcore2
import httpx2
import pydantic
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from runtime.affinity import place_thread
from runtime.config import McpConfig, McpServerConfig
from runtime.errors import AddressRefused, ToolError
from runtime.outbound import check_public
from runtime.tools.mcp.servers import describe, expand, scrub, secret_values, withheld

log = logging.getLogger("agentcell.mcp")

_STOP_TIMEOUT: Final = 10.0  # the SDK bounds a stdio server's shutdown (stdin closed, TERM, KILL) below this
_STDERR_TAIL: Final = 600  # characters of a server's stderr quoted when it fails to start
CLIENT_INFO: Final = types.Implementation(name="agentcell", version="0.1.0")
IDEMPOTENCY_META_KEY: Final = "agentcell/idempotency_key"
"""The key of a tool call's ``_meta`` that holds its idempotency key (the call id, design §3.12)."""

Report = Callable[..., None]  # report(kind, message, *, tool=None, call_id=None, retry_in=None)


class McpUnavailable(ToolError):
    """The server cannot take the call now; the message says why, for the model."""


class Listed:
    """A tool as a server listed it; ``idempotent``: its annotations say a second call does what the first
    did (``readOnlyHint`` or ``idempotentHint``, design §3.12)."""

    __slots__ = ("description", "idempotent", "input_schema", "name")

    def __init__(
        self, name: str, description: str | None, input_schema: Any, idempotent: bool = False
    ) -> None:
        self.name = name
        self.description = description
        self.input_schema = input_schema
        self.idempotent = idempotent


class Connection:
    """One live connection to a server: a task on the I/O loop (see the module docstring)."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        cwd: Path | None,
        stderr_path: Path,
        cpus: frozenset[int] | None = None,
    ) -> None:
        self.name = name
        self.cpus = cpus  # where a stdio server runs: every CPU, not the runtime's own (runtime.cpu)
        self.config = config
        self.cwd = cwd
        self.stderr_path = stderr_path
        self.session: ClientSession | None = None
        self.tools: list[Listed] = []
        self.closed = asyncio.Event()
        self.stopping = False
        self.tools_changed = False  # the server said its tool list changed
        self.garbage = 0  # lines from the server that were not JSON-RPC
        self.on_garbage: Callable[[Exception], None] = lambda _exc: None
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # (read even when open() gave up waiting: no "exception was never retrieved" noise)
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._task: asyncio.Task[None] | None = None
        self._stderr_offset = 0

    async def open(self, timeout: float) -> None:
        """Start the server (or reach it), initialize, list its tools; raises with a readable reason."""
        self._task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.close()
            raise McpUnavailable(
                f"MCP server {self.name!r} did not start within {timeout:g} s{self._stderr_tail()}"
            ) from None
        except McpUnavailable:
            await self.close()
            raise
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop the connection (a stdio server is stopped: stdin closed, then TERM, then KILL)."""
        self.stopping = True
        self._stop.set()
        task = self._task
        if task is None or task.done():
            self.closed.set()
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.closed.wait()), _STOP_TIMEOUT)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, _STOP_TIMEOUT)
            log.warning("MCP server %s took more than %g s to stop; cancelled", self.name, _STOP_TIMEOUT)

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.closed.is_set() and not self.stopping

    async def _run(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                with _spawning_on(self.cpus if config_is_stdio(self.config) else None):
                    read, write = await stack.enter_async_context(self._transport(stack))
                sink, source = anyio.create_memory_object_stream[Any](0)
                ended = asyncio.Event()
                group = await stack.enter_async_context(anyio.create_task_group())
                group.start_soon(_pump, read, sink, ended)
                session = await stack.enter_async_context(
                    ClientSession(source, write, message_handler=self._incoming, client_info=CLIENT_INFO)
                )
                await session.initialize()
                self.tools = await _list_tools(session)
                self.session = session
                self._ready.set_result(None)
                stop, end = asyncio.create_task(self._stop.wait()), asyncio.create_task(ended.wait())
                try:
                    await asyncio.wait((stop, end), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    end.cancel()
                group.cancel_scope.cancel()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(McpUnavailable(self._failure(exc)))
            elif not isinstance(exc, asyncio.CancelledError | GeneratorExit):
                log.debug("MCP server %s: the connection ended with %r", self.name, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.closed.set()

    def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        missing = withheld(config)
        if missing:
            raise McpUnavailable(
                f"its {', '.join(missing)} looked like a secret and was not stored with the session: give the "
                "server again (resume_session(mcp_servers=...)) or write the value as ${VARIABLE}"
            )
        env, headers = dict(config.env), dict(config.headers)
        if config.expand_env:  # ${NAME}: the host's environment, for the host's own servers only
            try:
                env = {k: expand(v, os.environ) for k, v in env.items()}
                headers = {k: expand(v, os.environ) for k, v in headers.items()}
            except KeyError as exc:
                raise McpUnavailable(
                    f"the environment variable {exc.args[0]} it refers to is not set"
                ) from None
        if config.url is not None:
            return _http(_http_client(headers, public_only=config.public_only), config.url)
        assert config.command is not None
        cwd = Path(config.cwd).expanduser() if config.cwd else self.cwd
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        errlog = stack.enter_context(self.stderr_path.open("a", encoding="utf-8", errors="replace"))
        self._stderr_offset = errlog.tell()
        params = StdioServerParameters(command=config.command, args=list(config.args), env=env, cwd=cwd)
        return stdio_client(params, errlog=errlog)

    async def _incoming(self, message: Any) -> None:
        if isinstance(message, Exception):  # a line that is not JSON-RPC, or a transport error
            self.garbage += 1
            self.on_garbage(message)
        elif isinstance(message, types.ToolListChangedNotification):
            self.tools_changed = True
        await anyio.lowlevel.checkpoint()

    def _failure(self, exc: BaseException) -> str:
        cause = _root_cause(exc)
        if isinstance(cause, McpUnavailable):
            why = str(cause)
        elif isinstance(cause, FileNotFoundError):
            why = f"its command was not found ({self.config.command})"
        elif isinstance(cause, MCPError) and cause.code == types.CONNECTION_CLOSED:
            why = "it exited (or closed the connection) before it was ready"
        else:
            why = f"{type(cause).__name__}: {cause}"
        return (
            f"MCP server {self.name!r} ({describe(self.config)}) failed to start: {why}{self._stderr_tail()}"
        )

    def _stderr_tail(self) -> str:
        if self.config.command is None:
            return ""
        try:
            with self.stderr_path.open("rb") as fh:
                fh.seek(self._stderr_offset)
                data = fh.read()[-_STDERR_TAIL * 4 :]
        except OSError:
            return ""
        text = data.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        return f"; its stderr ends with: {text}" if text else ""


def config_is_stdio(config: McpServerConfig) -> bool:
    return config.command is not None


_widened = 0
_saved_cpus: set[int] | None = None


@contextlib.contextmanager
def _spawning_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """Let a server process start on ``cpus``: a child inherits the affinity of the thread that starts it,
    and the I/O loop's thread may be kept on the runtime's one CPU (``runtime.cpu``). Connections starting
    at once (on the loop's thread, so no lock) share one widening."""
    global _widened, _saved_cpus
    if not cpus:
        yield
        return
    if _widened == 0:
        try:
            _saved_cpus = os.sched_getaffinity(0)
        except OSError:
            _saved_cpus = None
        place_thread(cpus)
    _widened += 1
    try:
        yield
    finally:
        _widened -= 1
        if _widened == 0 and _saved_cpus is not None:
            place_thread(frozenset(_saved_cpus))


def _http_client(headers: Mapping[str, str], *, public_only: bool) -> httpx2.AsyncClient:
    """The HTTP client of a server at a URL. ``public_only`` (a client's server): no proxy from the
    environment, and every connection made to a public address only (:class:`_PublicOnly`)."""
    timeout = httpx2.Timeout(30.0, read=300.0)
    if not public_only:
        return httpx2.AsyncClient(headers=dict(headers), timeout=timeout)
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    pool = transport._pool  # (httpcore's pool: its network backend is where connections are made)
    pool._network_backend = _PublicOnly(pool._network_backend)
    return httpx2.AsyncClient(headers=dict(headers), timeout=timeout, transport=transport, trust_env=False)


class _PublicOnly(httpcore2.AsyncNetworkBackend):
    """A network backend over ``inner`` that connects to public addresses only: the host is resolved, every
    address it has checked (runtime.outbound), and the connection made to a checked one. So a name that
    resolved to a public address when the session was made and resolves inside now reaches nothing."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise AddressRefused(f"cannot resolve {host}: {exc}") from None
        addresses = sorted({str(info[4][0]) for info in infos})
        check_public(host, addresses)
        return await self._inner.connect_tcp(
            addresses[0], port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise AddressRefused("a client's MCP server is never reached over a Unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@contextlib.asynccontextmanager
async def _http(client: httpx2.AsyncClient, url: str) -> Any:
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams


async def _pump(source: Any, sink: Any, ended: asyncio.Event) -> None:
    """Pass messages from the transport to the session; say when the transport's stream ends."""
    try:
        async with sink:
            async for item in source:
                await sink.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
        pass
    finally:
        ended.set()


async def _list_tools(session: ClientSession) -> list[Listed]:
    tools: list[Listed] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever must not hang the connection
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(Listed(t.name, t.description, t.input_schema, _idempotent(t)) for t in result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


def _idempotent(listed: types.Tool) -> bool:
    """What a server does not say is taken as no."""
    hints = listed.annotations
    return hints is not None and bool(hints.read_only_hint or hints.idempotent_hint)


def _root_cause(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, for a readable message."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


class ServerClient:
    """One MCP server of one session, across its connections (see the module docstring)."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        settings: McpConfig,
        *,
        cwd: Path | None,
        logs_dir: Path,
        report: Report,
        started: Callable[[ServerClient], None],
        cpus: frozenset[int] | None = None,
    ) -> None:
        self.name = name
        self.cpus = cpus
        self.config = config
        self.settings = settings
        self.cwd = cwd
        self.logs_dir = logs_dir
        self._secrets = secret_values(config, os.environ if config.expand_env else {})
        self._report = report
        self.started = started
        self.conn: Connection | None = None
        self.failures = 0  # failures in a row (a call the server answers resets it)
        self.last_error = ""
        self.retry_at = 0.0
        self.connections = 0
        self._lock = asyncio.Lock()
        self._checks: set[asyncio.Task[None]] = set()
        self._live: set[Connection] = set()  # connections not closed yet (stop() waits for all of them)

    # -- connecting --------------------------------------------------------------------------------------
    def report(self, kind: str, message: str, **kw: Any) -> None:
        """An ``mcp_server_error`` event, the server's secrets cut out (its stderr may print them)."""
        self._report(kind, self.scrub(message), **kw)

    def scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    def backing_off(self) -> float:
        """Seconds until the next connection attempt is allowed (0: now)."""
        return max(0.0, self.retry_at - time.monotonic())

    async def ensure(self) -> Connection:
        """The live connection, made now if there is none; :class:`McpUnavailable` when it cannot be."""
        conn = self.conn
        if conn is not None and conn.alive:
            return conn
        async with self._lock:
            conn = self.conn
            if conn is not None and conn.alive:
                return conn
            wait = self.backing_off()
            if wait > 0:
                raise McpUnavailable(
                    f"MCP server {self.name!r} is down: it failed {self.failures} times in a row (the last: "
                    f"{self.last_error}); it is started again by a call from {wait:.1f} s from now"
                )
            conn = Connection(
                self.name,
                self.config,
                cwd=self.cwd,
                stderr_path=self.logs_dir / f"mcp-{self.name}.stderr.log",
                cpus=self.cpus,
            )
            conn.on_garbage = lambda exc: self._garbage(conn, exc)
            timeout = self.config.startup_timeout or self.settings.startup_timeout
            self._live.add(conn)
            try:
                await conn.open(timeout)
            except Exception as exc:
                self._live.discard(conn)
                message = str(exc) if isinstance(exc, McpUnavailable) else f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, McpUnavailable):
                    message = f"MCP server {self.name!r} failed to start: {message}"
                message = self.scrub(message)
                self._failed("start_failed", message)
                raise McpUnavailable(message) from None
            self.conn = conn
            self.connections += 1
            watcher = asyncio.create_task(self._watch(conn))
            self._checks.add(watcher)
            watcher.add_done_callback(self._checks.discard)
            self.started(self)
            return conn

    async def _watch(self, conn: Connection) -> None:
        await conn.closed.wait()
        self._live.discard(conn)
        if not conn.stopping and self.conn is conn:  # it ended on its own: the server went away
            self.conn = None
            self._failed("crashed", f"MCP server {self.name!r} exited (its connection closed)")

    def _failed(
        self, kind: str, message: str, *, tool: str | None = None, call_id: str | None = None
    ) -> None:
        message = self.scrub(message)
        self.failures += 1
        self.last_error = message
        delay = 0.0
        if self.failures >= 2:
            delay = min(
                self.settings.max_restart_backoff, self.settings.restart_backoff * 2 ** (self.failures - 2)
            )
        self.retry_at = time.monotonic() + delay
        log.warning("%s", message)
        self._report(kind, message, tool=tool, call_id=call_id, retry_in=delay)

    def _garbage(self, conn: Connection, exc: Exception) -> None:
        if conn.garbage == 1:  # once a connection: a chatty server must not flood the event stream
            self.report("bad_result", f"MCP server {self.name!r} wrote something that is not JSON-RPC: {exc}")

    async def _drop(self, conn: Connection, kind: str, message: str, **kw: Any) -> None:
        """Give up on a connection that failed: stop it (the server process with it), then report."""
        mine = self.conn is conn
        if mine:
            self.conn = None  # (calls from now on start a new one)
        await conn.close()
        if mine:
            self._failed(kind, message, **kw)

    # -- calls ---------------------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], call_id: str) -> Any:
        """Call ``tool``; the SDK's ``CallToolResult``, or :class:`McpUnavailable` with the reason."""
        conn = await self.ensure()
        session = conn.session
        assert session is not None
        try:
            # the call id as an idempotency key (design §3.12): a server can tell a retry from a new call
            meta = cast("types.RequestParamsMeta", {IDEMPOTENCY_META_KEY: call_id})
            result = await session.call_tool(tool, arguments, meta=meta)
        except asyncio.CancelledError:  # the executor gave up on the call (timeout, abort)
            self._check_later(conn, tool)
            raise
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED or exc.message == "Session terminated":
                message = f"MCP server {self.name!r} went away during the call ({exc.message})"
                await self._drop(conn, "crashed", message, tool=tool, call_id=call_id)
                raise McpUnavailable(f"{message}; it is restarted on its next use") from None
            raise McpUnavailable(
                self.scrub(f"MCP server {self.name!r} refused the call: {exc.message} (code {exc.code})")
            ) from None
        except (pydantic.ValidationError, ValueError, TypeError, RuntimeError) as exc:
            message = self.scrub(f"MCP server {self.name!r} answered with an invalid result: {_short(exc)}")
            self.report("bad_result", message, tool=tool, call_id=call_id)
            raise McpUnavailable(message) from None
        self.failures = 0
        return result

    def _check_later(self, conn: Connection, tool: str) -> None:
        """After a call was given up on: ping the server, and restart it if it does not answer."""
        task = asyncio.get_running_loop().create_task(self._check(conn, tool))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check(self, conn: Connection, tool: str) -> None:
        session = conn.session
        if session is None or not conn.alive:
            return
        timeout = self.settings.ping_timeout
        try:
            await asyncio.wait_for(session.send_ping(), timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = "no answer" if isinstance(exc, TimeoutError) else _short(exc)
            message = (
                f"MCP server {self.name!r} did not answer a ping within {timeout:g} s after a call of "
                f"{tool!r} was given up on ({why}); it was stopped and is restarted on its next use"
            )
            await self._drop(conn, "unresponsive", message, tool=tool)

    async def stop(self) -> None:
        """Stop the server (the session stops or hibernates): no failure, started again on its next use.
        Waits for every connection still closing, a dropped one's too."""
        self.conn = None
        for task in list(self._checks):
            task.cancel()
        live = list(self._live)
        await asyncio.gather(*(c.close() for c in live), return_exceptions=True)
        self._live.difference_update(live)

    def tools_changed(self) -> bool:
        conn = self.conn
        return conn is not None and conn.tools_changed


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 1] + "…"
