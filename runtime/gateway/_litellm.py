"""litellm itself: imported once, lazily (it costs seconds), quiet and configured (:func:`load_litellm`).

A leaf of the gateway: routing (litellm's provider resolution) and the litellm transport both import it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import threading
from typing import Any, Final

__all__ = ["litellm_loaded", "load_litellm"]

_FIRST_CALL_MODULES: Final = (
    # What litellm's first OpenAI-compatible call imports lazily (~500 modules, seconds): imported here, off
    # the loop thread, so that the first call does not stall every other coroutine of the I/O loop.
    "openai.resources",
    "litellm.proxy._types",
    "litellm.llms.litellm_proxy.chat.transformation",
    "litellm.llms.openai_like.dynamic_config",
    "litellm.llms.openai.chat.gpt_audio_transformation",
    "litellm._service_logger",
    "anyio._backends._asyncio",
    "litellm.litellm_core_utils.default_encoding",
    "litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic.transformation",
    "litellm.proxy.openai_files_endpoints.common_utils",
    "litellm.types.litellm_core_utils.streaming_chunk_builder_utils",
)
_litellm_lock = threading.Lock()
_litellm_module: Any = None


def load_litellm() -> Any:
    """Import and configure litellm once: quiet, no telemetry, no retries of its own, and its import's
    objects kept out of the cycle collector's full passes (``gc.freeze()``)."""
    global _litellm_module
    if _litellm_module is not None:
        return _litellm_module
    with _litellm_lock:
        if _litellm_module is None:
            import litellm

            litellm.suppress_debug_info = True
            litellm.set_verbose = False  # type: ignore[attr-defined]  # litellm does not re-export it
            if hasattr(litellm, "telemetry"):
                litellm.telemetry = False
            logging.getLogger("LiteLLM").setLevel(logging.WARNING)
            for module in _FIRST_CALL_MODULES:
                with contextlib.suppress(ImportError):
                    importlib.import_module(module)
            # litellm's import leaves ~360,000 objects that live as long as the process. The cycle collector
            # would walk them all in every full collection (~0.25 s on a small machine, while every session
            # waits); frozen, they are left out. Garbage from the import is collected first.
            gc.collect()
            gc.freeze()
            _litellm_module = litellm
    return _litellm_module


def litellm_loaded() -> Any:
    """litellm if :func:`load_litellm` has run, else None (never imports)."""
    return _litellm_module
