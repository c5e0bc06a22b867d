"""Events through the cluster as on one process (design §10.2): a subscription per session across two
shards gets every delta in order, through a shard's SIGKILL; a dead shard's socket folder is removed.

A module of its own, with a cluster runtime of its own: the test kills one of its shards.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import events as ev
from runtime.cluster import ClusterRuntime
from runtime.cluster._channel import FOLDER_PREFIX, sweep_folders
from runtime.config import Config
from runtime.provider.script import Turn
from tests.cluster.test_cluster import ids_on_each_shard, start
from tests.conftest import Recorder

WORDS = " ".join(f"w{n}" for n in range(200))


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRuntime]:
    sessions = tmp_path_factory.mktemp("cluster-events") / "sessions"
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    with ClusterRuntime(config, sessions_dir=sessions, shards=2, shard_cpus=0.5) as rt:
        yield rt


def check_stream(sid: str, events: list[ev.Event]) -> None:
    """Each event once, in order, numbered one after the other: a jump only where the session was resumed
    after its shard died (``session_started`` with ``resumed``, or the ``log_recovered`` before it) or after
    a ``subscriber_lagged`` notice."""
    numbered = [e for e in events if not isinstance(e, ev.SubscriberLagged)]
    seqs = [e.seq for e in numbered]
    assert seqs == sorted(set(seqs)), f"{sid}: out of order or twice: {seqs}"
    reported = False
    for before, event in itertools.pairwise(events):
        if isinstance(event, ev.SubscriberLagged):
            reported = True
            continue
        if isinstance(before, ev.SubscriberLagged):
            continue
        resumed = (isinstance(event, ev.SessionStarted) and event.resumed) or isinstance(
            event, ev.LogRecovered
        )
        assert event.seq == before.seq + 1 or resumed or reported, (
            f"{sid}: {before.type} #{before.seq} then {event.type} #{event.seq}, a gap nobody reported"
        )
        reported = False


def test_a_subscription_per_session_gets_every_delta_in_order_through_a_shards_sigkill(
    cluster: ClusterRuntime, provider: Any
) -> None:
    sids = ids_on_each_shard(cluster, "streamed", 4)
    provider.add_script("streamed", [Turn(text=WORDS)], loop=True)
    model = "openai/streamed"
    for sid in sids:
        start(cluster, provider, sid, model=model)
    recorders = {sid: Recorder() for sid in sids}
    subs = [cluster.subscribe(sid, callback=recorders[sid]) for sid in sids]
    victim = cluster.shard_of(sids[0])
    doomed = [sid for sid in sids if cluster.shard_of(sid) == victim]
    safe = [sid for sid in sids if sid not in doomed]
    address = cluster._fleet.shards[victim].address
    assert address is not None and os.path.exists(address.path)
    pid = cluster.shard_info(victim).pid

    chunk_chars, chunk_delay = provider.chunk_chars, provider.chunk_delay
    provider.chunk_chars, provider.chunk_delay = 5, 0.02  # ~200 deltas a turn, over about four seconds
    try:
        handles = {sid: cluster.prompt(sid, "stream to me") for sid in sids}
        for sid in sids:  # every session is mid-turn
            recorders[sid].wait_for(lambda evs: any(e.type == "text_delta" for e in evs), timeout=30)
        ended = [sid for sid in doomed if handles[sid].done()]  # (else the kill cuts off fewer turns)
        assert not ended, f"turns that ended before every session had begun streaming: {ended}"
        # The front is busy for a moment (it reads nothing) when the shard dies: what the shard sent or
        # wrote down before still reaches the subscribers.
        loop = cluster._fleet.loop
        assert loop is not None
        loop.loop.call_soon_threadsafe(time.sleep, 0.4)
        time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        results = {sid: handle.result(timeout=60) for sid, handle in handles.items()}
    finally:
        provider.chunk_chars, provider.chunk_delay = chunk_chars, chunk_delay

    for sid in safe:  # the other shard's sessions: every delta, in order
        assert results[sid].status == "ok" and results[sid].text == WORDS
    for sid in doomed:  # taken up on the shard left from the log (design §3.12): the answer, whole
        result = results[sid]
        assert result.status == "ok" and result.text == WORDS, result.error
    assert cluster.shards == [next(s for s in cluster.shards if s != victim)]
    assert not os.path.exists(os.path.dirname(address.path))  # its socket folder is gone with it

    after = {sid: cluster.prompt(sid, "again, on the shard left") for sid in doomed}
    for handle in after.values():
        assert handle.result(timeout=60).text == WORDS
    for sub in subs:
        assert sub.flush(timeout=10)

    for sid in sids:
        events = list(recorders[sid].events)
        check_stream(sid, events)
        deltas = "".join(e.delta for e in events if isinstance(e, ev.TextDelta))
        if sid in safe:
            assert deltas == WORDS, sid
            continue
        # Before the crash, everything its transcript holds from the first event received on...
        first = events[0].seq
        written = {e.seq for e in cluster.replay(sid, first - 1)}
        missing = sorted(written - {e.seq for e in events})
        assert not missing, f"{sid}: events the dead shard wrote down never reached the subscriber: {missing}"
        # ... and after it, on the shard left, the turn taken up and the next one, each whole, once.
        resumed = next(n for n, e in enumerate(events) if isinstance(e, ev.SessionStarted) and e.resumed)
        later = events[resumed:]
        assert "".join(e.delta for e in later if isinstance(e, ev.TextDelta)) == WORDS * 2, sid
        assert [e.type for e in later].count("agent_end") == 2
        assert [e.type for e in later].count("turn_resumed") == 1
    for sub in subs:
        sub.close()


def test_a_shards_socket_folder_left_by_a_dead_process_is_swept() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (left / "pid").write_text(str(dead.pid))
    (left / "turns.sock").write_text("")
    alive = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (alive / "pid").write_text(str(os.getpid()))
    try:
        sweep_folders()  # as a shard does before it opens its own
        assert not left.exists()
        assert alive.exists()  # a live shard's folder stays
    finally:
        for folder in (left, alive):
            if folder.exists():
                for child in folder.iterdir():
                    child.unlink()
                folder.rmdir()
