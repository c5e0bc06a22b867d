"""Durable turns (design §3.12): taking up a turn a crash cut off, from its log. Pure functions.

Every step of a turn is in the log before its effect: the turn's start (with the caller's prompt id), each
model request, each tool call's start (:class:`~runtime.store.entries.StepEntry` records), and the answers,
results and compactions as they complete (message and compaction entries). A turn whose process died is
taken up from what the log holds (:func:`recover_turn`):

- an answer in the log is not asked for again, a result in the log is reused;
- a call of the newest answer with no result in the log is run (again, if it had started) when its tool is
  idempotent (:attr:`Tool.idempotent`) or when no record says it started; a call of any other tool that
  had started gets a result saying its outcome is unknown (:func:`unknown_outcome_result`), and the model
  decides what to do: it is never run twice;
- a request whose answer was not recorded is made again (asking a model twice has no effect but its cost);
  an unfinished compaction is decided again.

So the model never sees two results for one call: a call has its logged result, or its re-run's, or the
unknown-outcome one, and the step goes on only once every call has one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Final, Literal

import msgspec

from runtime.context.integrity import find_orphans
from runtime.messages import KIND_TOOL_SUMMARY, Message, ToolCallPart, tool_result
from runtime.store.entries import StepEntry, StepKind

__all__ = [
    "MAX_RESUMES",
    "OUTCOME_UNKNOWN_KEY",
    "OUTCOME_UNKNOWN_TEXT",
    "ResumePoint",
    "TurnRecovery",
    "process_name",
    "recover_turn",
    "step_record",
    "turn_prompt",
    "unknown_outcome_result",
]

OUTCOME_UNKNOWN_KEY: Final = "outcome_unknown"
"""Metadata of a tool result that says its call's outcome is unknown (the process stopped while it ran)."""

OUTCOME_UNKNOWN_TEXT: Final = (
    "Error: the process running this call stopped (a crash or a restart) before its result was recorded. "
    "The call is not idempotent, so it was not run again: its outcome is unknown. It may have done all, "
    "part or none of its work; check its effects before you run it again."
)

MAX_RESUMES: Final = 3
"""A turn taken up this many times and cut off again is not taken up any more: it ends as interrupted
(a turn that kills its process each time must not kill every process that takes it up)."""

ResumePoint = Literal["prompt", "request", "compaction", "answer", "tool_started", "tool_result"]
"""The last step a turn recorded before it was cut off: it goes on from the next one."""


class TurnRecovery(msgspec.Struct, frozen=True, kw_only=True):
    """How to take up a turn a crash cut off (what :func:`recover_turn` decides).

    ``turn_id`` and ``prompt_id`` come from the turn's start record (None: the log has none, as logs
    written before durable turns). ``steps``: the model requests it made. ``resume_from``: its last
    recorded step. ``unknown``: results to append for calls that started and may not run again.
    ``rerun``: calls of its newest answer to run now (idempotent, or never started). ``resumed``: how
    many times it was taken up before.
    """

    turn_id: str | None
    prompt_id: str | None
    steps: int
    resume_from: ResumePoint
    resumed: int = 0
    unknown: tuple[Message, ...] = ()
    rerun: tuple[ToolCallPart, ...] = ()


def recover_turn(
    messages: Sequence[Message],
    steps: Sequence[StepEntry],
    *,
    idempotent: Callable[[str], bool],
    awaited: frozenset[str] = frozenset(),
) -> TurnRecovery:
    """Decide how a cut-off turn goes on, from the model's view of the session (``messages``) and the
    newest turn's step records (``steps``). ``idempotent(name)``: whether the tool ``name`` may run
    twice. ``awaited``: calls whose results the client sends (not the runtime's to run or repair).

    Call it for a turn that did not end (:func:`~runtime.context.integrity.unfinished_turn`)."""
    start = next((s for s in steps if s.kind == "turn"), None)
    requests = sum(1 for s in steps if s.kind == "request")
    started = {s.call_id for s in steps if s.kind == "tool_started"}
    newest = _newest_answer(messages)
    pending: list[ToolCallPart] = []
    if newest is not None:
        own = {c.id for c in messages[newest].tool_calls}
        pending = [c for c in find_orphans(messages[newest:]) if c.id in own and c.id not in awaited]
    unknown = tuple(unknown_outcome_result(c) for c in pending if c.id in started and not idempotent(c.name))
    skipped = {m.tool_call_id for m in unknown}
    rerun = tuple(c for c in pending if c.id not in skipped)
    return TurnRecovery(
        turn_id=start.turn_id if start is not None else None,
        prompt_id=(start.prompt_id or None) if start is not None else None,
        steps=requests,
        resume_from=_resume_point(messages, newest, pending, started, steps),
        unknown=unknown,
        rerun=rerun,
        resumed=sum(1 for s in steps if s.kind == "resumed"),
    )


def _newest_answer(messages: Sequence[Message]) -> int | None:
    """The index of the newest assistant message with tool calls if only its results follow it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "tool":
            continue
        if message.role == "assistant" and message.tool_calls:
            return index
        return None
    return None


def _resume_point(
    messages: Sequence[Message],
    newest: int | None,
    pending: list[ToolCallPart],
    started: set[str],
    steps: Sequence[StepEntry],
) -> ResumePoint:
    if newest is not None:
        if any(c.id in started for c in pending):
            return "tool_started"
        return "tool_result" if messages[-1].role == "tool" else "answer"
    kinds: list[StepKind] = [s.kind for s in steps if s.kind in ("request", "compaction")]
    if kinds:
        return "request" if kinds[-1] == "request" else "compaction"
    return "prompt"


def turn_prompt(messages: Sequence[Message]) -> Message | None:
    """The message that asked for the newest turn, as the model sees it (a compaction summary that
    carries the request, when the prompt itself was summarized), or None."""
    for message in reversed(messages):
        if message.role == "user" and message.kind != KIND_TOOL_SUMMARY:
            return message
    return None


def unknown_outcome_result(call: ToolCallPart) -> Message:
    """The result of a call that was running when its process stopped and may not be run again."""
    return tool_result(
        call.id,
        call.name,
        OUTCOME_UNKNOWN_TEXT,
        is_error=True,
        metadata={OUTCOME_UNKNOWN_KEY: True, "repaired": True},
    )


def step_record(turn_id: str, kind: StepKind, **fields: str | int) -> StepEntry:
    """A step record of this process."""
    return StepEntry(turn_id=turn_id, kind=kind, process=process_name(), **fields)  # type: ignore[arg-type]


def process_name() -> str:
    """This process, as step records and ``turn_resumed`` name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"
