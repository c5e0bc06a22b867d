"""Events broadcast on the bus (design §1.4, 3, 4.6, 5.10, 6; the contract: §7.6) as one msgspec tagged union.

Every event carries ``type`` (the tag), ``session_id``, ``seq`` (monotonic per session, stamped by the
bus when it is published) and ``ts`` (wall-clock seconds). Encode and decode with :func:`encode_event`
and :func:`decode_event`, which reuse one encoder and one decoder.

**An event is declared once**, as a subclass of :class:`Event` in this module::

    class CacheBreak(Event, frozen=True, tag="cache_break"):
        # its docstring: what happened, for whoever reads the stream
        turn_id: str
        tokens: int = 0  # a field added later comes with a default: old readers keep working

The class is the event's type, its fields, its wire name (``tag``) and its documentation; what else the
runtime must know of it is a class attribute with a default (:attr:`Event.opens_transcript`,
:attr:`Event.fragment`). Everything else is derived from the declarations: :data:`EVENTS` (in order),
:data:`EVENT_TYPES`, :data:`FRAGMENT_TYPES`, the :data:`AnyEvent` union the decoders read, this module's
``__all__``, the names ``runtime`` exports (and the README's list of them), the transcript's rule, the
dashboard's stream, the metrics' subscription (which counts the events it has a rule for:
``runtime/observability/metrics.py``) and the spans' (the OpenTelemetry spans are made from the events
they have a rule for, at the events' timestamps: ``runtime/observability/tracing.py``). What a span or a
metric needs of an event is a field of it. A new event is then its declaration plus its behaviour (who
publishes it, who reacts to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

import msgspec

from runtime.messages import Usage

_API = [
    "EVENTS",
    "EVENT_TYPES",
    "FRAGMENT_TYPES",
    "AnyEvent",
    "CompactionMode",
    "CompactionTrigger",
    "OverflowCause",
    "Event",
    "McpErrorKind",
    "decode_event",
    "encode_event",
    "event_to_builtins",
]
"""What this module defines besides the event classes (``__all__`` adds those, at the end)."""

_declared: list[type[Event]] = []


CompactionTrigger = Literal["threshold", "overflow", "manual", "usage_overflow"]
OverflowCause = Literal["refused", "counted"]
"""Why a compaction with trigger ``overflow`` ran (design §6.3, §5.13): ``refused``, the provider refused
the request as over its context window (the request is sent again after it); ``counted``, the runtime
counted the next request over the limit (window − reserve) and compacted before sending it."""
CompactionMode = Literal["summarize", "hard_reset", "truncate"]


# gc=False: an event never references itself (frozen data, from the wire or a publisher), and one that the
# garbage collector counts (msgspec's structs are counted as they are made, even those it then leaves alone)
# sets it going: a cluster front decoding a thousand sessions' deltas ran a full collection of its heap
# (0.1-0.5 s, while the shards stream on) every few seconds.
class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=False, gc=False):
    session_id: str
    seq: int = 0
    ts: float = 0.0
    parent_session_id: str | None = None  # a sub-agent's event: the session that delegated to it ...
    parent_call_id: str | None = None  # ... and the tool call that did (design §3.10)

    opens_transcript: ClassVar[bool] = True
    """Whether this event, as a session's first worth keeping, opens its event transcript (design §2.3).
    False for a session's comings and goings: a session that only starts and stops writes no transcript.
    Once a session's transcript is open, every event of it is kept."""

    fragment: ClassVar[bool] = False
    """A piece of something streamed (text, reasoning, tool-call arguments, a tool's output), many a
    second: whoever follows what happened rather than its text leaves these out (the dashboard's stream)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:  # declared here: one of the events (see the module's docstring)
            _declared.append(cls)

    @property
    def type(self) -> str:
        return type(self).__struct_config__.tag  # type: ignore[return-value]

    @classmethod
    def wire_name(cls) -> str:
        """The event's ``type`` on the wire (its tag)."""
        return str(cls.__struct_config__.tag)


# --- session lifecycle -------------------------------------------------------------------------------


class SessionStarted(Event, frozen=True, tag="session_started"):
    """A session is hosted: started (``start_session``), or resumed from its log (``resume_session``,
    ``resumed``), with ``model`` and its ``context_window`` in tokens. A session started and never used gets
    it rebuilt from its header (seq 1) when its transcript opens later (design §2.3)."""

    opens_transcript = False

    model: str
    context_window: int
    resumed: bool = False


class SessionStopped(Event, frozen=True, tag="session_stopped"):
    """The session is no longer hosted: ``stop_session``, or the runtime stopping (one for each session it
    hosts). A running turn ended ``aborted`` before it. ``reason`` is ``stopped``."""

    opens_transcript = False

    reason: str = "stopped"


class SessionHibernated(Event, frozen=True, tag="session_hibernated"):
    """The session parked its actors (idle for ``persistence.hibernate_after`` seconds, or ``hibernate()``):
    its state is its log, and its next use starts them again (design §8)."""

    opens_transcript = False


class SessionDead(Event, frozen=True, tag="session_dead"):
    """The session is dead, as a turn finds it or leaves it: a ``hard_reset`` compaction could not bring its
    context under the window (design §5.8). ``message`` says why; the turn ends with the error
    ``session_dead``. A manual compaction that succeeds revives the session."""

    message: str


class ModelChanged(Event, frozen=True, tag="model_changed"):
    """``set_model`` switched the session to ``model``, whose window is ``context_window`` tokens; the log
    records it, and the next request goes to it."""

    model: str
    context_window: int


class Branched(Event, frozen=True, tag="branched"):
    """``branch`` moved the session's leaf to the message ``leaf_id`` (None: before the first message): the
    next message goes under it, and nothing is removed (design §2.2)."""

    leaf_id: str | None


# --- agent loop (design §3) -----------------------------------------------------------------------------


class AgentStart(Event, frozen=True, tag="agent_start"):
    """A turn begins, for a prompt (at once, or when it leaves the queue) or for a turn a crash cut off that
    is taken up (``turn_resumed`` follows, design §3.12). ``turn_id`` names the turn in every event of it;
    ``prompt_id`` is the id of the handle (or the HTTP ``prompt_id``) its result answers; ``model`` the model
    it starts with (empty from a runtime before it was added). Its last event is its ``agent_end``."""

    turn_id: str
    prompt_id: str | None = None
    model: str = ""


class RequestStart(Event, frozen=True, tag="request_start"):
    """The turn sends a step's request to the model. ``attempt``: the step's number in the turn (its n-th
    model request, from 1; a retry of the same request is ``provider_retry``); ``messages``: the messages it
    carries; ``estimated_tokens``: the runtime's count of it (design §4.2); ``transport``: the gateway
    transport it goes over; ``message_id``: the id its answer will be appended with (it names the call in
    its ``request_failed``, whatever a ``stream_reset`` renames the answer to); ``provider``: litellm's name
    of the provider; ``max_tokens``: the answer's cap sent with it; ``server_address`` and ``server_port``:
    the endpoint of a session with an ``api_base``. Waiting for capacity (``request_queued``) comes after
    it. Its end is its ``turn_end`` (answered), ``request_failed``, or the turn's end (cancelled)."""

    turn_id: str
    attempt: int
    model: str
    messages: int
    estimated_tokens: int
    transport: str | None = None  # the gateway transport the call goes over: litellm or openai_compat
    message_id: str | None = None  # the id the answer will have when it is appended
    provider: str | None = None
    max_tokens: int | None = None
    server_address: str | None = None
    server_port: int | None = None


class RequestFailed(Event, frozen=True, tag="request_failed"):
    """A provider call failed for good (its retries spent, or an error no retry helps; not a cancelled
    one): a turn's step (``turn_id``, ``request_id`` its ``request_start``'s ``message_id``) or a summarizer's
    (``turn_id`` None, ``request_id`` its ``summary_request``'s). ``kind``: the error's kind
    (``rate_limit``, ``transient``, ``timeout``, ``auth``, ``context_overflow``, ...), ``message`` its text,
    ``status_code`` the HTTP status if any, ``attempts`` the attempts made, ``transport`` the one it went
    over (empty if it never started), ``latency`` the seconds from its start to its failure, ``pool`` and
    ``waited`` the capacity pool it went through and the seconds it waited (design §3.11). What follows a
    turn's is the turn's: an overflow's compaction, or its ``error``."""

    turn_id: str | None
    request_id: str | None
    kind: str
    message: str
    status_code: int | None = None
    attempts: int = 1
    transport: str | None = None
    pool: str | None = None
    waited: float = 0.0
    latency: float = 0.0


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
    """A piece of the answer's text as the model streams it (``delta``). ``stream_reset`` voids the pieces of
    an attempt that failed."""

    fragment = True

    turn_id: str
    delta: str


class ReasoningDelta(Event, frozen=True, tag="reasoning_delta"):
    """A piece of the model's reasoning as it streams (``delta``), for models that show it (design §3.3)."""

    fragment = True

    turn_id: str
    delta: str


class ToolCallDelta(Event, frozen=True, tag="tool_call_delta"):
    """A piece of a tool call as the model streams it: ``index`` is the call's place in the answer,
    ``call_id`` and ``name`` come with its first piece (None after), ``arguments_delta`` is a piece of its
    JSON arguments."""

    fragment = True

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
    """The model's stream has sent nothing for ``seconds`` (``agent.stream_stall_seconds``): said once a
    silence; the call goes on (its own limits, ``retry.stall_timeout``, decide whether to give up and
    retry)."""

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
    """A tool worker takes a call up (before its approval, if it needs one): ``call_id``, the tool's ``name``
    and its ``arguments`` as the model wrote them (JSON)."""

    turn_id: str
    call_id: str
    name: str
    arguments: str


class ToolOutput(Event, frozen=True, tag="tool_output"):
    """A piece of a tool's output as it runs (``chunk``; a shell command's, as it prints), before its
    result."""

    fragment = True

    turn_id: str
    call_id: str
    chunk: str


class ToolExecutionEnd(Event, frozen=True, tag="tool_execution_end"):
    """A tool call has its result: ``is_error`` (a failure, a denial, a time-out), ``duration`` in seconds,
    ``output_chars`` the characters of the result the model gets, ``truncated`` when the output was cut to the
    limits (the rest saved for ``read_saved``, design §3.5), ``error`` the kind of a failed call's error
    (``tool_error``, ``timeout``, ``denied``, ``aborted``, ...; None when it did not fail). Its
    ``message_appended`` follows once the step's results are in the log."""

    turn_id: str
    call_id: str
    name: str
    is_error: bool
    duration: float
    output_chars: int
    truncated: bool = False
    error: str | None = None


class ApprovalRequest(Event, frozen=True, tag="approval_request"):
    """A tool call waits for approval (``require_approval``, or an ``approval`` hook): the hook is asked, or,
    without one, a client answers with ``approve(session, call_id, ...)`` (denied after 300 s). ``name`` and
    ``arguments`` are the call's."""

    turn_id: str
    call_id: str
    name: str
    arguments: str


class ApprovalResponse(Event, frozen=True, tag="approval_response"):
    """The answer to an ``approval_request``: ``approved``, and why not (``reason``: the hook's words, a
    failing hook, or the time-out). A denied call's result says so to the model."""

    call_id: str
    approved: bool
    reason: str | None = None


class TurnEnd(Event, frozen=True, tag="turn_end"):
    """A step's model response is complete (not the turn: that is ``agent_end``): its ``stop_reason``
    (``stop``, ``tool_calls``, ``length``, ...) and that response's ``usage``; ``attempts`` the provider
    attempts it took (retries included), ``latency`` the seconds from the call's start to its answer (the
    event comes once the answer is recorded), ``pool`` and ``waited`` the capacity pool it went through and
    the seconds it waited for it (design §3.11)."""

    turn_id: str
    stop_reason: str
    usage: Usage = msgspec.field(default_factory=Usage)
    attempts: int = 1
    pool: str | None = None
    waited: float = 0.0
    latency: float = 0.0


class AgentEnd(Event, frozen=True, tag="agent_end"):
    """The turn is over, the last of its events: ``status`` ``ok``, ``aborted`` or ``error`` (an ``error``
    event before it says why), ``usage`` the turn's own (every step, design §4.1), ``context_window`` and
    ``context_tokens`` (the context after its last response), ``steps`` its model requests. Its handle
    resolves once it is queued to every subscriber."""

    turn_id: str
    status: Literal["ok", "aborted", "error"]
    usage: Usage = msgspec.field(default_factory=Usage)
    context_window: int = 0
    context_tokens: int = 0
    steps: int = 0


class MessageQueued(Event, frozen=True, tag="message_queued"):
    """A prompt arrived while a turn runs: it waits in the queue at ``position`` (from 1) and runs as a turn
    of its own, or, with ``steer``, it is handed to the running turn at its next step boundary (``position``
    among the steering messages)."""

    prompt_id: str
    position: int
    steer: bool = False  # a steering message: applied at the running turn's next step boundary


class StatusUpdate(Event, frozen=True, tag="status_update"):
    """The agent's state changed: ``idle``, ``running``, ``streaming`` or ``executing_tools``."""

    state: str
    previous: str
    turn_id: str | None = None


class AgentAbort(Event, frozen=True, tag="agent_abort"):
    """The turn was aborted (``abort``, a client, or the parent of a sub-agent): ``repaired_calls`` tool calls
    left without a result got one saying so (design §3.6). Its ``agent_end`` (``aborted``) follows."""

    turn_id: str | None
    repaired_calls: int = 0


class AgentRecovered(Event, frozen=True, tag="agent_recovered"):
    """The session's agent started from the log (after a crash of it or of the session, or a resume):
    ``messages`` in the model's view, ``repaired_calls`` results given to calls that had none,
    ``interrupted_turn`` when the log ended inside a turn, ``continued`` when that turn is taken up (else the
    log records it ended, design §3.12)."""

    messages: int
    repaired_calls: int = 0
    interrupted_turn: bool = False  # the log ended inside a turn (a crash cut it off)
    continued: bool = False  # ... and the restarted agent takes it up (else the log records it ended)


class TurnResumed(Event, frozen=True, tag="turn_resumed"):
    """A turn cut off by a crash is taken up (design §3.12), after its ``agent_start``: ``resume_from`` is
    its last recorded step (``prompt``, ``request``, ``compaction``, ``answer``, ``tool_started``,
    ``tool_result``), ``step`` the model requests it had made, ``process`` the process taking it up
    (``host:pid``); ``rerun_calls`` tool calls run again (or for the first time), ``unknown_calls`` given
    a result saying their outcome is unknown. Its ``agent_end`` follows as for any turn."""

    turn_id: str
    prompt_id: str | None = None
    resume_from: str = "prompt"
    step: int = 0
    process: str = ""
    rerun_calls: int = 0
    unknown_calls: int = 0


class ProviderRetry(Event, frozen=True, tag="provider_retry"):
    """A model call failed in a way worth retrying (a 429, a 5xx, a reset, a stall) and is tried again after
    ``delay`` seconds: ``attempt`` is the failed attempt (from 1) of ``max_attempts``, ``error``, ``kind`` (the
    error's kind: ``rate_limit``, ``transient``, ...) and ``status_code`` say how it failed (design §3.7).
    ``turn_id`` is None for a summarizer's call, which ``request_id`` names (its ``summary_request``'s)."""

    turn_id: str | None
    attempt: int
    max_attempts: int
    delay: float
    error: str
    status_code: int | None = None
    kind: str = ""
    request_id: str | None = None


class ErrorOccurred(Event, frozen=True, tag="error"):
    """Something failed in the session (its wire name is ``error``): ``message`` for a person, ``code`` for a
    program (``rate_limited``, ``max_steps``, ``context_overflow_after_compaction``, ``session_dead``,
    ``persistence_failed``, ``agent_crashed``, ``session_crashed``, ``store_open``, ``recovery``,
    ``internal``, or the provider error's kind), ``turn_id`` when a turn ends with it (its ``agent_end``
    follows), ``retryable`` when sending the prompt again may succeed."""

    message: str
    code: str = "error"
    turn_id: str | None = None
    retryable: bool = False


# --- usage (design §4) ----------------------------------------------------------------------------------


class UsageUpdate(Event, frozen=True, tag="usage_update"):
    """The session's usage after a response (the agent's or a summarizer's), a compaction or a model switch:
    ``usage`` that response's (empty for the other two), ``totals`` the session's so far, ``context_window``,
    and ``context_tokens`` the context's size now (the last response's input tokens; ``estimated`` when it is
    the runtime's count instead, after a compaction, design §4.6)."""

    usage: Usage
    totals: Usage
    context_window: int
    context_tokens: int
    estimated: bool = False


class Calibration(Event, frozen=True, tag="calibration"):
    """A response's input tokens against the runtime's estimate of its request (design §4.4):
    ``estimated_tokens``, ``actual_tokens``, ``error`` ((estimated - actual) / actual) and ``ratio``, the
    calibration the session's counts use from now on (1.0 while unknown)."""

    estimated_tokens: int
    actual_tokens: int
    error: float
    ratio: float


class CacheBreak(Event, frozen=True, tag="cache_break"):
    """A response read much less of its prompt from the provider's cache than the prefix it shares with the
    previous request (design §4.7: under half of that request's ``expected_tokens``), once the provider has
    been seen caching in the session. ``cause``: ``model_switch``, ``system_prompt``, ``tools``,
    ``compaction`` (the history before the previous request's end was rewritten: a compaction or a tool
    archive), or ``unknown`` (the prefix was unchanged: an entry expired or was evicted)."""

    cause: str
    expected_tokens: int
    cached_tokens: int
    model: str = ""
    turn_id: str | None = None


class UsageOverflow(Event, frozen=True, tag="usage_overflow"):
    """A response reported more input tokens (``input_tokens``) than the session's ``context_window``: the
    provider cut the context silently (design §6.2). A compaction (trigger ``usage_overflow``) follows."""

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
    """A compaction begins (design §5.10): its ``trigger`` (``threshold``, ``overflow``, ``manual``,
    ``usage_overflow``), ``messages_before`` in the model's view and ``tokens_before``, a full count of the
    request the context would make, in ``mode`` (``compaction.mode``). An ``overflow`` compaction's ``cause``
    says whether the provider refused the request (``refused``) or the runtime counted it over the limit
    before sending it (``counted``); None for the other triggers (and from runtimes older than the field).
    Its summarizer calls (``summary_request``) come next; ``compaction_end``, ``compaction_failed`` or
    ``compaction_skipped`` follows, with the same ``trigger`` and ``cause``."""

    trigger: CompactionTrigger
    messages_before: int
    tokens_before: int
    mode: CompactionMode = "summarize"
    cause: OverflowCause | None = None


class SummaryRequest(Event, frozen=True, tag="summary_request"):
    """A compaction (``purpose`` ``summary``) or a tool archive (``tool_summary``, design §5.9) asks the
    summarizer ``model`` for a summary: ``request_id`` names the call in its ``summary_response`` (or
    ``request_failed``) and ``provider_retry`` events; ``max_tokens``, ``server_address`` and
    ``server_port`` as a ``request_start`` says them; ``count_ratio`` the server's count ÷ ours a compaction's
    request was sized at (design §4.5: learned, else the model's default; None for a tool archive's)."""

    request_id: str
    purpose: str
    model: str
    max_tokens: int | None = None
    server_address: str | None = None
    server_port: int | None = None
    count_ratio: float | None = None


class SummaryResponse(Event, frozen=True, tag="summary_response"):
    """The summarizer answered the ``summary_request`` ``request_id``: its ``stop_reason``, ``usage``,
    ``attempts`` (retries included), the ``transport`` it went over, ``latency`` the seconds from its start
    to its answer, and the capacity ``pool`` and seconds ``waited`` (design §3.11). A call that failed ends in ``request_failed`` instead; one cut short by the
    compaction's end, in nothing."""

    request_id: str
    stop_reason: str
    usage: Usage = msgspec.field(default_factory=Usage)
    attempts: int = 1
    transport: str | None = None
    pool: str | None = None
    waited: float = 0.0
    latency: float = 0.0


class CompactionEnd(Event, frozen=True, tag="compaction_end"):
    """A compaction is done and in the log: the model's view went from ``messages_before`` to
    ``messages_after`` messages and from ``tokens_before`` to ``tokens_after`` tokens, with a summary of
    ``summary_chars`` characters, in ``mode`` (``summarize``, ``hard_reset``, ``truncate``); ``fallback`` when
    a deterministic summary stood in for a summarizer that failed (design §5.5); ``trigger`` and ``cause`` as
    its ``compaction_start`` said."""

    trigger: CompactionTrigger
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    summary_chars: int
    mode: CompactionMode
    fallback: bool = False
    cause: OverflowCause | None = None


class CompactionFailed(Event, frozen=True, tag="compaction_failed"):
    """A compaction failed and the conversation is unchanged: ``error`` for a person, ``reason`` for a program
    (``summarizer_failed``, ``no_progress``, ``store_error``, ``interrupted``, ...), ``context_exceeded`` when
    it could not get under the window (the session is marked dead, ``session_dead``), ``tokens`` the context's
    count before it, ``window`` the session's, ``trigger`` and ``cause`` as its ``compaction_start`` said (or
    would have: one that failed before it started has none), ``messages`` in the model's view before it,
    ``mode`` the compaction's."""

    error: str
    reason: str = "error"
    context_exceeded: bool = False
    tokens: int = 0
    window: int = 0
    trigger: CompactionTrigger | None = None
    messages: int = 0
    mode: CompactionMode | None = None
    cause: OverflowCause | None = None


class CompactionSkipped(Event, frozen=True, tag="compaction_skipped"):
    """A compaction that had nothing to reduce: the history is too short to summarize
    (``reason`` ``nothing_to_compact``), or its summary would not have made it shorter (``no_progress``).
    The history is unchanged and the session goes on: not an error. ``tokens`` is the same full count a
    ``compaction_start`` before it reported (a manual compaction with nothing to compact has none);
    ``message`` says why, for a person; ``messages`` in the model's view, ``mode`` the compaction's;
    ``trigger`` and ``cause`` as that ``compaction_start`` said."""

    reason: str
    message: str
    tokens: int = 0
    trigger: CompactionTrigger | None = None
    messages: int = 0
    mode: CompactionMode | None = None
    cause: OverflowCause | None = None


class ToolResultsArchived(Event, frozen=True, tag="tool_results_archived"):
    """Old tool steps were archived (design §5.9): ``archived`` results are hidden from the model and one
    ``tool_summary`` message of ``summary_chars`` characters stands in for them, written by ``strategy``
    (``llm`` or ``heuristic``). They stay in the log and the user's view."""

    archived: int
    strategy: str
    summary_chars: int


class ToolOutputsCleared(Event, frozen=True, tag="tool_outputs_cleared"):
    """Old tool outputs were replaced by a placeholder in the model's view
    (``compaction.clear_old_tool_outputs``, design §5.9): ``cleared`` results, ``tokens_freed`` tokens."""

    cleared: int
    tokens_freed: int


# --- bus and persistence -----------------------------------------------------------------------------


class SubscriberLagged(Event, frozen=True, tag="subscriber_lagged"):
    """Told to one subscriber only, before its next event of the session: its queue was full and it lost the
    ``dropped`` oldest of this session's events (design §1.4). Publishers never wait for a reader."""

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
    """A write failed (its wire name is ``persistence_error``): the session's log (the turn that wrote ends
    with ``persistence_failed``), its event transcript, or the sessions index. ``path`` is the file, ``error``
    the system's error; the session refuses new prompts, naming them, until a write beside its log succeeds
    again (design §9)."""

    path: str
    error: str


class ActorRestarted(Event, frozen=True, tag="actor_restarted"):
    """One of the session's actors crashed and its supervisor restarted it, with those started after it
    (design §1.2): ``actor`` (``store``, ``usage``, ``overflow``, ``compactor``, ``agent``), ``error`` (the
    exception, or ``stopped``), ``restarts`` within the intensity window."""

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


EVENTS: tuple[type[Event], ...] = tuple(_declared)
"""Every event type, in the order declared above."""

EVENT_TYPES: frozenset[str] = frozenset(cls.wire_name() for cls in EVENTS)
"""Every event's wire name."""

FRAGMENT_TYPES: frozenset[str] = frozenset(cls.wire_name() for cls in EVENTS if cls.fragment)
"""The wire names of the events that are pieces of something streamed (:attr:`Event.fragment`)."""

if TYPE_CHECKING:
    AnyEvent = Event  # (type checkers: any event is an Event)
else:
    AnyEvent = Union[EVENTS]  # noqa: UP007  (built from a tuple: the tagged union msgspec decodes)

if not TYPE_CHECKING:  # (type checkers take every public name defined here for an export, as they should)
    __all__ = sorted([*_API, *(cls.__name__ for cls in EVENTS)])

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
