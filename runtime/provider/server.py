"""The local OpenAI-compatible provider: a Starlette app on uvicorn, in a background thread.

``POST /v1/chat/completions`` (streamed as SSE or not) and ``GET /v1/models``. Replies come from a script
selected by the request's ``model`` (see :mod:`runtime.provider.script`) or from the built-in policy
(:mod:`runtime.provider.policy`). Usage is exact (:mod:`runtime.provider.usage`). A request over the
context window fails with the configured vendor's overflow error (:mod:`runtime.provider.errors`).

Example::

    with LocalProvider(context_window=8_000, overflow_format="anthropic").start() as provider:
        provider.add_script("hello", [Turn(text="Hi!")])
        litellm.completion(model="openai/hello", api_base=provider.url, api_key="sk-local", messages=...)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from runtime.provider import errors, policy
from runtime.provider._http import error_response, fault_status, json_response
from runtime.provider.anthropic_api import MessagesEndpoint
from runtime.provider.limits import Decision, ProviderLimiter
from runtime.provider.script import Fault, FaultKind, ToolCallSpec, Turn
from runtime.provider.usage import PromptCount, TokenCounter

DEFAULT_MODEL: Final = "agentcell-local"
_SSE_DONE: Final = b"data: [DONE]\n\n"

Responder = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], Turn]
"""A reply computed from a request's messages and tools (see :meth:`LocalProvider.add_responder`)."""
_log = logging.getLogger("agentcell.provider")
_json = msgspec.json.Encoder()
_decode_body = msgspec.json.Decoder(dict[str, Any])


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
        self._hanging = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.cache_min_tokens: int | None = None
        """The shortest prefix the Messages endpoint caches (None: the model's minimum, as Anthropic has it)."""
        self.messages = MessagesEndpoint(self)
        """``POST /v1/messages``: Anthropic's Messages API (:mod:`runtime.provider.anthropic_api`)."""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/chat/completions", self._chat_completions, methods=["POST"]),
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
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
        return self._hanging

    # -- HTTP handlers ------------------------------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def _models(self, request: Request) -> Response:
        with self._lock:
            names = [DEFAULT_MODEL, *self._scripts]
        created = int(time.time())
        data = [{"id": n, "object": "model", "created": created, "owned_by": "agentcell"} for n in names]
        return json_response(200, {"object": "list", "data": data})

    async def _chat_completions(self, request: Request) -> Response:
        received = time.time()
        authorized = self._authorized(request)
        try:
            body = _decode_body.decode(await request.body())
        except msgspec.DecodeError as exc:
            return error_response(
                errors.bad_request(f"We could not parse the JSON body of your request: {exc}")
            )
        model = _model_name(body.get("model"))
        stream = bool(body.get("stream"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return error_response(
                errors.bad_request("'messages' must be an array of objects", param="messages")
            )

        def log(status: int, outcome: str, count: PromptCount | None = None, source: str = "-") -> None:
            self._record(request, body, model, stream, count, status, outcome, source, authorized, received)

        if not authorized:
            log(401, "auth")
            return error_response(errors.auth_error())
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        count = self._counter.prompt(messages, tools, model=model).scaled(self.prompt_ratio)
        limiter = self.limiter
        if not limiter.active:
            return await self._answer(request, body, model, stream, messages, tools, count, log, {})
        key = _bearer(request)
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        tokens = count.prompt_tokens + (cap if isinstance(cap, int) and cap > 0 else 0)
        decision = limiter.admit(key, tokens, time.monotonic())
        if not decision.admitted:
            log(429, "rate_limit", count)
            return error_response(_limit_error(model, decision, limiter))
        try:
            response = await self._answer(
                request, body, model, stream, messages, tools, count, log, decision.headers
            )
        except BaseException:
            limiter.release(key)
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = _released(response.body_iterator, limiter, key)
        else:
            limiter.release(key)
        return response

    async def _answer(
        self,
        request: Request,
        body: dict[str, Any],
        model: str,
        stream: bool,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        count: PromptCount,
        log: Callable[..., None],
        limit_headers: dict[str, str],
    ) -> Response:
        fault = self._take_fault()
        window = self._window_of(model)
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        completion = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else 0
        answer = completion if self.refuse_answer_overflow else 0
        if fault is None and count.prompt_tokens + answer > window:
            error = errors.overflow_error(self.overflow_format, count.prompt_tokens, window, completion)
            log(error.status, "overflow", count)
            return error_response(error)
        source = "policy"
        if fault is None:
            turn, source, problem = self._next_turn(model, messages, tools)
            if problem is not None:
                log(problem.status, "error", count, source)
                return error_response(problem)
            fault = turn.fault
        else:
            turn = Turn()
        if fault is not None:
            log(fault_status(fault, overloaded=503), fault.kind, count, source)
            return await self._fault_response(request, fault, model, count, stream)
        delay = self.latency if turn.latency is None else turn.latency
        if delay > 0:
            await asyncio.sleep(delay)
        log(200, "ok", count, source)
        turn = self._counter.cut(turn, body.get("max_completion_tokens") or body.get("max_tokens"))
        reply = _Reply(turn, model, count, self._counter, self.reasoning_field)
        if not stream:
            return json_response(200, reply.completion(), limit_headers or None)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        frames = reply.sse_frames(self.chunk_chars, include_usage)
        headers = {**_SSE_HEADERS, **limit_headers} if limit_headers else _SSE_HEADERS
        if self.chunk_delay <= 0:
            return Response(b"".join(frames), media_type="text/event-stream", headers=headers)
        return StreamingResponse(self._paced(frames), media_type="text/event-stream", headers=headers)

    def _authorized(self, request: Request) -> bool:
        """The request carries the key (``authorization: Bearer``, or Anthropic's ``x-api-key`` on the
        Messages endpoint), or the provider takes any."""
        if self._api_key is None:
            return True
        if request.url.path.endswith("/messages") and request.headers.get("x-api-key") == self._api_key:
            return True
        header = request.headers.get("authorization", "")
        return header == f"Bearer {self._api_key}"

    def _bearer_of(self, request: Request) -> str:
        return _bearer(request)

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

    async def _paced(self, frames: Iterator[bytes]) -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame
            if frame is not _SSE_DONE:
                await asyncio.sleep(self.chunk_delay)

    async def _fault_response(
        self, request: Request, fault: Fault, model: str, count: PromptCount, stream: bool
    ) -> Response:
        def overflow(prompt: int) -> errors.ErrorResponse:
            return errors.overflow_error(self.overflow_format, prompt, self.context_window)

        error = b"data: " + _json.encode(errors.server_error().body) + b"\n\n"
        words = errors.FaultWords(
            rate_limit=lambda: errors.rate_limit_error(model, fault.retry_after),
            server_error=errors.server_error,
            overloaded=errors.overloaded_error,
            auth=errors.auth_error,
            overflow=overflow,
            frames=lambda phrase: self._fault_frames(phrase, model, count),
            error_event=error,
        )
        return await self.fault_response(request, fault, count, stream, words)

    async def fault_response(
        self, request: Request, fault: Fault, count: PromptCount, stream: bool, words: errors.FaultWords
    ) -> Response:
        """The answer of an injected ``fault``, in the words of an endpoint's dialect."""
        match fault.kind:
            case "rate_limit":
                return error_response(words.rate_limit())
            case "server_error":
                return error_response(words.server_error(fault.status))
            case "overloaded":
                return error_response(words.overloaded(fault.status))
            case "auth":
                return error_response(words.auth())
            case "overflow":
                return error_response(words.overflow(max(count.prompt_tokens, self.context_window + 1)))
            case "hang":
                await self._hang(request)
                return Response(status_code=504)
            case "stall":
                if not stream:
                    await self._hang(request)
                    return Response(status_code=504)
                frames = words.frames("This reply stops and stays silent ")
                return _sse(self._stall_after(request, frames, fault.after_chunks))
            case "keepalive":
                if not stream:
                    await self._hang(request)
                    return Response(status_code=504)
                frames = words.frames("This reply waits forever ")
                return _sse(self._keep_alive_after(request, frames, fault.after_chunks, words.keepalive))
            case "stream_error":
                if not stream:
                    return error_response(words.server_error(None))
                pieces = list(words.frames("This reply breaks off "))
                head = pieces[: max(0, fault.after_chunks)]
                return Response(
                    b"".join([*head, words.error_event]), media_type="text/event-stream", headers=_SSE_HEADERS
                )
            case "reset":
                if not stream or fault.after_chunks <= 0:
                    self._reset_connection(request)
                    return Response(status_code=500)
                frames = words.frames("This reply is cut off in the middle ")
                return _sse(self._cut_after(request, frames, fault.after_chunks))
        raise AssertionError(f"unhandled fault {fault.kind}")  # pragma: no cover

    def _fault_frames(self, phrase: str, model: str, count: PromptCount) -> Iterator[bytes]:
        """The SSE frames of a reply that a mid-stream fault breaks into (``phrase`` four times over)."""
        reply = _Reply(Turn(text=phrase * 4), model, count, self._counter)
        return reply.sse_frames(max(1, self.chunk_chars // 2), include_usage=True)

    async def _hang(self, request: Request) -> None:
        self._hanging += 1  # only the server's loop thread changes it
        try:
            while not self._stopping.is_set():
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.05)
        finally:
            self._hanging -= 1

    async def _stall_after(
        self, request: Request, frames: Iterator[bytes], count: int
    ) -> AsyncIterator[bytes]:
        for i, frame in enumerate(frames):
            if i >= count:
                break
            yield frame
        await self._hang(request)

    async def _keep_alive_after(
        self, request: Request, frames: Iterator[bytes], count: int, keepalive: bytes = b": keep-alive\n\n"
    ) -> AsyncIterator[bytes]:
        for i, frame in enumerate(frames):
            if i >= count:
                break
            yield frame
        self._hanging += 1
        try:
            while not self._stopping.is_set() and not await request.is_disconnected():
                yield keepalive
                await asyncio.sleep(0.1)
        finally:
            self._hanging -= 1

    async def _cut_after(self, request: Request, frames: Iterator[bytes], count: int) -> AsyncIterator[bytes]:
        for i, frame in enumerate(frames):
            if i >= count:
                break
            yield frame
            await asyncio.sleep(0.01)  # let the chunk reach the client before the cut
        self._reset_connection(request)
        await asyncio.sleep(0.01)  # let uvicorn notice the lost connection before the response ends

    def _reset_connection(self, request: Request) -> None:
        """Abort the request's TCP connection with an RST (SO_LINGER 0), as a crashed peer would."""
        client = request.scope.get("client")
        connections = self._server.server_state.connections if self._server is not None else ()
        for connection in list(connections):
            if getattr(connection, "client", None) == tuple(client or ()):
                transport = connection.transport
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
                return
        _log.warning("reset fault: no connection found for client %s", client)


_SSE_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _bearer(request: Request) -> str:
    """The request's API key (its bearer token), the key its limits are counted under."""
    header = request.headers.get("authorization", "")
    return header[7:] if header.startswith("Bearer ") else ""


def _limit_error(model: str, decision: Decision, limiter: ProviderLimiter) -> errors.ErrorResponse:
    value = {"requests": limiter.rpm, "tokens": limiter.tpm}.get(decision.limit) or limiter.max_concurrent
    return errors.rate_limit_error(
        model,
        decision.retry_after,
        limit=decision.limit,
        limit_value=int(value or 0),
        headers=decision.headers,
    )


async def _released(body: Any, limiter: ProviderLimiter, key: str) -> AsyncIterator[Any]:
    """A streamed body that frees its request's concurrent slot when it ends (or is cut off)."""
    try:
        async for piece in body:
            yield piece
    finally:
        limiter.release(key)


def _model_name(raw: Any) -> str:
    name = raw if isinstance(raw, str) and raw else DEFAULT_MODEL
    return name.removeprefix("openai/")


def _sse(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=_SSE_HEADERS)


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Reply:
    """One reply rendered as a chat completion or as SSE chunks, with exact usage."""

    def __init__(
        self,
        turn: Turn,
        model: str,
        count: PromptCount,
        counter: TokenCounter,
        reasoning_field: str = "reasoning_content",
    ) -> None:
        self.turn = turn
        self.reasoning_field = reasoning_field
        self.model = model
        self.id = "chatcmpl-" + os.urandom(12).hex()
        self.created = int(time.time())
        self.calls = [(spec.id or f"call_{os.urandom(12).hex()}", spec) for spec in turn.tool_calls]
        completion, reasoning = counter.completion(
            turn.text, turn.reasoning, [(spec.name, spec.arguments) for spec in turn.tool_calls]
        )
        prompt_tokens = count.prompt_tokens if turn.prompt_tokens is None else turn.prompt_tokens
        self.usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": count.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _thinking_blocks(self) -> list[dict[str, Any]] | None:
        if not self.turn.reasoning or self.turn.reasoning_signature is None:
            return None
        return [
            {"type": "thinking", "thinking": self.turn.reasoning, "signature": self.turn.reasoning_signature}
        ]

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.turn.text or None}
        if self.turn.reasoning:
            message[self.reasoning_field] = self.turn.reasoning
        blocks = self._thinking_blocks()
        if blocks:
            message["thinking_blocks"] = blocks
        if self.calls:
            message["tool_calls"] = [_tool_call(call_id, spec) for call_id, spec in self.calls]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_agentcell",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.turn.effective_finish_reason,
                }
            ],
            "usage": self.usage,
        }

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_agentcell",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        return b"data: " + _json.encode(chunk) + b"\n\n"

    def sse_frames(self, size: int, include_usage: bool) -> Iterator[bytes]:
        """The reply as SSE frames: role, reasoning, content, tool calls (arguments split), finish, usage."""
        yield self._chunk({"role": "assistant", "content": ""})
        pieces = _pieces(self.turn.reasoning, size)
        blocks = self._thinking_blocks()
        for i, piece in enumerate(pieces):
            delta: dict[str, Any] = {self.reasoning_field: piece}
            if blocks and i == len(pieces) - 1:
                delta["thinking_blocks"] = [{**blocks[0], "thinking": ""}]
            yield self._chunk(delta)
        for piece in _pieces(self.turn.text, size):
            yield self._chunk({"content": piece})
        for index, (call_id, spec) in enumerate(self.calls):
            head = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": spec.name, "arguments": ""},
            }
            yield self._chunk({"tool_calls": [head]})
            for piece in _pieces(spec.arguments, size):
                yield self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield self._chunk({}, self.turn.effective_finish_reason)
        if include_usage:
            usage_chunk = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": "fp_agentcell",
                "choices": [],
                "usage": self.usage,
            }
            yield b"data: " + _json.encode(usage_chunk) + b"\n\n"
        yield _SSE_DONE


def _tool_call(call_id: str, spec: ToolCallSpec) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": spec.name, "arguments": spec.arguments}}
