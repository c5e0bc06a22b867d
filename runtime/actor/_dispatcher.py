"""The dispatcher: a few threads running the pooled actors that have mail, and the process-wide default."""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pykka import ActorDeadError, ActorRef

from runtime.actor._future import thread_state
from runtime.actor._pykka import ActorStop
from runtime.actor._timers import TimerHandle, Timers
from runtime.affinity import place_thread
from runtime.config import RuntimeConfig
from runtime.errors import DispatcherClosed

if TYPE_CHECKING:
    from pykka import ActorRef

    from runtime.actor._mailbox import Mailbox

    class PooledActor(Protocol):
        """What a dispatcher sees of the actors it runs (``_actor.PooledActor``, the module above it)."""

        actor_urn: str

        @property
        def actor_ref(self) -> ActorRef[Any]: ...


__all__ = ["Dispatcher", "default_dispatcher", "set_default_dispatcher"]

logger = logging.getLogger("agentcell.actor")


class Dispatcher:
    """A pool of ``threads`` threads running pooled actors that have mail, ``batch_size`` messages at a time.

    It keeps every live actor it runs (O(1) insert and remove, start order preserved), so
    :meth:`shutdown` can stop them all, newest first. Threads are daemons: call :meth:`shutdown` for an
    orderly stop (the process-wide default dispatcher is shut down at interpreter exit).
    """

    def __init__(
        self,
        threads: int | None = None,
        *,
        batch_size: int | None = None,
        name: str = "agentcell-dispatcher",
        cpus: frozenset[int] | None = None,
    ) -> None:
        defaults = RuntimeConfig()
        self.threads = threads if threads is not None else defaults.dispatcher_threads
        self.batch_size = batch_size if batch_size is not None else defaults.batch_size
        if self.threads < 1 or self.batch_size < 1:
            raise ValueError("a dispatcher needs at least one thread and a batch size of at least 1")
        self.name = name
        self.cpus = cpus
        """The CPUs its threads run on (``runtime.cpu``); None: wherever the OS puts them."""
        self._run_queue: queue.SimpleQueue[Mailbox | None] = queue.SimpleQueue()
        self._actors: dict[str, PooledActor] = {}
        self._lock = threading.Condition(threading.Lock())
        self._closing = False
        self._timers = Timers(name, cpus)
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(self.threads)
        ]
        for worker in self._workers:
            worker.start()

    def __repr__(self) -> str:
        return f"<Dispatcher {self.name!r} threads={self.threads} actors={len(self._actors)}>"

    def __len__(self) -> int:
        """The number of live actors on this dispatcher."""
        return len(self._actors)

    @property
    def closing(self) -> bool:
        """True once :meth:`shutdown` has begun: no new actors start, supervisors stop restarting."""
        return self._closing

    def get_by_urn(self, urn: str) -> ActorRef[Any] | None:
        """The live actor with this URN, in O(1)."""
        actor = self._actors.get(urn)
        return actor.actor_ref if actor is not None else None

    def actor_refs(self) -> list[ActorRef[Any]]:
        """A snapshot of the live actors' refs, in start order."""
        with self._lock:
            return [actor.actor_ref for actor in self._actors.values()]

    def call_later(self, delay: float, fn: Callable[[], None]) -> TimerHandle:
        """Call ``fn()`` on this dispatcher's timer thread after ``delay`` seconds.

        ``fn`` should be quick — typically ``lambda: ref.tell(Timeout(...))``.
        """
        return self._timers.call_later(delay, fn)

    def shutdown(self, timeout: float | None = 10.0) -> bool:
        """Stop every live actor (newest first), then the threads. Returns True if all stopped in time.

        Must not be called from one of this dispatcher's own threads.
        """
        if threading.current_thread() in self._workers:
            raise RuntimeError("a dispatcher cannot be shut down from one of its own threads")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closing = True
            actors = list(self._actors.values())
        for actor in reversed(actors):
            try:
                actor.actor_ref.tell(ActorStop())
            except ActorDeadError:
                pass
        with self._lock:
            clean = self._lock.wait_for(lambda: not self._actors, _remaining(deadline))
        for _ in self._workers:
            self._run_queue.put(None)
        for worker in self._workers:
            worker.join(_remaining(deadline))
            clean = clean and not worker.is_alive()
        self._timers.close()
        if not clean:
            logger.warning("%r did not shut down cleanly within %s s", self, timeout)
        return clean

    def _register(self, actor: PooledActor) -> None:
        with self._lock:
            if self._closing:
                raise DispatcherClosed(f"{self!r} is shutting down; cannot start {actor}")
            self._actors[actor.actor_urn] = actor

    def _unregister(self, actor: PooledActor) -> None:
        with self._lock:
            self._actors.pop(actor.actor_urn, None)
            if self._closing and not self._actors:
                self._lock.notify_all()

    def _work(self) -> None:
        place_thread(self.cpus)
        thread_state.dispatcher = self
        get, batch_size = self._run_queue.get, self.batch_size
        while (mailbox := get()) is not None:
            try:
                mailbox.run(batch_size)
            except BaseException:  # a bug in this module, not in an actor: keep the thread alive
                logger.critical("dispatcher %s failed running %s", self.name, mailbox.actor, exc_info=True)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


_default_dispatcher: Dispatcher | None = None
_default_lock = threading.Lock()
_dispatcher_numbers = itertools.count(1)


def default_dispatcher() -> Dispatcher:
    """The process-wide dispatcher (``Config.runtime`` defaults), created on first use."""
    global _default_dispatcher
    current = _default_dispatcher
    if current is not None and not current.closing:
        return current
    with _default_lock:
        if _default_dispatcher is None or _default_dispatcher.closing:
            _default_dispatcher = Dispatcher(name=f"agentcell-dispatcher-{next(_dispatcher_numbers)}")
        return _default_dispatcher


def set_default_dispatcher(dispatcher: Dispatcher | None) -> None:
    """Make ``dispatcher`` the one ``PooledActor.start()`` uses when given none (None: make one lazily)."""
    global _default_dispatcher
    with _default_lock:
        _default_dispatcher = dispatcher


@atexit.register
def _shutdown_default_dispatcher() -> None:
    dispatcher = _default_dispatcher
    if dispatcher is not None and not dispatcher.closing:
        dispatcher.shutdown(timeout=5.0)
