"""Tool-call integrity (design §3.6) — pure functions over messages.

Providers reject a conversation in which an assistant's tool call has no result, or a result answers no
call. A turn that is aborted or crashes mid-tools leaves exactly that behind. This module finds and
repairs it:

- :func:`repair_tool_calls` gives the error results to *append* (and persist) so every call has one.
- :func:`model_view` builds the provider-facing sequence: each call's result right after its assistant
  message, in call order; a result hidden from the model (archived) stands in as a short placeholder;
  duplicates and strays dropped; and any orphan still left gets an interrupted-error result.
- :func:`check_integrity` reports orphans, duplicates and strays.

Matching rules. Tool results are matched to calls by id. Some providers reuse ids across turns
("call_0" every time), so a result answers the *most recent* earlier unanswered call with its id.
A second result for an already answered call is a **duplicate**: the first result wins (it is what the
model saw when it made its next move); later ones stay in the log but are dropped from the model view.
A result whose id matches no earlier call is a **stray**, dropped from the model view likewise.

The error texts a model sees for malformed arguments, unknown tools and interruptions are built here too,
so every part of the runtime words them the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from runtime.context.prompts import CURRENT_REQUEST_TAG
from runtime.messages import (
    KIND_COMPACTION_SUMMARY,
    KIND_TOOL_RESULT_ARCHIVED,
    KIND_TOOL_SUMMARY,
    KIND_TURN_INTERRUPTED,
    Message,
    TextPart,
    ToolCallPart,
    tool_result,
)

__all__ = [
    "ARCHIVED_TEXT",
    "CLIENT_CALLS_KEY",
    "CURRENT_REQUEST_MARK",
    "DROPPED_CALLS_KEY",
    "INTERRUPTED_TEXT",
    "INTERRUPTED_TURN_TEXT",
    "CallRef",
    "IntegrityReport",
    "awaiting_client",
    "check_integrity",
    "find_orphans",
    "interrupted_result",
    "interrupted_turn_note",
    "malformed_arguments_result",
    "malformed_arguments_text",
    "model_view",
    "one_call",
    "repair_tool_calls",
    "request_view",
    "unfinished_turn",
    "unknown_tool_result",
    "unknown_tool_text",
]


CURRENT_REQUEST_MARK = f"<{CURRENT_REQUEST_TAG}>"

CLIENT_CALLS_KEY = "client_calls"
"""Metadata of an assistant message: the ids of its tool calls that the client runs (the Responses API's
function tools), whose results come from outside the runtime."""

DROPPED_CALLS_KEY = "dropped_tool_calls"
"""Metadata of an assistant message: the tool calls the model made beyond the first in a request that
allowed one (``parallel_tool_calls: false``), each ``{id, name, arguments}``; never run, never shown."""

INTERRUPTED_TEXT = (
    "Error: tool call was interrupted (aborted or crashed) before it produced a result. "
    "Its effects, if any, are unknown; check before retrying."
)
ARCHIVED_TEXT = "[Result archived to save context; see the tool summary.]"


class CallRef(msgspec.Struct, frozen=True):
    """A tool call and where it is: the index of its assistant message in the sequence given."""

    call: ToolCallPart
    message_index: int


class IntegrityReport(msgspec.Struct, frozen=True):
    """What is wrong with the tool calls and results of a conversation (empty lists: nothing)."""

    orphans: list[CallRef]
    duplicates: list[int]  # indices of result messages that answer an already answered call
    strays: list[int]  # indices of result messages that answer no call

    @property
    def ok(self) -> bool:
        return not (self.orphans or self.duplicates or self.strays)


def one_call(message: Message) -> Message:
    """``message`` with its first tool call only, for a request that allowed one call (the Responses API's
    ``parallel_tool_calls: false``, which a model need not keep to): the answer OpenAI's API gives, its
    other calls recorded under :data:`DROPPED_CALLS_KEY` (design §3.6). A message with at most one call is
    returned as it is."""
    calls = message.tool_calls
    if len(calls) < 2:
        return message
    dropped = {id(c) for c in calls[1:]}
    return msgspec.structs.replace(
        message,
        parts=tuple(p for p in message.parts if id(p) not in dropped),
        metadata={
            **message.metadata,
            DROPPED_CALLS_KEY: [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls[1:]],
        },
    )


def check_integrity(context: Sequence[Message]) -> IntegrityReport:
    """Match every tool result of ``context`` to its call and report what does not match."""
    match = _match(context)
    return IntegrityReport(match.orphans, match.duplicates, match.strays)


def find_orphans(context: Sequence[Message]) -> list[ToolCallPart]:
    """The tool calls of ``context`` that have no result, in order."""
    return [ref.call for ref in _match(context).orphans]


def repair_tool_calls(context: Sequence[Message]) -> list[Message]:
    """The tool results to append so that every tool call of ``context`` has exactly one result.

    Each orphan gets an explicit error result (metadata ``{"repaired": True}``). Appended at the end of
    the log, they still reach the model right after their call: :func:`model_view` places them there.
    """
    return [interrupted_result(call) for call in find_orphans(context)]


def model_view(context: Sequence[Message]) -> list[Message]:
    """The agent-visible messages of ``context`` in an order every provider accepts.

    Pass the whole path, hidden messages included, so that archived results are told apart from
    missing ones. Each assistant message is followed by exactly one result per tool call, in call order;
    other messages keep their order.
    """
    return _view(context, _match(context))


def request_view(context: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """``(repairs, view)`` for a provider request, with one pass over ``context``.

    ``repairs`` is :func:`repair_tool_calls`; when there are none, ``view`` is :func:`model_view`
    (otherwise it is empty: append the repairs first, then ask again).
    """
    match = _match(context)
    if match.orphans:
        return [interrupted_result(ref.call) for ref in match.orphans], []
    return [], _view(context, match)


def _view(context: Sequence[Message], match: _Match) -> list[Message]:
    dropped = set(match.duplicates) | set(match.strays)
    orphan_ids = {(ref.message_index, ref.call.id) for ref in match.orphans}
    out: list[Message] = []
    for index, msg in enumerate(context):
        if msg.role == "tool":
            continue  # placed after their call below
        if not msg.agent_visible:
            continue
        out.append(msg)
        if msg.role != "assistant":
            continue
        for call in msg.tool_calls:
            result_index = match.answers.get((index, call.id))
            if result_index is not None and result_index not in dropped:
                result = context[result_index]
                out.append(result if result.agent_visible else _archived_placeholder(call, result))
            elif (index, call.id) in orphan_ids:
                out.append(interrupted_result(call))
    return out


def awaiting_client(context: Sequence[Message]) -> frozenset[str]:
    """The ids of the client tool calls (:data:`CLIENT_CALLS_KEY`) of the newest assistant message that
    have no result yet: the run stopped for them, and their results are still to come from the client, so
    they are not orphans to repair."""
    for index in range(len(context) - 1, -1, -1):
        message = context[index]
        if message.role != "assistant":
            continue
        client = message.metadata.get(CLIENT_CALLS_KEY)
        if not client:
            return frozenset()
        answered = {m.tool_call_id for m in context[index + 1 :] if m.role == "tool"}
        return frozenset(str(i) for i in client if i not in answered)
    return frozenset()


# ---------------------------------------------------------------------------------------------------
# The error results a model sees


def interrupted_result(call: ToolCallPart) -> Message:
    """The error result of a call that never finished (abort, crash, restart)."""
    return tool_result(call.id, call.name, INTERRUPTED_TEXT, is_error=True, metadata={"repaired": True})


def malformed_arguments_text(call: ToolCallPart, reason: str) -> str:
    """What the model sees when its tool-call arguments are not a JSON object."""
    shown = call.arguments if len(call.arguments) <= 200 else call.arguments[:200] + "…"
    return (
        f"Error: the arguments of this call to {call.name!r} could not be parsed ({reason}). "
        f"Arguments received: {shown!r}. Send the arguments as one JSON object matching the tool's schema."
    )


def malformed_arguments_result(call: ToolCallPart, reason: str) -> Message:
    return tool_result(call.id, call.name, malformed_arguments_text(call, reason), is_error=True)


def unknown_tool_text(name: str, available: Iterable[str]) -> str:
    """What the model sees when it calls a tool that does not exist."""
    names = sorted(available)
    listed = ", ".join(names) if names else "none (no tools are enabled in this session)"
    return f"Error: there is no tool named {name!r}. Available tools: {listed}."


def unknown_tool_result(call: ToolCallPart, available: Iterable[str]) -> Message:
    return tool_result(call.id, call.name, unknown_tool_text(call.name, available), is_error=True)


# ---------------------------------------------------------------------------------------------------


class _Match(msgspec.Struct):
    answers: dict[tuple[int, str], int]  # (assistant index, call id) -> result index
    orphans: list[CallRef]
    duplicates: list[int]
    strays: list[int]


def _match(context: Sequence[Message]) -> _Match:
    pending: dict[str, list[int]] = {}  # call id -> assistant indices with that call unanswered
    answered: set[str] = set()
    answers: dict[tuple[int, str], int] = {}
    duplicates: list[int] = []
    strays: list[int] = []
    for index, msg in enumerate(context):
        if msg.role == "assistant":
            for call in msg.tool_calls:
                pending.setdefault(call.id, []).append(index)
        elif msg.role == "tool":
            call_id = msg.tool_call_id or ""
            waiting = pending.get(call_id)
            if waiting:
                answers[(waiting.pop(), call_id)] = index
                answered.add(call_id)
            elif call_id in answered:
                duplicates.append(index)
            else:
                strays.append(index)
    orphans = (
        [
            CallRef(call, index)
            for index, msg in enumerate(context)
            if msg.role == "assistant"
            for call in msg.tool_calls
            if index in pending.get(call.id, ())
        ]
        if any(pending.values())
        else []
    )
    return _Match(answers, orphans, duplicates, strays)


def _archived_placeholder(call: ToolCallPart, result: Message) -> Message:
    return tool_result(
        call.id,
        call.name,
        ARCHIVED_TEXT,
        is_error=result.is_error,
        id=result.id,
        created_at=result.created_at,
        kind=KIND_TOOL_RESULT_ARCHIVED,
    )


# ---------------------------------------------------------------------------------------------------
# Turns cut off by a crash (design §1.2, 2.3)

INTERRUPTED_TURN_TEXT = (
    "[This turn was interrupted before it finished: the runtime stopped (a crash or a restart). "
    "Its prompt and the tool results above are kept; anything the model was writing when it stopped was "
    "not recorded.]"
)


def unfinished_turn(messages: Sequence[Message], ended_at: str | None = None) -> bool:
    """Whether the newest turn of a model-facing context never ended: no final answer follows its prompt
    (or the request a compaction summary carries), and no record says it ended without one at the
    current leaf (``ended_at``: an error or an abort ends a turn that way)."""
    if not messages or messages[-1].id == ended_at:
        return False
    for message in reversed(messages):
        if not message.agent_visible:
            continue
        if message.role == "assistant" and not message.tool_calls:
            return False  # a final answer
        if message.role == "user" and message.kind == KIND_COMPACTION_SUMMARY:
            return CURRENT_REQUEST_MARK in message.text  # the summary cut into an open turn
        if message.role == "user" and message.kind != KIND_TOOL_SUMMARY:
            return True  # a prompt with no answer after it
    return False


def interrupted_turn_note() -> Message:
    """The record a turn cut off by a crash gets in the log: it says so, and ends the turn."""
    return Message(
        role="assistant",
        parts=(TextPart(INTERRUPTED_TURN_TEXT),),
        stop_reason="error",
        kind=KIND_TURN_INTERRUPTED,
    )
