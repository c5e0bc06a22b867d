"""The gateway: every provider call of the runtime, on one asyncio loop thread (design §3.2, 3.3, 3.7).

Actors never wait for the network. They hand a :class:`CompletionRequest` to :meth:`Gateway.complete`, which
returns at once with a :class:`CallHandle`; the call runs on the :class:`IoLoop` over a transport, and its
:class:`CompletionResult` -- the assistant message with normalized usage, or a classified
:class:`ProviderError` -- comes back through ``on_result`` exactly once, from the loop thread (pass e.g.
``actor_ref.tell``). Streaming deltas, retries and stalls are reported through their own callbacks as they
happen.

Transient failures (429, 5xx, "overloaded", timeouts, connection resets) are retried with exponential
backoff and jitter, honouring ``retry-after``; overflow, auth and invalid requests never are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import msgspec
import pykka

from runtime.capacity import RateLimitInfo, Ticket, parse_rate_limit_headers
from runtime.config import RetryConfig
from runtime.gateway._admission import AdmissionControl, OnQueued, PoolState, QueueTimeout
from runtime.gateway._litellm import load_litellm
from runtime.gateway._loop import IoLoop
from runtime.gateway._models import (
    Admission,
    CompletionRequest,
    CompletionResult,
    Delta,
    ProviderError,
    RetryInfo,
)
from runtime.gateway._retry import backoff_delay
from runtime.gateway._routing import Route, Router
from runtime.gateway._windows import WindowBook
from runtime.gateway.transports.anthropic import AnthropicTransport
from runtime.gateway.transports.base import Transport
from runtime.gateway.transports.litellm import LitellmTransport
from runtime.gateway.transports.openai_compat import OpenAICompatTransport
from runtime.messages import Message, Usage

_log = logging.getLogger("agentcell.gateway")
T = TypeVar("T")


class CallHandle:
    """A call in flight. :meth:`cancel` is safe from any thread; the result then reports ``cancelled``."""

    __slots__ = ("_call", "_loop")

    def __init__(self, loop: IoLoop, call: _Call) -> None:
        self._loop = loop
        self._call = call

    @property
    def done(self) -> bool:
        return self._call.finished.is_set()

    @property
    def attempts(self) -> int:
        return self._call.attempts

    def cancel(self) -> None:
        """Stop the call; ``on_result`` still fires once, with a ``cancelled`` error (unless already done)."""
        if not self._call.finished.is_set():
            with contextlib.suppress(RuntimeError):  # loop already closed: nothing left to cancel
                self._loop.call_soon(self._call.cancel)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the result was delivered; True if it was."""
        return self._call.finished.wait(timeout)


class _Call:
    """The state of one call, owned by the loop thread (the :class:`~transports.base.Attempt` a transport
    sees)."""

    def __init__(
        self,
        request: CompletionRequest,
        on_result: Callable[[CompletionResult], object],
        on_delta: Callable[[Delta], object] | None,
        on_retry: Callable[[RetryInfo], object] | None,
        on_stall: Callable[[float], object] | None,
        stall_after: float,
        on_queued: OnQueued | None = None,
        on_admitted: Callable[[float], object] | None = None,
    ) -> None:
        self.request = request
        self.on_queued = on_queued
        self.on_admitted = on_admitted
        self.headers: Mapping[str, str] | None = None  # the last attempt's answer headers
        self.on_result = on_result
        self.on_delta = _safe(on_delta) if on_delta is not None else None
        self.on_retry = on_retry
        self.on_stall = on_stall
        self.on_answering: Callable[[], None] | None = None  # this attempt's first data (admission control)
        self.stall_after = stall_after
        self.attempts = 0
        self.refusals = 0  # 429s met while admission control paced the call (attempts that count for none)
        self.waited = 0.0  # seconds waited for capacity
        self.pool = ""
        self.transport = ""
        self.started = time.monotonic()
        self.task: asyncio.Task[CompletionResult] | None = None
        self.cancel_requested = False
        self.finished = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_activity = 0.0
        self._attempt_started = 0.0
        self.responded = False  # this attempt has the response's headers
        self.answered = False  # this attempt has had its first data (a chunk of the answer, or the body)
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_reported = False

    def cancel(self) -> None:
        self.cancel_requested = True
        if self.task is not None:
            self.task.cancel()

    def received_headers(self, headers: Mapping[str, str]) -> None:
        self.headers = headers

    # Stall watch: one timer per stall period, re-armed lazily (not per chunk).

    def response_started(self) -> None:
        """The response's headers arrived (not yet an answer: a proxy sends them before it has one)."""
        self.responded = True

    def activity(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._last_activity = loop.time()
        first = not self.answered
        self.responded = self.answered = True
        if first and self.on_answering is not None:
            self.on_answering()
        if self._stall_reported:
            self._stall_reported = False
            self._arm_stall()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._last_activity = self._attempt_started = loop.time()
        self.responded = self.answered = False
        self._stall_reported = False
        if self.on_stall is not None and self._stall_timer is None:
            self._arm_stall()

    def _arm_stall(self) -> None:
        if self._loop is not None and self.on_stall is not None:
            self._stall_timer = self._loop.call_at(self._last_activity + self.stall_after, self._check_stall)

    def _check_stall(self) -> None:
        self._stall_timer = None
        if self._loop is None or self.finished.is_set() or self.on_stall is None:
            return
        idle = self._loop.time() - self._last_activity
        if idle + 1e-3 < self.stall_after:
            self._arm_stall()
            return
        self._stall_reported = True
        # Up to 1 ms short of stall_after counts as a stall (no re-arming for a sliver); it is reported as
        # stall_after, never less.
        _safely(self.on_stall, round(max(idle, self.stall_after), 3))

    def deadline(self, retry: RetryConfig) -> tuple[float, str, float]:
        """The limit this attempt runs out of first, as things stand: when (loop time), its name and seconds.

        Every attempt has the request's timeout from its start; a streamed one also the silence limits of
        its phase (``retry.headers_timeout`` and ``retry.first_byte_timeout`` from its start until headers,
        then data, arrive; ``retry.stall_timeout`` from its last data event after that). A limit of 0 is off.
        """
        start = self._attempt_started
        limits = [(start + self.request.timeout, "request_timeout", self.request.timeout)]
        if self.request.stream:
            if not self.responded and retry.headers_timeout:
                limits.append((start + retry.headers_timeout, "headers_timeout", retry.headers_timeout))
            if not self.answered and retry.first_byte_timeout:
                limits.append(
                    (start + retry.first_byte_timeout, "first_byte_timeout", retry.first_byte_timeout)
                )
            if self.answered and retry.stall_timeout:
                limits.append(
                    (self._last_activity + retry.stall_timeout, "stall_timeout", retry.stall_timeout)
                )
        return min(limits)

    def unwatch(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._loop = None


class Gateway:
    """Runs provider calls on the :class:`IoLoop` over its transports, and delivers their results as
    callbacks (messages)."""

    def __init__(
        self,
        loop: IoLoop,
        retry: RetryConfig | None = None,
        *,
        rng: random.Random | None = None,
        max_connections: int = 1_000,
        capacity: AdmissionControl | None = None,
    ) -> None:
        self._io = loop
        self._retry = retry or RetryConfig()
        self.capacity = capacity
        """Admission control (design §3.11); None or disabled: every call goes at once."""
        self._rng = rng or random.Random()
        self._in_flight: set[_Call] = set()
        self._router = Router()
        transports: list[Transport] = [
            LitellmTransport(),
            OpenAICompatTransport(max_connections=max_connections),
            AnthropicTransport(max_connections=max_connections),
        ]
        self._transports: dict[str, Transport] = {t.name: t for t in transports}
        self.windows = WindowBook()  # the windows of endpoints litellm does not know (design §4.5)
        loop.add_closer(self.aclose)

    @property
    def retry_config(self) -> RetryConfig:
        return self._retry

    def set_capacity_shares(self, shares: Mapping[str, float], default: float) -> None:
        """Set this process's part of each capacity pool's limits (a cluster shard's lease); from any
        thread."""
        if self.capacity is not None:
            self._io.call_soon(self.capacity.set_shares, dict(shares), default)

    @property
    def in_flight(self) -> int:
        """Calls started and not yet delivered."""
        return len(self._in_flight)

    def route(self, request: CompletionRequest) -> Route:
        """Where ``request`` would go: its transport (``route(request).transport``), endpoint and why.

        Resolving a model the first time asks litellm (imported first if :meth:`preload` has not finished:
        that waits for the import); later answers come from a cache.
        """
        return self._router.route(request)

    def preload(self) -> concurrent.futures.Future[Any]:
        """Import litellm in a background thread now, so that the first call does not wait for it."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def load() -> None:
            try:
                future.set_result(load_litellm())
            except BaseException as exc:
                future.set_exception(exc)

        # httpx (which litellm imports) is imported whole here first: a module being imported on another
        # thread is already in sys.modules, and code that looks it up there (the openai SDK checks for
        # httpx so) would find it half made.
        with contextlib.suppress(ImportError):
            import httpx  # noqa: F401

        # Not a daemon: a program that exits while litellm is still importing must wait for the import.
        # A daemon thread would be frozen mid-import holding a module lock, and the first finalizer that
        # imports (litellm's HTTP handlers do, in __del__) would then hang the exit forever.
        threading.Thread(target=load, name="agentcell-litellm-import").start()
        return future

    def complete(
        self,
        request: CompletionRequest,
        on_result: Callable[[CompletionResult], object],
        *,
        on_delta: Callable[[Delta], object] | None = None,
        on_retry: Callable[[RetryInfo], object] | None = None,
        on_stall: Callable[[float], object] | None = None,
        stall_after: float = 10.0,
        on_queued: OnQueued | None = None,
        on_admitted: Callable[[float], object] | None = None,
    ) -> CallHandle:
        """Start ``request`` on the loop and return at once.

        ``on_result`` fires exactly once (from the loop thread) with the result, a classified error, or a
        ``cancelled`` error after :meth:`CallHandle.cancel`. ``on_delta`` gets each streamed piece,
        ``on_retry`` each retry before its backoff, ``on_stall`` the idle seconds once per stall (no chunk
        for ``stall_after`` seconds), ``on_queued`` ``(pool, position, estimated_wait)`` when the call
        starts waiting for its pool's capacity and ``on_admitted`` the seconds it waited when it goes
        (design §3.11). Callbacks must not block: hand the value on (e.g. ``ref.tell``).
        """
        call = _Call(request, on_result, on_delta, on_retry, on_stall, stall_after, on_queued, on_admitted)
        try:
            self._io.call_soon(self._start, call)
        except RuntimeError:  # the loop is closed
            raise RuntimeError("the gateway's I/O loop is stopped; no call can start") from None
        return CallHandle(self._io, call)

    async def acomplete(
        self,
        request: CompletionRequest,
        *,
        on_delta: Callable[[Delta], object] | None = None,
        on_retry: Callable[[RetryInfo], object] | None = None,
        on_stall: Callable[[float], object] | None = None,
        stall_after: float = 10.0,
    ) -> CompletionResult:
        """The same call, awaited from code already running on the gateway's loop."""
        future: asyncio.Future[CompletionResult] = asyncio.get_running_loop().create_future()

        def deliver(result: CompletionResult) -> None:
            if not future.done():
                future.set_result(result)

        call = _Call(request, deliver, on_delta, on_retry, on_stall, stall_after)
        self._start(call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            call.cancel()
            raise

    async def aclose(self) -> None:
        """Close every transport's connections (run on the loop as it stops)."""
        for transport in self._transports.values():
            try:
                await transport.aclose()
            except Exception:
                _log.warning("closing the %s transport failed", transport.name, exc_info=True)

    # -- on the loop thread -------------------------------------------------------------------------

    def _start(self, call: _Call) -> None:
        self._in_flight.add(call)
        if call.cancel_requested:  # cancelled before it started
            self._deliver(call, self._cancelled(call))
            return
        call.task = asyncio.get_running_loop().create_task(self._run(call))
        call.task.add_done_callback(lambda task: self._finish(call, task))

    def _finish(self, call: _Call, task: asyncio.Task[CompletionResult]) -> None:
        if task.cancelled():
            result = self._cancelled(call)
        elif (exc := task.exception()) is not None:
            _log.error("provider call failed unexpectedly", exc_info=exc)
            error = ProviderError(kind="unknown", message=f"{type(exc).__name__}: {exc}")
            result = self._result(call, error=error)
        else:
            result = task.result()
        self._deliver(call, result)

    def _deliver(self, call: _Call, result: CompletionResult) -> None:
        call.unwatch()
        self._in_flight.discard(call)
        call.finished.set()
        _safely(call.on_result, result)

    def _cancelled(self, call: _Call) -> CompletionResult:
        return self._result(call, error=ProviderError(kind="cancelled", message="the call was cancelled"))

    @staticmethod
    def _result(call: _Call, error: ProviderError) -> CompletionResult:
        return CompletionResult(
            message=None,
            error=error,
            attempts=call.attempts,
            latency=time.monotonic() - call.started,
            transport=call.transport,
            waited=call.waited,
            pool=call.pool,
        )

    async def _run(self, call: _Call) -> CompletionResult:
        request = call.request
        route = self._router.cached(request)
        if route is None:  # the model's first call: resolving it may import litellm, off the loop thread
            route = await asyncio.get_running_loop().run_in_executor(None, self._router.route, request)
        transport = self._transports[route.transport]
        call.transport = transport.name
        max_attempts = self._retry.max_attempts
        capacity = self.capacity
        pool: PoolState | None = None
        if capacity is not None and capacity.enabled and request.mock_response is None:
            pool = capacity.pool(
                model=request.model,
                endpoint=request.api_base or route.base_url or route.url or (route.provider or "default"),
                api_key=request.api_key or route.api_key,
            )
            call.pool = pool.pool.name
        while True:
            ticket = None
            if pool is not None:
                assert capacity is not None
                ticket, error = await self._admit(call, capacity, pool)
                if error is not None:
                    return self._result(call, error)
            call.attempts += 1
            call.headers = None
            call.watch(asyncio.get_running_loop())
            if ticket is not None:  # its answer beginning ends a new pool's one-at-a-time wait
                assert capacity is not None and pool is not None
                call.on_answering = partial(_answering, call, capacity, pool)
            answered = False
            try:
                message = await self._attempt(call, transport, route)
                answered = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = exc.error if isinstance(exc, _Silent) else transport.classify(exc, route)
                if request.api_key and request.api_key in error.message:  # keys never reach events or logs
                    error = msgspec.structs.replace(
                        error, message=error.message.replace(request.api_key, "***")
                    )
                paced = pool is not None and error.kind == "rate_limit"
                if paced:  # the pool pauses and the call waits again for capacity, using no attempt
                    assert capacity is not None and pool is not None and ticket is not None
                    info = parse_rate_limit_headers(call.headers or _headers_of(exc), now=time.time())
                    if info is None and error.retry_after is not None:
                        info = RateLimitInfo(retry_after=error.retry_after)
                    delay = capacity.refused(pool, ticket, info)
                    ticket = None
                    call.refusals += 1
                    limit = capacity.config.max_refusals
                    if call.refusals > limit:
                        return self._result(call, error)
                    attempt, attempts_allowed = call.refusals, limit
                else:
                    attempt = call.attempts - call.refusals  # refusals under pacing use no attempt
                    if not error.retryable or attempt >= max_attempts:
                        return self._result(call, error)
                    delay = backoff_delay(attempt, self._retry, retry_after=error.retry_after, rng=self._rng)
                    attempts_allowed = max_attempts
                info_ = RetryInfo(
                    attempt=attempt,
                    max_attempts=attempts_allowed,
                    delay=round(delay, 3),
                    error=error.message,
                    status_code=error.status_code,
                    kind=error.kind,
                )
                call.unwatch()
                if call.on_retry is not None:
                    _safely(call.on_retry, info_)
                if not paced:
                    await asyncio.sleep(delay)
                continue
            finally:
                call.unwatch()
                call.on_answering = None
                if ticket is not None:
                    assert capacity is not None and pool is not None
                    usage_out = None
                    if answered and message.usage is not None:
                        usage_out = message.usage.output_tokens
                    capacity.release(
                        pool,
                        ticket,
                        output_tokens=usage_out,
                        info=parse_rate_limit_headers(call.headers, now=time.time()) if answered else None,
                        answered=answered,
                    )
            usage = message.usage or Usage()
            return CompletionResult(
                message=message,
                usage=usage,
                attempts=call.attempts,
                latency=time.monotonic() - call.started,
                transport=call.transport,
                waited=call.waited,
                pool=call.pool,
            )

    async def _admit(
        self, call: _Call, capacity: AdmissionControl, pool: PoolState
    ) -> tuple[Ticket | None, ProviderError | None]:
        """Wait for ``pool``'s capacity for the call's next attempt: its ticket, or the ``rate_limited``
        error when its wait budget ran out."""
        request = call.request
        admission = request.admission or Admission()
        ticket = capacity.ticket(
            admission.flow,
            admission.priority,
            admission.weight,
            admission.input_tokens,
            request.max_tokens,
        )
        budget = admission.wait_budget
        if budget is None:
            budget = capacity.config.queue_timeout
        budget -= call.waited
        queued: list[bool] = []

        def on_queued(name: str, position: int, estimate: float) -> None:
            queued.append(True)
            if call.on_queued is not None:
                _safely3(call.on_queued, name, position, estimate)

        try:
            waited = await capacity.acquire(pool, ticket, budget, on_queued)
        except QueueTimeout as exc:
            call.waited += exc.waited
            total = round(call.waited, 1)
            return None, ProviderError(
                kind="rate_limited",
                message=(
                    f"rate_limited: waited {total:g} s for capacity of the pool {exc.pool!r} and gave up "
                    f"(capacity.queue_timeout is {capacity.config.queue_timeout:g} s a turn); the provider "
                    "key is busier than its limits allow"
                ),
                code="rate_limited",
            )
        call.waited += waited
        if queued and call.on_admitted is not None:
            _safely(call.on_admitted, round(waited, 3))
        return ticket, None

    async def _attempt(self, call: _Call, transport: Transport, route: Route) -> Message:
        """One attempt under its limits (:meth:`_Call.deadline`): ``request_timeout`` for the whole attempt,
        streamed or not; for a streamed one also ``retry.headers_timeout`` and ``retry.first_byte_timeout``
        until the headers and the first data event arrive, then ``retry.stall_timeout`` between data events.
        An attempt past one is cancelled and fails as a ``timeout``, which is retried. Keep-alives (SSE
        comments) reset no clock: a provider that sends only those has not answered."""
        loop = asyncio.get_running_loop()
        attempt = loop.create_task(transport.attempt(call, route))
        stall = self._retry.stall_timeout
        try:
            while True:
                deadline, name, seconds = call.deadline(self._retry)
                timeout = deadline - loop.time()
                if timeout <= 0:
                    raise _Silent(_silence_error(name, seconds, call))
                if stall and call.request.stream and not call.answered:
                    timeout = min(timeout, stall)  # look again by then: once answered, the stall limit holds
                done, _ = await asyncio.wait((attempt,), timeout=timeout)
                if done:
                    return attempt.result()
        finally:
            if not attempt.done():
                attempt.cancel()  # its own cleanup (closing the response) runs as it unwinds
                attempt.add_done_callback(_retrieve)


class _Silent(Exception):
    """An attempt cancelled for silence; carries its classified error."""

    def __init__(self, error: ProviderError) -> None:
        super().__init__(error.message)
        self.error = error


def _silence_error(limit: str, seconds: float, call: _Call) -> ProviderError:
    if limit == "request_timeout":
        what = "the attempt was not complete after"
    elif call.answered:
        what = "the stream stalled: no data for"
    elif call.responded:
        what = "no answer from the provider (headers, then no data) for"
    else:
        what = "no answer from the provider (not even headers) for"
    return ProviderError(kind="timeout", message=f"{what} {seconds:g} s (retry.{limit}); cancelled")


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Consume a cancelled attempt's outcome, so asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _safely(fn: Callable[[T], object], value: T) -> None:
    try:
        fn(value)
    except pykka.ActorDeadError:  # e.g. the result of a call cancelled as its session was deleted
        _log.debug("gateway callback %r: its actor has stopped; the value is dropped", fn)
    except Exception:
        _log.exception("gateway callback %r raised", fn)


def _safely3(fn: OnQueued, pool: str, position: int, estimate: float) -> None:
    try:
        fn(pool, position, estimate)
    except pykka.ActorDeadError:
        _log.debug("gateway callback %r: its actor has stopped; the value is dropped", fn)
    except Exception:
        _log.exception("gateway callback %r raised", fn)


def _answering(call: _Call, capacity: AdmissionControl, pool: PoolState) -> None:
    """``call``'s attempt had its first data: tell its pool, with what the answer's headers say."""
    capacity.answering(pool, parse_rate_limit_headers(call.headers, now=time.time()))


def _headers_of(exc: BaseException) -> Mapping[str, str] | None:
    headers = getattr(exc, "headers", None)
    if headers is None:
        headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    return headers if isinstance(headers, Mapping) or hasattr(headers, "items") else None


def _safe(fn: Callable[[T], object]) -> Callable[[T], None]:
    """``fn`` that never raises into the transport calling it (a subscriber's bug never breaks a call)."""

    def call(value: T) -> None:
        _safely(fn, value)

    return call


def complete_sync(
    gateway: Gateway, request: CompletionRequest, timeout: float | None = None
) -> CompletionResult:
    """Run one call and wait for its result (for tests and the CLI; never from the gateway's loop thread).

    When ``timeout`` passes first, the call is cancelled and its ``cancelled`` result returned.
    """
    if gateway._io.in_loop_thread():
        raise RuntimeError("complete_sync() would deadlock on the gateway's own loop thread; use acomplete()")
    box: list[CompletionResult] = []
    done = threading.Event()

    def deliver(result: CompletionResult) -> None:
        box.append(result)
        done.set()

    handle = gateway.complete(request, deliver)
    if not done.wait(timeout):
        handle.cancel()
        done.wait(5.0)
    if not box:
        raise TimeoutError("the gateway did not deliver a result")
    return box[0]
