"""One interface for both runtimes: ``Runtime`` and ``ClusterRuntime`` take what ``runtime.api.RuntimeAPI``
declares (the same parameters, kinds, defaults and annotations), and the README's method table lists exactly
its methods. (mypy checks the same statically: both classes derive from the Protocol.)"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from runtime.api import RuntimeAPI
from runtime.cluster import ClusterRuntime
from runtime.host import Runtime

README = Path(__file__).resolve().parent.parent / "README.md"


def api_members() -> set[str]:
    return {
        name
        for name, value in vars(RuntimeAPI).items()
        if (
            not name.startswith("_")
            or (name.startswith("__") and name in ("__enter__", "__exit__", "__aenter__", "__aexit__"))
        )
        and (callable(value) or isinstance(value, property))
    }


def public_parameters(fn: object) -> list[tuple[str, object, object, object]]:
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        if not p.name.startswith("_")
    ]


def test_the_readme_method_table_is_the_interface() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Methods of a runtime", 1)[1].split("\n### ", 1)[0]
    rows = [
        line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "---" not in line
    ]
    names = [name for row in rows[1:] for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row)]
    assert len(names) == len(set(names)), "a method is listed twice"
    assert sorted(names) == sorted(api_members())


@pytest.mark.parametrize("cls", [Runtime, ClusterRuntime], ids=lambda c: c.__name__)
def test_each_runtime_takes_what_the_interface_declares(cls: type) -> None:
    assert RuntimeAPI in cls.__mro__
    for name in sorted(api_members()):
        declared, implemented = getattr(RuntimeAPI, name), getattr(cls, name)
        assert implemented is not declared, f"{cls.__name__}.{name} is not implemented"
        if isinstance(declared, property):
            assert isinstance(implemented, property), name
            continue
        assert public_parameters(implemented) == public_parameters(declared), f"{cls.__name__}.{name}"
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared), name


def test_every_public_method_of_the_plain_runtime_is_in_the_interface() -> None:
    public = {n for n in dir(Runtime) if not n.startswith("_")}
    assert public - api_members() == set()
