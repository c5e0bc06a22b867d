"""A session's turn calls from the cluster front (design §10): ``prompt``, ``send``, ``compact``, ``abort``
and a resumed turn's result, each sent to the session's shard and answered by resolving its handle.

A call goes on the shard's turn channel (:mod:`runtime.cluster._channel`), or as a Ray call when there is none
or it broke. Its handle resolves once this front has received the turn's events (as on the local bus, a
turn's events are queued to every subscriber before its handle resolves). When the shard dies first, the
session is resumed from its log on another shard, which takes the turn up (design §3.12); a turn it does not
take up, and a compaction or abort the dead shard had, resolve with an error starting with ``shard_lost:``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from runtime.cluster import _wire
from runtime.cluster._channel import LOST
from runtime.cluster._errors import SHARD_LOST, ShardDied
from runtime.cluster._feeds import Feeds
from runtime.cluster._fleet import Fleet, Hosted, ShardRef
from runtime.handles import CompactionResult, Handle, TurnResult
from runtime.host import RuntimeStopped, SessionNotFound

EVENTS_WAIT = 5.0
"""The longest a handle waits for its turn's events to reach the front (see :meth:`TurnCalls._after_events`)."""


class TurnCalls:
    """Sends a front's turn calls to the shards of ``fleet`` and resolves their handles (``feeds`` says when a
    shard's events have reached this front, and whether a shard whose channel broke is dead)."""

    def __init__(self, fleet: Fleet, feeds: Feeds) -> None:
        self.fleet = fleet
        self.feeds = feeds

    def send(self, session_id: str, handle: Handle[Any], method: str, args: tuple[Any, ...]) -> None:
        """Send a call whose answer resolves ``handle`` (once the session is not moving)."""
        entry = self.fleet.sessions.get(session_id)
        with self.fleet.lock:
            shard = self.fleet.shards.get(entry.shard) if entry is not None else None
        if entry is None or shard is None or not self.fleet.started:
            handle.set_exception(SessionNotFound(f"no running session {session_id!r}"))
            return
        if entry.error is not None:
            handle.set_exception(entry.error)
            return
        if not shard.alive:  # died a moment ago: send it once the session is resumed
            entry.gate.then(partial(self.send, session_id, handle, method, args))
            return
        with self.fleet.lock:
            entry.inflight += 1
        channel = shard.channel if method != "resumed_result" else None
        if channel is not None:
            reply = partial(self._channel_answered, entry, shard, handle, method)
            if channel.call(method, session_id, args, reply):
                return
        ref = getattr(shard.actor, method).remote(session_id, *args)
        ref.future().add_done_callback(partial(self._answered, entry, shard, handle, method))

    def _answered(
        self,
        entry: Hosted,
        shard: ShardRef,
        handle: Handle[Any],
        method: str,
        future: concurrent.futures.Future[Any],
    ) -> None:
        """The answer of a turn call sent as a Ray call."""
        try:
            value = future.result()
        except BaseException as exc:
            self._resolve(entry, handle, method, None, self.fleet.failure(exc, shard), shard)
            return
        self._resolve(entry, handle, method, value, None, shard)

    def _channel_answered(
        self,
        entry: Hosted,
        shard: ShardRef,
        handle: Handle[Any],
        method: str,
        value: Any,
        error: BaseException | None,
    ) -> None:
        """The answer of a turn call sent on the shard's channel (on the front's loop). A call its broken
        channel answered with ``LOST`` waits for Ray to say whether the shard died."""
        if error is LOST:
            if self.fleet.started:
                self.fleet.submit(self._lost_on_channel(entry, shard, handle, method))
            else:
                self._resolve(
                    entry, handle, method, None, RuntimeStopped("stopped before the answer came"), shard
                )
            return
        if value is not None and method != "abort":
            value = tuple(value)  # (msgpack gives a list)
        self._resolve(entry, handle, method, value, error, shard)

    async def _lost_on_channel(
        self, entry: Hosted, shard: ShardRef, handle: Handle[Any], method: str
    ) -> None:
        """A turn call whose channel broke: a dead shard resolves it as Ray calls are (``shard_lost``); a live
        one, with an error (its outcome is unknown), and the shard's turn calls go as Ray calls until the
        channel is connected again."""
        self._resolve(entry, handle, method, None, await self.feeds.verdict(shard), shard)

    def _resolve(
        self,
        entry: Hosted,
        handle: Handle[Any],
        method: str,
        value: Any,
        error: BaseException | None,
        shard: ShardRef,
    ) -> None:
        with self.fleet.lock:
            entry.inflight -= 1
        turn = method in ("prompt", "send", "resumed_result")
        if error is not None and turn and isinstance(error, ShardDied) and entry.session_id:
            # the session is resumed from its log on another shard, which takes the turn up (design §3.12)
            follow = partial(self.send, entry.session_id, handle, "resumed_result", (handle.id,))
            entry.gate.then(follow)
            return
        if method == "resumed_result" and value is None:  # the new shard did not take the turn up
            error = ShardDied(
                "the turn's shard died and the shard that resumed its session did not take it up"
            )
        if error is not None:
            if not isinstance(error, ShardDied):
                handle.set_exception(error)
                return
            note = (
                f"{SHARD_LOST}: {error}; the session is resumed from its log on another shard and this turn "
                "is not retried (what it wrote before is kept): send the prompt again"
            )
            if turn:
                handle.set_result(TurnResult(prompt_id=handle.id, status="error", error=note))
            elif method == "compact":
                handle.set_result(CompactionResult(compacted=False, reason=note))
            else:  # abort: no turn runs on a dead shard
                handle.set_result(False)
            return
        if turn:
            data, positions = value
            self._after_events(entry, shard, positions, partial(handle.set_result, _wire.decode_turn(data)))
        elif method == "compact":
            data, positions = value
            self._after_events(
                entry, shard, positions, partial(handle.set_result, _wire.decode_compaction(data))
            )
        else:
            handle.set_result(value)

    def _after_events(
        self, entry: Hosted, shard: ShardRef, positions: dict[str, int], fn: Callable[[], None]
    ) -> None:
        """Call ``fn`` once this front has received the batch of the shard's events that holds the turn's
        last (``positions``: front id -> batch number), so that, as on the local bus, a turn's events are
        queued to every subscriber before its handle resolves. An answer on the turn channel comes after
        that batch, so this is at once; one sent as a Ray call may overtake it. After
        :data:`EVENTS_WAIT` seconds ``fn`` runs anyway: a handle must resolve. After the session's shard
        died, the relays hold its new shard's events until the catch-up has passed on the dead shard's:
        the wait begins once the session is caught up (``Hosted.caught_up``)."""
        entry.caught_up.then(partial(self._after_batch, shard, positions, fn))

    def _after_batch(self, shard: ShardRef, positions: dict[str, int], fn: Callable[[], None]) -> None:
        wanted = positions.get(self.feeds.front_id)
        inbound = shard.inbound
        if wanted is None or inbound is None or inbound.received >= wanted:
            fn()
            return
        lock = threading.Lock()
        done = [False]

        def once() -> None:
            with lock:
                if done[0]:
                    return
                done[0] = True
            fn()

        loop = self.fleet.loop
        if loop is not None:
            loop.loop.call_soon_threadsafe(loop.loop.call_later, EVENTS_WAIT, once)
        inbound.when(wanted, once)
