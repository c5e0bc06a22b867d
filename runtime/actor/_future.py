"""Futures that can be waited on from threads and from asyncio, and that take done-callbacks."""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import sys
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

import pykka
from pykka import Timeout

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["OptExcInfo", "PooledFuture", "fail_future", "thread_state"]

logger = logging.getLogger("agentcell.actor")

T = TypeVar("T")
OptExcInfo: TypeAlias = tuple[type[BaseException] | None, BaseException | None, "TracebackType | None"]

thread_state = threading.local()
"""``.dispatcher`` is set on a dispatcher's threads: a blocking ``get()`` there is warned about."""


class PooledFuture(pykka.Future[T]):
    """A :class:`pykka.Future` usable from any thread and from asyncio.

    ``get()`` blocks the calling thread; ``await future`` suspends the calling coroutine without blocking
    its event loop; :meth:`add_done_callback` runs a function when the value arrives (on the thread that
    sets it — keep callbacks short, e.g. ``lambda f: ref.tell(Reply(f))``). Derived futures made by
    ``map``/``filter``/``join``/``reduce`` (and ``ActorRef.stop(block=False)``) are computed lazily by
    ``get()``, as in pykka; awaiting one runs ``get()`` in the loop's default executor.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._exc_info: OptExcInfo | None = None
        self._gates: list[threading.Lock] | None = None  # one per thread blocked in get()
        self._callbacks: list[Callable[[PooledFuture[T]], object]] | None = None

    def get(self, *, timeout: float | None = None) -> T:
        """The value, or raise the exception that was set; wait up to ``timeout`` seconds.

        Raises:
            pykka.Timeout: if no value arrives in time.
        """
        if self._get_hook is not None:
            with self._lock:  # the hook runs once even if several threads ask at the same time
                return super().get(timeout=timeout)
        if not self._done:
            self._wait(timeout)
        return self._outcome()

    def set(self, value: T | None = None) -> None:
        """Set the value. Raises :class:`queue.Full` if the future is already set."""
        self._resolve(value, None)

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        """Set an exception (``sys.exc_info()`` by default). Raises :class:`queue.Full` if already set."""
        self._resolve(None, sys.exc_info() if exc_info is None else exc_info)

    def set_get_hook(self, func: Callable[[float | None], T]) -> None:
        with self._lock:
            if self._done:
                raise queue.Full
            super().set_get_hook(func)

    def done(self) -> bool:
        """Whether a value or an exception has been set (derived futures: always False)."""
        return self._done

    def add_done_callback(self, fn: Callable[[PooledFuture[T]], object]) -> None:
        """Call ``fn(self)`` once the future is set — now, if it already is.

        The callback runs on the thread that sets the future (usually a dispatcher thread): it must be
        quick and must not block. Exceptions it raises are logged.
        """
        if self._get_hook is not None:
            raise TypeError("derived futures are computed by get(); they take no callbacks")
        with self._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def __await__(self) -> Generator[Any, None, T]:
        if self._get_hook is not None:
            loop = asyncio.get_running_loop()
            return (yield from loop.run_in_executor(None, self.get).__await__())
        if not self._done:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self.add_done_callback(functools.partial(_wake_waiter, loop, waiter))
            yield from waiter.__await__()
        return self._outcome()

    __iter__ = __await__

    def _wait(self, timeout: float | None) -> None:
        # A held lock is the cheapest one-shot gate: set() releases it, which lets acquire() return.
        gate = threading.Lock()
        gate.acquire()
        with self._lock:
            if self._done:
                return
            if self._gates is None:
                self._gates = []
            self._gates.append(gate)
        if getattr(thread_state, "dispatcher", None) is not None:
            _warn_blocking_get()
        if gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return
        with self._lock:
            if self._done:  # set while we gave up
                return
            assert self._gates is not None
            self._gates.remove(gate)
        raise Timeout(f"{timeout} seconds")

    def _resolve(self, value: Any, exc_info: OptExcInfo | None) -> None:
        with self._lock:
            if self._done or self._get_hook is not None:
                raise queue.Full
            self._value = value
            self._exc_info = exc_info
            self._done = True
            gates, callbacks = self._gates, self._callbacks
            self._gates = self._callbacks = None
        if gates:
            for gate in gates:
                gate.release()
        if callbacks:
            for fn in callbacks:
                _run_callback(fn, self)

    def _outcome(self) -> T:
        if self._exc_info is None:
            return cast(T, self._value)
        exc_type, exc_value, tb = self._exc_info
        if exc_value is None:
            assert exc_type is not None
            exc_value = exc_type()
        if exc_value.__traceback__ is not tb:
            raise exc_value.with_traceback(tb)
        raise exc_value


def _run_callback(fn: Callable[[PooledFuture[Any]], object], future: PooledFuture[Any]) -> None:
    try:
        fn(future)
    except Exception:
        logger.exception("future callback %r failed", fn)


def _wake_waiter(loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None], _: object) -> None:
    try:
        loop.call_soon_threadsafe(_set_waiter, waiter)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _set_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_warned_blocking = False


def _warn_blocking_get() -> None:
    global _warned_blocking
    if not _warned_blocking:
        _warned_blocking = True
        logger.warning(
            "a dispatcher thread is blocking on Future.get(); pooled actors must not wait for each "
            "other (reply with a message, use add_done_callback, or defer_reply) — this can deadlock"
        )


def fail_future(future: pykka.Future[Any], exc_info: OptExcInfo | None = None) -> None:
    try:
        future.set_exception(sys.exc_info() if exc_info is None else exc_info)
    except queue.Full:  # already answered
        pass
