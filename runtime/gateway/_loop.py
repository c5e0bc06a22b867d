"""The I/O loop: one asyncio event loop in a daemon thread, shared by the whole runtime (design §3.2)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from runtime.affinity import place_thread

_log = logging.getLogger("agentcell.gateway")
T = TypeVar("T")

Closer = Callable[[], Awaitable[object]]
"""An async callable run on the loop as it stops (a transport closing its connections)."""


class IoLoop:
    """One asyncio event loop running in a daemon thread, shared by the whole runtime.

    Thread-safe: :meth:`submit` and :meth:`call_soon` may be called from any thread. What registered with
    :meth:`add_closer` runs on the loop as it stops, after the tasks still running were cancelled.
    """

    def __init__(self, name: str = "agentcell-io", *, cpus: frozenset[int] | None = None) -> None:
        self._cpus = cpus  # where the loop's thread runs, and the worker threads started from it
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Future[None] = self._loop.create_future()
        self._closers: list[Closer] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        place_thread(self._cpus)
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_until_complete(self._root())
        finally:
            self._shutdown()

    async def _root(self) -> None:
        # The loop runs one long-lived root task (run_until_complete) rather than run_forever(): anyio, which
        # litellm's HTTP stack uses, ties its worker threads to the root task. Without one it takes each
        # call's own task as the root and starts (and stops) a thread per call: milliseconds each.
        await self._stopping

    def _request_stop(self) -> None:
        if not self._stopping.done():
            self._stopping.set_result(None)

    def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(self._close())
        with contextlib.suppress(RuntimeError):
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _close(self) -> None:
        for closer in self._closers:
            try:
                await closer()
            except Exception:  # one that fails to close must not keep the others open
                _log.warning("closing %r on the I/O loop's stop failed", closer, exc_info=True)
        self._closers.clear()

    def add_closer(self, closer: Closer) -> None:
        """Run ``closer()`` on the loop when it stops (once; in the order they were added)."""
        self._closers.append(closer)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._loop.is_closed()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its result (or exception) arrives in the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the loop thread, soon."""
        self._loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what is still running, stop the loop and join its thread. Idempotent."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._request_stop)
        if not self.in_loop_thread():
            self._thread.join(timeout)

    def __enter__(self) -> IoLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
