"""A front's relay of one subscription (runtime.cluster._events.Relay), without Ray: after a shard's death
the subscriber gets each of a session's events once and in order, whichever way they come."""

from __future__ import annotations

from runtime import events as ev
from runtime.bus import ALL
from runtime.cluster._events import REPLAY_OVERLAP, Relay


def delta(seq: int) -> ev.TextDelta:
    return ev.TextDelta(session_id="s", seq=seq, turn_id="t", delta=f"{seq} ")


def test_events_the_replay_passed_on_are_not_passed_on_again_when_the_new_shards_feed_brings_them() -> None:
    """The session's new shard wrote events 4-6 to its transcript and sent them on its feed; the replay (a
    call of its own) read them first, so the feed's copies arrive after the release: seen twice, before."""
    relay = Relay(1, "s", None, queue_size=100)
    relay.deliver("a", [delta(1), delta(2)])
    relay.hold("s", "a")  # shard a died
    relay.deliver("b", [delta(4)])  # held until the release
    relay.release("s", [delta(3), delta(4), delta(5), delta(6)])
    relay.deliver("b", [delta(5), delta(6), delta(7)])  # the feed's copies, then a new event
    relay.deliver("b", [delta(8)])
    assert [e.seq for e in relay.subscription.drain()] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_without_a_replay_the_feed_passes_on_everything() -> None:
    relay = Relay(1, "s", None, queue_size=100)
    relay.deliver("a", [delta(1), delta(2)])
    relay.hold("s", "a")
    relay.deliver("b", [delta(3)])
    relay.release("s", [])  # (nothing in the transcript beyond what was seen)
    relay.deliver("b", [delta(4)])
    assert [e.seq for e in relay.subscription.drain()] == [1, 2, 3, 4]


def test_a_replay_is_remembered_until_the_feed_passes_it_and_a_minute_at_most() -> None:
    """A front with many sessions and shard deaths: the relay remembers what each release replayed only until
    the new shard's feed passes it, or a minute (``REPLAY_OVERLAP``) when the session has no event since;
    before, one entry per session released stayed until the subscription closed."""
    now = [1_000.0]
    relay = Relay(1, ALL, None, queue_size=10_000, clock=lambda: now[0])
    sessions = [f"s{n}" for n in range(500)]
    for sid in sessions:
        relay.deliver("a", [ev.TextDelta(session_id=sid, seq=1, turn_id="t", delta="1")])
        relay.hold(sid, "a")
        relay.release(sid, [ev.TextDelta(session_id=sid, seq=2, turn_id="t", delta="2")])
    relay.deliver("b", [ev.TextDelta(session_id="s0", seq=2, turn_id="t", delta="copy")])  # dropped
    relay.deliver("b", [ev.TextDelta(session_id="s0", seq=3, turn_id="t", delta="3")])  # passes it
    assert len(relay._replayed) == 499
    now[0] += REPLAY_OVERLAP / 2
    relay.deliver("b", [ev.TextDelta(session_id="s1", seq=2, turn_id="t", delta="copy")])  # still dropped
    assert len(relay._replayed) == 499
    now[0] += REPLAY_OVERLAP
    relay.deliver("b", [ev.TextDelta(session_id="s0", seq=4, turn_id="t", delta="4")])
    assert relay._replayed == {}  # idle sessions' replays forgotten
    got = [(e.session_id, e.seq) for e in relay.subscription.drain()]
    assert got.count(("s0", 2)) == 1 and got.count(("s1", 2)) == 1 and ("s0", 4) in got
