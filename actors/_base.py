"""What every session actor shares: the session's identity, event publishing, and asynchronous calls.

Pooled actors never block on each other. :meth:`SessionActor.call` sends an ask without waiting and
delivers the answer back to this actor as a message, where the continuation runs — so a handler stays
one-message-at-a-time and a dispatcher thread is never parked on another actor's reply.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
import pykka

from actors.protocol import Asking
from runtime.actor import PooledActor, PooledFuture
from runtime.errors import RuntimeStateError
from runtime.events import Event, ProviderRetry

if TYPE_CHECKING:
    from runtime.actor import Ref
    from runtime.gateway import RetryInfo

log = logging.getLogger("agentcell.actors")

Publish = Callable[[Event], Any]
R = TypeVar("R")
Q = TypeVar("Q")


def retry_reporter(
    publish: Publish, session_id: str, turn_id: str | None, request_id: str | None = None
) -> Callable[[RetryInfo], None]:
    """A gateway ``on_retry`` callback that broadcasts each retry as a ``provider_retry`` event (of the
    turn ``turn_id``'s call, or of the summarizer call ``request_id``)."""

    def on_retry(info: RetryInfo) -> None:
        publish(
            ProviderRetry(
                session_id=session_id,
                turn_id=turn_id,
                attempt=info.attempt,
                max_attempts=info.max_attempts,
                delay=info.delay,
                error=info.error,
                status_code=info.status_code,
                kind=info.kind,
                request_id=request_id,
            )
        )

    return on_retry


def server_of(api_base: str | None) -> tuple[str | None, int | None]:
    """The host and port of an endpoint's ``api_base`` (None, None without one): what a ``request_start``
    and a ``summary_request`` say of where the call goes (the OpenTelemetry ``server.*`` attributes)."""
    if not api_base:
        return None, None
    from urllib.parse import urlsplit

    parts = urlsplit(api_base)
    if not parts.hostname:
        return None, None
    try:
        port = parts.port
    except ValueError:  # a port that is no number: the host alone
        return parts.hostname, None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


class Reply(msgspec.Struct, frozen=True):
    """The answer to a :meth:`SessionActor.call`, delivered to the caller's own mailbox."""

    token: int
    value: Any = None
    error: BaseException | None = None


def _deliver(caller: Ref[Reply], token: int, future: PooledFuture[Any]) -> None:
    """Tell ``caller`` the outcome of its call ``token``.

    A module-level function bound with ``functools.partial``, not a closure: a closure that passes
    itself on (for a deferred reply) references itself, and every call would leave a reference cycle for
    the garbage collector.
    """
    try:
        value = future.get(timeout=0)
    except BaseException as exc:  # the callee's failure becomes a value for the caller
        reply = Reply(token, error=exc)
    else:
        if isinstance(value, PooledFuture):  # the callee replies later: wait for that one too
            value.add_done_callback(functools.partial(_deliver, caller, token))
            return
        reply = Reply(token, value)
    try:
        caller.tell(reply)
    except pykka.ActorDeadError:  # the caller stopped meanwhile (its session was stopped or deleted)
        pass


class CallFailed(RuntimeStateError):
    """The actor that was called is gone or raised; ``__cause__`` holds the reason."""


class SessionActor(PooledActor):
    """Base class of the five per-session actors."""

    def __init__(self, session_id: str, publish: Publish) -> None:
        super().__init__()
        self.session_id = session_id
        self.publish = publish
        self._tokens = itertools.count(1)
        self._pending: dict[int, Callable[[Any], None]] = {}  # each takes its call's reply type

    # -- asynchronous request/reply -------------------------------------------------------------------
    def call(self, target: Ref[Q], message: Asking[R, Q], then: Callable[[R | CallFailed], None]) -> None:
        """Ask ``target`` without blocking; ``then(value)`` runs later in this actor.

        ``message`` is an :class:`~actors.protocol.Ask` of its reply's type, which is what ``then``
        receives, and one of the messages ``target`` takes (its ref is a ``Ref`` of the actor's union, e.g.
        :data:`~actors.protocol.StoreMessage`): the type checker sees both that the target takes the
        message and that ``then`` handles the reply the message gets. (A message of a union type, e.g.
        ``Compact | MaybeCompact``, is not inferred: call with one class.)

        A callee that cannot answer at once takes the reply over with ``defer_reply()`` and completes it
        later (or returns a ``PooledFuture`` it completes later); either way ``then`` gets the value.

        If the target fails or is dead, ``then`` receives a :class:`CallFailed` instance instead of a value.
        """
        token = next(self._tokens)
        self._pending[token] = then
        me = self.actor_ref
        try:  # (an Asking[R, Q] is a Q: its _message() says so to the type checker, which cannot see it here)
            future = cast(PooledFuture[Any], target.ask(message, block=False))  # type: ignore[call-overload]
        except pykka.ActorDeadError as exc:
            me.tell(Reply(token, error=exc))
            return

        future.add_done_callback(functools.partial(_deliver, me, token))

    def handle_reply(self, reply: Reply) -> None:
        then = self._pending.pop(reply.token, None)
        if then is None:
            return
        if reply.error is not None:
            failure = CallFailed(f"{type(reply.error).__name__}: {reply.error}")
            failure.__cause__ = reply.error
            then(failure)
        else:
            then(reply.value)

    def emit(self, event_type: type[Event], **fields: Any) -> Event:
        event = event_type(session_id=self.session_id, **fields)
        result = self.publish(event)
        return result if isinstance(result, Event) else event
