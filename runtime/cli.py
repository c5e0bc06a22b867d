"""The ``agentcell`` command line (SPEC 7.1).

Only argparse is imported up front so that ``--help`` answers at once; each command imports what it needs
(litellm, uvicorn, rich) when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


def _cmd_demo(args: argparse.Namespace) -> int:
    from runtime.demo import run_demo

    return run_demo(sessions=args.sessions, window=args.window, plain=args.plain)


def _cmd_chat(args: argparse.Namespace) -> int:
    from runtime.chat import run_chat

    return run_chat(
        model=args.model,
        session_id=args.session,
        api_base=args.api_base,
        config_path=args.config,
        local=args.local,
    )


def _cmd_sessions(args: argparse.Namespace) -> int:
    from runtime.sessions_cli import run_sessions

    return run_sessions(args.action, args.id, config_path=args.config, sessions_dir=args.dir)


def _cmd_serve(args: argparse.Namespace) -> int:
    from runtime.server import run_server

    return run_server(host=args.host, port=args.port, token=args.token, config_path=args.config)


def _cmd_provider(args: argparse.Namespace) -> int:
    from runtime.provider import cli_main

    return cli_main(args.provider_args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.__main__ import main as bench_main

    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcell",
        description="An actor-based concurrent runtime for LLM agent sessions.",
    )
    parser.add_argument("--version", action="version", version="agentcell 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run sessions against the built-in local provider (offline)")
    demo.add_argument("--sessions", type=int, default=3, help="concurrent sessions (default 3)")
    demo.add_argument("--window", type=int, default=6_000, help="context window of the demo model")
    demo.add_argument("--plain", action="store_true", help="plain text output instead of a live display")
    demo.set_defaults(handler=_cmd_demo)

    chat = sub.add_parser("chat", help="an interactive session with any litellm model")
    chat.add_argument("--model", default=None, help="litellm model name, e.g. openai/gpt-4o")
    chat.add_argument("--session", default=None, help="resume or create this session id")
    chat.add_argument("--api-base", default=None, help="provider base URL")
    chat.add_argument("--local", action="store_true", help="start and use the built-in local provider")
    chat.add_argument("--config", default=None, help="TOML config file")
    chat.set_defaults(handler=_cmd_chat)

    sessions = sub.add_parser("sessions", help="list, show or delete stored sessions")
    sessions.add_argument("action", nargs="?", choices=["list", "show", "delete"], default="list")
    sessions.add_argument("id", nargs="?", default=None, help="session id (show, delete)")
    sessions.add_argument("--dir", default=None, help="sessions directory")
    sessions.add_argument("--config", default=None, help="TOML config file")
    sessions.set_defaults(handler=_cmd_sessions)

    serve = sub.add_parser("serve", help="serve the HTTP API and Server-Sent Events")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765)")
    serve.add_argument("--token", default=None, help="bearer token (generated when not set)")
    serve.add_argument("--config", default=None, help="TOML config file")
    serve.set_defaults(handler=_cmd_serve)

    provider = sub.add_parser("provider", help="run the local OpenAI-compatible provider", add_help=False)
    provider.add_argument("provider_args", nargs=argparse.REMAINDER)
    provider.set_defaults(handler=_cmd_provider)

    bench = sub.add_parser("bench", help="run the benchmarks", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(handler=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
