"""Responses API items ↔ agentcell messages: pure functions, no I/O.

Input items (what a client sends in ``input``, or adds to a conversation) become :class:`Message` s:
a user message, the history a client keeps itself (assistant messages, ``reasoning``, ``function_call``
items) and the results of its function calls (``function_call_output``). Messages become items again for
a response's ``output``, its ``input_items`` and a conversation's items:

- a user message: a ``message`` item (``input_text``, ``input_image``);
- an assistant message: a ``reasoning`` item (its reasoning as the summary), a ``message`` item
  (``output_text``), and one item per tool call: ``function_call`` for the client's own tools (the ids
  in the message's ``client_calls`` metadata), ``mcp_call`` for the tools the runtime ran itself, with
  their output (``server_label`` ``agentcell``);
- a result of a client call: a ``function_call_output`` item.

Item ids are made from message and call ids (``msg_<id>``, ``rs_<id>``, ``fc_<call id>``,
``mcp_<call id>``, ``fco_<id>``), so one message has the same items wherever it is listed, and a stream
can name an item before the message exists (``request_start`` announces the message's id).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from runtime.context.integrity import CLIENT_CALLS_KEY
from runtime.errors import AgentcellError
from runtime.messages import (
    KIND_STEER,
    KIND_TOOL_RESULT,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    new_id,
    tool_result,
)

SERVER_LABEL: Final = "agentcell"
"""The ``server_label`` of the ``mcp_call`` items of the runtime's own tools."""

_SHOWN_KINDS: Final = frozenset({None, KIND_STEER, KIND_TOOL_RESULT})
"""Messages of these kinds are items; the others are context management's (summaries, notes)."""

_OUR_ID = re.compile(r"^(?:msg|rs|fco)_([0-9a-f]{16})$")


class InputError(AgentcellError, ValueError):
    """An input item the server cannot take: ``param`` names it (``input[2].content[0]``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class ParsedInput:
    """The messages of a request's input, and what it says besides them.

    ``messages``: to record, in order. ``instructions``: the text of its ``system`` and ``developer``
    messages (they join the run's instructions). ``outputs``: the call ids its ``function_call_output``
    items answer; ``calls``: the call ids of its own ``function_call`` items (history sent along).
    """

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.instructions: list[str] = []
        self.outputs: list[str] = []
        self.calls: list[str] = []
        self.compaction: str | None = None  # the last ``compaction`` item's token: what came before it


Unseal = Callable[[str], list[ReasoningPart]]
"""Opens a reasoning item's ``encrypted_content`` into its parts (raises ``ValueError`` if it cannot)."""


class Shape:
    """How messages become items for one response: ``seal`` (when the client included
    ``reasoning.encrypted_content``) makes a reasoning item's token; ``namespaces`` names the namespace of
    the client's functions declared inside a ``namespace`` tool."""

    def __init__(
        self,
        seal: Callable[[Sequence[ReasoningPart]], str] | None = None,
        namespaces: Mapping[str, str] | None = None,
    ) -> None:
        self.seal = seal
        self.namespaces: Mapping[str, str] = namespaces or {}


PLAIN: Final = Shape()


def parse_input(
    value: Any, *, keep_ids: bool = False, param: str = "input", unseal: Unseal | None = None
) -> ParsedInput:
    """Parse ``input`` (a string, or a list of items) into messages; :class:`InputError` for what does not
    fit. ``keep_ids``: an item with an id this module made keeps it (a conversation's stored items).
    ``unseal`` opens a reasoning item's ``encrypted_content`` (its parts replace the item's summary)."""
    parsed = ParsedInput()
    if isinstance(value, str):
        if value:
            parsed.messages.append(Message(role="user", parts=(TextPart(value),)))
        return parsed
    if not isinstance(value, list):
        raise InputError(f"{param} must be a string or a list of items", param)
    group = _AssistantGroup()
    for index, item in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(item, dict):
            raise InputError(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                group.text(_assistant_text(item.get("content"), where), _id(item, keep_ids))
                continue
            parsed.messages.extend(group.flush())
            if role == "user":
                parts = _user_parts(item.get("content"), where)
                parsed.messages.append(Message(role="user", parts=parts, id=_id(item, keep_ids) or new_id()))
            elif role in ("system", "developer"):
                parsed.instructions.append(
                    "".join(
                        p.text for p in _user_parts(item.get("content"), where) if isinstance(p, TextPart)
                    )
                )
            else:
                raise InputError(
                    f"{where}.role must be user, assistant, system or developer", f"{where}.role"
                )
        elif kind == "reasoning":
            summary = item.get("summary") or []
            content = item.get("content") or []
            if not isinstance(summary, list) or not isinstance(content, list):
                raise InputError(f"{where}: summary and content are lists", where)
            texts = [
                _str(p.get("text") if isinstance(p, dict) else None, f"{where}.summary") for p in summary
            ]
            texts += [
                _str(p.get("text") if isinstance(p, dict) else None, f"{where}.content") for p in content
            ]
            token = item.get("encrypted_content")
            if token is not None and unseal is not None:
                try:
                    group.reasoning_parts(unseal(_str(token, f"{where}.encrypted_content")))
                except ValueError as exc:
                    raise InputError(
                        f"{where}.encrypted_content: {exc}", f"{where}.encrypted_content"
                    ) from None
                group.message_id = group.message_id or _id(item, keep_ids)
            else:
                group.reasoning("\n".join(texts), _id(item, keep_ids))
        elif kind == "function_call":
            call = ToolCallPart(
                id=_str(item.get("call_id"), f"{where}.call_id"),
                name=_str(item.get("name"), f"{where}.name"),
                arguments=_str(item.get("arguments", "{}"), f"{where}.arguments"),
            )
            group.call(call, client=True)
            parsed.calls.append(call.id)
        elif kind == "mcp_call":
            call = ToolCallPart(
                id=_call_id_of(_str(item.get("id"), f"{where}.id"), "mcp_"),
                name=_str(item.get("name"), f"{where}.name"),
                arguments=_str(item.get("arguments", "{}"), f"{where}.arguments"),
            )
            error = item.get("error")
            group.call(
                call, client=False, result=(str(item.get("output") or _error_text(error)), bool(error))
            )
        elif kind == "function_call_output":
            call_id = _str(item.get("call_id"), f"{where}.call_id")
            output = _output_text(item.get("output"), f"{where}.output")
            parsed.messages.extend(group.flush())
            name = group.names.get(call_id, "")
            message_id = _id(item, keep_ids) or new_id()
            parsed.messages.append(tool_result(call_id, name, output, id=message_id))
            parsed.outputs.append(call_id)
        elif kind == "compaction":  # (responses.compact's): the session it names holds what came before
            group.flush()
            parsed.compaction = _str(item.get("encrypted_content"), f"{where}.encrypted_content")
            parsed.messages, parsed.outputs, parsed.calls = [], [], []
        elif kind is None:
            raise InputError(f"{where} has no type", f"{where}.type")
        else:
            raise InputError(
                f"{where}: items of type {kind!r} are not supported by this server", f"{where}.type"
            )
    parsed.messages.extend(group.flush())
    return parsed


class _AssistantGroup:
    """Consecutive assistant items (reasoning, text, calls) become one assistant message; reasoning after
    text or calls starts the next one."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.client: list[str] = []
        self.results: list[Message] = []
        self.names: dict[str, str] = {}
        self.message_id: str | None = None
        self.done: list[Message] = []

    def reasoning(self, text: str, item_id: str | None) -> None:
        if any(not isinstance(p, ReasoningPart) for p in self.parts):
            self._close()
        self.parts.append(ReasoningPart(text))
        self.message_id = self.message_id or item_id

    def reasoning_parts(self, parts: Sequence[ReasoningPart]) -> None:
        if any(not isinstance(p, ReasoningPart) for p in self.parts):
            self._close()
        self.parts.extend(parts)

    def text(self, text: str, item_id: str | None) -> None:
        self.parts.append(TextPart(text))
        self.message_id = self.message_id or item_id

    def call(self, call: ToolCallPart, *, client: bool, result: tuple[str, bool] | None = None) -> None:
        self.parts.append(call)
        self.names[call.id] = call.name
        if client:
            self.client.append(call.id)
        if result is not None:
            self.results.append(tool_result(call.id, call.name, result[0], is_error=result[1]))

    def flush(self) -> list[Message]:
        """The messages of the items so far (each assistant message, then the results of its own calls)."""
        self._close()
        done, self.done = self.done, []
        return done

    def _close(self) -> None:
        if not self.parts:
            return
        parts = tuple(sorted(self.parts, key=_rank))  # reasoning, text, calls (a stable sort)
        calls = any(isinstance(p, ToolCallPart) for p in parts)
        self.done.append(
            Message(
                role="assistant",
                parts=parts,
                id=self.message_id or new_id(),
                metadata={CLIENT_CALLS_KEY: list(self.client)} if self.client else {},
                stop_reason="tool_calls" if calls else "stop",
            )
        )
        self.done.extend(self.results)
        self.parts, self.client, self.results, self.message_id = [], [], [], None


def _error_text(error: Any) -> str:
    """The text of an ``mcp_call``'s ``error`` (a string, or one of the API's error objects)."""
    if isinstance(error, dict):
        content = error.get("content")
        if isinstance(content, list):
            return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        return str(error.get("message") or content or "")
    return str(error or "")


def _rank(part: Part) -> int:
    return 0 if isinstance(part, ReasoningPart) else 2 if isinstance(part, ToolCallPart) else 1


def _id(item: Mapping[str, Any], keep: bool) -> str | None:
    if not keep:
        return None
    match = _OUR_ID.match(str(item.get("id") or ""))
    return match.group(1) if match else None


def _call_id_of(item_id: str, prefix: str) -> str:
    return item_id[len(prefix) :] if item_id.startswith(prefix) else item_id


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{param} must be a string", param)
    return value


def _user_parts(content: Any, where: str) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (TextPart(content),)
    if not isinstance(content, list):
        raise InputError(f"{where}.content must be a string or a list of parts", f"{where}.content")
    parts: list[Part] = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append(TextPart(_str(part.get("text"), f"{at}.text")))
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise InputError(f"{at}: only images by image_url are supported (not file_id)", at)
            parts.append(ImagePart(url, detail=part.get("detail") if part.get("detail") != "auto" else None))
        else:
            raise InputError(f"{at}: content parts of type {kind!r} are not supported by this server", at)
    return tuple(parts)


def _assistant_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"{where}.content must be a string or a list of parts", f"{where}.content")
    texts: list[str] = []
    for i, part in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("output_text", "input_text", "text"):
            texts.append(_str(part.get("text"), f"{at}.text"))
        elif kind == "refusal":
            texts.append(_str(part.get("refusal"), f"{at}.refusal"))
        else:
            raise InputError(f"{at}: content parts of type {kind!r} are not supported here", at)
    return "".join(texts)


def _output_text(output: Any, param: str) -> str:
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise InputError(f"{param} must be a string or a list of parts", param)
    texts: list[str] = []
    for i, part in enumerate(output):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text"):
            raise InputError(f"{param}[{i}]: only text outputs are supported, not {kind!r}", f"{param}[{i}]")
        texts.append(_str(part.get("text"), f"{param}[{i}].text"))
    return "".join(texts)


# -- messages → items -------------------------------------------------------------------------------------


def is_shown(message: Message) -> bool:
    """Whether ``message`` is a conversation's (not context management's: summaries, notes)."""
    return message.kind in _SHOWN_KINDS


def message_item_id(message_id: str) -> str:
    return f"msg_{message_id}"


def reasoning_item_id(message_id: str) -> str:
    return f"rs_{message_id}"


def call_item_id(call_id: str, *, client: bool) -> str:
    return f"fc_{call_id}" if client else f"mcp_{call_id}"


def client_calls(message: Message) -> frozenset[str]:
    """The ids of ``message``'s tool calls that the client runs."""
    ids = message.metadata.get(CLIENT_CALLS_KEY)
    return frozenset(str(i) for i in ids) if isinstance(ids, list) else frozenset()


def to_items(
    messages: Sequence[Message], *, results: Iterable[Message] = (), shape: Shape = PLAIN
) -> list[dict[str, Any]]:
    """The items of ``messages``, in order. The runtime's own calls carry their results, found among
    ``messages`` and ``results`` (a call without one yet is ``in_progress``)."""
    by_call = {m.tool_call_id: m for m in (*messages, *results) if m.role == "tool" and m.tool_call_id}
    own_calls: set[str] = set()
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.kind not in _SHOWN_KINDS:
            continue
        if message.role == "user":
            items.append(user_item(message))
        elif message.role == "assistant":
            client = client_calls(message)
            own_calls.update(c.id for c in message.tool_calls if c.id not in client)
            items.extend(assistant_items(message, by_call, shape))
        elif message.role == "tool" and message.tool_call_id not in own_calls:
            items.append(function_call_output_item(message))
    return items


def user_item(message: Message) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, ImagePart):
            content.append({"type": "input_image", "image_url": part.url, "detail": part.detail or "auto"})
    return {
        "id": message_item_id(message.id),
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": content,
    }


def assistant_items(
    message: Message, results: Mapping[str, Message], shape: Shape = PLAIN
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    reasoning = [p for p in message.parts if isinstance(p, ReasoningPart)]
    if message.reasoning or (reasoning and shape.seal is not None):
        items.append(reasoning_item(message.id, message.reasoning, shape=shape, parts=reasoning))
    if message.text or (not message.tool_calls and not message.reasoning):
        items.append(text_item(message.id, message.text))
    client = client_calls(message)
    for call in message.tool_calls:
        if call.id in client:
            items.append(function_call_item(call, namespace=shape.namespaces.get(call.name)))
        else:
            items.append(mcp_call_item(call, results.get(call.id)))
    return items


def reasoning_item(
    message_id: str,
    text: str,
    status: str = "completed",
    *,
    shape: Shape = PLAIN,
    parts: Sequence[ReasoningPart] | None = None,
) -> dict[str, Any]:
    """A ``reasoning`` item: its text as the summary; with ``shape.seal``, the reasoning ``parts`` (or the
    text alone) sealed in ``encrypted_content``."""
    summary = [{"type": "summary_text", "text": text}] if text else []
    item = {"id": reasoning_item_id(message_id), "type": "reasoning", "summary": summary, "status": status}
    if shape.seal is not None and status == "completed":
        item["encrypted_content"] = shape.seal(parts if parts is not None else [ReasoningPart(text)])
    return item


def text_item(message_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [output_text_part(text)] if status == "completed" else []
    return {
        "id": message_item_id(message_id),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    call: ToolCallPart, status: str = "completed", *, namespace: str | None = None
) -> dict[str, Any]:
    item = {
        "id": call_item_id(call.id, client=True),
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }
    if namespace:
        item["namespace"] = namespace
    return item


def mcp_call_item(call: ToolCallPart, result: Message | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": call_item_id(call.id, client=False),
        "type": "mcp_call",
        "server_label": SERVER_LABEL,
        "name": call.name,
        "arguments": call.arguments,
        "output": None,
        "error": None,
        "status": "in_progress" if result is None else "failed" if result.is_error else "completed",
    }
    if result is not None:
        item["output"] = result.text
        if result.is_error:  # (McpToolExecutionError: the tool ran and failed; its output says why)
            item["error"] = {
                "type": "mcp_tool_execution_error",
                "content": [{"type": "text", "text": result.text}],
            }
    return item


def function_call_output_item(message: Message) -> dict[str, Any]:
    return {
        "id": f"fco_{message.id}",
        "type": "function_call_output",
        "call_id": message.tool_call_id or "",
        "output": message.text,
        "status": "completed",
    }
