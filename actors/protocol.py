"""The protocol of a session's actors: every message they exchange, and every reply, declared once.

A session is five actors (store, usage tracker, overflow detector, compactor, agent; see
:mod:`actors.session`) and the runtime that talks to them. This module is their whole vocabulary, so a
reader sees in one place what each actor understands and what it answers, and mypy checks the data flow:

* A message that is answered subclasses :class:`Ask` with the type of its answer: ``GetContext`` is an
  ``Ask[ContextView]``. :meth:`actors._base.SessionActor.call` and :meth:`actors.session.Session.ask`
  take an ``Ask[R]`` and hand its continuation (or return) an ``R``, so a continuation that expects
  the wrong reply is a type error, not a crash at run time.
* A message that only informs (``RecordResponse``, ``SetModel``) is a plain frozen Struct, sent with
  ``tell``.
* What each actor takes is one union here (:data:`AgentMessage`, :data:`CompactorMessage`,
  :data:`StoreMessage`, :data:`UsageMessage`, :data:`OverflowMessage`), and a sender holds the actor's ref
  as a :class:`runtime.actor.Ref` of it (:class:`actors.wiring.SessionRefs`): a ``tell``, ``ask`` or
  ``call`` of a message the actor does not take is a type error. Each actor's ``on_receive`` matches its
  union, plus :class:`actors._base.Reply` and the messages it sends itself.
* :class:`SetModel` is the one model switch: the session tells it to every actor that cares.

Only what crosses from one actor to another is here. The messages an actor sends itself (a provider's
answer coming back from the I/O loop, the log opened on the writer thread) stay private to its module.

Every message is a frozen :class:`msgspec.Struct`, matched by type in ``on_receive``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeAlias, TypeVar

import msgspec

from runtime.context.estimate import ContextStats
from runtime.events import CompactionMode, CompactionTrigger, OverflowCause
from runtime.handles import CompactionResult, Handle, PromptHandle, TurnResult
from runtime.messages import Message, Usage
from runtime.store.entries import CompactionEntry, Entry, StepEntry
from runtime.store.tree import SessionTree

if TYPE_CHECKING:  # field types only: msgspec never resolves them (these messages are not encoded)
    from typing import Self

    from runtime.actor import Ref
    from runtime.gateway import ProviderError
    from runtime.tokens import TokenCounter

__all__ = [
    "Abort",
    "AgentMessage",
    "AgentStatus",
    "Append",
    "Ask",
    "Asking",
    "Branch",
    "Calibration",
    "CheckUsage",
    "ClassifyError",
    "Compact",
    "CompactorJob",
    "CompactorMessage",
    "ContextView",
    "CountRatioLearned",
    "GetCalibration",
    "GetContext",
    "GetContextStats",
    "GetMessages",
    "GetState",
    "GetTotals",
    "GetTree",
    "MaybeArchiveTools",
    "MaybeCompact",
    "MessagesView",
    "Outcome",
    "OverflowMessage",
    "Overlay",
    "Prompt",
    "RecordCompaction",
    "RecordResponse",
    "RecordSpend",
    "RecordStep",
    "ReplyTo",
    "Reset",
    "Restore",
    "SetMetadata",
    "SetModel",
    "SetVisibility",
    "StoreMessage",
    "Stored",
    "SyncTurn",
    "TurnOptions",
    "UsageMessage",
    "UsageOverflowed",
    "Verdict",
]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
Q_co = TypeVar("Q_co", covariant=True)


class Ask(msgspec.Struct, Generic[R], frozen=True):
    """A message answered with an ``R``: subclass ``Ask[TheReply]``.

    The type parameter is for the type checker only; at run time an ``Ask`` is an ordinary message.
    """

    if TYPE_CHECKING:  # what :class:`Asking` reads; nothing at run time

        def _reply(self) -> R: ...

        def _message(self) -> Self: ...


class Asking(Protocol[R_co, Q_co]):
    """An :class:`Ask` seen twice by the type checker: answered with an ``R_co``, and a ``Q_co`` (its own
    class). ``SessionActor.call(target: Ref[Q], message: Asking[R, Q], ...)`` so checks both that the
    target takes the message and that the continuation takes its reply, with no intersection types."""

    def _reply(self) -> R_co: ...

    def _message(self) -> Q_co: ...


ReplyTo: TypeAlias = "Ref[R] | Callable[[R], Any] | None"
"""Where a store sends its answer (an ``R``) instead of answering the ask: an actor that takes it (told
it), or a function."""


# -- the whole session ------------------------------------------------------------------------------------


class SetModel(msgspec.Struct, frozen=True):
    """The session switched models. Every actor that depends on the model takes what it needs: the agent
    and the compactor the model, window and counter; the usage tracker the same (it looks the window up
    when ``context_window`` is None); the overflow detector the window; the store records the model."""

    model: str
    context_window: int | None = None
    counter: TokenCounter | None = None  # the new model's token counter (None: keep counting as before)


class GetContextStats(Ask[ContextStats], frozen=True):
    """Ask the session for its context breakdown (design §4.6): the store's view measured with the usage
    tracker's calibration. Answered by the session itself, which asks both."""


# -- the agent --------------------------------------------------------------------------------------------


class TurnOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What a client that keeps part of a turn on its side (the Responses API front door) asks of a run.

    ``client_tools``: function tools the client runs itself (OpenAI ``function`` schemas). The model sees
    them beside the session's own tools; a step whose calls include them runs the session's own calls,
    then ends the run with the client's calls pending (:attr:`TurnResult.awaiting`). Their results come
    back as ``tool`` messages in the next prompt's :attr:`Prompt.lead`, and the thread goes on from them.
    ``instructions``: this run's system prompt (None: the session's). ``compaction``: False turns automatic
    compaction off for the run: a context that does not fit is then an error.

    What the client asks of each model request of the run (issue 40): ``max_output_tokens`` caps each
    answer (the smaller of it and the runtime's own cap, :meth:`answer_cap`); ``parallel_tool_calls``
    False asks the model for at most one tool call a step; ``reasoning_effort`` and ``verbosity`` go to the
    model as such (:meth:`extra`: litellm maps them for the providers that take them).
    """

    client_tools: tuple[dict[str, Any], ...] = ()
    instructions: str | None = None
    compaction: bool = True
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    reasoning_effort: str | None = None
    verbosity: str | None = None

    def answer_cap(self, runtime_cap: int | None) -> int | None:
        """A request's ``max_tokens``: the runtime's own cap (the room the window leaves, the output
        limits), within the client's ``max_output_tokens``."""
        if self.max_output_tokens is None:
            return runtime_cap
        return self.max_output_tokens if runtime_cap is None else min(runtime_cap, self.max_output_tokens)

    def extra(self, *, tools: bool) -> dict[str, Any]:
        """The request parameters the client set beyond the cap (``CompletionRequest.extra``); ``tools``:
        whether the request offers tools (``parallel_tool_calls`` goes only with them)."""
        out: dict[str, Any] = {}
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        if self.verbosity is not None:
            out["verbosity"] = self.verbosity
        if not self.parallel_tool_calls and tools:
            out["parallel_tool_calls"] = False
        return out

    @property
    def client_tool_names(self) -> frozenset[str]:
        return frozenset(str(t.get("function", {}).get("name", "")) for t in self.client_tools)


class Prompt(msgspec.Struct, frozen=True):
    """A user message. ``steer``: while a turn runs, apply it at the turn's next step boundary (after the
    running tools' results) instead of queueing it for the next turn.

    ``lead``: messages recorded before ``message``, in order: the history a client sends along, or the
    results (``tool`` messages) of the client tool calls the previous run stopped for; ``message`` may then
    be the last of those results. ``options``: see :class:`TurnOptions`.
    """

    message: Message
    handle: PromptHandle
    steer: bool = False
    lead: tuple[Message, ...] = ()
    options: TurnOptions | None = None

    @property
    def inputs(self) -> tuple[Message, ...]:
        """Everything the prompt records, in order."""
        return (*self.lead, self.message) if self.lead else (self.message,)

    def undelivered(self, why: str) -> None:
        """The agent stopped (e.g. restarted after a failure) before it took this prompt up: say so."""
        self.handle.set_result(
            TurnResult(
                prompt_id=self.handle.id,
                status="error",
                error=f"the prompt was never run: the session's agent was restarted first ({why}); send it again",
            )
        )


class Abort(msgspec.Struct, frozen=True):
    """Stop the running turn; ``handle`` resolves to whether one was running."""

    handle: Handle[bool] | None = None

    def undelivered(self, why: str) -> None:
        """The agent stopped before it took this abort up: no turn of it is running any more."""
        if self.handle is not None:
            self.handle.set_result(False)


class AgentStatus(msgspec.Struct, frozen=True):
    """What :class:`GetState` answers: the agent's state, how many prompts wait, the model it uses."""

    state: str
    queued: int
    model: str


class GetState(Ask[AgentStatus], frozen=True):
    """Ask the agent for its :class:`AgentStatus`."""


class UsageOverflowed(msgspec.Struct, frozen=True):
    """Told to :attr:`CheckUsage.notify` when the input tokens filled the context window."""

    input_tokens: int


# -- the session store ------------------------------------------------------------------------------------


class ContextView(msgspec.Struct, frozen=True, kw_only=True):
    """What the model sees of the session, as of the store's latest command.

    ``messages[usage_floor:]`` were appended after the latest compaction: provider usage from before
    that point must be ignored (design §4.2). ``estimated_tokens`` comes from the store's estimator and is
    0 when it has none.
    """

    session_id: str
    leaf_id: str | None
    messages: tuple[Message, ...]
    usage_floor: int = 0
    latest_compaction: CompactionEntry | None = None
    model: str | None = None
    estimated_tokens: int = 0
    dead: str | None = None  # why the session is dead (design §5.8), or None
    turn_ended_at: str | None = None  # the newest message when the latest turn ended without an answer
    spent: Usage | None = None  # what the session paid for, as its log records it (SessionTree.spent)
    steps: tuple[StepEntry, ...] = ()  # the newest turn's step records (design §3.12)


class MessagesView(msgspec.Struct, frozen=True, kw_only=True):
    """What a user sees of the session: the path, overlays applied, summaries as markers.

    ``messages`` is the part the store keeps in memory (design §2.2); the ``before`` messages of the path
    that come first are in the log, read back by :mod:`runtime.store.history`. ``history`` names the
    store's history: pages read back under one name stay valid while it is the same.
    """

    session_id: str
    leaf_id: str | None
    messages: tuple[Message, ...]
    before: int = 0
    history: str = ""

    @property
    def total(self) -> int:
        """Messages of the whole path."""
        return self.before + len(self.messages)


class Stored(msgspec.Struct, frozen=True):
    """A write was done (``error is None``) or failed. ``entries`` are what it recorded; ``view`` the
    model-facing view after it, when the command asked for one (``Append(with_view=True)``)."""

    session_id: str
    entries: tuple[Entry, ...] = ()
    error: str | None = None
    view: ContextView | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Append(Ask[Stored], frozen=True):
    """Append one message or several (in order) to the leaf, or as children of ``parent_id``.

    With ``with_view`` the reply also carries the model-facing view right after the append
    (:attr:`Stored.view`): what an agent sends next, without asking for it in a second round trip.
    ``end_turn`` makes the log durable right after, as :class:`SyncTurn` does, for a turn's last message
    (the reply still comes once the append is written, not after the fsync). ``steps``: step records
    written just before the messages, in the same write (a turn's start with its prompt, design §3.12).
    """

    messages: tuple[Message, ...] | Message
    parent_id: str | None = None
    reply_to: ReplyTo[Stored] = None
    with_view: bool = False
    end_turn: bool = False
    steps: tuple[StepEntry, ...] = ()


class RecordSpend(Ask[Stored], frozen=True):
    """Record what a compaction that wrote no summary spent (design §4.1): added to the session's unlogged
    spend (:data:`~runtime.store.tree.SPEND_KEY`, a metadata entry, not a node: it moves no leaf), which the
    next compaction's summary carries."""

    usage: Usage
    reply_to: ReplyTo[Stored] = None


class RecordCompaction(Ask[Stored], frozen=True, kw_only=True):
    """Record a compaction at the leaf (see :meth:`SessionTree.record_compaction`); its summary's usage
    also carries the session's unlogged spend (:class:`RecordSpend`), which it clears."""

    summary: Message
    first_kept_id: str | None
    tokens_before: int = 0
    tokens_after: int = 0
    mode: CompactionMode = "summarize"
    trigger: CompactionTrigger = "threshold"
    artifacts: tuple[str, ...] = ()
    cause: OverflowCause | None = None  # an overflow compaction's (its events say it too)
    reply_to: ReplyTo[Stored] = None


class Overlay(Ask[Stored], frozen=True):
    """Replace messages of the path by id in the views (archived or cleared tool results)."""

    replacements: tuple[Message, ...]
    reply_to: ReplyTo[Stored] = None


class SetVisibility(Ask[Stored], frozen=True, kw_only=True):
    """Show or hide messages of the path, by id, to the model (``agent_visible``) or the user
    (``user_visible``); ``None`` leaves a flag as it is. The log records the ids only, not the messages:
    ``SetVisibility(message_ids=(prompt.id,), agent_visible=False)`` hides a prompt of any size for the
    cost of a line."""

    message_ids: tuple[str, ...]
    agent_visible: bool | None = None
    user_visible: bool | None = None
    reply_to: ReplyTo[Stored] = None


class Branch(Ask[Stored], frozen=True):
    """Move the leaf to ``leaf_id`` (``None``: before the first message)."""

    leaf_id: str | None
    reply_to: ReplyTo[Stored] = None


class SetMetadata(Ask[Stored], frozen=True):
    """Record a session setting, e.g. ``SetMetadata("model", "gpt-4o")``."""

    key: str
    value: Any
    reply_to: ReplyTo[Stored] = None


class SyncTurn(Ask[Stored], frozen=True):
    """A turn ended: make the log durable under the ``turn`` policy. ``ended`` records that the turn ended
    at the current leaf (an error or an abort, with no final answer to say so), so a restart does not take
    it for a turn cut off by a crash."""

    reply_to: ReplyTo[Stored] = None
    ended: bool = False


class RecordStep(Ask[Stored], frozen=True):
    """Record a step of a turn before its effect (design §3.12): acknowledged once it is written."""

    step: StepEntry
    reply_to: ReplyTo[Stored] = None


class GetContext(Ask[ContextView], frozen=True):
    """Ask for the model-facing view: answered with a :class:`ContextView`."""

    reply_to: ReplyTo[ContextView] = None


class GetMessages(Ask[MessagesView], frozen=True):
    """Ask for the user's view: answered with a :class:`MessagesView`."""

    reply_to: ReplyTo[MessagesView] = None


class GetTree(Ask[SessionTree], frozen=True):
    """Ask for a copy of the whole tree: answered with a :class:`SessionTree` the caller owns."""

    reply_to: ReplyTo[SessionTree] = None


# -- the usage tracker ------------------------------------------------------------------------------------


class RecordResponse(Ask[None], frozen=True):
    """A provider response arrived. ``estimated_input`` is the estimate made before the call (for
    calibration); None or 0 when there was none. Answered once its ``usage_update`` is published (the agent
    ends the turn only then: the turn's last event is its ``agent_end``)."""

    message: Message
    estimated_input: int | None = None


class Reset(msgspec.Struct, frozen=True):
    """The context was compacted: earlier usage no longer describes it. ``context_tokens`` is the
    compacted context's estimated size, when known."""

    context_tokens: int | None = None


class Restore(msgspec.Struct, frozen=True):
    """Rebuild the usage state after a restart: the totals are ``spent`` (what the log records the session
    paid for, :attr:`ContextView.spent`; None: the sum over ``messages``), the last prompt size is read from
    ``messages`` (the model's view). ``read=False``: the log could not be read; keep what is known. A tracker
    started for a session with a history answers queries only after it (design §4.1)."""

    messages: tuple[Message, ...]
    spent: Usage | None = None
    read: bool = True


class GetTotals(Ask[Usage], frozen=True):
    """Ask: the session's cumulative :class:`Usage`."""


class Calibration(msgspec.Struct, frozen=True):
    """``ratio``: actual to estimated tokens over past calls; ``last_error``: the last estimate's relative
    error. Both None before the first calibrated call."""

    ratio: float | None
    last_error: float | None


class GetCalibration(Ask[Calibration], frozen=True):
    """Ask: how the estimates have compared with actual input tokens, as a :class:`Calibration`."""


# -- the overflow detector --------------------------------------------------------------------------------


class Verdict(msgspec.Struct, frozen=True):
    """What to do about a failed provider call: compact and retry it, or fail the turn with ``message``."""

    action: Literal["compact_and_retry", "fail"]
    message: str
    code: str = "provider_error"
    overflow: bool = False
    retryable: bool = False
    learned_window: int | None = None  # the smaller window the error stated (the detector took it already)


class ClassifyError(Ask[Verdict], frozen=True):
    """Ask for the :class:`Verdict` on a provider error, given the turn's recoveries so far."""

    error: ProviderError
    recoveries_this_turn: int = 0
    estimated_tokens: int | None = None


class CheckUsage(Ask[bool], frozen=True):
    """Did a response's input fill the window (a silent overflow, design §6.2)? An ``ask`` gets a bool.

    Sent with ``tell`` and a ``notify`` ref, it is answered only when the answer is yes, with
    :class:`UsageOverflowed`: a turn's usual "no" costs no reply at all.
    """

    input_tokens: int
    notify: Ref[UsageOverflowed] | None = None


# -- the compactor ----------------------------------------------------------------------------------------


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to MaybeCompact / Compact: the context to send next and what happened."""

    messages: tuple[Message, ...] = ()
    estimate: int = 0
    attempted: bool = False
    compacted: bool = False
    dead: bool = False
    message: str | None = None
    skipped: bool = False  # nothing to reduce (``compaction_skipped``): no failure
    messages_before: int = 0
    tokens_before: int = 0  # the full count the compaction's events report
    summary_chars: int = 0
    fallback: bool = False


class MaybeCompact(Ask[Outcome], frozen=True):
    """Compact if the estimate reached the threshold (design §5.1), at most once per turn (5.11).
    ``count_ratio``: the session's learned server count ÷ ours (design §4.5), for the summarizer's request
    when it is the session's own model; None: what the compactor was last told, or its default."""

    trigger: CompactionTrigger = "threshold"
    attempted: bool = False
    count_ratio: float | None = None


class Compact(Ask[Outcome], frozen=True):
    """Compact now: manual (5.12) or emergency (6.3), with the overflow's ``cause`` (the events carry it);
    ``count_ratio`` as for :class:`MaybeCompact`."""

    trigger: CompactionTrigger = "manual"
    emergency: bool = False
    keep_recent_tokens: int | None = None
    instructions: str | None = None
    handle: Handle[CompactionResult] | None = None
    cause: OverflowCause | None = None
    count_ratio: float | None = None

    def undelivered(self, why: str) -> None:
        """The compactor stopped before it took this compaction up: it did nothing."""
        if self.handle is not None:
            self.handle.set_result(CompactionResult(compacted=False, reason=f"not run: {why}; ask again"))


class CountRatioLearned(msgspec.Struct, frozen=True):
    """The session's replies taught it a new ``ratio`` of its server's prompt count to ours for ``model``
    (design §4.5), told by the agent as it learns it: the compactor's summarizer requests to the session's
    own model keep that margin, a manual compaction's included."""

    model: str
    ratio: float


class MaybeArchiveTools(Ask[ContextView | None], frozen=True):
    """Archive old tool results when there are more than ``tool_call_cutoff`` (5.9). Answered with the
    view the next request can be made from when the context is as it was, or None when this changed it."""


# -- what each actor takes ------------------------------------------------------------------------------
# Besides these, every actor takes its calls' replies (:class:`actors._base.Reply`) and the messages it
# sends itself (private to its module). tests/session/test_protocol.py checks each union against the
# actor's ``on_receive``.

AgentMessage: TypeAlias = Prompt | Abort | SetModel | GetState | UsageOverflowed
CompactorJob: TypeAlias = MaybeCompact | Compact | MaybeArchiveTools  # the compactor's jobs, in turn
CompactorMessage: TypeAlias = CompactorJob | SetModel | CountRatioLearned
StoreMessage: TypeAlias = (
    GetContext
    | Append
    | SyncTurn
    | RecordStep
    | RecordCompaction
    | RecordSpend
    | Overlay
    | SetVisibility
    | Branch
    | SetMetadata
    | SetModel
    | GetMessages
    | GetTree
)
UsageMessage: TypeAlias = RecordResponse | SetModel | Reset | Restore | GetTotals | GetCalibration
OverflowMessage: TypeAlias = ClassifyError | CheckUsage | SetModel
