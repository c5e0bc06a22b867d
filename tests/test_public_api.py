"""The public surface: ``runtime.__all__`` is exactly what the README's "Public API" section lists, every
name resolves, and importing the package (or listing it) imports nothing heavy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import runtime
from runtime import errors

README = Path(__file__).resolve().parent.parent / "README.md"


def documented_names() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Exported names", 1)[1].split("\n### ", 1)[0]
    rows = [
        line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "---" not in line
    ]
    names: list[str] = []
    for row in rows[1:]:
        listed, _, events = row.partition("and one class per event type")
        names += re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", listed)
        if events:  # the event classes: those runtime.events.EVENTS lists (a few are named as examples)
            from runtime.events import EVENTS

            names += [cls.__name__ for cls in EVENTS]
    return names


def test_all_is_what_the_readme_documents() -> None:
    names = documented_names()
    assert len(names) == len(set(names)), "a name is listed twice"
    assert sorted(names) == sorted(runtime.__all__)


def test_every_exported_name_resolves_and_dir_lists_them() -> None:
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name
    assert set(runtime.__all__) <= set(dir(runtime))


def test_every_error_and_event_is_exported() -> None:
    from runtime import events as ev

    assert set(errors.__all__) <= set(runtime.__all__)
    assert {cls.__name__ for cls in ev.AnyEvent.__args__} <= set(runtime.__all__)
    assert runtime.SessionNotFound is errors.SessionNotFound and runtime.Runtime.__module__ == "runtime.host"


def test_importing_runtime_and_listing_it_stays_light() -> None:
    probe = (
        "import sys, runtime; dir(runtime); runtime.Config; runtime.AgentcellError; "
        "print(sorted(m for m in ('litellm', 'pykka', 'httpx', 'tiktoken', 'actors', 'runtime.host') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_module_with_all_lists_every_public_class_and_function_it_defines() -> None:
    import importlib
    import inspect
    import pkgutil

    unlisted: list[str] = []
    for info in pkgutil.walk_packages(runtime.__path__, "runtime."):
        if info.name.startswith(("runtime.apps.", "runtime.cluster.")) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        listed = getattr(module, "__all__", None)
        if listed is None:
            continue
        for name, obj in vars(module).items():
            defined_here = getattr(obj, "__module__", None) == info.name
            if (
                defined_here
                and not name.startswith("_")
                and (inspect.isclass(obj) or inspect.isfunction(obj))
            ) and name not in listed:
                unlisted.append(f"{info.name}.{name}")
    assert unlisted == []
