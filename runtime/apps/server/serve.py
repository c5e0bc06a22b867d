"""Serving: :class:`ApiServer` (the application on uvicorn, on a socket bound at once) and :func:`run_server`,
the ``agentcell serve`` command (design §7.2): a local ``Runtime`` or a cluster, the local provider beside it
with ``--local``, served until SIGTERM or SIGINT, then drained (:mod:`runtime.apps.drain`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from runtime.apps import LOCAL_MODEL, serve_log
from runtime.apps.connections import guarded_protocol
from runtime.apps.drain import Drain
from runtime.apps.server.app import create_app
from runtime.apps.server.policy import ServerPolicy
from runtime.apps.server.sessions import TakeUp
from runtime.config import Config, ConfigError
from runtime.host import Runtime

if TYPE_CHECKING:
    from runtime.apps import AnyRuntime

__all__ = ["ApiServer", "run_server"]

log = logging.getLogger("agentcell.server")


class ApiServer:
    """The HTTP API for ``runtime`` on uvicorn, bound to ``host:port`` at once (port 0: a free one).

    :meth:`start` serves from a background thread (tests, embedding); :meth:`run` serves in the calling
    thread until SIGINT/SIGTERM (the ``serve`` command). Once it serves, :meth:`take_up_interrupted` takes up
    the turns a server that stopped cut off (the ``serve`` command does).
    """

    def __init__(
        self,
        runtime: AnyRuntime,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        policy: ServerPolicy | None = None,
        max_body_bytes: int | None = None,
        metrics_public: bool | None = None,
    ) -> None:
        import uvicorn

        self.token = token
        self.host = host
        self.runtime = runtime
        self._take_up: TakeUp | None = None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP spelled out: asyncio turns Nagle off on accepted connections only when the socket says
        # TCP (proto 0 does not), and with Nagle on, a keep-alive answer waits ~40 ms for a delayed ACK.
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(2048)  # connections queue from now on, before uvicorn takes the socket over
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        limits = runtime.config.server
        self.drain = Drain(runtime)
        config = uvicorn.Config(
            create_app(
                runtime,
                token,
                stopping=lambda: self._server.should_exit,
                policy=policy,
                max_body_bytes=max_body_bytes,
                metrics_public=metrics_public,
                drain=self.drain,
                takes_up=self._set_take_up,
            ),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            http=guarded_protocol(
                header_timeout=limits.header_timeout,
                body_timeout=limits.body_timeout,
                max_connections=limits.max_connections,
            ),
            timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]  # (a float works)
        )
        self._server = _server(config)
        self._thread: threading.Thread | None = None

    def _set_take_up(self, take_up: TakeUp) -> None:
        self._take_up = take_up

    def take_up_interrupted(self, timeout: float | None = None) -> list[str]:
        """Resume, under the server's policy, the stored sessions whose turn a runtime that stopped cut off
        (:meth:`~runtime.api.RuntimeAPI.interrupted_sessions`), as a first request of each would: their
        turns go on now, and ``GET /sessions/{id}/turns/{prompt_id}`` answers with their results (design
        §3.12). Returns the ids whose turn was taken up; one that cannot be resumed is logged and left, and
        one whose config has ``agent.resume_turns`` off is left as it is (not resumed).
        Call it once the server serves (from any thread but the server's)."""
        loop, take_up = self._server.loop, self._take_up
        if loop is None or take_up is None:
            raise RuntimeError("the server is not serving yet")
        session_ids = self.runtime.interrupted_sessions()
        if not session_ids:
            return []
        return asyncio.run_coroutine_threadsafe(take_up(session_ids), loop).result(timeout)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> ApiServer:
        """Serve from a daemon thread; returns once connections are accepted."""
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="agentcell-api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the API server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def run(self) -> None:
        """Serve in this thread until interrupted."""
        self._server.run(sockets=[self._sock])

    def run_until_signalled(self, drain_timeout: float, on_ready: Callable[[], object] | None = None) -> None:
        """Serve (from a thread) until SIGTERM or SIGINT, then drain (:meth:`Drain.finish`: no new turns,
        running ones given ``drain_timeout`` seconds, a second signal cuts that short) and stop.
        ``on_ready`` runs once the signals are caught and connections accepted."""
        signalled = threading.Event()
        hurry = threading.Event()

        def on_signal(signum: int, _frame: object) -> None:
            (hurry if signalled.is_set() else signalled).set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if on_ready is not None:
                on_ready()
            while not signalled.wait(0.5):
                if self._thread is None or not self._thread.is_alive():
                    return  # uvicorn stopped on its own
            self.drain.finish(drain_timeout, hurry=hurry)
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (open event streams end) and wait for the server thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with contextlib.suppress(OSError):
            self._sock.close()
        self.drain.close()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_server(
    *,
    host: str | None = None,
    port: int | None = None,
    token: str | None = None,
    token_file: str | None = None,
    config_path: str | None = None,
    sessions_dir: str | None = None,
    workspace_root: str | None = None,
    allow_shell: bool | None = None,
    allow_api_base: bool | None = None,
    allow_mcp_commands: bool | None = None,
    metrics_public: bool | None = None,
    shards: int | None = None,
    ray_address: str | None = None,
    local: bool = False,
    drain_timeout: float | None = None,
    log_format: str | None = None,
) -> int:
    """The ``serve`` command: serve until SIGTERM or SIGINT, then drain (:mod:`runtime.apps.drain`);
    returns the exit status.

    ``local`` starts the built-in local provider (offline, scripted replies) beside the server: new
    sessions default to its model, and a session that names no ``api_base`` runs against it.

    With ``shards`` or ``ray_address`` the sessions live on shards of a Ray cluster
    (:class:`runtime.cluster.ClusterRuntime`: ``shards`` of them, 2 by default, on the cluster at
    ``ray_address`` or on a local one).

    The token comes from ``token``, else the file ``token_file``, else ``server.token`` (which
    ``AGENTCELL_SERVER__TOKEN`` sets), else the file ``server.token_file``; else one is generated.
    """
    from runtime.config import load_config

    overrides: dict[str, Any] = {}
    if sessions_dir is not None:
        overrides["persistence.sessions_dir"] = sessions_dir
    if workspace_root is not None:
        overrides["server.workspace_root"] = workspace_root
    if allow_shell is not None:
        overrides["server.allow_shell"] = allow_shell
    if allow_api_base is not None:
        overrides["server.allow_api_base"] = allow_api_base
    if allow_mcp_commands is not None:
        overrides["server.allow_mcp_commands"] = allow_mcp_commands
    if metrics_public is not None:
        overrides["server.metrics_public"] = metrics_public
    if local:
        overrides["agent.model"] = LOCAL_MODEL
    if drain_timeout is not None:
        overrides["server.drain_timeout"] = drain_timeout
    if log_format is not None:
        overrides["server.log_format"] = log_format
    try:
        cfg = load_config(config_path).with_overrides(overrides)
        policy = ServerPolicy.from_config(cfg.server)
        token = token or _read_token(token_file) or cfg.server.token or _read_token(cfg.server.token_file)
    except (ConfigError, ValueError) as exc:
        print(f"agentcell serve: {exc}", file=sys.stderr)
        return 2
    serve_log.configure(cfg.server.log_format)
    json_log = cfg.server.log_format == "json"

    def say(message: str) -> None:
        if json_log:
            log.info("%s", message)
        else:
            print(f"agentcell serve: {message}", file=sys.stderr, flush=True)

    if not token:
        token = secrets.token_urlsafe(24)
        say(f"generated bearer token: {token}")
    bind_host = host or cfg.server.host
    with contextlib.ExitStack() as stack:
        if local:
            from runtime.provider import LocalProvider

            provider = stack.enter_context(LocalProvider())
            policy = msgspec.structs.replace(policy, local_provider=provider.url)
            say(
                f"the built-in local provider at {provider.url} answers sessions that name "
                f"no api_base (model {LOCAL_MODEL} by default; its replies are scripted, offline, no key)"
            )
        return _serve(cfg, policy, token, bind_host, port, shards, ray_address, say)


def _serve(
    cfg: Config,
    policy: ServerPolicy,
    token: str,
    bind_host: str,
    port: int | None,
    shards: int | None,
    ray_address: str | None,
    say: Callable[[str], None],
) -> int:
    try:
        host_runtime = _host_runtime(cfg, shards, ray_address)
    except ValueError as exc:
        print(f"agentcell serve: {exc}", file=sys.stderr)
        return 2
    try:
        host_runtime.start()
    except RuntimeError as exc:  # a ClusterError: Ray missing, no cluster at the address, shards not started
        print(f"agentcell serve: {exc}", file=sys.stderr)
        return 1
    with host_runtime as rt:
        try:
            server = ApiServer(rt, token, bind_host, cfg.server.port if port is None else port, policy=policy)
        except ConfigError as exc:  # (a tenants file that cannot be read)
            print(f"agentcell serve: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"agentcell serve: cannot listen on {bind_host}:{port}: {exc.strerror}", file=sys.stderr)
            return 1
        where = f"workspaces under {policy.workspace_root}" if policy.workspace_root else "no workspaces"
        if shards is not None or ray_address is not None:
            where += f"; {len(getattr(rt, 'shards', ()))} shards on Ray"
        banner = (
            f"listening on {server.url} (sessions in {rt.sessions_path}; {where}; "
            f"shell {'allowed' if policy.allow_shell else 'off'}; "
            f"api_base {'allowed' if policy.allow_api_base else 'only with its own api_key'}; "
            f"MCP commands {'allowed' if policy.allow_mcp_commands else 'off'}; "
            f"/metrics {'public' if cfg.server.metrics_public else 'with the token'})"
        )

        def take_up() -> None:  # (from a thread of its own: the signals are caught meanwhile)
            try:
                taken = server.take_up_interrupted()
            except Exception:
                log.exception("taking up the turns a stopped server cut off failed")
                return
            if taken:
                say(f"took up the turns cut off when the server stopped in {len(taken)} sessions")

        def ready() -> None:
            say(banner)
            threading.Thread(target=take_up, name="agentcell-take-up", daemon=True).start()

        server.run_until_signalled(cfg.server.drain_timeout, on_ready=ready)
    return 0


def _server(config: Any) -> Any:
    """A ``uvicorn.Server`` for ``config`` that remembers its event loop (``loop``) as it starts."""
    import uvicorn

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)

    return Server(config)


def _host_runtime(cfg: Config, shards: int | None, ray_address: str | None) -> AnyRuntime:
    """A local ``Runtime``, or a ``ClusterRuntime`` when asked for shards or a Ray address."""
    if shards is None and ray_address is None:
        return Runtime(cfg)
    from runtime.cluster import ClusterRuntime

    return ClusterRuntime(cfg, shards=shards if shards is not None else 2, address=ray_address)


def _read_token(path: str | None) -> str | None:
    """The token held in the file ``path`` (surrounding whitespace dropped); None without a path."""
    if path is None:
        return None
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {path}: {exc}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token
