"""``agentcell provider``: run the local provider from a shell until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from runtime.provider.errors import OVERFLOW_FORMATS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcell provider",
        description="Run the local OpenAI-compatible provider (deterministic replies, exact usage, vendor errors).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8400, help="port (default 8400; 0 = any free port)")
    parser.add_argument("--context-window", type=int, default=128_000, help="tokens (default 128000)")
    parser.add_argument(
        "--overflow-format",
        default="openai",
        choices=sorted(OVERFLOW_FORMATS),
        help="whose overflow error to send (default openai)",
    )
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply (default 0)")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream chunks")
    parser.add_argument("--encoding", default="o200k_base", help="tiktoken encoding (default o200k_base)")
    parser.add_argument("--api-key", default=None, help="require this bearer key (default: accept any)")
    parser.add_argument(
        "--rpm", type=float, default=None, help="requests per minute a key may send (default: no limit)"
    )
    parser.add_argument(
        "--tpm", type=float, default=None, help="tokens per minute a key may send (prompt + output cap)"
    )
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="requests of a key answered at once (default: no limit)",
    )
    parser.add_argument(
        "--no-rate-limit-headers",
        action="store_true",
        help="send no x-ratelimit-* headers (only 429s with retry-after)",
    )
    parser.add_argument("--script", default=None, metavar="FILE.json", help='scripts: {"model": [turns...]}')
    return parser


def cli_main(argv: Sequence[str] | None = None) -> int:
    """Run the provider until SIGINT/SIGTERM; prints its base URL first. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--rpm", args.rpm), ("--tpm", args.tpm), ("--max-concurrent", args.max_concurrent)):
        if value is not None and value <= 0:
            parser.error(f"{flag} must be positive, not {value:g}")
    from runtime.provider.script import load_scripts
    from runtime.provider.server import LocalProvider

    provider = LocalProvider(
        context_window=args.context_window,
        overflow_format=args.overflow_format,
        latency=args.latency,
        encoding=args.encoding,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        chunk_delay=args.chunk_delay,
        rpm=args.rpm,
        tpm=args.tpm,
        max_concurrent=args.max_concurrent,
        rate_limit_headers=not args.no_rate_limit_headers,
    )
    if args.script:
        try:
            scripts = load_scripts(args.script)
        except ValueError as exc:
            print(f"agentcell provider: {exc}", file=sys.stderr)
            return 2
        for name, turns in scripts.items():
            provider.add_script(name, turns)
    try:
        provider.start()
    except OSError as exc:
        print(
            f"agentcell provider: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr
        )
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    limits = ", ".join(
        f"{name} {value:g}"
        for name, value in (("rpm", args.rpm), ("tpm", args.tpm), ("max concurrent", args.max_concurrent))
        if value is not None
    )
    print(
        f"agentcell provider listening on {provider.url} (window {args.context_window} tokens"
        + (f"; per key: {limits}" if limits else "")
        + ")",
        flush=True,
    )
    try:
        while not stop.wait(0.5) and provider.running:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        provider.stop()
    return 0
