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
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

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
from actors.session import ParkedSession, Session
from runtime import _delivery
from runtime import events as ev
from runtime._hosting import Hosting, workspace_of
from runtime._machinery import Machinery
from runtime._resume import check_log, continue_numbering, resumed_servers
from runtime.affinity import place_runtime
from runtime.api import RuntimeAPI, ToolsArg
from runtime.bus import Subscription
from runtime.config import Config, load_config
from runtime.context.estimate import ContextStats
from runtime.errors import RuntimeStopped, SessionNotFound
from runtime.gateway import PoolSnapshot
from runtime.handles import CompactionResult, Handle, PromptHandle, UsageReport
from runtime.ids import validate_session_id
from runtime.messages import Message, Usage, new_id, user
from runtime.models import validate_model_name
from runtime.observability.metrics import RuntimeMetrics
from runtime.store.history import HistoryPages, page_bounds
from runtime.store.sessions import SessionInfo
from runtime.subagents import Delegations, parse_profiles
from runtime.tools.mcp import parse_servers

__all__ = ["Runtime", "RuntimeStopped", "SessionNotFound", "ToolsArg", "check_sendable"]


class Runtime(RuntimeAPI):
    """Hosts sessions: each a supervised group of actors over a shared dispatcher, I/O loop and bus (the
    methods are documented once, in :class:`runtime.api.RuntimeAPI`)."""

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
        self._hosting = Hosting(self)  # the sessions hosted (replaced by each start) and what they share
        self._started = False
        self._writes = _delivery.WriteHealth()  # sessions whose log could not be written, and why
        self.cpus: frozenset[int] | None = None
        """The CPUs the runtime's own threads run on (``runtime.cpu``), once started; None: not placed."""
        self._tracer_provider = tracer_provider
        self._metrics: RuntimeMetrics | None = None
        self.history = HistoryPages()
        """Pages of old history read back from the logs (design §2.2): a small LRU shared by the sessions."""

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> Runtime:
        with self._lock:
            if self._started:
                return self
            self._placement = place_runtime(self.config.runtime.cpu)  # first: a bad CPU makes nothing
            try:
                m = self._machinery = Machinery(
                    self.config,
                    self._placement.cpus,
                    tracer_provider=self._tracer_provider,
                    left_out=self._hosting.left_out,
                )
            except BaseException:
                self._placement.release()
                raise
            self.sessions_path, self.services, self.root = m.sessions_path, m.services, m.root
            self.dispatcher, self.bus, self.io = m.dispatcher, m.bus, m.io
            self.bus.add_sink(self._writes)  # sessions whose log cannot be written refuse new prompts
            self._hosting.attach(m)
            self.cpus = self._placement.cpus
            self._started = True
            return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            if not self._started:
                return
            self._started = False
            if self._metrics is not None:
                self._metrics.close()
                self._metrics = None
            self._machinery.stop(self._hosting.sessions, timeout)
            self._placement.release()

    def flush(self, timeout: float | None = None) -> None:
        self._require_started()
        self.services.writer.flush(timeout)

    def __enter__(self) -> Runtime:
        return self.start()

    def metrics(self) -> RuntimeMetrics:
        with self._lock:
            self._require_started()
            if self._metrics is None:
                self._metrics = RuntimeMetrics(self)
            return self._metrics

    def capacity(self) -> list[PoolSnapshot]:
        self._require_started()
        control = self.services.gateway.capacity
        return control.snapshot() if control is not None else []

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
        self._require_started()
        _require_unicode(system_prompt, "the system prompt")
        if session_id is None:
            # 64 random bits: no need to ask the disk (a stat per start, contended by the log writer
            # creating files in the same directory, was most of the cost of starting a session).
            sid = new_id()
        else:
            sid = validate_session_id(session_id)
            if sid in self._hosting.sessions or self.services.directory.exists(sid):
                raise ValueError(f"session {sid!r} already exists; use resume_session to continue it")
        cfg = self.config.for_session(config)
        if model is not None:
            self._hosting.check_model(model)
        overrides = dict(config or {})
        # a sub-agent delegates only with the profiles its parent passes on; others with the runtime's
        profiles = (
            parse_profiles(agents) if _parent is not None else {**self.agents, **parse_profiles(agents)}
        )
        session, header, line = self._hosting.new(
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
            profiles=profiles,
            parent=_parent,
            mcp_servers=mcp_servers,
        )
        self._machinery.index.add(sid, line)
        if _parent is not None:
            self.delegations.adopt(sid, _parent[0], _parent[1])
        self.bus.publish(  # (at its header's time: the same event is rebuilt from the header by left_out)
            ev.SessionStarted(
                session_id=sid,
                ts=header.created_at,
                model=session.model,
                context_window=session.context_window,
            )
        )
        return sid

    async def astart_session(self, session_id: str | None = None, **kwargs: Any) -> str:
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
        self._require_started()
        sid = validate_session_id(session_id)
        if repair not in (None, "truncate"):
            raise ValueError(f"repair must be None or 'truncate', not {repair!r}")
        if sid in self._hosting.sessions:
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
        model = header.model
        with self.services.directory.lock(sid):
            if self.services.directory.has_log(sid):  # (a session never used has its header in the index)
                # a corrupt log is an error here, not a session that dies later; a model set after the
                # header is the one it goes on with (a turn taken up from the log included)
                model = check_log(self.services.directory, self.bus, sid, repair) or model
        try:
            overrides = dict(header.config or {})
            cfg = self.config.with_overrides(overrides)
            spec = self._hosting.spec(
                sid,
                model=model,
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
                mcp_servers=resumed_servers(header.mcp_servers, explicit, cfg),
            )
            continue_numbering(
                self.services.directory, self.bus, sid, transcript=self.config.persistence.transcript
            )
            plain = api_key is None and approval is None and not require_approval and tools is None
            plain = plain and spec.mcp is None
            plain = plain and (workspace is None or spec.workspace == workspace_of(header))
            plain = plain and (api_base is None or api_base == header.api_base)
            session = self._hosting.host(
                spec, line, plain=plain, builtin_tools=bool(header.tools), fresh=False
            )
            if header.parent_session_id:  # a sub-agent: its events carry its parent again
                self.delegations.adopt(sid, header.parent_session_id, header.parent_call_id or "")
            # (said before its actors start: a turn its agent takes up from the log comes after, design §3.12)
            self.bus.publish(
                ev.SessionStarted(
                    session_id=sid, model=spec.model, context_window=session.context_window, resumed=True
                )
            )
            session.ensure_running()
            return sid
        except BaseException:
            self.services.directory.take_over(sid)  # not hosted: nobody takes the tree check_log left
            raise

    async def aresume_session(self, session_id: str, **kwargs: Any) -> str:
        return await asyncio.to_thread(self.resume_session, session_id, **kwargs)

    def resumed_turn(self, session_id: str, timeout: float = 30.0) -> PromptHandle | None:
        refs = self._session(session_id).ensure_running()
        return refs.resumed.result(timeout)

    def interrupted_sessions(self) -> list[str]:
        self._require_started()
        directory = self.services.directory
        return self._machinery.turns.interrupted(self._hosting.sessions, directory.held, directory.exists)

    def _session(self, session_id: str) -> Session:
        """The hosted session ``session_id`` (made from its parked record on its first use)."""
        self._require_started()
        return self._hosting.session(session_id)

    def _hosted(self, session_id: str) -> Session | ParkedSession:
        """The hosted session or its parked record, as it is (read-only uses: its model, window, state)."""
        self._require_started()
        return self._hosting.hosted(session_id)

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeStopped("the runtime is not running; call start() or use it as a context manager")

    def list_sessions(self) -> list[SessionInfo]:
        self._require_started()
        self.services.writer.flush()  # the sessions started just now too (their headers on their way)
        infos = self.services.directory.list()
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    async def alist_sessions(self) -> list[SessionInfo]:
        return await asyncio.to_thread(self.list_sessions)

    def hosted_sessions(self) -> list[str]:
        return list(self._hosting.sessions.keys())

    def stop_session(self, session_id: str) -> None:
        for child in self.delegations.children(session_id):
            if child in self._hosting.sessions:
                self.stop_session(child)
        session = self._hosted(session_id)
        if isinstance(session, Session):  # (a parked one has nothing running)
            session.stop()
            if session.mcp is not None:
                session.mcp.wait_stopped()
        self._hosting.sessions.unregister(session_id)
        if session.fresh:  # never used: its header may still be on its way to the index
            self.services.writer.flush()
        self.bus.publish(ev.SessionStopped(session_id=session_id))

    async def astop_session(self, session_id: str) -> None:
        await asyncio.to_thread(self.stop_session, session_id)

    def delete_session(self, session_id: str) -> None:
        self._require_started()
        validate_session_id(session_id)
        for child in self.delegations.children(session_id):
            if child in self._hosting.sessions or self.services.directory.exists(child):
                self.delete_session(child)
        if session_id in self._hosting.sessions:
            self.stop_session(session_id)
        self.services.writer.flush()  # (its header may still be on its way to the index)
        if not self.services.directory.exists(session_id):
            raise SessionNotFound(f"no stored session {session_id!r}")
        self.services.directory.delete(session_id, append_index=self._machinery.append_index)
        self.delegations.forget(session_id)
        self.history.forget(session_id)
        # the id may be started again: as a new session, its events number from 1 in a new transcript
        self.bus.forget_session(session_id)
        if self._machinery.transcripts is not None:
            self._machinery.transcripts.forget(session_id)

    async def adelete_session(self, session_id: str) -> None:
        await asyncio.to_thread(self.delete_session, session_id)

    def hibernate(self, session_id: str) -> bool:
        session = self._hosted(session_id)
        parked = isinstance(session, Session) and session.hibernate_if_idle()
        if parked:
            for child in self.delegations.children(session_id):
                if child in self._hosting.sessions:
                    self.hibernate(child)
        return parked

    async def ahibernate(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.hibernate, session_id)

    def children(self, session_id: str) -> list[str]:
        self._require_started()
        known = self.delegations.children(session_id)
        stored = self.services.directory.children(session_id)  # from the index: no log is read
        return known + [c for c in stored if c not in known]

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
        if not isinstance(text, str):
            raise TypeError(f"prompt text must be a string, got {type(text).__name__}")
        if not text.strip() and not images:  # the one rule, for Python and HTTP alike
            raise ValueError("prompt text must not be empty (or send an image)")
        _require_unicode(text, "prompt text")
        session = self._session(session_id)
        self._writes.check(session_id, len(text))
        handle = PromptHandle(prompt_id or new_id())
        _delivery.tell(session, Prompt(user(text, *images), handle, steer=steer), self._writes)
        return handle

    def send(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        options: Any = None,
        prompt_id: str | None = None,
    ) -> PromptHandle:
        check_sendable(messages, options)
        session = self._session(session_id)
        self._writes.check(session_id, sum(len(m.text) for m in messages))
        handle = PromptHandle(prompt_id or new_id())
        *lead, last = messages
        _delivery.tell(session, Prompt(last, handle, lead=tuple(lead), options=options), self._writes)
        return handle

    def abort(self, session_id: str) -> Handle[bool]:
        session = self._session(session_id)
        handle: Handle[bool] = Handle(new_id())
        if not session.running:
            handle.set_result(False)
            return handle
        _delivery.tell(session, Abort(handle), self._writes)
        return handle

    def compact(
        self, session_id: str, keep_recent_tokens: int | None = None, instructions: str | None = None
    ) -> Handle[CompactionResult]:
        if keep_recent_tokens is not None and keep_recent_tokens < 0:
            raise ValueError("keep_recent_tokens must be >= 0")
        session = self._session(session_id)
        handle: Handle[CompactionResult] = Handle(new_id())
        _delivery.tell(
            session,
            Compact(
                trigger="manual",
                keep_recent_tokens=keep_recent_tokens,
                instructions=instructions,
                handle=handle,
            ),
            self._writes,
        )
        return handle

    def approve(
        self, session_id: str, call_id: str, approved: bool = True, reason: str | None = None
    ) -> bool:
        self._require_started()
        return self.services.approvals.answer(session_id, call_id, approved, reason)

    # -- queries --------------------------------------------------------------------------------------
    def context_stats(self, session_id: str, timeout: float = 30.0) -> ContextStats:
        return _delivery.ask(self._session(session_id), GetContextStats(), timeout, self._writes)

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
        page_bounds(0, offset, limit)  # a bad offset or limit is refused before anything is asked
        session = self._session(session_id)
        if view == "model":
            found = _delivery.ask(session, GetContext(), timeout, self._writes).messages
            lo, hi = page_bounds(len(found), offset, limit)
            return list(found[lo:hi])
        answer = _delivery.ask(session, GetMessages(), timeout, self._writes)
        lo, hi = page_bounds(answer.total, offset, limit)
        before = answer.before
        recent = list(answer.messages[max(lo - before, 0) : max(hi - before, 0)])
        if lo >= before:
            return recent
        path = self.services.directory.log_path(session_id)
        older = self.history.read(
            session_id,
            path,
            history=answer.history,
            leaf_id=answer.leaf_id,
            before=before,
            lo=lo,
            hi=hi,
            settle=lambda: self._settle(path, timeout),
        )
        return older + recent

    def message_count(self, session_id: str, *, view: str = "user", timeout: float = 30.0) -> int:
        if view not in ("user", "model"):
            raise ValueError("view must be 'user' or 'model'")
        session = self._session(session_id)
        if view == "model":
            return len(_delivery.ask(session, GetContext(), timeout, self._writes).messages)
        return _delivery.ask(session, GetMessages(), timeout, self._writes).total

    async def amessages(
        self, session_id: str, *, view: str = "user", offset: int = 0, limit: int | None = None
    ) -> list[Message]:
        return await asyncio.to_thread(self.messages, session_id, view=view, offset=offset, limit=limit)

    def _settle(self, path: os.PathLike[str], timeout: float) -> None:
        """Wait until every write queued for the log at ``path`` is done (so it can be read back)."""
        done = threading.Event()
        self.services.writer.call(path, lambda _path: None, lambda _error: done.set())
        if not done.wait(timeout):
            raise TimeoutError(f"the log {path} was not written within {timeout}s")

    def usage(
        self, session_id: str, timeout: float = 30.0, *, include_children: bool = False
    ) -> Usage | UsageReport:
        own = _delivery.ask(self._session(session_id), GetTotals(), timeout, self._writes)
        if not include_children:
            return own
        children = {}
        for child in self.children(session_id):
            if child not in self._hosting.sessions:
                self.resume_session(child)
            report = self.usage(child, timeout, include_children=True)
            assert isinstance(report, UsageReport)
            children[child] = report.total
        return UsageReport.of(own, children)

    async def ausage(self, session_id: str) -> Usage | UsageReport:
        return await asyncio.to_thread(self.usage, session_id)

    def set_model(self, session_id: str, model: str, timeout: float = 30.0) -> int:
        session = self._session(session_id)
        spec = session.spec
        window = self._hosting.window(validate_model_name(model), spec.config, spec.api_base, spec.api_key)
        counter = self._hosting.counter(
            model, spec.config, spec.api_base
        )  # the new model's tokenizer, loaded here
        # the session hands it to each of its actors
        _delivery.tell(session, SetModel(model, window, counter), self._writes)
        self.bus.publish(ev.ModelChanged(session_id=session_id, model=model, context_window=window))
        return window

    async def aset_model(self, session_id: str, model: str) -> int:
        return await asyncio.to_thread(self.set_model, session_id, model)

    def branch(self, session_id: str, leaf_id: str | None, timeout: float = 30.0) -> None:
        stored = _delivery.ask(self._session(session_id), Branch(leaf_id), timeout, self._writes)
        if stored.error is not None:
            raise OSError(f"could not record the branch: {stored.error}")
        self.bus.publish(ev.Branched(session_id=session_id, leaf_id=leaf_id))

    async def abranch(self, session_id: str, leaf_id: str | None) -> None:
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
        bulk: bool = True,
    ) -> Subscription:
        self._require_started()
        if types is not None:
            types = set(types)
            unknown = types - ev.EVENT_TYPES
            if unknown:
                raise ValueError(f"unknown event types: {', '.join(sorted(unknown))}")
        return self.bus.subscribe(
            sessions,
            types,
            callback=callback,
            queue_size=queue_size,
            include_children=include_children,
            bulk=bulk,
        )


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


def _require_unicode(text: str, what: str) -> None:
    """Refuse text that cannot be stored as UTF-8 (a lone surrogate, e.g. from ``surrogateescape``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} is not valid Unicode: a lone surrogate at position {exc.start} "
            "(decode bytes with errors='replace')"
        ) from None
