"""A front's relay of one subscription (runtime.cluster._events.Relay), without Ray: after a shard's death
the subscriber gets each of a session's events once and in order, whichever way they come."""

from __future__ import annotations

from runtime import events as ev
from runtime.cluster._events import Relay


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
