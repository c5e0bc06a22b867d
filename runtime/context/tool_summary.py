"""Tool-result archiving and old-output clearing (design §5.9, reference 001), the pure part.

**Archiving.** When the agent-visible tool results exceed ``tool_call_cutoff``, the oldest tool steps (an
assistant message with tool calls, and its results) are archived: copies with the same ids become hidden
from the model (``agent_visible=False``, kind ``tool_result_archived``, and ``tool_call_archived`` for the
assistant message) and stay visible to the user. A call and its results are archived together, because a
provider rejects a tool call without its result. The newest step is never archived: the model has not
read it yet. One ``tool_summary`` message (hidden from the user) replaces them for the model; earlier tool
summaries are folded into it, so the context holds at most one.

Strategies: ``llm`` (a summarizer call whose input is at most ``tool_summary_input_chars`` and whose
output is clipped to ``tool_summary_output_chars``; the heuristic summary stands in when it fails),
``heuristic`` (one line per result, clipped head and tail to ``heuristic_summary_chars``) and ``off``.

**Clearing.** Alternatively, old tool outputs can be replaced by a short placeholder: the newest
``clear_protect_tokens`` of tool output are protected, and nothing is done unless at least
``clear_min_freed_tokens`` would be freed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from runtime.config import CompactionConfig
from runtime.context.cut import CountTokens
from runtime.context.estimate import compaction_threshold
from runtime.context.prompts import (
    TOOL_SUMMARIZER_SYSTEM,
    TOOL_SUMMARY_PREFIX,
    clip_head_tail,
    tool_summary_prompt,
)
from runtime.context.summary_requests import SummaryRequest
from runtime.messages import (
    KIND_TOOL_CALL_ARCHIVED,
    KIND_TOOL_OUTPUT_CLEARED,
    KIND_TOOL_RESULT_ARCHIVED,
    KIND_TOOL_SUMMARY,
    Message,
    TextPart,
    ToolCallPart,
    tool_result,
)
from runtime.wording import plural

__all__ = [
    "ARGUMENT_CHARS",
    "ASSISTANT_TEXT_CHARS",
    "HEURISTIC_ARGUMENT_CHARS",
    "HEURISTIC_RESULT_CHARS",
    "MIN_RESULT_CHARS",
    "ArchivePlan",
    "ClearPlan",
    "archive_bounds",
    "finish_tool_archive",
    "plan_tool_archive",
    "plan_tool_output_clearing",
]


# Sizes inside a digest: enough to identify a call and its outcome.
ARGUMENT_CHARS: Final = 200
ASSISTANT_TEXT_CHARS: Final = 300
MIN_RESULT_CHARS: Final = 200
HEURISTIC_ARGUMENT_CHARS: Final = 80
HEURISTIC_RESULT_CHARS: Final = 100

_DEFAULTS: Final = CompactionConfig()


class ArchivePlan(msgspec.Struct, frozen=True):
    """Tool steps to archive, and how to summarize them.

    ``archived`` are the original messages to hide (tool results and the assistant messages that made the
    calls), ``retired`` the earlier tool summaries folded into the new one, ``results`` the number of tool
    results archived. ``request`` is the summarizer call of the ``llm`` strategy; ``heuristic`` is the
    deterministic summary (the ``heuristic`` strategy's, and the ``llm`` strategy's fallback).
    """

    archived: list[Message]
    retired: list[Message]
    results: int
    strategy: Literal["llm", "heuristic"]
    request: SummaryRequest | None
    heuristic: str
    output_chars: int


class ClearPlan(msgspec.Struct, frozen=True):
    """Old tool outputs to replace by a placeholder: ``replacements`` keep the originals' ids."""

    replacements: list[Message]
    tokens_freed: int


def archive_bounds(window: int, config: CompactionConfig, *, caching: bool) -> tuple[int, int | None]:
    """When an archive may be made (design §4.7, 5.9): the fewest tokens it must free, and the context size
    (as the compaction trigger estimates it) at or over which none is made (None: any size).

    A configured ``archive_min_freed_tokens`` is the minimum, at any size. By default, while the provider
    caches prefixes (``caching``: gateway.prompt_cache), an archive, which rewrites the conversation from its
    oldest archived step and so makes the next request's prompt new to the cache, must free a quarter of
    the window and is made only in the first half of the way to the compaction threshold: past it, a
    compaction is near, sheds the same old results with a summary request read from the cache, and an
    archive would only add a prompt the cache has not seen (and a summarizer call of its own) before it.
    Without a cache an archive costs no cached prefix: any size, any time."""
    if config.archive_min_freed_tokens is not None:
        return config.archive_min_freed_tokens, None
    if not caching:
        return 0, None
    threshold = compaction_threshold(window, config) if config.auto else None
    return window // 4, None if threshold is None else threshold // 2


def plan_tool_archive(
    messages: Sequence[Message],
    *,
    cutoff: int = _DEFAULTS.tool_call_cutoff,
    strategy: Literal["llm", "heuristic", "off"] = _DEFAULTS.tool_summary_strategy,
    input_chars: int = _DEFAULTS.tool_summary_input_chars,
    output_chars: int = _DEFAULTS.tool_summary_output_chars,
    heuristic_chars: int = _DEFAULTS.heuristic_summary_chars,
    min_freed: int = 0,
    count: CountTokens | None = None,
    tokens: int | None = None,
    below: int | None = None,
) -> ArchivePlan | None:
    """Plan archiving when the agent-visible tool results exceed ``cutoff``.

    Whole tool steps are archived, oldest first, until at most ``cutoff`` results remain visible (so a
    step with several results may archive one or two more than the excess); ``None`` when nothing needs
    archiving, nothing can be (only the newest step is over), the strategy is ``off``, or the steps would
    free fewer than ``min_freed`` tokens (as ``count`` counts them): an archive rewrites the conversation
    from its oldest step on, so where the provider caches the prefix it must free enough to be worth the
    cache it breaks (design §4.7), nor when the context (``tokens``) is at or over ``below`` (see
    :func:`archive_bounds`). The defaults are :class:`CompactionConfig`'s.
    """
    if strategy == "off" or (below is not None and tokens is not None and tokens >= below):
        return None
    visible = [m for m in messages if m.role == "tool" and m.agent_visible]
    excess = len(visible) - cutoff
    if excess <= 0:
        return None
    steps = _tool_steps(messages)[:-1]  # never the newest step
    archived: list[Message] = []
    results: list[Message] = []
    for call, step_results in steps:
        if len(results) >= excess:
            break
        if call is not None:
            archived.append(call)
        archived += step_results
        results += step_results
    if not results:
        return None
    if min_freed > 0 and count is not None and sum(count(m) for m in archived) < min_freed:
        return None
    retired = [m for m in messages if m.kind == KIND_TOOL_SUMMARY and m.agent_visible]
    previous = "\n".join(_tool_summary_body(m) for m in retired)
    heuristic = _heuristic_summary(archived, previous, heuristic_chars)
    request = None
    if strategy == "llm":
        digest = _digest(archived, previous, input_chars, output_chars)
        prompt = tool_summary_prompt(digest, max_chars=output_chars)
        max_tokens = max(64, output_chars // 3)
        request = SummaryRequest("tool_summary", TOOL_SUMMARIZER_SYSTEM, prompt, max_tokens)
    return ArchivePlan(
        archived=archived,
        retired=retired,
        results=len(results),
        strategy=strategy,
        request=request,
        heuristic=heuristic,
        output_chars=output_chars,
    )


def finish_tool_archive(
    plan: ArchivePlan, answer: str | None = None, *, output_chars: int | None = None
) -> tuple[list[Message], Message]:
    """The replacements (hidden copies, same ids) and the new ``tool_summary`` message to append.

    ``answer`` is the summarizer's reply for the ``llm`` strategy, clipped to ``output_chars`` (default:
    the plan's); when it is missing or empty, or the strategy is ``heuristic``, the heuristic summary is
    used. The summary's metadata says which strategy produced it and which messages it covers.
    """
    body = (answer or "").strip()
    if body.startswith(TOOL_SUMMARY_PREFIX):
        body = body[len(TOOL_SUMMARY_PREFIX) :].strip()
    used = "llm"
    if plan.strategy != "llm" or not body:
        body, used = plan.heuristic, "heuristic"
    else:
        body = clip_head_tail(body, plan.output_chars if output_chars is None else output_chars)
    replacements = [_archived_copy(m) for m in plan.archived]
    replacements += [msgspec.structs.replace(m, agent_visible=False) for m in plan.retired]
    summary = Message(
        role="user",
        parts=(TextPart(f"{TOOL_SUMMARY_PREFIX}\n{body}"),),
        agent_visible=True,
        user_visible=False,
        kind=KIND_TOOL_SUMMARY,
        metadata={
            "strategy": used,
            "archived_results": plan.results,
            "archived_ids": [m.id for m in plan.archived],
        },
    )
    return replacements, summary


def plan_tool_output_clearing(
    messages: Sequence[Message],
    *,
    count: CountTokens,
    protect_tokens: int = _DEFAULTS.clear_protect_tokens,
    min_freed: int = _DEFAULTS.clear_min_freed_tokens,
) -> ClearPlan | None:
    """Plan replacing old tool outputs by a placeholder (when ``clear_old_tool_outputs`` is on).

    Walking back from the newest, tool outputs are protected until they add up to ``protect_tokens`` (the
    newest step's results are always protected); every older visible output is cleared. ``None`` unless
    at least ``min_freed`` tokens would be freed.
    """
    steps = _tool_steps(messages)
    newest = {m.id for m in steps[-1][1]} if steps else set()
    protected = 0
    protecting = True
    freed = 0
    replacements: list[Message] = []
    for msg in reversed(messages):
        if msg.role != "tool" or not msg.agent_visible or msg.kind == KIND_TOOL_OUTPUT_CLEARED:
            continue
        tokens = count(msg)
        if msg.id in newest or (protecting and protected + tokens <= protect_tokens):
            protected += tokens
            continue
        protecting = False
        text = (
            f"[Old tool output cleared to save context: {len(msg.text)} chars from {msg.name or 'a tool'}. "
            "Run the tool again if you need it.]"
        )
        # Measured on a fresh message: a counter that caches by id would return the original's count.
        freed += tokens - count(tool_result(msg.tool_call_id or "", msg.name or "", text))
        replacements.append(
            msgspec.structs.replace(
                msg,
                parts=(TextPart(text),),
                kind=KIND_TOOL_OUTPUT_CLEARED,
                metadata={**msg.metadata, "cleared_chars": len(msg.text)},
            )
        )
    if not replacements or freed < min_freed:
        return None
    return ClearPlan(replacements=replacements[::-1], tokens_freed=freed)


def _tool_steps(messages: Sequence[Message]) -> list[tuple[Message | None, list[Message]]]:
    """Agent-visible tool results grouped by the assistant message that made the calls, oldest first.

    A result whose call is not among the visible assistant messages is a step of its own (``None``).
    """
    owner: dict[str, int] = {}
    steps: list[tuple[Message | None, list[Message]]] = []
    for msg in messages:
        if not msg.agent_visible:
            continue
        if msg.role == "assistant" and msg.tool_calls:
            for call in msg.tool_calls:
                owner[call.id] = len(steps)
            steps.append((msg, []))
        elif msg.role == "tool":
            index = owner.get(msg.tool_call_id or "")
            if index is None:
                steps.append((None, [msg]))
            else:
                steps[index][1].append(msg)
    return [step for step in steps if step[1]]


def _archived_copy(msg: Message) -> Message:
    kind = KIND_TOOL_RESULT_ARCHIVED if msg.role == "tool" else KIND_TOOL_CALL_ARCHIVED
    return msgspec.structs.replace(msg, agent_visible=False, kind=kind)


def _calls_by_id(messages: list[Message]) -> dict[str, ToolCallPart]:
    return {c.id: c for m in messages if m.role == "assistant" for c in m.tool_calls}


def _tool_summary_body(msg: Message) -> str:
    text = msg.text.strip()
    return text[len(TOOL_SUMMARY_PREFIX) :].strip() if text.startswith(TOOL_SUMMARY_PREFIX) else text


def _digest(archived: list[Message], previous: str, input_chars: int, previous_chars: int) -> str:
    """The ``llm`` strategy's input: the earlier summary, then each step, at most ``input_chars``."""
    parts: list[str] = []
    if previous:
        parts.append(f"Summary of earlier tool results:\n{clip_head_tail(previous, previous_chars)}")
    results = [m for m in archived if m.role == "tool"]
    room = input_chars - sum(len(p) for p in parts)
    per_result = max(MIN_RESULT_CHARS, room // max(1, len(results)) - ARGUMENT_CHARS)
    calls = _calls_by_id(archived)
    for msg in archived:
        if msg.role == "assistant":
            if msg.text.strip():
                parts.append(f"Assistant: {clip_head_tail(msg.text.strip(), ASSISTANT_TEXT_CHARS)}")
            continue
        call = calls.get(msg.tool_call_id or "")
        arguments = clip_head_tail(call.arguments, ARGUMENT_CHARS) if call else ""
        status = " (error)" if msg.is_error else ""
        output = clip_head_tail(msg.text, per_result)
        parts.append(f"{msg.name or '?'}({arguments}){status} ->\n{output}")
    return clip_head_tail("\n\n".join(parts), input_chars)


def _heuristic_summary(archived: list[Message], previous: str, max_chars: int) -> str:
    """One line per archived result (call, outcome, first line of output), clipped head and tail."""
    calls = _calls_by_id(archived)
    results = [m for m in archived if m.role == "tool"]
    lines = [previous] if previous else []
    lines.append(f"{plural(len(results), 'older tool result')} archived:")
    for msg in results:
        call = calls.get(msg.tool_call_id or "")
        arguments = clip_head_tail(call.arguments, HEURISTIC_ARGUMENT_CHARS) if call else ""
        first_line = next((line.strip() for line in msg.text.splitlines() if line.strip()), "")
        status = "error" if msg.is_error else "ok"
        preview = clip_head_tail(first_line, HEURISTIC_RESULT_CHARS)
        lines.append(f"- {msg.name or '?'}({arguments}) [{status}, {len(msg.text)} chars]: {preview}")
    return clip_head_tail("\n".join(lines), max_chars)
