"""The compactor actor (design §5): decides when a session compacts and carries it out.

The rules are pure functions in ``runtime.context`` (trigger and estimate, cut point, summarizer
requests, fallback, progress guard, tool archiving); this shell fetches the session's context from the
store, has the summarizer requests sent and the artifacts written (:mod:`actors.summarizer`), records the
result in the store and broadcasts ``compaction_start`` / ``compaction_end`` / ``compaction_failed``.
One job (:mod:`actors.compaction_job`) runs at a time; requests that arrive meanwhile wait their turn. A
``MaybeArchiveTools`` job is :mod:`actors.tool_archive`'s.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec

from actors import protocol as p
from actors._base import CallFailed, Reply, SessionActor
from actors.compaction_job import Job, JobAnswer
from actors.protocol import Compact, CompactorJob, MaybeArchiveTools, MaybeCompact, Outcome, SetModel
from actors.session_estimate import SessionEstimate
from actors.summarizer import (
    Artifacts,
    Summarizer,
    SummaryPurpose,
    record_spend,
    record_unlogged_spend,
    saved_as,
    summarizer_input,
    with_spend,
)
from actors.tool_archive import ToolArchive
from actors.wiring import Services, SessionRefs, SessionSpec
from runtime import events as ev
from runtime.context import compaction as comp
from runtime.context.estimate import CountRatio, effective_limit, should_compact, usable_response
from runtime.context.summary_requests import SummaryRequest
from runtime.context.working_set import working_set_start
from runtime.errors import RuntimeStateError
from runtime.events import CompactionTrigger, OverflowCause
from runtime.handles import CompactionResult
from runtime.messages import Message, Usage
from runtime.store.tree import DEAD_KEY
from runtime.tokens import TokenCounter

if TYPE_CHECKING:
    from runtime.gateway import CompletionResult

log = logging.getLogger("agentcell.compactor")


class CompactionInterrupted(RuntimeStateError):
    """The compactor stopped (crashed, or its session stopped) before it answered this request."""


class _SummaryDone(msgspec.Struct, frozen=True):
    """The summarizer call ``index`` of job ``job`` ended with ``result``; it asked ``model`` with a request
    of ``counted`` tokens as counted here."""

    job: int
    index: int
    result: CompletionResult
    model: str
    counted: int


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
        self._jobs: deque[Job] = deque()
        self._active: Job | None = None
        self._job_ids = 0
        self._no_progress_at: str | None = None  # leaf of the last history that could not be compacted
        # The session's learned server count ÷ ours (design §4.5), as its agent last told it (with a
        # compaction request, or as it learned it; after a restart, as the session kept it); None until then
        # (and after a model change)
        told = refs.count_ratio
        self._count_ratio: float | None = told[1] if told is not None and told[0] == model else None
        # Each summarizer model's server count ÷ ours, learned from its replies here (design §4.5), and the
        # window its refusals stated, when smaller than the one it was given
        self._ratios: dict[str, CountRatio] = {}
        self._windows: dict[str, int] = {}
        self._set_summarizer()
        self.estimate = SessionEstimate(spec, counter)
        self.summarizer = Summarizer(spec, services, self.publish)
        self.artifacts = Artifacts(services, spec.session_id, self.publish)
        self.tool_archive = ToolArchive(
            self, spec, refs, summarize=self._summarize, done=self._done, spent_unlogged=self._spent_unlogged
        )

    def _set_summarizer(self) -> None:
        from runtime.models import model_info

        self.summarizer_model = self.cfg.summarizer_model or self.model
        if self.summarizer_model == self.model:  # the session's own window: a learned one included
            self.summarizer_window = self.context_window
        else:
            self.summarizer_window = model_info(self.summarizer_model, self.spec.config.models).context_window
        stated = self._windows.get(self.summarizer_model)
        if stated is not None and stated < self.summarizer_window:
            self.summarizer_window = stated

    def _summarizer_ratio(self) -> float:
        """What the summarizer's server counts per token counted here (design §4.5): the highest of what
        its replies taught the compactor and, when the summarizer is the session's own model, what the
        session's replies taught the agent; while neither has, the default for the summarizer's model."""
        learned = self._ratios.get(self.summarizer_model)
        taught = [learned.value] if learned is not None and learned.learned else []
        if self.summarizer_model == self.model and self._count_ratio is not None:
            taught.append(self._count_ratio)
        if taught:
            return max(taught)
        from runtime.turn.fit import default_count_ratio

        return default_count_ratio(self.summarizer_model, self.spec.config)

    def _learn_ratio(self, done: _SummaryDone) -> None:
        """A summarizer reply's usage against our count of its request: its model's count ratio."""
        message = done.result.message
        if message is None or not usable_response(message):
            return
        assert message.usage is not None
        ratio = self._ratios.setdefault(done.model, CountRatio())
        ratio.observe(actual_input=message.usage.input_tokens, estimate=done.counted, counted=done.counted)

    def _learn_from_refusal(self, done: _SummaryDone) -> None:
        """A summarizer request refused as too large: the count of its prompt the server states, against
        ours, is its model's count ratio; a window it states smaller than the one used is its window."""
        error = done.result.error
        assert error is not None
        if error.prompt_tokens is not None:
            ratio = self._ratios.setdefault(done.model, CountRatio())
            ratio.observe(actual_input=error.prompt_tokens, estimate=done.counted, counted=done.counted)
        if error.window is not None and error.window < self._windows.get(done.model, error.window + 1):
            self._windows[done.model] = error.window
            self._set_summarizer()

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
                if counter is not None:  # counted otherwise here: every summarizer's ratio is learned again
                    self.counter, self.estimate = counter, SessionEstimate(self.spec, counter)
                    self._ratios.clear()
                self._set_summarizer()
            case p.CountRatioLearned(model=model, ratio=ratio):
                if model == self.model:  # (a ratio of the model before a switch is no longer the session's)
                    self._count_ratio = ratio
            case MaybeCompact() | Compact():
                if message.count_ratio is not None:
                    self._count_ratio = message.count_ratio
                self._enqueue(message)
            case MaybeArchiveTools():
                self._enqueue(message)
            case _:
                raise TypeError(f"compactor: unexpected message {type(message).__name__}")
        return None

    def _enqueue(self, request: CompactorJob) -> None:
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

        self._jobs.append(Job(self._job_ids, request, reply, fail))
        self._next()

    def _next(self) -> None:
        if self._active is not None or not self._jobs:
            return
        job = self._active = self._jobs.popleft()
        self.call(self.refs.store, p.GetContext(), lambda view: self._with_view(job, view))

    def _done(self, job: Job, value: JobAnswer) -> None:
        self._active = None
        job.reply(value)
        self._next()

    # -- deciding -------------------------------------------------------------------------------------
    def _with_view(self, job: Job, view: p.ContextView | CallFailed) -> None:
        if isinstance(view, CallFailed):
            self._done(job, Outcome(message=f"store unavailable: {view}"))
            return
        job.view = view
        estimate = job.estimate = self.estimate(view)
        request = job.request
        messages = tuple(view.messages)
        unchanged = Outcome(messages=messages, estimate=estimate.tokens)
        if isinstance(request, MaybeArchiveTools):
            self.tool_archive.start(job, self.counter, self.context_window)
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
    def _cause(job: Job) -> OverflowCause | None:
        """Why an ``overflow`` compaction runs (``refused``, ``counted``): its events and log entry say it."""
        return job.request.cause if isinstance(job.request, Compact) else None

    @staticmethod
    def _leaf(messages: tuple[Message, ...]) -> str | None:
        return messages[-1].id if messages else None

    # -- compacting -----------------------------------------------------------------------------------
    def _start(
        self,
        job: Job,
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

        job.planned_from = (messages, trigger, emergency, keep, instructions)
        plan = self._plan(job, *job.planned_from)
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
        job.number = self.artifacts.next_number()
        self._write_artifact(job, 0, summarizer_input(plan.requests))
        for index, req in enumerate(plan.requests):
            self._summarize(job, index, req)

    def _plan(
        self,
        job: Job,
        messages: list[Message],
        trigger: CompactionTrigger,
        emergency: bool,
        keep: int | None,
        instructions: str | None,
    ) -> comp.CompactionPlan | comp.NothingToCompact:
        """The compaction of ``messages``, its summarizer requests sized with what is known now."""
        # An automatic compaction never summarizes the working set away (design §5.13).
        keep_from = working_set_start(messages) if trigger != "manual" else None
        keep_tokens = comp.keep_recent_budget(
            self.context_window, self.cfg, emergency=emergency, override=keep
        )
        job.sized = (self._summarizer_ratio(), self.summarizer_window)
        return comp.plan_compaction(
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
            count_ratio=job.sized[0],
        )

    def _rides_the_cache(self) -> bool:
        """Whether summaries send the conversation itself (design §5.4): the summarizer is the session's
        own model, and cache hints are on."""
        return self.summarizer_model == self.model and self.spec.config.gateway.prompt_cache

    def _write_artifact(self, job: Job, which: int, text: str) -> None:
        """Save ``job``'s summarizer input (``which=0``) or summary (1) beside the session (design §2.3)."""
        path = self.artifacts.path(job.number, which)
        job.artifacts.append(str(path))
        self.artifacts.write(path, text)

    def _spent_unlogged(self, job: Job) -> None:
        """A compaction that ends without a summary in the log: its spend is counted and logged now."""
        spent, job.spent = job.spent, Usage()
        record_unlogged_spend(self.refs.store, self.refs.usage, spent)

    def _summarize(self, job: Job, index: int, request: SummaryRequest) -> None:
        """Send ``request``, the ``index``-th of ``job``; its answer comes back as a :class:`_SummaryDone`."""
        me, job_id = self.actor_ref, job.id

        def done(result: CompletionResult, model: str, counted: int) -> None:  # on the gateway's loop
            me.tell(_SummaryDone(job_id, index, result, model, counted))

        manual = getattr(job.request, "trigger", None) == "manual"
        ratio = job.sized[0] if job.planned_from is not None else None  # (a compaction's: sized at it)
        if request.prefix:
            summarized = job.plan.summarized[: request.prefix]
            call = self.summarizer.cached(
                self.model,
                self.counter,
                summarized,
                request.prompt,
                request.max_tokens,
                manual=manual,
                done=done,
                count_ratio=ratio,
            )
        else:
            purpose: SummaryPurpose = (
                "tool_summary" if isinstance(job.request, MaybeArchiveTools) else "summary"
            )
            call = self.summarizer.isolated(
                self.summarizer_model,
                self.counter,
                request.system,
                request.prompt,
                request.max_tokens,
                purpose=purpose,
                manual=manual,
                done=done,
                count_ratio=ratio,
            )
        job.calls.append(call)

    def _on_summary(self, done: _SummaryDone) -> None:
        job = self._active
        if job is None or job.id != done.job:
            return
        result = done.result
        self._learn_ratio(done)
        if result.error is not None and result.error.kind == "overflow" and job.planned_from is not None:
            self._learn_from_refusal(done)
            job.refused.append(done.index)
        text = None if result.error is not None or result.message is None else result.message.text.strip()
        job.answers[done.index] = text or None
        if result.message is not None and result.message.usage is not None:
            job.spent = job.spent + result.message.usage
        job.outstanding -= 1
        if job.outstanding > 0:
            return
        if isinstance(job.request, MaybeArchiveTools):
            self.tool_archive.finish(job, self.counter)
        elif not self._retry(job):
            self._finish(job, job.request.trigger)

    def _retry(self, job: Job) -> bool:
        """Send the requests the summarizer refused again, once, sized anew, when their refusals taught a
        higher count ratio or a smaller window than they were sized with (design §5.4); False when there is
        nothing to retry (the compaction then finishes, falling back for what was refused)."""
        if not job.refused or job.retried or job.planned_from is None:
            return False
        ratio, window = job.sized
        if not (self._summarizer_ratio() > ratio or self.summarizer_window < window):
            return False  # the refusals stated nothing new: sent again, they would be refused again
        job.retried = True
        plan = self._plan(job, *job.planned_from)
        if isinstance(plan, comp.NothingToCompact) or not plan.requests:
            return False
        # (the same cut, so the same requests: only the refused ones go again, unless their number changed)
        again = job.refused if len(plan.requests) == len(job.plan.requests) else range(len(plan.requests))
        if len(plan.requests) != len(job.answers):
            job.answers = [None] * len(plan.requests)
        job.plan, job.refused, job.outstanding = plan, [], len(again)
        log.info(
            "%s: the summarizer refused %d request(s) as too large; sending them again at count ratio %.3f, "
            "window %d",
            self.session_id,
            len(again),
            job.sized[0],
            job.sized[1],
        )
        self.artifacts.write(self.artifacts.path(job.number, 0), summarizer_input(plan.requests))
        for index in again:
            self._summarize(job, index, plan.requests[index])
        return True

    def _finish(self, job: Job, trigger: CompactionTrigger) -> None:
        assert job.estimate is not None
        tokens_before = job.tokens_before
        # The progress guard compares counts of the same kind: a full count before and after.
        outcome = comp.finish_compaction(
            job.plan,
            job.answers,
            count=self.counter.count_message,
            tokens_before=tokens_before,
            limit=effective_limit(self.context_window, self.cfg),
            kept_at=saved_as(self.artifacts.path(job.number, 1)) if job.number else None,
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
        summary = with_spend(outcome.summary, job.spent)
        if summary is not outcome.summary:
            outcome = msgspec.structs.replace(
                outcome,
                summary=summary,
                messages=[summary if m is outcome.summary else m for m in outcome.messages],
            )
        self._write_artifact(job, 1, outcome.unclipped_summary or summary.text)
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
            record_spend(
                self.refs.usage, summary, job.spent
            )  # the summarizer's spend is the session's (design §4.1)
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
            cause=self._cause(job),
        )
        self.call(self.refs.store, record, recorded)

    def _skip(self, job: Job, trigger: CompactionTrigger, reason: str, message: str) -> None:
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
        job: Job,
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
