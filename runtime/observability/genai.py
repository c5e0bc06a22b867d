"""The GenAI semantic conventions as the spans use them (design §7.5): attribute names (the conventions' own,
then agentcell's for what they do not name), litellm's provider names in the conventions' spelling, and
the JSON form of messages and the usage attributes. Pure: no OpenTelemetry, no I/O."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runtime.messages import Message, ReasoningPart, TextPart, ToolCallPart, Usage

__all__ = ["INSTRUMENTATION", "PROVIDER_NAMES", "messages_json", "provider_name", "usage_attributes"]

INSTRUMENTATION = "agentcell"

# litellm's provider names -> the gen_ai.provider.name values of the conventions (others pass unchanged).
PROVIDER_NAMES = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai",
    "mistral": "mistral_ai",
    "xai": "x_ai",
    "watsonx": "ibm.watsonx.ai",
}

# Attribute names: the GenAI conventions' own, then agentcell's for what they do not name.
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
CONVERSATION = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
SESSION_ID = "agentcell.session.id"
TURN_ID = "agentcell.turn.id"


def provider_name(provider: str | None, model: str) -> str:
    """``gen_ai.provider.name``: litellm's provider for the call (else the model's prefix; none: openai), in
    the conventions' spelling where they have one."""
    if not provider:
        prefix, slash, _ = model.partition("/")
        provider = prefix if slash else "openai"
    return PROVIDER_NAMES.get(provider, provider)


def usage_attributes(usage: Usage) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        INPUT_TOKENS: usage.input_tokens,
        OUTPUT_TOKENS: usage.output_tokens,
        CACHE_READ_TOKENS: usage.cache_read_tokens,
    }
    if usage.cache_write_tokens:
        attributes[CACHE_WRITE_TOKENS] = usage.cache_write_tokens
    if usage.reasoning_tokens:
        attributes[REASONING_TOKENS] = usage.reasoning_tokens
    if usage.cost is not None:
        attributes["agentcell.usage.cost"] = usage.cost
    if usage.costs is not None:
        attributes["agentcell.usage.cost.input"] = usage.costs.input
        attributes["agentcell.usage.cost.cache_read"] = usage.costs.cache_read
        attributes["agentcell.usage.cost.cache_write"] = usage.costs.cache_write
        attributes["agentcell.usage.cost.output"] = usage.costs.output
        attributes["agentcell.usage.cost.saved"] = usage.costs.saved
    return attributes


def messages_json(messages: Sequence[Message], finish_reason: str | None = None) -> str:
    """Messages in the conventions' input/output messages JSON form (role, parts[, finish_reason])."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        if message.role == "tool":
            parts.append({"type": "tool_call_response", "id": message.tool_call_id, "result": message.text})
        else:
            for part in message.parts:
                if isinstance(part, TextPart):
                    parts.append({"type": "text", "content": part.text})
                elif isinstance(part, ReasoningPart):
                    parts.append({"type": "reasoning", "content": part.text})
                elif isinstance(part, ToolCallPart):
                    parts.append(
                        {"type": "tool_call", "id": part.id, "name": part.name, "arguments": part.arguments}
                    )
                else:
                    parts.append({"type": "uri", "modality": "image", "uri": getattr(part, "url", "")})
        entry: dict[str, Any] = {"role": message.role, "parts": parts}
        if finish_reason is not None:
            entry["finish_reason"] = finish_reason
        out.append(entry)
    return json.dumps(out, ensure_ascii=False)
