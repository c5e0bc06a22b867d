"""One response's run: its record, its stream and its state (:class:`Run`), and its turn on the session
(:func:`run_turn`): the session's tree at the response's starting point, the input sent, the turn's events
translated into the API's stream events until its ``agent_end``, and its outcome (status, output items,
usage, leaf, the client's calls it waits for) written into the record. The front door
(:mod:`runtime.apps.responses.door`) prepares runs, orders them on their sessions and keeps what they leave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from actors.protocol import TurnOptions
from runtime import events as ev
from runtime.apps.responses import items as it
from runtime.apps.responses.api import ClientTools, ResponseRecord, failure, usage_object
from runtime.apps.responses.stream import StreamTranslator
from runtime.apps.responses.threads import Thread
from runtime.handles import TurnResult
from runtime.messages import Message
from runtime.served import served

STREAM_END = object()  # what ends a run's event queue


class Run:
    """One response being made: its record, its stream's events (a queue, when streamed), its task."""

    def __init__(
        self,
        record: ResponseRecord,
        streamed: bool,
        tools: ClientTools,
        shape: it.Shape = it.PLAIN,
        extra_events: bool = False,
    ) -> None:
        self.record = record
        self.queue: asyncio.Queue[Any] | None = asyncio.Queue() if streamed else None
        self.translator = StreamTranslator(tools.names, shape=shape, extra_events=extra_events)
        self.shape = shape
        self.not_offered = tools.not_offered  # hosted tools the client declared: not offered to the model
        self.task: asyncio.Task[None] | None = None
        self.session_id: str | None = None
        self.cancelled = False
        self.sent = False  # its turn was sent to the session (a cancel aborts it from then on)
        self.queued = False  # it counts among the responses waiting for its session
        self.copied = False  # store: false, run in a copy of the stored session it goes on from
        self.deleted = False
        self.http_status = 200
        self.stateless: Stateless | None = None  # (no previous_response_id, no conversation)
        self.replay: list[Message] = []  # an interrupted response's input, sent again if its session lacks it

    def send(self, events: list[dict[str, Any]]) -> None:
        if self.queue is not None:
            for event in events:
                self.queue.put_nowait(event)

    def end(self, status: Any, error: dict[str, Any] | None, incomplete: Any = None) -> None:
        """Record how the response ended: its status, its error, why it is incomplete."""
        self.record.status = status
        self.record.error = error
        self.record.incomplete_details = incomplete


class Stateless:
    """A response of a client that keeps its own history: its input's digest and length, the thread it
    went on with (if any), its ``prompt_cache_key``."""

    def __init__(self, digest: bytes, length: int, thread: Thread | None, cache_key: str | None) -> None:
        self.digest, self.length, self.thread, self.cache_key = digest, length, thread, cache_key


async def run_turn(
    runtime: Any,
    hosted: Callable[[str], Awaitable[str]],
    run: Run,
    messages: list[Message],
    options: TurnOptions,
    model: str,
) -> None:
    """Run ``run``'s turn on its session (hosted by ``hosted``; the caller holds the session's lock): the
    session's tree at the response's starting point, ``messages`` sent, the turn's events translated into
    the run's stream, and its outcome written into the run's record."""
    record = run.record
    sid = run.session_id
    assert sid is not None
    await hosted(sid)
    before = await runtime.amessages(sid)
    if (before[-1].id if before else None) != record.start_leaf and record.start_leaf is not None:
        await runtime.abranch(sid, record.start_leaf)  # an older response: its branch of the tree
    recorded = {m.id for m in before}
    missing = [m for m in run.replay if m.id not in recorded]  # (the server stopped before it was)
    messages = [*missing, *messages]
    summary = served(runtime).session_summary(sid)  # (in memory: a local runtime's)
    if summary.model != model:
        await runtime.aset_model(sid, model)
    # a stream needs every event of the turn; an answer in one piece only where it starts and ends
    types = None if run.queue is not None else ("agent_start", "agent_end", "error")
    if run.cancelled:  # (cancelled while it waited for the session)
        run.end("cancelled", None)
        return
    subscription = runtime.subscribe(sid, types)
    try:
        handle = runtime.send(sid, messages, options=options)
        run.sent = True
        code = await _follow(runtime, run, subscription, handle)
    finally:
        subscription.close()
    result: TurnResult = await handle
    after = await runtime.amessages(sid)
    inputs = {m.id for m in messages}
    last_input = max((i for i, m in enumerate(after) if m.id in inputs), default=-1)
    new = [m for m in after[last_input + 1 :] if m.id not in inputs]
    record.output = it.to_items(new, shape=run.shape)
    record.usage = usage_object(result.usage)
    record.leaf_id = after[-1].id if after else None
    record.awaiting = [c.id for c in result.awaiting]
    if result.status == "ok":
        final = result.message
        if final is not None and final.stop_reason == "length":
            run.end("incomplete", None, {"reason": "max_output_tokens"})
        else:
            run.end("completed", None)
    elif result.status == "aborted":
        run.end("cancelled", None)
    else:
        status, error = failure(code or "error", result.error or "the run failed")
        run.http_status = status
        run.end("failed", error)


async def _follow(runtime: Any, run: Run, subscription: Any, handle: Any) -> str | None:
    """Translate the run's events until its ``agent_end``; the error code it ended with, if any."""
    turn: str | None = None
    code: str | None = None
    iterator = subscription.__aiter__()
    while True:
        try:
            async with asyncio.timeout(0.5):  # (no task per event, as wait_for would make)
                event = await iterator.__anext__()
        except TimeoutError:
            if handle.done():  # (agent_end comes before the handle resolves: nothing is left)
                return code
            continue
        except StopAsyncIteration:
            return code
        if isinstance(event, ev.AgentStart):
            if event.prompt_id == handle.id:
                turn = event.turn_id
            continue
        if turn is None:
            continue
        if getattr(event, "turn_id", turn) not in (turn, None):
            continue  # another turn's event (a prompt sent to the session by other means)
        if isinstance(event, ev.ErrorOccurred) and event.turn_id == turn:
            code = event.code
        if isinstance(event, ev.AgentEnd) and event.turn_id == turn:
            return code
        if run.queue is None:
            continue
        run.send(run.translator.on_event(event))
        if isinstance(event, ev.MessageAppended) and event.role == "tool" and run.translator.waiting:
            assert run.session_id is not None
            recent = await runtime.amessages(run.session_id)
            run.send(run.translator.results(m for m in recent[-64:] if m.role == "tool"))
