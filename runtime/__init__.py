"""agentcell: an actor-based concurrent runtime for LLM agent sessions.

Everything a user of the runtime needs is importable from here (``__all__``; the README's "Public API"
section lists it, and what each call raises). Importing this package is cheap and offline-safe: it sets
``LITELLM_LOCAL_MODEL_COST_MAP`` and ``TIKTOKEN_CACHE_DIR`` (unless you set them), never imports litellm,
and imports the runtime itself (actors, the gateway, tools, events) only when one of those names is first
used.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from runtime._offline import configure_offline_environment

configure_offline_environment()

# Every module logs under one root, "agentcell.<area>" (agentcell.runtime, .agent, .gateway, .store, ...):
# configuring "agentcell" configures them all. Without configuration nothing is printed (pykka's way).
logging.getLogger("agentcell").addHandler(logging.NullHandler())

from runtime.config import (  # noqa: E402
    AgentConfig,
    AgentProfile,
    BusConfig,
    CompactionConfig,
    Config,
    GatewayConfig,
    McpConfig,
    McpServerConfig,
    ModelsConfig,
    PersistenceConfig,
    RetryConfig,
    RuntimeConfig,
    ServerConfig,
    SubagentsConfig,
    TelemetryConfig,
    TokenConfig,
    ToolOutputConfig,
    load_config,
)
from runtime.errors import (  # noqa: E402
    AddressRefused,
    AgentcellError,
    AlreadyRegistered,
    ClusterError,
    ClusterUnavailable,
    ConfigError,
    CorruptLogError,
    DispatcherClosed,
    InvalidSessionId,
    LogWriteError,
    RestartIntensityExceeded,
    RuntimeStateError,
    RuntimeStopped,
    SessionError,
    SessionLockedError,
    SessionNotFound,
    ShardDied,
    StoreError,
    ToolError,
    TransportError,
    WorkspaceError,
    WriterClosedError,
)
from runtime.ids import validate_session_id  # noqa: E402

__version__ = "0.1.0"

if TYPE_CHECKING:
    from runtime.bus import (
        Subscription,
    )
    from runtime.context.estimate import (
        ContextStats,
    )
    from runtime.events import (
        EVENT_TYPES,
        ActorRestarted,
        AgentAbort,
        AgentEnd,
        AgentRecovered,
        AgentStart,
        ApprovalRequest,
        ApprovalResponse,
        Branched,
        Calibration,
        CompactionEnd,
        CompactionFailed,
        CompactionStart,
        ErrorOccurred,
        Event,
        LogRecovered,
        McpServerFailed,
        McpServerStarted,
        MessageAppended,
        MessageQueued,
        ModelChanged,
        PersistenceFailed,
        ProviderRetry,
        ReasoningDelta,
        RequestStart,
        SessionDead,
        SessionHibernated,
        SessionStarted,
        SessionStopped,
        StatusUpdate,
        StreamStalled,
        SubscriberLagged,
        TextDelta,
        ToolCallDelta,
        ToolExecutionEnd,
        ToolExecutionStart,
        ToolOutput,
        ToolOutputsCleared,
        ToolResultsArchived,
        TurnEnd,
        UsageOverflow,
        UsageUpdate,
        WindowLearned,
        decode_event,
        encode_event,
    )
    from runtime.handles import (
        CompactionResult,
        Handle,
        PromptHandle,
        TurnResult,
    )
    from runtime.host import (
        Runtime,
    )
    from runtime.messages import (
        ImagePart,
        Message,
        ReasoningPart,
        TextPart,
        ToolCallPart,
        Usage,
    )
    from runtime.store.sessions import (
        SessionInfo,
    )
    from runtime.subagents import (
        UsageReport,
    )
    from runtime.tools import (
        Tool,
        ToolContext,
        ToolRegistry,
        tool,
    )

# Imported on first use: name -> the module that defines it.
_LAZY: dict[str, str] = {
    "Runtime": "runtime.host",
    "CompactionResult": "runtime.handles",
    "Handle": "runtime.handles",
    "PromptHandle": "runtime.handles",
    "TurnResult": "runtime.handles",
    "Subscription": "runtime.bus",
    "ContextStats": "runtime.context.estimate",
    "SessionInfo": "runtime.store.sessions",
    "UsageReport": "runtime.subagents",
    "ImagePart": "runtime.messages",
    "Message": "runtime.messages",
    "ReasoningPart": "runtime.messages",
    "TextPart": "runtime.messages",
    "ToolCallPart": "runtime.messages",
    "Usage": "runtime.messages",
    "Tool": "runtime.tools",
    "ToolContext": "runtime.tools",
    "ToolRegistry": "runtime.tools",
    "tool": "runtime.tools",
    "EVENT_TYPES": "runtime.events",
    "Event": "runtime.events",
    "decode_event": "runtime.events",
    "encode_event": "runtime.events",
    "ActorRestarted": "runtime.events",
    "AgentAbort": "runtime.events",
    "AgentEnd": "runtime.events",
    "AgentRecovered": "runtime.events",
    "AgentStart": "runtime.events",
    "ApprovalRequest": "runtime.events",
    "ApprovalResponse": "runtime.events",
    "Branched": "runtime.events",
    "Calibration": "runtime.events",
    "CompactionEnd": "runtime.events",
    "CompactionFailed": "runtime.events",
    "CompactionStart": "runtime.events",
    "ErrorOccurred": "runtime.events",
    "LogRecovered": "runtime.events",
    "McpServerFailed": "runtime.events",
    "McpServerStarted": "runtime.events",
    "MessageAppended": "runtime.events",
    "MessageQueued": "runtime.events",
    "ModelChanged": "runtime.events",
    "PersistenceFailed": "runtime.events",
    "ProviderRetry": "runtime.events",
    "ReasoningDelta": "runtime.events",
    "RequestStart": "runtime.events",
    "SessionDead": "runtime.events",
    "SessionHibernated": "runtime.events",
    "SessionStarted": "runtime.events",
    "SessionStopped": "runtime.events",
    "StatusUpdate": "runtime.events",
    "StreamStalled": "runtime.events",
    "SubscriberLagged": "runtime.events",
    "TextDelta": "runtime.events",
    "ToolCallDelta": "runtime.events",
    "ToolExecutionEnd": "runtime.events",
    "ToolExecutionStart": "runtime.events",
    "ToolOutput": "runtime.events",
    "ToolOutputsCleared": "runtime.events",
    "ToolResultsArchived": "runtime.events",
    "TurnEnd": "runtime.events",
    "UsageOverflow": "runtime.events",
    "UsageUpdate": "runtime.events",
    "WindowLearned": "runtime.events",
}

__all__ = [
    "EVENT_TYPES",
    "ActorRestarted",
    "AddressRefused",
    "AgentAbort",
    "AgentConfig",
    "AgentEnd",
    "AgentProfile",
    "AgentRecovered",
    "AgentStart",
    "AgentcellError",
    "AlreadyRegistered",
    "ApprovalRequest",
    "ApprovalResponse",
    "Branched",
    "BusConfig",
    "Calibration",
    "ClusterError",
    "ClusterUnavailable",
    "CompactionConfig",
    "CompactionEnd",
    "CompactionFailed",
    "CompactionResult",
    "CompactionStart",
    "Config",
    "ConfigError",
    "ContextStats",
    "CorruptLogError",
    "DispatcherClosed",
    "ErrorOccurred",
    "Event",
    "GatewayConfig",
    "Handle",
    "ImagePart",
    "InvalidSessionId",
    "LogRecovered",
    "LogWriteError",
    "McpConfig",
    "McpServerConfig",
    "McpServerFailed",
    "McpServerStarted",
    "Message",
    "MessageAppended",
    "MessageQueued",
    "ModelChanged",
    "ModelsConfig",
    "PersistenceConfig",
    "PersistenceFailed",
    "PromptHandle",
    "ProviderRetry",
    "ReasoningDelta",
    "ReasoningPart",
    "RequestStart",
    "RestartIntensityExceeded",
    "RetryConfig",
    "Runtime",
    "RuntimeConfig",
    "RuntimeStateError",
    "RuntimeStopped",
    "ServerConfig",
    "SessionDead",
    "SessionError",
    "SessionHibernated",
    "SessionInfo",
    "SessionLockedError",
    "SessionNotFound",
    "SessionStarted",
    "SessionStopped",
    "ShardDied",
    "StatusUpdate",
    "StoreError",
    "StreamStalled",
    "SubagentsConfig",
    "SubscriberLagged",
    "Subscription",
    "TelemetryConfig",
    "TextDelta",
    "TextPart",
    "TokenConfig",
    "Tool",
    "ToolCallDelta",
    "ToolCallPart",
    "ToolContext",
    "ToolError",
    "ToolExecutionEnd",
    "ToolExecutionStart",
    "ToolOutput",
    "ToolOutputConfig",
    "ToolOutputsCleared",
    "ToolRegistry",
    "ToolResultsArchived",
    "TransportError",
    "TurnEnd",
    "TurnResult",
    "Usage",
    "UsageOverflow",
    "UsageReport",
    "UsageUpdate",
    "WindowLearned",
    "WorkspaceError",
    "WriterClosedError",
    "__version__",
    "decode_event",
    "encode_event",
    "load_config",
    "tool",
    "validate_session_id",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
