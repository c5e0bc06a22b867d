"""The front's side of the shards' event streams (design §10.2): connections kept up, subscriptions added on
every shard, and a dead shard's sessions caught up from their transcripts.

Each shard pushes this front's events on its turn channel (:mod:`runtime.cluster._stream`); its
:class:`~runtime.cluster._events.Inbound` decodes each batch once and hands the events to the subscriptions'
relays, and this front acknowledges what it received every :data:`ACK_DELAY` seconds. When a connection
breaks and Ray says the shard lives, the front connects again (trying every few seconds at most), adds its
subscriptions again and says the last batch it received: the shard writes what came after. While it cannot
connect (or never could: a port its network does not let through), it pulls the batches by Ray calls.

When a shard dies, its connection is read to its end; meanwhile what the sessions' new shard sends them is
held, and once they are resumed, each relay gets what the session's transcript holds beyond the last event
it passed on (the ``Last-Event-ID`` resume of the HTTP server, done for every subscription): every event the
dead shard sent or wrote down arrives once, in order, before the session's events on its new shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

from runtime.cluster import _wire
from runtime.cluster._channel import SUBSCRIBE, UNSUBSCRIBE, TurnChannel, connect
from runtime.cluster._errors import ClusterError, ShardDied, first_line
from runtime.cluster._events import Inbound, Relay
from runtime.cluster._fleet import Fleet, ShardRef
from runtime.events import Event
from runtime.messages import new_id

log = logging.getLogger("agentcell.cluster")

__all__ = ["Feeds"]

ACK_DELAY = 0.05
"""Seconds after a batch arrives before the front acknowledges it (and those after it)."""
PULL_SECONDS = 1.0
"""How long one pull of a shard's stream (by Ray call) waits for a batch."""
SWEEP_SECONDS = 1.0
"""How often the shards are told of subscriptions closed."""
REPLAY_SECONDS = 30.0
"""The longest the catch-up after a shard's death waits for a session's transcript (then it passes on what
was held without it): the session's turn handles wait for the catch-up."""
TCP = False
"""Connect over TCP even to a shard on this host (tests of a TCP channel)."""


class Feeds:
    """This front's event streams from the shards of ``fleet``, and its subscriptions on them."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.front_id = new_id()
        self._keys = itertools.count(1)
        self._acking: set[str] = set()
        self._dropping: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        fleet.on_lost = self._shard_lost
        fleet.after_failover = self._catch_up

    def next_key(self) -> int:
        return next(self._keys)

    # -- connections ----------------------------------------------------------------------------------
    def open(self, shards: list[ShardRef]) -> None:
        """Connect to new shards' streams (blocking), and add every open subscription on them."""
        import ray

        refs = {shard.name: shard.actor.open_channel.remote() for shard in shards}
        for shard in shards:
            shard.inbound = Inbound(shard.name, self.fleet.relays, self._unknown)
            try:
                shard.address = ray.get(refs[shard.name], timeout=self.fleet.start_timeout)
                shard.channel = self.fleet.submit(self._connect(shard)).result(self.fleet.start_timeout)
            except Exception as exc:
                log.warning(
                    "%s: no turn channel (%s); its turns and events go as Ray calls",
                    shard.name,
                    first_line(exc),
                )
                if self.fleet.started:  # (else once it has started)
                    self.fleet.submit(self._pump(shard))
        with self.fleet.lock:
            relays = [r for r in self.fleet.relays.values() if not r.closed]
        if relays:
            self.subscribe(relays, shards)

    def start(self) -> None:
        """Once the runtime has started: pull the events of the shards it could not connect to, and sweep."""
        with self.fleet.lock:
            unreached = [s for s in self.fleet.shards.values() if s.alive and s.channel is None]
        for shard in unreached:
            self.fleet.submit(self._pump(shard))
        self.fleet.submit(self._sweep())

    async def _connect(self, shard: ShardRef) -> TurnChannel:
        assert shard.address is not None and shard.inbound is not None
        return await connect(
            shard.name,
            shard.address,
            (self.front_id, shard.inbound.received),
            partial(self._pushed, shard),
            partial(self._broke, shard),
            tcp=TCP,
        )

    def _pushed(self, shard: ShardRef, data: bytes) -> None:
        """A frame of events from ``shard`` (on the front's loop)."""
        assert shard.inbound is not None
        if shard.inbound.push(data) and shard.name not in self._acking:
            self._acking.add(shard.name)
            asyncio.get_running_loop().call_later(ACK_DELAY, self._ack, shard)

    def _ack(self, shard: ShardRef) -> None:
        self._acking.discard(shard.name)
        channel = shard.channel
        if channel is not None and shard.inbound is not None:
            channel.notify("ack", (shard.inbound.received,))

    def _broke(self, shard: ShardRef, channel: TurnChannel) -> None:
        """A connection to ``shard`` ended (on the front's loop): the shard stopped or died, or only the
        connection did (then it is made again)."""
        if channel is not shard.channel and shard.channel is not None:
            return  # an older connection
        if not self.fleet.started or not shard.alive or shard.stopping:
            self.ended(shard)
            return
        self.verdict(shard)
        self._task(self._after_break(shard))

    def _task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def verdict(self, shard: ShardRef) -> asyncio.Future[BaseException]:
        """Why the shard's channel broke (on the front's loop): :class:`ShardDied` if the shard died, else
        the error for the calls the break cut off (their outcome is unknown)."""
        if shard.verdict is None:
            shard.verdict = asyncio.ensure_future(self._why_broken(shard))
        return shard.verdict

    async def _why_broken(self, shard: ShardRef) -> BaseException:
        import ray

        shard.channel = None  # turn calls go as Ray calls until it is connected again
        try:
            await asyncio.wait_for(asyncio.wrap_future(shard.actor.hosted_sessions.remote().future()), 60)
        except ray.exceptions.RayError as exc:
            return self.fleet.failure(exc, shard)
        except TimeoutError:
            pass
        log.warning("the turn channel to %s broke; connecting again", shard.name)
        return ClusterError(
            f"the turn channel to {shard.name} broke while this call was running on it: its outcome is unknown"
        )

    async def _after_break(self, shard: ShardRef) -> None:
        assert shard.verdict is not None
        if isinstance(await shard.verdict, ShardDied):
            return  # (the failover ends its stream once it has read it)
        delay = 0.05
        while self.fleet.started and shard.alive and not shard.stopping:
            try:
                channel = await self._connect(shard)
            except (OSError, TimeoutError) as exc:
                log.info("%s: cannot connect again yet (%s)", shard.name, first_line(exc))
                if not shard.pumping:
                    self._task(self._pump(shard))
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)
                continue
            with self.fleet.lock:
                relays = [r for r in self.fleet.relays.values() if not r.closed]
            for relay in relays:  # (a shard that forgot this front meanwhile has none of them)
                channel.call(SUBSCRIBE, "", self._feed_args(relay), _ignore)
            shard.channel, shard.verdict = channel, None
            log.info("the turn channel to %s is connected again", shard.name)
            return

    async def _pump(self, shard: ShardRef) -> None:
        """Pull the shard's batches by Ray calls while it has no turn channel."""
        import ray

        assert shard.inbound is not None
        shard.pumping = True
        try:
            while self.fleet.started and shard.alive and shard.channel is None:
                try:
                    pulled = await shard.actor.pull_events.remote(
                        self.front_id, shard.inbound.received, PULL_SECONDS
                    )
                except ray.exceptions.ActorDiedError:
                    self.fleet.lost(shard.name)
                    return
                except ray.exceptions.RayError as exc:
                    log.warning("pulling events from %s: %s", shard.name, first_line(exc))
                    await asyncio.sleep(PULL_SECONDS)
                    continue
                for data in pulled:
                    shard.inbound.push(data)
        finally:
            shard.pumping = False

    def ended(self, shard: ShardRef) -> None:
        """Nothing more comes from ``shard`` (it stopped, or died and its connection was read)."""
        if shard.inbound is not None:
            shard.inbound.end()
        with self.fleet.lock:
            relays = list(self.fleet.relays.values())
        for relay in relays:
            relay.feed_ended(shard.name)

    def final_pull(self, shard: ShardRef) -> None:
        """What a stopped shard without a turn channel had left for this front (blocking)."""
        import ray

        if shard.channel is None and shard.inbound is not None:
            with contextlib.suppress(Exception):
                pulled = ray.get(
                    shard.actor.pull_events.remote(self.front_id, shard.inbound.received, 0.0), timeout=5
                )
                self.fleet.submit(_push_all(shard.inbound, pulled)).result(5)

    # -- subscriptions --------------------------------------------------------------------------------
    @staticmethod
    def _feed_args(relay: Relay) -> tuple[Any, ...]:
        return (relay.key, relay.shard_sessions(), relay.shard_types(), relay.include_children, relay.bulk)

    def subscribe(self, relays: list[Relay], shards: list[ShardRef], timeout: float = 30.0) -> None:
        """Add each relay's feed on each shard; every shard has it before this returns (blocking)."""
        import ray

        waits: list[tuple[Relay, ShardRef, Any]] = []
        for relay in relays:
            for shard in shards:
                channel = shard.channel
                if channel is not None:
                    answered = threading.Event()
                    errors: list[BaseException | None] = [None]

                    def reply(
                        _: Any, error: BaseException | None, e: Any = errors, a: Any = answered
                    ) -> None:
                        e[0] = error
                        a.set()

                    if channel.call(SUBSCRIBE, "", self._feed_args(relay), reply):
                        waits.append((relay, shard, (answered, errors)))
                        continue
                ref = shard.actor.subscribe_feed.remote(self.front_id, *self._feed_args(relay))
                waits.append((relay, shard, ref))
        deadline = time.monotonic() + timeout
        for relay, shard, wait in waits:
            left = max(0.0, deadline - time.monotonic())
            if isinstance(wait, tuple):
                answered, errors = wait
                if not answered.wait(left):
                    raise TimeoutError(f"{shard.name} did not take the subscription within {timeout:g} s")
                error = errors[0]
                if error is not None and not isinstance(
                    error, ClusterError
                ):  # (LOST: added again on reconnecting)
                    raise error
            else:
                try:
                    ray.get(wait, timeout=left)
                except ray.exceptions.GetTimeoutError:
                    raise TimeoutError(
                        f"{shard.name} did not take the subscription within {timeout:g} s"
                    ) from None
                except ray.exceptions.RayError as exc:
                    failure = self.fleet.failure(exc, shard)
                    if isinstance(failure, ShardDied):
                        continue  # its sessions are resumed on the others, whose streams carry them
                    raise failure from None
            relay.feed_opened(shard.name)

    def _unsubscribe(self, shard: ShardRef, key: int) -> None:
        channel = shard.channel
        if channel is not None and channel.call(UNSUBSCRIBE, "", (key,), _ignore):
            return
        if shard.alive:
            with contextlib.suppress(Exception):
                shard.actor.unsubscribe_feed.remote(self.front_id, key)

    def _unknown(self, shard_name: str, key: int) -> None:
        """Events came for a subscription closed meanwhile: the shard is told (once)."""
        if (shard_name, key) in self._dropping:
            return
        self._dropping.add((shard_name, key))
        shard = self.fleet.shards.get(shard_name)
        if shard is not None:
            self._unsubscribe(shard, key)

    async def _sweep(self) -> None:
        """Tell the shards of the subscriptions closed (a subscription closes without the front's help)."""
        while self.fleet.started:
            await asyncio.sleep(SWEEP_SECONDS)
            with self.fleet.lock:
                closed = [r for r in self.fleet.relays.values() if r.closed]
                for relay in closed:
                    del self.fleet.relays[relay.key]
                shards = [s for s in self.fleet.shards.values() if s.alive]
            for relay in closed:
                for shard in shards:
                    if (shard.name, relay.key) not in self._dropping:
                        self._dropping.add((shard.name, relay.key))
                        self._unsubscribe(shard, relay.key)

    # -- a shard's death ------------------------------------------------------------------------------
    def _shard_lost(self, dead: ShardRef, sessions: Iterable[str]) -> None:
        """``dead`` died: what other shards send for its sessions waits until they are caught up."""
        with self.fleet.lock:
            relays = [r for r in self.fleet.relays.values() if not r.closed]
        for sid in sessions:
            for relay in relays:
                if relay.covers(sid) or relay.seen(sid):
                    relay.hold(sid, dead.name)

    async def _catch_up(self, dead: ShardRef, sessions: list[str]) -> None:
        """After the failover: read the dead shard's connection to its end, then give each relay what the
        sessions' transcripts hold beyond what it passed on."""
        channel = dead.channel
        if channel is not None:
            await channel.ended(2.0)  # (a dead process's socket ends at once; a dead node's may not)
            channel.close()
        self.ended(dead)
        limit = asyncio.Semaphore(16)

        async def one(sid: str) -> None:
            with self.fleet.lock:
                relays = [r for r in self.fleet.relays.values() if r.holds(sid)]
                entry = self.fleet.sessions.get(sid)
                shard = self.fleet.shards.get(entry.shard) if entry is not None else None
            if not relays:
                return
            events: list[Event] = []
            if shard is not None and shard.alive and entry is not None and entry.error is None:
                after = min(r.seen(sid) for r in relays)
                async with limit:
                    try:
                        replay = shard.actor.replay.remote(sid, after, None)
                        events = _wire.decode_events(await asyncio.wait_for(replay, REPLAY_SECONDS))
                    except Exception as exc:
                        log.warning("replaying session %s after its shard died: %s", sid, first_line(exc))
            for relay in relays:
                since = relay.since if not relay.seen(sid) else 0.0  # (nothing older than the subscription)
                relay.release(sid, [e for e in events if e.ts >= since])
            if entry is not None:
                entry.caught_up.open()  # its turns' handles resolve now (the rest open after them all)

        await asyncio.gather(*(one(sid) for sid in sessions))


def _ignore(_answer: Any, _error: BaseException | None) -> None:
    pass


async def _push_all(inbound: Inbound, pulled: list[bytes]) -> None:
    for data in pulled:
        inbound.push(data)
