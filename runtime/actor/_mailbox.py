"""A pooled actor's mailbox: pykka's inbox protocol, plus the state that schedules the actor on a dispatcher."""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any, Protocol

import pykka
from pykka import ActorDeadError

from runtime.actor._future import fail_future
from runtime.actor._pykka import ActorStop, Envelope

if TYPE_CHECKING:
    from runtime.actor._exit import ActorExit, ExitReason
    from runtime.actor._stop_flag import StopFlag

    # What a mailbox sees of the modules above it (imports go one way: _actor -> _dispatcher -> _mailbox):

    class PooledActor(Protocol):
        """Its actor (``_actor.PooledActor``)."""

        actor_stopped: threading.Event
        _pooled_exit_reason: ExitReason | None

        def on_start(self) -> None: ...
        def _pooled_start(self) -> None: ...
        def _pooled_handle(self, envelope: Envelope[Any]) -> None: ...
        def _pooled_teardown(self) -> None: ...
        def _pooled_exit_notice(self) -> ActorExit: ...

    class Dispatcher(Protocol):
        """The dispatcher that runs it (``_dispatcher.Dispatcher``)."""

        _run_queue: queue.SimpleQueue[Mailbox | None]

    class Monitor(Protocol):
        """A registration that wants its actor's exit (``_monitor.Monitor``)."""

        def _deliver(self, exit_notice: ActorExit) -> None: ...


logger = logging.getLogger("agentcell.actor")

__all__ = ["Mailbox"]

_UNSTARTED, _IDLE, _SCHEDULED, _CLOSED = range(4)


class Mailbox:
    """An actor's inbox (pykka's ``ActorInbox``) that schedules its actor when mail arrives.

    ``_state`` says who owns the actor: ``_SCHEDULED`` means it is in the run queue or being run, so no
    other thread may run it; a ``put`` on an ``_IDLE`` mailbox flips it to ``_SCHEDULED`` and enqueues it.
    Producers append to ``_items`` under the lock; the runner swaps that list out and works through it
    (``_buf``/``_head``) without the lock.
    """

    __slots__ = (
        "_buf",
        "_dispatcher",
        "_head",
        "_items",
        "_lock",
        "_monitors",
        "_started",
        "_state",
        "actor",
        "exit",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Envelope[Any]] = []
        self._buf: list[Envelope[Any] | None] = []
        self._head = 0
        self._state = _UNSTARTED
        self._started = False
        self._monitors: list[Monitor] | None = None
        self._dispatcher: Dispatcher | None = None
        self.actor: PooledActor | None = None
        self.exit: ActorExit | None = None

    # pykka's ActorInbox protocol

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            state = self._state
            if state != _CLOSED:
                self._items.append(envelope)
                if state == _IDLE:
                    self._state = _SCHEDULED
        if state == _IDLE:
            assert self._dispatcher is not None
            self._dispatcher._run_queue.put(self)
        elif state == _CLOSED:
            self._reject(envelope, "not found")

    def get(self) -> Envelope[Any]:
        raise queue.Empty  # a pooled actor's mail is taken by its dispatcher, never by get()

    def empty(self) -> bool:
        return not self._items and self._head >= len(self._buf)

    # scheduling

    def start(self, dispatcher: Dispatcher) -> bool:
        """Hand the actor to ``dispatcher``; False if it was killed before it could start."""
        actor = self.actor
        if actor is None:
            return False
        # An actor without an on_start and without mail has nothing to run yet: leave it idle.
        trivial = type(actor).on_start is pykka.Actor.on_start  # type: ignore[comparison-overlap]  # (a Protocol)
        with self._lock:
            if self._state == _CLOSED:
                return False
            if self._state != _UNSTARTED:
                raise RuntimeError(f"{actor} was already started")
            self._dispatcher = dispatcher
            if trivial and not self._items:
                self._started = True
                self._state = _IDLE
                return True
            self._state = _SCHEDULED
        dispatcher._run_queue.put(self)
        return True

    def run(self, batch_size: int) -> None:
        """Handle up to ``batch_size`` messages; then go idle, re-queue, or tear the actor down."""
        actor = self.actor
        if actor is None:  # killed while it waited in the run queue
            return
        stopped: StopFlag = actor.actor_stopped  # type: ignore[assignment]  # read as ._flag: the hot loop
        if not self._started:
            self._started = True
            if not stopped._flag:  # killed before it ever ran: no on_start
                actor._pooled_start()
        handle = actor._pooled_handle
        buf: list[Any] = self._buf
        head, handled = self._head, 0
        while True:
            if stopped._flag:
                self._buf, self._head = buf, head
                actor._pooled_teardown()
                return
            if head >= len(buf):
                buf.clear()
                with self._lock:
                    items = self._items
                    if not items and not stopped._flag:
                        self._state = _IDLE
                        self._buf, self._head = buf, 0
                        return
                    self._items = buf
                buf, head = items, 0
                continue
            if handled == batch_size:
                break
            envelope = buf[head]
            buf[head] = None  # let the message go as soon as it is handled
            head += 1
            handled += 1
            handle(envelope)
        self._buf, self._head = buf, head
        assert self._dispatcher is not None
        self._dispatcher._run_queue.put(self)  # fairness: back of the queue

    def close(self, exit_notice: ActorExit) -> tuple[list[Envelope[Any]], list[Monitor]]:
        """Mark the actor ended; return the envelopes it never handled and the monitors to notify."""
        with self._lock:
            self._state = _CLOSED
            pending = [e for e in self._buf[self._head :] if e is not None]
            pending.extend(self._items)
            self._items, self._buf, self._head = [], [], 0
            monitors = self._monitors or []
            self._monitors = None
            self.exit = exit_notice
            self.actor = None
        return pending, monitors

    def kill(self) -> None:
        actor = self.actor
        if actor is None:
            return
        if actor._pooled_exit_reason is None:
            actor._pooled_exit_reason = "killed"
        actor.actor_stopped.set()
        exit_notice = actor._pooled_exit_notice()
        with self._lock:
            if self._state == _CLOSED:
                return
            monitors = self._monitors or []
            self._monitors = None  # told now; the teardown that follows will find none
            claim = self._state in (_UNSTARTED, _IDLE)
            if claim:
                self._state = _SCHEDULED
        for registration in monitors:
            registration._deliver(exit_notice)
        if claim:  # nobody is running it: tear it down here
            actor._pooled_teardown()

    def add_monitor(self, registration: Monitor) -> ActorExit | None:
        with self._lock:
            if self._state == _CLOSED:
                return self.exit
            if self._monitors is None:
                self._monitors = []
            self._monitors.append(registration)
            return None

    def remove_monitor(self, registration: Monitor) -> None:
        with self._lock:
            if self._monitors and registration in self._monitors:
                self._monitors.remove(registration)

    def _reject(self, envelope: Envelope[Any], why: str) -> None:
        exit_notice = self.exit
        name = exit_notice.ref if exit_notice is not None else "actor"
        if envelope.reply_to is None:
            if why == "not found":
                raise ActorDeadError(f"{name} not found")
            # A told message that carries its own answer (a prompt's handle) is told it was never handled:
            # nobody else would resolve that answer.
            undelivered = getattr(envelope.message, "undelivered", None)
            if callable(undelivered):
                try:
                    undelivered(f"{name} {why}")
                except Exception:
                    logger.exception("undelivered() of %r raised", type(envelope.message).__name__)
            return
        if isinstance(envelope.message, ActorStop):
            try:
                envelope.reply_to.set(None)  # it is stopped, which is what was asked
            except queue.Full:
                pass
            return
        fail_future(envelope.reply_to, (ActorDeadError, ActorDeadError(f"{name} {why}"), None))
