"""Tool-result archiving and output clearing (design §5.9, 5.10): the compactor's ``MaybeArchiveTools`` job.

The rules are pure (``runtime.context.tool_summary``); :class:`ToolArchive` applies them to the session's
view, asks the summarizer for an archive's digest (through the compactor, one job at a time), overlays the
archived results and appends the digest, then clears old tool outputs, and answers the job with the view
the next request can be made from (or None when it changed the context).
"""

from __future__ import annotations

from collections.abc import Callable

from actors import protocol as p
from actors._base import CallFailed, SessionActor
from actors.compaction_job import Job, JobAnswer
from actors.summarizer import record_spend, with_spend
from actors.wiring import SessionRefs, SessionSpec
from runtime import events as ev
from runtime.context import tool_summary as ts
from runtime.context.summary_requests import SummaryRequest
from runtime.tokens import TokenCounter

__all__ = ["ToolArchive"]


class ToolArchive:
    """Runs ``MaybeArchiveTools`` jobs for ``actor`` (the compactor): ``summarize`` sends a job's summary
    request, ``done`` answers the job, ``spent_unlogged`` records a summary's spend that found no place in
    the log."""

    def __init__(
        self,
        actor: SessionActor,
        spec: SessionSpec,
        refs: SessionRefs,
        *,
        summarize: Callable[[Job, int, SummaryRequest], None],
        done: Callable[[Job, JobAnswer], None],
        spent_unlogged: Callable[[Job], None],
    ) -> None:
        self.actor = actor
        self.spec = spec
        self.refs = refs
        self.cfg = spec.config.compaction
        self.summarize = summarize
        self.done = done
        self.spent_unlogged = spent_unlogged

    def start(self, job: Job, counter: TokenCounter, window: int) -> None:
        """Archive old tool results when they are worth it, then clear old outputs; answers ``job``."""
        messages = list(job.view.messages)
        cfg = self.cfg
        plan = None
        if cfg.tool_summary_strategy != "off":
            assert job.estimate is not None
            caching = self.spec.config.gateway.prompt_cache
            min_freed, below = ts.archive_bounds(window, cfg, caching=caching)
            plan = ts.plan_tool_archive(
                messages,
                cutoff=cfg.tool_call_cutoff,
                strategy=cfg.tool_summary_strategy,
                input_chars=cfg.tool_summary_input_chars,
                output_chars=cfg.tool_summary_output_chars,
                heuristic_chars=cfg.heuristic_summary_chars,
                min_freed=min_freed,
                count=counter.count_message,
                tokens=job.estimate.tokens,
                below=below,
            )
        if plan is None:
            self._clear_tool_outputs(job, counter, job.view)
            return
        job.plan = plan
        request = plan.request
        if request is None:  # heuristic strategy: no model call
            job.answers = []
            self.finish(job, counter)
            return
        job.answers = [None]
        job.outstanding = 1
        self.summarize(job, 0, request)

    def finish(self, job: Job, counter: TokenCounter) -> None:
        """Record the archive once its summary (``job.answers``, when one was asked) is in."""
        answer = job.answers[0] if job.answers else None
        replacements, summary = ts.finish_tool_archive(job.plan, answer)
        summary = with_spend(summary, job.spent)
        store = self.refs.store

        def appended(reply: p.Stored | CallFailed) -> None:
            if isinstance(reply, CallFailed):
                self.spent_unlogged(job)
            else:
                record_spend(self.refs.usage, summary, job.spent)
            self.actor.emit(
                ev.ToolResultsArchived,
                archived=job.plan.results,
                strategy=str(summary.metadata.get("strategy", job.plan.strategy)),
                summary_chars=len(summary.text),
            )
            self._clear_tool_outputs(job, counter, None)

        self.actor.call(
            store,
            p.Overlay(tuple(replacements)),
            lambda _: self.actor.call(store, p.Append((summary,)), appended),
        )

    def _clear_tool_outputs(self, job: Job, counter: TokenCounter, current: p.ContextView | None) -> None:
        """The second half of ``MaybeArchiveTools``. ``current`` is the session's view when nothing has
        changed it since it was read (None: read it again). The job's answer is the view the next request
        can be made from when the context is as it was, or None when this changed it."""
        cfg = self.cfg
        if not cfg.clear_old_tool_outputs:
            self.done(job, current)
            return

        def with_view(view: p.ContextView | CallFailed) -> None:
            if isinstance(view, CallFailed):
                self.done(job, None)
                return
            cleared = ts.plan_tool_output_clearing(
                list(view.messages),
                count=counter.count_message,
                protect_tokens=cfg.clear_protect_tokens,
                min_freed=cfg.clear_min_freed_tokens,
            )
            if cleared is None:
                self.done(job, view)
                return

            def done(_: p.Stored | CallFailed) -> None:
                self.actor.emit(
                    ev.ToolOutputsCleared,
                    cleared=len(cleared.replacements),
                    tokens_freed=cleared.tokens_freed,
                )
                self.done(job, None)

            self.actor.call(self.refs.store, p.Overlay(tuple(cleared.replacements)), done)

        if current is not None:
            with_view(current)
        else:
            self.actor.call(self.refs.store, p.GetContext(), with_view)
