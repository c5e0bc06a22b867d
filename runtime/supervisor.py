"""OTP-style supervision for pooled actors (design §1.2).

A supervisor starts its children from :class:`ChildSpec`\\ s, watches them (:func:`runtime.actor.monitor`),
and when one ends it applies its restart type and the supervisor's strategy:

* restart types — ``permanent``: always restarted; ``transient``: restarted only after an abnormal exit
  (an exception, or a kill); ``temporary``: never restarted, and forgotten once it ends;
* strategies — ``one_for_one``: restart just that child; ``one_for_all``: stop the other running
  children (newest first) and restart them all in start order; ``rest_for_one``: the same for the child
  and the children started after it;
* intensity — more than ``max_restarts`` restarts within ``max_seconds`` and the supervisor gives up: it
  stops its children, calls ``on_escalate``, and fails itself, which its parent sees as a child failure.

Stopping a supervisor stops its children one at a time, newest first, each given its ``shutdown_timeout``
before it is killed. Nothing here blocks a dispatcher thread: every wait is a message.

Two layers: :class:`SupervisorActor` is the supervisor itself (a :class:`~runtime.actor.PooledActor`; use
it as a child of another supervisor or through a proxy), and :class:`Supervisor` is a handle for plain
threads — ``Supervisor.start_tree(...)`` starts the children before it returns and offers blocking
``start_child`` / ``terminate_child`` / ``which_children`` / ``stop``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal, get_args

import msgspec
import pykka
from pykka import ActorDeadError, ActorRef

from runtime.actor import (
    ActorExit,
    ActorStop,
    Dispatcher,
    DispatcherClosed,
    Monitor,
    PooledActor,
    TimerHandle,
    kill,
    monitor,
)
from runtime.errors import RestartIntensityExceeded

__all__ = [
    "ChildInfo",
    "ChildSpec",
    "RestartIntensityExceeded",
    "RestartType",
    "Strategy",
    "Supervisor",
    "SupervisorActor",
]

logger = logging.getLogger("agentcell.supervisor")

RestartType = Literal["permanent", "transient", "temporary"]
Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RestartHook = Callable[[str, BaseException | None, int], None]
EscalateHook = Callable[[BaseException], None]


class ChildSpec(msgspec.Struct, frozen=True):
    """How to start one child: ``start()`` must start a pooled actor and return its ref.

    A restart calls ``start()`` again; the new actor recovers its own state (e.g. in ``on_start``).
    ``shutdown_timeout`` is how long an orderly stop may take before the child is killed (None: wait as
    long as it takes, as OTP does for child supervisors).
    """

    id: str
    start: Callable[[], ActorRef[Any]]
    restart: RestartType = "permanent"
    shutdown_timeout: float | None = 5.0

    def __post_init__(self) -> None:
        if self.restart not in get_args(RestartType):
            raise ValueError(f"child {self.id!r}: restart must be one of {get_args(RestartType)}")
        if self.shutdown_timeout is not None and self.shutdown_timeout < 0:
            raise ValueError(f"child {self.id!r}: shutdown_timeout must be >= 0")


class ChildInfo(msgspec.Struct, frozen=True):
    """One row of :meth:`SupervisorActor.which_children`; ``ref`` is None while the child is not running."""

    id: str
    ref: ActorRef[Any] | None
    restart: RestartType
    restarts: int


# --- the supervisor's own messages ---------------------------------------------------------------------


class _StartChild(msgspec.Struct, frozen=True):
    spec: ChildSpec


class _TerminateChild(msgspec.Struct, frozen=True):
    child_id: str
    ref: ActorRef[Any] | None = None  # only if the child is still this incarnation


class _WhichChildren(msgspec.Struct, frozen=True):
    pass


class _Adopt(msgspec.Struct, frozen=True):
    spec: ChildSpec
    ref: ActorRef[Any]


class _StopTimedOut(msgspec.Struct, frozen=True):
    urn: str


class _StartFailed(msgspec.Struct, frozen=True):
    child_id: str
    error: BaseException


class _Child:
    __slots__ = ("monitor", "ref", "restarts", "spec", "stopping", "timer")

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.ref: ActorRef[Any] | None = None
        self.monitor: Monitor | None = None
        self.timer: TimerHandle | None = None
        self.restarts = 0
        self.stopping = False


class _Waiting:
    """Work deferred until the current stop sequence is over; ``reply`` is failed if it never runs."""

    __slots__ = ("reply", "run")

    def __init__(self, run: Callable[[], None], reply: pykka.Future[Any] | None) -> None:
        self.run = run
        self.reply = reply


def _set(reply: pykka.Future[Any] | None, value: Any) -> None:
    if reply is not None:
        reply.set(value)


def _tell_quietly(ref: ActorRef[Any], message: Any) -> None:
    try:
        ref.tell(message)
    except ActorDeadError:
        pass


# --- the supervisor actor ------------------------------------------------------------------------------


class SupervisorActor(PooledActor):
    """The supervisor: a pooled actor that owns its children's lifecycle. See the module docstring.

    ``children`` are started in ``on_start``, in order. ``on_restart(child_id, error, restarts)`` runs after
    each restart (``error`` is None for siblings restarted alongside a failed child);
    ``on_escalate(error)`` runs when it gives up. Both run on a dispatcher thread and must be quick.
    Methods (``start_child``, ``terminate_child``, ``which_children``) are for proxies and for code
    running inside this actor; from plain threads, use :class:`Supervisor`.
    """

    def __init__(
        self,
        children: Iterable[ChildSpec] = (),
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        name: str | None = None,
        on_restart: RestartHook | None = None,
        on_escalate: EscalateHook | None = None,
    ) -> None:
        super().__init__()
        if strategy not in get_args(Strategy):
            raise ValueError(f"strategy must be one of {get_args(Strategy)}, not {strategy!r}")
        if max_restarts < 0 or max_seconds <= 0:
            raise ValueError("max_restarts must be >= 0 and max_seconds > 0")
        self._initial = list(children)
        ids = [spec.id for spec in self._initial]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate child ids in {ids}")
        self.name = name or f"supervisor-{self.actor_urn[-12:]}"
        self.strategy: Strategy = strategy
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self._on_restart = on_restart
        self._on_escalate = on_escalate
        self._children: dict[str, _Child] = {}  # in start order
        self._by_urn: dict[str, _Child] = {}  # running children by their actor's urn
        self._restart_times: deque[float] = deque()
        self._busy = False  # a stop sequence is in progress; other work waits in _waiting
        self._to_stop: deque[_Child] = deque()
        self._after_stop: Callable[[], None] | None = None
        self._waiting: deque[_Waiting] = deque()
        self._closing = False  # shutting down or giving up: no more restarts
        self._stop_replies: list[pykka.Future[Any]] = []

    def __str__(self) -> str:
        return f"Supervisor {self.name} ({self.actor_urn})"

    # --- public API (proxies, or code inside this actor) ------------------------------------------------

    def start_child(self, spec: ChildSpec) -> ActorRef[Any] | None:
        """Start ``spec`` as the newest child and return its ref.

        Raises:
            ValueError: a child with this id exists.
            RuntimeError: the supervisor is shutting down.
        """
        if self._closing:
            raise RuntimeError(f"{self} is shutting down")
        if not self._busy:
            return self._start_child_now(spec)
        reply = self.defer_reply()
        self._waiting.append(
            _Waiting(lambda: self._answer(reply, lambda: self._start_child_now(spec)), reply)
        )
        return None

    def terminate_child(self, child_id: str, ref: ActorRef[Any] | None = None) -> bool:
        """Stop the child (waiting for it, up to its ``shutdown_timeout``) and forget its spec.

        The reply is True once it is stopped, False if there is no such child (or, with ``ref``, if the
        child is no longer that actor).
        """
        reply = self.defer_reply()

        def run() -> None:
            child = self._children.get(child_id)
            if child is None or (ref is not None and child.ref is not ref):
                _set(reply, False)
                return

            def done() -> None:
                self._forget(child)
                _set(reply, True)

            self._stop_children([child], then=done)

        self._when_idle(run, reply)
        return False

    def which_children(self) -> list[ChildInfo]:
        """The children in start order."""
        return [ChildInfo(c.spec.id, c.ref, c.spec.restart, c.restarts) for c in self._children.values()]

    # --- lifecycle ----------------------------------------------------------------------------------------

    def on_start(self) -> None:
        try:
            for spec in self._initial:
                self._add(spec, spec.start())
        except BaseException:
            self._abandon()
            raise

    def on_stop(self) -> None:
        self._abandon()

    def on_failure(self, *_exc_info: Any) -> None:
        self._abandon()

    def _handle_receive(self, message: Any) -> Any:
        if isinstance(message, ActorStop):  # an orderly stop: children first, newest first
            self._begin_shutdown(self.defer_reply())
            return None
        return super()._handle_receive(message)

    def on_receive(self, message: Any) -> Any:
        match message:
            case ActorExit():
                self._child_exited(message)
            case _StopTimedOut(urn=urn):
                self._stop_timed_out(urn)
            case _StartFailed():
                self._start_failed(message)
            case _Adopt(spec=spec, ref=adoptee):
                self._when_idle(lambda: self._adopt(spec, adoptee), None)
            case _StartChild(spec=spec):
                return self.start_child(spec)
            case _TerminateChild(child_id=child_id, ref=incarnation):
                return self.terminate_child(child_id, incarnation)
            case _WhichChildren():
                return self.which_children()
            case _:
                return super().on_receive(message)
        return None

    # --- children -----------------------------------------------------------------------------------------

    def _start_child_now(self, spec: ChildSpec) -> ActorRef[Any] | None:
        if spec.id in self._children:
            raise ValueError(f"{self} already has a child {spec.id!r}")
        return self._add(spec, spec.start()).ref

    def _add(self, spec: ChildSpec, ref: ActorRef[Any]) -> _Child:
        if spec.id in self._children:
            _tell_quietly(ref, ActorStop())
            raise ValueError(f"{self} already has a child {spec.id!r}")
        child = _Child(spec)
        self._attach(child, ref)
        self._children[spec.id] = child
        return child

    def _attach(self, child: _Child, ref: Any) -> None:
        if not isinstance(ref, ActorRef):
            raise TypeError(f"child {child.spec.id!r}: start() returned {ref!r}, not an ActorRef")
        try:
            registration = monitor(ref, self.actor_ref)
        except TypeError:
            _tell_quietly(ref, ActorStop())
            raise
        child.ref = ref
        child.monitor = registration
        self._by_urn[ref.actor_urn] = child

    def _forget(self, child: _Child) -> None:
        if self._children.get(child.spec.id) is child:
            del self._children[child.spec.id]
        if child.ref is not None:
            self._by_urn.pop(child.ref.actor_urn, None)
        if child.monitor is not None:
            child.monitor.cancel()
        if child.timer is not None:
            child.timer.cancel()

    def _adopt(self, spec: ChildSpec, ref: ActorRef[Any]) -> None:
        existing = self._children.get(spec.id)
        if existing is not None:
            if existing.ref is not None and existing.ref.is_alive():
                logger.error("%s: a child %r is already running; stopping the newcomer", self, spec.id)
                _tell_quietly(ref, ActorStop())
                return
            self._forget(existing)  # its predecessor is on its way out
        if self._closing:
            _tell_quietly(ref, ActorStop())
            return
        try:
            self._add(spec, ref)
        except (TypeError, ValueError):
            logger.exception("%s: cannot adopt %r", self, spec.id)

    def _running_newest_first(self) -> list[_Child]:
        return [c for c in reversed(self._children.values()) if c.ref is not None]

    # --- stop sequences: one child at a time, each waited for by message ---------------------------------

    def _when_idle(self, run: Callable[[], None], reply: pykka.Future[Any] | None) -> None:
        if self._busy:
            self._waiting.append(_Waiting(run, reply))
        else:
            run()

    def _stop_children(self, children: list[_Child], then: Callable[[], None]) -> None:
        assert not self._busy, "one stop sequence at a time"
        self._busy = True
        self._to_stop = deque(children)
        self._after_stop = then
        self._stop_next()

    def _stop_next(self) -> None:
        while self._to_stop:
            child = self._to_stop[0]
            ref = child.ref
            if ref is None:
                self._to_stop.popleft()
                continue
            child.stopping = True
            _tell_quietly(ref, ActorStop())  # if it is already dead, its exit notice is on the way
            timeout = child.spec.shutdown_timeout
            dispatcher = self.actor_dispatcher
            if timeout is not None and dispatcher is not None:
                child.timer = dispatcher.call_later(
                    timeout, functools.partial(_tell_quietly, self.actor_ref, _StopTimedOut(ref.actor_urn))
                )
            return
        self._busy = False
        then, self._after_stop = self._after_stop, None
        if then is not None:
            then()
        while self._waiting and not self._busy and not self.actor_stopped.is_set():
            self._waiting.popleft().run()

    def _stop_timed_out(self, urn: str) -> None:
        child = self._by_urn.get(urn)
        if child is None or not child.stopping or child.ref is None:
            return
        logger.warning(
            "%s: child %r did not stop within %s s; killing it",
            self,
            child.spec.id,
            child.spec.shutdown_timeout,
        )
        kill(child.ref)  # its monitor delivers ActorExit(reason="killed") at once

    def _begin_shutdown(self, reply: pykka.Future[Any] | None) -> None:
        if reply is not None:
            self._stop_replies.append(reply)
        if self._closing:
            return  # already on the way down; replies are answered at the end
        self._closing = True
        self._when_idle(lambda: self._stop_children(self._running_newest_first(), then=self._stop), None)

    # --- failures and restarts ----------------------------------------------------------------------------

    def _child_exited(self, notice: ActorExit) -> None:
        child = self._by_urn.pop(notice.ref.actor_urn, None)
        if child is None:
            return  # an incarnation we already replaced or forgot
        child.ref = None
        child.monitor = None
        if child.timer is not None:
            child.timer.cancel()
            child.timer = None
        if child.stopping:
            child.stopping = False
            if self._to_stop and self._to_stop[0] is child:
                self._to_stop.popleft()
                self._stop_next()
            return
        self._when_idle(lambda: self._child_down(child, notice), None)

    def _child_down(self, child: _Child, notice: ActorExit) -> None:
        if self._closing or self._children.get(child.spec.id) is not child or child.ref is not None:
            return  # shutting down, forgotten, or already restarted with its group
        restart = child.spec.restart
        if restart == "temporary" or (restart == "transient" and not notice.abnormal):
            logger.debug("%s: child %r ended (%s), not restarted", self, child.spec.id, notice.reason)
            if restart == "temporary":
                self._forget(child)
            return
        self._restart_after(child, notice.exception)

    def _start_failed(self, message: _StartFailed) -> None:
        child = self._children.get(message.child_id)
        if child is None or child.ref is not None:
            return

        def run() -> None:
            if not self._closing and self._children.get(child.spec.id) is child and child.ref is None:
                self._restart_after(child, message.error)

        self._when_idle(run, None)

    def _restart_after(self, failed: _Child, error: BaseException | None) -> None:
        dispatcher = self.actor_dispatcher
        if dispatcher is not None and dispatcher.closing:
            return  # the whole runtime is going down
        if not self._within_intensity():
            self._give_up(failed, error)
            return
        if self.strategy == "one_for_one":
            self._restart([failed], failed, error)
            return
        order = list(self._children.values())
        group = order if self.strategy == "one_for_all" else order[order.index(failed) :]
        running = [c for c in group if c.ref is not None]
        restart_ids = {failed.spec.id} | {c.spec.id for c in running}
        self._stop_children(
            running[::-1],
            then=lambda: self._restart([c for c in group if c.spec.id in restart_ids], failed, error),
        )

    def _restart(self, group: list[_Child], failed: _Child, error: BaseException | None) -> None:
        if self._closing:
            return
        for child in group:
            if self._children.get(child.spec.id) is not child or child.ref is not None:
                continue
            if child is not failed and child.spec.restart == "temporary":
                self._forget(child)  # OTP: a temporary sibling is not restarted
                continue
            try:
                self._attach(child, child.spec.start())
            except DispatcherClosed:
                return
            except Exception as exc:
                logger.error("%s: restarting %r failed: %r", self, child.spec.id, exc)
                self.actor_ref.tell(_StartFailed(child.spec.id, exc))
                continue
            child.restarts += 1
            logger.info("%s: restarted %r (%d)", self, child.spec.id, child.restarts)
            if self._on_restart is not None:
                try:
                    self._on_restart(child.spec.id, error if child is failed else None, child.restarts)
                except Exception:
                    logger.exception("%s: on_restart hook failed", self)

    def _within_intensity(self) -> bool:
        now = time.monotonic()
        times = self._restart_times
        times.append(now)
        while now - times[0] > self.max_seconds:
            times.popleft()
        return len(times) <= self.max_restarts

    def _give_up(self, failed: _Child, error: BaseException | None) -> None:
        err = RestartIntensityExceeded(
            f"{self.name}: child {failed.spec.id!r} failed"
            f"{f' ({error!r})' if error is not None else ''}; more than {self.max_restarts} restarts "
            f"in {self.max_seconds} s, giving up",
            supervisor=self.name,
            child_id=failed.spec.id,
        )
        err.__cause__ = error
        self._closing = True

        def fail() -> None:
            # Mark this actor failed before telling anyone, so a caller reacting to on_escalate already
            # sees it dead; monitors (the parent) hear of it when this handler returns.
            self._pooled_fail(RestartIntensityExceeded, err, None)
            if self._on_escalate is not None:
                try:
                    self._on_escalate(err)
                except Exception:
                    logger.exception("%s: on_escalate hook failed", self)

        self._stop_children(self._running_newest_first(), then=fail)

    def _abandon(self) -> None:
        """On the way out: stop whatever still runs (without waiting) and answer everyone still waiting."""
        for child in reversed(list(self._children.values())):
            if child.timer is not None:
                child.timer.cancel()
            if child.monitor is not None:
                child.monitor.cancel()
            if child.ref is not None:
                _tell_quietly(child.ref, ActorStop())
        replies, self._stop_replies = self._stop_replies, []
        for reply in replies:
            try:
                reply.set(None)
            except Exception:  # already answered
                pass
        while self._waiting:
            waiting = self._waiting.popleft()
            if waiting.reply is not None:
                dead = ActorDeadError(f"{self} stopped before handling the request")
                try:
                    waiting.reply.set_exception((ActorDeadError, dead, None))
                except Exception:
                    pass

    def _answer(self, reply: pykka.Future[Any] | None, fn: Callable[[], Any]) -> None:
        try:
            value = fn()
        except Exception:
            if reply is None:
                logger.exception("%s: a deferred request failed", self)
            else:
                reply.set_exception()
        else:
            _set(reply, value)


# --- the handle for plain threads ----------------------------------------------------------------------


_handle_numbers = itertools.count(1)


class Supervisor:
    """A supervision tree node for code running on plain threads (or asyncio, via ``to_thread``).

    ``Supervisor.start_tree(children, ...)`` starts a :class:`SupervisorActor` and its children — in the
    calling thread, so each child's ``start()`` has run (and any error raised) when it returns. With
    ``parent``, the new supervisor becomes a child of that one (``restart`` says whether the parent
    restarts it after a failure; this handle follows the new incarnation), is stopped with it, and its
    escalation reaches the parent. Blocking methods must not be called from a dispatcher thread; actors use
    ``ref`` instead.
    """

    def __init__(
        self,
        children: Iterable[ChildSpec],
        *,
        strategy: Strategy,
        max_restarts: int,
        max_seconds: float,
        name: str | None,
        on_restart: RestartHook | None,
        on_escalate: EscalateHook | None,
        dispatcher: Dispatcher | None,
    ) -> None:
        self._children = list(children)
        self._options: dict[str, Any] = {
            "strategy": strategy,
            "max_restarts": max_restarts,
            "max_seconds": max_seconds,
            "on_restart": on_restart,
            "on_escalate": on_escalate,
        }
        self._dispatcher = dispatcher
        self.name = name or f"supervisor-{next(_handle_numbers)}"  # stable across restarts
        self._ref: ActorRef[SupervisorActor] | None = None
        self._parent: Supervisor | None = None

    @classmethod
    def start_tree(
        cls,
        children: Iterable[ChildSpec] = (),
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        name: str | None = None,
        parent: Supervisor | None = None,
        restart: RestartType = "temporary",
        on_restart: RestartHook | None = None,
        on_escalate: EscalateHook | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> Supervisor:
        """Start a supervisor and its ``children`` (in order) and return its handle.

        If a child's ``start()`` raises, the children already started are stopped, the supervisor is
        stopped, and the exception propagates.
        """
        handle = cls(
            children,
            strategy=strategy,
            max_restarts=max_restarts,
            max_seconds=max_seconds,
            name=name,
            on_restart=on_restart,
            on_escalate=on_escalate,
            dispatcher=dispatcher if dispatcher is not None else (parent._dispatcher if parent else None),
        )
        ref = handle._launch()
        if parent is not None:
            handle._parent = parent
            spec = ChildSpec(id=handle.name, start=handle._launch, restart=restart, shutdown_timeout=None)
            parent.ref.tell(_Adopt(spec, ref))
        return handle

    def _launch(self) -> ActorRef[SupervisorActor]:
        ref = SupervisorActor.start(name=self.name, dispatcher=self._dispatcher, **self._options)
        started: list[tuple[ChildSpec, ActorRef[Any]]] = []
        try:
            for spec in self._children:
                started.append((spec, spec.start()))
        except BaseException:
            for _, child in reversed(started):
                _tell_quietly(child, ActorStop())
            _tell_quietly(ref, ActorStop())
            raise
        for spec, child in started:
            ref.tell(_Adopt(spec, child))
        self._ref = ref
        return ref

    def __repr__(self) -> str:
        return f"<Supervisor {self.name!r} alive={self.is_alive()}>"

    @property
    def ref(self) -> ActorRef[SupervisorActor]:
        """The current :class:`SupervisorActor` (a new one after the parent restarted it)."""
        assert self._ref is not None
        return self._ref

    def is_alive(self) -> bool:
        return self._ref is not None and self._ref.is_alive()

    def start_child(self, spec: ChildSpec, *, timeout: float | None = None) -> ActorRef[Any]:
        """Start and supervise one more child; returns its ref (errors from ``spec.start()`` propagate)."""
        ref: ActorRef[Any] = self.ref.ask(_StartChild(spec), block=True, timeout=timeout)
        return ref

    def terminate_child(self, child_id: str, *, timeout: float | None = None) -> bool:
        """Stop a child (waiting for it) and forget its spec; False if there is no such child."""
        return bool(self.ref.ask(_TerminateChild(child_id), block=True, timeout=timeout))

    def which_children(self, *, timeout: float | None = None) -> list[ChildInfo]:
        """The children in start order, with their refs (None while not running) and restart counts."""
        children: list[ChildInfo] = self.ref.ask(_WhichChildren(), block=True, timeout=timeout)
        return children

    def stop(self, *, timeout: float | None = None) -> bool:
        """Stop the children newest first, then the supervisor; True once done, False on timeout.

        With a parent, the parent stops it and forgets it (so it is not restarted).
        """
        ref = self._ref
        if ref is None:
            return True
        try:
            if self._parent is not None and self._parent.is_alive():
                try:
                    self._parent.ref.ask(_TerminateChild(self.name, ref), timeout=timeout)
                except ActorDeadError:
                    pass
            if ref.is_alive():
                ref.stop(timeout=timeout)
        except pykka.Timeout:
            return False
        return True
