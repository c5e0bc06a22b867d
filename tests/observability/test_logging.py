"""One logger root: every record agentcell writes is under ``agentcell``, so configuring that one logger
catches the agent's, the actors' and the gateway's records; unconfigured, ``agentcell`` prints nothing."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import actors
import runtime
from runtime import Runtime
from runtime.config import Config
from runtime.provider.script import Turn


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)

    def named(self, prefix: str) -> list[logging.LogRecord]:
        with self._lock_records:
            return [r for r in self.records if r.name == prefix or r.name.startswith(prefix + ".")]


@pytest.fixture
def agentcell_log() -> Iterator[Collect]:
    """A handler on the ``agentcell`` logger only, at DEBUG: what a user who configures it gets."""
    logger = logging.getLogger("agentcell")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_the_root_has_a_null_handler() -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("agentcell").handlers)


def test_every_module_logs_under_agentcell() -> None:
    for package in (runtime, actors):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.startswith("runtime.cluster.") or module.name.endswith(".__main__"):
                continue  # the cluster needs the ray extra (its loggers are agentcell.cluster); __main__ runs
            importlib.import_module(module.name)
    ours = [name for name in logging.Logger.manager.loggerDict if name.split(".")[0] in ("runtime", "actors")]
    assert ours == [], f"loggers outside the agentcell root: {ours}"


def test_configuring_agentcell_catches_the_agent_and_the_gateway(
    sessions_dir: Path, provider: Any, agentcell_log: Collect, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider.add_script("logging-ok", [Turn(text="fine")])
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    with Runtime(config, sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model="openai/logging-ok", api_base=provider.url, api_key="sk-local")
        assert rt.prompt(sid, "hello").result(timeout=30).text == "fine"

        # The agent crashes on a message it does not know: the failure is logged and supervised.
        restarted = threading.Event()
        rt.subscribe(sid, callback=lambda e: e.type == "agent_recovered" and restarted.set())
        rt._session(sid).refs.agent.tell(object())
        assert restarted.wait(30)
        assert any("Agent" in r.getMessage() and r.levelno == logging.ERROR for r in agentcell_log.records)

        # A bug inside the gateway (here where a call starts its stall watch, on the I/O loop) fails the
        # call, and the gateway logs it.
        def broken(self: Any, loop: Any) -> None:
            raise RuntimeError("stall watch bug")

        monkeypatch.setattr("runtime.gateway._gateway._Call.watch", broken)
        result = rt.prompt(sid, "hello again").result(timeout=30)
        assert result.status == "error" and "stall watch bug" in (result.error or ""), result

    gateway = agentcell_log.named("agentcell.gateway")
    assert [r.getMessage() for r in gateway] == ["provider call failed unexpectedly"]
    assert {"agentcell.actor", "agentcell.supervisor", "agentcell.runtime"} & {
        r.name for r in agentcell_log.records
    }
