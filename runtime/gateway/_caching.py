"""Prompt-cache hints (design §4.7): which providers take which, the hints of a request, and their
rendering in the OpenAI chat format (``cache_control`` where litellm's Anthropic, Bedrock and Vertex
converters and OpenRouter read it; ``prompt_cache_key``).

Where the breakpoints go is decided in :mod:`runtime.context.caching`; this module only says whether and
how a provider is told.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from runtime.context.caching import min_cacheable_tokens, place_breakpoints
from runtime.gateway._models import CacheHints, CacheTTL, CompletionRequest

if TYPE_CHECKING:
    from runtime.messages import Message
    from runtime.tokens import TokenCounter


def cache_hints(
    model: str,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    counter: TokenCounter,
    *,
    key: str | None,
    ttl: CacheTTL = "5m",
) -> CacheHints:
    """The hints of a request of ``messages`` (system prompt first) and ``tools`` to ``model``: its
    breakpoints (:func:`runtime.context.caching.place_breakpoints`, counted with ``counter``) and ``key``."""
    marks = place_breakpoints(
        messages,
        count=counter.count_message,
        tools_tokens=counter.count_tools(tools),
        minimum=min_cacheable_tokens(model),
    )
    return CacheHints(breakpoints=marks.positions, tools=marks.tools, key=key, ttl=ttl)


CacheStyle = Literal["breakpoints", "key"]
"""How a provider is told what to cache: ``cache_control`` breakpoints (Anthropic's models, directly, on
Bedrock, on Vertex and through OpenRouter), or a ``prompt_cache_key`` (OpenAI's automatic caching)."""

_BREAKPOINT_PREFIXES: Final = ("anthropic/", "claude-", "openrouter/anthropic/")
_BREAKPOINT_HOSTS: Final = ("bedrock/", "bedrock_converse/", "vertex_ai/", "vertex_ai_beta/")


def cache_style(model: str, api_base: str | None = None) -> CacheStyle | None:
    """How ``model``'s provider takes cache hints (design §4.7), or None: it caches on its own (DeepSeek,
    Gemini) or not at all, and is sent none."""
    name = model.lower()
    if name.startswith(_BREAKPOINT_PREFIXES) or (name.startswith(_BREAKPOINT_HOSTS) and "claude" in name):
        return "breakpoints"
    if name.startswith("openai/") or (
        "/" not in name and name.startswith(("gpt-", "o1", "o3", "o4", "chatgpt-", "codex-"))
    ):
        return "key"
    return None


def cache_key(request: CompletionRequest) -> str | None:
    """The ``prompt_cache_key`` to send with ``request``, if its provider takes one."""
    hints = request.cache
    if hints is None or hints.key is None or cache_style(request.model, request.api_base) != "key":
        return None
    return hints.key


def cache_control(hints: CacheHints) -> dict[str, str]:
    """The ``cache_control`` of a breakpoint with the hints' time to live."""
    return {"type": "ephemeral"} if hints.ttl == "5m" else {"type": "ephemeral", "ttl": hints.ttl}


def marked(message: dict[str, Any], control: dict[str, str]) -> dict[str, Any]:
    """``message`` (OpenAI format) with a ``cache_control`` breakpoint on its last block, where litellm's
    Anthropic, Bedrock and Vertex converters read it: on its last tool call; on a tool result, the message's
    own (it becomes the ``tool_result`` block's); else on its last content part (a string content becomes
    one text part)."""
    out = dict(message)
    calls = out.get("tool_calls")
    if out.get("role") == "assistant" and calls:
        out["tool_calls"] = [*calls[:-1], {**calls[-1], "cache_control": control}]
        return out
    content = out.get("content")
    if out.get("role") == "tool" or not content:
        out["cache_control"] = control
    elif isinstance(content, str):
        out["content"] = [{"type": "text", "text": content, "cache_control": control}]
    elif isinstance(content, list):
        out["content"] = [*content[:-1], {**content[-1], "cache_control": control}]
    return out


def in_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each message-level ``cache_control`` moved onto the message's last content part,
    as litellm sends them to OpenRouter (which reads breakpoints only inside content)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        control = message.get("cache_control")
        if control is None:
            out.append(message)
            continue
        moved = {k: v for k, v in message.items() if k != "cache_control"}
        content = moved.get("content")
        if isinstance(content, str):
            moved["content"] = [{"type": "text", "text": content, "cache_control": control}]
        elif isinstance(content, list) and content:
            moved["content"] = [*content[:-1], {**content[-1], "cache_control": control}]
        out.append(moved)
    return out


def tools_with_cache(request: CompletionRequest) -> list[dict[str, Any]]:
    """The request's tools, the last one marked when the hints ask for it and the provider takes it."""
    tools = list(request.tools)
    hints = request.cache
    if (
        tools
        and hints is not None
        and hints.tools
        and cache_style(request.model, request.api_base) == "breakpoints"
    ):
        tools[-1] = {**tools[-1], "cache_control": cache_control(hints)}
    return tools
