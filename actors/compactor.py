"""The compactor actor (design §5): decides when a session compacts and carries it out.

The rules are pure functions in ``runtime.context`` (trigger and estimate, cut point, summarizer
requests, fallback, progress guard, tool archiving); this shell fetches the session's context from the
store, sends the summarizer requests through the gateway, writes the artifacts through the log writer,
records the result in the store and broadcasts ``compaction_start`` / ``compaction_end`` /
``compaction_failed``. One compaction runs at a time; requests that arrive meanwhile wait their turn.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec

from actors import protocol as p
from actors._base import CallFailed, Reply, SessionActor, retry_reporter, server_of
from actors.protocol import Compact, MaybeArchiveTools, MaybeCompact, Outcome, SetModel
from actors.wiring import Services, SessionRefs, SessionSpec
from runtime import events as ev
from runtime.context import compaction as comp
from runtime.context import tool_summary as ts
from runtime.context.estimate import ContextEstimate, effective_limit, estimate_context, should_compact
from runtime.context.working_set import working_set_start
from runtime.errors import RuntimeStateError
from runtime.events import CompactionTrigger, OverflowCause
from runtime.handles import CompactionResult
from runtime.messages import KIND_COMPACTION_SUMMARY, Message, Usage, new_id
from runtime.store.tree import DEAD_KEY
from runtime.tokens import TokenCounter

if TYPE_CHECKING:
    from runtime.gateway import CacheHints, CallHandle, CompletionResult, RetryInfo

log = logging.getLogger("agentcell.compactor")

CompactorRequest: TypeAlias = MaybeCompact | Compact | MaybeArchiveTools
JobAnswer: TypeAlias = "Outcome | p.ContextView | None"  # an Outcome, or MaybeArchiveTools' answer


class SessionEstimate:
    """A session's context estimate (design §4.2): the input size of a request made from a store view now.

    The agent uses it to see whether a request can go out at once; the compactor, to decide and to
    report. The system prompt and tools are counted once; messages through the counter's cache.
    """

    def __init__(self, spec: SessionSpec, counter: TokenCounter) -> None:
        self._spec = spec
        self._counter = counter
        self._count = counter.count_message
        self._system_tokens = counter.count_system(spec.system_prompt) if spec.system_prompt else 0
        self._tools: Any = None
        self._tools_count = 0

    @property
    def _tools_tokens(self) -> int:
        """The tool schemas' tokens, counted again when the session's registry is replaced (its MCP
        servers' tools arrived or changed)."""
        tools = self._spec.tools
        if tools is not self._tools:
            self._tools_count = self._counter.count_tools(tools.schemas()) if len(tools) else 0
            self._tools = tools
        return self._tools_count

    @property
    def fixed_tokens(self) -> int:
        """What every request costs before its messages: the system prompt and the tool schemas."""
        return self._system_tokens + self._tools_tokens

    def full(self, messages: Sequence[Message]) -> int:
        """A full count of a request made from ``messages``: no provider usage to anchor on."""
        return self.fixed_tokens + sum(self._count(m) for m in messages if m.agent_visible)

    def __call__(self, view: p.ContextView) -> ContextEstimate:
        return estimate_context(
            view.messages,
            count=self._count,
            system_tokens=self._system_tokens,
            tools_tokens=self._tools_tokens,
            usage_floor=view.usage_floor,
        )


class CompactionInterrupted(RuntimeStateError):
    """The compactor stopped (crashed, or its session stopped) before it answered this request."""


class _SummaryDone(msgspec.Struct, frozen=True):
    job: int
    index: int
    result: CompletionResult


@dataclass
class _Job:
    id: int
    request: CompactorRequest
    reply: Callable[[JobAnswer], None]
    fail: Callable[[str], None]
    view: Any = None  # the ContextView the job started from (set before anything reads it)
    estimate: ContextEstimate | None = None
    plan: Any = None
    answers: list[str | None] = field(default_factory=list)
    outstanding: int = 0
    tokens_before: int = 0  # the full count before (design §4.2): every event of the compaction reports it
    artifacts: list[str] = field(default_factory=list)
    calls: list[CallHandle] = field(default_factory=list)  # the summarizer calls in flight
    number: int = 0  # the compaction's number in its artifacts' names
    spent: Usage = field(default_factory=Usage)  # what its summarizer calls cost (design §4.1)


class Compactor(SessionActor):
    def __init__(
        self,
        spec: SessionSpec,
        services: Services,
        refs: SessionRefs,
        counter: TokenCounter,
        context_window: int,
        *,
        model: str,
    ) -> None:
        super().__init__(spec.session_id, services.bus.publish)
        self.spec = spec
        self.services = services
        self.refs = refs
        self.counter = counter
        self.model = model  # the session's current model (its spec holds the one it started with)
        self.context_window = context_window
        self.cfg = spec.config.compaction
        self._jobs: deque[_Job] = deque()
        self._active: _Job | None = None
        self._job_ids = 0
        self._no_progress_at: str | None = None  # leaf of the last history that could not be compacted
        self._compactions: int | None = None  # number of the latest compaction's artifacts; read lazily
        # The session's learned server count ÷ ours (design §4.5), as the turn machine last told it with a
        # compaction request; None until then (and after a model change)
        self._count_ratio: float | None = None
        self._set_summarizer()
        self.estimate = SessionEstimate(spec, counter)

    def _set_summarizer(self) -> None:
        from runtime.models import model_info

        self.summarizer_model = self.cfg.summarizer_model or self.model
        if self.summarizer_model == self.model:  # the session's own window: a learned one included
            self.summarizer_window = self.context_window
        else:
            self.summarizer_window = model_info(self.summarizer_model, self.spec.config.models).context_window

    def _summarizer_ratio(self) -> float:
        """What the summarizer's server counts per token counted here (design §4.5): the session's learned
        ratio when the summarizer is its own model and the turn machine told it, else the default for the
        summarizer's model (:func:`~runtime.turn.fit.default_count_ratio`)."""
        if self.summarizer_model == self.model and self._count_ratio is not None:
            return self._count_ratio
        from runtime.turn.fit import default_count_ratio

        return default_count_ratio(self.summarizer_model, self.spec.config)

    # -- lifecycle --------------------------------------------------------------------------------------
    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self._abandon_jobs(f"the compactor crashed ({exception_type.__name__}: {exception_value})")

    def on_stop(self) -> None:
        self._abandon_jobs("the compactor was stopped (its session stopped or restarted)")

    def _abandon_jobs(self, why: str) -> None:
        """Answer every request still waiting, so no caller (a ``compact`` handle) waits forever; a
        compaction cut short after its ``compaction_start`` ends with ``compaction_failed``."""
        jobs = ([self._active] if self._active is not None else []) + list(self._jobs)
        self._active = None
        self._jobs.clear()
        for job in jobs:
            for call in job.calls:  # a summarizer answer would find no one waiting for it
                call.cancel()
            request = job.request
            tokens = job.tokens_before or (job.estimate.tokens if job.estimate is not None else 0)
            try:
                if isinstance(request, MaybeCompact | Compact) and job.plan is not None:  # it was announced
                    self.emit(
                        ev.CompactionFailed,
                        error=f"the compaction was interrupted: {why}",
                        reason="interrupted",
                        tokens=tokens,
                        window=self.context_window,
                        trigger=request.trigger,
                        messages=len(job.view.messages) if job.view is not None else 0,
                        mode=self.cfg.mode,
                        cause=self._cause(job),
                    )
                job.fail(why)
            except Exception:  # the bus or a caller may be gone at shutdown: answer the rest regardless
                log.debug("could not answer an interrupted compactor request", exc_info=True)

    # -- mailbox ----------------------------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        match message:
            case Reply():
                self.handle_reply(message)
            case _SummaryDone():
                self._on_summary(message)
            case SetModel(model=model, context_window=window, counter=counter):
                if model != self.model:  # another tokenizer: the ratio is learned again
                    self._count_ratio = None
                self.model = model
                if window is not None:
                    self.context_window = window
                if counter is not None:
                    self.counter, self.estimate = counter, SessionEstimate(self.spec, counter)
                self._set_summarizer()
            case MaybeCompact() | Compact():
                if message.count_ratio is not None:
                    self._count_ratio = message.count_ratio
                self._enqueue(message)
            case MaybeArchiveTools():
                self._enqueue(message)
            case _:
                raise TypeError(f"compactor: unexpected message {type(message).__name__}")
        return None

    def _enqueue(self, request: CompactorRequest) -> None:
        asker = self.defer_reply()  # answered when the job is done (None for a tell)
        self._job_ids += 1

        handle = getattr(request, "handle", None)

        def reply(value: JobAnswer) -> None:
            if handle is not None and isinstance(value, Outcome):
                handle.set_result(self._as_result(value))
            if asker is not None:
                asker.set(value)

        def fail(why: str) -> None:
            """The job was cut short: a ``compact`` handle gets a failed result, an asking actor an error
            (so an agent ends its run instead of going on to a provider call it cannot see through)."""
            if handle is not None:
                handle.set_result(CompactionResult(compacted=False, reason=why))
            if asker is not None:
                error = CompactionInterrupted(why)
                asker.set_exception((CompactionInterrupted, error, None))

        self._jobs.append(_Job(self._job_ids, request, reply, fail))
        self._next()

    def _next(self) -> None:
        if self._active is not None or not self._jobs:
            return
        job = self._active = self._jobs.popleft()
        self.call(self.refs.store, p.GetContext(), lambda view: self._with_view(job, view))

    def _done(self, job: _Job, value: JobAnswer) -> None:
        self._active = None
        job.reply(value)
        self._next()

    # -- deciding -------------------------------------------------------------------------------------
    def _with_view(self, job: _Job, view: p.ContextView | CallFailed) -> None:
        if isinstance(view, CallFailed):
            self._done(job, Outcome(message=f"store unavailable: {view}"))
            return
        job.view = view
        estimate = job.estimate = self.estimate(view)
        request = job.request
        messages = tuple(view.messages)
        unchanged = Outcome(messages=messages, estimate=estimate.tokens)
        if isinstance(request, MaybeArchiveTools):
            self._archive_tools(job)
            return
        if isinstance(request, MaybeCompact):
            if view.dead is not None:  # no turn runs in a dead session; a manual compaction may revive it
                dead = Outcome(
                    messages=messages, estimate=estimate.tokens, attempted=True, dead=True, message=view.dead
                )
                self._done(job, dead)
                return
            forced = request.trigger == "usage_overflow"
            due = forced or should_compact(estimate.tokens, self.context_window, self.cfg, len(messages))
            if not self.cfg.auto or not due or request.attempted:
                self._done(job, unchanged)
                return
            if self._leaf(messages) == self._no_progress_at:
                self._done(job, unchanged)  # never compact the same unchanged history twice (5.6)
                return
            self._start(job, request.trigger, emergency=False, keep=None, instructions=None)
            return
        self._start(job, request.trigger, request.emergency, request.keep_recent_tokens, request.instructions)

    @staticmethod
    def _cause(job: _Job) -> OverflowCause | None:
        """Why an ``overflow`` compaction runs (``refused``, ``counted``): its events say it."""
        return job.request.cause if isinstance(job.request, Compact) else None

    @staticmethod
    def _leaf(messages: tuple[Message, ...]) -> str | None:
        return messages[-1].id if messages else None

    # -- compacting -----------------------------------------------------------------------------------
    def _start(
        self,
        job: _Job,
        trigger: CompactionTrigger,
        emergency: bool,
        keep: int | None,
        instructions: str | None,
    ) -> None:
        assert job.estimate is not None
        messages = list(job.view.messages)
        # One figure from start to end: the full count the progress guard compares the summary with (the
        # estimate that triggered may rest on a provider's usage, which no count of ours can match).
        tokens_before = job.tokens_before = self.estimate.full(messages)
        # An automatic compaction never summarizes the working set away (design §5.13).
        keep_from = working_set_start(messages) if trigger != "manual" else None
        keep_tokens = comp.keep_recent_budget(
            self.context_window, self.cfg, emergency=emergency, override=keep
        )
        plan = comp.plan_compaction(
            messages,
            mode=self.cfg.mode,
            trigger=trigger,
            keep_tokens=keep_tokens,
            count=self.counter.count_message,
            config=self.cfg,
            instructions=instructions,
            summarizer_window=self.summarizer_window,
            count_text=self.counter.count_text,
            force=emergency or trigger == "manual",
            keep_from=keep_from,
            room=comp.summary_room(
                effective_limit(self.context_window, self.cfg), self.estimate.fixed_tokens
            ),
            cached_prefix=self.estimate.fixed_tokens if self._rides_the_cache() else None,
            count_ratio=self._summarizer_ratio(),
        )
        if isinstance(plan, comp.NothingToCompact):
            if trigger in ("threshold", "usage_overflow"):  # nothing to do is not news: stay quiet
                self._no_progress_at = self._leaf(tuple(messages))
                self._done(
                    job, Outcome(messages=tuple(messages), estimate=job.estimate.tokens, attempted=True)
                )
            elif trigger == "manual":  # asked for, so answered: there is nothing to do, which is no failure
                self._skip(job, trigger, "nothing_to_compact", f"nothing to compact: {plan.reason}")
            else:
                self._fail(job, trigger, "nothing_to_compact", plan.reason, job.estimate.tokens)
            return
        self.emit(
            ev.CompactionStart,
            trigger=trigger,
            messages_before=len(messages),
            tokens_before=tokens_before,
            mode=self.cfg.mode,
            cause=self._cause(job),
        )
        job.plan = plan
        job.answers = [None] * len(plan.requests)
        job.outstanding = len(plan.requests)
        if not plan.requests:
            self._finish(job, trigger)
            return
        job.number = self._next_artifact_number()
        inputs = "\n\n".join(
            f"=== {r.kind} ===\n--- system ---\n{r.system}\n--- prompt ---\n{r.prompt}"
            if not r.prefix
            else f"=== {r.kind} ===\n--- the session's system prompt, tools and {r.prefix} messages, as sent ---\n"
            f"--- prompt ---\n{r.prompt}"
            for r in plan.requests
        )
        self._write_artifact(0, inputs, job)
        for index, req in enumerate(plan.requests):
            if req.prefix:
                self._summarize_cached(job, index, plan.summarized[: req.prefix], req.prompt, req.max_tokens)
            else:
                self._summarize(job, index, self.summarizer_model, req.system, req.prompt, req.max_tokens)

    def _rides_the_cache(self) -> bool:
        """Whether summaries send the conversation itself (design §5.4): the summarizer is the session's
        own model, and cache hints are on."""
        return self.summarizer_model == self.model and self.spec.config.gateway.prompt_cache

    def _summarize_cached(
        self, job: _Job, index: int, summarized: Sequence[Message], prompt: str, max_tokens: int
    ) -> None:
        """A summary of ``summarized`` asked the way the session asks its own model: its system prompt,
        tools and messages as the agent sends them (the prefix the provider cached), then ``prompt``."""
        from runtime.gateway import cache_hints
        from runtime.messages import system as system_message
        from runtime.messages import user

        spec = self.spec
        messages = [system_message(spec.system_prompt)] if spec.system_prompt else []
        messages += [m for m in summarized if m.agent_visible]
        messages.append(user(prompt))
        tools = spec.tools.schemas() if len(spec.tools) else []
        gateway = spec.config.gateway
        hints = cache_hints(
            self.model, messages, tools, self.counter, key=self.session_id, ttl=gateway.cache_ttl
        )
        self._summarize(
            job,
            index,
            self.model,
            "",
            prompt,
            max_tokens,
            messages=messages,
            tools=tools,
            cache=hints,
            include_reasoning=spec.config.agent.send_reasoning,
        )

    def _summarize(
        self,
        job: _Job,
        index: int,
        model: str,
        system: str,
        prompt: str,
        max_tokens: int,
        *,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        cache: CacheHints | None = None,
        include_reasoning: bool = False,
    ) -> None:
        from runtime.capacity import Priority
        from runtime.gateway import Admission, CompletionRequest
        from runtime.messages import system as system_message
        from runtime.messages import user

        if messages is None:
            messages = [system_message(system), user(prompt)]
        # A compaction a turn waits for goes before the turns' own calls; a manual one is background work.
        manual = getattr(job.request, "trigger", None) == "manual"
        admission = Admission(
            flow=self.session_id,
            priority=Priority.BACKGROUND if manual else Priority.UNBLOCK,
            weight=self.spec.config.capacity.weight,
            input_tokens=sum(self.counter.count_message(m) for m in messages),
            wait_budget=self.spec.config.capacity.queue_timeout,
        )
        request = CompletionRequest(
            admission=admission,
            model=model,
            messages=messages,
            tools=tools or [],
            api_base=self.spec.api_base,
            api_key=self.spec.api_key,
            max_tokens=max_tokens,
            timeout=self.cfg.summarizer_timeout,
            stream=False,
            include_reasoning=include_reasoning,
            transport=self.spec.config.gateway.transport,
            cache=cache,
        )
        me, sid, publish, content = self.actor_ref, self.session_id, self.publish, self.services.content
        request_id = new_id()
        address, port = server_of(self.spec.api_base)
        if content is not None:  # what the call's span records (telemetry.record_content): before its event
            content.put(sid, "request", request_id, messages)
        self.emit(
            ev.SummaryRequest,
            request_id=request_id,
            purpose="tool_summary" if isinstance(job.request, MaybeArchiveTools) else "summary",
            model=model,
            max_tokens=max_tokens,
            server_address=address,
            server_port=port,
        )

        def deliver(result: CompletionResult) -> None:  # on the gateway's loop
            error, message = result.error, result.message
            if error is not None:
                if error.kind != "cancelled":  # (cut short by the compaction's end: that end says so)
                    publish(
                        ev.RequestFailed(
                            session_id=sid,
                            turn_id=None,
                            request_id=request_id,
                            kind=error.kind,
                            message=error.message,
                            status_code=error.status_code,
                            attempts=result.attempts,
                            transport=result.transport or None,
                            pool=result.pool or None,
                            waited=result.waited,
                            latency=result.latency,
                        )
                    )
            elif message is not None:
                if content is not None:
                    content.put(sid, "response", request_id, message)
                publish(
                    ev.SummaryResponse(
                        session_id=sid,
                        request_id=request_id,
                        stop_reason=message.stop_reason or ("tool_calls" if message.tool_calls else "stop"),
                        usage=message.usage or result.usage,
                        attempts=result.attempts,
                        transport=result.transport or None,
                        pool=result.pool or None,
                        waited=result.waited,
                        latency=result.latency,
                    )
                )
            me.tell(_SummaryDone(job.id, index, result))

        on_retry: Callable[[RetryInfo], None] = retry_reporter(publish, sid, None, request_id)  # events too
        job.calls.append(self.services.gateway.complete(request, deliver, on_retry=on_retry))

    def _on_summary(self, done: _SummaryDone) -> None:
        job = self._active
        if job is None or job.id != done.job:
            return
        result = done.result
        text = None if result.error is not None or result.message is None else result.message.text.strip()
        job.answers[done.index] = text or None
        if result.message is not None and result.message.usage is not None:
            job.spent = job.spent + result.message.usage
        job.outstanding -= 1
        if job.outstanding > 0:
            return
        if isinstance(job.request, MaybeArchiveTools):
            self._finish_archive(job)
        else:
            self._finish(job, job.request.trigger)

    def _finish(self, job: _Job, trigger: CompactionTrigger) -> None:
        assert job.estimate is not None
        tokens_before = job.tokens_before
        # The progress guard compares counts of the same kind: a full count before and after.
        outcome = comp.finish_compaction(
            job.plan,
            job.answers,
            count=self.counter.count_message,
            tokens_before=tokens_before,
            limit=effective_limit(self.context_window, self.cfg),
            kept_at=self._saved_as(self._artifact_path(job, 1)) if job.number else None,
        )
        if isinstance(outcome, comp.CompactionFailure):
            over = job.estimate.tokens >= self.context_window
            # Only hard_reset kills a session (design §5.8); otherwise the turn ends and the session goes on.
            dead = self.cfg.mode == "hard_reset" and (outcome.context_exceeded or over)
            if outcome.reason == "no_progress":
                self._no_progress_at = self._leaf(tuple(job.view.messages))
                if not (dead or outcome.context_exceeded) and trigger in ("manual", "threshold"):
                    # A summary no shorter than what it replaces: the conversation is as short as it gets.
                    after = outcome.tokens_after if outcome.tokens_after is not None else tokens_before
                    why = (
                        f"nothing to compact: a summary would take the context from {tokens_before:,} to "
                        f"{after:,} tokens (a compaction must save at least "
                        f"{self.cfg.min_reduction:.0%}); the conversation is unchanged"
                    )
                    self._skip(job, trigger, "no_progress", why)
                    return
            message = outcome.message
            if dead:  # design §5.8: no fallback; the log marks it dead
                message = (
                    f"{message.rstrip('.')}. The session is marked dead (its log is kept); a manual "
                    "compaction that succeeds revives it."
                )
                self.refs.store.tell(p.SetMetadata(DEAD_KEY, message))
            self._fail(job, trigger, outcome.reason, message, tokens_before, dead=dead)
            return
        summary = self._with_spend(outcome.summary, job)
        if summary is not outcome.summary:
            outcome = msgspec.structs.replace(
                outcome,
                summary=summary,
                messages=[summary if m is outcome.summary else m for m in outcome.messages],
            )
        self._write_artifact(1, outcome.unclipped_summary or summary.text, job)
        # Right after a compaction the estimate is a full count (design §4.2): usage from before it, which
        # may be a provider's inflated report (a silent overflow), no longer describes the context.
        tokens_after = self.estimate.full(outcome.messages)

        def recorded(reply: p.Stored | CallFailed) -> None:
            if isinstance(reply, CallFailed):
                self._fail(job, trigger, "store_error", str(reply), tokens_before)
                return
            self._no_progress_at = None
            if job.view.dead is not None:  # a manual compaction brought a dead session back
                self.refs.store.tell(p.SetMetadata(DEAD_KEY, ""))
            self.refs.usage.tell(p.Reset(context_tokens=tokens_after))
            self._record_spend(summary, job)  # the summarizer's spend is the session's (design §4.1)
            self.emit(
                ev.CompactionEnd,
                trigger=trigger,
                messages_before=len(job.view.messages),
                messages_after=len(outcome.messages),
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                summary_chars=len(summary.text),
                mode=self.cfg.mode,
                fallback=outcome.fallback,
                cause=self._cause(job),
            )
            self._done(
                job,
                Outcome(
                    messages=tuple(outcome.messages),
                    estimate=tokens_after,
                    attempted=True,
                    compacted=True,
                    messages_before=len(job.view.messages),
                    tokens_before=tokens_before,
                    summary_chars=len(summary.text),
                    fallback=outcome.fallback,
                ),
            )

        record = p.RecordCompaction(
            summary=summary,
            first_kept_id=outcome.first_kept_id,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            mode=self.cfg.mode,
            trigger=trigger,
            artifacts=tuple(job.artifacts),
        )
        self.call(self.refs.store, record, recorded)

    def _with_spend(self, summary: Message, job: _Job) -> Message:
        """``summary`` carrying what its summarizer calls cost, as a response carries its usage: the
        session's totals count it, live and when rebuilt from the log (design §4.1). A compaction's summary
        also carries, added by the store, what earlier compactions that recorded nothing spent
        (:meth:`_spent_unlogged`); :meth:`_record_spend` counts only this job's part live (the rest was
        counted as it failed)."""
        spent = job.spent
        if not (spent.input_tokens or spent.output_tokens):
            return summary
        return msgspec.structs.replace(summary, usage=spent)

    def _record_spend(self, summary: Message, job: _Job) -> None:
        """Count ``summary``'s spend in the session's totals, once it is in the log (:meth:`_with_spend`)."""
        if job.spent.input_tokens or job.spent.output_tokens:
            self.refs.usage.tell(p.RecordResponse(message=msgspec.structs.replace(summary, usage=job.spent)))

    def _spent_unlogged(self, job: _Job) -> None:
        """A compaction that ends without a summary in the log (no progress, a failure): what its summarizer
        calls cost is the session's all the same: counted now, recorded in the log (not as a message: the
        no-progress guard keys on the leaf), and carried by the next compaction's summary (design §4.1)."""
        spent, job.spent = job.spent, Usage()
        if not (spent.input_tokens or spent.output_tokens):
            return
        self.refs.store.tell(p.RecordSpend(spent))  # in the log: a restart's totals count it too
        record = Message(role="user", kind=KIND_COMPACTION_SUMMARY, agent_visible=False, usage=spent)
        self.refs.usage.tell(p.RecordResponse(message=record))

    def _skip(self, job: _Job, trigger: CompactionTrigger, reason: str, message: str) -> None:
        """A compaction with nothing to reduce: said once (``compaction_skipped``), the history unchanged."""
        self._spent_unlogged(job)
        messages = tuple(job.view.messages)
        self.emit(
            ev.CompactionSkipped,
            reason=reason,
            message=message,
            tokens=job.tokens_before,
            trigger=trigger,
            messages=len(messages),
            mode=self.cfg.mode,
            cause=self._cause(job),
        )
        assert job.estimate is not None
        self._done(
            job,
            Outcome(
                messages=messages,
                estimate=job.estimate.tokens,
                attempted=True,
                skipped=True,
                message=message,
                messages_before=len(messages),
                tokens_before=job.tokens_before,
            ),
        )

    def _fail(
        self,
        job: _Job,
        trigger: CompactionTrigger,
        reason: str,
        message: str,
        tokens: int,
        *,
        dead: bool = False,
    ) -> None:
        self._spent_unlogged(job)
        self.emit(
            ev.CompactionFailed,
            error=message,
            reason=reason,
            context_exceeded=dead,
            tokens=tokens,
            window=self.context_window,
            trigger=trigger,
            messages=len(job.view.messages) if job.view is not None else 0,
            mode=self.cfg.mode,
            cause=self._cause(job),
        )
        self._done(
            job,
            Outcome(
                messages=tuple(job.view.messages) if job.view is not None else (),
                estimate=job.estimate.tokens if job.estimate is not None else tokens,
                attempted=True,
                dead=dead,
                message=message,
                tokens_before=tokens,
            ),
        )

    def _next_artifact_number(self) -> int:
        """The next compaction number for artifact names. Numbers continue from the artifacts on disk across
        restarts, resumes and hibernation, so a later compaction never overwrites an earlier one's files."""
        if self._compactions is None:
            self._compactions = self.services.directory.last_compaction_number(self.session_id)
        self._compactions += 1
        return self._compactions

    def _artifact_path(self, job: _Job, which: int) -> Path:
        """The summarizer input (``which=0``) or the summary (1) of ``job``'s compaction."""
        return self.services.directory.compaction_artifacts(self.session_id, job.number)[which]

    @staticmethod
    def _saved_as(path: Path) -> str:
        """Where a clipped summary's whole text is, for the model: its path and its ``read_saved`` id."""
        return f'{path}, read_saved(id="{path.name}")'

    def _write_artifact(self, which: int, text: str, job: _Job) -> None:
        """Save the summarizer input (``which=0``) or the summary (1) beside the session (design §2.3)."""
        path = self._artifact_path(job, which)
        job.artifacts.append(str(path))
        publish, session_id = self.publish, self.session_id

        def written(error: Exception | None) -> None:  # on the writer thread
            if error is not None:
                publish(ev.PersistenceFailed(session_id=session_id, path=str(path), error=str(error)))

        data = text.encode("utf-8", errors="replace")  # a lone surrogate must not crash the compactor
        self.services.writer.write_file(path, data, written)

    # -- tool-result archiving (5.9) ------------------------------------------------------------------
    def _archive_tools(self, job: _Job) -> None:
        messages = list(job.view.messages)
        cfg = self.cfg
        plan = None
        if cfg.tool_summary_strategy != "off":
            assert job.estimate is not None
            caching = self.spec.config.gateway.prompt_cache
            min_freed, below = ts.archive_bounds(self.context_window, cfg, caching=caching)
            plan = ts.plan_tool_archive(
                messages,
                cutoff=cfg.tool_call_cutoff,
                strategy=cfg.tool_summary_strategy,
                input_chars=cfg.tool_summary_input_chars,
                output_chars=cfg.tool_summary_output_chars,
                heuristic_chars=cfg.heuristic_summary_chars,
                min_freed=min_freed,
                count=self.counter.count_message,
                tokens=job.estimate.tokens,
                below=below,
            )
        if plan is None:
            self._clear_tool_outputs(job, job.view)
            return
        job.plan = plan
        request = plan.request
        if request is None:  # heuristic strategy: no model call
            job.answers = []
            self._finish_archive(job)
            return
        job.answers = [None]
        job.outstanding = 1
        self._summarize(job, 0, self.summarizer_model, request.system, request.prompt, request.max_tokens)

    def _finish_archive(self, job: _Job) -> None:
        answer = job.answers[0] if job.answers else None
        replacements, summary = ts.finish_tool_archive(job.plan, answer)
        summary = self._with_spend(summary, job)
        store = self.refs.store

        def appended(reply: p.Stored | CallFailed) -> None:
            if isinstance(reply, CallFailed):
                self._spent_unlogged(job)
            else:
                self._record_spend(summary, job)
            self.emit(
                ev.ToolResultsArchived,
                archived=job.plan.results,
                strategy=str(summary.metadata.get("strategy", job.plan.strategy)),
                summary_chars=len(summary.text),
            )
            self._clear_tool_outputs(job, None)

        self.call(
            store,
            p.Overlay(tuple(replacements)),
            lambda _: self.call(store, p.Append((summary,)), appended),
        )

    def _clear_tool_outputs(self, job: _Job, current: p.ContextView | None) -> None:
        """The second half of ``MaybeArchiveTools``. ``current`` is the session's view when nothing has
        changed it since it was read (None: read it again). The job's answer is the view the next request
        can be made from when the context is as it was, or None when this changed it."""
        cfg = self.cfg
        if not cfg.clear_old_tool_outputs:
            self._done(job, current)
            return

        def with_view(view: p.ContextView | CallFailed) -> None:
            if isinstance(view, CallFailed):
                self._done(job, None)
                return
            cleared = ts.plan_tool_output_clearing(
                list(view.messages),
                count=self.counter.count_message,
                protect_tokens=cfg.clear_protect_tokens,
                min_freed=cfg.clear_min_freed_tokens,
            )
            if cleared is None:
                self._done(job, view)
                return

            def done(_: p.Stored | CallFailed) -> None:
                self.emit(
                    ev.ToolOutputsCleared,
                    cleared=len(cleared.replacements),
                    tokens_freed=cleared.tokens_freed,
                )
                self._done(job, None)

            self.call(self.refs.store, p.Overlay(tuple(cleared.replacements)), done)

        if current is not None:
            with_view(current)
        else:
            self.call(self.refs.store, p.GetContext(), with_view)

    @staticmethod
    def _as_result(outcome: Outcome) -> CompactionResult:
        return CompactionResult(
            compacted=outcome.compacted,
            skipped=outcome.skipped,
            reason=outcome.message,
            messages_before=outcome.messages_before,
            messages_after=len(outcome.messages),
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_before if outcome.skipped else outcome.estimate,
            summary_chars=outcome.summary_chars,
            fallback=outcome.fallback,
        )
