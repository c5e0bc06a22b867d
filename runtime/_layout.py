"""agentcell installs two top-level packages, ``runtime`` and ``actors``, side by side (the project's layout).

A module of the same name earlier on ``sys.path`` (a user's own ``actors.py`` or ``runtime.py`` in the
directory a script runs from) hides one of them, and Python's own error then says only that a name cannot be
imported, or that ``'actors' is not a package``. :func:`require_sibling` turns that into an error naming the
file that hides the package and what to do.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HOME = Path(__file__).resolve().parent.parent
"""The folder that holds both packages."""


def hidden_by(name: str) -> str | None:
    """What hides agentcell's package ``name`` (its file or folder), or None when it is agentcell's own."""
    module = sys.modules.get(name)
    try:
        origin = (
            getattr(module, "__file__", None)
            if module is not None
            else getattr(importlib.util.find_spec(name), "origin", None)
        )
    except (ImportError, ValueError):
        return None
    if origin is None:  # nothing found, or a namespace package (a bare folder never hides a package)
        return None
    found = Path(origin).resolve()
    if found.name == "__init__.py" and found.parent == HOME / name:
        return None
    return str(found.parent if found.name == "__init__.py" else found)


def require_sibling(name: str) -> None:
    """Raise ImportError naming the cause when agentcell's package ``name`` is hidden by another module."""
    other = hidden_by(name)
    if other is not None:
        raise ImportError(
            f"agentcell's {name!r} package is hidden by {other}, a module of the same name found first on "
            f"sys.path (the directory a script runs from comes first). Rename yours (and remove its "
            f"__pycache__); agentcell's is in {HOME / name}",
            name=name,
            path=other,
        )
