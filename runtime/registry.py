"""The session registry (design §1.3): session id → that session's actor refs (or any handle), in O(1).

A dict behind a lock: lookups, registration and removal cost the same at 10 or 100,000 sessions, and
it is safe to use from any thread. Listing methods return snapshots, so callers can iterate while other
threads register and unregister.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

from runtime.errors import AlreadyRegistered

__all__ = ["AlreadyRegistered", "SessionRegistry"]

T = TypeVar("T")


class SessionRegistry(Generic[T]):
    """Session id → entry (e.g. a mapping of actor name to ``ActorRef``, or a session object)."""

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}
        self._lock = threading.Lock()

    def register(self, session_id: str, entry: T, *, replace: bool = False) -> None:
        """Add ``entry`` under ``session_id``.

        Raises:
            AlreadyRegistered: the id is taken and ``replace`` is False.
        """
        with self._lock:
            if not replace and session_id in self._entries:
                raise AlreadyRegistered(session_id)
            self._entries[session_id] = entry

    def swap(self, session_id: str, old: T, new: T) -> T | None:
        """Replace ``old`` with ``new`` if ``old`` is still the entry, and return the entry now: ``new``,
        or what another thread put there first (None: the id was unregistered meanwhile)."""
        with self._lock:
            current = self._entries.get(session_id)
            if current is old:
                self._entries[session_id] = current = new
            return current

    def lookup(self, session_id: str) -> T | None:
        """The entry for ``session_id``, or None."""
        return self._entries.get(session_id)

    def get(self, session_id: str, default: T | None = None) -> T | None:
        """The entry for ``session_id``, or ``default``."""
        return self._entries.get(session_id, default)

    def __getitem__(self, session_id: str) -> T:
        return self._entries[session_id]

    def unregister(self, session_id: str, entry: T | None = None) -> T | None:
        """Remove and return the entry (None if absent).

        With ``entry``, remove it only if it is still that object — so a stale owner cannot remove the
        entry of a session that was registered again since.
        """
        with self._lock:
            current = self._entries.get(session_id)
            if current is None or (entry is not None and current is not entry):
                return None
            del self._entries[session_id]
            return current

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        """A snapshot of the registered ids, in registration order."""
        with self._lock:
            return list(self._entries)

    def values(self) -> list[T]:
        """A snapshot of the entries, in registration order."""
        with self._lock:
            return list(self._entries.values())

    def items(self) -> list[tuple[str, T]]:
        """A snapshot of (id, entry) pairs, in registration order."""
        with self._lock:
            return list(self._entries.items())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
