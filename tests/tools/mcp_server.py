"""A real MCP server for the MCP tests, written with the ``mcp`` SDK's own server API (``MCPServer``).

Run over stdio (``python mcp_server.py``) or streamable HTTP (``python mcp_server.py --http [--port N]``:
it prints the port it listens on). Options shape hostile servers:

- ``--fail-start``: exit with status 3 before serving (a server that fails to start);
- ``--count-file PATH``: append a line to PATH each time the server starts (counts restarts);
- ``--fail-after N`` (with ``--count-file``): start normally N times, then fail to start;
- ``--bad-schema``: also offer tools whose input schemas a provider would refuse, and a tool whose name
  is not a valid tool name.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-start", action="store_true")
    parser.add_argument("--count-file")
    parser.add_argument("--bad-schema", action="store_true")
    parser.add_argument("--fail-after", type=int)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", help="ignored: a credential on the command line, for the tests of secrets")
    return parser.parse_args()


if __name__ == "__main__":  # a server told to fail to start fails before the SDK's import (a second or more)
    OPTIONS = _options()
    starts = 0
    if OPTIONS.count_file:
        with open(OPTIONS.count_file, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        starts = len(Path(OPTIONS.count_file).read_text().split())
    if OPTIONS.fail_start or (OPTIONS.fail_after is not None and starts > OPTIONS.fail_after):
        print(f"this server refuses to start (argv: {' '.join(sys.argv[1:])})", file=sys.stderr)
        sys.exit(3)

from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp.server.mcpserver.tools import Tool  # noqa: E402
from mcp.server.mcpserver.utilities.types import Image  # noqa: E402
from mcp.types import EmbeddedResource, TextContent, TextResourceContents, ToolAnnotations  # noqa: E402

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/x8AAwMCAO+ip1sAAAAASUVORK5CYII="
)

_running = 0
_peak = 0


def build(bad_schema: bool = False) -> MCPServer:
    server = MCPServer("agentcell-test", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def cpus() -> str:
        """The CPUs the server may run on (a JSON list)."""
        return json.dumps(sorted(os.sched_getaffinity(0)))

    @server.tool()
    def cwd() -> str:
        """The server's working directory."""
        return os.getcwd()

    @server.tool()
    def header(name: str, ctx: Context, digest: bool = False) -> str:  # type: ignore[type-arg]
        """The value of a header of the HTTP request that carried this call ('' when none), or its SHA-256."""
        request = getattr(ctx.request_context, "request", None)
        value = request.headers.get(name, "") if request is not None else ""
        return hashlib.sha256(value.encode()).hexdigest() if digest else value

    @server.tool()
    def env(name: str, digest: bool = False) -> str:
        """The value of an environment variable of the server ('' when unset), or its SHA-256."""
        value = os.environ.get(name, "")
        return hashlib.sha256(value.encode()).hexdigest() if digest else value

    @server.tool()
    async def slow(seconds: float) -> str:
        """Wait (without blocking the server), then say how many calls ran at once at most."""
        global _running, _peak
        _running += 1
        _peak = max(_peak, _running)
        try:
            await asyncio.sleep(seconds)
        finally:
            _running -= 1
        return f"peak={_peak}"

    @server.tool()
    async def freeze(seconds: float) -> str:
        """Block the whole server (it answers nothing meanwhile, not even pings)."""
        time.sleep(seconds)  # (in a coroutine: the server's event loop itself stops)
        return "thawed"

    @server.tool()
    async def crash() -> str:
        """Kill the server in the middle of the call (once a call sent beside it is running, or after a
        second: under load the other call can reach the server after this one)."""
        deadline = time.monotonic() + 1.0
        while _running == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        os._exit(9)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def idempotency_key(ctx: Context) -> str:  # type: ignore[type-arg]
        """The idempotency key this call carried in its _meta ('' when none); reads nothing else."""
        meta: Any = ctx.request_context.meta or {}
        return str(meta.get("agentcell/idempotency_key", ""))

    @server.tool()
    def fail(message: str) -> str:
        """Fail on purpose (an isError result)."""
        raise ToolError(message)

    @server.tool()
    def big(lines: int) -> str:
        """Return a large output: numbered lines."""
        return "\n".join(f"line {i:07d} of a large output" for i in range(lines))

    @server.tool()
    def garbage() -> str:
        """Write a line that is not JSON-RPC on the protocol stream, then answer normally."""
        os.write(_wire(), b"this is not json-rpc\n")
        return "answered after garbage"

    @server.tool()
    async def bogus(ctx: Context) -> str:  # type: ignore[type-arg]
        """Answer the call with a result that is not a valid tool result (the real answer comes late)."""
        answer = {"jsonrpc": "2.0", "id": int(ctx.request_id), "result": {"content": 42, "isError": "maybe"}}
        os.write(_wire(), json.dumps(answer).encode() + b"\n")
        await asyncio.sleep(0.2)
        return "too late"

    @server.tool(structured_output=False)
    def picture() -> list[Any]:
        """An image and a caption."""
        return [TextContent(type="text", text="a tiny picture"), Image(data=PNG, format="png")]

    @server.tool(structured_output=False)
    def document() -> EmbeddedResource:
        """An embedded text resource."""
        contents = TextResourceContents(
            uri="file:///notes/readme.txt", mime_type="text/plain", text="the notes"
        )
        return EmbeddedResource(type="resource", resource=contents)

    if bad_schema:
        server.add_tool(
            lambda: "renamed", name="dotted.name/with spaces", description="A tool with an odd name."
        )
        broken = Tool.from_function(lambda: "x", name="broken_schema", description="An invalid JSON schema.")
        broken.parameters = {"type": "object", "properties": {"x": {"type": 12}}}
        server._tool_manager._tools[broken.name] = broken
    return server


def _wire() -> int:
    """The descriptor of the protocol stream: the SDK moves it off fd 1 (so that prints go to stderr)."""
    import fcntl

    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            continue
        if fd > 2 and target.startswith("pipe:") and mode == os.O_WRONLY:
            return fd
    return 1


def main() -> None:
    server = build(bad_schema=OPTIONS.bad_schema)
    if OPTIONS.http:
        serve_http(server, OPTIONS.port)
    else:
        server.run("stdio")


def serve_http(server: MCPServer, port: int) -> None:
    """Serve streamable HTTP on 127.0.0.1 (port 0: any free one) and print the port once listening."""
    import socket

    import uvicorn

    # IPPROTO_TCP: asyncio turns Nagle off on accepted connections only when the socket says TCP
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    print(sock.getsockname()[1], flush=True)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
