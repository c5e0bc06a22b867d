"""One exception tree: every error agentcell raises on purpose is an ``AgentcellError``, keeps the built-in
base users catch, and is drawn in ``runtime/errors.py``; no event is named like an exception."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re

import pytest

import actors
import runtime
from runtime import errors
from runtime import events as ev
from runtime.errors import AgentcellError


def agentcell_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in runtime/ and actors/, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for package in (runtime, actors):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(".__main__"):
                continue
            if info.name.startswith("runtime.cluster.") and importlib.util.find_spec("ray") is None:
                continue
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_public_error_is_an_agentcell_error() -> None:
    found = agentcell_exceptions()
    assert len(found) >= 30  # the walk found the modules
    public = {name: cls for name, cls in found.items() if not cls.__name__.startswith("_")}
    outside = sorted(name for name, cls in public.items() if not issubclass(cls, AgentcellError))
    assert outside == [], f"errors outside the tree: {outside}"


def test_the_tree_in_the_docstring_names_every_error() -> None:
    drawn = set(re.findall(r"\b[A-Z][A-Za-z]+\b", errors.__doc__ or ""))
    # The native transport's many errors are drawn as their two bases ("HTTPTransportError ...").
    bases = {"HTTPTransportError", "ProviderHTTPError"}
    missing = sorted(
        cls.__name__
        for cls in agentcell_exceptions().values()
        if not cls.__name__.startswith("_")
        and cls.__name__ not in drawn
        and not bases & {base.__name__ for base in cls.__mro__[1:]}
    )
    assert missing == []
    assert set(errors.__all__) <= drawn


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.SessionNotFound, KeyError),
        (errors.SessionNotFound, LookupError),
        (errors.InvalidSessionId, ValueError),
        (errors.ConfigError, ValueError),
        (errors.CorruptLogError, ValueError),
        (errors.LogWriteError, OSError),
        (errors.RuntimeStopped, RuntimeError),
        (errors.SessionLockedError, RuntimeError),
        (errors.AlreadyRegistered, KeyError),
        (errors.ClusterUnavailable, RuntimeError),
    ],
)
def test_errors_keep_the_builtin_base_users_catch(error: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(error, builtin) and issubclass(error, AgentcellError)


def test_a_session_not_found_is_one_class_wherever_it_is_raised() -> None:
    from runtime.host import SessionNotFound
    from runtime.store import SessionNotFoundError

    assert SessionNotFound is SessionNotFoundError is errors.SessionNotFound
    assert str(SessionNotFound("no stored session 'x'")) == "no stored session 'x'"  # not KeyError's quotes


def test_the_runtime_raises_them(tmp_path: object) -> None:
    from runtime import Runtime

    with Runtime(sessions_dir=str(tmp_path)) as rt:
        with pytest.raises(AgentcellError):
            rt.prompt("nobody", "hello")
        with pytest.raises(AgentcellError):
            rt.resume_session("../escape")
        with pytest.raises(AgentcellError):
            rt.start_session(model="openai/x", config={"compaction.threshold": 7})
    with pytest.raises(AgentcellError):
        rt.start_session(model="openai/x")


def test_no_event_is_named_like_an_exception_and_the_wire_names_stay() -> None:
    names = [obj.__name__ for obj in vars(ev).values() if inspect.isclass(obj) and issubclass(obj, ev.Event)]
    assert "ErrorOccurred" in names
    assert [n for n in names if n.endswith(("Error", "Exception"))] == []
    assert ev.ErrorOccurred.__struct_config__.tag == "error"
    assert ev.PersistenceFailed.__struct_config__.tag == "persistence_error"
