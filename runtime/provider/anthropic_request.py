"""An Anthropic Messages request as the local provider reads it (design §7.3), pure: checked as Anthropic
checks it (a 400 in Anthropic's words otherwise: fields, roles, content blocks, ``tool_use``/``tool_result``
pairs, thinking signatures and the thinking that must lead a tool loop), then turned into chat messages (what
scripts, responders and the policy reply to) and into the prompt's cache blocks with their token counts
(:mod:`runtime.provider.prompt_cache`). :class:`Signer` signs the thinking the provider gives out and checks
what comes back."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from typing import Any, Final

import msgspec

from runtime.dialects import anthropic
from runtime.dialects._base import ErrorResponse
from runtime.provider.prompt_cache import Block
from runtime.provider.usage import IMAGE_TOKENS, MESSAGE_OVERHEAD, TokenCounter

_canonical = msgspec.json.Encoder(order="deterministic").encode


class _Problem(Exception):
    """A request Anthropic would refuse: the error response to send."""

    def __init__(self, error: ErrorResponse) -> None:
        super().__init__(error.body)
        self.error = error


def _bad(message: str) -> _Problem:
    return _Problem(anthropic.bad_request(message))


# -- signatures -----------------------------------------------------------------------------------------------


class Signer:
    """Signs the thinking the provider gives out, and checks what comes back: a signature is valid only for
    the very thinking it was given with (an HMAC under a secret of this provider, or a scripted signature
    recorded when it was sent)."""

    def __init__(self) -> None:
        self._secret = os.urandom(32)
        self._scripted: dict[str, bytes] = {}

    def sign(self, thinking: str, scripted: str | None = None) -> str:
        if scripted is not None:
            self._scripted[scripted] = hashlib.sha256(thinking.encode()).digest()
            return scripted
        mac = hmac.new(self._secret, thinking.encode(), hashlib.sha256).digest()
        return base64.b64encode(b"agentcell-sig:" + mac).decode()

    def valid(self, thinking: str, signature: object) -> bool:
        if not isinstance(signature, str) or not signature:
            return False
        recorded = self._scripted.get(signature)
        if recorded is not None:
            return hmac.compare_digest(recorded, hashlib.sha256(thinking.encode()).digest())
        return hmac.compare_digest(signature, self.sign(thinking))


# -- a request, checked and read ------------------------------------------------------------------------------


class Parsed(msgspec.Struct, kw_only=True):
    """A Messages request as the provider reads it."""

    model: str
    max_tokens: int
    stream: bool
    system: list[dict[str, Any]]
    messages: list[tuple[str, list[dict[str, Any]]]]
    tools: list[dict[str, Any]]


def parse(body: dict[str, Any], signer: Signer) -> Parsed | ErrorResponse:
    """``body`` checked as Anthropic checks it: read, or the 400 Anthropic would send."""
    try:
        return _parse(body, signer)
    except _Problem as problem:
        return problem.error


def _parse(body: dict[str, Any], signer: Signer) -> Parsed:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise _bad("max_tokens: Field required")
    if max_tokens < 1:
        raise _bad("max_tokens: Input should be greater than or equal to 1")
    raw_system = body.get("system")
    system: list[dict[str, Any]] = []
    if isinstance(raw_system, str):
        if raw_system:
            system = [{"type": "text", "text": raw_system}]
    elif isinstance(raw_system, list):
        for i, block in enumerate(raw_system):
            if (
                not isinstance(block, dict)
                or block.get("type") != "text"
                or not isinstance(block.get("text"), str)
            ):
                raise _bad(f"system.{i}: Input should be a valid text block")
            system.append(block)
    elif raw_system is not None:
        raise _bad("system: Input should be a valid string or a list of text blocks")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _bad(
            "messages: Field required"
            if raw_messages is None
            else "messages: at least one message is required"
        )
    messages: list[tuple[str, list[dict[str, Any]]]] = []
    for i, message in enumerate(raw_messages):
        if not isinstance(message, dict):
            raise _bad(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _bad(
                f'messages.{i}.role: Unexpected role "{role}". The Messages API accepts a top-level `system` '
                'parameter, not "system" as an input message role.'
                if role == "system"
                else f"messages.{i}.role: Input should be 'user' or 'assistant'"
            )
        content = message.get("content")
        if isinstance(content, str):
            blocks = [{"type": "text", "text": content}]
        elif isinstance(content, list) and all(isinstance(b, dict) for b in content):
            blocks = list(content)
        else:
            raise _bad(f"messages.{i}.content: Input should be a valid string or a list of content blocks")
        for j, block in enumerate(blocks):
            _check_block(block, role, f"messages.{i}.content.{j}", signer)
        messages.append((role, blocks))
    _check_tool_pairs(messages)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        _check_thinking_leads(messages)
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise _bad("tools: Input should be a valid list")
    for i, tool in enumerate(raw_tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise _bad(f"tools.{i}.name: Field required")
        if "type" not in tool and not isinstance(tool.get("input_schema"), dict):
            raise _bad(f"tools.{i}.input_schema: Field required")
    marks = sum(1 for t in raw_tools if isinstance(t, dict) and t.get("cache_control"))
    marks += sum(1 for b in system if b.get("cache_control"))
    marks += sum(1 for _, blocks in messages for b in blocks if b.get("cache_control"))
    marks += sum(  # a tool result's own text blocks may carry one too
        1
        for _, blocks in messages
        for b in blocks
        if b.get("type") == "tool_result" and isinstance(b.get("content"), list)
        for inner in b["content"]
        if isinstance(inner, dict) and inner.get("cache_control")
    )
    if marks > anthropic.MAX_BREAKPOINTS:
        raise _Problem(anthropic.too_many_breakpoints(marks))
    return Parsed(
        model=model,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        system=system,
        messages=messages,
        tools=list(raw_tools),
    )


_USER_BLOCKS: Final = frozenset({"text", "image", "document", "tool_result"})
_ASSISTANT_BLOCKS: Final = frozenset({"text", "tool_use", "thinking", "redacted_thinking", "server_tool_use"})


def _check_block(block: dict[str, Any], role: str, where: str, signer: Signer) -> None:
    kind = block.get("type")
    allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
    if kind not in allowed:
        raise _bad(f"{where}.type: a {role} message cannot hold a {kind!r} block")
    if kind == "text" and not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text: Field required")
    if kind == "tool_use":
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise _bad(f"{where}: tool_use blocks need an id and a name")
        if not isinstance(block.get("input"), dict):
            raise _bad(f"{where}.input: Input should be a valid dictionary")
    if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id: Field required")
    if kind == "thinking":
        thinking = block.get("thinking")
        if not isinstance(thinking, str):
            raise _bad(f"{where}.thinking: Field required")
        if not signer.valid(thinking, block.get("signature")):
            raise _bad(f"{where}: Invalid `signature` in `thinking` block")
    if block.get("cache_control") is not None:
        control = block["cache_control"]
        if not isinstance(control, dict) or control.get("type") != "ephemeral":
            raise _bad(f"{where}.cache_control.type: Input should be 'ephemeral'")
        if control.get("ttl", "5m") not in anthropic.TTL_SECONDS:
            raise _bad(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")


def _check_tool_pairs(messages: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Each ``tool_use`` answered in the very next user turn; each ``tool_result`` answering one before it."""
    for i, (role, blocks) in enumerate(messages):
        if role != "assistant":
            continue
        ids = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if not ids:
            continue
        answered: set[object] = set()
        if i + 1 < len(messages) and messages[i + 1][0] == "user":
            answered = {b.get("tool_use_id") for b in messages[i + 1][1] if b.get("type") == "tool_result"}
        missing = [x for x in ids if x not in answered]
        if missing and i + 1 < len(messages):
            raise _bad(
                f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in "
                "the next message."
            )
    for i, (_, blocks) in enumerate(messages):
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        if not results:
            continue
        before = messages[i - 1] if i > 0 else None
        calls = {b.get("id") for b in before[1] if b.get("type") == "tool_use"} if before else set()
        stray = [x for x in results if x not in calls]
        if stray:
            raise _bad(
                f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {stray[0]}. Each "
                "`tool_result` block must have a corresponding `tool_use` block in the previous message."
            )


def _check_thinking_leads(messages: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """With thinking enabled, the assistant message whose tool calls the final user message answers must
    start with its thinking (the block the model gave, sent back), as Anthropic requires: else its 400."""
    if len(messages) < 2:
        return
    role, blocks = messages[-1]
    if role != "user" or not any(b.get("type") == "tool_result" for b in blocks):
        return
    index = len(messages) - 2
    before, content = messages[index]
    first = content[0].get("type") if content else None
    if before == "assistant" and first not in ("thinking", "redacted_thinking"):
        raise _bad(
            f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
            "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
            "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
            "thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
        )


# -- the same request in the chat format (for the policy, responders and the counter) ------------------------


def as_chat(parsed: Parsed) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The request's messages and tools in OpenAI's chat format, as the policy and responders read them."""
    chat: list[dict[str, Any]] = []
    if parsed.system:
        chat.append({"role": "system", "content": "\n\n".join(b["text"] for b in parsed.system)})
    for role, blocks in parsed.messages:
        if role == "user":
            texts: list[str] = []
            for block in blocks:
                if block.get("type") == "tool_result":
                    chat.append(
                        {"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result_text(block)}
                    )
                elif block.get("type") == "text":
                    texts.append(block["text"])
            if texts:
                chat.append({"role": "user", "content": "\n".join(texts)})
            continue
        message: dict[str, Any] = {"role": "assistant", "content": None}
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        if text:
            message["content"] = text
        thinking = [b for b in blocks if b.get("type") == "thinking"]
        if thinking:
            message["reasoning_content"] = "".join(b["thinking"] for b in thinking)
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        if calls:
            message["tool_calls"] = calls
        chat.append(message)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {},
            },
        }
        for t in parsed.tools
    ]
    return chat, tools or None


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


# -- the prompt as blocks: tokens and the cache ---------------------------------------------------------------


def prompt_blocks(parsed: Parsed, counter: TokenCounter) -> list[Block]:
    """The prompt as the cache sees it: tools, system blocks, then each message's blocks, with their tokens
    (a message's framing counted on its first block)."""
    blocks: list[Block] = []
    for tool in parsed.tools:
        bare = _bare(tool)
        blocks.append(Block(b"T" + _canonical(bare), counter.text(_canonical(bare).decode()), _mark(tool)))
    for block in parsed.system:
        blocks.append(Block(b"S" + _canonical(_bare(block)), counter.text(block["text"]), _mark(block)))
    for role, content in parsed.messages:
        for i, block in enumerate(content):
            overhead = MESSAGE_OVERHEAD + counter.text(role) if i == 0 else 0
            key = (b"U" if role == "user" else b"A") + (b"0" if i == 0 else b"+") + _canonical(_bare(block))
            blocks.append(Block(key, overhead + _block_tokens(block, counter), _mark(block)))
    return blocks


def _bare(block: dict[str, Any]) -> dict[str, Any]:
    """A block as the cache sees it: without its ``cache_control`` markers (a breakpoint that moves changes no
    prefix), and a ``tool_result``'s text as a list of text blocks, however it was sent (the same prompt)."""
    bare = {k: v for k, v in block.items() if k != "cache_control"} if "cache_control" in block else block
    if bare.get("type") == "tool_result":
        content = bare.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        elif isinstance(content, list):
            content = [_bare(b) if isinstance(b, dict) else b for b in content]
        bare = {**bare, "content": content}
    return bare


def _mark(block: dict[str, Any]) -> str | None:
    control = block.get("cache_control")
    if control is None and block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        inner = [b.get("cache_control") for b in block["content"] if isinstance(b, dict)]
        control = next((c for c in reversed(inner) if c is not None), None)
    if not isinstance(control, dict):
        return None
    ttl = control.get("ttl", "5m")
    return ttl if isinstance(ttl, str) else "5m"


def _block_tokens(block: dict[str, Any], counter: TokenCounter) -> int:
    kind = block.get("type")
    if kind == "text":
        return counter.text(block.get("text") or "")
    if kind == "tool_use":
        return counter.text(str(block.get("name") or "")) + counter.text(json.dumps(block.get("input") or {}))
    if kind == "tool_result":
        return counter.text(_result_text(block)) + sum(
            IMAGE_TOKENS
            for b in block.get("content") or ()
            if isinstance(b, dict) and b.get("type") == "image"
        )
    if kind == "thinking":
        return counter.text(block.get("thinking") or "")
    if kind in ("image", "document"):
        return IMAGE_TOKENS
    return counter.text(_canonical(block).decode())
