"""Pooled pykka actors: many actors sharing a few threads (design §1.1).

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

One concept per module, as in pykka: ``_future`` (:class:`PooledFuture`), ``_mailbox`` (the inbox that
schedules its actor), ``_monitor`` (:class:`ActorExit`, :func:`monitor`, :func:`kill`), ``_timers``,
``_dispatcher`` (:class:`Dispatcher` and the process-wide default), ``_actor`` (:class:`PooledActor`),
``_stop_flag``, ``_ref`` (:class:`Ref`, a ref typed by the messages its actor takes); and ``_pykka``, the one module that touches pykka's private internals. The errors are in
:mod:`runtime.errors` (:class:`DispatcherClosed` is re-exported here). :class:`ActorStop` is pykka's stop
message (what ``ActorRef.stop()`` sends), re-exported for a supervisor or an actor that must recognise one.
"""

from runtime.actor._actor import PooledActor
from runtime.actor._dispatcher import Dispatcher, default_dispatcher, set_default_dispatcher
from runtime.actor._future import PooledFuture
from runtime.actor._monitor import ActorExit, ExitReason, Monitor, kill, monitor
from runtime.actor._pykka import ActorStop
from runtime.actor._ref import Ref
from runtime.actor._timers import TimerHandle
from runtime.errors import DispatcherClosed

__all__ = [
    "ActorExit",
    "ActorStop",
    "Dispatcher",
    "DispatcherClosed",
    "ExitReason",
    "Monitor",
    "PooledActor",
    "PooledFuture",
    "Ref",
    "TimerHandle",
    "default_dispatcher",
    "kill",
    "monitor",
    "set_default_dispatcher",
]
