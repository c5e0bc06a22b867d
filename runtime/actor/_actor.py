"""Pooled pykka actors: many actors sharing a few threads (SPEC 1.1).

pykka's :class:`~pykka.ThreadingActor` spends one OS thread per actor. :class:`PooledActor` keeps pykka's
contract — :class:`~pykka.ActorRef`, ``tell``/``ask``, proxies, futures, ``on_start``/``on_stop``/
``on_failure``, one message at a time, FIFO per sender — but runs on a :class:`Dispatcher`: a small pool
of threads and a run queue of actors that have mail. A dispatcher thread handles up to ``batch_size``
messages of one actor, then puts it at the back of the run queue so a busy actor cannot starve the rest.

Differences from pykka, all deliberate:

* Failures are contained. An exception (or a ``BaseException`` such as ``SystemExit``) escaping a handler
  stops that actor only; pykka would call ``ActorRegistry.stop_all()`` for a ``BaseException``. Whoever
  :func:`monitor`\\ s the actor (its supervisor) receives an :class:`ActorExit` saying why it ended.
* Pooled actors are not put in pykka's global ``ActorRegistry`` (a list scanned on every lookup and
  removal); each dispatcher tracks its live actors in a dict instead.
* Futures (:class:`PooledFuture`) can be awaited from asyncio without blocking the event loop, and take
  done-callbacks, so actors can wait for a reply as a message instead of blocking a dispatcher thread.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import heapq
import itertools
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Final, Literal, Self, TypeAlias, TypeVar, cast

import msgspec
import pykka
from pykka import ActorDeadError, ActorRef, Timeout
from pykka._envelope import Envelope
from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr, _ActorStop

from runtime.affinity import place_thread
from runtime.config import RuntimeConfig
from runtime.errors import DispatcherClosed

if TYPE_CHECKING:
    from types import TracebackType

    from pykka._actor import ActorInbox

__all__ = [
    "ActorExit",
    "Dispatcher",
    "DispatcherClosed",
    "Monitor",
    "PooledActor",
    "PooledFuture",
    "TimerHandle",
    "default_dispatcher",
    "kill",
    "monitor",
    "set_default_dispatcher",
]

logger = logging.getLogger("agentcell.actor")

T = TypeVar("T")
OptExcInfo: TypeAlias = tuple[type[BaseException] | None, BaseException | None, "TracebackType | None"]
ExitReason = Literal["normal", "failure", "killed"]

_thread_state = threading.local()  # .dispatcher is set on dispatcher threads


# --- futures -------------------------------------------------------------------------------------------


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
        if getattr(_thread_state, "dispatcher", None) is not None:
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


def _fail_future(future: pykka.Future[Any], exc_info: OptExcInfo | None = None) -> None:
    try:
        future.set_exception(sys.exc_info() if exc_info is None else exc_info)
    except queue.Full:  # already answered
        pass


# --- actor lifecycle bookkeeping -----------------------------------------------------------------------


class _StopFlag(threading.Event):
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


_STOP_FLAG_LOCK = threading.Lock()


class ActorExit(msgspec.Struct, frozen=True):
    """What a monitor receives when a pooled actor ends.

    ``reason`` is ``"normal"`` (it was stopped), ``"failure"`` (an exception escaped a handler or a hook;
    ``exception`` says which) or ``"killed"`` (:func:`kill`).
    """

    ref: ActorRef[Any]
    reason: ExitReason
    exception: BaseException | None = None

    @property
    def abnormal(self) -> bool:
        """True unless the actor stopped normally (what a ``transient`` restart policy looks at)."""
        return self.reason != "normal"


class Monitor:
    """A registration made by :func:`monitor`; :meth:`cancel` it to stop caring."""

    __slots__ = ("_mailbox", "_notify", "ref")

    def __init__(
        self,
        ref: ActorRef[Any],
        mailbox: _Mailbox,
        notify: ActorRef[Any] | Callable[[ActorExit], None],
    ) -> None:
        self.ref = ref
        self._mailbox = mailbox
        self._notify = notify

    def cancel(self) -> None:
        """Do not deliver the exit notice (no-op if it was already delivered)."""
        self._mailbox.remove_monitor(self)

    def _deliver(self, exit_notice: ActorExit) -> None:
        notify = self._notify
        if isinstance(notify, ActorRef):
            try:
                notify.tell(exit_notice)
            except ActorDeadError:
                pass
            return
        try:
            notify(exit_notice)
        except Exception:
            logger.exception("monitor callback %r failed", notify)


def monitor(ref: ActorRef[Any], notify: ActorRef[Any] | Callable[[ActorExit], None]) -> Monitor:
    """Tell ``notify`` (an actor, or a function) how the pooled actor behind ``ref`` ends.

    ``notify`` receives exactly one :class:`ActorExit`: an actor ref gets it as a message, a function is
    called with it on the thread where the actor ended (keep it short). Monitoring an actor that has
    already ended delivers its exit at once.

    Raises:
        TypeError: ``ref`` is not a :class:`PooledActor`'s ref.
    """
    mailbox = ref.actor_inbox
    if not isinstance(mailbox, _Mailbox):
        raise TypeError(f"only pooled actors can be monitored, not {ref}")
    registration = Monitor(ref, mailbox, notify)
    exit_notice = mailbox.add_monitor(registration)
    if exit_notice is not None:
        registration._deliver(exit_notice)
    return registration


def kill(ref: ActorRef[Any]) -> bool:
    """Stop a pooled actor without running ``on_stop`` and without waiting for it (OTP's ``brutal_kill``).

    It handles no further messages, its monitors get ``ActorExit(reason="killed")`` now, and asks still in
    its inbox fail with :class:`pykka.ActorDeadError`. A handler that is running right now cannot be
    interrupted; it finishes on its thread and its reply is discarded. Returns False if ``ref`` is not a
    pooled actor (nothing can be done to it), True otherwise.
    """
    mailbox = ref.actor_inbox
    if not isinstance(mailbox, _Mailbox):
        return False
    mailbox.kill()
    return True


# --- the mailbox: inbox + scheduling state -------------------------------------------------------------

_UNSTARTED, _IDLE, _SCHEDULED, _CLOSED = range(4)
_PYKKA_MESSAGES: Final = frozenset((_ActorStop, ProxyCall, ProxyGetAttr, ProxySetAttr))


class _Mailbox:
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
        trivial = type(actor).on_start is pykka.Actor.on_start
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
        stopped: _StopFlag = actor.actor_stopped  # type: ignore[assignment]  # read as ._flag: the hot loop
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
            return
        if isinstance(envelope.message, _ActorStop):
            try:
                envelope.reply_to.set(None)  # it is stopped, which is what was asked
            except queue.Full:
                pass
            return
        _fail_future(envelope.reply_to, (ActorDeadError, ActorDeadError(f"{name} {why}"), None))


# --- the actor -----------------------------------------------------------------------------------------


def _new_urn() -> str:
    # uuid.uuid4().urn without building a UUID object: ~1.6x faster, which shows when starting 100k actors.
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class PooledActor(pykka.Actor):
    """A pykka actor scheduled on a shared :class:`Dispatcher` instead of a thread of its own.

    Use it exactly like :class:`pykka.ThreadingActor`::

        class Counter(PooledActor):
            def __init__(self) -> None:
                super().__init__()
                self.n = 0

            def on_receive(self, message: Any) -> Any:
                self.n += 1
                return self.n

        ref = Counter.start()                # or Counter.start(dispatcher=my_dispatcher)
        ref.tell("x"); assert ref.ask("x") == 2
        assert Counter.start().proxy().n.get() == 0
        ref.stop()

    A handler must not block its dispatcher thread for long (no network or disk waits, no blocking
    ``ask``/``get`` on another pooled actor): hand slow work elsewhere and receive the result as a
    message, or answer an ask later with :meth:`defer_reply`.

    An exception escaping a ``tell``-ed message, ``on_start``, ``on_stop`` or ``on_failure`` — including a
    ``BaseException`` — stops this actor only, after ``on_failure`` (for message handlers), and its
    monitors receive ``ActorExit(reason="failure")``. An exception from an ``ask``-ed message goes back
    to the asker and the actor lives on, as in pykka; a ``BaseException`` there fails the actor too, and
    the asker gets :class:`pykka.ActorDeadError`.
    """

    _pooled_dispatcher: Dispatcher | None = None
    _pooled_exit_reason: ExitReason | None = None
    _pooled_exit_exception: BaseException | None = None
    _pooled_reply: pykka.Future[Any] | None = None
    _pooled_stash: list[Envelope[Any]] | None = None  # messages put aside by stash(); None: none

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        # pykka.Actor.__init__ is replaced, not extended: its threading.Event costs ~1 KB per actor.
        mailbox = cast(_Mailbox, self._create_actor_inbox())
        mailbox.actor = self
        self._pooled_mailbox = mailbox
        self.actor_urn = _new_urn()
        self.actor_inbox = mailbox
        self.actor_stopped = _StopFlag()
        self._actor_ref = ActorRef(self)

    @classmethod
    def start(cls, *args: Any, dispatcher: Dispatcher | None = None, **kwargs: Any) -> ActorRef[Self]:
        """Create the actor with ``*args, **kwargs`` and schedule it on ``dispatcher`` (default: the
        process-wide one from :func:`default_dispatcher`). ``on_start`` runs on a dispatcher thread before
        the first message.

        Raises:
            DispatcherClosed: the dispatcher is shutting down.
        """
        target = dispatcher if dispatcher is not None else default_dispatcher()
        obj = cls(*args, **kwargs)
        if not isinstance(getattr(obj, "_pooled_mailbox", None), _Mailbox):
            raise TypeError(f"{cls.__name__}.__init__() must call super().__init__()")
        obj._pooled_dispatcher = target
        target._register(obj)
        obj._start_actor_loop()
        return obj.actor_ref

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return _Mailbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return PooledFuture()

    def _start_actor_loop(self) -> None:
        dispatcher = self._pooled_dispatcher
        assert dispatcher is not None
        if not self._pooled_mailbox.start(dispatcher):
            dispatcher._unregister(self)  # killed before it started

    @property
    def actor_dispatcher(self) -> Dispatcher | None:
        """The dispatcher this actor runs on (None before it is started)."""
        return self._pooled_dispatcher

    def defer_reply(self) -> pykka.Future[Any] | None:
        """Take over the reply to the message being handled; the handler's return value is then ignored.

        Returns the asker's future — set it later (from any thread) with ``set(value)`` or
        ``set_exception(exc_info)`` — or None if the message was a ``tell``. This is how an actor answers
        an ``ask`` whose answer needs another actor's reply without blocking its dispatcher thread.
        """
        reply, self._pooled_reply = self._pooled_reply, None
        return reply

    def stash(self, message: Any) -> None:
        """Put ``message``, the one being handled, aside with its reply until :meth:`unstash_all`.

        For an actor that cannot handle messages yet (a store still opening its log): its handler stashes
        them and returns. An asker keeps waiting; if the actor stops first, the ask fails with
        :class:`pykka.ActorDeadError`, as for mail still in the inbox.
        """
        stash = self._pooled_stash
        if stash is None:
            stash = self._pooled_stash = []
        stash.append(Envelope(message, reply_to=self.defer_reply()))

    def unstash_all(self) -> None:
        """Handle the stashed messages now, in the order they arrived, before anything still in the inbox.

        Call it from a handler. Each is handled as if it had just arrived (an ask gets its reply, or its
        exception). If one of them stops the actor, the rest are rejected like mail to a stopped actor.
        """
        stash, self._pooled_stash = self._pooled_stash, None
        if not stash:
            return
        reply = self._pooled_reply  # the reply of the message whose handler is unstashing: keep it
        try:
            for envelope in stash:
                if self.actor_stopped.is_set():
                    self._pooled_mailbox._reject(envelope, "stopped before handling the message")
                else:
                    self._pooled_handle(envelope)
        finally:
            self._pooled_reply = reply

    # --- what the dispatcher calls -------------------------------------------------------------------

    def _pooled_start(self) -> None:
        logger.debug("Starting %s", self)
        try:
            self.on_start()
        except BaseException:
            self._handle_failure(*sys.exc_info())

    def _pooled_handle(self, envelope: Envelope[Any]) -> None:
        reply_to = self._pooled_reply = envelope.reply_to
        try:
            message = envelope.message
            # pykka's own messages (stop, proxy calls) take its route; the others go straight to on_receive
            if type(message) in _PYKKA_MESSAGES:
                response = self._handle_receive(message)
            else:
                response = self.on_receive(message)
            if reply_to is not None and self._pooled_reply is not None:  # answered here, not deferred
                self._pooled_reply = None
                reply_to.set(response)
        except Exception:
            self._pooled_reply = None
            if reply_to is not None:
                logger.info("Exception returned from %s to caller:", self, exc_info=True)
                _fail_future(reply_to)
            else:
                self._pooled_fail(*sys.exc_info())
        except BaseException as exc:
            self._pooled_reply = None
            if reply_to is not None:
                dead = ActorDeadError(f"{self.actor_ref} stopped by {exc!r} while handling the message")
                _fail_future(reply_to, (ActorDeadError, dead, None))
            self._pooled_fail(*sys.exc_info())

    def _pooled_teardown(self) -> None:
        exit_notice = self._pooled_exit_notice()
        pending, monitors = self._pooled_mailbox.close(exit_notice)
        if self._pooled_dispatcher is not None:
            self._pooled_dispatcher._unregister(self)
        stash, self._pooled_stash = self._pooled_stash, None
        for envelope in (*stash, *pending) if stash else pending:
            self._pooled_mailbox._reject(envelope, "stopped before handling the message")
        for registration in monitors:
            registration._deliver(exit_notice)
        logger.debug("Stopped %s (%s)", self, self._pooled_exit_reason)

    def _pooled_exit_notice(self) -> ActorExit:
        return ActorExit(self.actor_ref, self._pooled_exit_reason or "normal", self._pooled_exit_exception)

    # --- pykka's hooks, with containment ---------------------------------------------------------------

    def _stop(self) -> None:
        """Stop now (on this actor's thread): set the stopped flag and run ``on_stop``."""
        if self._pooled_exit_reason is None:
            self._pooled_exit_reason = "normal"
        self.actor_stopped.set()
        try:
            self.on_stop()
        except BaseException:
            self._handle_failure(*sys.exc_info())

    def _pooled_fail(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._handle_failure(exc_type, exc_value, tb)
        try:
            self.on_failure(exc_type, exc_value, tb)
        except BaseException:
            self._handle_failure(*sys.exc_info())

    def _handle_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Log the failure and stop this actor — only this one (never ``ActorRegistry.stop_all()``)."""
        logger.error(
            "Unhandled exception in %s:",
            self,
            exc_info=(exception_type, exception_value, traceback),  # type: ignore[arg-type]
        )
        if self._pooled_exit_reason in (None, "normal"):
            self._pooled_exit_reason = "failure"
            self._pooled_exit_exception = exception_value
        self.actor_stopped.set()


# --- timers --------------------------------------------------------------------------------------------


class TimerHandle:
    """A scheduled call from :meth:`Dispatcher.call_later`; :meth:`cancel` it if it is no longer needed."""

    __slots__ = ("_fn", "_timers", "cancelled", "when")

    def __init__(self, when: float, fn: Callable[[], None], timers: _Timers) -> None:
        self.when = when
        self._fn = fn
        self._timers = timers
        self.cancelled = False

    def cancel(self) -> None:
        self._timers.cancel(self)

    def __lt__(self, other: TimerHandle) -> bool:
        return self.when < other.when


class _Timers:
    """One thread and a heap: cheap timeouts for actors (callbacks should only ``tell``)."""

    def __init__(self, name: str, cpus: frozenset[int] | None = None) -> None:
        self._name = name
        self._cpus = cpus
        self._heap: list[TimerHandle] = []
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cancelled = 0  # cancelled handles still in the heap

    def call_later(self, delay: float, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(time.monotonic() + max(0.0, delay), fn, self)
        with self._cond:
            if self._closed:
                raise DispatcherClosed("the dispatcher's timers are shut down")
            if self._cancelled > 1024 and 2 * self._cancelled > len(self._heap):  # mostly dead weight
                self._heap = [h for h in self._heap if not h.cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0
            heapq.heappush(self._heap, handle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self._name}-timers", daemon=True)
                self._thread.start()
            elif self._heap[0] is handle:
                self._cond.notify()
        return handle

    def cancel(self, handle: TimerHandle) -> None:
        with self._cond:
            if not handle.cancelled:
                handle.cancelled = True
                self._cancelled += 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify()

    def _run(self) -> None:
        place_thread(self._cpus)
        while True:
            with self._cond:
                due: list[TimerHandle] = []
                while not due:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0].when - time.monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    while self._heap and self._heap[0].when <= time.monotonic():
                        handle = heapq.heappop(self._heap)
                        if handle.cancelled:
                            self._cancelled -= 1
                        else:
                            due.append(handle)
            for handle in due:
                if handle.cancelled:
                    continue
                try:
                    handle._fn()
                except Exception:
                    logger.exception("timer callback %r failed", handle._fn)


# --- the dispatcher ------------------------------------------------------------------------------------


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
        self._run_queue: queue.SimpleQueue[_Mailbox | None] = queue.SimpleQueue()
        self._actors: dict[str, PooledActor] = {}
        self._lock = threading.Condition(threading.Lock())
        self._closing = False
        self._timers = _Timers(name, cpus)
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
                actor.actor_ref.tell(_ActorStop())
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
        _thread_state.dispatcher = self
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
