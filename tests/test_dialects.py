"""The dialect modules are listed once (``runtime.dialects.MODULES``); what is read of every dialect (the
classifier's records, the local provider's overflow formats) is derived from that list, so a new dialect's
module is one file and one line."""

from __future__ import annotations

import inspect
import pkgutil

import runtime.dialects as dialects
from runtime.dialects import DIALECTS, MODULES, OVERFLOW_FORMATS, Dialect
from runtime.provider import errors as provider_errors


def test_every_dialect_module_is_in_the_one_list() -> None:
    on_disk = {m.name for m in pkgutil.iter_modules(dialects.__path__) if not m.name.startswith("_")}
    assert {m.__name__.rsplit(".", 1)[1] for m in MODULES} == on_disk


def test_every_dialect_record_of_every_module_is_read_by_the_classifier() -> None:
    declared = {
        value.name for module in MODULES for value in vars(module).values() if isinstance(value, Dialect)
    }
    assert declared == {d.name for d in DIALECTS}


def test_the_local_provider_answers_in_every_overflow_a_dialect_module_declares() -> None:
    assert provider_errors.OVERFLOW_FORMATS is OVERFLOW_FORMATS  # derived, not a second list
    for module in MODULES:
        own = getattr(module, "OVERFLOW_FORMATS", {})
        for name, build in own.items():
            assert OVERFLOW_FORMATS[name] is build
        builders = {
            f
            for n, f in inspect.getmembers(module, inspect.isfunction)
            if f.__module__ == module.__name__ and (n.endswith("overflow") or n == "request_too_large")
        }
        assert builders <= set(own.values()), f"{module.__name__} has an overflow it does not declare"
    assert len(OVERFLOW_FORMATS) == sum(len(getattr(m, "OVERFLOW_FORMATS", {})) for m in MODULES)
