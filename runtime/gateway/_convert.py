"""Our messages in the OpenAI chat format every transport sends (design §3.3 for reasoning, §4.7 for the
cache hints rendered in it)."""

from __future__ import annotations

from typing import Any, Final

from runtime.gateway._caching import cache_control, cache_style, marked
from runtime.gateway._models import CompletionRequest
from runtime.messages import Message, message_to_openai

_NO_REASONING_PREFIXES: Final = ("deepseek/",)


def accepts_reasoning(model: str, api_base: str | None) -> bool:
    """Whether reasoning may be sent back to this provider (reference 004, design §3.3).

    litellm carries it as ``reasoning_content`` / ``thinking_blocks`` and translates it for providers that
    take it back (Anthropic's signed thinking, Gemini's thought signatures, Bedrock). OpenAI's own API
    rejects unknown message fields and DeepSeek rejects ``reasoning_content`` in input, so neither gets
    it; an OpenAI-compatible server at a custom ``api_base`` (vLLM, llama.cpp, the local provider) does.
    """
    if model.startswith(_NO_REASONING_PREFIXES):
        return False
    if "/" not in model or model.startswith(("openai/", "text-completion-openai/")):
        return api_base is not None
    return True


def to_provider_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    """The request's messages in the OpenAI chat format; hidden messages are left out. Where the provider
    takes ``cache_control`` breakpoints, the request's cache hints are rendered on their messages."""
    include = request.include_reasoning and accepts_reasoning(request.model, request.api_base)
    hints = request.cache
    marks: frozenset[int] = frozenset()
    if (
        hints is not None
        and hints.breakpoints
        and cache_style(request.model, request.api_base) == "breakpoints"
    ):
        marks = frozenset(hints.breakpoints)
    out: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        if isinstance(message, Message):
            if not message.agent_visible:
                continue
            converted = message_to_openai(message, include_reasoning=include)
        else:
            converted = message
        if i in marks:
            assert hints is not None
            converted = marked(converted, cache_control(hints))
        out.append(converted)
    return out
