"""Configuration: one msgspec tree holding every default from the SPEC, with the section it comes from.

Load order (later wins): built-in defaults → a TOML file → ``AGENTCELL_*`` environment variables →
per-session overrides. Environment variables name a key path with double underscores:
``AGENTCELL_COMPACTION__THRESHOLD=0.7``. An invalid value raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

Fraction = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosInt = Annotated[int, msgspec.Meta(ge=1)]
PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]

ENV_PREFIX = "AGENTCELL_"


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CompactionConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 5."""

    auto: bool = True  # 5.1
    mode: Literal["summarize", "hard_reset", "truncate"] = "summarize"  # 5.8
    threshold: Fraction = 0.80  # 5.1
    reserve_tokens: NonNegInt = 16_384  # 5.1
    max_tokens: PosInt | None = None  # 5.1: used when the window is unknown
    max_messages: PosInt | None = None  # 5.1: message-count trigger, off by default
    keep_recent_tokens: PosInt | None = None  # 5.2: None = auto (window / 4)
    default_keep_recent_tokens: PosInt = 20_000  # 5.2: when there is no window
    force_keep_messages: PosInt = 2  # 5.2
    emergency_keep_divisor: PosInt = 5  # 6.3: keep window / 5
    split_turn_min_messages: PosInt = 5  # 5.3
    summarizer_model: str | None = None  # 5.4: None = the session's model
    summarizer_timeout: PosFloat = 120.0
    summary_tool_result_chars: PosInt = 2_000  # 5.4: tool results clipped head and tail
    summary_max_output_tokens: PosInt = 4_096
    fallback: bool = True  # 5.5 (hard_reset never falls back)
    min_reduction: Fraction = 0.10  # 5.6
    tool_call_cutoff: PosInt = 10  # 5.9
    tool_summary_strategy: Literal["llm", "heuristic", "off"] = "llm"  # 5.9
    tool_summary_input_chars: PosInt = 12_000  # 5.9
    tool_summary_output_chars: PosInt = 1_200  # 5.9
    heuristic_summary_chars: PosInt = 800  # 5.9
    clear_old_tool_outputs: bool = False  # 5.9
    clear_protect_tokens: NonNegInt = 40_000  # 5.9
    clear_min_freed_tokens: NonNegInt = 20_000  # 5.9


class ToolOutputConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 3.5 (reference 001)."""

    max_lines: PosInt = 2_000
    max_bytes: PosInt = 50 * 1024
    max_chars: PosInt = 200 * 1024
    spill_threshold_chars: PosInt = 200 * 1024
    mode: Literal["head_tail", "head"] = "head_tail"
    spill_dir: str | None = None  # None = <sessions_dir>/<session>.spill


class RetryConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 3.7."""

    max_attempts: PosInt = 3
    base_delay: NonNegFloat = 1.0
    max_delay: NonNegFloat = 30.0
    jitter: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.25
    request_timeout: PosFloat = 600.0


class TokenConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 4.3, 4.4."""

    exact: bool = True
    encoding: str | None = None  # None = chosen per model
    image_tokens: NonNegInt = 1_200
    message_overhead: NonNegInt = 4
    apply_calibration: bool = False


class ModelsConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 4.5."""

    fallback_context_window: PosInt = 128_000
    context_windows: dict[str, PosInt] = msgspec.field(default_factory=dict)
    max_output_tokens: dict[str, PosInt] = msgspec.field(default_factory=dict)


class AgentConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 3."""

    model: str = "agentcell-local"
    tool_timeout: PosFloat = 60.0
    max_parallel_tools: PosInt = 8
    stream_stall_seconds: PosFloat = 10.0  # 3: stream_stalled after 10 s without chunks
    max_steps_per_turn: PosInt = 50
    max_turn_input_tokens: PosInt | None = None  # 5.13: the turn's spend guard; None = 20 × the window
    shell_enabled: bool = False
    shell_timeout: PosFloat = 120.0
    send_reasoning: bool = True  # 3.3
    max_output_tokens: PosInt | None = None
    mock_response: str | None = None  # litellm's in-process fake reply (tests, benchmarks)


class PersistenceConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 2.3."""

    sessions_dir: str = "~/.agentcell/sessions"
    fsync: Literal["always", "turn", "never"] = "turn"
    transcript: bool = True
    transcript_delay: PosFloat = 0.1  # seconds transcript lines may wait for a write that is due anyway
    max_open_files: PosInt | None = None  # log and transcript files kept open; None: ulimit -n / 4, ≤ 4,096
    hibernate_after: NonNegFloat | None = None  # seconds idle before a session parks its actors


class BusConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 1.4."""

    subscriber_queue: PosInt = 10_000


class ServerConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 7.2."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8765
    token: str | None = None  # None = generated and printed at start


class RuntimeConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """SPEC 1.1."""

    dispatcher_threads: PosInt = 2
    tool_workers: PosInt = 16
    batch_size: PosInt = 64  # messages an actor handles before yielding its thread
    max_restarts: NonNegInt = 3  # 1.2: restart intensity of a session's supervisor ...
    max_restart_seconds: PosFloat = 5.0  # ... within this many seconds, then it escalates
    # Where the runtime's own threads run: "auto" (one CPU, claimed among the processes of the host, on
    # Linux with a GIL and two CPUs or more), "off" (the OS decides) or a CPU number. See runtime.affinity.
    cpu: Literal["off", "auto"] | NonNegInt = "auto"


class Config(_Section, frozen=True, forbid_unknown_fields=True):
    compaction: CompactionConfig = msgspec.field(default_factory=CompactionConfig)
    tool_output: ToolOutputConfig = msgspec.field(default_factory=ToolOutputConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    tokens: TokenConfig = msgspec.field(default_factory=TokenConfig)
    models: ModelsConfig = msgspec.field(default_factory=ModelsConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    persistence: PersistenceConfig = msgspec.field(default_factory=PersistenceConfig)
    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    runtime: RuntimeConfig = msgspec.field(default_factory=RuntimeConfig)

    @property
    def sessions_path(self) -> Path:
        return Path(os.path.expanduser(self.persistence.sessions_dir))

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> Config:
        """A copy with ``overrides`` (nested dicts, or dotted keys like ``"compaction.mode"``) applied."""
        if not overrides:
            return self
        base = msgspec.to_builtins(self)
        _deep_merge(base, _expand_dotted(overrides))
        return _convert(base)


def _expand_dotted(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"invalid config: keys must be strings, not {type(key).__name__} ({key!r})")
        target = out
        *head, last = key.split(".")
        for part in head:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(f"invalid config: {key}: {part!r} is set to a value and a table at once")
        if isinstance(value, Mapping):
            value = _expand_dotted(value)
            if isinstance(target.get(last), dict):
                _deep_merge(target[last], value)
                continue
        target[last] = value
    return out


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _convert(data: Mapping[str, Any], *, source: str = "config") -> Config:
    try:
        return msgspec.convert(data, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid {source}: {_readable(str(exc))}") from None


def _readable(message: str) -> str:
    # msgspec says "... - at `$.compaction.threshold`"; turn the path into the key users write.
    if " - at `$." in message:
        reason, _, path = message.partition(" - at `$.")
        return f"{path.rstrip('`')}: {reason}"
    return message


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``AGENTCELL_SECTION__KEY=value`` pairs as a nested dict (values left as strings)."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        target = out
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = _env_value(value)
    return out


def _env_value(value: str) -> Any:
    # Tables (dict-valued keys) can be given as inline TOML/JSON: AGENTCELL_MODELS__CONTEXT_WINDOWS='{"m": 8000}'
    stripped = value.strip()
    if stripped.startswith("{"):
        try:
            return msgspec.json.decode(stripped)
        except msgspec.DecodeError:
            return value
    if stripped.lower() in ("none", "null"):
        return None
    return value


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults ← TOML file (``path``, or ``$AGENTCELL_CONFIG``) ← environment ← ``overrides``."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    file = path if path is not None else env.get(ENV_PREFIX + "CONFIG")
    source = "config"
    if file is not None:
        source = f"config file {os.fspath(file)}"
        try:
            raw = Path(file).expanduser().read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {source}: {exc.strerror}") from None
        try:
            data = msgspec.toml.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"invalid {source}: {exc}") from None
    from_env = env_overrides(env)
    if from_env:
        source = f"{source} / {ENV_PREFIX}* environment"
        _deep_merge(data, from_env)
    if overrides:
        _deep_merge(data, _expand_dotted(overrides))
    return _convert(data, source=source)
