"""The actor protocol's types: each actor's message union is what its ``on_receive`` handles, and a ref typed
by it (``runtime.actor.Ref``) makes mypy refuse a message the actor does not take."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import typing
from pathlib import Path

import pytest
from mypy import api as mypy_api

from actors import protocol as p
from actors.agent import Agent
from actors.compactor import Compactor
from actors.overflow_detector import OverflowDetector
from actors.session_store import SessionStore
from actors.usage_tracker import UsageTracker

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ROOT / "tests" / "typing" / "refs.py"
IGNORE = re.compile(r"  # type: ignore\[([a-z-]+)\]$")


def _matched(function: typing.Callable[..., object]) -> set[str]:
    """The classes the ``case`` patterns of ``function`` match, by name (``p.X()`` counts as ``X``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if isinstance(node, ast.MatchClass):
            cls = node.cls
            names.add(
                cls.attr if isinstance(cls, ast.Attribute) else cls.id if isinstance(cls, ast.Name) else ""
            )
    return names


@pytest.mark.parametrize(
    ("union", "handlers"),
    [
        (p.AgentMessage, (Agent.on_receive,)),
        (p.CompactorMessage, (Compactor.on_receive,)),
        (p.StoreMessage, (SessionStore.on_receive, SessionStore._handle)),
        (p.UsageMessage, (UsageTracker.on_receive,)),
        (p.OverflowMessage, (OverflowDetector.on_receive,)),
    ],
    ids=["agent", "compactor", "store", "usage", "overflow"],
)
def test_each_union_is_what_its_actor_handles(
    union: object, handlers: tuple[typing.Callable[..., object], ...]
) -> None:
    declared = {cls.__name__ for cls in typing.get_args(union)}
    handled = set().union(*(_matched(h) for h in handlers))
    # besides its union, an actor handles its calls' replies and the messages it sends itself
    handled = {name for name in handled if name != "Reply" and not name.startswith("_")}
    assert declared == handled, (
        f"declared but not handled: {declared - handled}; handled but not declared: {handled - declared}"
    )


def test_a_ref_refuses_what_its_actor_does_not_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/typing/refs.py sends each actor's ref messages it does not take, each line marked with the error
    mypy must report. Checked without the marks, mypy reports exactly those errors, on those lines.

    (CI's mypy step checks the file with its marks: strict mypy reports a mark that covers no error.)"""
    source = CHECKED.read_text()
    expected: set[tuple[int, str]] = set()
    lines = []
    for number, line in enumerate(source.splitlines(), start=1):
        mark = IGNORE.search(line)
        if mark:
            expected.add((number, mark.group(1)))
            line = line[: mark.start()]
        lines.append(line)
    assert len(expected) >= 10
    unmarked = tmp_path / "refs_unmarked.py"
    unmarked.write_text("\n".join(lines) + "\n")

    monkeypatch.setenv("MYPYPATH", str(ROOT))  # this checkout's runtime and actors, whatever is installed
    out, err, _ = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(unmarked),
        ]
    )
    reported = {
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"^[^\n]*refs_unmarked\.py:(\d+): error: .*\[([a-z-]+)\]$", out, re.M)
    }
    assert reported == expected, f"mypy said:\n{out}{err}"
