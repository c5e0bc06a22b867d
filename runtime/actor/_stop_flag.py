"""An actor's stopped flag that costs a bool until somebody waits on it."""

from __future__ import annotations

import threading

__all__ = ["StopFlag"]

_STOP_FLAG_LOCK = threading.Lock()


class StopFlag(threading.Event):
    """``actor_stopped`` for pooled actors: a :class:`threading.Event` that makes its condition lazily.

    A real Event allocates a Condition and a lock (about 1 KB) up front; almost nobody ever waits on an
    actor's stopped flag, so this one is a bool until somebody does.
    """

    def __init__(self) -> None:  # deliberately not calling Event.__init__
        self._flag = False
        self._waiter: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    isSet = is_set  # threading.Event's legacy alias

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None:
            waiter.set()

    def clear(self) -> None:
        self._flag = False
        waiter = self._waiter
        if waiter is not None:
            waiter.clear()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        with _STOP_FLAG_LOCK:
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = threading.Event()
        # set() stores the flag before reading _waiter; we stored _waiter before reading the flag.
        if self._flag:
            return True
        return waiter.wait(timeout)

    def _at_fork_reinit(self) -> None:
        self._waiter = None
