"""The agent's turns as a sans-I/O state machine (design §3.1).

What happened goes in (a prompt, an answer to an effect, an abort, a capacity wait, a silent overflow, a
new model); what to do next comes out, as effects (:mod:`runtime.turn.effects`). No actors, no threads, no
I/O: the ``Agent`` actor (``actors/agent.py``) is its driver, which performs the effects and hands their
answers back, and the tests drive it with scripted answers.

Each flow (a turn; the ending of one; the recovery after a crash) is written as one generator, so its rules
read top to bottom: it yields the effects it waits for and receives their answers, and says the others
(events, step records, a prompt's result) as it goes, in order. :class:`TurnMachine` is in three modules,
each one concern: :mod:`runtime.turn.core` (its state, the pump that runs the flows, the end of a turn),
:mod:`runtime.turn.recovery` (a crash, a stop, the recovery of a restarted agent, overflow recovery) and
this one (the inputs, and a turn's own flows). Every decision rule of a turn is called from them: the
refusal of a prompt that cannot fit (:func:`~runtime.context.working_set.prompt_too_large`), the rules of
each request (:func:`~runtime.context.working_set.decide_step`: the compactions, the input-token guard),
the working set clipped to fit (:func:`~runtime.context.working_set.plan_clips`), every call with one
result before a request (:func:`~runtime.context.integrity.request_view`) and after an abort
(:func:`~runtime.context.integrity.repair_tool_calls`), overflow recovery (the detector's verdict,
:func:`~runtime.context.recovery.compaction_did_not_help`, :func:`~runtime.context.recovery.prompt_caused_overflow`),
the steps limit, client tools, steering and the queue.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

import msgspec

from runtime import events as ev
from runtime.context import working_set as ws
from runtime.context.caching import min_cacheable_tokens, place_breakpoints, request_shape
from runtime.context.estimate import CountRatio, usable_response
from runtime.context.integrity import CLIENT_CALLS_KEY, one_call, request_view
from runtime.durable import step_record
from runtime.messages import KIND_STEER, Message, ToolCallPart, Usage, new_id, system
from runtime.tools.saved import READ_SAVED
from runtime.turn import fit
from runtime.turn.core import CounterLike, Flow, MeasureLike, SpecLike, ToolsLike
from runtime.turn.effects import (
    ArchiveTools,
    CallModel,
    CancelApprovals,
    CancelIO,
    Classify,
    Compact,
    CompletionLike,
    LearnCountRatio,
    ModelReply,
    OutcomeLike,
    Overlay,
    Persist,
    ReadContext,
    RecordAnswer,
    RefreshTools,
    RequestSpec,
    ResolveAbort,
    Route,
    Routed,
    RunTools,
    Said,
    StoredLike,
    ToolResultLike,
    VerdictLike,
    ViewLike,
)
from runtime.turn.recovery import RecoveryFlows
from runtime.turn.state import AgentState, PromptLike, TurnState

if TYPE_CHECKING:
    from runtime.events import CompactionTrigger

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


class TurnMachine(RecoveryFlows):
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
        count_ratio: the server's count ÷ ours the session learned before its agent restarted (design §4.5).
    """

    # -- what happened ---------------------------------------------------------------------------------------
    def prompt(self, prompt: PromptLike) -> list[Said]:
        """A prompt arrived: steer the running turn, wait in the queue, or start a turn."""
        if prompt.steer and self.run is not None:
            self.steering.append(prompt)
            self._publish(
                ev.MessageQueued(
                    session_id=self.session_id,
                    prompt_id=prompt.handle.id,
                    position=len(self.steering),
                    steer=True,
                )
            )
            return self._take()
        if self.state is not AgentState.IDLE or self._busy_with_recovery or self._flow is not None:
            self.queue.append(prompt)
            if self.state is not AgentState.IDLE:  # (while recovering, the prompt just waits a moment)
                self._publish(
                    ev.MessageQueued(
                        session_id=self.session_id, prompt_id=prompt.handle.id, position=len(self.queue)
                    )
                )
            return self._take()
        return self._begin(self._turn(prompt))

    def abort(self, handle: Any = None) -> list[Said]:
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

    def queued(self, ticket: int, pool: str, position: int, estimated_wait: float) -> list[Said]:
        """The call ``ticket`` waits for capacity of ``pool`` (state ``queued``)."""
        run = self.run
        if run is None or not self.expects(ticket):
            return []
        run.queued_pool = pool
        self._publish(
            ev.RequestQueued(
                session_id=self.session_id,
                turn_id=run.turn_id,
                pool=pool,
                position=position,
                estimated_wait=estimated_wait,
            )
        )
        if self.state is AgentState.STREAMING:
            self._enter(AgentState.QUEUED)
        return self._take()

    def admitted(self, ticket: int, waited: float) -> list[Said]:
        """The call ``ticket`` got its capacity after ``waited`` seconds (state ``streaming`` again)."""
        run = self.run
        if run is None or not self.expects(ticket):
            return []
        self._publish(
            ev.RequestAdmitted(
                session_id=self.session_id, turn_id=run.turn_id, pool=run.queued_pool, waited=waited
            )
        )
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
        """The session switched models (its window and counter with it, when given); the count ratio is
        learned again (another model, another tokenizer)."""
        if model != self.model:
            self.count_ratio = CountRatio(fit.default_count_ratio(model, self.spec.config))
        self.model = model
        if context_window is not None:
            self.context_window = context_window
        if counter is not None and measure is not None:
            self.counter, self.measure = counter, measure

    # -- a turn: idle → running ------------------------------------------------------------------------------
    def _turn(self, prompt: PromptLike) -> Flow:
        return self._start(TurnState(prompt=prompt))

    def _start(self, run: TurnState) -> Flow:
        prompt = run.prompt
        self.run = run  # (from its agent_start on, the turn can be aborted)
        self._publish(
            ev.AgentStart(
                session_id=self.session_id, turn_id=run.turn_id, prompt_id=prompt.handle.id, model=self.model
            )
        )
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

    # -- running: the rules of the next request (design §5.13) -----------------------------------------------
    def _before_request(self, run: TurnState, view: ViewLike | None) -> Flow:
        """Make the next provider call once the context passes the rules of :func:`decide_step`. ``view`` is
        the context as of the write this follows, when one came with it; without one it is read first."""
        if view is None:
            view = yield from self._ask(ReadContext())
        assert view is not None
        if view.dead is not None:  # no turn runs in a dead session; a manual compaction may revive it
            self._publish(ev.SessionDead(session_id=self.session_id, message=view.dead))
            yield from self._finish("error", view.dead, code="session_dead")
            return
        measured = self.measure(view)
        yield from self._decide(run, view.messages, measured.tokens, measured.anchored_tokens)

    def _decide(self, run: TurnState, context: tuple[Message, ...], estimate: int, anchored: int = 0) -> Flow:
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
                yield from self._request(run, context, estimate, anchored)
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
                        anchored = min(anchored, estimate)  # (clipping takes counted tokens away)
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
            outcome: OutcomeLike = yield from self._ask(
                Compact(
                    trigger=trigger,
                    emergency=emergency,
                    cause="counted" if emergency else None,  # (over the limit, not sent)
                    count_ratio=self.count_ratio.value,
                )
            )
            if outcome.dead:  # hard_reset could not get under the window: the log marks the session dead
                message = outcome.message or "context limit exceeded"
                self._publish(ev.SessionDead(session_id=self.session_id, message=message))
                yield from self._finish("error", message, code="session_dead")
                return
            context, estimate, anchored = outcome.messages, outcome.estimate, 0  # (a full count)

    # -- the working set: a step's results clipped to fit (design §5.13) -------------------------------------
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
    def _request(
        self, run: TurnState, context: tuple[Message, ...], estimate: int, anchored: int = 0
    ) -> Flow:
        repairs, view = request_view(context)
        while repairs:  # every tool call gets exactly one result before the next provider call (design §3.6)
            extra = sum(self.counter.count_message(m) for m in repairs)
            yield from self._ask(Persist(messages=tuple(repairs)))
            context, estimate = (*context, *repairs), estimate + extra
            repairs, view = request_view(context)
        counted = max(0, estimate - anchored)  # (repairs add counted tokens: the anchored part stays)
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
            max_tokens=options.answer_cap(
                fit.answer_cap_for(
                    self.model,
                    self.context_window,
                    estimate,
                    cfg,
                    counted=counted,
                    count_ratio=self.count_ratio.value,
                )
            ),
            extra=options.extra(tools=bool(tools)),
            one_call=not options.parallel_tool_calls,
            estimated_tokens=estimate,
            wait_budget=max(0.0, cfg.capacity.queue_timeout - run.waited),
            first=run.step == 0 or run.last_message is None,
        )
        self.cache_watch.sent(request_shape(self.model, system_prompt or "", tools, messages))
        run.step += 1
        self._record(run, "request", step=run.step)
        run.estimated_tokens, run.counted_tokens = estimate, counted
        request_id = run.message_id = new_id()
        routed: Routed = yield Route(request, request_id)
        self._publish(
            ev.RequestStart(
                session_id=self.session_id,
                turn_id=run.turn_id,
                attempt=run.step,
                model=self.model,
                messages=len(messages),
                estimated_tokens=estimate,
                transport=routed.transport,
                message_id=request_id,
                provider=routed.provider,
                max_tokens=request.max_tokens,
                server_address=routed.server_address,
                server_port=routed.server_port,
            )
        )
        self._enter(AgentState.STREAMING)
        reply: ModelReply = yield CallModel(request=request, turn_id=run.turn_id, message_id=request_id)
        yield from self._on_reply(run, reply, request_id)

    # -- streaming: the provider answered --------------------------------------------------------------------
    def _on_reply(self, run: TurnState, reply: ModelReply, request_id: str) -> Flow:
        result = reply.result
        run.message_id = reply.message_id
        run.waited += result.waited
        self._enter(AgentState.RUNNING)
        if result.error is not None:
            if result.error.kind == "cancelled":
                return
            self._publish(
                ev.RequestFailed(
                    session_id=self.session_id,
                    turn_id=run.turn_id,
                    request_id=request_id,
                    kind=result.error.kind,
                    message=result.error.message,
                    status_code=result.error.status_code,
                    attempts=result.attempts,
                    transport=result.transport or None,
                    pool=result.pool or None,
                    waited=result.waited,
                    latency=result.latency,
                )
            )
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
                    ev.CacheBreak(
                        session_id=self.session_id,
                        turn_id=run.turn_id,
                        cause=broke.cause,
                        expected_tokens=broke.expected_tokens,
                        cached_tokens=broke.cached_tokens,
                        model=self.model,
                    )
                )
            run.usage = run.usage + message.usage
            if usable_response(message):  # the server's count against ours: the answer cap's ratio
                ratio = self.count_ratio
                before = ratio.value
                ratio.observe(
                    actual_input=usage.input_tokens, estimate=run.estimated_tokens, counted=run.counted_tokens
                )
                if ratio.value != before:  # the compactor's summarizer requests keep the same margin
                    self._emit(LearnCountRatio(ratio.value, self.model))
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
        yield from self._after_response(run, message, result)

    def _after_response(self, run: TurnState, message: Message, result: CompletionLike) -> Flow:
        stop = message.stop_reason or ("tool_calls" if message.tool_calls else "stop")
        self._publish(
            ev.TurnEnd(
                session_id=self.session_id,
                turn_id=run.turn_id,
                stop_reason=stop,
                usage=message.usage or Usage(),
                attempts=result.attempts,
                pool=result.pool or None,
                waited=result.waited,
                latency=result.latency,
            )
        )
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

    # -- executing_tools -------------------------------------------------------------------------------------
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


def _working_set_has_results(context: tuple[Message, ...]) -> bool:
    start = ws.working_set_start(context)
    return start is not None and context[start].role == "assistant"


def _child_input_tokens(result: Message) -> int:
    """The input tokens a sub-agent spent on a delegation, as its tool result records them."""
    usage = result.metadata.get("child_usage")
    tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else 0
