"""Configuration: one msgspec tree holding every default, marked with the section of docs/design.md it serves.

Load order (later wins): built-in defaults → a TOML file → ``AGENTCELL_*`` environment variables →
per-session overrides. Environment variables name a key path with double underscores:
``AGENTCELL_COMPACTION__THRESHOLD=0.7``. An invalid value raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from runtime.errors import ConfigError
from runtime.outbound import check_allowed_urls

__all__ = [
    "ENV_PREFIX",
    "MAX_DEPTH",
    "MAX_SECONDS",
    "MCP_SERVER_NAME",
    "SESSION_KEYS",
    "AgentConfig",
    "AgentProfile",
    "BusConfig",
    "CapacityConfig",
    "CompactionConfig",
    "Config",
    "ConfigError",
    "Fraction",
    "GatewayConfig",
    "LimitConfig",
    "McpConfig",
    "McpServerConfig",
    "ModelsConfig",
    "NonNegFloat",
    "NonNegInt",
    "NonNegSeconds",
    "PersistenceConfig",
    "PosFloat",
    "PosInt",
    "RetryConfig",
    "RuntimeConfig",
    "Seconds",
    "ServerConfig",
    "SubagentsConfig",
    "TelemetryConfig",
    "TokenConfig",
    "ToolOutputConfig",
    "check_mcp_server_name",
    "env_overrides",
    "load_config",
]


Fraction = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosInt = Annotated[int, msgspec.Meta(ge=1)]
PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]

MAX_SECONDS = 7 * 24 * 3600.0
"""The longest duration any setting accepts (a week): beyond it, a value is a mistake or an attack (a
timeout of 1e308 s overflows the waits that honour it)."""
Seconds = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_SECONDS)]
NonNegSeconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
MAX_DEPTH = 8
"""How deeply config tables may nest (the deepest real key, ``models.context_windows.<model>``, is 3)."""

ENV_PREFIX = "AGENTCELL_"


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CompactionConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §5."""

    auto: bool = True  # 5.1
    mode: Literal["summarize", "hard_reset", "truncate"] = "summarize"  # 5.8
    threshold: Fraction = 0.80  # 5.1
    reserve_tokens: NonNegInt | None = None  # 5.1: None = auto (16,384, at most window / 8, at least 1,024)
    max_tokens: PosInt | None = None  # 5.1: used when the window is unknown
    max_messages: PosInt | None = None  # 5.1: message-count trigger, off by default
    keep_recent_tokens: PosInt | None = None  # 5.2: None = auto (window / 4)
    default_keep_recent_tokens: PosInt = 20_000  # 5.2: when there is no window
    force_keep_messages: PosInt = 2  # 5.2
    emergency_keep_divisor: PosInt = 5  # 6.3: keep window / 5
    split_turn_min_messages: PosInt = 5  # 5.3
    summarizer_model: str | None = None  # 5.4: None = the session's model
    summarizer_timeout: Seconds = 120.0
    summary_tool_result_chars: PosInt = 2_000  # 5.4: tool results clipped head and tail
    summary_max_output_tokens: PosInt = 4_096
    fallback: bool = True  # 5.5 (hard_reset never falls back)
    min_reduction: Fraction = 0.10  # 5.6
    tool_call_cutoff: PosInt = 10  # 5.9
    # 5.9, 4.7: an archive must free this many tokens (None: while gateway.prompt_cache is on, a quarter of the
    # window, and only while the context is under half the compaction threshold; else 0): it rewrites the
    # conversation from its oldest archived step, breaking the cached prefix
    archive_min_freed_tokens: NonNegInt | None = None
    tool_summary_strategy: Literal["llm", "heuristic", "off"] = "llm"  # 5.9
    tool_summary_input_chars: PosInt = 12_000  # 5.9
    tool_summary_output_chars: PosInt = 1_200  # 5.9
    heuristic_summary_chars: PosInt = 800  # 5.9
    clear_old_tool_outputs: bool = False  # 5.9
    clear_protect_tokens: NonNegInt = 40_000  # 5.9
    clear_min_freed_tokens: NonNegInt = 20_000  # 5.9


class ToolOutputConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.5 (reference 001)."""

    max_lines: PosInt = 2_000
    max_bytes: PosInt = 50 * 1024
    max_chars: PosInt = 200 * 1024
    spill_threshold_chars: PosInt = 200 * 1024
    mode: Literal["head_tail", "head"] = "head_tail"
    spill_dir: str | None = None  # None = <sessions_dir>/<session>.spill


class RetryConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.7."""

    max_attempts: PosInt = 3
    base_delay: NonNegSeconds = 1.0
    max_delay: NonNegSeconds = 30.0
    jitter: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.25
    # The most one attempt may take, streamed or not, whatever arrives meanwhile (keep-alives included).
    request_timeout: Seconds = 600.0
    # A streamed attempt past one of these limits is cancelled and retried as a timeout (0: no limit), each
    # counted from the attempt's start: the response's headers within ``headers_timeout`` (they come at once
    # from a live provider, even a reasoning model: a dead one fails here, in a minute); its first data event
    # within ``first_byte_timeout`` (reasoning models may think for minutes before their first token); then
    # no gap between two data events over ``stall_timeout``. SSE comments (keep-alives) are not data: they
    # reset none of these clocks.
    headers_timeout: NonNegSeconds = 60.0
    first_byte_timeout: NonNegSeconds = 300.0
    stall_timeout: NonNegSeconds = 120.0


class TokenConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §4.3, 4.4."""

    exact: bool = True
    encoding: str | None = None  # None = chosen per model
    image_tokens: NonNegInt = 1_200
    message_overhead: NonNegInt = 4
    apply_calibration: bool = False
    # Count text with the server's own tokenizer (llama.cpp's POST /tokenize at the session's api_base), exact
    # for models tiktoken does not know; falls back to counting here when the server does not answer.
    server_tokenize: bool = False


class ModelsConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §4.5."""

    fallback_context_window: PosInt = 128_000
    context_windows: dict[str, PosInt] = msgspec.field(default_factory=dict)
    max_output_tokens: dict[str, PosInt] = msgspec.field(default_factory=dict)
    # A model nobody's table knows, at an api_base: ask the server its window (once per endpoint and model)
    discover_windows: bool = True
    discovery_timeout: Seconds = 1.5


class AgentConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3."""

    model: str = "agentcell-local"
    tool_timeout: Seconds = 60.0
    max_parallel_tools: PosInt = 8
    stream_stall_seconds: Seconds = 10.0  # 3: stream_stalled after 10 s without chunks
    max_steps_per_turn: PosInt = 50
    max_turn_input_tokens: PosInt | None = None  # 5.13: the turn's spend guard; None = 20 × the window
    shell_enabled: bool = False
    shell_timeout: Seconds = 120.0
    # Environment variables shell passes beyond its allow-list (names, or patterns such as "MYAPP_*").
    shell_env: list[str] = msgspec.field(default_factory=list)
    send_reasoning: bool = True  # 3.3
    max_output_tokens: PosInt | None = None
    mock_response: str | None = None  # litellm's in-process fake reply (tests, benchmarks)
    resume_turns: bool = True  # 3.12: resume_session and a failover take up a turn a crash cut off


class PersistenceConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §2.3."""

    sessions_dir: str = "~/.agentcell/sessions"
    fsync: Literal["always", "turn", "never"] = "turn"
    transcript: bool = True
    transcript_delay: Seconds = 0.1  # seconds transcript lines may wait for a write that is due anyway
    max_open_files: PosInt | None = None  # log and transcript files kept open; None: ulimit -n / 4, ≤ 4,096
    hibernate_after: NonNegSeconds | None = None  # seconds idle before a session parks its actors


class BusConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §1.4."""

    subscriber_queue: PosInt = 10_000


class ServerConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §7.2."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8765
    token: str | None = None  # None = generated and printed at start (or read from token_file)
    token_file: str | None = None  # a file holding the token (keeps it out of `ps` and the config)
    max_body_bytes: PosInt = 4 * 1024 * 1024  # larger request bodies are refused with 413
    # Policy for clients (design §9): session workspaces must lie under workspace_root (None: no session may
    # have one), a session may enable the shell tool only if allow_shell, and may name an api_base without
    # its own api_key (so running on the server's provider keys, sent to that URL) only if allow_api_base,
    # and may start MCP servers over stdio (a command run on this machine) only if allow_mcp_commands.
    workspace_root: str | None = None
    allow_shell: bool = False
    allow_api_base: bool = False
    metrics_public: bool = False  # GET /metrics without the bearer token (a scraper on a trusted network)

    allow_mcp_commands: bool = False  # a client's session may start stdio MCP servers (commands) only if set
    # On SIGTERM/SIGINT `serve` takes no new turns (503), waits this long for the running ones, then aborts
    # what is left (runtime/apps/drain.py). Under a platform's grace period (30 s on Kubernetes by default).
    drain_timeout: Seconds = 25.0
    log_format: Literal["text", "json"] = "text"  # `serve`'s log on stderr; json: one object a line
    # The MCP server URLs a client's session may name (runtime.outbound.match_url): URLs (same scheme, host and
    # port, a path under the entry's), or "*" for any URL at a public address. Empty: none. A host named here
    # is reached whatever its addresses; otherwise loopback, private and link-local addresses are refused.
    mcp_allowed_urls: list[str] = msgspec.field(default_factory=list)
    # The api_base URLs a client's session may name (with its own api_key, or with allow_api_base), as
    # mcp_allowed_urls: "*" is any URL at a public address, and at loopback and private ones while
    # api_base_private is on (local model servers); link-local and reserved ones (metadata) must be named.
    api_base_allowed_urls: list[str] = msgspec.field(default_factory=lambda: ["*"])
    api_base_private: bool = True
    # Connection hygiene (runtime.apps.connections): a request's headers must arrive within header_timeout
    # (of the connection opening, or of the previous response), its body within body_timeout; an idle
    # keep-alive connection closes after keep_alive_timeout; past max_connections open ones, the oldest idle
    # one is closed for a new one (when all are busy, the new one gets a 503).
    header_timeout: Seconds = 10.0
    tenants_file: str | None = (
        None  # tenants, their hashed tokens and quotas (runtime.apps.tenants); re-read on change
    )
    body_timeout: Seconds = 60.0
    keep_alive_timeout: Seconds = 5.0
    max_connections: PosInt = 2_048

    def __post_init__(self) -> None:
        for key, urls in (
            ("mcp_allowed_urls", self.mcp_allowed_urls),
            ("api_base_allowed_urls", self.api_base_allowed_urls),
        ):
            try:
                check_allowed_urls(urls)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None


class GatewayConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.2: the transport of provider calls (see runtime.gateway._routing)."""

    # "auto": the native OpenAI-compatible transport where it sends what litellm would, litellm elsewhere;
    # "litellm" or "openai_compat" force one (calls only litellm can make still go to litellm).
    transport: Literal["auto", "litellm", "openai_compat"] = "auto"
    max_connections: PosInt = 1_000  # the native transport's open connections per endpoint
    # 4.7: cache hints on every request (cache_control breakpoints, prompt_cache_key); "1h" asks Anthropic
    # to keep written prefixes an hour (writes cost 2x instead of 1.25x)
    prompt_cache: bool = True
    cache_ttl: Literal["5m", "1h"] = "5m"


class CapacityConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.11: admission control, many sessions sharing a provider key's limits (runtime.capacity)."""

    enabled: bool = True
    group_by: Literal["key", "model"] = "key"  # a pool per endpoint + key, or per endpoint + key + model
    queue_timeout: Seconds = 300.0  # the most a turn waits for capacity, in all; then it ends rate_limited
    headroom: Fraction = 0.98  # the share of a known limit sent (a little under: no refusals from drift)
    burst: Seconds = 1.0  # the seconds of a rate its bucket holds (what may go at once)
    jitter: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = (
        0.25  # a 429's pause is its retry-after plus up to this share of it
    )
    max_refusals: PosInt = 8  # 429s one call may meet (each re-queued, no retry attempt used) before failing
    default_output_tokens: NonNegInt = 1_024  # reserved against an output-token limit when no cap is set
    weight: PosFloat = 1.0  # a session's share of the fair queue against the others (per session)


class LimitConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.11: ``[limits."<model or api_base>"]``, the limits of a key (per minute; None: learned)."""

    rpm: PosFloat | None = None
    tpm: PosFloat | None = None  # input and output tokens together (OpenAI)
    input_tpm: PosFloat | None = None  # (Anthropic)
    output_tpm: PosFloat | None = None
    max_concurrent: PosInt | None = None


class RuntimeConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §1.1."""

    dispatcher_threads: PosInt = 2
    tool_workers: PosInt = 16
    batch_size: PosInt = 64  # messages an actor handles before yielding its thread
    max_restarts: NonNegInt = 3  # 1.2: restart intensity of a session's supervisor ...
    max_restart_seconds: Seconds = 5.0  # ... within this many seconds, then it escalates
    # Where the runtime's own threads run: "auto" (one CPU, claimed among the processes of the host, on
    # Linux with a GIL and two CPUs or more), "off" (the OS decides) or a CPU number. See runtime.affinity.
    cpu: Literal["off", "auto"] | NonNegInt = "auto"


class AgentProfile(_Section, frozen=True, forbid_unknown_fields=True):
    """A sub-agent a session can delegate to (design §3.10): ``[agents.NAME]`` in the config file, or
    ``Runtime(agents=...)`` / ``start_session(agents=...)``.

    ``model`` None runs the child on its parent's model (and endpoint). ``tools``: ``"inherit"`` (the
    parent's tools, delegation aside), ``"builtin"``, ``"none"``, or a list of the parent's tool names.
    ``config`` holds per-session overrides for the child. ``delegate`` lets the child delegate in turn,
    as deep as ``subagents.max_depth`` allows.
    """

    description: str
    model: str | None = None
    system_prompt: str = ""
    tools: Literal["inherit", "builtin", "none"] | list[str] = "inherit"
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    delegate: bool = False


class SubagentsConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.10: the limits of delegation."""

    max_depth: PosInt = 1  # 1: a session's children cannot delegate further
    max_children_per_session: PosInt = 4  # children of one session running at once
    max_children: PosInt = 32  # children running at once in the runtime
    max_children_per_turn: PosInt = 16  # children one turn of a session may start
    max_total_children_per_session: PosInt = 64  # children a session may start (or has resumed) in a runtime
    timeout: Seconds = 1_800.0  # the most one delegation may take, its child's whole turn


class TelemetryConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """OpenTelemetry spans (design §7.5; see ``runtime.observability``)."""

    # auto: trace when an OpenTelemetry SDK's tracer provider is set when the runtime starts; on: always, on
    # the global provider; off: never
    tracing: Literal["auto", "on", "off"] = "auto"
    record_content: bool = False  # prompts, completions, tool arguments and results on spans (opt-in)
    # Models named in metric labels beyond the configured ones (admitted on their first successful call);
    # the rest are counted as "other", so clients' model names cannot grow /metrics without bound
    metrics_max_models: PosInt = 100


class McpServerConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """One MCP server (design §3.9): ``[mcp.servers.NAME]`` in the config file, or a session's ``mcp_servers``.

    Over stdio give ``command`` (and ``args``, ``env``, ``cwd``: default the session's workspace); over
    streamable HTTP give ``url`` (and ``headers``). Values of ``env`` and ``headers`` may name variables
    of the runtime's environment as ``${NAME}``, expanded when the server starts (and stored as written)
    if ``expand_env``. ``timeout`` bounds each call (default ``agent.tool_timeout``); ``tools`` keeps only
    the named tools.

    A server a client of ``agentcell serve`` gives is the client's, not the host's: the server sets
    ``expand_env`` off (the host's environment is never sent on a client's say-so) and ``public_only`` on
    unless ``server.mcp_allowed_urls`` names its host (its url is then reached only at public addresses,
    checked at every connection), whatever the client wrote.
    """

    command: str | None = None
    args: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    timeout: Seconds | None = None
    startup_timeout: Seconds | None = None  # None: mcp.startup_timeout
    require_approval: bool = False
    tools: list[str] | None = None
    enabled: bool = True
    expand_env: bool = True
    public_only: bool = False

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs either a command (stdio) or a url (streamable HTTP)")
        if self.command is not None and not self.command.strip():
            raise ValueError("an MCP server's command must not be empty")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"an MCP server's url must be http:// or https://, not {self.url[:60]!r}")

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


class McpConfig(_Section, frozen=True, forbid_unknown_fields=True):
    """design §3.9: MCP servers whose tools every session gets (each session runs its own connections),
    and how their failures are handled."""

    servers: dict[str, McpServerConfig] = msgspec.field(default_factory=dict)
    startup_timeout: Seconds = 30.0  # a server that has not listed its tools by then failed to start
    ping_timeout: Seconds = 5.0  # after a call timed out: a server that does not answer a ping is restarted
    restart_backoff: NonNegSeconds = 1.0  # after the 2nd failure in a row; doubling up to max_restart_backoff
    max_restart_backoff: NonNegSeconds = 60.0
    max_description_chars: PosInt = 2_000  # longer tool descriptions are cut

    def __post_init__(self) -> None:
        for name in self.servers:
            check_mcp_server_name(name)


MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,31}$")
"""An MCP server's name: it prefixes its tools' names (``NAME__tool``), so no ``__`` and at most 32 chars."""


def check_mcp_server_name(name: str) -> str:
    """``name`` if it is a valid MCP server name, else a ``ValueError`` saying what is allowed."""
    if not isinstance(name, str) or not MCP_SERVER_NAME.match(name) or name.endswith("_"):
        raise ValueError(
            f"invalid MCP server name {str(name)[:40]!r}: use 1-32 letters, digits, '-' or single '_' "
            "(its tools are named NAME__tool)"
        )
    return name


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
    gateway: GatewayConfig = msgspec.field(default_factory=GatewayConfig)
    capacity: CapacityConfig = msgspec.field(default_factory=CapacityConfig)
    limits: dict[str, LimitConfig] = msgspec.field(default_factory=dict)
    subagents: SubagentsConfig = msgspec.field(default_factory=SubagentsConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    agents: dict[str, AgentProfile] = msgspec.field(default_factory=dict)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)

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

    def for_session(self, overrides: Mapping[str, Any] | None) -> Config:
        """:meth:`with_overrides` for one session: refuses keys that only the runtime reads (a
        :class:`ConfigError` naming the key), since a session could not honour them."""
        if not overrides:
            return self
        expanded = _expand_dotted(overrides)
        for key in _setting_keys(expanded):
            if not _session_scoped(key):
                raise ConfigError(
                    f"invalid config: {key} is not a per-session setting (the runtime reads it once, for every "
                    f"session: set it in the runtime's config); per-session config takes "
                    f"{', '.join(sorted(k if '.' in k else k + '.*' for k in SESSION_KEYS))}"
                )
        return self.with_overrides(expanded)


SESSION_KEYS = frozenset(
    {
        "agent",
        "compaction",
        "models",
        "tokens",
        "tool_output.max_lines",
        "tool_output.max_bytes",
        "tool_output.max_chars",
        "tool_output.spill_threshold_chars",
        "tool_output.mode",
        "retry.request_timeout",
        "gateway.transport",
        "capacity.queue_timeout",
        "capacity.weight",
        "persistence.fsync",
        "runtime.max_restarts",
        "runtime.max_restart_seconds",
    }
)
"""What a session's own config may set: whole sections, or single keys. Everything else (the sessions
directory, the server, the bus, the runtime's threads, the gateway's retries...) is read once by the runtime."""


def _session_scoped(key: str) -> bool:
    return key in SESSION_KEYS or key.partition(".")[0] in SESSION_KEYS


def _setting_keys(data: Mapping[str, Any]) -> list[str]:
    """``section.key`` of every setting in nested ``data`` (a section given a plain value: its name)."""
    keys: list[str] = []
    for section, value in data.items():
        if isinstance(value, Mapping):
            keys.extend(f"{section}.{key}" for key in value)
        else:
            keys.append(section)
    return keys


def _expand_dotted(data: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    if depth >= MAX_DEPTH:
        raise ConfigError(f"invalid config: tables nested more than {MAX_DEPTH} levels deep")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"invalid config: keys must be strings, not {type(key).__name__} ({key!r})")
        target = out
        # Dots separate a section from its key; below that, a table's keys are names (a model's may hold dots).
        *head, last = key.split(".", max(0, 2 - depth))
        if depth + len(head) >= MAX_DEPTH:
            raise ConfigError(f"invalid config: {key[:100]}: nested more than {MAX_DEPTH} levels deep")
        for part in head:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(f"invalid config: {key}: {part!r} is set to a value and a table at once")
        if isinstance(value, Mapping):
            value = _expand_dotted(value, depth + len(head) + 1)
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
