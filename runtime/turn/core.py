"""The turn machine's core (design §3.1): its state, the pump that runs its flows, how a flow says what to
do, and the end of a turn.

A flow is a generator: it yields the effects it waits for (:class:`~runtime.turn.effects.Awaited`) and
receives their answers, and says the others (events, step records, a prompt's result) as it goes, into the
outbox the machine's call returns, in order. The pump runs the flow up to the effect it waits for next and
gives that effect a ticket; an answer with another ticket (a late answer of an aborted turn) is dropped. A
collaborator that could not answer (:class:`~runtime.turn.effects.Failed`, raised by
:meth:`MachineCore._ask`) ends the turn. :mod:`runtime.turn.recovery` adds the recovery flows, and
:mod:`runtime.turn.machine` the inputs and a turn's own flows (:class:`~runtime.turn.machine.TurnMachine`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import msgspec

from runtime import events as ev
from runtime.context.caching import CacheWatch
from runtime.context.estimate import CountRatio, effective_limit
from runtime.context.integrity import repair_tool_calls
from runtime.durable import step_record
from runtime.handles import TurnResult
from runtime.messages import Message, ToolCallPart
from runtime.turn import fit
from runtime.turn.effects import (
    Awaited,
    Effect,
    Failed,
    Persist,
    PublishBestEffort,
    ReadContext,
    RecordStep,
    Resolve,
    ResolveAbort,
    Said,
    SyncTurn,
    ViewLike,
)
from runtime.turn.state import TRANSITIONS, AgentState, IllegalTransition, PromptLike, TurnState

if TYPE_CHECKING:
    from runtime.config import Config
    from runtime.events import CompactionTrigger
    from runtime.store.entries import StepKind

__all__ = ["CounterLike", "Flow", "MachineCore", "MeasureLike", "SpecLike", "ToolsLike"]

Flow = Generator[Awaited, Any, None]
"""A flow: yields the effects it waits for and receives their answers (it says the others with ``_emit``)."""

T = TypeVar("T")
_Step = Generator[Awaited, Any, T]


class ToolsLike(Protocol):
    """The session's tool registry (it is replaced whole when its MCP servers' tools arrive)."""

    def __contains__(self, name: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def names(self) -> list[str]: ...
    def schemas(self) -> list[dict[str, Any]]: ...
    def get(self, name: str) -> _ToolLike | None: ...


class _ToolLike(Protocol):
    @property
    def idempotent(self) -> bool: ...


class SpecLike(Protocol):
    """What the machine reads of the session's definition (``actors.wiring.SessionSpec``)."""

    @property
    def session_id(self) -> str: ...
    @property
    def system_prompt(self) -> str: ...
    @property
    def config(self) -> Config: ...
    @property
    def tools(self) -> ToolsLike: ...
    @property
    def mcp(self) -> object | None: ...  # its MCP servers (None: it has none, nothing to refresh)


class CounterLike(Protocol):
    """The model's token counter (``runtime.tokens.TokenCounter``)."""

    def count_message(self, message: Message) -> int: ...
    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int: ...


class _EstimateLike(Protocol):
    @property
    def tokens(self) -> int: ...
    @property
    def anchored_tokens(self) -> int: ...


class MeasureLike(Protocol):
    """The session's context estimate (``actors.compactor.SessionEstimate``)."""

    @property
    def fixed_tokens(self) -> int: ...
    def __call__(self, view: Any) -> _EstimateLike: ...


class _IOFailed(Exception):
    """A collaborator a turn needs could not answer: the turn ends (raised inside a flow)."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.message)
        self.failed = failed


class MachineCore(ABC):
    """The state of one session's turns and the pump that runs their flows (see the module's docstring).
    The machine is :class:`~runtime.turn.machine.TurnMachine`, documented there."""

    def __init__(
        self,
        spec: SpecLike,
        *,
        counter: CounterLike,
        measure: MeasureLike,
        model: str,
        context_window: int,
        spill_dir: Path,
        recovering: bool = False,
        count_ratio: float | None = None,
    ) -> None:
        self.spec = spec
        self.session_id = spec.session_id
        self.counter = counter
        self.measure = measure
        self.model = model
        self.context_window = context_window
        self.spill_dir = spill_dir
        self.state = AgentState.IDLE
        self.queue: list[PromptLike] = []
        self.steering: list[PromptLike] = []  # steering messages for the running turn's next step boundary
        self.run: TurnState | None = None
        self.context_tokens = 0
        # A pending reason to compact before the next request (e.g. usage_overflow), across turns.
        self.pending_trigger: CompactionTrigger | None = None
        self.cache_watch = CacheWatch()  # design §4.7: a response that broke the cached prefix
        # the server's prompt count ÷ ours, learned from replies: the answer cap's margin (design §4.5)
        # (``count_ratio``: what the session learned before its agent restarted)
        self.count_ratio = CountRatio(fit.default_count_ratio(model, spec.config), learned=count_ratio)
        self._busy_with_recovery = recovering
        self._flow: Flow | None = None
        self._ticket = 0
        self._awaited: Awaited | None = None
        self._out: list[Said] = []  # what the call in progress says, in order (see _take)

    # -- the answers, and the pump ---------------------------------------------------------------------------
    def answer(self, ticket: int, value: Any) -> list[Said]:
        """The answer to the awaited effect ``ticket`` (a value, or :class:`Failed`). A late one is dropped."""
        if ticket != self._ticket or self._awaited is None:
            return []
        self._awaited = None
        return self._pump(value)

    def expects(self, ticket: int) -> bool:
        """Whether ``ticket`` is the effect the machine waits for."""
        return self._awaited is not None and ticket == self._ticket

    def _begin(self, flow: Flow) -> list[Said]:
        self._flow = flow
        return self._pump(None)

    def _pump(self, value: Any) -> list[Said]:
        """Run the flow up to the effect it waits for next, and return what it said meanwhile (that effect
        last). A flow that ends lets the next queued prompt in; one whose collaborator failed (:meth:`_ask`)
        ends the turn."""
        flow = self._flow
        while flow is not None:
            try:
                awaited = flow.send(value)
            except StopIteration:
                flow = self._flow = None
                self._busy_with_recovery = False
                if self.state is AgentState.IDLE and self.queue:
                    flow = self._flow = self._turn(self.queue.pop(0))
                value = None
                continue
            except _IOFailed as failure:
                flow = self._flow = self._failed(failure.failed)
                value = None
                continue
            self._ticket += 1
            self._awaited = awaited = msgspec.structs.replace(awaited, ticket=self._ticket)
            self._out.append(awaited)
            break
        return self._take()

    def _take(self) -> list[Said]:
        """The effects said since the last call, in order; the outbox starts empty again (the same list: one
        that lived on while the session waits would be work for the garbage collector)."""
        out = self._out.copy()
        self._out.clear()
        return out

    # -- saying what to do -----------------------------------------------------------------------------------
    def _emit(self, effect: Effect) -> None:
        """Say ``effect``, which nobody waits for (a flow yields only what it waits for)."""
        self._out.append(effect)

    def _publish(self, event: ev.Event) -> None:
        """Say ``event``: the driver publishes it as it is (no effect wraps it)."""
        self._out.append(event)

    def _record(self, run: TurnState, kind: StepKind, **fields: str | int) -> None:
        """Record a step of ``run`` in the log before its effect (design §3.12)."""
        self._out.append(RecordStep(step_record(run.turn_id, kind, **fields)))

    def _enter(self, state: AgentState, turn_id: str | None = None) -> None:
        previous = self.state
        if state is previous:
            return
        if state not in TRANSITIONS[previous]:
            raise IllegalTransition(f"agent: {previous} → {state} is not a transition of the state machine")
        self.state = state
        turn = turn_id or (self.run.turn_id if self.run is not None else None)
        self._publish(
            ev.StatusUpdate(
                session_id=self.session_id, state=str(state), previous=str(previous), turn_id=turn
            )
        )

    @staticmethod
    def _ask(effect: Awaited) -> _Step[Any]:
        """Yield ``effect`` and return its answer; a :class:`Failed` one ends the turn (see :meth:`_failed`)."""
        value = yield effect
        if isinstance(value, Failed):
            raise _IOFailed(value)
        return value

    def _failed(self, failed: Failed) -> Flow:
        """A collaborator the turn needs could not answer (:meth:`_ask`): end the turn. A log that cannot be
        written is ``persistence_failed`` (what was acknowledged before is kept), anything else ``internal``."""
        if isinstance(failed.cause, OSError):
            message = (
                f"persistence_failed: the session's log could not be written ({failed.cause}); the turn ends "
                "here, and what was acknowledged before is kept"
            )
            yield from self._finish("error", message, code="persistence_failed")
            return
        yield from self._finish("error", f"session actor unavailable: {failed.message}", code="internal")

    def _limit(self) -> int:
        return effective_limit(self.context_window, self.spec.config.compaction) or self.context_window

    # -- the end of a turn -----------------------------------------------------------------------------------
    def _finish(
        self,
        status: Literal["ok", "aborted", "error"],
        error: str | None = None,
        *,
        code: str = "error",
        retryable: bool = False,
        repair: bool = False,
        abort_handle: Any = None,
    ) -> Flow:
        """End the turn: orphaned calls get results (``repair``), the log is made durable, the events and
        the prompt's result go out, and steering that found no step boundary waits as the next turn."""
        run = self.run
        assert run is not None
        self.run = None  # late answers of this turn are dropped from here on, and an abort finds no turn
        repaired = 0
        if repair:
            view = yield ReadContext(optional=True)
            if not isinstance(view, Failed):
                repairs = repair_tool_calls(view.messages)
                if repairs:
                    yield Persist(messages=tuple(repairs), optional=True)
                    repaired = len(repairs)
        if status == "aborted":
            self._publish(
                ev.AgentAbort(session_id=self.session_id, turn_id=run.turn_id, repaired_calls=repaired)
            )
        elif status == "error":
            self._publish(
                ev.ErrorOccurred(
                    session_id=self.session_id,
                    message=error or "error",
                    code=code,
                    turn_id=run.turn_id,
                    retryable=retryable,
                )
            )
        if not (status == "ok" and run.synced):  # (a turn that waits for the client ends there too)
            self._emit(SyncTurn(ended=status != "ok" or bool(run.awaiting)))
        self._enter(AgentState.IDLE, run.turn_id)  # the turn's last event is its agent_end
        self._agent_end(run, status)
        failed = error if status != "ok" else None
        self._emit(
            Resolve(
                run.prompt,
                TurnResult(
                    prompt_id=run.prompt.handle.id,
                    status=status,
                    message=run.last_message,
                    usage=run.usage,
                    steps=run.step,
                    error=failed,
                    awaiting=run.awaiting if status == "ok" else (),
                ),
            )
        )
        for joined in run.joined:  # steering messages share the turn they joined
            self._emit(
                Resolve(
                    joined,
                    TurnResult(
                        prompt_id=joined.handle.id,
                        status=status,
                        message=run.last_message,
                        usage=run.usage,
                        steps=run.step,
                        error=failed,
                    ),
                )
            )
        if abort_handle is not None:
            self._emit(ResolveAbort(abort_handle, True))
        # steering that found no step boundary (the turn answered, or ended) runs as the next turn
        self.queue[:0], self.steering = self.steering, []

    def _agent_end(
        self, run: TurnState, status: Literal["ok", "aborted", "error"], best_effort: bool = False
    ) -> None:
        event = ev.AgentEnd(
            session_id=self.session_id,
            turn_id=run.turn_id,
            status=status,
            usage=run.usage,
            context_window=self.context_window,
            context_tokens=self.context_tokens,
            steps=run.step,
        )
        self._out.append(PublishBestEffort(event) if best_effort else event)

    def _end_interrupted(self, run: TurnState, status: Literal["aborted", "error"], reason: str) -> None:
        """Close a turn cut short by a crash or a stop for subscribers: every agent_start gets its agent_end."""
        if status == "error":
            self._emit(
                PublishBestEffort(
                    ev.ErrorOccurred(
                        session_id=self.session_id, message=reason, code="agent_crashed", turn_id=run.turn_id
                    )
                )
            )
        self._agent_end(run, status, best_effort=True)

    # -- a turn's own flows (runtime.turn.machine) -----------------------------------------------------------
    @abstractmethod
    def _turn(self, prompt: PromptLike) -> Flow:
        """A turn for ``prompt``, from its start."""

    @abstractmethod
    def _before_request(self, run: TurnState, view: ViewLike | None) -> Flow:
        """The next request of ``run``, once the context passes the rules (``view``: the context, if known)."""

    @abstractmethod
    def _decide(self, run: TurnState, context: tuple[Message, ...], estimate: int, anchored: int = 0) -> Flow:
        """The rules of the next request over ``context`` (``estimate`` tokens, ``anchored`` of them the
        provider's own count: 0 after a compaction), then the request."""

    @abstractmethod
    def _run_tools(self, run: TurnState, calls: tuple[ToolCallPart, ...]) -> Flow:
        """Run ``calls``, record their results, and go on with the turn."""
