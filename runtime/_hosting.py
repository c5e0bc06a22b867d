"""How a :class:`~runtime.host.Runtime` hosts its sessions (design §1.3, §8).

Every hosted session is in one :class:`~runtime.registry.SessionRegistry`: a
:class:`~actors.session.Session`, or, for a plain session never used yet, a
:class:`~actors.session.ParkedSession` (its header line) swapped for its Session on first use
(:meth:`Hosting.session`); :meth:`Hosting.new` decides which a new session is. A session's
:class:`~actors.wiring.SessionSpec` is built here from what ``start_session`` or ``resume_session`` was
given (:meth:`Hosting.spec`), or, when a parked or hibernated session wakes, from its header
(:meth:`Hosting.wake`). What many sessions share is worked out once: a
model's context window, its token counter, a session's first model state, a plain session's tool names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from msgspec.structs import replace

from actors.protocol import SetModel
from actors.session import ParkedSession, Session, header_for
from actors.wiring import SessionSpec
from runtime import events as ev
from runtime.config import AgentProfile, Config
from runtime.errors import SessionNotFound
from runtime.ids import validate_session_id
from runtime.models import ModelInfo, model_info, validate_model_name
from runtime.registry import SessionRegistry
from runtime.store.entries import Header, decode_entry, encode_entry, new_header, scrub_secrets
from runtime.subagents import DELEGATION_TOOL, parse_profiles
from runtime.tokens import TokenCounter
from runtime.tools.builtin import builtin_registry
from runtime.tools.mcp import McpServers, parse_servers
from runtime.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from runtime._machinery import Machinery
    from runtime.api import ToolsArg
    from runtime.subagents import Delegations

    class _Runtime(Protocol):
        """What hosting reads of the :class:`~runtime.host.Runtime` it serves (when it uses them)."""

        @property
        def config(self) -> Config: ...

        @property
        def approval(self) -> Callable[[str, Any], bool | str] | None: ...

        @property
        def agents(self) -> dict[str, AgentProfile]: ...

        @property
        def delegations(self) -> Delegations: ...


__all__ = ["Hosting", "workspace_of"]


class Hosting:
    """The sessions of one runtime: their registry (replaced by each start, :meth:`attach`), the specs they
    are made from, and the values they share. It reads the runtime's ``config``, ``agents``, ``approval``
    and ``delegations`` when it uses them."""

    _machinery: Machinery  # the running machinery (set by attach())

    def __init__(self, runtime: _Runtime) -> None:
        self._rt = runtime
        self._lock = threading.Lock()
        # replaced by each start(); a plain session never used is a ParkedSession until its first use
        self.sessions: SessionRegistry[Session | ParkedSession] = SessionRegistry()
        self._counters: dict[
            tuple[str, Any] | str, TokenCounter
        ] = {}  # by (model, tokens config); by model: defaults
        self._windows: dict[str, ModelInfo] = {}
        self._names: dict[tuple[str | None, bool, bool], list[str]] = {}
        self._states: dict[tuple[str, int], SetModel] = {}
        # One bound method for every session (each ``self.wake`` would be a new object per session, one the
        # cycle collector tracks for as long as the session is hosted, idle or not)
        self._wake = self.wake

    def attach(self, machinery: Machinery) -> None:
        """Host the sessions of a new start on ``machinery``, none yet."""
        self._machinery = machinery
        self.sessions = SessionRegistry()

    # -- the hosted sessions --------------------------------------------------------------------------
    def session(self, session_id: str) -> Session:
        """The hosted session ``session_id`` (made from its parked record on its first use)."""
        entry = self.hosted(session_id)
        if type(entry) is ParkedSession:
            made = Session(
                None,
                self._machinery.services,
                entry.state,
                parent=self._machinery.root,
                recipe=entry.recipe,
                wake=self._wake,
                session_id=session_id,
                plain=True,
                builtin_tools=entry.builtin_tools,
                fresh=True,
            )
            now = self.sessions.swap(session_id, entry, made)  # (another thread may have made it first)
            if now is None:
                raise SessionNotFound(f"no running session {session_id!r} (resume_session it first)")
            entry = now
        assert isinstance(entry, Session)
        return entry

    def hosted(self, session_id: str) -> Session | ParkedSession:
        """The hosted session or its parked record, as it is (read-only uses: its model, window, state)."""
        entry = self.sessions.get(session_id)
        if entry is None:
            validate_session_id(session_id)
            raise SessionNotFound(f"no running session {session_id!r} (resume_session it first)")
        return entry

    def new(
        self,
        sid: str,
        *,
        model: str,
        system_prompt: str,
        tools: ToolsArg,
        workspace: str | os.PathLike[str] | None,
        cfg: Config,
        overrides: dict[str, Any],
        api_base: str | None,
        api_key: str | None,
        approval: Callable[[str, Any], bool | str] | None,
        require_approval: bool,
        profiles: dict[str, Any],
        parent: tuple[str, str, int] | None,
        mcp_servers: Any,
    ) -> tuple[Session | ParkedSession, Header, bytes]:
        """Host a new session (``start_session``'s options); return it, its header and its header line.

        The header goes to the sessions index, and the actors start on first use: a session that is never
        used costs its header line in memory and in the index, and no file of its own (issue 32). A plain
        session (nothing a header cannot hold) keeps only that line until it is used."""
        plain = (
            api_key is None
            and approval is None
            and not require_approval
            and parent is None
            and (tools is None or (isinstance(tools, str) and tools == "builtin"))
            and scrub_secrets(overrides) == overrides
            and not mcp_servers  # (MCP servers are objects of the spec's, started with the session)
            and not cfg.mcp.servers
        )
        if plain:
            parked, header = self._host_plain(
                sid, model, system_prompt, tools, workspace, cfg, overrides, api_base, profiles
            )
            return parked, header, parked.recipe
        spec = self.spec(
            sid,
            model=model,
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
            parent=parent,
            mcp_servers=parse_servers(mcp_servers),
        )
        header = header_for(spec)
        line = encode_entry(header)
        return self.host(spec, line, plain=False, builtin_tools=tools is not None), header, line

    def host(
        self, spec: SessionSpec, recipe: bytes, *, plain: bool, builtin_tools: bool, fresh: bool | None = None
    ) -> Session:
        """Host a session made from ``spec`` (its header line: ``recipe``)."""
        session = Session(
            spec,
            self._machinery.services,
            self.model_state(spec.model, spec.config, spec.api_base, spec.api_key),
            parent=self._machinery.root,
            recipe=recipe,
            wake=self._wake,
            plain=plain,
            builtin_tools=builtin_tools,
            fresh=fresh,
        )
        self.sessions.register(spec.session_id, session)
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
        its :class:`Session` is made on first use (:meth:`session`)."""
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
        session = ParkedSession(
            encode_entry(header), self.model_state(model, cfg, api_base), tools is not None
        )
        self.sessions.register(sid, session)
        return session, header

    def left_out(self, session_id: str) -> list[ev.Event]:
        """The events the transcript left out of a session started here while it had nothing to keep: its
        ``session_started`` (seq 1), rebuilt from its header as the bus stamped it (a resumed session's
        is kept: it opens the transcript itself)."""
        entry = self.sessions.get(session_id)
        if entry is None:
            return []
        header = decode_entry(entry.recipe)
        if not isinstance(header, Header):  # pragma: no cover - a recipe is always a header line
            return []
        config = self._rt.config
        cfg = config.with_overrides(dict(header.config)) if header.config else config
        started = ev.SessionStarted(
            session_id=session_id,
            seq=1,
            ts=header.created_at,
            model=header.model,
            context_window=self.window(header.model, cfg, header.api_base),
        )
        parent = self._machinery.bus.parent_of(session_id)
        if parent is not None:
            started = replace(started, parent_session_id=parent[0], parent_call_id=parent[1])
        return [started]

    # -- specs ----------------------------------------------------------------------------------------
    def spec(self, sid: str, *, tools: ToolsArg, workspace: Any, cfg: Config, **kw: Any) -> SessionSpec:
        """The spec of a session started or resumed with these options (``kw``: the other fields of
        :class:`SessionSpec`, and ``parent`` and ``agents``)."""
        root = _workspace(workspace)
        kw["approval"] = kw.get("approval") or self._rt.approval
        parent = kw.pop("parent", None)
        agents = kw.pop("agents", None) or {}
        depth = parent[2] if parent is not None else 0
        registry = self._rt.delegations.equip(_registry(tools, cfg), sid, agents, depth, cfg)
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
            machinery = self._machinery
            spec.mcp = McpServers(
                sid,
                servers,
                cfg.mcp,
                io=machinery.io,
                publish=machinery.bus.publish,
                base=registry,
                workspace=root,
                logs_dir=machinery.services.directory.spill_dir(sid),
                hub=machinery.services.mcp,
                cpus=machinery.process_cpus,
            )
        return spec

    def wake(self, session: Session) -> SessionSpec:
        """The spec of a parked session, rebuilt from its header (what ``start_session`` or
        ``resume_session`` made of the same header, without the checks done then)."""
        header = session.header()
        sid = header.session_id
        overrides = dict(header.config)
        cfg = self._rt.config.with_overrides(overrides)
        parent = (
            (header.parent_session_id, header.parent_call_id or "", header.depth)
            if header.parent_session_id
            else None
        )
        agents = (
            parse_profiles(header.agents) if parent else {**self._rt.agents, **parse_profiles(header.agents)}
        )
        tools = _registry("builtin" if session.builtin_tools else None, cfg)
        registry = self._rt.delegations.equip(tools, sid, agents, header.depth, cfg)
        return SessionSpec(
            session_id=sid,
            model=header.model,
            system_prompt=header.system_prompt,
            config=cfg,
            tools=registry,
            workspace=workspace_of(header),
            api_base=header.api_base,
            approval=self._rt.approval,
            overrides=overrides,
            resume=not session.fresh,
            agents=agents,
            parent=parent,
        )

    # -- what sessions share --------------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        """Refuse a model name that is not valid (a model in use was checked already)."""
        if model not in self._windows:
            validate_model_name(model)

    def model_state(
        self, model: str, cfg: Config, api_base: str | None = None, api_key: str | None = None
    ) -> SetModel:
        """A session's first model, window and counter: one value shared by the sessions on the runtime's
        own settings and endpoint (a million idle sessions hold a reference each, not a copy)."""
        window = self.window(model, cfg, api_base, api_key)
        if (
            cfg is not self._rt.config
            or (cfg.tokens.apply_calibration and not cfg.tokens.exact)
            or cfg.tokens.server_tokenize
        ):
            return SetModel(model, window, self.counter(model, cfg, api_base))
        state = self._states.get((model, window))
        if state is None:
            state = self._states[(model, window)] = SetModel(model, window, self.counter(model, cfg))
        return state

    def _tool_names(self, tools: str | None, cfg: Config, delegates: bool) -> list[str]:
        """The names of a plain session's tools (as its header lists them), the same for every session
        of the same choice: worked out once."""
        key = (tools, cfg.agent.shell_enabled, delegates and cfg.subagents.max_depth > 0)
        names = self._names.get(key)
        if names is None:
            names = list(_registry(tools, cfg).names)
            if key[2]:
                names = [n for n in names if n != DELEGATION_TOOL] + [DELEGATION_TOOL]
            self._names[key] = names
        return names

    def window(self, model: str, cfg: Config, api_base: str | None = None, api_key: str | None = None) -> int:
        """The model's context window (cached for sessions on the runtime's own model settings); for a model
        nobody's table knows, at an ``api_base``, what its server said or an overflow there stated (design
        §4.5: asked once per endpoint and model, for at most ``models.discovery_timeout`` seconds)."""
        if cfg.models is not self._rt.config.models:  # per-session overrides: look it up each time
            info = model_info(model, cfg.models)
        else:
            cached = self._windows.get(model)
            info = cached if cached is not None else model_info(model, cfg.models)
            self._windows[model] = info
        if info.source != "fallback":
            return info.context_window
        from runtime.gateway import endpoint_of

        api_base = endpoint_of(model, api_base)
        if api_base is None:
            return info.context_window
        book = self._machinery.services.gateway.windows
        found = book.get(api_base, model)
        if found is None and cfg.models.discover_windows:
            found = book.discover(api_base, model, timeout=cfg.models.discovery_timeout, api_key=api_key)
        return found.window if found is not None else info.context_window

    def counter(self, model: str, cfg: Config, api_base: str | None = None) -> TokenCounter:
        """The model's token counter under ``cfg``'s token settings: one per model and settings, shared by
        the sessions that use them (a calibrated one is its session's alone; one that asks the server to
        count, ``tokens.server_tokenize``, is shared by the sessions on that server)."""
        if cfg.tokens.apply_calibration and not cfg.tokens.exact:
            return TokenCounter(model, cfg.tokens)  # calibrated by its session alone: never shared
        if cfg.tokens.server_tokenize and api_base is not None:
            from runtime.gateway import ServerTokenizer

            with self._lock:
                counter = self._counters.get((model, (cfg.tokens, api_base)))
                if counter is None:
                    counter = TokenCounter(model, cfg.tokens, tokenize=ServerTokenizer(api_base))
                    self._counters[(model, (cfg.tokens, api_base))] = counter
                return counter
        own = self._rt.config.tokens
        if cfg.tokens is own:  # the runtime's own settings (most sessions): no key to hash
            counter = self._counters.get(model)
            if counter is not None:
                return counter
        key = (model, cfg.tokens)  # every token setting: a session's own must not meet another's counter
        with self._lock:
            counter = self._counters.get(key)
            if counter is None:
                counter = self._counters[key] = TokenCounter(model, cfg.tokens)
            if cfg.tokens is own:
                self._counters[model] = counter
            return counter


def workspace_of(header: Any) -> Path | None:
    """The workspace a session's header records (None: none)."""
    return Path(header.workspace) if header.workspace else None


def _workspace(workspace: str | os.PathLike[str] | None) -> Path | None:
    root = Path(workspace).expanduser().resolve() if workspace is not None else None
    if root is not None and not root.is_dir():
        raise ValueError(f"workspace {root} is not a directory")
    return root


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
