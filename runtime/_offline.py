"""Offline-safe start-up: make litellm and tiktoken work without the network.

litellm downloads its model price map at import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, and
tiktoken downloads its encodings on first use unless ``TIKTOKEN_CACHE_DIR`` holds them. litellm ships the
cl100k, o200k and p50k files, so we point tiktoken there. A user's own values always win. Nothing here
imports litellm (that costs seconds); the tokenizer directory is found from the package's location.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def litellm_tokenizer_dir() -> Path | None:
    """The folder of tiktoken files that litellm ships, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    folder = root / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


def configure_offline_environment() -> None:
    """Set the two variables, each only when the user has not set it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        folder = litellm_tokenizer_dir()
        if folder is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
