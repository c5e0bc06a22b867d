"""The agent's turns as a sans-I/O state machine (design §3.1).

What happened goes in (a prompt, an answer to an effect, an abort, a capacity wait, a silent overflow, a
new model); what to do next comes out, as effects (:mod:`runtime.turn.effects`). No actors, no threads, no
I/O: the ``Agent`` actor (``actors/agent.py``) is its driver, which performs the effects and hands their
answers back, and the tests drive it with scripted answers.

Each flow (a turn; the ending of one; the recovery after a crash) is written as one generator, so its rules
read top to bottom: it yields the effects it waits for and receives their answers, and says the others
(events, step records, a prompt's result) as it goes, into the outbox the call returns, in order. A flow
waits at one awaited effect at a time, known by its ticket: an answer with another ticket (a late answer of
an aborted turn) is dropped, and an abort closes the flow where it waits. Every decision rule of a turn is
called from here: the refusal of a prompt that cannot fit (:func:`~runtime.context.working_set.prompt_too_large`), the rules
of each request (:func:`~runtime.context.working_set.decide_step`: the compactions, the input-token guard),
the working set clipped to fit (:func:`~runtime.context.working_set.plan_clips`), every call with one
result before a request (:func:`~runtime.context.integrity.request_view`) and after an abort
(:func:`~runtime.context.integrity.repair_tool_calls`), overflow recovery (the detector's verdict,
:func:`~runtime.context.recovery.compaction_did_not_help`, :func:`~runtime.context.recovery.prompt_caused_overflow`),
the steps limit, client tools, steering and the queue.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar

import msgspec

from runtime import events as ev
from runtime.context import working_set as ws
from runtime.context.caching import CacheWatch, min_cacheable_tokens, place_breakpoints, request_shape
from runtime.context.estimate import effective_limit
from runtime.context.integrity import (
    CLIENT_CALLS_KEY,
    awaiting_client,
    interrupted_turn_note,
    one_call,
    repair_tool_calls,
    request_view,
    unfinished_turn,
)
from runtime.context.recovery import PROMPT_HIDDEN_NOTE, compaction_did_not_help, prompt_caused_overflow
from runtime.durable import MAX_RESUMES, TurnRecovery, process_name, recover_turn, step_record, turn_prompt
from runtime.handles import PromptHandle, TurnResult
from runtime.messages import KIND_STEER, Message, ToolCallPart, Usage, new_id, system
from runtime.tools.saved import READ_SAVED
from runtime.turn import fit
from runtime.turn.effects import (
    Abandon,
    ArchiveTools,
    Awaited,
    CallModel,
    CancelApprovals,
    CancelIO,
    Classify,
    Compact,
    Effect,
    EndSpan,
    Failed,
    Hide,
    LearnWindow,
    ModelReply,
    OutcomeLike,
    Overlay,
    Persist,
    Publish,
    ReadContext,
    RecordAnswer,
    RecordStep,
    RefreshTools,
    Reject,
    RequestSpec,
    Resolve,
    ResolveAbort,
    RestoreUsage,
    Resumed,
    Route,
    RunTools,
    StartSpan,
    StoredLike,
    SyncTurn,
    TakeHandover,
    ToolResultLike,
    VerdictLike,
    ViewLike,
)
from runtime.turn.state import (
    TRANSITIONS,
    AgentState,
    Handover,
    IllegalTransition,
    PromptLike,
    TakenUpPrompt,
    TurnState,
)

if TYPE_CHECKING:
    from runtime.config import Config
    from runtime.events import CompactionTrigger
    from runtime.store.entries import StepKind

__all__ = [
    "CLIENT_TOOL_CLASH",
    "CounterLike",
    "Flow",
    "MeasureLike",
    "SpecLike",
    "ToolsLike",
    "TurnMachine",
]

CLIENT_TOOL_CLASH: Final = "client_tool_clash"
"""The error code of a turn whose client tools have the names of the session's own."""

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


class TurnMachine:
    """One session's turns: the prompts waiting, the turn running, and what to do next.

    Feed it what happened; each method returns the effects to perform, in order (see
    :mod:`runtime.turn.effects`). ``state`` is the agent's :class:`AgentState`, ``run`` the running turn's
    record (None between turns and while a turn ends), ``queue`` and ``steering`` the prompts waiting.

    Args:
        spec: the session's definition (its id, config, system prompt and tools).
        counter: the model's token counter.
        measure: the session's context estimate (system prompt, tools, messages).
        model: the session's model; ``context_window`` its window.
        spill_dir: where a clipped result's full text is saved.
        recovering: the agent restarts after a crash: call :meth:`recover` first; prompts wait until then.
        traced: the runtime traces turns: each turn opens a span (:class:`StartSpan`) and ends it.
    """

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
        traced: bool = True,
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
        self._busy_with_recovery = recovering
        self._traced = traced
        self._flow: Flow | None = None
        self._ticket = 0
        self._awaited: Awaited | None = None
        self._out: list[Effect] = []  # what the call in progress says, in order (see _take)

    # -- what happened ------------------------------------------------------------------------------------
    def prompt(self, prompt: PromptLike) -> list[Effect]:
        """A prompt arrived: steer the running turn, wait in the queue, or start a turn."""
        if prompt.steer and self.run is not None:
            self.steering.append(prompt)
            self._publish(
                ev.MessageQueued, prompt_id=prompt.handle.id, position=len(self.steering), steer=True
            )
            return self._take()
        if self.state is not AgentState.IDLE or self._busy_with_recovery or self._flow is not None:
            self.queue.append(prompt)
            if self.state is not AgentState.IDLE:  # (while recovering, the prompt just waits a moment)
                self._publish(ev.MessageQueued, prompt_id=prompt.handle.id, position=len(self.queue))
            return self._take()
        return self._begin(self._turn(prompt))

    def answer(self, ticket: int, value: Any) -> list[Effect]:
        """The answer to the awaited effect ``ticket`` (a value, or :class:`Failed`). A late one is dropped."""
        if ticket != self._ticket or self._awaited is None:
            return []
        self._awaited = None
        return self._pump(value)

    def expects(self, ticket: int) -> bool:
        """Whether ``ticket`` is the effect the machine waits for."""
        return self._awaited is not None and ticket == self._ticket

    def abort(self, handle: Any = None) -> list[Effect]:
        """The user aborts: the running turn stops, its provider call and tools are cancelled, its
        orphaned calls get results, and it ends ``aborted``. ``handle`` learns whether a turn ran."""
        if self.run is None:
            if handle is not None:
                self._emit(ResolveAbort(handle, False))
            return self._take()
        if self._flow is not None:
            self._flow.close()  # (it waits at a yield: nothing of it runs any more)
        self._awaited = None
        self._emit(CancelIO())
        self._emit(CancelApprovals("the turn was aborted"))
        return self._begin(
            self._finish("aborted", "aborted by the user", code="aborted", repair=True, abort_handle=handle)
        )

    def queued(self, ticket: int, pool: str, position: int, estimated_wait: float) -> list[Effect]:
        """The call ``ticket`` waits for capacity of ``pool`` (state ``queued``)."""
        run = self.run
        if run is None or not self.expects(ticket):
            return []
        run.queued_pool = pool
        self._publish(
            ev.RequestQueued, turn_id=run.turn_id, pool=pool, position=position, estimated_wait=estimated_wait
        )
        if self.state is AgentState.STREAMING:
            self._enter(AgentState.QUEUED)
        return self._take()

    def admitted(self, ticket: int, waited: float) -> list[Effect]:
        """The call ``ticket`` got its capacity after ``waited`` seconds (state ``streaming`` again)."""
        run = self.run
        if run is None or not self.expects(ticket):
            return []
        self._publish(ev.RequestAdmitted, turn_id=run.turn_id, pool=run.queued_pool, waited=waited)
        if self.state is AgentState.QUEUED:
            self._enter(AgentState.STREAMING)
        return self._take()

    def usage_overflowed(self) -> None:
        """A response's input filled the window (a silent overflow, design §6.2): compact before the next
        request, even in a later turn."""
        self.pending_trigger = "usage_overflow"

    def set_model(
        self,
        model: str,
        context_window: int | None = None,
        counter: CounterLike | None = None,
        measure: MeasureLike | None = None,
    ) -> None:
        """The session switched models (its window and counter with it, when given)."""
        self.model = model
        if context_window is not None:
            self.context_window = context_window
        if counter is not None and measure is not None:
            self.counter, self.measure = counter, measure

    def recover(self) -> list[Effect]:
        """The agent restarted after a crash: read the log, give orphaned calls their results, and take up
        the turn its predecessor was in (from :class:`TakeHandover`) or say it ended."""
        return self._begin(self._recovery())

    def resume(self, run: TurnState) -> list[Effect]:
        """Take up ``run``, a turn cut off before its end, at its next step: from the log, without a new
        prompt (design §1.2)."""
        run.continued = True
        self.run = run
        return self._begin(self._continue(run))

    def crash(self, reason: str, incoming: PromptLike | None = None) -> tuple[Handover | None, list[Effect]]:
        """The agent crashed (``reason``). A turn cut off for the first time is handed over (with the prompts
        waiting) for the successor to take up; otherwise nobody may wait forever: the prompt being handled
        (``incoming``), a turn that was already taken up once, and the queue are answered."""
        self._out.clear()  # (what the call that raised had said was never handed out)
        run = self.run
        handover = None
        if run is not None and not run.continued:
            self._emit(CancelIO())
            handover = Handover(run, [*self.steering, *self.queue])
            self.run, self.queue, self.steering = None, [], []
        if incoming is not None:
            self._emit(
                Resolve(incoming, TurnResult(prompt_id=incoming.handle.id, status="error", error=reason))
            )
        run = self.run
        if run is not None:
            self._emit(CancelIO())
            self._emit(SyncTurn(ended=True))  # (no resume takes it for a turn the process stopped in)
            self._end_interrupted(run, "error", reason)
            self._emit(
                Resolve(
                    run.prompt,
                    TurnResult(
                        prompt_id=run.prompt.handle.id,
                        status="error",
                        usage=run.usage,
                        steps=run.step,
                        error=reason,
                    ),
                )
            )
        for queued in self.queue:
            self._publish(ev.ErrorOccurred, message="queued prompt lost to an agent crash; resend it")
            self._emit(Reject(queued, "the agent crashed before this queued prompt ran"))
        self._flow, self._awaited = None, None
        return handover, self._take()

    def stop(self) -> list[Effect]:
        """The session stops: the running turn and every prompt waiting end ``aborted``."""
        self._out.clear()  # (what a call that raised had said was never handed out)
        run = self.run
        if run is not None:
            self._emit(CancelIO())
            self._emit(SyncTurn(ended=True))  # (no resume takes it for a turn the process stopped in)
            self._end_interrupted(run, "aborted", "session stopped")
            self._emit(
                Resolve(
                    run.prompt,
                    TurnResult(prompt_id=run.prompt.handle.id, status="aborted", error="session stopped"),
                )
            )
        for queued in [*self.steering, *self.queue]:
            self._emit(
                Resolve(
                    queued, TurnResult(prompt_id=queued.handle.id, status="aborted", error="session stopped")
                )
            )
        self._flow, self._awaited = None, None
        return self._take()

    # -- the pump -----------------------------------------------------------------------------------------
    def _begin(self, flow: Flow) -> list[Effect]:
        self._flow = flow
        return self._pump(None)

    def _pump(self, value: Any) -> list[Effect]:
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

    def _take(self) -> list[Effect]:
        """The effects said since the last call, in order; the outbox starts empty again (the same list: one
        that lived on while the session waits would be work for the garbage collector)."""
        out = self._out.copy()
        self._out.clear()
        return out

    # -- helpers ------------------------------------------------------------------------------------------
    def _emit(self, effect: Effect) -> None:
        """Say ``effect``, which nobody waits for (a flow yields only what it waits for)."""
        self._out.append(effect)

    def _publish(self, event_type: type[ev.Event], **fields: Any) -> None:
        self._out.append(Publish(event_type(session_id=self.session_id, **fields)))

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
        self._publish(ev.StatusUpdate, state=str(state), previous=str(previous), turn_id=turn)

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

    # -- a turn: idle → running ----------------------------------------------------------------------------
    def _turn(self, prompt: PromptLike) -> Flow:
        return self._start(TurnState(prompt=prompt))

    def _start(self, run: TurnState) -> Flow:
        prompt = run.prompt
        if self._traced:
            run.span = yield StartSpan(turn_id=run.turn_id, inputs=prompt.inputs, model=self.model)
        self.run = run  # (from its agent_start on, the turn can be aborted)
        self._publish(ev.AgentStart, turn_id=run.turn_id, prompt_id=prompt.handle.id)
        self._enter(AgentState.RUNNING)
        clash = sorted(run.options.client_tool_names & set(self.spec.tools.names)) if prompt.options else []
        if clash:  # the model could not tell which one it calls: refused before anything is recorded
            message = f"client tools {clash} have the names of tools this session runs itself; rename them"
            yield from self._finish("error", message, code=CLIENT_TOOL_CLASH)
            return
        begun = (step_record(run.turn_id, "turn", prompt_id=prompt.handle.id),)  # written with the prompt
        inputs = prompt.inputs
        results = tuple(m for m in inputs if m.role == "tool")
        refusal = None
        if not results:
            refusal = fit.prompt_refusal(
                inputs,
                count=self.counter.count_message,
                fixed_tokens=self.measure.fixed_tokens,
                window=self.context_window,
                limit=self._limit(),
            )
        if refusal is not None:
            # Kept on record for the user, hidden from the model, never summarized, never sent (design §5.13).
            hidden = tuple(msgspec.structs.replace(m, agent_visible=False) for m in inputs)
            yield from self._ask(Persist(messages=hidden, steps=begun))
            yield from self._finish("error", refusal, code=ws.PROMPT_TOO_LARGE)
            return
        if results:
            # The results of the client's tool calls: a step's results like any other, clipped to fit the
            # working set, and the thread goes on from them (see TurnOptions).
            run.step_results = results
            clipped = {m.id: m for m in self._clip_results(run, self._working_set_budget(None))}
            inputs = tuple(clipped.get(m.id, m) for m in inputs)
            yield from self._ask(Persist(messages=inputs, steps=begun))
            if self.spec.mcp is not None:  # its MCP servers' tools, before the first request
                yield RefreshTools()
            yield from self._after_tool_results(run)
            return
        stored: StoredLike = yield from self._ask(Persist(messages=inputs, with_view=True, steps=begun))
        if self.spec.mcp is not None:  # its MCP servers' tools, before the first request
            yield RefreshTools()
        yield from self._before_request(run, stored.view if stored.ok else None)

    def _continue(
        self, run: TurnState, rerun: tuple[ToolCallPart, ...] = (), answer: Message | None = None
    ) -> Flow:
        """Take up a turn cut off by a crash: its calls to run (again), or the next step, from the log
        (design §1.2, §3.12)."""
        self._busy_with_recovery = False
        self._enter(AgentState.RUNNING)
        if rerun and answer is not None:
            run.last_message = answer
            yield from self._run_tools(run, rerun)
            return
        yield from self._before_request(run, None)

    # -- running: the rules of the next request (design §5.13) ---------------------------------------------
    def _before_request(self, run: TurnState, view: ViewLike | None) -> Flow:
        """Make the next provider call once the context passes the rules of :func:`decide_step`. ``view`` is
        the context as of the write this follows, when one came with it; without one it is read first."""
        if view is None:
            view = yield from self._ask(ReadContext())
        assert view is not None
        if view.dead is not None:  # no turn runs in a dead session; a manual compaction may revive it
            self._publish(ev.SessionDead, message=view.dead)
            yield from self._finish("error", view.dead, code="session_dead")
            return
        yield from self._decide(run, view.messages, self.measure(view).tokens)

    def _decide(self, run: TurnState, context: tuple[Message, ...], estimate: int) -> Flow:
        cfg = self.spec.config
        while True:
            compaction = cfg.compaction
            if not run.options.compaction and compaction.auto:
                compaction = msgspec.structs.replace(compaction, auto=False)
            decision = ws.decide_step(
                estimate=estimate,
                message_count=len(context),
                window=self.context_window,
                config=compaction,
                pending=self.pending_trigger,
                threshold_used=run.compacted,
                overflow_used=run.overflow_recoveries > 0,
                turn_input_tokens=run.usage.input_tokens + run.child_input_tokens,
                turn_budget=ws.turn_input_budget(cfg.agent.max_turn_input_tokens, self.context_window),
                tool_results_in_view=_working_set_has_results(context),
                compactable=functools.partial(ws.compactable_tokens, context, self.counter.count_message),
            )
            if decision.action == "send":
                yield from self._request(run, context, estimate)
                return
            if decision.action == "fail":
                code, message = decision.code or "error", decision.message or "the request cannot be sent"
                if code == ws.WORKING_SET_TOO_LARGE:
                    again, saves = fit.clip_again(
                        run,
                        context,
                        estimate,
                        count=self.counter.count_message,
                        limit=self._limit(),
                        spill_dir=self.spill_dir,
                        reader=self._reader(),
                    )
                    self._out.extend(saves)
                    if again is not None:
                        changed, context, estimate = again
                        yield from self._ask(Overlay(changed))
                        continue
                if code == ws.CONTEXT_OVERFLOW and self._prompt_caused_overflow(run, estimate):
                    yield from self._fail_hiding_prompt(run, message, code)
                    return
                yield from self._finish("error", message, code=code)
                return
            emergency = decision.trigger == "overflow"
            if emergency:  # the request would overflow: the turn's emergency compaction
                run.overflow_recoveries += 1
            run.compacted = True  # one automatic compaction before any emergency one, and only one
            self.pending_trigger = None
            self._record(run, "compaction", step=run.step)
            trigger: CompactionTrigger = "overflow" if emergency else (decision.trigger or "threshold")
            outcome: OutcomeLike = yield from self._ask(Compact(trigger=trigger, emergency=emergency))
            if outcome.dead:  # hard_reset could not get under the window: the log marks the session dead
                message = outcome.message or "context limit exceeded"
                self._publish(ev.SessionDead, message=message)
                yield from self._finish("error", message, code="session_dead")
                return
            context, estimate = outcome.messages, outcome.estimate

    # -- the working set: a step's results clipped to fit (design §5.13) ---------------------------------
    def _working_set_budget(self, call: Message | None) -> int:
        """The tokens a step's results may take, after the assistant message ``call`` that asked for them."""
        return ws.working_set_budget(
            limit=self._limit(),
            fixed_tokens=self.measure.fixed_tokens,
            call_tokens=self.counter.count_message(call) if call is not None else 0,
            config=self.spec.config.compaction,
        )

    def _clip_results(self, run: TurnState, budget: int) -> tuple[Message, ...]:
        """The newest step's results clipped to ``budget`` (:func:`~runtime.turn.fit.clip_results`); the
        full texts it clipped are saved first."""
        fitted, saves = fit.clip_results(
            run, budget, count=self.counter.count_message, spill_dir=self.spill_dir, reader=self._reader()
        )
        self._out.extend(saves)
        return fitted

    def _reader(self) -> str | None:
        return READ_SAVED if READ_SAVED in self.spec.tools else None

    # -- the request -----------------------------------------------------------------------------------------
    def _request(self, run: TurnState, context: tuple[Message, ...], estimate: int) -> Flow:
        repairs, view = request_view(context)
        while repairs:  # every tool call gets exactly one result before the next provider call (design §3.6)
            extra = sum(self.counter.count_message(m) for m in repairs)
            yield from self._ask(Persist(messages=tuple(repairs)))
            context, estimate = (*context, *repairs), estimate + extra
            repairs, view = request_view(context)
        cfg = self.spec.config
        options = run.options
        system_prompt = self.spec.system_prompt if options.instructions is None else options.instructions
        messages: list[Message] = [system(system_prompt)] if system_prompt else []
        messages.extend(view)  # each result right after its call, duplicates dropped
        tools = self.spec.tools.schemas() if len(self.spec.tools) else []
        if options.client_tools:
            tools = [*tools, *options.client_tools]
        cache = None
        if cfg.gateway.prompt_cache:  # (design §4.7)
            cache = place_breakpoints(
                messages,
                count=self.counter.count_message,
                tools_tokens=self.counter.count_tools(tools),
                minimum=min_cacheable_tokens(self.model),
            )
        request = RequestSpec(
            model=self.model,
            messages=tuple(messages),
            tools=tuple(tools),
            cache=cache,
            max_tokens=options.answer_cap(fit.answer_cap_for(self.model, self.context_window, estimate, cfg)),
            extra=options.extra(tools=bool(tools)),
            one_call=not options.parallel_tool_calls,
            estimated_tokens=estimate,
            wait_budget=max(0.0, cfg.capacity.queue_timeout - run.waited),
            first=run.step == 0 or run.last_message is None,
        )
        self.cache_watch.sent(request_shape(self.model, system_prompt or "", tools, messages))
        run.step += 1
        self._record(run, "request", step=run.step)
        run.estimated_tokens = estimate
        transport = yield Route(request)
        run.message_id = new_id()
        self._publish(
            ev.RequestStart,
            turn_id=run.turn_id,
            attempt=run.step,
            model=self.model,
            messages=len(messages),
            estimated_tokens=estimate,
            transport=transport,
            message_id=run.message_id,
        )
        self._enter(AgentState.STREAMING)
        reply: ModelReply = yield CallModel(request=request, turn_id=run.turn_id, message_id=run.message_id)
        yield from self._on_reply(run, reply)

    # -- streaming: the provider answered ----------------------------------------------------------------------
    def _on_reply(self, run: TurnState, reply: ModelReply) -> Flow:
        result = reply.result
        run.message_id = reply.message_id
        run.waited += result.waited
        self._enter(AgentState.RUNNING)
        if result.error is not None:
            if result.error.kind == "cancelled":
                return
            verdict: VerdictLike = yield from self._ask(
                Classify(
                    error=result.error,
                    recoveries_this_turn=run.overflow_recoveries,
                    estimated_tokens=run.estimated_tokens,
                )
            )
            yield from self._on_verdict(run, verdict)
            return
        message = result.message
        assert message is not None  # a result without an error carries the answer
        if run.message_id is not None:  # the id RequestStart announced (a stream's client names it early)
            message = msgspec.structs.replace(message, id=run.message_id)
        if not run.options.parallel_tool_calls:  # one call a step, whatever the model did (design §3.6)
            message = one_call(message)
        client_names = run.options.client_tool_names if run.options.client_tools else frozenset()
        client_calls = [c.id for c in message.tool_calls if c.name in client_names]
        if client_calls:  # recorded, so that a restart knows these calls wait for the client's results
            message = msgspec.structs.replace(
                message, metadata={**message.metadata, CLIENT_CALLS_KEY: client_calls}
            )
        run.last_message = message
        if message.usage is not None:
            usage = message.usage
            broke = self.cache_watch.answered(
                usage.input_tokens, usage.cache_read_tokens, minimum=min_cacheable_tokens(self.model)
            )
            if broke is not None:
                self._publish(
                    ev.CacheBreak,
                    turn_id=run.turn_id,
                    cause=broke.cause,
                    expected_tokens=broke.expected_tokens,
                    cached_tokens=broke.cached_tokens,
                    model=self.model,
                )
            run.usage = run.usage + message.usage
            self.context_tokens = message.usage.input_tokens + message.usage.output_tokens
        # A final answer ends the turn: its append also makes the log durable (no SyncTurn after it).
        run.synced = not message.tool_calls
        # The usage tracker and the store both answer before the turn goes on: the usage_update of this
        # response is published before the turn's end (subscribers see agent_end last).
        yield from self._ask(
            RecordAnswer(
                message=message,
                estimated_input=run.estimated_tokens,
                check_usage=message.usage is not None,
                end_turn=run.synced,
            )
        )
        yield from self._after_response(run, message)

    def _after_response(self, run: TurnState, message: Message) -> Flow:
        stop = message.stop_reason or ("tool_calls" if message.tool_calls else "stop")
        self._publish(ev.TurnEnd, turn_id=run.turn_id, stop_reason=stop, usage=message.usage or Usage())
        calls = message.tool_calls
        if not calls:
            yield from self._finish("ok")
            return
        if run.step >= self.spec.config.agent.max_steps_per_turn:
            yield from self._finish(
                "error",
                f"the run reached max_steps_per_turn ({run.step}) with tool calls still pending",
                code="max_steps",
                repair=True,
            )
            return
        client_ids = message.metadata.get(CLIENT_CALLS_KEY)
        if client_ids:  # the client runs these: the session's own calls run first, then the turn stops
            run.awaiting = tuple(c for c in calls if c.id in client_ids)
            calls = tuple(c for c in calls if c.id not in client_ids)
            if not calls:
                yield from self._finish("ok")
                return
        yield from self._run_tools(run, calls)

    # -- overflow recovery (design §6.3) -------------------------------------------------------------------
    def _on_verdict(self, run: TurnState, verdict: VerdictLike) -> Flow:
        if verdict.learned_window is not None:
            self._learn_window(verdict.learned_window, "overflow")
        if verdict.action == "compact_and_retry" and run.options.compaction:
            run.overflow_recoveries += 1
            self._record(run, "compaction", step=run.step)
            outcome: OutcomeLike = yield from self._ask(Compact(trigger="overflow", emergency=True))
            if outcome.dead or not outcome.compacted:
                failure = compaction_did_not_help(
                    context_window=self.context_window,
                    reason=outcome.message or "nothing could be summarized",
                )
                if self._prompt_caused_overflow(run, max(run.estimated_tokens, outcome.estimate)):
                    yield from self._fail_hiding_prompt(run, failure.message, failure.code)
                    return
                yield from self._finish("error", failure.message, code=failure.code)
                return
            run.compacted = True
            yield from self._decide(run, outcome.messages, outcome.estimate)
            return
        if verdict.overflow and self._prompt_caused_overflow(run, run.estimated_tokens):
            yield from self._fail_hiding_prompt(run, verdict.message, verdict.code)
            return
        yield from self._finish("error", verdict.message, code=verdict.code, retryable=verdict.retryable)

    def _learn_window(self, window: int, source: str) -> None:
        """Take the window the provider stated, for this session (its actors, and their restarts) and for
        its endpoint (sessions started later on it), and say so (``window_learned``)."""
        old = self.context_window
        if window == old:
            return
        self.context_window = window
        self._emit(LearnWindow(window, self.model))
        self._publish(ev.WindowLearned, old=old, new=window, source=source, model=self.model)

    def _prompt_caused_overflow(self, run: TurnState, request_tokens: int) -> bool:
        return prompt_caused_overflow(
            prompt_tokens=sum(self.counter.count_message(m) for m in run.prompt.inputs),
            request_tokens=request_tokens,
            answered=run.last_message is not None,
        )

    def _fail_hiding_prompt(self, run: TurnState, message: str, code: str) -> Flow:
        """End the turn; hide its prompt from the model (it stays on record) so later turns can fit."""
        yield from self._ask(Hide(tuple(m.id for m in run.prompt.inputs)))
        yield from self._finish("error", message + PROMPT_HIDDEN_NOTE, code=code)

    # -- executing_tools ------------------------------------------------------------------------------------
    def _run_tools(self, run: TurnState, calls: tuple[ToolCallPart, ...]) -> Flow:
        self._enter(AgentState.EXECUTING_TOOLS)
        results: list[ToolResultLike] = yield RunTools(calls, run.turn_id, run.step)
        self._enter(AgentState.RUNNING)
        run.step_results, run.reclipped = tuple(r.message for r in results), False
        run.child_input_tokens += sum(_child_input_tokens(m) for m in run.step_results)
        messages = self._clip_results(run, self._working_set_budget(run.last_message))
        steering: list[PromptLike] = []
        if not run.awaiting:  # (a turn that stops for the client's tools leaves steering to the next turn)
            steering, self.steering = self.steering, []
        if steering:  # the step boundary: the user's steering joins the turn right after the results
            run.joined.extend(steering)
            messages += tuple(msgspec.structs.replace(p.message, kind=KIND_STEER) for p in steering)
        yield from self._ask(Persist(messages=messages))
        yield from self._after_tool_results(run)

    def _after_tool_results(self, run: TurnState) -> Flow:
        if run.awaiting:  # the step's own calls are answered; the client's are the client's to answer
            yield from self._finish("ok")
            return
        view = yield from self._ask(ArchiveTools())
        yield from self._before_request(run, view)

    # -- the end of a turn --------------------------------------------------------------------------------
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
        self._end_span(run, status, error, code=code)
        if status == "aborted":
            self._publish(ev.AgentAbort, turn_id=run.turn_id, repaired_calls=repaired)
        elif status == "error":
            self._publish(
                ev.ErrorOccurred,
                message=error or "error",
                code=code,
                turn_id=run.turn_id,
                retryable=retryable,
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
        )
        self._emit(Publish(event, best_effort=best_effort))

    def _end_span(self, run: TurnState, status: str, error: str | None, *, code: str | None) -> None:
        """End the turn's span, if it has one open."""
        span, run.span = run.span, None
        if span is not None:
            self._emit(
                EndSpan(
                    span=span,
                    status=status,
                    usage=run.usage,
                    steps=run.step,
                    error=error,
                    code=code,
                    answer=run.last_message,
                )
            )

    def _end_interrupted(self, run: TurnState, status: Literal["aborted", "error"], reason: str) -> None:
        """Close a turn cut short by a crash or a stop for subscribers: every agent_start gets its agent_end."""
        self._end_span(run, status, reason, code="agent_crashed" if status == "error" else None)
        if status == "error":
            self._emit(
                Publish(
                    ev.ErrorOccurred(
                        session_id=self.session_id, message=reason, code="agent_crashed", turn_id=run.turn_id
                    ),
                    best_effort=True,
                )
            )
        self._agent_end(run, status, best_effort=True)

    # -- recovery after a crash (design §1.2, §3.12) --------------------------------------------------------
    def _recovery(self) -> Flow:
        view = yield ReadContext()
        handover: Handover | None = yield TakeHandover()
        if isinstance(view, Failed):
            self._publish(
                ev.ErrorOccurred,
                message=f"agent recovery could not read the session: {view.message}",
                code="recovery",
            )
            if handover is not None:
                self._emit(
                    Abandon(handover, f"the session could not be read after an agent crash: {view.message}")
                )
            self._emit(Resumed(None))
            return
        self._emit(RestoreUsage(tuple(view.messages)))
        awaited = awaiting_client(view.messages)  # a turn that stopped for the client's tools still waits
        interrupted = unfinished_turn(view.messages, view.turn_ended_at)
        run = handover.run if handover is not None else None
        if run is None and interrupted and not awaited:  # the process stopped mid-turn (design §3.12)
            run = self._taken_up_run(view)
        if run is not None and interrupted:
            run.continued = True
            self.run = run  # (prompts wait meanwhile)
            taken_up = handover is None
            if taken_up:  # its caller is gone with the process: the runtime hands its handle out
                if self._traced:
                    run.span = yield StartSpan(
                        turn_id=run.turn_id, inputs=run.prompt.inputs, model=self.model
                    )
                self._publish(ev.AgentStart, turn_id=run.turn_id, prompt_id=run.prompt.handle.id)
            self._emit(Resumed(run.prompt.handle if taken_up else None))
            if self.spec.mcp is not None:  # its MCP servers' tools, before the first request
                yield RefreshTools()
            yield from self._take_up(run, view, awaited, handover)
            return
        repairs = [r for r in repair_tool_calls(view.messages) if r.tool_call_id not in awaited]
        # A turn cut off and not taken up is said to be so in the log, which ends it.
        notes = [*repairs, interrupted_turn_note()] if interrupted else repairs
        if notes:
            yield Persist(messages=tuple(notes), end_turn=True)
        self._publish(
            ev.AgentRecovered,
            messages=len(view.messages),
            repaired_calls=len(repairs),
            interrupted_turn=interrupted,
            continued=False,
        )
        self._emit(Resumed(None))
        if handover is not None:
            self.queue = [*handover.queue, *self.queue]
        if run is not None:  # it crashed after its answer was recorded: the turn is over
            answer = view.messages[-1] if view.messages else None
            self._emit(
                Resolve(
                    run.prompt,
                    TurnResult(prompt_id=run.prompt.handle.id, status="ok", message=answer, usage=run.usage),
                )
            )

    def _taken_up_run(self, view: ViewLike) -> TurnState | None:
        """The record of a turn the process stopped in, to take up from the log; None when it is not to be
        (the host said not to, it was taken up too often already, or the log names no prompt)."""
        recovery = recover_turn(view.messages, view.steps, idempotent=self._idempotent)
        prompt = turn_prompt(view.messages)
        if not self.spec.config.agent.resume_turns or recovery.resumed >= MAX_RESUMES or prompt is None:
            return None
        handle = PromptHandle(recovery.prompt_id or new_id())
        run = TurnState(prompt=TakenUpPrompt(prompt, handle), step=recovery.steps)
        if recovery.turn_id is not None:
            run.turn_id = recovery.turn_id
        return run

    def _take_up(
        self, run: TurnState, view: ViewLike, awaited: frozenset[str], handover: Handover | None
    ) -> Flow:
        """Go on with ``run`` from the log: the results of calls that may not run again first, then the
        calls to run (again), or the next request."""
        recovery = recover_turn(view.messages, view.steps, idempotent=self._idempotent, awaited=awaited)
        handled = {c.id for c in recovery.rerun} | {m.tool_call_id for m in recovery.unknown}
        repairs = [
            r
            for r in repair_tool_calls(view.messages)
            if r.tool_call_id not in awaited and r.tool_call_id not in handled
        ]
        notes = (*recovery.unknown, *repairs)
        if notes:
            yield from self._ask(Persist(messages=notes))
        self._publish(
            ev.AgentRecovered,
            messages=len(view.messages),
            repaired_calls=len(notes),
            interrupted_turn=True,
            continued=True,
        )
        if handover is not None:
            self.queue = [*handover.queue, *self.queue]
        self._announce_resume(run, recovery)
        answer = next((m for m in reversed(view.messages) if m.role == "assistant"), None)
        yield from self._continue(run, recovery.rerun, answer)

    def _announce_resume(self, run: TurnState, recovery: TurnRecovery) -> None:
        """Say that ``run`` is taken up (``turn_resumed``), in the log and to subscribers."""
        self._record(run, "resumed", step=recovery.steps)
        self._publish(
            ev.TurnResumed,
            turn_id=run.turn_id,
            prompt_id=run.prompt.handle.id,
            resume_from=recovery.resume_from,
            step=recovery.steps,
            process=process_name(),
            rerun_calls=len(recovery.rerun),
            unknown_calls=len(recovery.unknown),
        )

    def _idempotent(self, name: str) -> bool:
        tool = self.spec.tools.get(name)
        return tool is not None and tool.idempotent


def _working_set_has_results(context: tuple[Message, ...]) -> bool:
    start = ws.working_set_start(context)
    return start is not None and context[start].role == "assistant"


def _child_input_tokens(result: Message) -> int:
    """The input tokens a sub-agent spent on a delegation, as its tool result records them."""
    usage = result.metadata.get("child_usage")
    tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0
