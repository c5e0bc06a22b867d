"""The agent actor: the driver of one session's turn machine (design §3.1).

The turns themselves (every rule, every state) are :class:`runtime.turn.TurnMachine`, which performs
nothing: it says what to do next. This actor feeds it what happened (a prompt, an abort, the answer of a
store, a compactor, the overflow detector, the gateway or the tool executor) and performs the effects it
returns: a store write or read is an asynchronous call whose answer comes back as a message, a provider
call runs on the runtime's I/O loop and the tools on its worker pool, their results told back as messages.
Each awaited effect carries a ticket, so a late answer from an aborted turn is recognised and dropped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import pykka

from actors import protocol as p
from actors._base import CallFailed, Reply, SessionActor, retry_reporter, server_of
from actors.protocol import Abort, AgentStatus, GetState, Prompt, SetModel
from actors.session_estimate import SessionEstimate
from actors.wiring import Services, SessionRefs, SessionSpec
from runtime import events as ev
from runtime.capacity import Priority
from runtime.durable import step_record
from runtime.gateway import Admission, CacheHints, CompletionRequest, endpoint_of
from runtime.handles import TurnResult
from runtime.messages import ToolCallPart, new_id
from runtime.tokens import TokenCounter
from runtime.tools.executor import context_factory
from runtime.turn import effects as fx
from runtime.turn.machine import CLIENT_TOOL_CLASH, TurnMachine
from runtime.turn.state import TRANSITIONS, AgentState, Handover, IllegalTransition

if TYPE_CHECKING:
    from runtime.actor import Ref
    from runtime.bus import EventBus
    from runtime.gateway import CallHandle, CompletionResult, Delta, RetryInfo
    from runtime.tools.executor import ContextFactory, ToolBatchHandle, ToolRunResult
    from runtime.tools.registry import Tool, ToolRegistry

__all__ = [
    "CLIENT_TOOL_CLASH",
    "TRANSITIONS",
    "Agent",
    "AgentState",
    "Handover",
    "IllegalTransition",
    "abandon",
]

log = logging.getLogger("agentcell.agent")

_RECORD_TIMEOUT = 30.0  # seconds a tool's worker waits for the tool's start to be in the log (design §3.12)


# -- the messages it sends itself (the session's protocol is in actors.protocol) ------------------------


class _ProviderDone(msgspec.Struct, frozen=True):
    ticket: int
    result: CompletionResult
    message_id: str


class _Queued(msgspec.Struct, frozen=True):
    """The call ``ticket`` waits for capacity (``waited`` None) or got it after ``waited`` seconds."""

    ticket: int
    pool: str
    position: int = 0
    estimated_wait: float = 0.0
    waited: float | None = None


class _ToolsDone(msgspec.Struct, frozen=True):
    ticket: int
    results: list[ToolRunResult]


class _McpTools(msgspec.Struct, frozen=True):
    ticket: int
    registry: ToolRegistry | None  # None: unchanged


class _Performers(dict[type[fx.Said], Callable[["Agent", Any], "list[fx.Said] | None"]]):
    """Who performs each effect: one method of the agent a type (a lookup per effect, not a chain of tests);
    every event type is published."""

    def __missing__(self, effect_type: type[fx.Said]) -> Any:
        raise TypeError(f"agent: unexpected effect {effect_type.__name__}")


_PERFORMERS = _Performers()

_Performer = TypeVar("_Performer", bound=Callable[..., Any])


def _performs(*types: type[fx.Said]) -> Callable[[_Performer], _Performer]:
    """Make the decorated method the one that performs effects of ``types``. An awaited effect's performer
    returns the machine's next effects when the answer is there at once, else None (it comes as a message)."""

    def register(method: _Performer) -> _Performer:
        for effect_type in types:
            _PERFORMERS[effect_type] = method
        return method

    return register


class Agent(SessionActor):
    """Drives turns for one session; holds no history of its own (the store does), and no rule of a turn
    (its :class:`~runtime.turn.TurnMachine` does)."""

    def __init__(
        self,
        spec: SessionSpec,
        services: Services,
        refs: SessionRefs,
        counter: TokenCounter,
        context_window: int,
        *,
        model: str,
        recovering: bool = False,
    ) -> None:
        super().__init__(spec.session_id, services.bus.publish)
        self.spec = spec
        self.services = services
        self.refs = refs
        told = refs.count_ratio  # what the agent before a restart had learned
        self.machine = TurnMachine(
            spec,
            counter=counter,
            measure=SessionEstimate(spec, counter),
            model=model,
            context_window=context_window,
            spill_dir=services.directory.spill_dir(spec.session_id),
            recovering=recovering,
            count_ratio=told[1] if told is not None and told[0] == model else None,
        )
        self._content = services.content  # prompts and answers for the spans (telemetry.record_content)
        self._server = server_of(spec.api_base)
        self._recovering = recovering
        self._incoming: Prompt | None = None  # the prompt being handled: answered even if handling crashes
        self._call: CallHandle | None = None  # the turn's provider call in flight
        self._tools: ToolBatchHandle | None = None  # the turn's tools running
        self._prepared: CompletionRequest | None = None  # the request routed last

    @property
    def state(self) -> AgentState:
        return self.machine.state

    # -- lifecycle --------------------------------------------------------------------------------------
    def on_start(self) -> None:
        if self._recovering:
            self._perform(self.machine.recover())
        else:
            self.refs.resumed.set_result(None)  # a new session: no turn to take up

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        # The supervisor restarts us. A turn cut off for the first time is handed to the successor, which
        # goes on from the log; otherwise whoever waits on a prompt must not wait forever.
        crash = f"the agent crashed ({exception_type.__name__}: {exception_value}); the session recovers from its log"
        handover, effects = self.machine.crash(crash, self._incoming)
        if handover is not None:
            self.refs.handover = handover
        self._perform(effects)

    def on_stop(self) -> None:
        self._perform(self.machine.stop())

    # -- mailbox ----------------------------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        match message:
            case Reply():
                self.handle_reply(message)
            case Prompt():
                self._incoming = message  # if handling it crashes, on_failure still answers its handle
                self._on_prompt(message)
                self._incoming = None
            case _ProviderDone(ticket=ticket):
                if self.machine.expects(ticket):
                    self._call = None
                self._perform(self.machine.answer(ticket, fx.ModelReply(message.result, message.message_id)))
            case _ToolsDone(ticket=ticket):
                if self.machine.expects(ticket):
                    self._tools = None
                self._perform(self.machine.answer(ticket, message.results))
            case _McpTools(ticket=ticket, registry=registry):
                if registry is not None:  # (the registry is replaced whole: other threads see the old or new)
                    self.spec.tools = registry
                self._perform(self.machine.answer(ticket, None))
            case _Queued(ticket=ticket, waited=waited):
                if waited is None:
                    effects = self.machine.queued(
                        ticket, message.pool, message.position, message.estimated_wait
                    )
                else:
                    effects = self.machine.admitted(ticket, waited)
                self._perform(effects)
            case p.UsageOverflowed():
                self.machine.usage_overflowed()
            case Abort():
                self._perform(self.machine.abort(message.handle))
            case SetModel(model=model, context_window=window, counter=counter):
                measure = SessionEstimate(self.spec, counter) if counter is not None else None
                self.machine.set_model(model, window, counter, measure)
            case GetState():
                machine = self.machine
                return AgentStatus(state=str(machine.state), queued=len(machine.queue), model=machine.model)
            case _:
                raise TypeError(f"agent: unexpected message {type(message).__name__}")
        return None

    def _on_prompt(self, prompt: Prompt) -> None:
        if self._content is not None:  # for its turn's span, should it start one (its agent_start)
            self._content.put(self.session_id, "prompt", prompt.handle.id, prompt.inputs)
        self._perform(self.machine.prompt(prompt))

    # -- performing effects ---------------------------------------------------------------------------------
    def _perform(self, effects: list[fx.Said] | None) -> None:
        """Perform ``effects`` in order, each by its performer (see :func:`_performs`). Only the last may be
        awaited: answered at once, its performer returns the machine's next effects, performed in turn;
        answered later, the answer comes back as a message."""
        performers = _PERFORMERS
        while effects:
            following = None
            for effect in effects:
                following = performers[type(effect)](self, effect)
            effects = following

    # done and forgotten

    @_performs(*ev.EVENTS)
    def _publish(self, event: ev.Event) -> None:
        self.publish(event)

    @_performs(fx.PublishBestEffort)
    def _publish_best_effort(self, effect: fx.PublishBestEffort) -> None:
        try:
            self.publish(effect.event)
        except Exception:  # the bus may be gone at shutdown; the handle is answered regardless
            log.debug("could not publish %s", effect.event.type, exc_info=True)

    @_performs(fx.Resolve)
    def _resolve(self, effect: fx.Resolve) -> None:
        effect.prompt.handle.set_result(effect.result)

    @_performs(fx.Reject)
    def _reject(self, effect: fx.Reject) -> None:
        effect.prompt.handle.set_exception(RuntimeError(effect.reason))

    @_performs(fx.ResolveAbort)
    def _resolve_abort(self, effect: fx.ResolveAbort) -> None:
        effect.handle.set_result(effect.value)

    @_performs(fx.SaveOutput)
    def _save(self, effect: fx.SaveOutput) -> None:
        """Hand the full text of a clipped tool result to the writer thread."""
        publish, sid, path = self.publish, self.session_id, effect.path

        def written(error: Exception | None) -> None:  # on the writer thread
            if error is not None:
                publish(ev.PersistenceFailed(session_id=sid, path=path, error=str(error)))

        self.services.writer.write_file(Path(path), effect.data, written)

    @_performs(fx.LearnWindow)
    def _learn_window(self, effect: fx.LearnWindow) -> None:
        """The window the provider stated, for the session's other actors (and their restarts) and for its
        endpoint (sessions started later on it)."""
        window, model = effect.window, effect.model
        self.refs.learned_window = window
        update = SetModel(model, window)
        for ref in (self.refs.overflow_ref, self.refs.usage_ref, self.refs.compactor_ref):
            if ref is not None:
                ref.tell(update)
        self.services.gateway.windows.learn(endpoint_of(model, self.spec.api_base), model, window)

    @_performs(fx.RecordStep)
    def _record_step(self, effect: fx.RecordStep) -> None:
        self._tell_store(p.RecordStep(effect.record))

    @_performs(fx.LearnCountRatio)
    def _learn_count_ratio(self, effect: fx.LearnCountRatio) -> None:
        """The count ratio the session's replies taught it, for the compactor's summarizer requests (and for
        the restarts of either: :attr:`SessionRefs.count_ratio`)."""
        self.refs.count_ratio = (effect.model, effect.ratio)
        compactor = self.refs.compactor_ref
        if compactor is not None:
            with contextlib.suppress(pykka.ActorDeadError):  # restarting: it learns from its own replies
                compactor.tell(p.CountRatioLearned(effect.model, effect.ratio))

    @_performs(fx.SyncTurn)
    def _sync_turn(self, effect: fx.SyncTurn) -> None:
        self._tell_store(p.SyncTurn(ended=effect.ended))

    def _tell_store(self, message: p.RecordStep | p.SyncTurn) -> None:
        store = self.refs.store_ref  # None while the store restarts: the turn goes on (or still ends)
        if store is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                store.tell(message)

    @_performs(fx.Resumed)
    def _resumed(self, effect: fx.Resumed) -> None:
        self.refs.resumed.set_result(effect.handle)

    @_performs(fx.CancelIO)
    def _cancel_io(self, effect: fx.CancelIO) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._tools is not None:
            self._tools.cancel()
            self._tools = None

    @_performs(fx.CancelApprovals)
    def _cancel_approvals(self, effect: fx.CancelApprovals) -> None:
        self.services.approvals.cancel_session(self.session_id, effect.reason)

    @_performs(fx.RestoreUsage)
    def _restore_usage(self, effect: fx.RestoreUsage) -> None:
        self.refs.usage.tell(p.Restore(effect.messages, effect.spent, effect.read))

    @_performs(fx.Abandon)
    def _abandon(self, effect: fx.Abandon) -> None:
        abandon(effect.handover, effect.reason, self.services.bus, self.session_id)

    # awaited: answered at once (the machine's next effects returned) or later (None returned)

    @_performs(fx.TakeHandover)
    def _take_handover(self, effect: fx.TakeHandover) -> list[fx.Said]:
        handover, self.refs.handover = self.refs.handover, None
        return self.machine.answer(effect.ticket, handover)

    @_performs(fx.Route)
    def _route(self, effect: fx.Route) -> list[fx.Said]:
        routed = self._prepare(effect.request)
        if self._content is not None and self._prepared is not None:  # for the call's span: before its event
            self._content.put(self.session_id, "request", effect.request_id, self._prepared.messages)
        return self.machine.answer(effect.ticket, routed)

    @_performs(fx.RefreshTools)
    def _refresh_tools(self, effect: fx.RefreshTools) -> list[fx.Said] | None:
        mcp = self.spec.mcp
        if mcp is None or not mcp.needs_refresh():
            return self.machine.answer(effect.ticket, None)
        # Before a turn's first request: the session's MCP servers started and their tools listed (design
        # §3.9), off this thread. A server that fails is an event; the turn goes on.
        me, ticket = self.actor_ref, effect.ticket
        mcp.refresh(lambda registry: me.tell(_McpTools(ticket, registry)))
        return None

    @_performs(fx.Persist)
    def _persist(self, effect: fx.Persist) -> list[fx.Said] | None:
        store = self._store(effect.optional)
        if store is None:
            return self.machine.answer(effect.ticket, fx.Failed("the store is not running"))
        append = p.Append(
            effect.messages, with_view=effect.with_view, end_turn=effect.end_turn, steps=effect.steps
        )
        self.call(store, append, self._then(effect.ticket))
        return None

    @_performs(fx.ReadContext)
    def _read_context(self, effect: fx.ReadContext) -> list[fx.Said] | None:
        store = self._store(effect.optional)
        if store is None:
            return self.machine.answer(effect.ticket, fx.Failed("the store is not running"))
        self.call(store, p.GetContext(), self._then(effect.ticket))
        return None

    @_performs(fx.Overlay)
    def _overlay(self, effect: fx.Overlay) -> None:
        self.call(self.refs.store, p.Overlay(effect.messages), self._then(effect.ticket))

    @_performs(fx.Hide)
    def _hide(self, effect: fx.Hide) -> None:
        hide = p.SetVisibility(message_ids=effect.message_ids, agent_visible=False)
        self.call(self.refs.store, hide, self._then(effect.ticket))

    @_performs(fx.Compact)
    def _compact(self, effect: fx.Compact) -> None:
        if effect.emergency:
            compact = p.Compact(
                effect.trigger, emergency=True, cause=effect.cause, count_ratio=effect.count_ratio
            )
            self.call(self.refs.compactor, compact, self._then(effect.ticket))
        else:
            maybe = p.MaybeCompact(effect.trigger, count_ratio=effect.count_ratio)
            self.call(self.refs.compactor, maybe, self._then(effect.ticket))

    @_performs(fx.ArchiveTools)
    def _archive_tools(self, effect: fx.ArchiveTools) -> None:
        self.call(self.refs.compactor, p.MaybeArchiveTools(), self._then(effect.ticket))

    @_performs(fx.Classify)
    def _classify(self, effect: fx.Classify) -> None:
        classify = p.ClassifyError(
            error=effect.error,
            recoveries_this_turn=effect.recoveries_this_turn,
            estimated_tokens=effect.estimated_tokens,
        )
        self.call(self.refs.overflow, classify, self._then(effect.ticket))

    def _store(self, optional: bool) -> Ref[p.StoreMessage] | None:
        """The store's ref; when ``optional``, None while it is not running (else that is a failure)."""
        return self.refs.store_ref if optional else self.refs.store

    def _then(self, ticket: int) -> Callable[[Any], None]:
        """The continuation of a call made for the awaited effect ``ticket``: its answer, to the machine."""

        def then(value: Any) -> None:
            if isinstance(value, CallFailed):
                value = fx.Failed(str(value), value.__cause__)
            self._perform(self.machine.answer(ticket, value))

        return then

    @_performs(fx.RecordAnswer)
    def _record_answer(self, effect: fx.RecordAnswer) -> None:
        """The usage tracker and the store both answer before the turn goes on; they work meanwhile, each on
        its own. A failure of either is the answer at once."""
        waiting = [2]
        then = self._then(effect.ticket)

        def answered(value: object) -> None:
            if isinstance(value, CallFailed):
                then(value)
                return
            waiting[0] -= 1
            if not waiting[0]:
                then(None)

        message = effect.message
        self.call(
            self.refs.usage,
            p.RecordResponse(message=message, estimated_input=effect.estimated_input),
            answered,
        )
        if effect.check_usage and message.usage is not None:  # a silent overflow is told back; "no" is not
            self.refs.overflow.tell(
                p.CheckUsage(input_tokens=message.usage.input_tokens, notify=self.actor_ref)
            )
        self.call(self.refs.store, p.Append((message,), end_turn=effect.end_turn), answered)

    # -- the provider call ------------------------------------------------------------------------------
    def _prepare(self, spec: fx.RequestSpec) -> fx.Routed:
        """Build the request the machine decided (with the session's endpoint, key and limits) and say
        where it goes."""
        cfg = self.spec.config
        admission = Admission(
            flow=self.session_id,
            priority=Priority.NEW_TURN if spec.first else Priority.NEXT_STEP,
            weight=cfg.capacity.weight,
            input_tokens=spec.estimated_tokens,
            wait_budget=spec.wait_budget,
        )
        request = CompletionRequest(
            admission=admission,
            model=spec.model,
            messages=list(spec.messages),
            tools=list(spec.tools),
            api_base=self.spec.api_base,
            api_key=self.spec.api_key,
            max_tokens=spec.max_tokens,
            extra=dict(spec.extra),
            timeout=cfg.retry.request_timeout,
            include_reasoning=cfg.agent.send_reasoning,
            mock_response=cfg.agent.mock_response,
            transport=cfg.gateway.transport,
            cache=None
            if spec.cache is None
            else CacheHints(
                breakpoints=spec.cache.positions,
                tools=spec.cache.tools,
                key=self.session_id,
                ttl=cfg.gateway.cache_ttl,
            ),
        )
        route = self.services.gateway.route(request)
        self._prepared = request
        address, port = self._server
        return fx.Routed(
            transport=route.transport, provider=route.provider, server_address=address, server_port=port
        )

    @_performs(fx.CallModel)
    def _call_model(self, effect: fx.CallModel) -> None:
        assert self._prepared is not None
        request, self._prepared = self._prepared, None
        cfg = self.spec.config
        me, ticket, publish, sid, turn = (
            self.actor_ref,
            effect.ticket,
            self.publish,
            self.session_id,
            effect.turn_id,
        )
        # The gateway's loop thread runs on_delta and on_retry, one after the other.
        streamed = [False]
        message_id = [effect.message_id]  # a new one when an attempt that streamed is retried
        # One call allowed: the calls after the first are not shown (the machine drops them, design §3.6).
        first_call: list[int | None] | None = [None] if effect.request.one_call else None

        def on_delta(delta: Delta) -> None:
            streamed[0] = True
            if first_call is not None and delta.kind == "tool_call":
                if first_call[0] is None:
                    first_call[0] = delta.index
                elif delta.index != first_call[0]:
                    return
            if delta.kind == "text":
                publish(ev.TextDelta(session_id=sid, turn_id=turn, delta=delta.text))
            elif delta.kind == "reasoning":
                publish(ev.ReasoningDelta(session_id=sid, turn_id=turn, delta=delta.text))
            else:
                publish(
                    ev.ToolCallDelta(
                        session_id=sid,
                        turn_id=turn,
                        index=delta.index or 0,
                        call_id=delta.call_id,
                        name=delta.name,
                        arguments_delta=delta.text,
                    )
                )

        def on_stall(seconds: float) -> None:
            publish(ev.StreamStalled(session_id=sid, turn_id=turn, seconds=seconds))

        content, request_id = self._content, effect.message_id

        def deliver(result: CompletionResult) -> None:
            if content is not None and result.message is not None:  # for the call's span: before its event
                content.put(sid, "response", request_id, result.message)
            me.tell(_ProviderDone(ticket, result, message_id[0]))

        report_retry = retry_reporter(publish, sid, turn)

        def reset_then_report(info: RetryInfo) -> None:
            if streamed[0]:  # what the failed attempt streamed is void: subscribers drop it
                streamed[0] = False
                if first_call is not None:
                    first_call[0] = None
                message_id[0] = new_id()
                publish(
                    ev.StreamReset(
                        session_id=sid, turn_id=turn, attempt=info.attempt, message_id=message_id[0]
                    )
                )
            report_retry(info)

        def on_queued(pool: str, position: int, estimated_wait: float) -> None:
            me.tell(_Queued(ticket, pool, position, estimated_wait))

        def on_admitted(waited: float) -> None:
            me.tell(_Queued(ticket, "", waited=waited))

        self._call = self.services.gateway.complete(
            request,
            deliver,
            on_delta=on_delta,
            on_retry=reset_then_report,
            on_stall=on_stall,
            stall_after=cfg.agent.stream_stall_seconds,
            on_queued=on_queued,
            on_admitted=on_admitted,
        )

    # -- the tools --------------------------------------------------------------------------------------
    @_performs(fx.RunTools)
    def _run_tools(self, effect: fx.RunTools) -> None:
        ticket, calls, turn, step = effect.ticket, effect.calls, effect.turn_id, effect.step
        me, sid, publish = self.actor_ref, self.session_id, self.publish
        spec, services, content = self.spec, self.services, self._content
        cfg = spec.config

        def on_start(call: ToolCallPart) -> None:
            publish(
                ev.ToolExecutionStart(
                    session_id=sid, turn_id=turn, call_id=call.id, name=call.name, arguments=call.arguments
                )
            )

        def on_output(call: ToolCallPart, chunk: str) -> None:
            publish(ev.ToolOutput(session_id=sid, turn_id=turn, call_id=call.id, chunk=chunk))

        def on_done(res: ToolRunResult) -> None:
            message = res.message
            error = None
            if message.is_error:
                kind = message.metadata.get("error")
                error = kind if isinstance(kind, str) else "tool_error"
            if content is not None:  # what the call's span records (telemetry.record_content)
                content.put(sid, "result", res.call.id, message.text)
            publish(
                ev.ToolExecutionEnd(
                    session_id=sid,
                    turn_id=turn,
                    call_id=res.call.id,
                    name=res.call.name,
                    is_error=message.is_error,
                    duration=res.duration,
                    output_chars=len(message.text),
                    truncated=res.truncated,
                    error=error,
                )
            )

        approve = None
        if spec.approval is not None or spec.require_approval:

            def approve(call: ToolCallPart) -> bool | str:
                approved, reason = services.approvals.request(sid, turn, call, spec.approval)
                return True if approved else (reason or "denied by the approval hook")

        self._tools = services.executor.run(
            list(calls),
            spec.tools,
            self._tool_context_factory(turn),
            timeout=cfg.agent.tool_timeout,
            limits=cfg.tool_output,
            spill_dir=services.directory.spill_dir(sid),
            approve=approve,
            on_start=on_start,
            on_output=on_output,
            on_done=on_done,
            on_all_done=lambda results: me.tell(_ToolsDone(ticket, list(results))),
            before_run=self._tool_start_recorder(turn, step),
        )

    def _tool_start_recorder(self, turn: str, step: int) -> Callable[[ToolCallPart, Tool], None]:
        """What a tool's worker calls right before the tool: the call's start recorded in the log (design
        §3.12). A tool that is not idempotent runs only once that record is written (a crash after it: the
        outcome is unknown, and the call is not run again); an idempotent one does not wait."""
        refs = self.refs

        def record(call: ToolCallPart, tool: Tool) -> None:  # on the call's worker thread
            message = p.RecordStep(
                step_record(turn, "tool_started", step=step, call_id=call.id, name=call.name)
            )
            try:
                store = refs.store
                if tool.idempotent:
                    store.tell(message)
                    return
                stored = store.ask(message, block=False).get(timeout=_RECORD_TIMEOUT)
            except Exception as exc:
                raise RuntimeError(f"its start could not be recorded in the session's log ({exc})") from exc
            if stored.error is not None:
                raise RuntimeError(f"its start could not be recorded in the session's log ({stored.error})")

        return record

    def _tool_context_factory(self, turn_id: str) -> ContextFactory:
        return context_factory(
            session_id=self.session_id,
            workspace=self.spec.workspace,
            config=self.spec.config,
            logs_dir=self.services.directory.spill_dir(self.session_id),
            turn_id=turn_id,
            saved_dirs=(
                self.services.directory.spill_dir(self.session_id),
                self.services.directory.artifacts_dir(self.session_id),
            ),
        )


def abandon(handover: Handover, reason: str, bus: EventBus | None = None, session_id: str = "") -> None:
    """Answer every prompt of a handover nobody will take up (the session stopped, or could not recover);
    with ``bus``, its run ends for subscribers too (its ``error`` and ``agent_end``, as any turn does)."""
    run = handover.run
    if run is not None and bus is not None:
        try:
            bus.publish(
                ev.ErrorOccurred(
                    session_id=session_id, message=reason, code="agent_crashed", turn_id=run.turn_id
                )
            )
            bus.publish(
                ev.AgentEnd(
                    session_id=session_id,
                    turn_id=run.turn_id,
                    status="error",
                    usage=run.usage,
                    steps=run.step,
                )
            )
        except Exception:  # the bus may be gone at shutdown; the handles are answered regardless
            log.debug("could not publish the end of an abandoned turn", exc_info=True)
    if run is not None:
        run.prompt.handle.set_result(
            TurnResult(
                prompt_id=run.prompt.handle.id, status="error", usage=run.usage, steps=run.step, error=reason
            )
        )
    for queued in handover.queue:
        queued.handle.set_result(TurnResult(prompt_id=queued.handle.id, status="error", error=reason))
