"""Pooled pykka actors: many actors sharing a few threads (the implementation is in :mod:`._actor`)."""

from runtime.actor._actor import (
    ActorExit,
    Dispatcher,
    DispatcherClosed,
    Monitor,
    PooledActor,
    PooledFuture,
    TimerHandle,
    default_dispatcher,
    kill,
    monitor,
    set_default_dispatcher,
)

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
