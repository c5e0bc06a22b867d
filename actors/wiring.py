"""What a session's actors are built from: its spec, the runtime's shared services, and sibling refs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka

from runtime.config import AgentProfile, Config, McpServerConfig

if TYPE_CHECKING:
    from actors.agent import Handover
    from runtime.actor import Dispatcher
    from runtime.approval import ApprovalBroker, ApprovalCallable
    from runtime.bus import EventBus
    from runtime.gateway import Gateway
    from runtime.observability.tracing import Tracing
    from runtime.store.sessions import SessionDirectory
    from runtime.store.writer import LogWriter
    from runtime.tools.executor import ToolExecutor
    from runtime.tools.mcp import McpHub, McpServers
    from runtime.tools.registry import ToolRegistry


@dataclass
class SessionSpec:
    """Everything that defines one session. ``api_key`` lives only in memory: it is never stored."""

    session_id: str
    model: str
    system_prompt: str
    config: Config
    tools: ToolRegistry
    workspace: Path | None = None
    api_base: str | None = None
    api_key: str | None = field(default=None, repr=False)
    approval: ApprovalCallable | None = None
    require_approval: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    resume: bool = False
    agents: dict[str, AgentProfile] = field(default_factory=dict)  # sub-agent profiles it may delegate to
    parent: tuple[str, str, int] | None = None  # a sub-agent's parent session, call id and depth
    mcp_servers: dict[str, McpServerConfig] = field(default_factory=dict)  # its own (stored in its header)
    mcp: McpServers | None = None  # its MCP servers, its own and the runtime's (SPEC 3.9)


@dataclass
class Services:
    """The runtime-wide machinery every session shares."""

    dispatcher: Dispatcher
    bus: EventBus
    gateway: Gateway
    executor: ToolExecutor
    writer: LogWriter
    directory: SessionDirectory
    approvals: ApprovalBroker
    tracing: Tracing | None = None  # OpenTelemetry spans (SPEC 7.5); None: the runtime does not trace
    mcp: McpHub | None = None


@dataclass
class SessionRefs:
    """The current refs of a session's actors; updated when the supervisor restarts one."""

    store: pykka.ActorRef[Any] | None = None
    usage: pykka.ActorRef[Any] | None = None
    overflow: pykka.ActorRef[Any] | None = None
    compactor: pykka.ActorRef[Any] | None = None
    agent: pykka.ActorRef[Any] | None = None
    handover: Handover | None = None  # a crashed agent's run, for its successor to take up

    def require(self, name: str) -> pykka.ActorRef[Any]:
        ref = getattr(self, name)
        if ref is None:
            raise pykka.ActorDeadError(f"the session's {name} actor is not running")
        return ref
