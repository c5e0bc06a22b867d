"""Hostile configuration: what a session's config (from an HTTP client, say) or a config file can hold.

A bad value is a :class:`ConfigError` naming the key, never a crash later, and one session's config can
never change what the runtime does for every session.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runtime import Runtime
from runtime.config import MAX_SECONDS, Config, ConfigError, load_config

DURATIONS = [
    "compaction.summarizer_timeout",
    "retry.base_delay",
    "retry.max_delay",
    "retry.request_timeout",
    "retry.headers_timeout",
    "retry.first_byte_timeout",
    "retry.stall_timeout",
    "agent.tool_timeout",
    "agent.stream_stall_seconds",
    "agent.shell_timeout",
    "persistence.transcript_delay",
    "persistence.hibernate_after",
    "runtime.max_restart_seconds",
    "subagents.timeout",
    "capacity.queue_timeout",
    "mcp.startup_timeout",
    "mcp.ping_timeout",
    "models.discovery_timeout",
    "server.header_timeout",
    "server.body_timeout",
    "server.keep_alive_timeout",
    "server.drain_timeout",
]


def test_the_list_of_durations_is_complete() -> None:
    """Every setting measured in seconds is in the list below (so each is tested for its bounds)."""
    found = []
    for section in msgspec.structs.fields(Config):
        if not isinstance(section.type, type) or not issubclass(section.type, msgspec.Struct):
            continue  # a table of named entries (agents), not a section of settings
        for field in msgspec.structs.fields(section.type):
            if any(word in field.name for word in ("timeout", "delay", "seconds", "_after")):
                found.append(f"{section.name}.{field.name}")
    assert sorted(found) == sorted(DURATIONS)


@pytest.mark.parametrize("key", DURATIONS)
@pytest.mark.parametrize("value", [1e308, math.inf, "inf", math.nan, -1.0, MAX_SECONDS * 2])
def test_every_duration_is_bounded(key: str, value: Any) -> None:
    """A duration outside (0 s, a week] is a ConfigError naming the key, from any layer of config."""
    with pytest.raises(ConfigError, match=re.escape(key)):
        Config().with_overrides({key: value})
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(environ={f"AGENTCELL_{section.upper()}__{name.upper()}": str(value)})


def test_sane_durations_are_accepted() -> None:
    """Durations from a millisecond to a week are accepted as they are."""
    for key in DURATIONS:
        for value in (0.001, 3600, MAX_SECONDS):
            assert Config().with_overrides({key: value})


@pytest.mark.parametrize(
    "key",
    [
        "persistence.sessions_dir",
        "persistence.transcript",
        "server.token",
        "server.workspace_root",
        "server.allow_shell",
        "runtime.tool_workers",
        "runtime.cpu",
        "bus.subscriber_queue",
        "retry.max_attempts",
        "tool_output.spill_dir",
    ],
)
def test_a_session_cannot_set_what_the_runtime_reads_once(rt: Runtime, key: str) -> None:
    """A per-session key that only the runtime reads is refused by name, not silently ignored."""
    value: Any = {"persistence.transcript": False, "server.allow_shell": True, "runtime.cpu": "off"}.get(
        key, 1 if key.endswith(("workers", "queue", "attempts")) else "/"
    )
    with pytest.raises(ConfigError, match=re.escape(f"{key} is not a per-session setting")):
        rt.start_session(model="m", config={key: value})
    with pytest.raises(ConfigError, match="is not a per-session setting"):
        rt.start_session(model="m", config={key.split(".")[0]: {key.split(".")[1]: value}})
    assert rt.list_sessions() == []


def test_a_session_sets_what_it_can(rt: Runtime) -> None:
    """Per-session config takes the agent, compaction, model, token and output-limit settings."""
    sid = rt.start_session(
        model="m",
        config={
            "agent.tool_timeout": 5,
            "compaction": {"mode": "truncate"},
            "models.context_windows": {"openai/gpt-4.1": 50_000},
            "tool_output.max_lines": 10,
            "retry.request_timeout": 30,
            "persistence.fsync": "always",
        },
    )
    cfg = rt._session(sid).spec.config
    assert cfg.agent.tool_timeout == 5 and cfg.compaction.mode == "truncate"
    assert cfg.models.context_windows == {"openai/gpt-4.1": 50_000}  # a model name with a dot in it
    assert cfg.tool_output.max_lines == 10 and cfg.persistence.fsync == "always"


def test_deeply_nested_config_is_a_clear_error(rt: Runtime, tmp_path: Path) -> None:
    """Config nested thousands of levels deep is a ConfigError, not a RecursionError."""
    deep: Any = 1
    for _ in range(100_000):
        deep = {"a": deep}
    with pytest.raises(ConfigError, match="nested more than"):
        rt.start_session(model="m", config={"compaction": deep})
    with pytest.raises(ConfigError, match="nested more than"):
        Config().with_overrides({"models.context_windows": deep})
