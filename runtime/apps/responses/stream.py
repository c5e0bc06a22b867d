"""A run's agentcell events → the Responses API's stream events: pure, no I/O.

:class:`StreamTranslator` turns the events of one run (``request_start``, ``reasoning_delta``,
``text_delta``, ``tool_call_delta``, ``turn_end``, ``tool_execution_start``...) into the API's events, in
the API's order, each with its ``sequence_number``::

    response.created, response.in_progress
    per item:  response.output_item.added
               reasoning: response.reasoning_summary_part.added, response.reasoning_summary_text.delta...,
                          response.reasoning_summary_text.done, response.reasoning_summary_part.done
               message:   response.content_part.added, response.output_text.delta...,
                          response.output_text.done, response.content_part.done
               function_call (the client's tools): response.function_call_arguments.delta..., .done
               mcp_call (the runtime's own tools): response.mcp_call_arguments.delta..., .done,
                          response.mcp_call.in_progress, response.mcp_call.completed | .failed
               response.output_item.done
    response.completed | response.failed | response.incomplete

An item is done when the next one starts, or when its step ends (a tool run by the runtime when its
result is known: :meth:`StreamTranslator.results`). :meth:`finish` reconciles the stream with the final
output (read from the session): an item the stream never showed is added and done there, and the final
``output`` lists every item streamed, at its ``output_index``.

A provider attempt that fails after it streamed (``stream_reset``: the gateway retries) leaves items that
will never be completed: each is done there and then with status ``incomplete`` and the text it had, and
the retry streams new items (the answer's message has a new id). Every ``*.done`` event and the final
response agree with what was streamed. agentcell's own events (compaction, overflow recovery, retries,
resets) are passed on as ``agentcell.<type>`` events only to a client that asked for them
(``include: ["agentcell.events"]``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from runtime import events as ev
from runtime.apps.responses import items as it
from runtime.messages import Message, ToolCallPart

PASSED_ON: Final = frozenset(
    {
        "compaction_start",
        "compaction_end",
        "compaction_failed",
        "compaction_skipped",
        "tool_results_archived",
        "tool_outputs_cleared",
        "usage_overflow",
        "provider_retry",
        "stream_stalled",
        "tool_output",
        "message_queued",
        "stream_reset",
    }
)
"""agentcell events a stream carries as ``agentcell.<type>`` (a standard client skips unknown types)."""


class _Item:
    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index = index
        self.item = item
        self.text: list[str] = []
        self.done = False

    @property
    def id(self) -> str:
        return str(self.item["id"])


class StreamTranslator:
    """One response's stream: feed it the run's events; it returns the API events to send, numbered."""

    def __init__(
        self, client_tools: frozenset[str], *, shape: it.Shape = it.PLAIN, extra_events: bool = False
    ) -> None:
        self.client_tools = client_tools
        self.shape = shape
        self.extra_events = extra_events
        self.sequence = 0
        self.items: dict[str, _Item] = {}  # by item id, in the order they were added
        self.open: _Item | None = None  # the item deltas go to
        self.waiting: dict[str, _Item] = {}  # the runtime's own calls, by call id, until their results
        self.announced: set[str] = set()  # ... whose arguments are done
        self.message_id: str | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # this step's calls by index: id, name, arguments

    def _event(self, type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _on(self, item: _Item, type: str, **fields: Any) -> dict[str, Any]:
        """An event about ``item``."""
        return self._event(type, item_id=item.id, output_index=item.index, **fields)

    def start(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def on_event(self, event: ev.Event) -> list[dict[str, Any]]:
        if isinstance(event, ev.RequestStart):
            self.message_id, self.calls = event.message_id, {}
            return []
        if isinstance(event, ev.ReasoningDelta) and self.message_id is not None:
            return self._delta(it.reasoning_item_id(self.message_id), event.delta, "reasoning")
        if isinstance(event, ev.TextDelta) and self.message_id is not None:
            return self._delta(it.message_item_id(self.message_id), event.delta, "message")
        if isinstance(event, ev.ToolCallDelta):
            return self._call_delta(event)
        if isinstance(event, ev.StreamReset):
            return self._reset(event) + self._passed_on(event)
        if isinstance(event, ev.TurnEnd):
            out = self._close()
            for item in self.waiting.values():
                if not item.done and item.id not in self.announced:
                    self.announced.add(item.id)
                    out.append(
                        self._on(
                            item,
                            "response.mcp_call_arguments.done",
                            arguments="".join(item.text),
                        )
                    )
            return out
        if isinstance(event, ev.ToolExecutionStart):
            waiting = self.waiting.get(event.call_id)
            if waiting is None:  # a call the deltas did not show (a transport that does not stream calls)
                out = self._close()
                call = ToolCallPart(event.call_id, event.name, event.arguments)
                item = self._add(it.mcp_call_item(call, None), out)
                item.text.append(event.arguments)
                self.waiting[event.call_id] = item
                self.announced.add(item.id)
                self.open = None
            else:
                item, out = waiting, []
            out.append(self._on(item, "response.mcp_call.in_progress"))
            return out
        return self._passed_on(event)

    def _passed_on(self, event: ev.Event) -> list[dict[str, Any]]:
        if self.extra_events and event.type in PASSED_ON:
            data = ev.event_to_builtins(event)
            return [self._event(f"agentcell.{event.type}", event=data)]
        return []

    def _reset(self, event: ev.StreamReset) -> list[dict[str, Any]]:
        """The attempt that streamed this step's items failed: each ends ``incomplete`` as it was; the
        retry's answer is a new message (``event.message_id``) with items of its own."""
        out: list[dict[str, Any]] = []
        step = {it.reasoning_item_id(self.message_id or ""), it.message_item_id(self.message_id or "")}
        step |= {c["item"].id for c in self.calls.values() if c["item"] is not None}
        for item in self.items.values():
            if item.id not in step or item.done:
                continue
            text = "".join(item.text)
            kind = item.item["type"]
            if kind == "message":
                out.append(
                    self._on(item, "response.output_text.done", content_index=0, text=text, logprobs=[])
                )
                out.append(
                    self._on(
                        item, "response.content_part.done", content_index=0, part=it.output_text_part(text)
                    )
                )
                item.item = {**item.item, "content": [it.output_text_part(text)]}
            elif kind == "reasoning":
                part = {"type": "summary_text", "text": text}
                out.append(self._on(item, "response.reasoning_summary_text.done", summary_index=0, text=text))
                out.append(self._on(item, "response.reasoning_summary_part.done", summary_index=0, part=part))
                item.item = {**item.item, "summary": [part] if text else []}
            else:
                self.waiting.pop(str(item.item.get("call_id") or item.id.split("_", 1)[1]), None)
                item.item = {**item.item, "arguments": text}
            item.item = {**item.item, "status": "incomplete"}
            out.extend(self._done(item))
        self.open = None
        self.message_id, self.calls = event.message_id or self.message_id, {}
        return out

    def results(self, messages: Iterable[Message]) -> list[dict[str, Any]]:
        """The runtime's own calls answered among ``messages``: each is completed (or failed) and done."""
        out: list[dict[str, Any]] = []
        for message in messages:
            item = self.waiting.pop(message.tool_call_id or "", None) if message.role == "tool" else None
            if item is None or item.done:
                continue
            call = ToolCallPart(message.tool_call_id or "", str(item.item["name"]), "".join(item.text))
            item.item = it.mcp_call_item(call, message)
            kind = "response.mcp_call.failed" if message.is_error else "response.mcp_call.completed"
            out.append(self._on(item, kind))
            out.extend(self._done(item))
        return out

    def finish(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The end of the stream: open items closed as the final ``output`` has them, items the stream did
        not show added and done, then ``response.completed`` (or ``failed``, ``incomplete``, ``cancelled``
        ends as ``failed``... see the response's status). ``response["output"]`` becomes the stream's
        items in order (those a failed attempt left ``incomplete`` included)."""
        out = self._close()
        final = {str(i["id"]): i for i in response.get("output", [])}
        for item in self.items.values():
            if not item.done:
                item.item = final.get(item.id, {**item.item, "status": "incomplete"})
                out.extend(self._done(item))
            elif item.item.get("status") != "incomplete" and item.id in final:
                item.item = final[item.id]
        for item_id, item in final.items():
            if item_id not in self.items:
                added = self._add(item, out)
                out.extend(self._done(added))
        response["output"] = [item.item for item in self.items.values()]
        status = response.get("status")
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            str(status), "response.failed"
        )
        out.append(self._event(kind, response=response))
        return out

    # -- items ----------------------------------------------------------------------------------------
    def _add(self, item: dict[str, Any], out: list[dict[str, Any]]) -> _Item:
        added = _Item(len(self.items), item)
        self.items[added.id] = added
        out.append(self._event("response.output_item.added", output_index=added.index, item=item))
        return added

    def _delta(self, item_id: str, delta: str, kind: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        item = self.items.get(item_id)
        if item is None:
            out.extend(self._close())
            assert self.message_id is not None
            if kind == "reasoning":
                item = self._add(it.reasoning_item(self.message_id, "", "in_progress") | {"summary": []}, out)
                part = {"type": "summary_text", "text": ""}
                out.append(
                    self._on(
                        item,
                        "response.reasoning_summary_part.added",
                        summary_index=0,
                        part=part,
                    )
                )
            else:
                item = self._add(it.text_item(self.message_id, "", "in_progress"), out)
                out.append(
                    self._on(
                        item,
                        "response.content_part.added",
                        content_index=0,
                        part=it.output_text_part(""),
                    )
                )
            self.open = item
        if item.done or item is not self.open:
            return out  # a late delta of an item already closed: the final output has it
        item.text.append(delta)
        if kind == "reasoning":
            out.append(
                self._on(
                    item,
                    "response.reasoning_summary_text.delta",
                    summary_index=0,
                    delta=delta,
                )
            )
        else:
            out.append(
                self._on(
                    item,
                    "response.output_text.delta",
                    content_index=0,
                    delta=delta,
                    logprobs=[],
                )
            )
        return out

    def _call_delta(self, event: ev.ToolCallDelta) -> list[dict[str, Any]]:
        call = self.calls.setdefault(event.index, {"id": None, "name": None, "arguments": [], "item": None})
        call["id"] = call["id"] or event.call_id
        call["name"] = call["name"] or event.name
        call["arguments"].append(event.arguments_delta)
        out: list[dict[str, Any]] = []
        item: _Item | None = call["item"]
        if item is None:
            if not call["id"] or not call["name"]:
                return out  # named once the id and the name are known
            out.extend(self._close())
            part = ToolCallPart(call["id"], call["name"], "")
            client = call["name"] in self.client_tools
            shown = (
                it.function_call_item(part, "in_progress", namespace=self.shape.namespaces.get(call["name"]))
                if client
                else it.mcp_call_item(part, None)
            )
            item = call["item"] = self._add(shown, out)
            self.open = item
            if not client:
                self.waiting[call["id"]] = item
            delta = "".join(call["arguments"])
        else:
            delta = event.arguments_delta
        if item is not self.open or not delta:
            return out
        item.text.append(delta)
        kind = (
            "response.function_call_arguments.delta"
            if item.item["type"] == "function_call"
            else "response.mcp_call_arguments.delta"
        )
        out.append(self._on(item, kind, delta=delta))
        return out

    def _close(self) -> list[dict[str, Any]]:
        """End the open item (its arguments or text are complete); a runtime's own call waits for its result."""
        item, self.open = self.open, None
        if item is None or item.done:
            return []
        text = "".join(item.text)
        kind = item.item["type"]
        out: list[dict[str, Any]] = []
        if kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            out.append(
                self._on(
                    item,
                    "response.reasoning_summary_text.done",
                    summary_index=0,
                    text=text,
                )
            )
            out.append(
                self._on(
                    item,
                    "response.reasoning_summary_part.done",
                    summary_index=0,
                    part=part,
                )
            )
            item.item = it.reasoning_item(self.message_id or "", text, shape=self.shape) | {"id": item.id}
        elif kind == "message":
            out.append(
                self._on(
                    item,
                    "response.output_text.done",
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self._on(
                    item,
                    "response.content_part.done",
                    content_index=0,
                    part=it.output_text_part(text),
                )
            )
            item.item = {**item.item, "status": "completed", "content": [it.output_text_part(text)]}
        elif kind == "function_call":
            out.append(
                self._on(
                    item,
                    "response.function_call_arguments.done",
                    arguments=text,
                )
            )
            item.item = {**item.item, "arguments": text, "status": "completed"}
        else:  # mcp_call: its arguments are done at turn_end; the item when its result comes
            return out
        out.extend(self._done(item))
        return out

    def _done(self, item: _Item) -> list[dict[str, Any]]:
        item.done = True
        return [self._event("response.output_item.done", output_index=item.index, item=item.item)]
