"""Error responses of the local provider, in the wording and shape real vendors send.

Context overflow comes in many dialects: each function of :data:`OVERFLOW_FORMATS` imitates one vendor's
HTTP status, JSON body shape and message wording (as observed from their APIs), so that the runtime's
overflow classifier is tested against what it will meet in production. Faults (rate limit, server error,
overload, bad key) have their own builders below.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple


class ErrorResponse(NamedTuple):
    """An HTTP error to send: status, JSON body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = {}  # noqa: RUF012 - NamedTuple defaults are shared and never mutated


def _openai_error(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _request_id(prefix: str = "req_") -> str:
    return prefix + os.urandom(12).hex()


# ---------------------------------------------------------------------------------------------------
# Context overflow, one function per vendor. Arguments: tokens in the prompt, the context window, and the
# completion tokens requested (``max_tokens``, 0 when absent).

OverflowFormat = Callable[[int, int, int], ErrorResponse]


def openai_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """OpenAI Chat Completions (and Azure OpenAI, which relays the same body)."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{prompt} tokens. Please reduce the length of the messages."
    )
    return ErrorResponse(
        400, _openai_error(message, "invalid_request_error", "context_length_exceeded", "messages")
    )


def openai_new_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """OpenAI's newer wording (Responses API and recent models): no numbers at all."""
    message = "Your input exceeds the context window of this model. Please adjust your input and try again."
    return ErrorResponse(
        400, _openai_error(message, "invalid_request_error", "context_length_exceeded", "input")
    )


def anthropic_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Anthropic Messages API."""
    body: dict[str, Any] = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {prompt} tokens > {window} maximum",
        },
        "request_id": _request_id(),
    }
    return ErrorResponse(400, body, {"request-id": body["request_id"]})


def gemini_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Google Gemini API (and Vertex AI for some models)."""
    message = f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({window})."
    return ErrorResponse(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})


def vertex_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Vertex AI (Gemini through Google Cloud): its own wording, in Google's error shape."""
    message = (
        f"Unable to submit request because the input token count is {prompt} but model only supports up to "
        f"{window}. Reduce the input token count and try again. You can also use the CountTokens API to "
        "calculate prompt token count and billable characters. Learn more: "
        "https://cloud.google.com/vertex-ai/generative-ai/docs/learn/models"
    )
    return ErrorResponse(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})


def llamacpp_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """llama.cpp ``llama-server`` (its wording since 2025; ``n_ctx`` is the slot's context)."""
    body = {
        "error": {
            "code": 400,
            "message": f"request ({prompt} tokens) exceeds the available context size ({window} tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": window,
        }
    }
    return ErrorResponse(400, body)


def vllm_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """vLLM's OpenAI-compatible server up to 0.9 (counts the requested completion tokens too)."""
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return ErrorResponse(400, body)


def vllm_new_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """vLLM from 0.10: the prompt alone, counted as "input tokens", in an ``error`` object."""
    message = (
        f"This model's maximum context length is {window} tokens. However, your request has {prompt} input "
        "tokens. Please reduce the length of the input messages."
    )
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return ErrorResponse(400, body)


def sglang_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """SGLang's OpenAI-compatible server."""
    message = f"The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return ErrorResponse(400, body)


def tgi_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Hugging Face Text Generation Inference: a 422 from the router's input validation."""
    message = f"Input validation error: `inputs` must have less than {window} tokens. Given: {prompt}"
    return ErrorResponse(422, {"error": message, "error_type": "validation"})


def ollama_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Ollama's OpenAI-compatible endpoint when truncation is off: the runner's error relayed as a 500."""
    message = "the input length exceeds the context length"
    return ErrorResponse(500, _openai_error(message, "api_error", None))


def ollama_new_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Ollama since mid-2026 when the prompt does not fit and context shift is off: a 400."""
    message = (
        "the prompt is longer than the context length currently available to the model; shorten the prompt, "
        "adjust the context length in settings, or use a model with a longer context length"
    )
    return ErrorResponse(400, _openai_error(message, "invalid_request_error", None))


def bedrock_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """AWS Bedrock runtime (Converse / InvokeModel): a ``ValidationException``."""
    return ErrorResponse(
        400,
        {"message": "Input is too long for requested model."},
        {"x-amzn-errortype": "ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
    )


def mistral_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Mistral La Plateforme."""
    message = f"Prompt contains {prompt} tokens and {completion} draft tokens, too large for model with {window} maximum context length"
    body = {
        "object": "error",
        "message": message,
        "type": "invalid_request_message_error",
        "param": None,
        "code": "3051",
    }
    return ErrorResponse(400, body)


def groq_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Groq."""
    message = "Please reduce the length of the messages or completion."
    return ErrorResponse(
        400, _openai_error(message, "invalid_request_error", "context_length_exceeded", "messages")
    )


def deepseek_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """DeepSeek."""
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion."
    )
    return ErrorResponse(400, _openai_error(message, "invalid_request_error", "invalid_request_error"))


def xai_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """xAI (Grok): a plain-text ``error`` with its own code field."""
    message = f"This model's maximum prompt length is {window} but the request contains {prompt} tokens."
    return ErrorResponse(400, {"code": "Client specified an invalid argument", "error": message})


def openrouter_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """OpenRouter."""
    message = (
        f"This endpoint's maximum context length is {window} tokens. However, you requested about "
        f"{prompt + completion} tokens ({prompt} of text input, {completion} in the output). Please reduce "
        'the length of either one, or use the "middle-out" transform to compress your prompt automatically.'
    )
    return ErrorResponse(
        400, {"error": {"message": message, "code": 400, "metadata": {"provider_name": None}}}
    )


def cohere_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """Cohere."""
    message = (
        f"too many tokens: total number of tokens in the prompt cannot exceed {window} - received {prompt}. "
        "Try using a shorter prompt, or enabling prompt truncating. See "
        "https://docs.cohere.com/reference/chat for more details."
    )
    return ErrorResponse(400, {"id": _request_id(""), "message": message})


def lmstudio_overflow(prompt: int, window: int, completion: int) -> ErrorResponse:
    """LM Studio's local server."""
    message = (
        f"Trying to keep the first {prompt} tokens when context the overflows. However, the model is loaded "
        f"with context length of only {window} tokens, which is not enough. Try to load the model with a "
        "larger context length, or provide a shorter input"
    )
    return ErrorResponse(400, {"error": message})


def request_too_large(prompt: int, window: int, completion: int) -> ErrorResponse:
    """HTTP 413, as Anthropic sends it when the request body itself is over the size limit."""
    body = {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "Request exceeds the maximum allowed number of bytes.",
        },
    }
    return ErrorResponse(413, body)


OVERFLOW_FORMATS: dict[str, OverflowFormat] = {
    "openai": openai_overflow,
    "azure": openai_overflow,
    "openai_new": openai_new_overflow,
    "anthropic": anthropic_overflow,
    "gemini": gemini_overflow,
    "vertex": vertex_overflow,
    "llamacpp": llamacpp_overflow,
    "vllm": vllm_overflow,
    "vllm_new": vllm_new_overflow,
    "sglang": sglang_overflow,
    "tgi": tgi_overflow,
    "ollama": ollama_overflow,
    "ollama_new": ollama_new_overflow,
    "bedrock": bedrock_overflow,
    "mistral": mistral_overflow,
    "groq": groq_overflow,
    "deepseek": deepseek_overflow,
    "xai": xai_overflow,
    "openrouter": openrouter_overflow,
    "cohere": cohere_overflow,
    "lmstudio": lmstudio_overflow,
    "request_too_large": request_too_large,
}
"""Overflow dialects by name (``LocalProvider(overflow_format=...)``, ``--overflow-format``)."""


def overflow_error(fmt: str, prompt: int, window: int, completion: int = 0) -> ErrorResponse:
    """The overflow error of vendor ``fmt``; raises ``ValueError`` listing the known formats."""
    try:
        build = OVERFLOW_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown overflow format {fmt!r}; known: {', '.join(OVERFLOW_FORMATS)}") from None
    return build(prompt, window, completion)


# ---------------------------------------------------------------------------------------------------
# Faults


def rate_limit_error(
    model: str,
    retry_after: float | None,
    *,
    limit: str = "requests",
    limit_value: int = 60,
    headers: dict[str, str] | None = None,
) -> ErrorResponse:
    """OpenAI's 429 for a per-minute limit (``limit``: ``requests``, ``tokens`` or ``concurrent``), with
    ``retry-after`` (and ``retry-after-ms``); ``headers``: the rate-limit headers to send (default: OpenAI's
    for an exhausted request limit)."""
    wait = f"{retry_after:g}s" if retry_after is not None else "a moment"
    what = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}.get(
        limit, "concurrent requests"
    )
    message = (
        f"Rate limit reached for {model} in organization org-agentcell-local on {what}: "
        f"Limit {limit_value}, Used {limit_value}, Requested 1. Please try again in {wait}. Visit "
        "https://platform.openai.com/account/rate-limits to learn more."
    )
    sent: dict[str, str] = (
        {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0"}
        if headers is None
        else dict(headers)
    )
    if retry_after is not None:
        sent["retry-after"] = f"{retry_after:.3f}".rstrip("0").rstrip(".")
        sent["retry-after-ms"] = str(math.ceil(retry_after * 1000))
    type_ = "requests" if limit != "tokens" else "tokens"
    return ErrorResponse(429, _openai_error(message, type_, "rate_limit_exceeded"), sent)


def server_error(status: int | None = None) -> ErrorResponse:
    """OpenAI's 500."""
    message = (
        "The server had an error while processing your request. Sorry about that! You can retry your "
        "request, or contact us through our help center if the error persists."
    )
    return ErrorResponse(status or 500, _openai_error(message, "server_error", None))


def overloaded_error(status: int | None = None) -> ErrorResponse:
    """Anthropic's ``overloaded_error`` (sent with 529 by Anthropic; 503 by default here)."""
    body = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": _request_id(),
    }
    return ErrorResponse(status or 503, body)


def auth_error() -> ErrorResponse:
    """OpenAI's 401 for a wrong key. No part of the key is echoed (keys never reach logs or events)."""
    message = "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
    return ErrorResponse(401, _openai_error(message, "invalid_request_error", "invalid_api_key"))


def bad_request(message: str, code: str | None = None, param: str | None = None) -> ErrorResponse:
    """A 400 in OpenAI's shape (malformed request, unknown script turn, ...)."""
    return ErrorResponse(400, _openai_error(message, "invalid_request_error", code, param))
