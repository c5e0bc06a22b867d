"""The shard: a Ray actor hosting one :class:`~runtime.host.Runtime` in its own process.

:class:`Shard` is a plain class; the cluster runtime wraps it with ``ray.remote`` when it starts, so that
importing this module does not import Ray. It is an async actor: every method runs on the actor's event
loop, and whatever blocks (reading a log, asking a session's actors) runs on a worker thread, so one slow
call never holds up the others. Turns and events travel as msgpack bytes (:mod:`runtime.cluster._wire`);
the turn calls (prompt, send, abort, compact) come on the shard's turn channel
(:mod:`runtime.cluster._channel`), or as Ray calls from a front that cannot reach it.

Events leave a shard pushed on each front's turn channel (:mod:`runtime.cluster._stream`): a front adds a
feed per cluster subscription (on the channel, or :meth:`Shard.subscribe_feed`), and a front that cannot
reach the channel pulls them (:meth:`Shard.pull_events`).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

import msgspec

from runtime.cluster import _wire
from runtime.cluster._channel import Address, Server
from runtime.cluster._stream import Router
from runtime.config import Config
from runtime.served import LocalServed, SessionSummary

log = logging.getLogger("agentcell.cluster")


class ShardInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Who a shard is: its name, process, host and the CPUs its runtime's threads run on."""

    name: str
    pid: int
    host: str
    node_ip: str
    cpus: list[int] | None
    sessions_path: str


class Shard:
    """Hosts a :class:`~runtime.host.Runtime` whose sessions directory is the cluster's shared one."""

    def __init__(self, name: str, config: Config, approval: Any = None, niceness: int | None = None) -> None:
        from runtime.host import Runtime

        self.name = name
        if niceness is not None:
            _renice(niceness)
        config, self._cpu_lock = _claim_cpu(config)
        self.runtime = Runtime(config, approval=approval).start()
        self.served = LocalServed(self.runtime)
        if self.runtime.cpus is not None:
            _place_process(self.runtime.cpus)
        self._forever: asyncio.Event | None = None
        self._router: Router | None = None  # made on the actor's loop (open_channel)
        self._channel: Server | None = None
        self._channel_address: Address | None = None

    # -- the shard itself ---------------------------------------------------------------------------------
    async def info(self) -> ShardInfo:
        import ray

        cpus = sorted(self.runtime.cpus) if self.runtime.cpus is not None else None
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
        path = str(self.runtime.sessions_path)
        return ShardInfo(
            name=self.name,
            pid=os.getpid(),
            host=socket.gethostname(),
            node_ip=node_ip,
            cpus=cpus,
            sessions_path=path,
        )

    async def watch(self) -> None:
        """Never returns: the front awaits it to learn at once when this shard's process dies."""
        if self._forever is None:
            self._forever = asyncio.Event()
        await self._forever.wait()

    async def flush(self, timeout: float | None = None) -> None:
        """Everything this shard's runtime queued for the disk is written (``Runtime.flush``)."""
        await asyncio.to_thread(self.runtime.flush, timeout)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop every session (logs flushed) and the runtime, then the turn channel, after writing the turns'
        answers and the events the stop published (``session_stopped`` of every session)."""
        await asyncio.to_thread(self.runtime.stop, timeout)
        if self._channel is not None:
            await self._channel.close()  # after the answers of the turns the stop ended, and their events

    # -- capacity (design §3.11, §10.5) ------------------------------------------------------------------
    async def capacity(self) -> list[Any]:
        """This shard's capacity pools (``Runtime.capacity``)."""
        return self.runtime.capacity()

    async def set_capacity_shares(self, shares: dict[str, float], default: float) -> None:
        """This shard's lease: its part of each pool's limits (the front rebalances them)."""
        self.runtime.services.gateway.set_capacity_shares(shares, default)

    # -- sessions -----------------------------------------------------------------------------------------
    async def start_session(self, session_id: str | None, options: dict[str, Any]) -> SessionSummary:
        sid = await asyncio.to_thread(lambda: self.runtime.start_session(session_id, **options))
        return self.served.session_summary(sid)

    async def resume_session(
        self, session_id: str, options: dict[str, Any], stale_owner: tuple[str, int] | None = None
    ) -> SessionSummary:
        """Host a stored session. ``stale_owner`` (host, pid): a shard known dead whose lock may be broken
        (on its own host the lock is seen to be stale anyway; on another host only the cluster knows)."""
        from runtime.store.sessions import SessionLockedError

        try:
            await asyncio.to_thread(lambda: self.runtime.resume_session(session_id, **options))
        except SessionLockedError as exc:
            if stale_owner is None or (exc.owner_host, exc.owner_pid) != tuple(stale_owner):
                raise
            lock = self.runtime.services.directory.lock_path(session_id)
            lock.unlink(missing_ok=True)  # its owner is dead: Ray said so
            await asyncio.to_thread(lambda: self.runtime.resume_session(session_id, **options))
        return self.served.session_summary(session_id)

    async def stop_session(self, session_id: str) -> int:
        """Stop a hosted session; returns the ``seq`` of its last event (``session_stopped``)."""
        await asyncio.to_thread(self.runtime.stop_session, session_id)
        return self.runtime.bus.last_seq(session_id)

    async def delete_session(self, session_id: str) -> None:
        await asyncio.to_thread(self.runtime.delete_session, session_id)

    async def list_sessions(self) -> list[Any]:
        return await asyncio.to_thread(self.runtime.list_sessions)

    async def interrupted_sessions(self) -> list[str]:
        return await asyncio.to_thread(self.runtime.interrupted_sessions)

    async def hosted_sessions(self) -> list[str]:
        return self.runtime.hosted_sessions()

    async def hibernate(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.runtime.hibernate, session_id)

    # -- turns --------------------------------------------------------------------------------------------
    # Each is a Ray method and a call of the turn channel (:mod:`runtime.cluster._channel`): started by
    # :meth:`_start`, answered by :meth:`_answer`.
    async def prompt(
        self, session_id: str, text: str, images: Sequence[str], steer: bool, prompt_id: str
    ) -> tuple[bytes, dict[str, int]]:
        """Run a prompt; its result, and where each feed of the session stood when it resolved."""
        handle = self._start("prompt", session_id, [text, images, steer, prompt_id])
        return self._answer("prompt", session_id, await handle)  # type: ignore[no-any-return]

    async def send(
        self, session_id: str, messages: bytes, options: bytes, prompt_id: str
    ) -> tuple[bytes, dict[str, int]]:
        """Run a turn on messages (see ``Runtime.send``); like :meth:`prompt`."""
        handle = self._start("send", session_id, [messages, options, prompt_id])
        return self._answer("send", session_id, await handle)  # type: ignore[no-any-return]

    async def resumed_turn(self, session_id: str, timeout: float) -> str | None:
        """The prompt id of the turn this shard took up from the log when it resumed the session (design
        §3.12), or None."""
        handle = await asyncio.to_thread(self.runtime.resumed_turn, session_id, timeout)
        return handle.id if handle is not None else None

    async def resumed_result(self, session_id: str, prompt_id: str) -> tuple[bytes, dict[str, int]] | None:
        """Once the turn this shard took up as prompt ``prompt_id`` ends, its result as :meth:`prompt`
        answers it; None when it took up no such turn."""
        handle = await asyncio.to_thread(self.runtime.resumed_turn, session_id)
        if handle is None or handle.id != prompt_id:
            return None
        return self._answer("prompt", session_id, await handle)  # type: ignore[no-any-return]

    async def abort(self, session_id: str) -> bool:
        return bool(await self._start("abort", session_id, []))

    async def compact(
        self, session_id: str, keep_recent_tokens: int | None, instructions: str | None
    ) -> tuple[bytes, dict[str, int]]:
        handle = self._start("compact", session_id, [keep_recent_tokens, instructions])
        return self._answer("compact", session_id, await handle)  # type: ignore[no-any-return]

    def _start(self, method: str, session_id: str, arguments: list[Any]) -> Any:
        """Start a turn call on the runtime (without waiting); its handle."""
        if method == "prompt":
            text, images, steer, prompt_id = arguments
            return self.runtime.prompt(session_id, text, images=images, steer=steer, prompt_id=prompt_id)
        if method == "send":
            messages, options, prompt_id = arguments
            return self.runtime.send(
                session_id,
                _wire.decode_messages(messages),
                options=_wire.decode_turn_options(options),
                prompt_id=prompt_id,
            )
        if method == "compact":
            keep_recent_tokens, instructions = arguments
            return self.runtime.compact(session_id, keep_recent_tokens, instructions)
        if method == "abort":
            return self.runtime.abort(session_id)
        raise ValueError(f"no turn call {method!r}")

    def _answer(self, method: str, session_id: str, value: Any) -> Any:
        """What crosses back once a turn call's handle resolved (on the actor's event loop)."""
        if method == "abort":
            return bool(value)
        return _wire.encode(value), self._positions()

    def _positions(self) -> dict[str, int]:
        """For each front: the number of the batch of events that holds the turn's last (a handle resolves
        after its events are published, and this seals what is pending). Once a front has received it,
        its subscribers have every event of the turn (the local bus's promise)."""
        return self._routing().seal_all() if self._router is not None else {}

    def _routing(self) -> Router:
        """The router of events to fronts and the turn channel's server (made once, on the actor's loop)."""
        if self._router is None:
            self._router = Router(self.runtime.bus, asyncio.get_running_loop())
            self.runtime.bus.add_sink(self._router)
            self._channel = Server(self._start, self._answer, self._router)
        return self._router

    async def open_channel(self) -> Address:
        """Start listening for fronts' turn channels (once); where, and the token they must bring."""
        import ray

        self._routing()
        assert self._channel is not None
        if self._channel_address is None:
            node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # unannotated in ray
            self._channel_address = await self._channel.open(node_ip)
        return self._channel_address

    async def approve(self, session_id: str, call_id: str, approved: bool, reason: str | None) -> bool:
        return self.runtime.approve(session_id, call_id, approved, reason)

    # -- queries ------------------------------------------------------------------------------------------
    async def context_stats(self, session_id: str, timeout: float) -> Any:
        return await asyncio.to_thread(self.runtime.context_stats, session_id, timeout)

    async def messages(
        self, session_id: str, view: str, timeout: float, offset: int = 0, limit: int | None = None
    ) -> bytes:
        found = await asyncio.to_thread(
            lambda: self.runtime.messages(session_id, view=view, offset=offset, limit=limit, timeout=timeout)
        )
        return _wire.encode(found)

    async def message_count(self, session_id: str, view: str, timeout: float) -> int:
        return await asyncio.to_thread(
            lambda: self.runtime.message_count(session_id, view=view, timeout=timeout)
        )

    async def usage(self, session_id: str, timeout: float, include_children: bool = False) -> Any:
        return await asyncio.to_thread(
            lambda: self.runtime.usage(session_id, timeout, include_children=include_children)
        )

    async def set_model(self, session_id: str, model: str, timeout: float) -> int:
        return await asyncio.to_thread(self.runtime.set_model, session_id, model, timeout)

    async def branch(self, session_id: str, leaf_id: str | None, timeout: float) -> None:
        await asyncio.to_thread(self.runtime.branch, session_id, leaf_id, timeout)

    async def call(self, session_id: str, method: str, kwargs: dict[str, Any]) -> Any:
        """Any other method of the runtime that takes a session id first (``children``, ...)."""
        return await asyncio.to_thread(lambda: getattr(self.runtime, method)(session_id, **kwargs))

    async def hosts(self, session_id: str) -> SessionSummary | None:
        """The session if this shard hosts it (a sub-agent session its parent started here), else None."""
        if not self.served.is_hosted(session_id):
            return None
        return self.served.session_summary(session_id)

    # -- what a front asks (runtime.served) ---------------------------------------------------------------
    async def is_stored(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.served.is_stored, session_id)

    async def stored_header(self, session_id: str) -> Any:
        return await asyncio.to_thread(self.served.stored_header, session_id)

    async def session_summary(self, session_id: str) -> SessionSummary:
        return self.served.session_summary(session_id)

    async def last_seq(self, session_id: str) -> int:
        return self.served.last_seq(session_id)

    async def replay(self, session_id: str, after_seq: int, types: list[str] | None) -> bytes:
        events = await asyncio.to_thread(self.served.replay, session_id, after_seq, types)
        return _wire.encode_events(events)

    # -- events (for a front without a turn channel; see runtime.cluster._stream) --------------------
    async def subscribe_feed(
        self,
        front_id: str,
        key: int,
        sessions: str | list[str],
        types: list[str] | None,
        children: bool,
        bulk: bool = True,
    ) -> None:
        self._routing().subscribe(front_id, key, sessions, types, children, bulk)

    async def unsubscribe_feed(self, front_id: str, key: int) -> None:
        self._routing().unsubscribe(front_id, key)

    async def pull_events(self, front_id: str, after: int, timeout: float) -> list[bytes]:
        """The batches of events for ``front_id`` after ``after`` (waiting up to ``timeout`` for one)."""
        return await self._routing().stream(front_id).pull(after, timeout)


def _place_process(cpus: frozenset[int]) -> None:
    """Put every thread of this process (Ray's own too) on the CPUs of the runtime's threads.

    A turn hands the GIL back and forth between Ray's threads (the task, the actor's event loop) and the
    runtime's; the runtime keeps its own threads on one CPU (``runtime.cpu``), and the hand-overs to Ray's
    threads cost a fifth of a mock turn's CPU when those run elsewhere. A shard is one busy process: all
    of it belongs where its runtime runs. Threads started later inherit the placement; the tool workers
    place themselves on every CPU as always.
    """
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cpus)
        except OSError:  # a thread that ended meanwhile, or a platform that does not let us
            continue


def _claim_cpu(config: Config) -> tuple[Config, int | None]:
    """``runtime.cpu = "auto"`` for a shard: a CPU that no other agentcell process on this host claims,
    held with the same lock files as :mod:`runtime.affinity` for as long as the shard lives (the
    descriptor returned). When every CPU is claimed, the shard is not placed at all (the OS balances it)
    rather than placed on a CPU another busy process has: two shards must never share one CPU while
    another sits idle."""
    if config.runtime.cpu != "auto":
        return config, None
    from runtime.affinity import LOCK_DIR, auto_candidates

    for cpu in auto_candidates():
        try:
            fd = os.open(
                LOCK_DIR / f"agentcell-cpu-{cpu}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process's
            os.close(fd)
            continue
        return config.with_overrides({"runtime.cpu": cpu}), fd
    return config.with_overrides({"runtime.cpu": "off"}), None


def _renice(niceness: int) -> None:
    """Run every thread at ``niceness`` (the front's): Ray starts its workers at 15 (``worker_niceness``),
    which leaves a shard, the process doing the work, last in line for a busy CPU. Raising priority needs
    the privilege to (root, or ``CAP_SYS_NICE``); without it the shard stays as Ray started it."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), niceness)
        except PermissionError:
            log.info("shard: cannot set its niceness to %d (Ray's workers run at 15)", niceness)
            return
        except OSError:
            continue
