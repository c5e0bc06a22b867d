"""The cluster's errors, and how a shard's error is told apart from Ray's.

    ClusterError            the cluster could not do what was asked (a shard did not start, none is left)
     ├─ ClusterUnavailable  no Ray cluster answers at the address, or the cluster went away
     └─ ShardDied           a call met its shard dead

(defined in :mod:`runtime.errors`, under :class:`~runtime.errors.AgentcellError`).

A shard's own errors (``SessionNotFound``, ``ValueError``, ``CorruptLogError``, ...) reach the caller as
themselves, out of Ray's wrapper (:func:`cause`).
"""

from __future__ import annotations

from runtime.errors import ClusterError, ClusterUnavailable, ShardDied

__all__ = ["SHARD_LOST", "ClusterError", "ClusterUnavailable", "ShardDied", "cause", "first_line"]

SHARD_LOST = "shard_lost"
"""How the error of a turn cut off by its shard's death begins (``TurnResult.error``)."""


def cause(exc: BaseException) -> BaseException:
    """A shard's own error out of Ray's wrapper (``SessionNotFound``, ``ValueError``, ...)."""
    inner = getattr(exc, "cause", None)
    return inner if isinstance(inner, BaseException) else exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
