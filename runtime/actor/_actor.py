"""The pooled actor: pykka's :class:`~pykka.Actor` contract, run on a shared :class:`Dispatcher`."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Self, cast

import pykka
from pykka import ActorDeadError, ActorRef

from runtime.actor._dispatcher import Dispatcher, default_dispatcher
from runtime.actor._exit import ActorExit, ExitReason
from runtime.actor._future import PooledFuture, fail_future
from runtime.actor._mailbox import Mailbox
from runtime.actor._pykka import PYKKA_MESSAGES, Envelope
from runtime.actor._stop_flag import StopFlag

if TYPE_CHECKING:
    from types import TracebackType

    from runtime.actor._pykka import ActorInbox

__all__ = ["PooledActor"]

logger = logging.getLogger("agentcell.actor")


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
        mailbox = cast(Mailbox, self._create_actor_inbox())
        mailbox.actor = self
        self._pooled_mailbox = mailbox
        self.actor_urn = _new_urn()
        self.actor_inbox = mailbox
        self.actor_stopped = StopFlag()
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
        if not isinstance(getattr(obj, "_pooled_mailbox", None), Mailbox):
            raise TypeError(f"{cls.__name__}.__init__() must call super().__init__()")
        obj._pooled_dispatcher = target
        target._register(obj)
        obj._start_actor_loop()
        return obj.actor_ref

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return Mailbox()

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
            if type(message) in PYKKA_MESSAGES:
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
                fail_future(reply_to)
            else:
                self._pooled_fail(*sys.exc_info())
        except BaseException as exc:
            self._pooled_reply = None
            if reply_to is not None:
                dead = ActorDeadError(f"{self.actor_ref} stopped by {exc!r} while handling the message")
                fail_future(reply_to, (ActorDeadError, dead, None))
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
