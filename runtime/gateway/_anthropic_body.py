"""A request in Anthropic's Messages format, as litellm's Anthropic request builder shapes it (design §3.2).

What the native Anthropic transport sends is checked body for body against what litellm sends over the same
request (``tests/gateway/test_anthropic_transport.py``): leading system messages become ``system`` text
blocks; user text and ``data:`` images become ``text`` and base64 ``image`` blocks; an assistant message is
its signed ``thinking`` (and ``redacted_thinking``) blocks, its text, then a ``tool_use`` block per call
(arguments parsed: a call whose arguments are not a JSON object goes with ``{}``); tool results become
``tool_result`` blocks, merged with the user turn they fall in (Anthropic's turns alternate); tool ids keep
only ``[A-Za-z0-9_-]``; tools are ``{name, input_schema, type: "custom", description}``; ``max_tokens`` is
always sent (litellm's default for the model when the request has none). The runtime's neutral cache
breakpoints (``request.cache``, design §4.7) are rendered in the chat format first, as for litellm
(:mod:`runtime.gateway._caching`), then carried over as litellm carries them: ``cache_control`` on the marked
text, image, ``tool_use`` or ``tool_result`` block, system block, or the last tool.

A request that litellm would reshape in ways not written down here (an image by URL, which litellm fetches; a
system message after the first turn; tool blocks without tools, for which litellm invents a tool) is
:func:`declined`: the router sends it to litellm. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import msgspec

from runtime.gateway._caching import tools_with_cache
from runtime.gateway._convert import to_provider_messages
from runtime.gateway._models import CompletionRequest
from runtime.messages import ImagePart, Message

_INVALID_ID: Final = re.compile(r"[^a-zA-Z0-9_-]")
_encode = msgspec.json.Encoder().encode


def declined(request: CompletionRequest) -> str | None:
    """Why the native Anthropic transport leaves ``request`` to litellm, or None when it takes it."""
    seen_other = False
    has_tool_blocks = False
    for message in request.messages:
        if isinstance(message, Message):
            if not message.agent_visible:
                continue
            role: object = message.role
            if any(isinstance(p, ImagePart) and not p.url.startswith("data:") for p in message.parts):
                return "an image by URL: litellm fetches it"
            has_tool_blocks = has_tool_blocks or role == "tool" or bool(message.tool_calls)
        else:
            role = message.get("role")
            if isinstance(message.get("content"), list) and role != "system":
                return "content parts in the chat format: litellm maps them"
            has_tool_blocks = has_tool_blocks or role == "tool" or bool(message.get("tool_calls"))
        if role == "system":
            if seen_other:
                return "a system message after the first turn: litellm places it"
        else:
            seen_other = True
    if has_tool_blocks and not request.tools:
        return "tool blocks without tools: litellm adds one"
    return None


def request_body(request: CompletionRequest, model: str, default_max_tokens: int) -> bytes:
    """The JSON body of ``request`` for Anthropic's ``POST /v1/messages``."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in to_provider_messages(request):  # cache hints rendered as litellm reads them
        blocks = _blocks(message)
        role = message.get("role")
        if role == "system":
            system.extend(blocks)
            continue
        side = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == side:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": side, "content": blocks})
    body: dict[str, Any] = {"model": model, "messages": turns}  # the keys in litellm's order
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.tools:
        body["tools"] = [_tool(t) for t in tools_with_cache(request)]
    if system:
        body["system"] = system
    if request.max_tokens is None:
        body["max_tokens"] = default_max_tokens
    if request.stream:
        body["stream"] = True
    return _encode(body)


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": _INVALID_ID.sub("_", str(message.get("tool_call_id") or "")) or "tool_use_id",
            "content": content if isinstance(content, str) else _parts(content, role),
        }
        if message.get("cache_control"):
            result["cache_control"] = message["cache_control"]
        return [result]
    if role == "assistant":
        blocks: list[dict[str, Any]] = []
        for block in message.get("thinking_blocks") or ():
            if block.get("type") == "thinking":
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": block.get("thinking"),
                        "signature": block.get("signature"),
                    }
                )
            elif block.get("type") == "redacted_thinking":
                blocks.append({"type": "redacted_thinking", "data": block.get("data")})
        if isinstance(content, str):
            if content:
                blocks.append({"type": "text", "text": content})
        else:
            blocks.extend(_parts(content, role))
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            use: dict[str, Any] = {
                "type": "tool_use",
                "id": _INVALID_ID.sub("_", str(call.get("id") or "")) or "tool_use_id",
                "name": fn.get("name"),
                "input": _arguments(fn.get("arguments")),
            }
            if call.get("cache_control"):
                use["cache_control"] = call["cache_control"]
            blocks.append(use)
        return blocks
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content or role != "system" else []
    return _parts(content, role)


def _parts(content: Any, role: object) -> list[dict[str, Any]]:
    """Content parts (text, ``data:`` images) as blocks, each keeping its ``cache_control``."""
    out: list[dict[str, Any]] = []
    for part in content or ():
        kind = part.get("type")
        block: dict[str, Any] | None = None
        if kind == "text":
            if part.get("text") or role != "system":
                block = {"type": "text", "text": part.get("text", "")}
        elif kind == "image_url":
            image = part.get("image_url")
            url = image if isinstance(image, str) else (image or {}).get("url", "")
            media_type, _, data = url.removeprefix("data:").partition(";base64,")
            block = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
        if block is not None:
            if part.get("cache_control"):
                block["cache_control"] = part["cache_control"]
            out.append(block)
    return out


def _arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict):
        return tool
    schema = dict(fn.get("parameters") or {"type": "object"})
    schema.setdefault("properties", {})  # as litellm: Anthropic wants an object schema with its properties
    out: dict[str, Any] = {"name": fn.get("name"), "input_schema": schema, "type": "custom"}
    if fn.get("description"):
        out["description"] = fn["description"]
    if tool.get("cache_control"):
        out["cache_control"] = tool["cache_control"]
    return out
