"""The public API (design §1.5): one :class:`Runtime` per process hosts many sessions.

    from runtime import Runtime

    with Runtime() as rt:
        sid = rt.start_session(model="openai/gpt-4o-mini", system_prompt="You are terse.")
        with rt.subscribe(sid, types={"compaction_end"}) as events:
            print(rt.prompt(sid, "Hello").result(timeout=60).text)

Every method is safe to call from any thread. Operations that complete later return a handle that can
be waited on (``handle.result(timeout)``) or awaited (``await handle``); the blocking queries have
``a``-prefixed async twins that never block an event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from msgspec.structs import replace

from actors.protocol import (
    Abort,
    Branch,
    Compact,
    GetContext,
    GetContextStats,
    GetMessages,
    GetTotals,
    Prompt,
    SetModel,
    TurnOptions,
)
from actors.session import ParkedSession, Session, header_for
from actors.wiring import Services, SessionSpec
from runtime import events as ev
from runtime.actor import Dispatcher
from runtime.affinity import allowed_cpus, place_runtime
from runtime.approval import ApprovalBroker
from runtime.bus import EventBus, Subscription
from runtime.config import Config, load_config
from runtime.context.estimate import ContextStats
from runtime.errors import RuntimeStopped, SessionNotFound
from runtime.gateway import Gateway, IoLoop
from runtime.handles import CompactionResult, Handle, PromptHandle
from runtime.ids import validate_session_id
from runtime.messages import Message, Usage, new_id, user
from runtime.models import model_info, validate_model_name
from runtime.observability import tracing_for
from runtime.observability.metrics import RuntimeMetrics
from runtime.registry import SessionRegistry
from runtime.store.entries import Header, decode_entry, encode_entry, new_header, scrub_secrets
from runtime.store.index import IndexAppender
from runtime.store.log import CorruptLogError, cut_log, load_tree
from runtime.store.sessions import SessionDirectory, SessionInfo
from runtime.store.transcript import TranscriptWriter, transcript_end
from runtime.store.writer import LogWriter, WriterClosedError
from runtime.subagents import Delegations, UsageReport, parse_profiles
from runtime.supervisor import Supervisor
from runtime.tokens import TokenCounter
from runtime.tools.builtin import builtin_registry
from runtime.tools.executor import ToolExecutor
from runtime.tools.mcp import McpHub, parse_servers
from runtime.tools.mcp.servers import restored, withheld
from runtime.tools.registry import ToolRegistry

__all__ = ["Runtime", "RuntimeStopped", "SessionNotFound", "ToolsArg", "check_sendable"]


log = logging.getLogger("agentcell.runtime")

ToolsArg = Any  # a ToolRegistry, an iterable of functions/Tools, "builtin", or None


class Runtime:
    """Hosts sessions: each a supervised group of actors over a shared dispatcher, I/O loop and bus."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        sessions_dir: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        approval: Callable[[str, Any], bool | str] | None = None,
        agents: Mapping[str, Any] | None = None,
        tracer_provider: Any = None,
    ) -> None:
        """``tracer_provider``: an OpenTelemetry ``TracerProvider`` for the runtime's spans (design §7.5); without
        one, the global provider is used when an SDK set it (``telemetry.tracing``)."""

        cfg = config if config is not None else load_config(config_path)
        if sessions_dir is not None:
            cfg = cfg.with_overrides({"persistence.sessions_dir": os.fspath(sessions_dir)})
        self.config = cfg
        self.approval = approval
        self.agents = {**cfg.agents, **parse_profiles(agents)}
        """The sub-agent profiles every session can delegate to (``[agents.NAME]`` and ``agents=``)."""
        self.delegations = Delegations(self)
        self._lock = threading.RLock()
        # replaced by each start(); a plain session never used is a ParkedSession until its first use
        self._sessions: SessionRegistry[Session | ParkedSession] = SessionRegistry()
        self._started = False
        self.cpus: frozenset[int] | None = None
        """The CPUs the runtime's own threads run on (``runtime.cpu``), once started; None: not placed."""
        self._counters: dict[
            tuple[str, Any] | str, TokenCounter
        ] = {}  # by (model, tokens config); by model: defaults
        self._windows: dict[str, int] = {}
        self._tracer_provider = tracer_provider
        self._metrics: RuntimeMetrics | None = None
        self._names: dict[tuple[str | None, bool, bool], list[str]] = {}
        self._states: dict[str, SetModel] = {}

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> Runtime:
        """Start the shared machinery. Idempotent; returns ``self``."""

        with self._lock:
            if self._started:
                return self
            self._placement = place_runtime(self.config.runtime.cpu)  # first: a bad CPU makes nothing
            try:
                self._start(self.config, self._placement.cpus)
            except BaseException:
                self._placement.release()
                raise
            self.cpus = self._placement.cpus
            self._started = True
            return self

    def _start(self, cfg: Config, cpus: frozenset[int] | None) -> None:

        self.sessions_path = cfg.sessions_path
        self.sessions_path.mkdir(parents=True, exist_ok=True)
        # Where tools and the processes they start run when the runtime keeps its own threads on one CPU.
        self._process_cpus = allowed_cpus() if cpus is not None else None
        self.dispatcher = Dispatcher(
            threads=cfg.runtime.dispatcher_threads, batch_size=cfg.runtime.batch_size, cpus=cpus
        )
        self.bus = EventBus(queue_size=cfg.bus.subscriber_queue)
        self.io = IoLoop(cpus=cpus)
        writer = LogWriter(
            lazy_delay=cfg.persistence.transcript_delay,
            max_open_files=cfg.persistence.max_open_files,
            cpus=cpus,
        )
        directory = SessionDirectory(self.sessions_path, migrate=True)
        self._transcripts: TranscriptWriter | None = None
        if cfg.persistence.transcript:
            self._transcripts = TranscriptWriter(
                directory, writer, on_error=self._transcript_failed, left_out=self._left_out
            )
            self.bus.add_sink(self._transcripts)
        self.services = Services(
            dispatcher=self.dispatcher,
            bus=self.bus,
            gateway=Gateway(self.io, cfg.retry, max_connections=cfg.gateway.max_connections),
            executor=ToolExecutor(workers=cfg.runtime.tool_workers, cpus=self._process_cpus),
            writer=writer,
            directory=directory,
            approvals=ApprovalBroker(self.bus.publish),
            tracing=tracing_for(cfg.telemetry, self._tracer_provider),
            mcp=(hub := McpHub()),
        )
        if self.services.tracing is not None:
            self.services.tracing.parent_of = self.bus.parent_of  # a sub-agent's turn: under its tool call
        self.io.add_closer(hub.aclose)  # (a safety net: stop() stops every MCP server first)
        self.root = Supervisor.start_tree([], strategy="one_for_one", name="root", dispatcher=self.dispatcher)
        self._sessions = SessionRegistry()
        self.services.gateway.preload()  # import litellm on the I/O loop now, not on the first turn
        self.services.directory.ensure()  # (sessions of the flat layout move into their shard folders)
        self._index = IndexAppender(
            directory.index,
            writer,
            fsync="never" if cfg.persistence.fsync == "never" else "always",
            on_error=self._index_failed,
        )
        self._reaper: threading.Thread | None = None
        self._stopping = threading.Event()
        if cfg.persistence.hibernate_after is not None:
            self._reaper = threading.Thread(target=self._reap, name="agentcell-hibernate", daemon=True)
            self._reaper.start()

    def _transcript_failed(self, session_id: str, path: str, error: Exception) -> None:
        """A transcript write failed (e.g. a full disk): say so to subscribers (design §9), not just the log."""

        if isinstance(error, WriterClosedError):  # an event after stop(): nobody is left to tell
            return
        log.error("event transcript of session %s: %s", session_id, error)
        self.bus.publish(
            ev.PersistenceFailed(session_id=session_id, ts=time.time(), path=path, error=str(error))
        )

    def _index_failed(self, session_ids: list[str], error: Exception) -> None:
        """Headers of new sessions could not be written to the index (e.g. a full disk): say so for each.
        They are hosted still, and their first message writes the header to their own log."""
        path = self.services.directory.index.claim()
        log.error("sessions index %s: %d new sessions not written: %s", path, len(session_ids), error)
        for sid in session_ids:
            self.bus.publish(
                ev.PersistenceFailed(session_id=sid, ts=time.time(), path=path, error=str(error))
            )

    def _append_index(self, data: bytes) -> None:
        """Append lines to this runtime's index segment through the log writer and wait for them."""
        done = threading.Event()
        failed: list[Exception | None] = [None]

        def told(error: Exception | None) -> None:
            failed[0] = error
            done.set()

        writer = self.services.writer
        writer.append(self.services.directory.index.claim(), data, told, fsync=self._index.fsync)
        done.wait()
        if failed[0] is not None:
            raise failed[0]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every session (agents first, stores last), flush the logs, stop the machinery."""
        with self._lock:
            if not self._started:
                return
            self._started = False
            self._stopping.set()
            if self._metrics is not None:
                self._metrics.close()
                self._metrics = None
            if self._reaper is not None:
                self._reaper.join()
            for session in list(self.services.awake):  # the running ones; a parked one has nothing to stop
                session.stop(timeout=timeout)
            # to whoever gets it: a session nobody follows (no subscriber, no transcript) makes no event
            self.bus.publish_each(self._sessions, "session_stopped", _stopped)
            self.root.stop(timeout=timeout)
            if self.services.mcp is not None:  # no MCP server process outlives the runtime
                self.services.mcp.stop_all(timeout=timeout + 5.0)
            self.services.executor.shutdown()
            self.io.stop()
            self.services.writer.close()
            self.services.directory.close()
            self.bus.close()
            self.dispatcher.shutdown()
            self._placement.release()

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued for the disk so far is written: every session started before is
        durable (its header is in the sessions index, fsynced unless ``persistence.fsync = "never"``), and
        so is every acknowledged entry and event line."""
        self._require_started()
        self.services.writer.flush(timeout)

    def __enter__(self) -> Runtime:
        return self.start()

    def metrics(self) -> RuntimeMetrics:
        """The runtime's Prometheus metrics (a :class:`~runtime.observability.metrics.RuntimeMetrics`): a
        collector with its own ``registry``, counting from the first call (``agentcell serve`` makes it at
        start). Needs the ``prometheus-client`` package."""

        with self._lock:
            self._require_started()
            if self._metrics is None:
                self._metrics = RuntimeMetrics(self)
            return self._metrics

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Runtime:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    @property
    def running(self) -> bool:
        return self._started

    # -- sessions -------------------------------------------------------------------------------------
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
        _parent: tuple[str, str, int] | None = None,
    ) -> str:
        """Create a session and return its id.

        ``config`` holds per-session overrides (``{"compaction.mode": "truncate"}``). ``tools`` is a
        ``ToolRegistry``, functions, ``"builtin"`` (the file tools; shell only when
        ``agent.shell_enabled``), or None for no tools. ``api_key`` is kept in memory only. ``agents``
        adds sub-agent profiles to the runtime's (name → :class:`~runtime.config.AgentProfile` or a
        mapping of its fields): the session gets the ``agent`` delegation tool. ``mcp_servers`` adds MCP
        servers to the runtime's ``[mcp.servers]`` (design §3.9): name → :class:`~runtime.config.McpServerConfig`
        or a mapping of its fields, or command lines / URLs as ``agentcell chat --mcp`` takes them; their
        tools reach the model as ``NAME__tool``. They are kept in the session's log (values that look like
        secrets withheld) and come back with :meth:`resume_session`.
        """

        self._require_started()
        _require_unicode(system_prompt, "the system prompt")
        if session_id is None:
            # 64 random bits: no need to ask the disk (a stat per start, contended by the log writer
            # creating files in the same directory, was most of the cost of starting a session).
            sid = new_id()
        else:
            sid = validate_session_id(session_id)
            if sid in self._sessions or self.services.directory.exists(sid):
                raise ValueError(f"session {sid!r} already exists; use resume_session to continue it")
        cfg = self.config.for_session(config)
        if model is not None and model not in self._windows:  # (a model in use was checked already)
            validate_model_name(model)
        overrides = dict(config or {})
        # a sub-agent delegates only with the profiles its parent passes on; others with the runtime's
        profiles = (
            parse_profiles(agents) if _parent is not None else {**self.agents, **parse_profiles(agents)}
        )
        # The header goes to the sessions index, and the actors start on first use: a session that is never
        # used costs its header line in memory and in the index, and no file of its own (issue 32). A
        # plain session (nothing a header cannot hold) keeps only that line until it is used.
        plain = (
            api_key is None
            and approval is None
            and not require_approval
            and _parent is None
            and (tools is None or (isinstance(tools, str) and tools == "builtin"))
            and scrub_secrets(overrides) == overrides
            and not mcp_servers  # (MCP servers are objects of the spec's, started with the session)
            and not cfg.mcp.servers
        )
        session: Session | ParkedSession
        if plain:
            session, header = self._host_plain(
                sid,
                model or cfg.agent.model,
                system_prompt,
                tools,
                workspace,
                cfg,
                overrides,
                api_base,
                profiles,
            )
            line = session.recipe
        else:
            spec = self._spec(
                sid,
                model=model or cfg.agent.model,
                system_prompt=system_prompt,
                tools=tools,
                workspace=workspace,
                cfg=cfg,
                overrides=overrides,
                api_base=api_base,
                api_key=api_key,
                approval=approval,
                require_approval=require_approval,
                resume=False,
                agents=profiles,
                parent=_parent,
                mcp_servers=parse_servers(mcp_servers),
            )
            header = header_for(spec)
            line = encode_entry(header)
            session = self._host(spec, line, plain=False, builtin_tools=tools is not None)
        self._index.add(sid, line)
        if _parent is not None:
            self.delegations.adopt(sid, _parent[0], _parent[1])
        self.bus.publish(  # (at its header's time: the same event is rebuilt from the header by _left_out)
            ev.SessionStarted(
                session_id=sid,
                ts=header.created_at,
                model=session.model,
                context_window=session.context_window,
            )
        )
        return sid

    async def astart_session(self, session_id: str | None = None, **kwargs: Any) -> str:
        """:meth:`start_session` from asyncio (the same arguments), run off the event loop."""
        return await asyncio.to_thread(self.start_session, session_id, **kwargs)

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
        """Continue a stored session: its actors rebuild the tree from the log.

        A log with a line that is not a valid entry (not a torn last line, which is always repaired) raises
        :class:`~runtime.store.log.CorruptLogError` naming the file and the line, and nothing is hosted.
        ``repair="truncate"`` opens such a session up to its last good entry instead: the log is cut before
        the bad line, everything from it on is kept in ``<id>.artifacts/log-cut-<time>.jsonl``, and a
        ``log_recovered`` event says where. The session's own MCP servers come back from its log;
        ``mcp_servers`` adds or replaces some (e.g. to give again a value the log withheld as a secret).
        """
        self._require_started()
        sid = validate_session_id(session_id)
        if repair not in (None, "truncate"):
            raise ValueError(f"repair must be None or 'truncate', not {repair!r}")
        if sid in self._sessions:
            return sid

        explicit = parse_servers(mcp_servers)  # (bad input fails here, before anything is touched)
        stored = self.services.directory.stored_header(sid)
        if stored is None:
            raise SessionNotFound(f"no stored session {sid!r} in {self.sessions_path}")
        header, line = stored
        # Fail here, clearly, when another runtime is writing the session (its store takes the lock again).
        # A store of this runtime that stopped a moment ago lets go of the lock once its last writes are
        # done: wait for those first, or resuming right after stop_session would find the lock still held.
        self.services.writer.flush()
        with self.services.directory.lock(sid):
            if self.services.directory.has_log(sid):  # (a session never used has its header in the index)
                self._check_log(sid, repair)  # a corrupt log is an error here, not a session that dies later
        overrides = dict(header.config or {})
        cfg = self.config.with_overrides(overrides)
        spec = self._spec(
            sid,
            model=header.model,
            system_prompt=header.system_prompt,
            tools=tools if tools is not None else (list(header.tools) and "builtin") or None,
            workspace=workspace if workspace is not None else header.workspace,
            cfg=cfg,
            overrides=overrides,
            api_base=api_base if api_base is not None else header.api_base,
            api_key=api_key,
            approval=approval,
            require_approval=require_approval,
            resume=True,
            agents=parse_profiles(header.agents)
            if header.parent_session_id
            else {**self.agents, **parse_profiles(header.agents)},
            parent=(header.parent_session_id, header.parent_call_id or "", header.depth)
            if header.parent_session_id
            else None,
            mcp_servers=_resumed_servers(header.mcp_servers, explicit, cfg),
        )
        self._continue_numbering(sid)
        plain = api_key is None and approval is None and not require_approval and tools is None
        plain = plain and spec.mcp is None
        plain = plain and (workspace is None or spec.workspace == _workspace_of(header))
        plain = plain and (api_base is None or api_base == header.api_base)
        session = self._host(spec, line, plain=plain, builtin_tools=bool(header.tools), fresh=False)
        if header.parent_session_id:  # a sub-agent: its events carry its parent again
            self.delegations.adopt(sid, header.parent_session_id, header.parent_call_id or "")
        session.ensure_running()
        self.bus.publish(
            ev.SessionStarted(
                session_id=sid, model=spec.model, context_window=session.context_window, resumed=True
            )
        )
        return sid

    async def aresume_session(self, session_id: str, **kwargs: Any) -> str:
        """:meth:`resume_session` from asyncio (the same arguments), run off the event loop."""
        return await asyncio.to_thread(self.resume_session, session_id, **kwargs)

    def _check_log(self, sid: str, repair: str | None) -> None:
        """Raise :class:`CorruptLogError` unless the session's log replays; with ``repair="truncate"``, cut
        it before its first bad line instead (what is cut is kept in the session's artifacts)."""

        directory = self.services.directory
        path = directory.log_path(sid)
        try:
            load_tree(path, repair=False)  # (a torn last line is left for the store to cut and report)
        except CorruptLogError as exc:
            if repair != "truncate" or exc.line < 2:
                hint = (
                    "; resume_session(..., repair='truncate') opens the session up to the last good entry"
                    if exc.line >= 2
                    else ""
                )
                raise CorruptLogError(exc.path, exc.line, exc.reason + hint) from None
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            keep = directory.artifact_path(sid, f"log-cut-{stamp}-line-{exc.line}.jsonl")
            keep.parent.mkdir(parents=True, exist_ok=True)
            cut = cut_log(path, exc.line, keep)
            log.warning(
                "session %s: cut its log at line %d (%s); kept in %s", sid, exc.line, exc.reason, keep
            )
            self.bus.publish(
                ev.LogRecovered(
                    session_id=sid, path=str(path), torn_bytes=cut, line=exc.line, kept_in=str(keep)
                )
            )
            load_tree(path, repair=False)  # what is left must replay (an error now is not a line we can cut)

    def _continue_numbering(self, sid: str) -> None:
        """Make the resumed session's event numbers go on after every number it was ever given.

        A transcript that ends with an orderly stop holds every event: numbering goes on after its last.
        Otherwise (a crash, a torn line, no transcript) events may have reached subscribers without reaching
        the disk, and nobody knows how far their numbers went: numbering jumps to the clock, in microseconds
        since 1970, which no session reaches by counting (it would take a million events a second). A torn
        transcript line is reported with ``log_recovered``, like a torn log line.
        """

        if self.bus.last_seq(sid):  # numbered in this process already: from a floor above all before it
            return
        path = self.services.directory.transcript_path(sid)
        end = transcript_end(path) if self.config.persistence.transcript else None
        floor = end.last_seq if end is not None else 0
        if end is None or not end.clean:
            floor = max(floor, time.time_ns() // 1_000)
        self.bus.set_last_seq(sid, floor)
        if end is not None and end.torn_bytes:
            self.bus.publish(ev.LogRecovered(session_id=sid, path=str(path), torn_bytes=end.torn_bytes))

    def _spec(self, sid: str, *, tools: ToolsArg, workspace: Any, cfg: Config, **kw: Any) -> SessionSpec:

        root = _workspace(workspace)
        kw["approval"] = kw.get("approval") or self.approval
        parent = kw.pop("parent", None)
        agents = kw.pop("agents", None) or {}
        depth = parent[2] if parent is not None else 0
        registry = self.delegations.equip(_registry(tools, cfg), sid, agents, depth, cfg)
        spec = SessionSpec(
            session_id=sid,
            config=cfg,
            tools=registry,
            workspace=root,
            agents=agents,
            parent=parent,
            **kw,
        )
        # A sub-agent gets MCP tools from its parent ("inherit"), not servers of its own.
        servers = {**(cfg.mcp.servers if parent is None else {}), **spec.mcp_servers}
        if servers:
            from runtime.tools.mcp import McpServers

            spec.mcp = McpServers(
                sid,
                servers,
                cfg.mcp,
                io=self.io,
                publish=self.bus.publish,
                base=registry,
                workspace=root,
                logs_dir=self.services.directory.spill_dir(sid),
                hub=self.services.mcp,
                cpus=self._process_cpus,
            )
        return spec

    def _host(
        self, spec: SessionSpec, recipe: bytes, *, plain: bool, builtin_tools: bool, fresh: bool | None = None
    ) -> Session:
        session = Session(
            spec,
            self.services,
            self._model_state(spec.model, spec.config),
            parent=self.root,
            recipe=recipe,
            wake=self._wake,
            plain=plain,
            builtin_tools=builtin_tools,
            fresh=fresh,
        )
        self._sessions.register(spec.session_id, session)
        return session

    def _host_plain(
        self,
        sid: str,
        model: str,
        system_prompt: str,
        tools: str | None,
        workspace: str | os.PathLike[str] | None,
        cfg: Config,
        overrides: dict[str, Any],
        api_base: str | None,
        profiles: dict[str, Any],
    ) -> tuple[ParkedSession, Header]:
        """Host a new plain session: its header line in a record the garbage collector does not track;
        its :class:`Session` is made on first use (:meth:`_session`)."""
        import msgspec

        root = _workspace(workspace)
        header = new_header(
            sid,
            model=model,
            system_prompt=system_prompt,
            workspace=str(root) if root is not None else None,
            api_base=api_base,
            tools=self._tool_names(tools, cfg, bool(profiles)),
            config=overrides,
            agents={name: msgspec.to_builtins(profile) for name, profile in profiles.items()},
        )
        session = ParkedSession(encode_entry(header), self._model_state(model, cfg), tools is not None)
        self._sessions.register(sid, session)
        return session, header

    def _left_out(self, session_id: str) -> list[ev.Event]:
        """The events the transcript left out of a session started here while it had nothing to keep: its
        ``session_started`` (seq 1), rebuilt from its header as the bus stamped it (a resumed session's
        is kept: it opens the transcript itself)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return []
        header = decode_entry(entry.recipe)
        if not isinstance(header, Header):  # pragma: no cover - a recipe is always a header line
            return []
        cfg = self.config.with_overrides(dict(header.config)) if header.config else self.config
        started = ev.SessionStarted(
            session_id=session_id,
            seq=1,
            ts=header.created_at,
            model=header.model,
            context_window=self._window(header.model, cfg),
        )
        parent = self.bus.parent_of(session_id)
        if parent is not None:
            started = replace(started, parent_session_id=parent[0], parent_call_id=parent[1])
        return [started]

    def _model_state(self, model: str, cfg: Config) -> SetModel:
        """A session's first model, window and counter: one value shared by the sessions on the runtime's
        own settings (a million idle sessions hold a reference each, not a copy)."""
        if cfg is not self.config or (cfg.tokens.apply_calibration and not cfg.tokens.exact):
            return SetModel(model, self._window(model, cfg), self._counter(model, cfg))
        state = self._states.get(model)
        if state is None:
            state = self._states[model] = SetModel(model, self._window(model, cfg), self._counter(model, cfg))
        return state

    def _tool_names(self, tools: str | None, cfg: Config, delegates: bool) -> list[str]:
        """The names of a plain session's tools (as its header lists them), the same for every session
        of the same choice: worked out once."""
        key = (tools, cfg.agent.shell_enabled, delegates and cfg.subagents.max_depth > 0)
        names = self._names.get(key)
        if names is None:
            from runtime.subagents import DELEGATION_TOOL

            names = list(_registry(tools, cfg).names)
            if key[2]:
                names = [n for n in names if n != DELEGATION_TOOL] + [DELEGATION_TOOL]
            self._names[key] = names
        return names

    def _wake(self, session: Session) -> SessionSpec:
        """The spec of a parked session, rebuilt from its header (what ``start_session`` or
        ``resume_session`` made of the same header, without the checks done then)."""
        header = session.header()
        sid = header.session_id
        overrides = dict(header.config)
        cfg = self.config.with_overrides(overrides)
        parent = (
            (header.parent_session_id, header.parent_call_id or "", header.depth)
            if header.parent_session_id
            else None
        )
        agents = parse_profiles(header.agents) if parent else {**self.agents, **parse_profiles(header.agents)}
        tools = _registry("builtin" if session.builtin_tools else None, cfg)
        registry = self.delegations.equip(tools, sid, agents, header.depth, cfg)
        return SessionSpec(
            session_id=sid,
            model=header.model,
            system_prompt=header.system_prompt,
            config=cfg,
            tools=registry,
            workspace=_workspace_of(header),
            api_base=header.api_base,
            approval=self.approval,
            overrides=overrides,
            resume=not session.fresh,
            agents=agents,
            parent=parent,
        )

    def _window(self, model: str, cfg: Config) -> int:
        """The model's context window, cached for sessions on the runtime's own model settings."""

        if cfg.models is not self.config.models:  # per-session overrides: look it up each time
            return model_info(model, cfg.models).context_window
        window = self._windows.get(model)
        if window is None:
            window = self._windows[model] = model_info(model, cfg.models).context_window
        return window

    def _counter(self, model: str, cfg: Config) -> TokenCounter:

        if cfg.tokens.apply_calibration and not cfg.tokens.exact:
            return TokenCounter(model, cfg.tokens)  # calibrated by its session alone: never shared
        if cfg.tokens is self.config.tokens:  # the runtime's own settings (most sessions): no key to hash
            counter = self._counters.get(model)
            if counter is not None:
                return counter
        key = (model, cfg.tokens)  # every token setting: a session's own must not meet another's counter
        with self._lock:
            counter = self._counters.get(key)
            if counter is None:
                counter = self._counters[key] = TokenCounter(model, cfg.tokens)
            if cfg.tokens is self.config.tokens:
                self._counters[model] = counter
            return counter

    def _session(self, session_id: str) -> Session:
        """The hosted session ``session_id`` (made from its parked record on its first use)."""
        entry = self._hosted(session_id)
        if type(entry) is ParkedSession:
            made = Session(
                None,
                self.services,
                entry.state,
                parent=self.root,
                recipe=entry.recipe,
                wake=self._wake,
                session_id=session_id,
                plain=True,
                builtin_tools=entry.builtin_tools,
                fresh=True,
            )
            now = self._sessions.swap(session_id, entry, made)  # (another thread may have made it first)
            if now is None:
                raise SessionNotFound(f"no running session {session_id!r} (resume_session it first)")
            entry = now
        assert isinstance(entry, Session)
        return entry

    def _hosted(self, session_id: str) -> Session | ParkedSession:
        """The hosted session or its parked record, as it is (read-only uses: its model, window, state)."""
        self._require_started()
        entry = self._sessions.get(session_id)
        if entry is None:
            validate_session_id(session_id)
            raise SessionNotFound(f"no running session {session_id!r} (resume_session it first)")
        return entry

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeStopped("the runtime is not running; call start() or use it as a context manager")

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session (running or not), newest first."""
        self._require_started()
        self.services.writer.flush()  # the sessions started just now too (their headers on their way)
        infos = self.services.directory.list()
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    async def alist_sessions(self) -> list[SessionInfo]:
        """:meth:`list_sessions` from asyncio: the directory is read off the event loop."""
        return await asyncio.to_thread(self.list_sessions)

    def hosted_sessions(self) -> list[str]:
        """Ids of the sessions this runtime currently hosts."""
        return list(self._sessions.keys())

    def stop_session(self, session_id: str) -> None:
        """Stop a hosted session (its log stays): its sub-agents hosted here are stopped first."""
        for child in self.delegations.children(session_id):
            if child in self._sessions:
                self.stop_session(child)
        session = self._hosted(session_id)
        if isinstance(session, Session):  # (a parked one has nothing running)
            session.stop()
            if session.mcp is not None:
                session.mcp.wait_stopped()
        self._sessions.unregister(session_id)
        if session.fresh:  # never used: its header may still be on its way to the index
            self.services.writer.flush()
        self.bus.publish(ev.SessionStopped(session_id=session_id))

    async def astop_session(self, session_id: str) -> None:
        """:meth:`stop_session` from asyncio: waits for the actors to stop off the event loop."""
        await asyncio.to_thread(self.stop_session, session_id)

    def delete_session(self, session_id: str) -> None:
        """Stop the session if hosted and delete its log, transcript and artifacts, and those of its
        sub-agents (they exist to serve it; their answers stay in its record until then)."""
        self._require_started()
        validate_session_id(session_id)
        for child in self.delegations.children(session_id):
            if child in self._sessions or self.services.directory.exists(child):
                self.delete_session(child)
        if session_id in self._sessions:
            self.stop_session(session_id)
        self.services.writer.flush()  # (its header may still be on its way to the index)
        if not self.services.directory.exists(session_id):
            raise SessionNotFound(f"no stored session {session_id!r}")
        self.services.directory.delete(session_id, append_index=self._append_index)
        self.delegations.forget(session_id)
        # the id may be started again: as a new session, its events number from 1 in a new transcript
        self.bus.forget_session(session_id)
        if self._transcripts is not None:
            self._transcripts.forget(session_id)

    async def adelete_session(self, session_id: str) -> None:
        """:meth:`delete_session` from asyncio, run off the event loop."""
        await asyncio.to_thread(self.delete_session, session_id)

    def hibernate(self, session_id: str) -> bool:
        """Park an idle session's actors (design §8); its next use restarts them from the log. Its idle
        sub-agents are parked with it.

        Returns False when the session was not running or is busy with a turn."""
        session = self._hosted(session_id)
        parked = isinstance(session, Session) and session.hibernate_if_idle()
        if parked:
            for child in self.delegations.children(session_id):
                if child in self._sessions:
                    self.hibernate(child)
        return parked

    async def ahibernate(self, session_id: str) -> bool:
        """:meth:`hibernate` from asyncio, run off the event loop."""
        return await asyncio.to_thread(self.hibernate, session_id)

    def children(self, session_id: str) -> list[str]:
        """The sub-agent sessions ``session_id`` delegated to (started or resumed in this runtime, or
        found in the logs), oldest first."""
        self._require_started()
        known = self.delegations.children(session_id)
        stored = [i.id for i in self.services.directory.list() if i.parent_id == session_id]
        return known + [c for c in stored if c not in known]

    def _reap(self) -> None:
        """Hibernate sessions idle for ``persistence.hibernate_after`` seconds."""
        idle_after = self.config.persistence.hibernate_after
        assert idle_after is not None
        while not self._stopping.wait(min(1.0, max(0.05, idle_after / 4))):
            now = time.monotonic()
            for session in list(self.services.awake):  # (not the million parked ones)
                if session.running and now - session.last_used >= idle_after:
                    try:
                        session.hibernate_if_idle()
                    except Exception:  # a session that cannot park now is tried again later
                        log.exception("hibernating %s failed", session.session_id)

    # -- turns ----------------------------------------------------------------------------------------
    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        images: Sequence[str] = (),
        steer: bool = False,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        """Send a user message. Returns at once; the handle resolves when the run ends.

        While the session is busy the prompt is queued (``message_queued``) and runs next. With ``steer``
        it joins the running turn instead, at its next step boundary (after the running tools' results),
        and its handle resolves with that turn; when the turn ends first, it runs next like a queued one.
        ``prompt_id`` is the handle's id (default: a new one; a cluster front passes the id of its own
        handle, so that both and the session's events agree).
        """
        if not isinstance(text, str):
            raise TypeError(f"prompt text must be a string, got {type(text).__name__}")
        if not text.strip() and not images:  # the one rule, for Python and HTTP alike
            raise ValueError("prompt text must not be empty (or send an image)")
        _require_unicode(text, "prompt text")
        session = self._session(session_id)
        handle = PromptHandle(prompt_id or new_id())
        session.tell(Prompt(user(text, *images), handle, steer=steer))
        return handle

    def send(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        options: Any = None,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        """Run a turn on ``messages``, recorded in order: what a client that keeps its own side of the
        conversation sends (the Responses API front door). The last is a user message, or a tool result.

        ``messages`` may hold history (user and assistant messages, tool calls and their results) and the
        results of the client tool calls the previous run stopped for (``tool`` messages answering the calls
        of :attr:`TurnResult.awaiting`). ``options`` is an :class:`actors.protocol.TurnOptions`: client-side
        tools, this run's instructions, compaction on or off. Queued like :meth:`prompt` while busy.
        """
        check_sendable(messages, options)
        session = self._session(session_id)
        handle = PromptHandle(prompt_id or new_id())
        *lead, last = messages
        session.tell(Prompt(last, handle, lead=tuple(lead), options=options))
        return handle

    def abort(self, session_id: str) -> Handle[bool]:
        """Stop the running turn, repair unanswered tool calls, emit ``agent_abort``. Resolves to whether
        a turn was running."""
        session = self._session(session_id)
        handle: Handle[bool] = Handle(new_id())
        if not session.running:
            handle.set_result(False)
            return handle
        session.tell(Abort(handle))
        return handle

    def compact(
        self, session_id: str, keep_recent_tokens: int | None = None, instructions: str | None = None
    ) -> Handle[CompactionResult]:
        """Compact now (design §5.12). A manual compaction is always allowed, even after a failed one."""
        if keep_recent_tokens is not None and keep_recent_tokens < 0:
            raise ValueError("keep_recent_tokens must be >= 0")
        session = self._session(session_id)
        handle: Handle[CompactionResult] = Handle(new_id())
        session.tell(
            Compact(
                trigger="manual",
                keep_recent_tokens=keep_recent_tokens,
                instructions=instructions,
                handle=handle,
            )
        )
        return handle

    def approve(
        self, session_id: str, call_id: str, approved: bool = True, reason: str | None = None
    ) -> bool:
        """Answer an ``approval_request`` event. Returns False when no such request is waiting."""
        self._require_started()
        return self.services.approvals.answer(session_id, call_id, approved, reason)

    # -- queries --------------------------------------------------------------------------------------
    def context_stats(self, session_id: str, timeout: float = 30.0) -> ContextStats:
        """The context breakdown of design §4.6 (the same estimate the compaction trigger uses)."""
        return self._session(session_id).ask(GetContextStats(), timeout)

    async def acontext_stats(self, session_id: str) -> ContextStats:
        """:meth:`context_stats` from asyncio, run off the event loop."""
        return await asyncio.to_thread(self.context_stats, session_id)

    def messages(self, session_id: str, *, view: str = "user", timeout: float = 30.0) -> list[Message]:
        """The conversation: ``"user"`` (everything on the path, nothing hidden) or ``"model"``."""
        session = self._session(session_id)
        if view == "model":
            return list(session.ask(GetContext(), timeout).messages)
        if view != "user":
            raise ValueError("view must be 'user' or 'model'")
        return list(session.ask(GetMessages(), timeout).messages)

    async def amessages(self, session_id: str, *, view: str = "user") -> list[Message]:
        """:meth:`messages` from asyncio, run off the event loop."""
        return await asyncio.to_thread(self.messages, session_id, view=view)

    def usage(
        self, session_id: str, timeout: float = 30.0, *, include_children: bool = False
    ) -> Usage | UsageReport:
        """Session totals (input, output, reasoning, cache read/write, cost). With ``include_children``,
        a :class:`~runtime.subagents.UsageReport`: the session's own, each sub-agent's (theirs rolled up),
        and the total."""
        own = self._session(session_id).ask(GetTotals(), timeout)
        if not include_children:
            return own
        children = {}
        for child in self.children(session_id):
            if child not in self._sessions:
                self.resume_session(child)
            report = self.usage(child, timeout, include_children=True)
            assert isinstance(report, UsageReport)
            children[child] = report.total
        return UsageReport.of(own, children)

    async def ausage(self, session_id: str) -> Usage | UsageReport:
        """:meth:`usage` from asyncio, run off the event loop."""
        return await asyncio.to_thread(self.usage, session_id)

    def set_model(self, session_id: str, model: str, timeout: float = 30.0) -> int:
        """Switch the session's model; returns the new context window. A smaller window compacts on the
        next turn if the context no longer fits."""
        session = self._session(session_id)
        window = model_info(validate_model_name(model), session.spec.config.models).context_window
        counter = self._counter(model, session.spec.config)  # the new model's tokenizer, loaded here
        session.tell(SetModel(model, window, counter))  # the session hands it to each of its actors
        self.bus.publish(ev.ModelChanged(session_id=session_id, model=model, context_window=window))
        return window

    async def aset_model(self, session_id: str, model: str) -> int:
        """:meth:`set_model` from asyncio (the new model's tokenizer loads off the event loop)."""
        return await asyncio.to_thread(self.set_model, session_id, model)

    def branch(self, session_id: str, leaf_id: str | None, timeout: float = 30.0) -> None:
        """Move the session's leaf to ``leaf_id`` (any message id of the session; None = the start)."""
        stored = self._session(session_id).ask(Branch(leaf_id), timeout)
        if stored.error is not None:
            raise OSError(f"could not record the branch: {stored.error}")
        self.bus.publish(ev.Branched(session_id=session_id, leaf_id=leaf_id))

    async def abranch(self, session_id: str, leaf_id: str | None) -> None:
        """:meth:`branch` from asyncio: waits for the branch to be logged off the event loop."""
        await asyncio.to_thread(self.branch, session_id, leaf_id)

    # -- events ---------------------------------------------------------------------------------------
    def subscribe(
        self,
        sessions: str | Iterable[str] = "*",
        types: Iterable[str] | None = None,
        *,
        callback: Callable[[ev.Event], Any] | None = None,
        queue_size: int | None = None,
        include_children: bool = False,
    ) -> Subscription:
        """Subscribe to one session, several, or all (``"*"``), optionally to some event types.

        With ``callback`` events are pushed to it; otherwise iterate the subscription (``for`` or
        ``async for``). Close it (or use ``with``) when done. ``include_children`` adds the events of
        the sessions' sub-agents (and theirs), each with ``parent_session_id`` and ``parent_call_id``.
        """
        self._require_started()
        if types is not None:
            types = set(types)
            unknown = types - ev.EVENT_TYPES
            if unknown:
                raise ValueError(f"unknown event types: {', '.join(sorted(unknown))}")
        return self.bus.subscribe(
            sessions, types, callback=callback, queue_size=queue_size, include_children=include_children
        )


def _stopped(session_id: str) -> ev.SessionStopped:
    return ev.SessionStopped(session_id=session_id)


def check_sendable(messages: Sequence[Message], options: Any) -> None:
    """Raise ``ValueError`` (``TypeError``) unless :meth:`Runtime.send` can take ``messages`` and ``options``."""

    if not messages:
        raise ValueError("send needs at least one message")
    for message in messages:
        if not isinstance(message, Message) or message.role not in ("user", "assistant", "tool"):
            raise ValueError("send takes user, assistant and tool messages")
        _require_unicode(message.text, f"the {message.role} message")
    if messages[-1].role not in ("user", "tool"):
        raise ValueError("the last message sent must be a user message or a tool result")
    if options is not None and not isinstance(options, TurnOptions):
        raise TypeError("options must be an actors.protocol.TurnOptions")


def _workspace(workspace: str | os.PathLike[str] | None) -> Path | None:
    root = Path(workspace).expanduser().resolve() if workspace is not None else None
    if root is not None and not root.is_dir():
        raise ValueError(f"workspace {root} is not a directory")
    return root


def _workspace_of(header: Any) -> Path | None:
    return Path(header.workspace) if header.workspace else None


def _require_unicode(text: str, what: str) -> None:
    """Refuse text that cannot be stored as UTF-8 (a lone surrogate, e.g. from ``surrogateescape``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} is not valid Unicode: a lone surrogate at position {exc.start} "
            "(decode bytes with errors='replace')"
        ) from None


def _resumed_servers(stored: Mapping[str, Any], explicit: Mapping[str, Any], cfg: Config) -> dict[str, Any]:
    """A resumed session's own MCP servers: those of its log (one whose log withheld a secret gives way
    to the runtime's server of that name), then ``explicit`` ones."""
    out = {
        name: server
        for name, server in restored(stored).items()
        if not (withheld(server) and name in cfg.mcp.servers)
    }
    out.update(explicit)
    return out


def _registry(tools: ToolsArg, cfg: Config) -> ToolRegistry:

    if tools is None:
        return ToolRegistry()
    if isinstance(tools, ToolRegistry):
        return tools
    if tools == "builtin":
        return builtin_registry(shell=cfg.agent.shell_enabled)
    registry = ToolRegistry()
    for item in tools:
        if item == "builtin":
            for t in builtin_registry(shell=cfg.agent.shell_enabled).tools():
                registry.register(t)
        else:
            registry.register(item)
    return registry
