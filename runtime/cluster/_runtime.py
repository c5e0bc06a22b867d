"""The cluster runtime (design §10): the public API of :class:`~runtime.host.Runtime`, over shards on Ray.

    from runtime.cluster import ClusterRuntime

    with ClusterRuntime(sessions_dir="/shared/sessions", shards=2) as rt:   # or address="head:6379"
        sid = rt.start_session(model="openai/gpt-4o-mini")
        print(rt.prompt(sid, "Hello").result(timeout=60).text)

Each shard is a Ray actor hosting a ``Runtime`` in its own process (:mod:`runtime.cluster._shard`); this
object is the front. It places each session on a shard by rendezvous hashing of its id
(:mod:`runtime.cluster._placement`), sends each call to the session's shard (:mod:`runtime.cluster._fleet`
keeps track of where sessions are, and moves and fails them over; :mod:`runtime.cluster._turns` sends the
turn calls and resolves their handles), and relays the events every shard pushes to its subscribers
(:mod:`runtime.cluster._feeds`, :mod:`runtime.cluster._events`).

The sessions directory must be one every shard sees (a shared filesystem path; the same path on every
node). A session's lock file keeps it to one owner. When a shard's process dies, its sessions are resumed
on the shards left, from their logs, and calls to them wait until they are back. A turn that was running
on the dead shard goes on there from its log (design §3.12: a logged answer is not asked for again, a
logged result is reused, a call that started and is not idempotent is not run again) and its handle
resolves with its real result. A turn the new shard does not take up (``agent.resume_turns`` off, or it
was taken up too often) resolves with ``status="error"`` and an error starting with ``shard_lost:``; so
do prompts that waited behind it (they were in the dead process's memory only). Everything acknowledged
before (every turn whose handle resolved) had been written to the log by then.

Adding a shard (:meth:`ClusterRuntime.add_shard`) or removing one (:meth:`ClusterRuntime.remove_shard`)
moves only the sessions whose place changes, each resumed on its new shard from its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from runtime import events as ev
from runtime.api import RuntimeAPI, ToolsArg
from runtime.bus import Subscription
from runtime.cluster import _wire
from runtime.cluster._callbacks import Callbacks
from runtime.cluster._capacity import Leases
from runtime.cluster._connect import check_address_form, connect, import_ray
from runtime.cluster._errors import ClusterError, ShardDied
from runtime.cluster._events import Relay, check_types
from runtime.cluster._feeds import Feeds
from runtime.cluster._fleet import Fleet
from runtime.cluster._loop import Loop
from runtime.cluster._placement import owner
from runtime.cluster._shard import Shard, ShardInfo
from runtime.cluster._turns import TurnCalls
from runtime.config import Config, load_config
from runtime.context.estimate import ContextStats
from runtime.handles import CompactionResult, Handle, PromptHandle
from runtime.host import _require_unicode, check_sendable
from runtime.ids import validate_session_id
from runtime.messages import Message, new_id
from runtime.observability import tracing_for
from runtime.served import SessionSummary
from runtime.store.history import page_bounds

if TYPE_CHECKING:
    from runtime.gateway import PoolSnapshot
    from runtime.handles import UsageReport
    from runtime.messages import Usage
    from runtime.observability.metrics import RuntimeMetrics
    from runtime.observability.tracing import Tracing
    from runtime.store.sessions import SessionInfo

log = logging.getLogger("agentcell.cluster")

SPAN_HOLD = 2.0
"""Seconds the front's spans wait at most for a delegating call's span before they make its sub-agent's
turn a root span: the two sessions' events can come from two shards once a failover put them apart (a
sub-agent lives on its parent's shard, whose one stream keeps their order, until a failover resumes one the
front knows at its own place; design §10.6)."""

__all__ = ["ClusterRuntime"]

_RESUME_KEYS = ("tools", "workspace", "api_key", "api_base", "approval", "require_approval")
"""What resuming a session needs that its log does not keep (the API key above all): kept in memory."""


class ClusterRuntime(RuntimeAPI):
    """Hosts sessions on N shards, each a Ray actor running a :class:`~runtime.host.Runtime` (the methods
    are documented once, in :class:`runtime.api.RuntimeAPI`; a docstring here says what differs).

    The same public API as ``Runtime`` (start/resume/stop/delete sessions, prompt, abort, compact,
    approve, the queries and their ``a``-twins, subscribe), usable from threads and asyncio, plus
    :meth:`add_shard`, :meth:`remove_shard`, :meth:`shard_of` and :attr:`shards`.

    Args:
        config, sessions_dir, config_path, approval: as for ``Runtime``. The sessions directory must be a
            path every shard sees (made absolute here). ``approval`` runs in the shards' processes.
        shards: how many shards to start.
        address: a Ray cluster to connect to (``HOST:PORT`` of its head's GCS, ``ray://HOST:PORT`` or
            ``"auto"``); None starts a local cluster unless this process is connected to one already.
        shard_cpus: the CPUs Ray reserves for each shard (each shard is one busy process).
        start_timeout: seconds to wait for the shards to start (a cluster too small for them never does).
        ray_init: more keyword arguments for ``ray.init``.
        tracer_provider: as for ``Runtime`` (``telemetry.tracing``): the spans are made here, at the front,
            from the events of every shard (design §10.6), so a turn is one trace wherever it runs, and the
            shards do not trace. Prompt and answer text stays in the shards: ``record_content`` is not.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        sessions_dir: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        approval: Callable[[str, Any], bool | str] | None = None,
        shards: int = 2,
        address: str | None = None,
        shard_cpus: float = 1.0,
        start_timeout: float = 120.0,
        ray_init: Mapping[str, Any] | None = None,
        tracer_provider: Any = None,
    ) -> None:
        if shards < 1:
            raise ValueError(f"a cluster needs at least one shard, not {shards}")
        if shard_cpus < 0:
            raise ValueError("shard_cpus must be >= 0")
        cfg = config if config is not None else load_config(config_path)
        if sessions_dir is not None:
            cfg = cfg.with_overrides({"persistence.sessions_dir": os.fspath(sessions_dir)})
        # One path for every shard: ~ and relative paths would mean something else in another process.
        cfg = cfg.with_overrides({"persistence.sessions_dir": str(cfg.sessions_path.expanduser().resolve())})
        if address is not None:
            check_address_form(address)
        self.config = cfg
        self.sessions_path = Path(cfg.persistence.sessions_dir)
        self.approval = approval
        self.address = address
        self.shard_count = shards
        self._leases: Leases | None = None
        self.shard_cpus = shard_cpus
        self.start_timeout = start_timeout
        self._ray_init = dict(ray_init or {})
        self._owns_ray = False
        self._metrics: RuntimeMetrics | None = None
        self._tracer_provider = tracer_provider
        self._tracing: Tracing | None = None
        self._metrics_lock = threading.Lock()  # not the fleet's: making them subscribes on every shard
        self._fleet = Fleet(
            cfg, approval, shard_cpus=shard_cpus, start_timeout=start_timeout, actor_class=None
        )
        self._feeds = Feeds(self._fleet)
        self._callbacks = Callbacks()
        self._turns = TurnCalls(self._fleet, self._feeds)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> ClusterRuntime:
        """Connect to (or start) the Ray cluster and start the shards. Idempotent; returns ``self``.

        Raises:
            ClusterUnavailable: nothing answers as a Ray cluster at ``address``.
            ClusterError: Ray is not installed, or the shards did not start (the error says why).
        """
        fleet = self._fleet
        with fleet.lock:
            if fleet.started:
                return self
            ray = import_ray()
            self._tracing = self._traced()
            self._connect(ray)
            fleet.loop = Loop().start()
            fleet.actor_class = ray.remote(Shard)
            try:
                self._feeds.open(fleet.spawn([fleet.next_name() for _ in range(self.shard_count)]))
            except BaseException:
                fleet.loop.stop()
                self._disconnect(ray)
                raise
            fleet.gone = None
            fleet.started = True
            self._feeds.start()
            if self._tracing is not None:
                self._tracing.attach(self._relay)
            self._leases = Leases(self._live_shards)
            self._leases.start()
            return self

    def _traced(self) -> Tracing | None:
        """The front's spans, if it traces (``telemetry.tracing``, as a ``Runtime`` decides): then the shards
        it starts do not (one span per turn, made here from their events)."""
        telemetry = self.config.telemetry
        if telemetry.record_content:
            log.warning(
                "telemetry.record_content: a cluster's spans are made at its front, from the events of its "
                "shards, which carry no prompt or answer text: the spans record none"
            )
            telemetry = msgspec.structs.replace(telemetry, record_content=False)
        tracing = tracing_for(telemetry, self._tracer_provider, hold=SPAN_HOLD)
        if tracing is not None:
            self._fleet.config = self.config.with_overrides({"telemetry.tracing": "off"})
        return tracing

    def _live_shards(self) -> list[tuple[str, Any]]:
        with self._fleet.lock:
            return [(s.name, s.actor) for s in self._fleet.shards.values() if s.alive]

    def capacity(self) -> list[PoolSnapshot]:
        import msgspec
        import ray

        self._fleet.require_started()
        shards = self._live_shards()
        refs = [actor.capacity.remote() for _, actor in shards]
        out: list[PoolSnapshot] = []
        for (name, _), ref in zip(shards, refs):
            out.extend(msgspec.structs.replace(p, shard=name) for p in ray.get(ref, timeout=30))
        return out

    def _connect(self, ray: Any) -> None:
        cpus = math.ceil(self.shard_count * self.shard_cpus)
        self._owns_ray = connect(ray, self.address, cpus=cpus, ray_init=self._ray_init)
        self._fleet.gcs_address = ray.get_runtime_context().gcs_address

    def _disconnect(self, ray: Any) -> None:
        if self._owns_ray:
            self._owns_ray = False
            with contextlib.suppress(Exception):
                ray.shutdown()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every session on every shard (logs flushed), end the subscriptions after what they have
        queued, and stop the shards; disconnect from Ray if this runtime connected."""
        if self._leases is not None:
            self._leases.stop()
            self._leases = None
        import ray

        with self._fleet.lock:
            if not self._fleet.started:
                return
            self._fleet.started = False
            shards = [s for s in self._fleet.shards.values() if s.alive]
            relays = list(self._fleet.relays.values())
        with self._metrics_lock:
            metrics, self._metrics = self._metrics, None
        if metrics is not None:
            metrics.close()
        stopped = time.time()
        with contextlib.suppress(Exception):
            ray.get([s.actor.stop.remote(timeout) for s in shards], timeout=timeout + 10)
        # Each shard closed its turn channel after writing the answers of the turns its stop ended.
        channels = [s.channel for s in shards if s.channel is not None]
        if channels:

            async def ended() -> None:
                await asyncio.gather(*(channel.ended(5.0) for channel in channels))

            with contextlib.suppress(Exception):
                self._fleet.submit(ended()).result(10)
        for shard in shards:  # (its events came on its channel, read to its end: or they are pulled now)
            self._feeds.final_pull(shard)
            self._feeds.ended(shard)
        deadline = time.monotonic() + 5.0
        for relay in relays:
            relay.wait_feeds_ended(max(0.0, deadline - time.monotonic()))
        tracing, self._tracing = self._tracing, None
        if tracing is not None:  # (the spans of every event the shards sent, made before stop returns)
            tracing.close(timeout, at=stopped)
        for relay in relays:
            relay.close()
        for shard in shards:
            shard.alive = False
            with contextlib.suppress(Exception):
                ray.kill(shard.actor)
        assert self._fleet.loop is not None
        self._fleet.loop.stop()
        with self._fleet.lock:
            self._fleet.shards.clear()
            self._fleet.sessions.clear()
            self._fleet.relays.clear()
        self._disconnect(ray)

    def metrics(self) -> RuntimeMetrics:
        """The cluster's Prometheus metrics, as ``Runtime.metrics``: counted at the front from the events of
        every shard (one subscription across them), from the first call on. Needs ``prometheus-client``."""
        from runtime.observability.metrics import RuntimeMetrics

        with self._metrics_lock:
            self._fleet.require_started()
            if self._metrics is None:
                self._metrics = RuntimeMetrics(self)
            return self._metrics

    def __enter__(self) -> ClusterRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ClusterRuntime:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    @property
    def running(self) -> bool:
        return self._fleet.started

    # -- shards -------------------------------------------------------------------------------------------
    @property
    def shards(self) -> list[str]:
        """The names of the live shards (those sessions are placed on, and any being removed)."""
        with self._fleet.lock:
            return [s.name for s in self._fleet.shards.values() if s.alive]

    def shard_info(self, name: str) -> ShardInfo:
        """Process, host and CPUs of a shard."""
        with self._fleet.lock:
            shard = self._fleet.shards.get(name)
        if shard is None:
            raise KeyError(f"no shard {name!r}")
        return shard.info

    def shard_of(self, session_id: str) -> str:
        """The shard hosting a session of this runtime (``SessionNotFound`` if it hosts none by that id);
        while the session moves, the shard it is moving to, once it is there."""
        return self._fleet.ready(session_id, 60.0)[1].name

    def placement(self, session_id: str) -> str:
        """The shard a session with this id goes to now (whether or not it exists)."""
        return owner(validate_session_id(session_id), self._fleet.placing())

    def add_shard(self) -> str:
        """Start one more shard; the sessions it now outscores the others for move to it. Returns its name."""
        self._fleet.require_started()
        (shard,) = self._fleet.spawn([self._fleet.next_name()])
        self._feeds.open([shard])
        self._fleet.rebalance()
        return shard.name

    def remove_shard(self, name: str, timeout: float = 60.0) -> None:
        """Move a shard's sessions to the others (each to its next place), then stop it."""
        import ray

        self._fleet.require_started()
        with self._fleet.lock:
            shard = self._fleet.shards.get(name)
            if shard is None or not shard.alive:
                raise KeyError(f"no live shard {name!r}")
            if len([s for s in self._fleet.shards.values() if s.alive and s.placing]) < 2:
                raise ClusterError(f"{name} is the last shard; add another before removing it")
            shard.placing = False
        self._fleet.rebalance(timeout)
        shard.stopping = True
        with contextlib.suppress(Exception):
            ray.get(shard.actor.stop.remote(), timeout=timeout)
        with self._fleet.lock:
            shard.alive = False
            self._fleet.shards.pop(name, None)
        with contextlib.suppress(Exception):
            ray.kill(shard.actor)

    def start_session(
        self,
        session_id: str | None = None,
        *,
        model: str | None = None,
        system_prompt: str = "",
        tools: ToolsArg = None,
        workspace: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        approval: Callable[[str, Any], bool | str] | None = None,
        require_approval: bool = False,
        agents: Mapping[str, Any] | None = None,
        mcp_servers: Any = None,
    ) -> str:
        """Create a session on its shard and return its id, as :meth:`runtime.api.RuntimeAPI.start_session`.
        ``tools``, ``approval``, ``agents`` and ``mcp_servers`` are pickled to the shard's process."""
        import ray

        self._fleet.require_started()
        _require_unicode(system_prompt, "the system prompt")
        sid = new_id() if session_id is None else validate_session_id(session_id)
        if sid in self._fleet.sessions:
            raise ValueError(f"session {sid!r} already exists; use resume_session to continue it")
        workspace = os.fspath(Path(workspace).expanduser().resolve()) if workspace is not None else None
        options = {
            "model": model,
            "system_prompt": system_prompt,
            "tools": tools,
            "workspace": workspace,
            "config": dict(config) if config is not None else None,
            "api_base": api_base,
            "api_key": api_key,
            "approval": approval,
            "require_approval": require_approval,
            "agents": agents,
            "mcp_servers": mcp_servers,
        }
        shard = self._fleet.place(sid)
        try:
            summary = ray.get(shard.actor.start_session.remote(sid, options), timeout=60)
        except ray.exceptions.RayError as exc:
            raise self._fleet.failure(exc, shard) from None
        self._fleet.register(sid, shard, summary, {k: options[k] for k in _RESUME_KEYS})
        return sid

    async def astart_session(self, session_id: str | None = None, **kwargs: Any) -> str:
        return await asyncio.to_thread(lambda: self.start_session(session_id, **kwargs))

    def resume_session(
        self,
        session_id: str,
        *,
        tools: ToolsArg = None,
        workspace: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        api_base: str | None = None,
        approval: Callable[[str, Any], bool | str] | None = None,
        require_approval: bool = False,
        repair: Literal["truncate"] | None = None,
        mcp_servers: Any = None,
    ) -> str:
        """Host a stored session on its shard; as ``Runtime.resume_session``."""
        import ray

        self._fleet.require_started()
        sid = validate_session_id(session_id)
        if repair not in (None, "truncate"):
            raise ValueError(f"repair must be None or 'truncate', not {repair!r}")
        if sid in self._fleet.sessions:
            return sid
        workspace = os.fspath(Path(workspace).expanduser().resolve()) if workspace is not None else None
        options = {
            "tools": tools,
            "workspace": workspace,
            "api_key": api_key,
            "api_base": api_base,
            "approval": approval,
            "require_approval": require_approval,
        }
        shard = self._fleet.place(sid)
        try:
            summary = ray.get(
                shard.actor.resume_session.remote(
                    sid, {**options, "repair": repair, "mcp_servers": mcp_servers}
                ),
                timeout=120,
            )
        except ray.exceptions.RayError as exc:
            raise self._fleet.failure(exc, shard) from None
        self._fleet.register(sid, shard, summary, options)
        return sid

    async def aresume_session(self, session_id: str, **kwargs: Any) -> str:
        return await asyncio.to_thread(lambda: self.resume_session(session_id, **kwargs))

    def flush(self, timeout: float | None = None) -> None:
        """Block until every shard has written what it queued for the disk, as ``Runtime.flush``: every
        session started before is durable."""
        import ray

        self._fleet.require_started()
        with self._fleet.lock:
            live = [s for s in self._fleet.shards.values() if s.alive]
        calls = [(shard, shard.actor.flush.remote(timeout)) for shard in live]
        for shard, call in calls:
            try:
                ray.get(call, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"{shard.name} did not flush within {timeout:g} s") from None
            except ray.exceptions.RayError as exc:
                error = self._fleet.failure(exc, shard)
                if not isinstance(error, ShardDied):  # (a dead shard has nothing left to write)
                    raise error from None

    def list_sessions(self) -> list[SessionInfo]:
        self.flush()  # (sessions started on other shards than the one that lists are written by then)
        infos: list[SessionInfo] = self._fleet.any("list_sessions")
        return infos

    async def alist_sessions(self) -> list[SessionInfo]:
        return await asyncio.to_thread(self.list_sessions)

    def interrupted_sessions(self) -> list[str]:
        # (any shard reads the journals: the sessions directory is shared; one whose runtime is gone becomes
        # that shard's, and a session resumed on another shard is dropped from it once that shard holds it)
        with self._fleet.lock:
            hosted = set(self._fleet.sessions)
        found: list[str] = self._fleet.any("interrupted_sessions")
        return [sid for sid in found if sid not in hosted]

    def hosted_sessions(self) -> list[str]:
        with self._fleet.lock:
            return list(self._fleet.sessions)

    def stop_session(self, session_id: str) -> None:
        self._fleet.call(session_id, "stop_session")
        with self._fleet.lock:
            self._fleet.sessions.pop(session_id, None)

    async def astop_session(self, session_id: str) -> None:
        await asyncio.to_thread(self.stop_session, session_id)

    def delete_session(self, session_id: str) -> None:
        self._fleet.require_started()
        validate_session_id(session_id)
        if session_id in self._fleet.sessions:
            self._fleet.call(session_id, "delete_session")
            with self._fleet.lock:
                self._fleet.sessions.pop(session_id, None)
        else:
            self._fleet.any("delete_session", session_id)

    async def adelete_session(self, session_id: str) -> None:
        await asyncio.to_thread(self.delete_session, session_id)

    def hibernate(self, session_id: str) -> bool:
        return bool(self._fleet.call(session_id, "hibernate"))

    async def ahibernate(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.hibernate, session_id)

    # -- turns --------------------------------------------------------------------------------------------
    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        images: Sequence[str] = (),
        steer: bool = False,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        """Send a user message to the session's shard, as :meth:`runtime.api.RuntimeAPI.prompt`. Returns at
        once; the handle resolves when the run ends, on the shard that resumed the session if its shard
        died meanwhile (or with ``status="error"`` and an error starting with ``shard_lost:`` when the turn
        could not be taken up there)."""
        if not isinstance(text, str):
            raise TypeError(f"prompt text must be a string, got {type(text).__name__}")
        if not text.strip() and not images:
            raise ValueError("prompt text must not be empty (or send an image)")
        _require_unicode(text, "prompt text")
        entry = self._fleet.hosted(session_id)
        handle = PromptHandle(prompt_id or new_id())
        send = partial(self._turns.send, session_id, handle, "prompt", (text, list(images), steer, handle.id))
        entry.gate.then(send)
        return handle

    def send(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        options: Any = None,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        """Run a turn on ``messages`` (see :meth:`runtime.Runtime.send`) on the session's shard; a shard that
        dies first resolves it like :meth:`prompt`."""
        check_sendable(messages, options)
        entry = self._fleet.hosted(session_id)
        handle = PromptHandle(prompt_id or new_id())
        payload = (_wire.encode(list(messages)), _wire.encode(options), handle.id)
        entry.gate.then(partial(self._turns.send, session_id, handle, "send", payload))
        return handle

    def resumed_turn(self, session_id: str, timeout: float = 30.0) -> PromptHandle | None:
        prompt_id = self._fleet.call(session_id, "resumed_turn", timeout, timeout=timeout)
        if prompt_id is None:
            return None
        handle = PromptHandle(str(prompt_id))
        entry = self._fleet.hosted(session_id)
        entry.gate.then(partial(self._turns.send, session_id, handle, "resumed_result", (handle.id,)))
        return handle

    def abort(self, session_id: str) -> Handle[bool]:
        entry = self._fleet.hosted(session_id)
        handle: Handle[bool] = Handle(new_id())
        entry.gate.then(partial(self._turns.send, session_id, handle, "abort", ()))
        return handle

    def compact(
        self, session_id: str, keep_recent_tokens: int | None = None, instructions: str | None = None
    ) -> Handle[CompactionResult]:
        if keep_recent_tokens is not None and keep_recent_tokens < 0:
            raise ValueError("keep_recent_tokens must be >= 0")
        entry = self._fleet.hosted(session_id)
        handle: Handle[CompactionResult] = Handle(new_id())
        send = partial(self._turns.send, session_id, handle, "compact", (keep_recent_tokens, instructions))
        entry.gate.then(send)
        return handle

    def approve(
        self, session_id: str, call_id: str, approved: bool = True, reason: str | None = None
    ) -> bool:
        return bool(self._fleet.call(session_id, "approve", call_id, approved, reason))

    # -- queries ------------------------------------------------------------------------------------------
    def context_stats(self, session_id: str, timeout: float = 30.0) -> ContextStats:
        stats: ContextStats = self._fleet.call(session_id, "context_stats", timeout, timeout=timeout)
        return stats

    async def acontext_stats(self, session_id: str) -> ContextStats:
        return await asyncio.to_thread(self.context_stats, session_id)

    def messages(
        self,
        session_id: str,
        *,
        view: str = "user",
        offset: int = 0,
        limit: int | None = None,
        timeout: float = 30.0,
    ) -> list[Message]:
        if view not in ("user", "model"):
            raise ValueError("view must be 'user' or 'model'")
        page_bounds(0, offset, limit)
        found = self._fleet.call(session_id, "messages", view, timeout, offset, limit, timeout=timeout)
        return _wire.decode_messages(found)

    def message_count(self, session_id: str, *, view: str = "user", timeout: float = 30.0) -> int:
        if view not in ("user", "model"):
            raise ValueError("view must be 'user' or 'model'")
        return int(self._fleet.call(session_id, "message_count", view, timeout, timeout=timeout))

    async def amessages(
        self, session_id: str, *, view: str = "user", offset: int = 0, limit: int | None = None
    ) -> list[Message]:
        return await asyncio.to_thread(
            lambda: self.messages(session_id, view=view, offset=offset, limit=limit)
        )

    def usage(
        self, session_id: str, timeout: float = 30.0, *, include_children: bool = False
    ) -> Usage | UsageReport:
        # (a session's sub-agents live on its shard: that shard's runtime rolls them up)
        report: Usage | UsageReport = self._fleet.call(
            session_id, "usage", timeout, include_children, timeout=timeout
        )
        return report

    async def ausage(self, session_id: str) -> Usage | UsageReport:
        return await asyncio.to_thread(self.usage, session_id)

    def set_model(self, session_id: str, model: str, timeout: float = 30.0) -> int:
        window = int(self._fleet.call(session_id, "set_model", model, timeout, timeout=timeout))
        entry = self._fleet.sessions.get(session_id)
        if entry is not None:
            entry.model, entry.context_window = model, window
        return window

    async def aset_model(self, session_id: str, model: str) -> int:
        return await asyncio.to_thread(self.set_model, session_id, model)

    def branch(self, session_id: str, leaf_id: str | None, timeout: float = 30.0) -> None:
        self._fleet.call(session_id, "branch", leaf_id, timeout, timeout=timeout)

    async def abranch(self, session_id: str, leaf_id: str | None) -> None:
        await asyncio.to_thread(self.branch, session_id, leaf_id)

    def children(self, session_id: str) -> list[str]:
        """The sub-agent sessions ``session_id`` delegated to (they live on its shard)."""
        found: list[str] = self._fleet.call(session_id, "call", "children", {})
        return found

    # -- what a front asks (runtime.served.Served) -------------------------------------------------------
    def is_hosted(self, session_id: str) -> bool:
        return session_id in self._fleet.sessions

    def is_stored(self, session_id: str) -> bool:
        return bool(self._fleet.any("is_stored", session_id))

    def stored_header(self, session_id: str) -> Any:
        return self._fleet.any("stored_header", session_id)

    def session_summary(self, session_id: str) -> SessionSummary:
        summary: SessionSummary = self._fleet.call(session_id, "session_summary")
        return summary

    def last_seq(self, session_id: str) -> int:
        if session_id not in self._fleet.sessions:
            return 0
        return int(self._fleet.call(session_id, "last_seq"))

    def replay(self, session_id: str, after_seq: int, types: Iterable[str] | None = None) -> list[ev.Event]:
        wanted = sorted(types) if types is not None else None
        if session_id in self._fleet.sessions:
            data = self._fleet.call(session_id, "replay", after_seq, wanted)
        else:
            data = self._fleet.any("replay", session_id, after_seq, wanted)
        return _wire.decode_events(data)

    # -- events -------------------------------------------------------------------------------------------
    def subscribe(
        self,
        sessions: str | Iterable[str] = "*",
        types: Iterable[str] | None = None,
        *,
        callback: Callable[[ev.Event], Any] | None = None,
        queue_size: int | None = None,
        include_children: bool = False,
        bulk: bool = True,
    ) -> Subscription:
        """Subscribe to sessions on every shard, as ``Runtime.subscribe``: the same filters, order per
        session, bounded queue and ``subscriber_lagged`` notices. Events published once this returns are
        not missed. ``include_children`` adds the events of the sessions' sub-agents (on their shards);
        with ``bulk=False`` no shard's stop sends a ``session_stopped`` for each of its sessions."""
        return self._relay(
            sessions,
            types,
            callback=callback,
            queue_size=queue_size,
            include_children=include_children,
            bulk=bulk,
        )

    def _relay(
        self,
        sessions: str | Iterable[str],
        types: Iterable[str] | None,
        *,
        callback: Callable[[ev.Event], Any] | None = None,
        queue_size: int | None = None,
        include_children: bool = False,
        bulk: bool = True,
        linger: float = 0.0,
    ) -> Subscription:
        """:meth:`subscribe` (the front's spans' too). ``linger`` is not needed: a front's callbacks run on
        a pool that reads each subscription's events in batches."""
        self._fleet.require_started()
        check_types(types)
        size = queue_size if queue_size is not None else self.config.bus.subscriber_queue
        relay = Relay(
            self._feeds.next_key(),
            sessions,
            types,
            queue_size=size,
            callback=callback,
            include_children=include_children,
            callbacks=self._callbacks,
            bulk=bulk,
        )
        with self._fleet.lock:
            self._fleet.relays[relay.key] = relay
            shards = [s for s in self._fleet.shards.values() if s.alive]
        try:
            self._feeds.subscribe([relay], shards)
        except BaseException:
            relay.subscription.close()
            with self._fleet.lock:
                self._fleet.relays.pop(relay.key, None)
            raise
        return relay.subscription
