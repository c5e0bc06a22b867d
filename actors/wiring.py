"""What a session's actors are built from: its spec, the runtime's shared services, and sibling refs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pykka import ActorDeadError

from runtime.config import AgentProfile, Config, McpServerConfig
from runtime.handles import Handle, PromptHandle

if TYPE_CHECKING:
    from actors.protocol import (
        AgentMessage,
        CompactorMessage,
        OverflowMessage,
        SetModel,
        StoreMessage,
        UsageMessage,
    )
    from runtime.actor import Dispatcher, Ref
    from runtime.approval import ApprovalBroker, ApprovalCallable
    from runtime.bus import EventBus
    from runtime.gateway import Gateway
    from runtime.observability.content import ContentTap
    from runtime.store.sessions import SessionDirectory
    from runtime.store.turns import TurnJournal
    from runtime.store.writer import LogWriter
    from runtime.tools.executor import ToolExecutor
    from runtime.tools.mcp import McpHub, McpServers
    from runtime.tools.registry import ToolRegistry
    from runtime.turn.state import Handover

M = TypeVar("M")


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
    mcp: McpServers | None = None  # its MCP servers, its own and the runtime's (design §3.9)


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
    content: ContentTap | None = None  # what spans record of prompts and answers (telemetry.record_content)
    mcp: McpHub | None = None
    turns: TurnJournal | None = None  # which sessions have a turn under way (design §3.12)
    awake: set[Any] = field(default_factory=set)  # the sessions whose actors run (what hibernation looks at)


@dataclass
class SessionRefs:
    """The current refs of a session's actors, each typed by the messages its actor takes (design §1.2);
    the session updates them when its supervisor restarts one.

    ``store_ref`` .. ``agent_ref`` are None while that actor is not running. The properties ``store`` ..
    ``agent`` are what the actors use: the running actor's ref, or :class:`pykka.ActorDeadError`.
    """

    store_ref: Ref[StoreMessage] | None = None
    usage_ref: Ref[UsageMessage] | None = None
    overflow_ref: Ref[OverflowMessage] | None = None
    compactor_ref: Ref[CompactorMessage] | None = None
    agent_ref: Ref[AgentMessage] | None = None
    handover: Handover | None = None  # a crashed agent's turn, for its successor to take up
    learned_window: int | None = None  # the window the provider stated (design §6.3): restarts start with it
    # The session's learned server count ÷ ours and the model it is of (design §4.5), as its agent last learned
    # it: a restarted agent or compactor starts with it.
    count_ratio: tuple[str, float] | None = None
    # The turn its agent took up from the log when it started (design §3.12): its handle, or None.
    resumed: Handle[PromptHandle | None] = field(default_factory=Handle)

    @property
    def store(self) -> Ref[StoreMessage]:
        return _running(self.store_ref, "store")

    @property
    def usage(self) -> Ref[UsageMessage]:
        return _running(self.usage_ref, "usage tracker")

    @property
    def overflow(self) -> Ref[OverflowMessage]:
        return _running(self.overflow_ref, "overflow detector")

    @property
    def compactor(self) -> Ref[CompactorMessage]:
        return _running(self.compactor_ref, "compactor")

    @property
    def agent(self) -> Ref[AgentMessage]:
        return _running(self.agent_ref, "agent")

    def running(self) -> list[Ref[SetModel]]:
        """The refs of the actors running now, in start order (store first, agent last): every one takes a
        :class:`~actors.protocol.SetModel`."""
        refs: tuple[Ref[SetModel] | None, ...] = (
            self.store_ref,
            self.usage_ref,
            self.overflow_ref,
            self.compactor_ref,
            self.agent_ref,
        )
        return [ref for ref in refs if ref is not None]


def _running(ref: Ref[M] | None, what: str) -> Ref[M]:
    if ref is None:
        raise ActorDeadError(f"the session's {what} actor is not running")
    return ref
