"""The front's own asyncio thread: shard watches, event feeds, failovers and moves run on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from typing import Any

__all__ = ["Loop"]


class Loop:
    """An event loop on a daemon thread; :meth:`submit` runs a coroutine on it from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="agentcell-cluster", daemon=True)

    def start(self) -> Loop:
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what runs on it, stop it and wait for its thread."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.submit(cancel_all()).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
