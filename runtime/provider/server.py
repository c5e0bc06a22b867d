"""The local OpenAI-compatible provider: a Starlette app on uvicorn, in a background thread.

This module is the server and what it holds for its endpoints: start and stop, scripts and responders
(which reply a request gets: a script selected by the request's ``model``, :mod:`runtime.provider.script`,
or the built-in policy, :mod:`runtime.provider.policy`), per-model windows, the queue of injected faults,
the key, and the request log. The endpoints say it in their dialects: ``POST /v1/chat/completions``
(:mod:`runtime.provider.chat_api`) and ``POST /v1/messages`` (:mod:`runtime.provider.anthropic_api`); an
injected fault plays out in :mod:`runtime.provider._faults`. Usage is exact (:mod:`runtime.provider.usage`).
A request over the context window fails with the configured vendor's overflow error
(:mod:`runtime.provider.errors`).

Example::

    with LocalProvider(context_window=8_000, overflow_format="anthropic").start() as provider:
        provider.add_script("hello", [Turn(text="Hi!")])
        litellm.completion(model="openai/hello", api_base=provider.url, api_key="sk-local", messages=...)
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.provider import errors, policy
from runtime.provider._faults import FaultPlayer
from runtime.provider._http import json_response
from runtime.provider.anthropic_api import MessagesEndpoint
from runtime.provider.chat_api import DEFAULT_MODEL, ChatEndpoint
from runtime.provider.limits import ProviderLimiter
from runtime.provider.script import Fault, FaultKind, Turn
from runtime.provider.usage import PromptCount, TokenCounter

Responder = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], Turn]
"""A reply computed from a request's messages and tools (see :meth:`LocalProvider.add_responder`)."""


class LoggedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request the provider received, and how it answered. Never holds the API key."""

    model: str
    body: dict[str, Any]
    stream: bool
    prompt_tokens: int
    cached_tokens: int
    status: int
    outcome: str
    """``ok``, ``overflow``, a fault kind (``rate_limit``, ``hang``, ...), or ``error``."""
    source: str
    """``script``, ``responder`` or ``policy`` (or ``-`` when no reply was chosen)."""
    authorized: bool
    received_at: float
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """The request's headers, ``authorization`` left out."""
    cache_write_tokens: int = 0
    """Tokens of the prompt written to the cache (Anthropic's Messages API)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body.get("messages") or []
        return messages


class _Script:
    __slots__ = ("loop", "position", "turns")

    def __init__(self, turns: Sequence[Turn], loop: bool) -> None:
        self.turns = list(turns)
        self.loop = loop
        self.position = 0

    def next_turn(self) -> Turn | None:
        if self.position >= len(self.turns):
            if not self.loop or not self.turns:
                return None
            self.position = 0
        turn = self.turns[self.position]
        self.position += 1
        return turn


class LocalProvider:
    """An OpenAI-compatible chat-completions server on 127.0.0.1, deterministic and instrumented.

    ``context_window``, ``overflow_format``, ``latency``, ``chunk_chars`` and ``chunk_delay`` are plain
    attributes: change them at any time, the next request uses the new value.
    """

    def __init__(
        self,
        context_window: int = 128_000,
        overflow_format: str = "openai",
        latency: float = 0.0,
        encoding: str = "o200k_base",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        chunk_chars: int = 24,
        chunk_delay: float = 0.0,
        log_size: int = 1_000,
        rpm: float | None = None,
        tpm: float | None = None,
        max_concurrent: int | None = None,
        rate_limit_headers: bool = True,
        prompt_ratio: float = 1.0,
        refuse_answer_overflow: bool = False,
    ) -> None:
        errors.overflow_error(overflow_format, 1, 1)  # fail fast on an unknown format
        self.limiter = ProviderLimiter(
            rpm=rpm, tpm=tpm, max_concurrent=max_concurrent, headers=rate_limit_headers
        )
        """Per-key limits (``rpm``, ``tpm``, ``max_concurrent``; :mod:`runtime.provider.limits`): over them a
        request gets a 429 with ``retry-after``; every answer carries OpenAI's ``x-ratelimit-*`` headers
        (unless ``rate_limit_headers`` is false). Replace it to change the limits."""
        self.context_window = context_window
        self.overflow_format = overflow_format
        self.prompt_ratio = prompt_ratio
        """Prompts are counted ``prompt_ratio`` × the encoding's count (in usage and against the window), as a
        server whose tokenizer is not ours counts them (SmolLM2's counts ~1.2 × cl100k)."""
        self.refuse_answer_overflow = refuse_answer_overflow
        """Refuse a request whose prompt + ``max_tokens`` (or ``max_completion_tokens``) exceeds the window, as
        vLLM, SGLang and OpenAI do (llama.cpp does not: it stops at its context), with the overflow error of
        ``overflow_format`` (``vllm``: "… you requested 2059 tokens (980 in the messages, 1079 in the
        completion) …")."""
        self.latency = latency
        self.chunk_chars = max(1, chunk_chars)
        self.chunk_delay = chunk_delay
        self.reasoning_field = "reasoning_content"
        """Where reasoning goes in a reply: ``reasoning_content`` (DeepSeek, litellm) or ``reasoning``
        (OpenRouter, recent vLLM and Ollama)."""
        self.host = host
        self._port = port
        self._api_key = api_key
        self._counter = TokenCounter(encoding)
        self._scripts: dict[str, _Script] = {}
        self._responders: dict[str, Responder] = {}
        self._windows: dict[str, int] = {}
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._log: deque[LoggedRequest] = deque(maxlen=log_size)
        self._stopping = threading.Event()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.cache_min_tokens: int | None = None
        """The shortest prefix the Messages endpoint caches (None: the model's minimum, as Anthropic has it)."""
        self.faults = FaultPlayer(self._stopping, self._connections)
        """How injected faults play out on the wire (:mod:`runtime.provider._faults`)."""
        self.chat = ChatEndpoint(self)
        """``POST /v1/chat/completions``: OpenAI's chat completions (:mod:`runtime.provider.chat_api`)."""
        self.messages = MessagesEndpoint(self)
        """``POST /v1/messages``: Anthropic's Messages API (:mod:`runtime.provider.anthropic_api`)."""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat.handle, methods=["POST"]),
                Route("/chat/completions", self.chat.handle, methods=["POST"]),
                Route("/v1/messages", self.messages.handle, methods=["POST"]),
                Route("/messages", self.messages.handle, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<LocalProvider {self.url if self.running else self.host} {state} window={self.context_window}>"
        )

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (the requested one before :meth:`start`, 0 meaning "a free one")."""
        return self._port

    @property
    def url(self) -> str:
        """The OpenAI base URL to give a client: ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self._port}/v1"

    @property
    def base_url(self) -> str:
        """The server's root, ``http://127.0.0.1:PORT``: Anthropic's base URL (its clients add ``/v1/messages``)."""
        return f"http://{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> LocalProvider:
        """Bind the port and serve from a daemon thread; returns once the server accepts connections."""
        import uvicorn

        if self.running:
            return self
        # IPPROTO_TCP spelled out: asyncio turns Nagle off on accepted connections only when the socket says
        # TCP (proto 0 does not), and with Nagle on, a keep-alive answer waits ~40 ms for a delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            backlog=2048,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(
            target=server.run,
            kwargs={"sockets": [sock]},
            name=f"agentcell-provider:{self._port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the local provider did not start on {self.host}:{self._port}")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: hung requests end, open connections close; returns when the thread is gone."""
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> LocalProvider:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- scripting and faults -----------------------------------------------------------------------

    def add_script(self, name: str, turns: Sequence[Turn], *, loop: bool = False) -> None:
        """Requests for model ``name`` consume ``turns`` in order (from the start again when ``loop``).

        A request after the last turn of a non-looping script fails with a 400 ``script_exhausted``.
        Adding a script under an existing name replaces it and starts from its first turn.
        """
        with self._lock:
            self._scripts[name] = _Script(turns, loop)

    def add_responder(self, name: str, respond: Responder, *, context_window: int | None = None) -> None:
        """Requests for model ``name`` are answered by ``respond(messages, tools)``: a reply computed from
        the request itself, as a real model's is (a script, by contrast, replies in a fixed order).
        ``context_window`` gives this model a window of its own (default: the provider's). An exception in
        ``respond`` is answered with a 400 naming it."""
        with self._lock:
            self._responders[name] = respond
            if context_window is None:
                self._windows.pop(name, None)
            else:
                self._windows[name] = context_window

    def remaining_turns(self, name: str) -> int:
        """How many turns of script ``name`` have not been used yet."""
        with self._lock:
            script = self._scripts[name]
            return len(script.turns) - script.position

    def inject_fault(
        self,
        kind: FaultKind,
        count: int = 1,
        *,
        retry_after: float | None = 1.0,
        status: int | None = None,
        after_chunks: int = 1,
    ) -> None:
        """Fail the next ``count`` requests (any model) with ``kind``, before any script or policy runs."""
        fault = Fault(kind=kind, retry_after=retry_after, status=status, after_chunks=after_chunks)
        with self._lock:
            self._faults.extend([fault] * count)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def request_log(self) -> list[LoggedRequest]:
        """The most recent requests, oldest first."""
        return list(self._log)

    def clear_log(self) -> None:
        self._log.clear()

    @property
    def hanging(self) -> int:
        """Requests a ``hang``, ``stall`` or ``keepalive`` fault holds now; each is let go when its client
        disconnects."""
        return self.faults.hanging

    def _connections(self) -> list[Any]:
        return list(self._server.server_state.connections) if self._server is not None else []

    # -- HTTP handlers ------------------------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def _models(self, request: Request) -> Response:
        with self._lock:
            names = [DEFAULT_MODEL, *self._scripts]
        created = int(time.time())
        data = [{"id": n, "object": "model", "created": created, "owned_by": "agentcell"} for n in names]
        return json_response(200, {"object": "list", "data": data})

    def _authorized(self, request: Request) -> bool:
        """The request carries the key (``authorization: Bearer``, or Anthropic's ``x-api-key`` on the
        Messages endpoint), or the provider takes any."""
        if self._api_key is None:
            return True
        if request.url.path.endswith("/messages") and request.headers.get("x-api-key") == self._api_key:
            return True
        header = request.headers.get("authorization", "")
        return header == f"Bearer {self._api_key}"

    def _take_fault(self) -> Fault | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def _window_of(self, model: str) -> int:
        return self._windows.get(model, self.context_window)

    def _record(
        self,
        request: Request,
        body: dict[str, Any],
        model: str,
        stream: bool,
        count: PromptCount | None,
        status: int,
        outcome: str,
        source: str,
        authorized: bool,
        received: float,
    ) -> None:
        self._log.append(
            LoggedRequest(
                model=model,
                body=body,
                stream=stream,
                prompt_tokens=count.prompt_tokens if count else 0,
                cached_tokens=count.cached_tokens if count else 0,
                cache_write_tokens=count.cache_write_tokens if count else 0,
                status=status,
                outcome=outcome,
                source=source,
                authorized=authorized,
                received_at=received,
                headers={k: v for k, v in request.headers.items() if k not in ("authorization", "x-api-key")},
            )
        )

    def _next_turn(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[Turn, str, errors.ErrorResponse | None]:
        with self._lock:
            script = self._scripts.get(model)
            turn = script.next_turn() if script is not None else None
            respond = self._responders.get(model) if script is None else None
        if respond is not None:
            try:
                return respond(messages, tools), "responder", None
            except Exception as exc:
                return Turn(), "responder", errors.bad_request(f"The responder of {model!r} failed: {exc!r}")
        if script is None:
            return policy.respond(messages, tools), "policy", None
        if turn is None:
            problem = errors.bad_request(
                f"The script {model!r} is exhausted: all {len(script.turns)} turns were used.",
                code="script_exhausted",
            )
            return Turn(), "script", problem
        return turn, "script", None
