"""agentcell: an actor-based concurrent runtime for LLM agent sessions.

Importing this package is cheap and offline-safe: it sets ``LITELLM_LOCAL_MODEL_COST_MAP`` and
``TIKTOKEN_CACHE_DIR`` (unless you set them) and never imports litellm; the gateway does that lazily.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from runtime._offline import configure_offline_environment

configure_offline_environment()

# Every module logs under one root, "agentcell.<area>" (agentcell.runtime, .agent, .gateway, .store, ...):
# configuring "agentcell" configures them all. Without configuration nothing is printed (pykka's way).
logging.getLogger("agentcell").addHandler(logging.NullHandler())

from runtime.config import Config, ConfigError, load_config  # noqa: E402
from runtime.ids import InvalidSessionId, validate_session_id  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "CorruptLogError",
    "InvalidSessionId",
    "Runtime",
    "__version__",
    "load_config",
    "validate_session_id",
]

if TYPE_CHECKING:
    from runtime.host import Runtime
    from runtime.store.log import CorruptLogError


def __getattr__(name: str) -> Any:
    # The Runtime pulls in the actor system; keep `import runtime` light.
    if name == "Runtime":
        from runtime.host import Runtime

        return Runtime
    if name == "CorruptLogError":  # what resume_session raises for a damaged log
        from runtime.store.log import CorruptLogError

        return CorruptLogError
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
