"""Where a session lives: rendezvous (highest random weight) hashing of session ids over shard names.

Every shard gets a score for a session, a hash of the pair; the session lives on the shard with the
highest score. Nothing is stored: any process that knows the shard names computes the same owner. When a
shard joins, the only sessions that move are those it now outscores every other shard for (about
``1 / (n + 1)`` of them), and they move to it; when a shard leaves, only its own sessions move, each to
the shard that scored second for it. Pure functions, no Ray.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["moves", "owner", "score"]


def score(shard: str, session_id: str) -> int:
    """The shard's weight for the session: 64 bits of BLAKE2b over both names (stable across processes,
    unlike ``hash()``)."""
    digest = hashlib.blake2b(
        session_id.encode(), digest_size=8, key=shard.encode()[:64], person=b"agentcell-place"
    )
    return int.from_bytes(digest.digest(), "big")


def owner(session_id: str, shards: Iterable[str]) -> str:
    """The shard ``session_id`` lives on among ``shards`` (ties, vanishingly rare, go to the greater name).

    Raises:
        ValueError: no shards.
    """
    best: tuple[int, str] | None = None
    for shard in shards:
        candidate = (score(shard, session_id), shard)
        if best is None or candidate > best:
            best = candidate
    if best is None:
        raise ValueError("no shards to place a session on")
    return best[1]


def moves(placed: Mapping[str, str], shards: Iterable[str]) -> dict[str, str]:
    """The sessions of ``placed`` (session id → its shard now) whose owner among ``shards`` is another
    shard, each with that shard: what must move when the set of shards becomes ``shards``."""
    names = list(shards)
    out: dict[str, str] = {}
    for session_id, current in placed.items():
        target = owner(session_id, names)
        if target != current:
            out[session_id] = target
    return out
