"""A session's summarizer calls (design §5.4, 5.9) and what they record: events, spans' content, artifacts.

The compactor decides what to ask (``runtime.context``); :class:`Summarizer` sends it through the gateway
the way the session asks its model (admission, transport, its server), publishes ``summary_request`` /
``summary_response`` / ``request_failed`` and hands the spans' content tap what was sent and answered. A
call's result goes to the ``done`` callback, on the gateway's loop: the compactor tells itself. The
summarizer input of a compaction is saved beside the session (:func:`summarizer_input`, design §2.3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from actors import protocol as p
from actors._base import Publish, retry_reporter, server_of
from actors.protocol import StoreMessage, UsageMessage
from actors.wiring import Services, SessionSpec
from runtime import events as ev
from runtime.actor import Ref
from runtime.context.summary_requests import SummaryRequest
from runtime.messages import KIND_COMPACTION_SUMMARY, Message, Usage, new_id
from runtime.tokens import TokenCounter

if TYPE_CHECKING:
    from runtime.gateway import CacheHints, CallHandle, CompletionResult, RetryInfo

__all__ = [
    "Artifacts",
    "Summarizer",
    "SummaryPurpose",
    "record_spend",
    "record_unlogged_spend",
    "saved_as",
    "summarizer_input",
    "with_spend",
]

SummaryPurpose = Literal["summary", "tool_summary"]


def summarizer_input(requests: Sequence[SummaryRequest]) -> str:
    """A compaction's summarizer input as its artifact keeps it: each request's system prompt and prompt
    (or, for a request that rides the cache, what it sends before its prompt)."""
    return "\n\n".join(
        f"=== {r.kind} ===\n--- system ---\n{r.system}\n--- prompt ---\n{r.prompt}"
        if not r.prefix
        else f"=== {r.kind} ===\n--- the session's system prompt, tools and {r.prefix} messages, as sent ---\n"
        f"--- prompt ---\n{r.prompt}"
        for r in requests
    )


class Summarizer:
    """Sends a session's summarizer calls and records them (events, the spans' content tap)."""

    def __init__(self, spec: SessionSpec, services: Services, publish: Publish) -> None:
        self.spec = spec
        self.services = services
        self.publish = publish

    def cached(
        self,
        model: str,
        counter: TokenCounter,
        summarized: Sequence[Message],
        prompt: str,
        max_tokens: int,
        *,
        manual: bool,
        done: Callable[[CompletionResult, str, int], None],
        count_ratio: float | None = None,
    ) -> CallHandle:
        """A summary of ``summarized`` asked the way the session asks its own ``model``: its system prompt,
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
        hints = cache_hints(model, messages, tools, counter, key=spec.session_id, ttl=gateway.cache_ttl)
        return self.call(
            model,
            counter,
            messages,
            max_tokens,
            purpose="summary",
            manual=manual,
            done=done,
            tools=tools,
            cache=hints,
            include_reasoning=spec.config.agent.send_reasoning,
            count_ratio=count_ratio,
        )

    def isolated(
        self,
        model: str,
        counter: TokenCounter,
        system: str,
        prompt: str,
        max_tokens: int,
        *,
        purpose: SummaryPurpose,
        manual: bool,
        done: Callable[[CompletionResult, str, int], None],
        count_ratio: float | None = None,
    ) -> CallHandle:
        """A summarizer call of its own: ``system`` and ``prompt``, nothing of the conversation."""
        from runtime.messages import system as system_message
        from runtime.messages import user

        messages = [system_message(system), user(prompt)]
        return self.call(
            model,
            counter,
            messages,
            max_tokens,
            purpose=purpose,
            manual=manual,
            done=done,
            count_ratio=count_ratio,
        )

    def call(
        self,
        model: str,
        counter: TokenCounter,
        messages: list[Message],
        max_tokens: int,
        *,
        purpose: SummaryPurpose,
        manual: bool,
        done: Callable[[CompletionResult, str, int], None],
        tools: list[dict[str, Any]] | None = None,
        cache: CacheHints | None = None,
        include_reasoning: bool = False,
        count_ratio: float | None = None,
    ) -> CallHandle:
        """Send ``messages`` to ``model``; ``done`` gets the result, the model and our count of the request
        (its messages, reply priming and tools: what its server's ``usage.input_tokens`` counts), on the
        gateway's loop. ``count_ratio``: what the request was sized at, for its ``summary_request``."""
        from runtime.capacity import Priority
        from runtime.gateway import Admission, CompletionRequest

        spec = self.spec
        # A compaction a turn waits for goes before the turns' own calls; a manual one is background work.
        admission = Admission(
            flow=spec.session_id,
            priority=Priority.BACKGROUND if manual else Priority.UNBLOCK,
            weight=spec.config.capacity.weight,
            input_tokens=sum(counter.count_message(m) for m in messages),
            wait_budget=spec.config.capacity.queue_timeout,
        )
        request = CompletionRequest(
            admission=admission,
            model=model,
            messages=messages,
            tools=tools or [],
            api_base=spec.api_base,
            api_key=spec.api_key,
            max_tokens=max_tokens,
            timeout=spec.config.compaction.summarizer_timeout,
            stream=False,
            include_reasoning=include_reasoning,
            transport=spec.config.gateway.transport,
            cache=cache,
        )
        counted = counter.count_messages(messages) + counter.count_tools(tools or [])
        sid, publish, content = spec.session_id, self.publish, self.services.content
        request_id = new_id()
        address, port = server_of(spec.api_base)
        if content is not None:  # what the call's span records (telemetry.record_content): before its event
            content.put(sid, "request", request_id, messages)
        publish(
            ev.SummaryRequest(
                session_id=sid,
                request_id=request_id,
                purpose=purpose,
                model=model,
                max_tokens=max_tokens,
                server_address=address,
                server_port=port,
                count_ratio=count_ratio,
            )
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
            done(result, model, counted)

        on_retry: Callable[[RetryInfo], None] = retry_reporter(publish, sid, None, request_id)  # events too
        return self.services.gateway.complete(request, deliver, on_retry=on_retry)


class Artifacts:
    """A session's compaction artifacts (design §2.3): the summarizer input and the summary of each
    compaction, beside its log, written by the log writer (a failed write is a ``persistence_error``)."""

    def __init__(self, services: Services, session_id: str, publish: Publish) -> None:
        self.services = services
        self.session_id = session_id
        self.publish = publish
        self._number: int | None = None  # number of the latest compaction's artifacts; read lazily

    def next_number(self) -> int:
        """The next compaction number for artifact names. Numbers continue from the artifacts on disk across
        restarts, resumes and hibernation, so a later compaction never overwrites an earlier one's files."""
        if self._number is None:
            self._number = self.services.directory.last_compaction_number(self.session_id)
        self._number += 1
        return self._number

    def path(self, number: int, which: int) -> Path:
        """The summarizer input (``which=0``) or the summary (1) of compaction ``number``."""
        return self.services.directory.compaction_artifacts(self.session_id, number)[which]

    def write(self, path: Path, text: str) -> None:
        """Save ``text`` at ``path``, on the writer thread."""
        publish, session_id = self.publish, self.session_id

        def written(error: Exception | None) -> None:  # on the writer thread
            if error is not None:
                publish(ev.PersistenceFailed(session_id=session_id, path=str(path), error=str(error)))

        data = text.encode("utf-8", errors="replace")  # a lone surrogate must not crash the compactor
        self.services.writer.write_file(path, data, written)


def saved_as(path: Path) -> str:
    """Where a clipped summary's whole text is, for the model: its path and its ``read_saved`` id."""
    return f'{path}, read_saved(id="{path.name}")'


def with_spend(summary: Message, spent: Usage) -> Message:
    """``summary`` carrying what its summarizer calls cost (``spent``), as a response carries its usage: the
    session's totals count it, live and when rebuilt from the log (design §4.1). A compaction's summary
    also carries, added by the store, what earlier compactions that recorded nothing spent
    (:func:`record_unlogged_spend`); :func:`record_spend` counts only this one's part live (the rest was
    counted as it failed)."""
    if not (spent.input_tokens or spent.output_tokens):
        return summary
    return msgspec.structs.replace(summary, usage=spent)


def record_spend(usage: Ref[UsageMessage], summary: Message, spent: Usage) -> None:
    """Count ``summary``'s spend in the session's totals, once it is in the log (:func:`with_spend`)."""
    if spent.input_tokens or spent.output_tokens:
        usage.tell(p.RecordResponse(message=msgspec.structs.replace(summary, usage=spent)))


def record_unlogged_spend(store: Ref[StoreMessage], usage: Ref[UsageMessage], spent: Usage) -> None:
    """A compaction that ends without a summary in the log (no progress, a failure): what its summarizer
    calls cost is the session's all the same: counted now, recorded in the log (not as a message: the
    no-progress guard keys on the leaf), and carried by the next compaction's summary (design §4.1)."""
    if not (spent.input_tokens or spent.output_tokens):
        return
    store.tell(p.RecordSpend(spent))  # in the log: a restart's totals count it too
    record = Message(role="user", kind=KIND_COMPACTION_SUMMARY, agent_visible=False, usage=spent)
    usage.tell(p.RecordResponse(message=record))
