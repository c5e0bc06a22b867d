"""The ``agentcell`` command line (design §7.1): ``demo``, ``chat``, ``sessions``, ``serve``, ``provider``, ``bench``.

Only argparse is imported up front, so that ``--help`` answers at once; each command imports what it
needs (litellm, uvicorn, rich) when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]


def _cmd_demo(args: argparse.Namespace) -> int:
    from runtime.apps.demo import run_demo

    return run_demo(
        sessions=args.sessions,
        window=args.window,
        plain=args.plain,
        serve=args.port if args.serve else None,
        shards=args.shards,
    )


def _cmd_chat(args: argparse.Namespace) -> int:
    from runtime.apps.chat import run_chat

    return run_chat(
        model=args.model,
        session_id=args.session,
        api_base=args.api_base,
        config_path=args.config,
        sessions_dir=args.dir,
        local=args.local,
        latency=args.latency,
        mcp=args.mcp,
    )


def _cmd_sessions(args: argparse.Namespace) -> int:
    from runtime.apps.sessions_cli import run_sessions

    return run_sessions(args.action, args.id, config_path=args.config, sessions_dir=args.dir)


def _cmd_serve(args: argparse.Namespace) -> int:
    from runtime.apps.server import run_server

    return run_server(
        host=args.host,
        port=args.port,
        token=args.token,
        token_file=args.token_file,
        config_path=args.config,
        sessions_dir=args.dir,
        workspace_root=args.workspace_root,
        allow_shell=True if args.allow_shell else None,
        allow_api_base=True if args.allow_api_base else None,
        allow_mcp_commands=True if args.allow_mcp_commands else None,
        metrics_public=True if args.metrics_public else None,
        shards=args.shards,
        ray_address=args.ray_address,
        local=args.local,
        drain_timeout=args.drain_timeout,
        log_format=args.log_format,
    )


def _run_provider(argv: list[str]) -> int:
    from runtime.provider import cli_main

    return cli_main(argv)


def _run_bench(argv: list[str]) -> int:
    """The benchmark runner of the agentcell checkout in the working directory: the benchmarks live in the
    repository, not in the installed package."""
    here = Path.cwd()
    if not (here / "benchmarks" / "__main__.py").is_file():
        print(
            "agentcell bench: the benchmarks are in agentcell's repository, not in the installed package; "
            "run this command from a checkout (the folder that holds benchmarks/)",
            file=sys.stderr,
        )
        return 2
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    from benchmarks.__main__ import main as bench_main

    return int(bench_main(argv) or 0)


# Commands with a parser of their own: everything after the command's name is theirs (``--help`` too).
_PASSTHROUGH: dict[str, Callable[[list[str]], int]] = {"provider": _run_provider, "bench": _run_bench}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcell",
        description="An actor-based concurrent runtime for LLM agent sessions.",
    )
    parser.add_argument("--version", action="version", version="agentcell 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="run concurrent sessions against the built-in local provider (offline, no API key)",
        description="Run a coding task in several concurrent sessions against the built-in local provider: "
        "tool calls, usage, an automatic compaction and an overflow recovery, shown live.",
    )
    demo.add_argument(
        "--sessions", type=_positive, default=3, help="concurrent sessions, at least 2 (default 3)"
    )
    demo.add_argument(
        "--window", type=_positive, default=6_000, help="context window of the demo model (default 6000)"
    )
    demo.add_argument("--plain", action="store_true", help="plain lines instead of a live display")
    demo.add_argument(
        "--shards",
        type=_positive,
        default=None,
        help="run the sessions on this many shards of a local Ray cluster (needs agentcell[ray])",
    )
    demo.add_argument(
        "--serve",
        action="store_true",
        help="serve the live dashboard (and the HTTP API) during the demo and after it, until Ctrl-C",
    )
    demo.add_argument("--port", type=int, default=8765, help="with --serve: the port (default 8765; 0 = any)")
    demo.set_defaults(handler=_cmd_demo)

    chat = sub.add_parser(
        "chat",
        help="an interactive session with any litellm model",
        description="Chat with a model; the agent can read and edit files in the current directory. "
        "Commands: /compact [focus], /context, /sessions, /branch [n], /help, /quit. "
        "Ctrl-C aborts a running turn.",
    )
    chat.add_argument("--model", default=None, help="litellm model name, e.g. openai/gpt-4o-mini")
    chat.add_argument("--session", default=None, help="resume this stored session, or start it with this id")
    chat.add_argument("--api-base", default=None, help="provider base URL")
    chat.add_argument(
        "--local",
        action="store_true",
        help="start and use the built-in local provider (the default without --model)",
    )
    chat.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="with --local: seconds the provider waits before each reply",
    )
    chat.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="[NAME=]COMMAND",
        help="take tools from an MCP server: a command line run over stdio (quote it: --mcp 'fs=npx -y "
        "@modelcontextprotocol/server-filesystem .') or a streamable HTTP URL; repeatable; its tools are "
        "NAME__tool",
    )
    chat.add_argument("--dir", default=None, help="sessions directory (default ~/.agentcell/sessions)")
    chat.add_argument("--config", default=None, help="TOML config file")
    chat.set_defaults(handler=_cmd_chat)

    sessions = sub.add_parser(
        "sessions",
        help="list, show or delete stored sessions",
        description="List the stored sessions, show one's conversation, or delete one with all its files.",
    )
    sessions.add_argument("action", nargs="?", choices=["list", "show", "delete"], default="list")
    sessions.add_argument("id", nargs="?", default=None, help="session id (show, delete)")
    sessions.add_argument("--dir", default=None, help="sessions directory (default ~/.agentcell/sessions)")
    sessions.add_argument("--config", default=None, help="TOML config file")
    sessions.set_defaults(handler=_cmd_sessions)

    serve = sub.add_parser(
        "serve",
        help="serve the HTTP API and Server-Sent Events",
        description="Serve sessions over HTTP (create, list, prompt, abort, compact, context, delete) and their "
        "events as Server-Sent Events. Every request needs the bearer token.",
    )
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765; 0 = any free port)")
    serve.add_argument(
        "--token",
        default=None,
        help="bearer token (visible in ps: prefer --token-file or AGENTCELL_SERVER__TOKEN; default: "
        "server.token, else generated)",
    )
    serve.add_argument("--token-file", default=None, help="read the bearer token from this file")
    serve.add_argument(
        "--workspace-root",
        default=None,
        help="session workspaces must lie under this directory (default: server.workspace_root; "
        "unset: sessions get no workspace)",
    )
    serve.add_argument(
        "--allow-shell", action="store_true", help="let sessions enable the shell tool (server.allow_shell)"
    )
    serve.add_argument(
        "--allow-api-base",
        action="store_true",
        help="let a session name an api_base without its own api_key: the server's provider keys then go to "
        "that URL (server.allow_api_base)",
    )
    serve.add_argument(
        "--allow-mcp-commands",
        action="store_true",
        help="let sessions start MCP servers over stdio, i.e. run commands on this machine "
        "(server.allow_mcp_commands)",
    )
    serve.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve GET /metrics (Prometheus) without the bearer token (server.metrics_public)",
    )
    serve.add_argument(
        "--local",
        action="store_true",
        help="start the built-in local provider (offline, scripted replies, no key) and run sessions that "
        "name no api_base against it: try the server and its dashboard with one command",
    )
    serve.add_argument("--dir", default=None, help="sessions directory (default ~/.agentcell/sessions)")
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="on SIGTERM/SIGINT: seconds running turns get to finish before they are aborted (default 25)",
    )
    serve.add_argument(
        "--log-format", choices=("text", "json"), default=None, help="stderr log: text (default) or json"
    )
    serve.add_argument("--config", default=None, help="TOML config file")
    serve.add_argument(
        "--shards",
        type=_positive,
        default=None,
        help="host the sessions on this many shards of a Ray cluster (needs agentcell[ray]; the sessions "
        "directory must be one every shard sees)",
    )
    serve.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to put the shards on (HOST:PORT of its head, or 'auto'; default: a local one)",
    )
    serve.set_defaults(handler=_cmd_serve)

    # Listed for the help text; main() hands their arguments to their own parsers.
    sub.add_parser("provider", help="run the local OpenAI-compatible provider", add_help=False)
    sub.add_parser("bench", help="run the benchmarks", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: parse ``argv`` and run the command; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        if arguments and arguments[0] in _PASSTHROUGH:
            return _PASSTHROUGH[arguments[0]](arguments[1:])
        parser = build_parser()
        args = parser.parse_args(arguments)
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return 0
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
