"""Configuration: the defaults, TOML, AGENTCELL_* environment, overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config import Config, ConfigError, env_overrides, load_config


def test_defaults_match_the_spec() -> None:
    c = Config()
    assert c.compaction.auto is True
    assert c.compaction.threshold == 0.80
    assert c.compaction.reserve_tokens is None  # auto: 16,384, at most an eighth of the window
    assert c.compaction.default_keep_recent_tokens == 20_000
    assert c.compaction.tool_call_cutoff == 10
    assert c.compaction.min_reduction == 0.10
    assert c.tool_output.max_lines == 2_000
    assert c.tool_output.max_bytes == 50 * 1024
    assert c.tool_output.max_chars == 200 * 1024
    assert c.retry.max_attempts == 3
    assert c.persistence.fsync == "turn"
    assert c.bus.subscriber_queue == 10_000
    assert c.models.fallback_context_window == 128_000
    assert c.server.host == "127.0.0.1"
    assert c.agent.stream_stall_seconds == 10.0
    assert c.agent.shell_enabled is False


def test_toml_file_env_and_overrides_layer(tmp_path: Path) -> None:
    file = tmp_path / "agentcell.toml"
    file.write_text(
        '[compaction]\nthreshold = 0.6\nmode = "truncate"\n[models.context_windows]\n"my/model" = 8000\n'
    )
    env = {"AGENTCELL_COMPACTION__THRESHOLD": "0.7", "AGENTCELL_RETRY__MAX_ATTEMPTS": "5", "HOME": "/x"}
    c = load_config(file, environ=env, overrides={"persistence.fsync": "always"})
    assert c.compaction.threshold == 0.7  # env beats the file
    assert c.compaction.mode == "truncate"  # the file beats defaults
    assert c.retry.max_attempts == 5
    assert c.models.context_windows == {"my/model": 8000}
    assert c.persistence.fsync == "always"


def test_config_file_from_environment(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("[bus]\nsubscriber_queue = 5\n")
    assert load_config(environ={"AGENTCELL_CONFIG": str(file)}).bus.subscriber_queue == 5


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"AGENTCELL_COMPACTION__THRESHOLD": "lots"}, "compaction.threshold"),
        ({"AGENTCELL_COMPACTION__THRESHOLD": "1.5"}, "compaction.threshold"),
        ({"AGENTCELL_RETRY__MAX_ATTEMPTS": "0"}, "retry.max_attempts"),
        ({"AGENTCELL_PERSISTENCE__FSYNC": "sometimes"}, "persistence.fsync"),
        ({"AGENTCELL_COMPACTION__NO_SUCH_KEY": "1"}, "no_such_key"),
    ],
)
def test_invalid_values_name_the_key(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(environ=env)


def test_invalid_toml_and_missing_file_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[compaction\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(bad, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml", environ={})


def test_with_overrides_validates_and_keeps_the_rest() -> None:
    c = Config().with_overrides({"compaction": {"keep_recent_tokens": 1000}, "agent.tool_timeout": 2})
    assert c.compaction.keep_recent_tokens == 1000
    assert c.agent.tool_timeout == 2.0
    assert c.compaction.threshold == 0.80
    with pytest.raises(ConfigError, match=r"compaction\.mode"):
        Config().with_overrides({"compaction.mode": "shred"})


def test_env_overrides_ignores_unrelated_variables() -> None:
    assert env_overrides({"AGENTCELL_CONFIG": "x", "PATH": "/bin", "AGENTCELL_X__Y": "1"}) == {
        "x": {"y": "1"}
    }


def test_dict_values_from_env_as_json() -> None:
    env = {"AGENTCELL_MODELS__CONTEXT_WINDOWS": '{"openai/local": 4096}'}
    assert load_config(environ=env).models.context_windows == {"openai/local": 4096}


def test_the_writer_settings_reach_the_log_writer(tmp_path: Path) -> None:
    from runtime import Runtime

    cfg = Config().with_overrides({"persistence.transcript_delay": 2.5, "persistence.max_open_files": 7})
    with Runtime(cfg, sessions_dir=tmp_path) as rt:
        assert rt.services.writer.lazy_delay == 2.5
        assert rt.services.writer.max_open_files == 7
    with pytest.raises(ConfigError, match=r"persistence\.transcript_delay"):
        Config().with_overrides({"persistence.transcript_delay": 0})
    with pytest.raises(ConfigError, match=r"persistence\.max_open_files"):
        Config().with_overrides({"persistence.max_open_files": 0})
