"""Sessions sharded over a Ray cluster, with the public API of :class:`runtime.Runtime` (design §10).

Needs the ``ray`` extra (``pip install 'agentcell[ray]'``); Ray itself is imported only when a
:class:`ClusterRuntime` starts. Modules: ``_runtime`` (the front: the public API), ``_fleet`` (where
sessions live; moves and failover), ``_turns`` (a session's turn calls and their handles), ``_shard`` (the
Ray actor hosting a ``Runtime``), ``_events`` (subscriptions across shards), ``_placement`` (rendezvous
hashing), ``_connect`` (reaching a cluster), ``_wire`` (what crosses between processes), ``_errors``, ``_loop``.
"""

from __future__ import annotations

from runtime.cluster._errors import SHARD_LOST, ClusterError, ClusterUnavailable
from runtime.cluster._placement import moves, owner, score
from runtime.cluster._runtime import ClusterRuntime
from runtime.cluster._shard import ShardInfo

__all__ = [
    "SHARD_LOST",
    "ClusterError",
    "ClusterRuntime",
    "ClusterUnavailable",
    "ShardInfo",
    "moves",
    "owner",
    "score",
]
