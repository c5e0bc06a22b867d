"""Placement by rendezvous hashing (design §10.1): stable, balanced, and minimal when shards come and go."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from runtime.cluster import moves, owner, score

SESSIONS = [f"session-{n}" for n in range(3_000)]


def test_owner_is_one_of_the_shards_and_the_same_in_every_process() -> None:
    shards = ["shard-0", "shard-1", "shard-2"]
    here = [owner(sid, shards) for sid in SESSIONS[:50]]
    assert set(here) <= set(shards)
    code = (
        "from runtime.cluster import owner\n"
        f"print(','.join(owner(f'session-{{n}}', {shards!r}) for n in range(50)))"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert there.stdout.strip().split(",") == here  # no hash() seed: every front and shard agrees
    assert owner("s", reversed(shards)) == owner("s", shards)  # the order of the names does not matter


def test_sessions_spread_evenly() -> None:
    counts = Counter(owner(sid, ["shard-0", "shard-1", "shard-2", "shard-3"]) for sid in SESSIONS)
    assert len(counts) == 4
    assert all(abs(n - 750) < 100 for n in counts.values()), counts


def test_a_new_shard_takes_only_its_share_and_nothing_else_moves() -> None:
    before = {sid: owner(sid, ["shard-0", "shard-1"]) for sid in SESSIONS}
    moving = moves(before, ["shard-0", "shard-1", "shard-2"])
    assert set(moving.values()) == {"shard-2"}  # every move is to the new shard
    assert 800 < len(moving) < 1_200  # about a third of them
    after = {sid: moving.get(sid, shard) for sid, shard in before.items()}
    assert after == {sid: owner(sid, ["shard-0", "shard-1", "shard-2"]) for sid in SESSIONS}


def test_a_shard_that_leaves_hands_on_only_its_own_sessions() -> None:
    shards = ["shard-0", "shard-1", "shard-2"]
    before = {sid: owner(sid, shards) for sid in SESSIONS}
    moving = moves(before, ["shard-0", "shard-2"])
    assert moving and all(before[sid] == "shard-1" for sid in moving)
    assert len(moving) == sum(shard == "shard-1" for shard in before.values())
    # ... each to the shard that scored second for it; and they come back if it returns
    assert all(
        target == max(("shard-0", "shard-2"), key=lambda s: score(s, sid)) for sid, target in moving.items()
    )
    back = {sid: moving.get(sid, shard) for sid, shard in before.items()}
    assert moves(back, shards) == {sid: "shard-1" for sid in moving}


def test_no_shards_is_an_error() -> None:
    with pytest.raises(ValueError, match="no shards"):
        owner("s", [])
