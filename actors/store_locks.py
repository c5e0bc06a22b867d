"""Which session store of this process holds which session's lock (design §2.3), and waiting for a stopped
store to let go of it: process-wide, shared by every session's stores and the sessions that restart them."""

from __future__ import annotations

import threading
from typing import Any

import pykka

from runtime.store.session_lock import SessionLock

__all__ = ["RELEASE_WAIT", "LockHolders", "lock_holders", "wait_lock_released"]

RELEASE_WAIT = 5.0  # seconds a restarting store waits for its stopped predecessor to let go of the lock


class LockHolders:
    """Which store of this process holds which session's lock.

    A store releases its lock from the writer thread once its last writes are done, so a restarted store
    may find the lock still held by its stopped predecessor (wait for it) — or by a live second store of
    the same session (refuse at once). A store that fails leaves its lock here (:meth:`park`) for the store
    its supervisor starts in its place (:meth:`take`): the lock file is not deleted and created again, which
    on a full disk fails (its owner cannot be written) and restarted the store over and over. A parked lock
    nobody takes within ``release_wait`` seconds (the supervisor gave up, or stopped) is released.
    """

    def __init__(self, release_wait: float = RELEASE_WAIT) -> None:
        self.release_wait = release_wait
        self._guard = threading.Condition(threading.Lock())
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._parked: dict[str, SessionLock] = {}

    def add(self, key: str, ref: pykka.ActorRef[Any]) -> None:
        with self._guard:
            self._refs[key] = ref

    def remove(self, key: str, ref: pykka.ActorRef[Any]) -> None:
        with self._guard:
            if self._refs.get(key) is ref:
                del self._refs[key]
                self._guard.notify_all()

    def park(self, key: str, lock: SessionLock) -> None:
        """Keep the lock of a store that failed for its successor; release it if none takes it in time."""
        with self._guard:
            self._parked[key] = lock
        timer = threading.Timer(self.release_wait, self.unpark, (key, lock))
        timer.daemon = True
        timer.start()

    def take(self, key: str, ref: pykka.ActorRef[Any]) -> SessionLock | None:
        """The lock a failed store of this session left, now held by ``ref``; None if there is none."""
        with self._guard:
            lock = self._parked.pop(key, None)
            if lock is not None:
                self._refs[key] = ref
            return lock

    def unpark(self, key: str, lock: SessionLock | None = None) -> None:
        """Release the parked lock ``key`` (only if it is ``lock``, when given): nobody takes it over."""
        with self._guard:
            parked = self._parked.get(key)
            if parked is None or (lock is not None and parked is not lock):
                return
            del self._parked[key]
            failed = self._refs.get(key)  # the store that parked it (a successor may lock it once released)
        parked.release()
        with self._guard:
            if self._refs.get(key) is failed:
                self._refs.pop(key, None)
            self._guard.notify_all()

    def wait_released(self, key: str, timeout: float) -> bool:
        """Wait until no store of this process holds the lock ``key`` (a stopped store lets go of it from
        the writer thread once its last writes are done); False if one still does after ``timeout``. A lock
        parked for a successor is released at once: the caller has stopped the session's stores."""
        with self._guard:
            if not self._guard.wait_for(lambda: key not in self._refs or key in self._parked, timeout):
                return False
        self.unpark(key)
        with self._guard:
            return self._guard.wait_for(lambda: key not in self._refs, timeout)

    def alive(self, key: str) -> bool:
        with self._guard:
            ref = self._refs.get(key)
        return ref is not None and ref.is_alive()


lock_holders = LockHolders()


def wait_lock_released(lock_path: str, timeout: float) -> bool:
    """Wait until this process's stores have let go of the session lock at ``lock_path``: after that,
    another process may open the session (a stop returns before the writer has released it)."""
    return lock_holders.wait_released(lock_path, timeout)
