"""What the turn machine asks its driver to do (effects), and what the driver tells it back (design §3.1).

The machine (:class:`runtime.turn.TurnMachine`) never performs anything: each of its methods returns a
list of what it says (:data:`Said`), in the order it must be performed. An event
(:class:`runtime.events.Event`) is said as it is: publish it. The effects below are the rest; most are done
and forgotten (:class:`Resolve` a prompt's handle, :class:`SyncTurn`). The last effect of a list may be an
:class:`Awaited` one (:class:`Persist`, :class:`CallModel`, :class:`RunTools`, ...): the machine waits for
its answer, which the driver hands to :meth:`TurnMachine.answer` with the effect's ``ticket``. An answer
whose ticket is not the one awaited (a late answer of an aborted turn) is dropped there.

The answers are the collaborators' own values, read through the small protocols at the end of this module
(a store's ``Stored`` and ``ContextView``, a compactor's ``Outcome``, a detector's ``Verdict``, a gateway's
``CompletionResult``), or :class:`Failed` when the collaborator could not answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from runtime.context.caching import Breakpoints
from runtime.events import CompactionTrigger, Event, OverflowCause
from runtime.handles import TurnResult
from runtime.messages import Message, ToolCallPart, Usage
from runtime.store.entries import StepEntry

if TYPE_CHECKING:
    from runtime.turn.state import Handover, PromptLike

__all__ = [
    "Abandon",
    "ArchiveTools",
    "Awaited",
    "CallModel",
    "CancelApprovals",
    "CancelIO",
    "Classify",
    "Compact",
    "CompletionLike",
    "Effect",
    "ErrorLike",
    "Failed",
    "Hide",
    "LearnCountRatio",
    "LearnWindow",
    "ModelReply",
    "OutcomeLike",
    "Overlay",
    "Persist",
    "PublishBestEffort",
    "ReadContext",
    "RecordAnswer",
    "RecordStep",
    "RefreshTools",
    "Reject",
    "RequestSpec",
    "Resolve",
    "ResolveAbort",
    "RestoreUsage",
    "Resumed",
    "Route",
    "Routed",
    "RunTools",
    "Said",
    "SaveOutput",
    "StoredLike",
    "SyncTurn",
    "TakeHandover",
    "ToolResultLike",
    "VerdictLike",
    "ViewLike",
]


class Effect(msgspec.Struct, frozen=True):
    """Something the driver does for the machine."""


Said = Effect | Event
"""What the machine says: an event to publish, or an effect."""


class Awaited(Effect, frozen=True, kw_only=True):
    """An effect whose answer the machine waits for: hand it to ``TurnMachine.answer(ticket, value)``.

    ``ticket`` is set by the machine; an answer with another ticket is a late one and is dropped.
    """

    ticket: int = 0


# -- done and forgotten ------------------------------------------------------------------------------------


class PublishBestEffort(Effect, frozen=True):
    """Publish ``event`` on the bus, ignoring a failure to: the bus may be gone (a stopping session). (Any
    other event is said as it is, no effect around it.)"""

    event: Event


class Resolve(Effect, frozen=True):
    """Answer ``prompt``'s handle with ``result``."""

    prompt: PromptLike
    result: TurnResult


class Reject(Effect, frozen=True):
    """Fail ``prompt``'s handle with a ``RuntimeError(reason)`` (a queued prompt lost to a crash)."""

    prompt: PromptLike
    reason: str


class ResolveAbort(Effect, frozen=True):
    """Answer an abort's handle: whether a turn was running."""

    handle: Any
    value: bool


class SaveOutput(Effect, frozen=True):
    """Write ``data`` to ``path`` (a clipped tool result's full text) off the actor's thread; a failure is a
    ``persistence_failed`` event, not the turn's end."""

    path: str
    data: bytes


class LearnWindow(Effect, frozen=True):
    """The provider stated a smaller context ``window``: tell the session's other actors, keep it for its
    restarts and its endpoint. (The machine took it already and publishes ``window_learned``.)"""

    window: int
    model: str


class LearnCountRatio(Effect, frozen=True):
    """A reply taught the session a higher ``ratio`` of its server's prompt count to ours for ``model``
    (design §4.5): tell the compactor, whose summarizer requests keep the same margin."""

    ratio: float
    model: str


class SyncTurn(Effect, frozen=True):
    """Make the log durable at the turn's end; ``ended``: the log records that the turn ended here (no
    final answer says so). Nothing to do while the store is not running."""

    ended: bool


class RecordStep(Effect, frozen=True):
    """Record a step of the turn in the log before its effect (design §3.12): told to the store, not
    waited for (a request or a compaction the log does not show is made again, which does no harm).
    Nothing to do while the store is not running."""

    record: StepEntry


class Resumed(Effect, frozen=True):
    """The restarted agent took up a turn its process stopped in (``handle``: the handle the runtime hands
    out under the original prompt id), or there is none to take up (None)."""

    handle: Any


class CancelIO(Effect, frozen=True):
    """Cancel the turn's provider call and its running tools, if any."""


class CancelApprovals(Effect, frozen=True):
    """Answer every approval request of the session still open with a denial (``reason``)."""

    reason: str


class RestoreUsage(Effect, frozen=True):
    """Rebuild the usage tracker's state after a restart: its totals are ``spent`` (what the log records the
    session paid for, every branch, compactions included), its last prompt size read from ``messages``;
    ``read=False``: the log could not be read (the tracker stops waiting for this and keeps what it has)."""

    messages: tuple[Message, ...]
    spent: Usage | None = None
    read: bool = True


class Abandon(Effect, frozen=True):
    """Answer every prompt of ``handover`` with an error (``reason``) and end its run for subscribers (its
    ``error`` and ``agent_end``): nobody takes it up."""

    handover: Handover
    reason: str


# -- awaited -------------------------------------------------------------------------------------------------


class TakeHandover(Awaited, frozen=True):
    """Hand over what a crashed predecessor left (a :class:`Handover`, or None), and forget it."""


class Persist(Awaited, frozen=True, kw_only=True):
    """Append ``messages`` to the session's log. Answer: the store's ``Stored`` (:class:`StoredLike`).

    ``with_view``: the answer carries the model's view after the append. ``end_turn``: make the log durable
    right after (a turn's last message). ``steps``: step records written with them. ``optional``: the turn is ending; with no store running, answer
    :class:`Failed` at once instead of failing the actor.
    """

    messages: tuple[Message, ...]
    with_view: bool = False
    end_turn: bool = False
    optional: bool = False
    steps: tuple[StepEntry, ...] = ()  # step records written with the messages (a turn's start)


class ReadContext(Awaited, frozen=True, kw_only=True):
    """Read the model's view of the session. Answer: a :class:`ViewLike` (the store's ``ContextView``).
    ``optional`` as for :class:`Persist`."""

    optional: bool = False


class Overlay(Awaited, frozen=True):
    """Replace ``messages`` (by id) in the views: tool results clipped harder. Answer: ``Stored``."""

    messages: tuple[Message, ...]


class Hide(Awaited, frozen=True):
    """Hide messages (by id) from the model; they stay on record. Answer: ``Stored``."""

    message_ids: tuple[str, ...]


class Compact(Awaited, frozen=True, kw_only=True):
    """Compact the session: ``emergency`` (an overflow's, forced, with its ``cause``) or only when due
    (``MaybeCompact``). ``count_ratio``: the session's learned server count ÷ ours, for the summarizer's
    request (design §4.5). Answer: the compactor's ``Outcome`` (:class:`OutcomeLike`)."""

    trigger: CompactionTrigger
    emergency: bool = False
    cause: OverflowCause | None = None
    count_ratio: float = 1.0


class ArchiveTools(Awaited, frozen=True):
    """Archive old tool results when there are too many (design §5.9). Answer: the view the next request
    can be made from, or None when the archiving changed the context."""


class Classify(Awaited, frozen=True, kw_only=True):
    """Ask the overflow detector for its verdict on a provider ``error``. Answer: a :class:`VerdictLike`."""

    error: Any
    recoveries_this_turn: int
    estimated_tokens: int


class RecordAnswer(Awaited, frozen=True, kw_only=True):
    """The provider's answer: record its usage (the usage tracker answers once its ``usage_update`` is
    out), ask whether it overflowed silently (``check_usage``; a yes comes back later as
    :meth:`TurnMachine.usage_overflowed`) and append it (``end_turn``: the turn's last message). Answer:
    None once both are done, or the first :class:`Failed`."""

    message: Message
    estimated_input: int
    check_usage: bool
    end_turn: bool


class RefreshTools(Awaited, frozen=True):
    """Start the session's MCP servers and list their tools when they need it (design §3.9), then answer
    None (at once when nothing needs refreshing)."""


class RequestSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the machine decides of a provider request; the driver adds the session's endpoint, key,
    timeouts and transport. ``first``: the turn's first request (its admission priority).
    ``cache``: the prompt-cache breakpoints (:func:`runtime.context.caching.place_breakpoints`)."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    max_tokens: int | None
    estimated_tokens: int
    wait_budget: float
    first: bool
    cache: Breakpoints | None = None  # where its cached prefixes end (None: prompt caching is off)
    extra: dict[str, Any] = msgspec.field(default_factory=dict)  # the client's request options
    one_call: bool = False  # the client allows one tool call (the stream shows the first call only)


class Route(Awaited, frozen=True):
    """Say where ``request`` goes (``request_id``: the call's id, its ``request_start``'s ``message_id``).
    Answer (at once): a :class:`Routed`."""

    request: RequestSpec
    request_id: str = ""


class Routed(msgspec.Struct, frozen=True, kw_only=True):
    """Where a request goes, as its ``request_start`` says: the gateway ``transport``, litellm's ``provider``,
    and the endpoint's ``server_address`` and ``server_port`` (a session with an ``api_base``)."""

    transport: str
    provider: str | None = None
    server_address: str | None = None
    server_port: int | None = None


class CallModel(Awaited, frozen=True, kw_only=True):
    """Send the request last routed. Answer: a :class:`ModelReply`. While it waits for capacity, tell the
    machine :meth:`~TurnMachine.queued` and :meth:`~TurnMachine.admitted` with this ticket."""

    request: RequestSpec
    turn_id: str
    message_id: str


class RunTools(Awaited, frozen=True):
    """Run ``calls`` (in parallel, with the session's limits and approval; each call's start recorded in
    the log as step ``step``'s, design §3.12). Answer: their results, one per call (:class:`ToolResultLike`)."""

    calls: tuple[ToolCallPart, ...]
    turn_id: str
    step: int


# -- answers -------------------------------------------------------------------------------------------------


class Failed(msgspec.Struct, frozen=True):
    """A collaborator could not answer: ``message`` says why, ``cause`` is its exception (an ``OSError``:
    the log could not be written)."""

    message: str
    cause: BaseException | None = None


class ModelReply(msgspec.Struct, frozen=True):
    """The answer to :class:`CallModel`: the gateway's result, and the id the answer gets (a new one when an
    attempt that streamed was retried)."""

    result: CompletionLike
    message_id: str


class ViewLike(Protocol):
    """The model's view of the session, as the store answers it."""

    @property
    def messages(self) -> tuple[Message, ...]: ...
    @property
    def dead(self) -> str | None: ...
    @property
    def turn_ended_at(self) -> str | None: ...
    @property
    def steps(self) -> tuple[StepEntry, ...]: ...
    @property
    def spent(self) -> Usage | None: ...


class StoredLike(Protocol):
    """A write's answer."""

    @property
    def ok(self) -> bool: ...
    @property
    def view(self) -> Any: ...  # a ViewLike when asked for


class OutcomeLike(Protocol):
    """A compaction's answer."""

    @property
    def messages(self) -> tuple[Message, ...]: ...
    @property
    def estimate(self) -> int: ...
    @property
    def compacted(self) -> bool: ...
    @property
    def dead(self) -> bool: ...
    @property
    def message(self) -> str | None: ...


class VerdictLike(Protocol):
    """The overflow detector's verdict on a failed call."""

    @property
    def action(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def code(self) -> str: ...
    @property
    def overflow(self) -> bool: ...
    @property
    def retryable(self) -> bool: ...
    @property
    def learned_window(self) -> int | None: ...


class ErrorLike(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def status_code(self) -> int | None: ...


class CompletionLike(Protocol):
    """The gateway's result of a call."""

    @property
    def message(self) -> Message | None: ...
    @property
    def error(self) -> ErrorLike | None: ...
    @property
    def waited(self) -> float: ...
    @property
    def attempts(self) -> int: ...
    @property
    def pool(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def latency(self) -> float: ...


class ToolResultLike(Protocol):
    """One tool call's outcome."""

    @property
    def message(self) -> Message: ...
