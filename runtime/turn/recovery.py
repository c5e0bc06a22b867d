"""The turn machine's recovery flows (design §3.1, §1.2, §3.12, §6.3): a crash or a stop, the recovery of a
restarted agent (a turn handed over, or taken up from the log) and the recovery from a context overflow.

They are part of :class:`~runtime.turn.machine.TurnMachine`, as :class:`RecoveryFlows`, its base: the
machine's core (:mod:`runtime.turn.core`) below them, a turn's own flows above.
"""

from __future__ import annotations

from runtime import events as ev
from runtime.context.integrity import (
    awaiting_client,
    interrupted_turn_note,
    repair_tool_calls,
    unfinished_turn,
)
from runtime.context.recovery import PROMPT_HIDDEN_NOTE, compaction_did_not_help, prompt_caused_overflow
from runtime.durable import MAX_RESUMES, TurnRecovery, process_name, recover_turn, turn_prompt
from runtime.handles import PromptHandle, TurnResult
from runtime.messages import Message, ToolCallPart, new_id
from runtime.turn.core import Flow, MachineCore
from runtime.turn.effects import (
    Abandon,
    CancelIO,
    Compact,
    Failed,
    Hide,
    LearnWindow,
    OutcomeLike,
    Persist,
    ReadContext,
    RefreshTools,
    Reject,
    Resolve,
    RestoreUsage,
    Resumed,
    Said,
    SyncTurn,
    TakeHandover,
    VerdictLike,
    ViewLike,
)
from runtime.turn.state import AgentState, Handover, PromptLike, TakenUpPrompt, TurnState

__all__ = ["RecoveryFlows"]


class RecoveryFlows(MachineCore):
    """What the machine does after a crash, at a stop, when a restarted agent takes a turn up, and when a
    request overflowed the context."""

    # -- a crash, a stop -------------------------------------------------------------------------------------
    def crash(self, reason: str, incoming: PromptLike | None = None) -> tuple[Handover | None, list[Said]]:
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
            self._publish(
                ev.ErrorOccurred(
                    session_id=self.session_id, message="queued prompt lost to an agent crash; resend it"
                )
            )
            self._emit(Reject(queued, "the agent crashed before this queued prompt ran"))
        self._flow, self._awaited = None, None
        return handover, self._take()

    def stop(self) -> list[Said]:
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

    # -- recovery after a crash (design §1.2, §3.12) ---------------------------------------------------------
    def recover(self) -> list[Said]:
        """The agent restarted after a crash: read the log, give orphaned calls their results, and take up
        the turn its predecessor was in (from :class:`TakeHandover`) or say it ended."""
        return self._begin(self._recovery())

    def resume(self, run: TurnState) -> list[Said]:
        """Take up ``run``, a turn cut off before its end, at its next step: from the log, without a new
        prompt (design §1.2)."""
        run.continued = True
        self.run = run
        return self._begin(self._continue(run))

    def _recovery(self) -> Flow:
        view = yield ReadContext()
        handover: Handover | None = yield TakeHandover()
        if isinstance(view, Failed):
            self._publish(
                ev.ErrorOccurred(
                    session_id=self.session_id,
                    message=f"agent recovery could not read the session: {view.message}",
                    code="recovery",
                )
            )
            if handover is not None:
                self._emit(
                    Abandon(handover, f"the session could not be read after an agent crash: {view.message}")
                )
            self._emit(RestoreUsage((), read=False))  # (a usage tracker waiting for it answers again)
            self._emit(Resumed(None))
            return
        self._emit(RestoreUsage(tuple(view.messages), view.spent))
        awaited = awaiting_client(view.messages)  # a turn that stopped for the client's tools still waits
        interrupted = unfinished_turn(view.messages, view.turn_ended_at)
        run = handover.run if handover is not None else None
        recovery = (
            recover_turn(view.messages, view.steps, idempotent=self._idempotent, awaited=awaited)
            if interrupted
            else None
        )
        if run is None and recovery is not None and not awaited:  # the process stopped mid-turn (§3.12)
            run = self._taken_up_run(view, recovery)
        if run is not None and recovery is not None:
            run.continued = True
            self.run = run  # (prompts wait meanwhile)
            taken_up = handover is None
            if taken_up:  # its caller is gone with the process: the runtime hands its handle out
                self._publish(
                    ev.AgentStart(
                        session_id=self.session_id,
                        turn_id=run.turn_id,
                        prompt_id=run.prompt.handle.id,
                        model=self.model,
                    )
                )
            self._emit(Resumed(run.prompt.handle if taken_up else None))
            if self.spec.mcp is not None:  # its MCP servers' tools, before the first request
                yield RefreshTools()
            yield from self._take_up(run, view, awaited, handover, recovery)
            return
        repairs = [r for r in repair_tool_calls(view.messages) if r.tool_call_id not in awaited]
        # A turn cut off and not taken up is said to be so in the log, which ends it.
        notes = [*repairs, interrupted_turn_note()] if interrupted else repairs
        if notes:
            yield Persist(messages=tuple(notes), end_turn=True)
        self._publish(
            ev.AgentRecovered(
                session_id=self.session_id,
                messages=len(view.messages),
                repaired_calls=len(repairs),
                interrupted_turn=interrupted,
                continued=False,
            )
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

    def _taken_up_run(self, view: ViewLike, recovery: TurnRecovery) -> TurnState | None:
        """The record of a turn the process stopped in (``recovery``: how it goes on), to take up from the
        log; None when it is not to be (the host said not to, it was taken up too often already, or the log
        names no prompt)."""
        prompt = turn_prompt(view.messages)
        if not self.spec.config.agent.resume_turns or recovery.resumed >= MAX_RESUMES or prompt is None:
            return None
        handle = PromptHandle(recovery.prompt_id or new_id())
        run = TurnState(prompt=TakenUpPrompt(prompt, handle), step=recovery.steps)
        if recovery.turn_id is not None:
            run.turn_id = recovery.turn_id
        return run

    def _take_up(
        self,
        run: TurnState,
        view: ViewLike,
        awaited: frozenset[str],
        handover: Handover | None,
        recovery: TurnRecovery,
    ) -> Flow:
        """Go on with ``run`` from the log as ``recovery`` decided: the results of calls that may not run
        again first, then the calls to run (again), or the next request."""
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
            ev.AgentRecovered(
                session_id=self.session_id,
                messages=len(view.messages),
                repaired_calls=len(notes),
                interrupted_turn=True,
                continued=True,
            )
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
            ev.TurnResumed(
                session_id=self.session_id,
                turn_id=run.turn_id,
                prompt_id=run.prompt.handle.id,
                resume_from=recovery.resume_from,
                step=recovery.steps,
                process=process_name(),
                rerun_calls=len(recovery.rerun),
                unknown_calls=len(recovery.unknown),
            )
        )

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

    def _idempotent(self, name: str) -> bool:
        tool = self.spec.tools.get(name)
        return tool is not None and tool.idempotent

    # -- overflow recovery (design §6.3) ---------------------------------------------------------------------
    def _on_verdict(self, run: TurnState, verdict: VerdictLike) -> Flow:
        if verdict.learned_window is not None:
            self._learn_window(verdict.learned_window, "overflow")
        if verdict.action == "compact_and_retry" and run.options.compaction:
            run.overflow_recoveries += 1
            self._record(run, "compaction", step=run.step)
            outcome: OutcomeLike = yield from self._ask(
                Compact(
                    trigger="overflow", emergency=True, cause="refused", count_ratio=self.count_ratio.value
                )
            )
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
        self._publish(
            ev.WindowLearned(session_id=self.session_id, old=old, new=window, source=source, model=self.model)
        )

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
