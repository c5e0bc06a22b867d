"""Events broadcast on the bus (design §1.4, 3, 4.6, 5.10, 6; the contract: §7.6) as one msgspec tagged union.

Every event carries ``type`` (the tag), ``session_id``, ``seq`` (monotonic per session, stamped by the
bus when it is published) and ``ts`` (wall-clock seconds). Encode and decode with :func:`encode_event`
and :func:`decode_event`, which reuse one encoder and one decoder.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from runtime.messages import Usage

__all__ = [
    "EVENT_TYPES",
    "ActorRestarted",
    "AgentAbort",
    "AgentEnd",
    "AgentRecovered",
    "AgentStart",
    "AnyEvent",
    "ApprovalRequest",
    "ApprovalResponse",
    "Branched",
    "Calibration",
    "CompactionEnd",
    "CompactionFailed",
    "CompactionMode",
    "CompactionSkipped",
    "CompactionStart",
    "CompactionTrigger",
    "ErrorOccurred",
    "Event",
    "LogRecovered",
    "McpErrorKind",
    "McpServerFailed",
    "McpServerStarted",
    "MessageAppended",
    "MessageQueued",
    "ModelChanged",
    "PersistenceFailed",
    "ProviderRetry",
    "ReasoningDelta",
    "RequestAdmitted",
    "RequestQueued",
    "RequestStart",
    "SessionDead",
    "SessionHibernated",
    "SessionStarted",
    "SessionStopped",
    "StatusUpdate",
    "StreamReset",
    "StreamStalled",
    "SubscriberLagged",
    "TextDelta",
    "ToolCallDelta",
    "ToolExecutionEnd",
    "ToolExecutionStart",
    "ToolOutput",
    "ToolOutputsCleared",
    "ToolResultsArchived",
    "TurnEnd",
    "UsageOverflow",
    "UsageUpdate",
    "WindowLearned",
    "decode_event",
    "encode_event",
    "event_to_builtins",
]


CompactionTrigger = Literal["threshold", "overflow", "manual", "usage_overflow"]
CompactionMode = Literal["summarize", "hard_reset", "truncate"]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=False):
    session_id: str
    seq: int = 0
    ts: float = 0.0
    parent_session_id: str | None = None  # a sub-agent's event: the session that delegated to it ...
    parent_call_id: str | None = None  # ... and the tool call that did (design §3.10)

    @property
    def type(self) -> str:
        return type(self).__struct_config__.tag  # type: ignore[return-value]


# --- session lifecycle -------------------------------------------------------------------------------


class SessionStarted(Event, frozen=True, tag="session_started"):
    model: str
    context_window: int
    resumed: bool = False


class SessionStopped(Event, frozen=True, tag="session_stopped"):
    reason: str = "stopped"


class SessionHibernated(Event, frozen=True, tag="session_hibernated"):
    pass


class SessionDead(Event, frozen=True, tag="session_dead"):
    message: str


class ModelChanged(Event, frozen=True, tag="model_changed"):
    model: str
    context_window: int


class Branched(Event, frozen=True, tag="branched"):
    leaf_id: str | None


# --- agent loop (design §3) -----------------------------------------------------------------------------


class AgentStart(Event, frozen=True, tag="agent_start"):
    turn_id: str
    prompt_id: str | None = None


class RequestStart(Event, frozen=True, tag="request_start"):
    turn_id: str
    attempt: int
    model: str
    messages: int
    estimated_tokens: int
    transport: str | None = None  # the gateway transport the call goes over: litellm or openai_compat
    message_id: str | None = None  # the id the answer will have when it is appended


class RequestQueued(Event, frozen=True, tag="request_queued"):
    """The step's provider call waits for capacity of its pool (a provider key's limits, design §3.11):
    ``position`` in the pool's queue when it started waiting, ``estimated_wait`` in seconds (rough)."""

    turn_id: str | None
    pool: str
    position: int
    estimated_wait: float


class RequestAdmitted(Event, frozen=True, tag="request_admitted"):
    """The waiting call got its capacity after ``waited`` seconds and goes to the provider now."""

    turn_id: str | None
    pool: str
    waited: float


class TextDelta(Event, frozen=True, tag="text_delta"):
    turn_id: str
    delta: str


class ReasoningDelta(Event, frozen=True, tag="reasoning_delta"):
    turn_id: str
    delta: str


class ToolCallDelta(Event, frozen=True, tag="tool_call_delta"):
    turn_id: str
    index: int
    call_id: str | None
    name: str | None
    arguments_delta: str


class StreamReset(Event, frozen=True, tag="stream_reset"):
    """A provider attempt failed after it streamed, and the gateway retries: drop the partial text,
    reasoning and tool-call deltas this turn streamed since its last ``request_start`` (or ``stream_reset``).
    ``attempt`` is the failed attempt's number; the retry's answer will be appended as ``message_id``."""

    turn_id: str
    attempt: int
    message_id: str | None = None


class StreamStalled(Event, frozen=True, tag="stream_stalled"):
    turn_id: str
    seconds: float


class MessageAppended(Event, frozen=True, tag="message_appended"):
    """A message is in the log. ``preview``: the first characters of a prompt (a user message of no
    special kind), so a list of sessions can title each by its first prompt; None for the rest."""

    message_id: str
    role: str
    kind: str | None = None
    preview: str | None = None


PREVIEW_CHARS = 120
"""The most characters of a prompt a ``message_appended`` event carries (its ``preview``)."""


class ToolExecutionStart(Event, frozen=True, tag="tool_execution_start"):
    turn_id: str
    call_id: str
    name: str
    arguments: str


class ToolOutput(Event, frozen=True, tag="tool_output"):
    turn_id: str
    call_id: str
    chunk: str


class ToolExecutionEnd(Event, frozen=True, tag="tool_execution_end"):
    turn_id: str
    call_id: str
    name: str
    is_error: bool
    duration: float
    output_chars: int
    truncated: bool = False


class ApprovalRequest(Event, frozen=True, tag="approval_request"):
    turn_id: str
    call_id: str
    name: str
    arguments: str


class ApprovalResponse(Event, frozen=True, tag="approval_response"):
    call_id: str
    approved: bool
    reason: str | None = None


class TurnEnd(Event, frozen=True, tag="turn_end"):
    turn_id: str
    stop_reason: str
    usage: Usage = msgspec.field(default_factory=Usage)


class AgentEnd(Event, frozen=True, tag="agent_end"):
    turn_id: str
    status: Literal["ok", "aborted", "error"]
    usage: Usage = msgspec.field(default_factory=Usage)
    context_window: int = 0
    context_tokens: int = 0


class MessageQueued(Event, frozen=True, tag="message_queued"):
    prompt_id: str
    position: int
    steer: bool = False  # a steering message: applied at the running turn's next step boundary


class StatusUpdate(Event, frozen=True, tag="status_update"):
    """The agent's state changed: ``idle``, ``running``, ``streaming`` or ``executing_tools``."""

    state: str
    previous: str
    turn_id: str | None = None


class AgentAbort(Event, frozen=True, tag="agent_abort"):
    turn_id: str | None
    repaired_calls: int = 0


class AgentRecovered(Event, frozen=True, tag="agent_recovered"):
    messages: int
    repaired_calls: int = 0
    interrupted_turn: bool = False  # the log ended inside a turn (a crash cut it off)
    continued: bool = False  # ... and the restarted agent takes it up (else the log records it ended)


class ProviderRetry(Event, frozen=True, tag="provider_retry"):
    turn_id: str | None
    attempt: int
    max_attempts: int
    delay: float
    error: str
    status_code: int | None = None


class ErrorOccurred(Event, frozen=True, tag="error"):
    message: str
    code: str = "error"
    turn_id: str | None = None
    retryable: bool = False


# --- usage (design §4) ----------------------------------------------------------------------------------


class UsageUpdate(Event, frozen=True, tag="usage_update"):
    usage: Usage
    totals: Usage
    context_window: int
    context_tokens: int
    estimated: bool = False


class Calibration(Event, frozen=True, tag="calibration"):
    estimated_tokens: int
    actual_tokens: int
    error: float
    ratio: float


class UsageOverflow(Event, frozen=True, tag="usage_overflow"):
    input_tokens: int
    context_window: int


class WindowLearned(Event, frozen=True, tag="window_learned"):
    """The session's context window changed to what the provider stated (design §4.5): ``source`` is
    ``overflow`` (an error that named the limit) or ``server`` (the server's own model info)."""

    old: int
    new: int
    source: str
    model: str = ""


# --- compaction (design §5.10) --------------------------------------------------------------------------


class CompactionStart(Event, frozen=True, tag="compaction_start"):
    trigger: CompactionTrigger
    messages_before: int
    tokens_before: int


class CompactionEnd(Event, frozen=True, tag="compaction_end"):
    trigger: CompactionTrigger
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary_chars: int
    mode: CompactionMode
    fallback: bool = False


class CompactionFailed(Event, frozen=True, tag="compaction_failed"):
    error: str
    reason: str = "error"
    context_exceeded: bool = False
    tokens: int = 0
    window: int = 0
    trigger: CompactionTrigger | None = None


class CompactionSkipped(Event, frozen=True, tag="compaction_skipped"):
    """A compaction that had nothing to reduce: the history is too short to summarize
    (``reason`` ``nothing_to_compact``), or its summary would not have made it shorter (``no_progress``).
    The history is unchanged and the session goes on: not an error. ``tokens`` is the same full count a
    ``compaction_start`` before it reported; ``message`` says why, for a person."""

    reason: str
    message: str
    tokens: int = 0
    trigger: CompactionTrigger | None = None


class ToolResultsArchived(Event, frozen=True, tag="tool_results_archived"):
    archived: int
    strategy: str
    summary_chars: int


class ToolOutputsCleared(Event, frozen=True, tag="tool_outputs_cleared"):
    cleared: int
    tokens_freed: int


# --- bus and persistence -----------------------------------------------------------------------------


class SubscriberLagged(Event, frozen=True, tag="subscriber_lagged"):
    dropped: int


class LogRecovered(Event, frozen=True, tag="log_recovered"):
    """A session log or event transcript was repaired on opening: ``torn_bytes`` cut from its end (a line a
    crash cut short; or, for ``resume_session(repair="truncate")``, everything from the corrupt ``line`` on,
    kept in the file ``kept_in``)."""

    path: str
    torn_bytes: int
    line: int | None = None
    kept_in: str | None = None


class PersistenceFailed(Event, frozen=True, tag="persistence_error"):
    path: str
    error: str


class ActorRestarted(Event, frozen=True, tag="actor_restarted"):
    actor: str
    error: str
    restarts: int


# --- MCP servers (design §3.9) ---------------------------------------------------------------------------


class McpServerStarted(Event, frozen=True, tag="mcp_server_started"):
    """A session's MCP server is connected and listed its tools (``restarts``: connections before this)."""

    server: str
    transport: str  # stdio or http
    tools: list[str]  # the tools the model sees, NAME__tool
    restarts: int = 0


McpErrorKind = Literal["start_failed", "crashed", "unresponsive", "bad_result", "bad_tool"]


class McpServerFailed(Event, frozen=True, tag="mcp_server_error"):
    """A session's MCP server failed: it did not start, died or stopped answering (the connection is dropped
    and the server restarted on its next use, ``retry_in`` seconds from now at the earliest), answered
    with something that is not a valid result, or offered a tool the model cannot be given (``bad_tool``).
    The call it concerns (if any) gets an error result; the session goes on."""

    server: str
    kind: McpErrorKind
    message: str
    tool: str | None = None
    call_id: str | None = None
    retry_in: float | None = None


AnyEvent = (
    SessionStarted
    | SessionStopped
    | SessionHibernated
    | SessionDead
    | StatusUpdate
    | ModelChanged
    | Branched
    | AgentStart
    | RequestStart
    | RequestQueued
    | RequestAdmitted
    | TextDelta
    | ReasoningDelta
    | ToolCallDelta
    | StreamReset
    | StreamStalled
    | MessageAppended
    | ToolExecutionStart
    | ToolOutput
    | ToolExecutionEnd
    | ApprovalRequest
    | ApprovalResponse
    | TurnEnd
    | AgentEnd
    | MessageQueued
    | AgentAbort
    | AgentRecovered
    | ProviderRetry
    | ErrorOccurred
    | UsageUpdate
    | Calibration
    | UsageOverflow
    | WindowLearned
    | CompactionStart
    | CompactionEnd
    | CompactionFailed
    | CompactionSkipped
    | ToolResultsArchived
    | ToolOutputsCleared
    | SubscriberLagged
    | LogRecovered
    | PersistenceFailed
    | ActorRestarted
    | McpServerStarted
    | McpServerFailed
)

EVENT_TYPES: frozenset[str] = frozenset(str(cls.__struct_config__.tag) for cls in AnyEvent.__args__)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event:
    ev: Event = _decoder.decode(data)
    return ev


def event_to_builtins(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out
