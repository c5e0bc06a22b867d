# ruff: noqa: I001  (the imports keep one name a line, each ``X as X``: an explicit re-export)
"""agentcell: an actor-based concurrent runtime for LLM agent sessions.

Everything a user of the runtime needs is importable from here (``__all__``; the README's "Public API"
section lists it, and what each call raises). Importing this package is cheap and offline-safe: it sets
``LITELLM_LOCAL_MODEL_COST_MAP`` and ``TIKTOKEN_CACHE_DIR`` (unless you set them), never imports litellm,
and imports the runtime itself (actors, the gateway, tools, events) only when one of those names is first
used.

Each exported name is listed once, as an import below: the cheap ones (configuration, errors) are imported at
once, the others under ``TYPE_CHECKING`` (what type checkers read; ``X as X`` marks each a re-export).
``__all__`` and the lazy look-up are read from those imports on first need (imports from private modules,
``runtime._x``, are not exports; a star import exports all its module lists: ``runtime.events``' events,
each declared once there).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from runtime._layout import require_sibling
from runtime._offline import configure_offline_environment

require_sibling("actors")  # a user's own actors.py would hide it: say so, not "'actors' is not a package"
configure_offline_environment()

# Every module logs under one root, "agentcell.<area>" (agentcell.runtime, .agent, .gateway, .store, ...):
# configuring "agentcell" configures them all. Without configuration nothing is printed (pykka's way).
logging.getLogger("agentcell").addHandler(logging.NullHandler())

from runtime.config import (  # noqa: E402
    AgentConfig as AgentConfig,
    AgentProfile as AgentProfile,
    BusConfig as BusConfig,
    CompactionConfig as CompactionConfig,
    Config as Config,
    GatewayConfig as GatewayConfig,
    McpConfig as McpConfig,
    McpServerConfig as McpServerConfig,
    ModelsConfig as ModelsConfig,
    PersistenceConfig as PersistenceConfig,
    RetryConfig as RetryConfig,
    RuntimeConfig as RuntimeConfig,
    ServerConfig as ServerConfig,
    SubagentsConfig as SubagentsConfig,
    TelemetryConfig as TelemetryConfig,
    TokenConfig as TokenConfig,
    ToolOutputConfig as ToolOutputConfig,
    load_config as load_config,
)
from runtime.errors import (  # noqa: E402
    AddressRefused as AddressRefused,
    AgentcellError as AgentcellError,
    AlreadyRegistered as AlreadyRegistered,
    ClusterError as ClusterError,
    ClusterUnavailable as ClusterUnavailable,
    ConfigError as ConfigError,
    CorruptLogError as CorruptLogError,
    DispatcherClosed as DispatcherClosed,
    InvalidSessionId as InvalidSessionId,
    LogWriteError as LogWriteError,
    RestartIntensityExceeded as RestartIntensityExceeded,
    RuntimeStateError as RuntimeStateError,
    RuntimeStopped as RuntimeStopped,
    SessionError as SessionError,
    SessionLockedError as SessionLockedError,
    SessionNotFound as SessionNotFound,
    ShardDied as ShardDied,
    StoreError as StoreError,
    ToolError as ToolError,
    TransportError as TransportError,
    WorkspaceError as WorkspaceError,
    WriterClosedError as WriterClosedError,
)
from runtime.ids import validate_session_id as validate_session_id  # noqa: E402

from runtime._version import __version__ as __version__  # noqa: E402

# The names imported on first use (PEP 562); type checkers read them here.
if TYPE_CHECKING:
    from runtime.bus import (
        Subscription as Subscription,
    )
    from runtime.context.estimate import (
        ContextStats as ContextStats,
    )
    from runtime.events import *  # noqa: F403  (all it lists: each event is declared once, there)
    from runtime.handles import (
        CompactionResult as CompactionResult,
        Handle as Handle,
        PromptHandle as PromptHandle,
        TurnResult as TurnResult,
        UsageReport as UsageReport,
    )
    from runtime.host import (
        Runtime as Runtime,
    )
    from runtime.messages import (
        CostSplit as CostSplit,
        ImagePart as ImagePart,
        Message as Message,
        ReasoningPart as ReasoningPart,
        TextPart as TextPart,
        ToolCallPart as ToolCallPart,
        Usage as Usage,
    )
    from runtime.store.sessions import (
        SessionInfo as SessionInfo,
    )
    from runtime.tools import (
        Tool as Tool,
        ToolContext as ToolContext,
        ToolRegistry as ToolRegistry,
        tool as tool,
    )

_exported: dict[str, str] | None = None


def _exports() -> dict[str, str]:
    """Each exported name -> the module that defines it, read once (on first need) from the imports above."""
    global _exported
    if _exported is None:
        import ast
        from pathlib import Path

        found: dict[str, str] = {}
        for node in ast.parse(Path(__file__).read_text(encoding="utf-8")).body:
            lazy = isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for stmt in node.body if isinstance(node, ast.If) and lazy else [node]:
                if not isinstance(stmt, ast.ImportFrom) or stmt.module is None:
                    continue
                if stmt.module.startswith("runtime.") and not stmt.module.startswith("runtime._"):
                    if stmt.names[0].name == "*":  # all the module lists (runtime.events: its events)
                        names = importlib.import_module(stmt.module).__all__
                        found.update((name, stmt.module) for name in names)
                    else:
                        found.update((alias.name, stmt.module) for alias in stmt.names)
        _exported = found  # (whole: another thread sees it complete or not at all)
    return _exported


def __getattr__(name: str) -> Any:
    if name == "__all__":
        value: Any = sorted([*_exports(), "__version__"])
    else:
        module = _exports().get(name)
        if module is None:
            raise AttributeError(f"module 'runtime' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_exports()) | {"__version__", "__all__"})
