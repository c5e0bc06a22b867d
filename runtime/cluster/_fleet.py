"""Where the sessions of a cluster runtime live, and what happens when shards come and go.

The :class:`Fleet` holds the shards (Ray actor handles) and, for each session the front hosts, the shard
it is on and what resuming it elsewhere takes (:class:`Hosted`: the API key and tools stay in memory,
never in the log). Every call for a session goes through :meth:`Fleet.ready`, which waits while the session
moves (its :class:`Gate` is closed).

A shard's death is learned at once: each shard has a call pending that never returns
(:meth:`Shard.watch`), and Ray fails it when the process dies. The fleet then takes the shard out of the
placement and resumes its sessions on their places among the shards left, from their logs
(:meth:`Fleet.rehost`). A lock file naming the dead process is stale on its own host; on another host the
fleet lets the new shard break it, since Ray has said its owner is dead.

An orderly move (a shard joins or leaves, :meth:`Fleet.move`) waits for the session's running turns to
end, stops it on the old shard, waits until every subscription has seen its last event from there (so
each subscriber gets the session's events in order), and resumes it on the new shard.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from runtime.cluster._channel import Address, TurnChannel, remove_folder
from runtime.cluster._connect import accepts
from runtime.cluster._errors import ClusterError, ClusterUnavailable, ShardDied, cause, first_line
from runtime.cluster._events import Inbound, Relay
from runtime.cluster._loop import Loop
from runtime.cluster._placement import moves, owner
from runtime.cluster._shard import ShardInfo
from runtime.config import Config
from runtime.host import RuntimeStopped, SessionNotFound
from runtime.ids import validate_session_id
from runtime.served import SessionSummary

log = logging.getLogger("agentcell.cluster")

__all__ = ["Fleet", "Gate", "Hosted", "ShardRef"]

MOVE_BARRIER_SECONDS = 5.0
"""How long a moving session waits for subscribers to receive its last events from the old shard."""


@dataclass(eq=False)
class ShardRef:
    name: str
    actor: Any
    info: ShardInfo
    alive: bool = True
    placing: bool = True  # in the placement: False while it is being removed
    channel: TurnChannel | None = None  # its turn channel; None: turn calls go as Ray calls
    address: Address | None = None  # where its turn channel listens
    inbound: Inbound | None = None  # its stream of events to this front
    pumping: bool = False  # its events are pulled by Ray calls (no turn channel)
    stopping: bool = False  # being stopped on purpose (removed)
    # Why its channel broke (the shard died, or only the connection did), once the runtime asked Ray.
    verdict: asyncio.Future[BaseException] | None = None


class Gate:
    """Open unless the session is moving between shards; callbacks wait for it to open."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._event.set()
        self._lock = threading.Lock()
        self._then: list[Callable[[], None]] = []

    def close(self) -> None:
        with self._lock:
            self._event.clear()

    def open(self) -> None:
        with self._lock:
            self._event.set()
            then, self._then = self._then, []
        for fn in then:
            fn()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    def then(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` now if open, else once it opens (on the thread that opens it)."""
        with self._lock:
            if not self._event.is_set():
                self._then.append(fn)
                return
        fn()


@dataclass(eq=False)
class Hosted:
    """A session this front hosts: where it is, and what resuming it elsewhere takes."""

    shard: str
    model: str
    context_window: int
    options: dict[str, Any]
    gate: Gate = field(default_factory=Gate)
    # Closed from its shard's death until the subscriptions have what the dead shard sent or wrote down
    # (the new shard's events are held until then): a turn's handle resolves after it opens.
    caught_up: Gate = field(default_factory=Gate)
    error: BaseException | None = None  # why it could not be resumed after its shard died
    inflight: int = 0  # prompts and compactions sent and not answered
    session_id: str = ""


class Fleet:
    """The shards of a cluster runtime and the sessions it hosts on them (state shared with the front)."""

    def __init__(
        self, config: Config, approval: Any, *, shard_cpus: float, start_timeout: float, actor_class: Any
    ) -> None:
        self.config = config
        self.approval = approval
        self.shard_cpus = shard_cpus
        self.start_timeout = start_timeout
        self.actor_class = actor_class
        self.lock = threading.RLock()
        self.started = False
        self.gone: ClusterUnavailable | None = None
        self.shards: dict[str, ShardRef] = {}
        self.sessions: dict[str, Hosted] = {}
        self.relays: dict[int, Relay] = {}
        self.on_lost: Callable[[ShardRef, Iterable[str]], None] | None = None
        self.after_failover: Callable[[ShardRef, list[str]], Awaitable[None]] | None = None
        self.loop: Loop | None = None
        self.gcs_address: str | None = None
        self._names = itertools.count()

    def next_name(self) -> str:
        while True:
            name = f"shard-{next(self._names)}"
            if name not in self.shards:
                return name

    def spawn(self, names: list[str]) -> list[ShardRef]:
        """Start shards and wait until each hosts its runtime; their deaths are watched from then on."""
        import ray

        actors = {
            name: self.actor_class.options(
                num_cpus=self.shard_cpus,
                max_concurrency=10_000,
                max_restarts=0,
                scheduling_strategy="SPREAD",
            ).remote(name, self.config, self.approval, os.getpriority(os.PRIO_PROCESS, 0))
            for name in names
        }
        refs = [actor.info.remote() for actor in actors.values()]
        try:
            infos = ray.get(refs, timeout=self.start_timeout)
        except ray.exceptions.GetTimeoutError:
            for actor in actors.values():
                ray.kill(actor)
            free = ray.available_resources().get("CPU", 0)  # type: ignore[no-untyped-call]  # unannotated in ray
            raise ClusterError(
                f"{len(names)} shard(s) did not start within {self.start_timeout:g} s: each asks Ray for "
                f"{self.shard_cpus:g} CPU (shard_cpus) and the cluster has {free:g} free"
            ) from None
        except ray.exceptions.RayError as exc:
            for actor in actors.values():
                ray.kill(actor)
            raise ClusterError(f"a shard failed to start: {cause(exc)}") from None
        started = []
        for (name, actor), info in zip(actors.items(), infos):
            shard = ShardRef(name, actor, info)
            with self.lock:
                self.shards[name] = shard
            started.append(shard)
            self.submit(self.watch(shard))
        return started

    def placing(self) -> list[str]:
        with self.lock:
            names = [s.name for s in self.shards.values() if s.alive and s.placing]
        if not names:
            raise ClusterError("no live shard is left in the cluster")
        return names

    def rebalance(self, timeout: float = 60.0) -> None:
        """Move every session whose place changed (after a shard joined or began to leave)."""
        with self.lock:
            placed = {sid: entry.shard for sid, entry in self.sessions.items() if entry.error is None}
        targets = moves(placed, self.placing())
        if not targets:
            return
        log.info("moving %d sessions between shards", len(targets))
        future = self.submit(self.move_all(targets, timeout))
        future.result()

    async def move_all(self, targets: dict[str, str], timeout: float) -> None:
        limit = asyncio.Semaphore(16)

        async def one(sid: str, target: str) -> None:
            async with limit:
                await self.move(sid, target, timeout)

        await asyncio.gather(*(one(sid, target) for sid, target in targets.items()))

    async def move(self, sid: str, target: str, timeout: float) -> None:
        """Move a session in an orderly way: drain its turns, stop it, let subscribers catch up, resume it."""
        import ray

        with self.lock:
            entry = self.sessions.get(sid)
            source = self.shards.get(entry.shard) if entry is not None else None
            destination = self.shards.get(target)
        if entry is None or source is None or destination is None:
            return
        entry.gate.close()
        try:
            deadline = time.monotonic() + timeout
            while entry.inflight and time.monotonic() < deadline:  # its running turns end first
                await asyncio.sleep(0.02)
            try:
                last = await source.actor.stop_session.remote(sid)
            except ray.exceptions.ActorDiedError:
                self.lost(source.name)
                await self.rehost(sid, entry, stale=source.info)
                return
            for relay in self.relays_of(sid):
                await asyncio.to_thread(relay.wait_seen, sid, last, source.name, MOVE_BARRIER_SECONDS)
            summary = await destination.actor.resume_session.remote(sid, entry.options, None)
            entry.shard, entry.model, entry.context_window = target, summary.model, summary.context_window
        except Exception as exc:
            entry.error = cause(exc)
            log.error("moving session %s to %s failed: %s", sid, target, entry.error)
        finally:
            entry.gate.open()

    # -- shard failures -----------------------------------------------------------------------------------
    async def watch(self, shard: ShardRef) -> None:
        """Learn of the shard's death the moment Ray does (its ``watch`` call never returns otherwise)."""
        import ray

        while shard.alive:
            try:
                await shard.actor.watch.remote()
            except ray.exceptions.ActorDiedError:
                if self.started and shard.alive:
                    self.lost(shard.name)
                return
            except ray.exceptions.RayError:
                if not shard.alive or not self.started:
                    return
                if not await asyncio.to_thread(self.cluster_alive):
                    self.went_away()
                    return
                await asyncio.sleep(1.0)  # unavailable for a moment (a network blip): watch again

    def lost(self, name: str) -> None:
        """A shard's process died: take it out of the placement and resume its sessions elsewhere."""
        with self.lock:
            shard = self.shards.get(name)
            if shard is None or not shard.alive or not self.started:
                return
            shard.alive = False
            orphans = [(sid, e) for sid, e in self.sessions.items() if e.shard == name]
            for _, entry in orphans:
                entry.gate.close()
                entry.caught_up.close()
            if self.on_lost is not None:  # (its connection is read to its end: see after_failover)
                self.on_lost(shard, [sid for sid, _ in orphans])
        if shard.address is not None:
            remove_folder(shard.address)  # its socket folder: the process that would remove it is dead
        log.warning(
            "shard %s (pid %d on %s) died; resuming its %d session(s) on the other shards",
            name,
            shard.info.pid,
            shard.info.host,
            len(orphans),
        )
        self.submit(self.failover(shard, orphans))

    async def failover(self, dead: ShardRef, orphans: list[tuple[str, Hosted]]) -> None:
        limit = asyncio.Semaphore(16)

        async def one(sid: str, entry: Hosted) -> None:
            async with limit:
                await self.rehost(sid, entry, stale=dead.info)

        try:
            await asyncio.gather(*(one(sid, entry) for sid, entry in orphans))
            if self.after_failover is not None:
                await self.after_failover(dead, [sid for sid, _ in orphans])
        finally:
            for _, entry in orphans:
                entry.caught_up.open()

    async def rehost(self, sid: str, entry: Hosted, stale: ShardInfo | None) -> None:
        """Resume a session of a dead shard on its place among the live ones; its gate opens whatever happens
        (an error it could not be resumed with is kept and raised by the calls that come)."""
        import ray

        try:
            for _ in range(len(self.shards) + 1):
                try:
                    target = self.shards[owner(sid, self.placing())]
                except ClusterError as exc:
                    entry.error = exc
                    return
                try:
                    stale_owner = (stale.host, stale.pid) if stale is not None else None
                    summary = await target.actor.resume_session.remote(sid, entry.options, stale_owner)
                except ray.exceptions.ActorDiedError:
                    self.lost(target.name)
                    continue
                except Exception as exc:
                    entry.error = cause(exc)
                    log.error("resuming session %s on %s failed: %s", sid, target.name, entry.error)
                    return
                entry.shard, entry.model, entry.context_window = (
                    target.name,
                    summary.model,
                    summary.context_window,
                )
                entry.error = None
                return
            entry.error = ClusterError(f"session {sid!r}: every shard tried died while it was resumed")
        finally:
            entry.gate.open()

    def cluster_alive(self) -> bool:
        """Whether the cluster's GCS still accepts connections."""
        return self.gcs_address is not None and accepts(self.gcs_address)

    def went_away(self) -> ClusterUnavailable:
        """The cluster is gone: every call raises this from now on, and subscriptions end (after what they
        have queued)."""
        with self.lock:
            if self.gone is not None:
                return self.gone
            gone = self.gone = ClusterUnavailable(
                f"the Ray cluster at {self.gcs_address} went away (its GCS does not answer); "
                "stop this runtime and start it again once the cluster is back"
            )
            relays = list(self.relays.values())
        log.error("%s", gone)
        for relay in relays:
            relay.close()
        return gone

    def failure(self, exc: BaseException, shard: ShardRef) -> BaseException:
        """What a failed call to ``shard`` means for its caller: the shard's own error, or a cluster error."""
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError):
            return cause(exc)
        if isinstance(exc, ray.exceptions.ActorDiedError):
            self.lost(shard.name)
            return ShardDied(f"{shard.name} died: {first_line(exc)}")
        if isinstance(exc, ray.exceptions.RayError):
            if not self.cluster_alive():
                return self.went_away()
            return ClusterError(f"{shard.name} did not answer: {first_line(exc)}")
        return exc

    # -- sessions -----------------------------------------------------------------------------------------
    def require_started(self) -> None:
        if self.gone is not None:
            raise self.gone
        if not self.started:
            raise RuntimeStopped("the runtime is not running; call start() or use it as a context manager")

    def hosted(self, session_id: str) -> Hosted:
        self.require_started()
        entry = self.sessions.get(session_id)
        if entry is None:
            validate_session_id(session_id)
            entry = self.discover(session_id)
        if entry is None:
            raise SessionNotFound(f"no running session {session_id!r} (resume_session it first)")
        return entry

    def discover(self, session_id: str) -> Hosted | None:
        """A session a shard hosts that this front did not start there: a sub-agent session, started by
        its parent on the parent's shard. Asked of every shard, so only when a session is not known."""
        import ray

        with self.lock:
            shards = [s for s in self.shards.values() if s.alive]
        refs = [s.actor.hosts.remote(session_id) for s in shards]
        for shard, ref in zip(shards, refs):
            try:
                summary = ray.get(ref, timeout=30)
            except ray.exceptions.RayError:
                continue
            if summary is not None:
                self.register(session_id, shard, summary, {})
                return self.sessions[session_id]
        return None

    def ready(self, session_id: str, timeout: float) -> tuple[Hosted, ShardRef]:
        """The session and its shard, once it is not moving (``TimeoutError`` after ``timeout``)."""
        entry = self.hosted(session_id)
        if not entry.gate.wait(timeout):
            raise TimeoutError(f"session {session_id!r} is still moving to another shard after {timeout:g} s")
        if entry.error is not None:
            raise entry.error
        with self.lock:
            shard = self.shards.get(entry.shard)
        if shard is None or not shard.alive:  # died a moment ago: its sessions are being resumed
            if not entry.gate.wait(timeout):
                raise TimeoutError(f"session {session_id!r} is still moving after {timeout:g} s")
            return self.ready(session_id, timeout)
        return entry, shard

    def call(self, session_id: str, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """Call a shard method for a hosted session, waiting at most ``timeout`` (plus a margin for the hop).
        A call that meets its shard dead is made again, once, on the shard that resumes the session."""
        import ray

        for attempt in range(2):
            entry, shard = self.ready(session_id, timeout)
            channel = shard.channel
            if channel is not None and entry.inflight:  # its turn calls sent before start first
                channel.sync(timeout)
            ref = getattr(shard.actor, method).remote(session_id, *args)
            try:
                return ray.get(ref, timeout=timeout + 5.0)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"{shard.name} did not answer within {timeout:g} s") from None
            except ray.exceptions.RayError as exc:
                error = self.failure(exc, shard)
                if isinstance(error, ShardDied) and attempt == 0:
                    continue
                raise error from None
        raise AssertionError("unreachable")

    def any(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        """Call a shard method that any shard can answer (the sessions directory is shared)."""
        import ray

        self.require_started()
        for _ in range(len(self.shards) + 1):
            with self.lock:
                live = [s for s in self.shards.values() if s.alive]
            if not live:
                raise ClusterError("no live shard is left in the cluster")
            shard = live[0]
            try:
                return ray.get(getattr(shard.actor, method).remote(*args), timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"{shard.name} did not answer within {timeout:g} s") from None
            except ray.exceptions.RayError as exc:
                error = self.failure(exc, shard)
                if not isinstance(error, ShardDied):
                    raise error from None
        raise ClusterError("every shard died while asked")

    def place(self, session_id: str) -> ShardRef:
        with self.lock:
            return self.shards[owner(session_id, self.placing())]

    def register(self, sid: str, shard: ShardRef, summary: SessionSummary, options: dict[str, Any]) -> None:
        with self.lock:
            self.sessions[sid] = Hosted(
                shard.name, summary.model, summary.context_window, options, session_id=sid
            )

    def relays_of(self, session_id: str) -> list[Relay]:
        with self.lock:
            return [r for r in self.relays.values() if not r.closed and r.covers(session_id)]

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        assert self.loop is not None
        return self.loop.submit(coro)
