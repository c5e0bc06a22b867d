"""The context-overflow classifier (design §6.1, 6.2): real provider wording, negatives, odd inputs."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.context.overflow import (
    OPAL_PATTERNS,
    OVERFLOW_PATTERNS,
    is_context_overflow,
    is_usage_overflow,
    overflow_reason,
)
from runtime.provider.errors import OVERFLOW_FORMATS, overflow_error


def _openai_body(
    message: str, code: str | None, type_: str = "invalid_request_error", param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# (provider, facts) — the facts a gateway has: message, status_code, code, body. Wording as providers send it.
OVERFLOWS: list[tuple[str, dict[str, Any]]] = [
    (
        "openai (old wording)",
        {
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
            "130542 tokens. Please reduce the length of the messages.",
            "status_code": 400,
            "code": "context_length_exceeded",
        },
    ),
    (
        "openai (old wording, message only)",
        {
            "message": "This model's maximum context length is 8192 tokens. However, you requested 8501 tokens "
            "(7501 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
        },
    ),
    (
        "openai (new wording)",
        {
            "message": "Your input exceeds the context window of this model. Please adjust your input and try again."
        },
    ),
    (
        "openai (new wording, body only)",
        {
            "status_code": 400,
            "body": _openai_body(
                "Your input exceeds the context window of this model. Please adjust your input and try again.",
                "context_length_exceeded",
                param="input",
            ),
        },
    ),
    (
        "openai (message content over 10 MiB)",
        {
            "message": "Invalid 'messages[1].content': string too long. Expected a string with maximum length "
            "10485760, but got a string with length 12582912 instead.",
            "code": "string_above_max_length",
        },
    ),
    (
        "azure openai",
        {
            "message": "litellm.ContextWindowExceededError: AzureException ContextWindowExceededError - This "
            "model's maximum context length is 128000 tokens. However, your messages resulted in 140212 tokens "
            "(139870 in the messages, 342 in the functions). Please reduce the length of the messages or functions."
        },
    ),
    (
        "azure ai foundry",
        {
            "message": "Request body too large for gpt-4o model. Max size: 128000 tokens.",
            "code": "tokens_limit_reached",
        },
    ),
    (
        "anthropic",
        {
            "status_code": 400,
            "body": {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                },
            },
        },
    ),
    (
        "anthropic (input + max_tokens)",
        {
            "message": "input length and `max_tokens` exceed context limit: 197202 + 21333 > 200000, decrease "
            "input length or `max_tokens` and try again"
        },
    ),
    (
        "anthropic 413",
        {
            "status_code": 413,
            "body": {
                "type": "error",
                "error": {
                    "type": "request_too_large",
                    "message": "Request exceeds the maximum allowed number of bytes.",
                },
            },
        },
    ),
    (
        "gemini",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "code": 400,
                    "message": "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).",
                    "status": "INVALID_ARGUMENT",
                }
            },
        },
    ),
    (
        "vertex ai (gemini)",
        {
            "message": "Unable to submit request because the input token count is 1052710 but model only supports "
            "up to 1048576. Reduce the input token count and try again. You can also use the CountTokens API to "
            "calculate prompt token count and billable characters."
        },
    ),
    ("vertex ai (payload)", {"message": "400 Request payload size exceeds the limit: 20971520 bytes."}),
    ("vertex ai (anthropic)", {"message": "prompt is too long: 201234 tokens > 199999 maximum"}),
    ("bedrock", {"status_code": 400, "body": {"message": "Input is too long for requested model."}}),
    (
        "bedrock (converse)",
        {
            "message": "An error occurred (ValidationException) when calling the Converse operation: The model "
            "returned the following errors: prompt is too long: 205000 tokens > 200000 maximum"
        },
    ),
    (
        "bedrock (mantle)",
        {"message": "ValidationException: prompt tokens (210000) exceed model maximum (200000)"},
    ),
    (
        "bedrock (titan)",
        {
            "message": "Malformed input request: expected maxLength: 50000, actual: 60012, please reformat your input and try again."
        },
    ),
    (
        "mistral",
        {
            "status_code": 400,
            "body": {
                "object": "error",
                "message": "Prompt contains 40123 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
                "type": "invalid_request_message_error",
                "param": None,
                "code": "3051",
            },
        },
    ),
    (
        "groq",
        {
            "status_code": 400,
            "body": _openai_body(
                "Please reduce the length of the messages or completion.",
                "context_length_exceeded",
                param="messages",
            ),
        },
    ),
    (
        "cohere",
        {
            "message": "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 5000. "
            "Try using a shorter prompt, or enabling prompt truncating. See https://docs.cohere.com/reference/chat "
            "for more details."
        },
    ),
    (
        "cohere (v2)",
        {
            "message": "too many tokens: size limit exceeded by 1234 tokens. Try using shorter or fewer inputs, or setting prompt_truncation='AUTO'."
        },
    ),
    (
        "deepseek",
        {
            "status_code": 400,
            "body": _openai_body(
                "This model's maximum context length is 65536 tokens. However, you requested 70314 tokens (69314 in "
                "the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
                "invalid_request_error",
            ),
        },
    ),
    (
        "xai",
        {
            "status_code": 400,
            "body": {
                "code": "Client specified an invalid argument",
                "error": "This model's maximum prompt length is 131072 but the request contains 150210 tokens.",
            },
        },
    ),
    (
        "openrouter",
        {
            "message": "This endpoint's maximum context length is 200000 tokens. However, you requested about "
            "250612 tokens (240612 of text input, 10000 in the output). Please reduce the length of either one, "
            'or use the "middle-out" transform to compress your prompt automatically.'
        },
    ),
    (
        "openrouter (relayed upstream error, nested JSON string)",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "message": "Provider returned error",
                    "code": 400,
                    "metadata": {
                        "raw": json.dumps(
                            {
                                "type": "error",
                                "error": {
                                    "type": "invalid_request_error",
                                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                                },
                            }
                        ),
                        "provider_name": "Anthropic",
                    },
                }
            },
        },
    ),
    (
        "ollama",
        {
            "status_code": 500,
            "body": _openai_body("the input length exceeds the context length", None, "api_error"),
        },
    ),
    ("ollama (runner)", {"message": "prompt too long; exceeded max context length by 1544 tokens"}),
    (
        "llama.cpp",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 5012,
                    "n_ctx": 4096,
                }
            },
        },
    ),
    (
        "vllm",
        {
            "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
            "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
        },
    ),
    (
        "vllm (newer)",
        {
            "message": "This model's maximum context length is 32768 tokens. However, your request has 40000 input "
            "tokens. Please reduce the length of the input messages."
        },
    ),
    (
        "vllm (V1 engine's processor)",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "message": "The prompt (total length 5000) is too long to fit into the model (context length "
                    "4096). Make sure that `max_model_len` is no smaller than the number of text tokens plus "
                    "multimodal tokens. For image inputs, the number of image tokens depends on the number of "
                    "images, and possibly their aspect ratios as well.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
        },
    ),
    (
        "lm studio",
        {
            "status_code": 400,
            "body": {
                "error": "Trying to keep the first 5012 tokens when context the overflows. However, the model is "
                "loaded with context length of only 4096 tokens, which is not enough. Try to load the model with a "
                "larger context length, or provide a shorter input"
            },
        },
    ),
    (
        "hugging face tgi / together",
        {
            "message": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 "
            "`inputs` tokens and 500 `max_new_tokens`"
        },
    ),
    (
        "cerebras",
        {
            "message": "Please reduce the length of the messages or completion. Current length is 9012 while limit is 8192"
        },
    ),
    (
        "github copilot",
        {
            "message": "prompt token count of 140213 exceeds the limit of 128000",
            "code": "model_max_prompt_tokens_exceeded",
        },
    ),
    ("moonshot", {"message": "Invalid request: Your request exceeded model token limit: 131072"}),
    ("minimax", {"message": "invalid params, context window exceeds limit (2013)"}),
    ("fireworks", {"message": "The prompt is too long: 140213, model maximum context length: 131072"}),
    (
        "proxy 413",
        {
            "status_code": 413,
            "message": "<html><head><title>413 Request Entity Too Large</title></head></html>",
        },
    ),
    ("code only", {"code": "context_length_exceeded"}),
    # Checked against each server's source (2026): the wordings that changed across releases.
    (
        "vllm (>= 0.10, prompt + max_tokens)",  # the prompt leaves no room for the output asked for
        {
            "status_code": 400,
            "body": {
                "error": {
                    "message": "'max_tokens' or 'max_completion_tokens' is too large: 16384. This model's maximum "
                    "context length is 65536 tokens and your request has 52189 input tokens (16384 > 65536 - "
                    "52189). (parameter=max_tokens, value=16384)",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
        },
    ),
    (
        "vllm (newest, prompt + max_tokens)",
        {
            "message": "This model's maximum context length is 131072 tokens. However, you requested 64000 output "
            "tokens and your prompt contains at least 67073 input tokens, for a total of at least 131073 tokens."
        },
    ),
    (
        "vllm (engine input check)",
        {
            "message": "The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make "
            "sure that `max_model_len` is no smaller than the number of text tokens."
        },
    ),
    (
        "sglang",
        {
            "status_code": 400,
            "body": {
                "object": "error",
                "message": "The input (291793 tokens) is longer than the model's context length (262144 tokens).",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
        },
    ),
    (
        "sglang (prompt + max_new_tokens)",
        {
            "message": "Requested token count exceeds the model's maximum context length of 32768 tokens. You "
            "requested a total of 34000 tokens: 30000 tokens from the input messages and 4000 tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
            "the limit."
        },
    ),
    (
        "tgi (input length)",
        {
            "status_code": 422,
            "body": {
                "error": "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000",
                "error_type": "validation",
            },
        },
    ),
    ("llama.cpp (2024)", {"message": "input is larger than the max context size. skipping"}),
    (
        "llama.cpp (no context shift)",
        {"message": "input (70000 tokens) is larger than the max context size (65536 tokens). skipping"},
    ),
    (
        "llama.cpp (late 2025)",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "code": 400,
                    "message": "request (66000 tokens) exceeds the available context size (65536 tokens), try "
                    "increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 66000,
                    "n_ctx": 65536,
                }
            },
        },
    ),
    (
        "ollama (2026, no context shift)",
        {
            "status_code": 400,
            "message": "the prompt is longer than the context length currently available to the model; shorten the "
            "prompt, adjust the context length in settings, or use a model with a longer context length",
        },
    ),
    (
        "ollama (mlx runner)",
        {"message": "input length (9000 tokens) exceeds the model's maximum context length (8192 tokens)"},
    ),
    (
        "vertex ai (gemini)",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "code": 400,
                    "message": "Unable to submit request because the input token count is 1052710 but model only "
                    "supports up to 1048576. Reduce the input token count and try again.",
                    "status": "INVALID_ARGUMENT",
                }
            },
        },
    ),
    (
        "lm studio (newer)",
        {
            "message": "The number of tokens to keep from the initial prompt is greater than the context length"
        },
    ),
    (
        "poolside via openrouter",
        {"message": "Input length 131393 exceeds the maximum allowed input length of 131040 tokens."},
    ),
    ("z.ai", {"message": "tokens in request more than max tokens allowed"}),
    ("kimi", {"message": "Input token length too long"}),
    ("litellm (maximum input length)", {"message": "The maximum input length is 8192 tokens."}),
]

NOT_OVERFLOWS: list[tuple[str, dict[str, Any]]] = [
    (
        "openai rate limit (tokens per min)",
        {
            "status_code": 429,
            "code": "rate_limit_exceeded",
            "message": "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, "
            "Used 25000, Requested 8000. Please try again in 6s. Visit https://platform.openai.com/account/rate-limits "
            "to learn more.",
        },
    ),
    (
        "openai request too large for TPM (message only)",
        {
            "message": "Request too large for gpt-4 in organization org-abc on tokens per min (TPM): Limit 10000, "
            "Requested 12000. The input or output tokens must be reduced in order to run successfully. Visit "
            "https://platform.openai.com/account/rate-limits to learn more."
        },
    ),
    (
        "groq 413 for tokens per minute",
        {
            "status_code": 413,
            "body": _openai_body(
                "Request too large for model `llama-3.3-70b-versatile` in organization `org_01abc` service tier "
                "`on_demand` on tokens per minute (TPM): Limit 12000, Requested 19340, please reduce your message "
                "size and try again.",
                "rate_limit_exceeded",
                "tokens",
            ),
        },
    ),
    (
        "anthropic rate limit",
        {
            "status_code": 429,
            "body": {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "This request would exceed the rate limit for your organization of 40,000 input tokens "
                    "per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits.",
                },
            },
        },
    ),
    (
        "openai max_tokens too large",
        {
            "status_code": 400,
            "body": _openai_body(
                "max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you "
                "provided 100000.",
                None,
                param="max_tokens",
            ),
        },
    ),
    (
        "anthropic max_tokens over the model's output limit",
        {
            "message": "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-20250514"
        },
    ),
    (
        "groq max_tokens bound",
        {
            "message": "`max_tokens` must be less than or equal to `32768`, the maximum value for `max_tokens` is "
            "less than the `context_window` for this model"
        },
    ),
    (
        "deepseek max_tokens range",
        {"message": "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]"},
    ),
    (
        "openai unsupported max_tokens",
        {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            "code": "unsupported_parameter",
        },
    ),
    (
        "vllm max_tokens too large",
        {
            "message": "'max_tokens' or 'max_completion_tokens' is too large: 5000. This model's maximum context "
            "length is 4096 tokens and your request has 100 input tokens (5000 > 4096 - 100)."
        },
    ),
    (
        "openai user param too long",
        {
            "message": "Invalid 'user': string too long. Expected a string with maximum length 64, but got a "
            "string with length 100 instead.",
            "code": "string_above_max_length",
        },
    ),
    (
        "openai bad key",
        {
            "status_code": 401,
            "code": "invalid_api_key",
            "message": "Incorrect API key provided: sk-abc*****xy. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
        },
    ),
    (
        "anthropic bad key",
        {
            "status_code": 401,
            "body": {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            },
        },
    ),
    (
        "openai content policy",
        {
            "status_code": 400,
            "code": "content_policy_violation",
            "message": "Your request was rejected as a result of our safety system. Your prompt may contain text "
            "that is not allowed by our safety system.",
        },
    ),
    (
        "azure content filter",
        {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management "
            "policy. Please modify your prompt and retry.",
            "code": "content_filter",
        },
    ),
    (
        "gemini quota",
        {
            "status_code": 429,
            "body": {
                "error": {
                    "code": 429,
                    "message": "Resource has been exhausted (e.g. check quota).",
                    "status": "RESOURCE_EXHAUSTED",
                }
            },
        },
    ),
    (
        "openai insufficient quota",
        {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "code": "insufficient_quota",
        },
    ),
    (
        "bedrock throttling",
        {"message": "ThrottlingException: Too many tokens, please wait before trying again."},
    ),
    (
        "anthropic overloaded",
        {
            "status_code": 529,
            "body": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        },
    ),
    (
        "openai server error",
        {
            "status_code": 500,
            "message": "The server had an error while processing your request. Sorry about that!",
        },
    ),
    (
        "model not found",
        {"status_code": 404, "message": "The model `gpt-9` does not exist or you do not have access to it."},
    ),
    (
        "dashscope max_tokens range",
        {"message": "<400> InternalError.Algo.InvalidParameter: Range of max_tokens should be [1, 8192]"},
    ),
    (
        "vllm output alone over the window (newest)",
        {
            "message": "This model's maximum context length is 8192 tokens. However, you requested 10000 output "
            "tokens and your prompt contains at least 12 input tokens, for a total of at least 10012 tokens."
        },
    ),
    (
        "sglang max_new_tokens over the window",
        {
            "message": "Requested token count exceeds the model's maximum context length of 4096 tokens. You "
            "requested a total of 5010 tokens: 10 tokens from the input messages and 5000 tokens for the "
            "completion."
        },
    ),
    (
        "tgi max_new_tokens over the window",
        {
            "status_code": 422,
            "message": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 10 "
            "`inputs` tokens and 5000 `max_new_tokens`",
        },
    ),
    (
        "anthropic max_tokens over the window",
        {"message": "input length and `max_tokens` exceed context limit: 120 + 250000 > 200000"},
    ),
    ("connection", {"message": "Connection error."}),
    ("nothing", {}),
]


@pytest.mark.parametrize(("provider", "facts"), OVERFLOWS, ids=[p for p, _ in OVERFLOWS])
def test_real_overflow_messages_are_detected(provider: str, facts: dict[str, Any]) -> None:
    assert is_context_overflow(**facts), provider


@pytest.mark.parametrize(("case", "facts"), NOT_OVERFLOWS, ids=[c for c, _ in NOT_OVERFLOWS])
def test_other_errors_are_not_overflow(case: str, facts: dict[str, Any]) -> None:
    assert not is_context_overflow(**facts), case


def test_the_table_covers_every_provider_of_the_spec() -> None:
    assert len(OVERFLOWS) >= 30
    names = " ".join(p for p, _ in OVERFLOWS)
    for provider in (
        "openai", "azure", "anthropic", "gemini", "vertex", "bedrock", "mistral", "groq", "cohere",
        "deepseek", "xai", "openrouter", "ollama", "llama.cpp", "vllm", "lm studio", "sglang", "tgi",
    ):  # fmt: skip
        assert provider in names


@pytest.mark.parametrize("fmt", sorted(OVERFLOW_FORMATS))
def test_every_local_provider_dialect_is_an_overflow_by_its_body_alone(fmt: str) -> None:
    error = overflow_error(fmt, prompt=9_000, window=8_192, completion=500)
    assert is_context_overflow(status_code=error.status, body=error.body), fmt
    assert is_context_overflow(message=json.dumps(error.body)), fmt  # as a transport's str(exc) shows it


def test_a_sum_too_large_is_an_overflow_only_when_a_smaller_prompt_could_make_room() -> None:
    def vllm(max_tokens: int, window: int, prompt: int) -> str:
        return (
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
            f"length is {window} tokens and your request has {prompt} input tokens "
            f"({max_tokens} > {window} - {prompt})."
        )

    assert overflow_reason(message=vllm(4_000, 8_192, 6_000)) == (
        "the prompt leaves no room for the 4000 output tokens asked for (window 8192)"
    )
    assert not is_context_overflow(message=vllm(8_192, 8_192, 1))  # no prompt is small enough
    assert not is_context_overflow(message=vllm(4_000, 8_192, 6_000), status_code=429)
    assert is_context_overflow(  # numbers written with thousands separators
        message="This endpoint's maximum context length is 200,000 tokens. However, you requested about "
        "210,000 tokens (190,000 of text input, 20,000 in the output). Please reduce the length of either one."
    )


def test_every_substring_litellm_checks_is_an_overflow() -> None:
    """litellm 1.110's ``is_error_str_context_window_exceeded`` list and its other shapes (design §6.1: the union)."""
    for text in (
        "exceed context limit",
        "This model's maximum context length is 4096",
        "Requested token count exceeds the model's maximum context length of 4096 tokens",
        "String too long. Expected a string with maximum length 10485760",
        "the model's maximum context limit",
        "The input is longer than the model's context length",
        "Input tokens exceed the configured limit of 272000 tokens.",
        "`inputs` tokens + `max_new_tokens` must be <= 2048",
        "the request exceeds the available context size",
        "The input token count exceeds the maximum number of tokens allowed",
        '{"code": "context_length_exceeded"}',
        "prompt is too long",
        "Current length is 9012 while limit is 8192",
        "maximum input length is 8192 tokens",
        "Input too long: 5000 input tokens, limit is 4096",
    ):
        assert is_context_overflow(message=text), text


def test_each_of_opals_17_substrings_alone_is_overflow() -> None:
    assert len(OPAL_PATTERNS) == 17
    assert set(OPAL_PATTERNS) <= {p for ps in OVERFLOW_PATTERNS.values() for p in ps}
    for phrase in OPAL_PATTERNS:
        assert is_context_overflow(message=f"Error: {phrase.upper()} (request rejected)"), phrase


def _status_error(cls: type[openai.APIStatusError], status: int, body: object) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx.Response(status, json=body, request=request)
    return cls(f"Error code: {status} - {body}", response=response, body=body)


def test_openai_sdk_exceptions_are_read_for_body_code_and_status() -> None:
    body = {
        "error": {
            "message": "Your input exceeds the context window of this model.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    assert is_context_overflow(_status_error(openai.BadRequestError, 400, body))
    too_big = {
        "type": "error",
        "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"},
    }
    assert is_context_overflow(_status_error(openai.APIStatusError, 413, too_big))
    limited = {
        "error": {
            "message": "Rate limit reached for requests",
            "type": "requests",
            "code": "rate_limit_exceeded",
        }
    }
    assert not is_context_overflow(_status_error(openai.RateLimitError, 429, limited))


def test_cause_chain_and_json_embedded_in_the_message_are_read() -> None:
    inner = _status_error(
        openai.BadRequestError,
        400,
        {"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"}},
    )
    try:
        try:
            raise inner
        except openai.BadRequestError as exc:
            raise RuntimeError("provider call failed") from exc
    except RuntimeError as outer:
        assert is_context_overflow(outer)
    embedded = 'OpenAIException - {"error": {"message": "request failed", "code": "context_length_exceeded"}}'
    assert is_context_overflow(RuntimeError(embedded))


def test_litellm_context_window_error_is_overflow_by_type() -> None:
    import litellm

    error = litellm.ContextWindowExceededError(
        message="something the patterns do not know", model="m", llm_provider="openai"
    )
    assert is_context_overflow(error)
    rate = litellm.RateLimitError(
        message="Rate limit reached on tokens per min", model="m", llm_provider="openai"
    )
    assert not is_context_overflow(rate)


def test_usage_overflow() -> None:
    assert is_usage_overflow(250_000, 200_000)
    assert not is_usage_overflow(200_000, 200_000)
    assert not is_usage_overflow(150_000, 200_000)
    assert not is_usage_overflow(10, 0)  # unknown window


class _Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    @property
    def message(self) -> str:
        raise RuntimeError("no message either")


def test_hostile_and_huge_inputs_do_not_raise() -> None:
    recursive: dict[str, Any] = {}
    recursive["error"] = recursive
    assert not is_context_overflow(body=recursive)
    assert not is_context_overflow(_Hostile())
    huge = "x" * 5_000_000 + " prompt is too long"
    assert not is_context_overflow(message=huge)  # only the first 64 KiB is read: bounded work
    assert is_context_overflow(message="prompt is too long" + "x" * 5_000_000)
    assert is_context_overflow(body=b'{"error": {"code": "context_length_exceeded"}}')


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    message=st.none() | st.text(),
    status=st.none() | st.integers(min_value=-(2**40), max_value=2**40),
    code=st.none() | st.text(max_size=50),
    body=json_values,
    exc_message=st.text(),
)
def test_fuzz_classifier_never_raises(
    message: str | None, status: int | None, code: str | None, body: object, exc_message: str
) -> None:
    error = ValueError(exc_message)
    error.body = body  # type: ignore[attr-defined]
    error.status_code = status  # type: ignore[attr-defined]
    result = is_context_overflow(error, message=message, status_code=status, code=code, body=body)
    assert isinstance(result, bool)


# -- the recovery decision (design §6.3) ---------------------------------------------------------------------


def test_overflow_recovery_is_one_emergency_compaction_then_clear_errors() -> None:
    from runtime.context.recovery import decide_overflow

    facts: dict[str, Any] = {"context_window": 8_000, "estimated_tokens": 9_500}
    first = decide_overflow(recoveries_this_turn=0, auto_compact=True, has_store=True, **facts)
    assert first.action == "compact_and_retry"
    again = decide_overflow(recoveries_this_turn=1, auto_compact=True, has_store=True, **facts)
    assert again.action == "fail" and again.code == "context_overflow_after_compaction"
    assert "after an emergency compaction" in again.message and "Nothing was lost" in again.message
    manual = decide_overflow(recoveries_this_turn=0, auto_compact=False, has_store=True, **facts)
    assert manual.action == "fail" and "Automatic compaction is disabled" in manual.message
    # Without a store (no session) there is nothing to compact: an error, not a compaction.
    storeless = decide_overflow(recoveries_this_turn=0, auto_compact=True, has_store=False, **facts)
    assert storeless.action == "fail" and "no session store" in storeless.message
    assert "8,000 tokens (about 9,500 tokens)" in storeless.message


def test_the_detector_answers_asks_and_tells_only_a_silent_overflow() -> None:
    import queue

    from actors.overflow_detector import CheckUsage, OverflowDetector, UsageOverflowed
    from runtime.actor import PooledActor
    from runtime.events import Event

    told: queue.Queue[Any] = queue.Queue()

    class Agent(PooledActor):
        def on_receive(self, message: Any) -> None:
            told.put(message)

    events: list[Event] = []
    detector = OverflowDetector.start("s1", events.append, context_window=1_000, auto_compact=True)
    agent = Agent.start()
    try:
        assert detector.ask(CheckUsage(500)) is False
        assert detector.ask(CheckUsage(1_500)) is True
        detector.tell(CheckUsage(900, notify=agent))  # within the window: no reply at all
        detector.tell(CheckUsage(1_200, notify=agent))
        assert told.get(timeout=5) == UsageOverflowed(1_200)
        assert told.empty()
        assert [(e.type, getattr(e, "input_tokens", None)) for e in events] == [
            ("usage_overflow", 1_500),
            ("usage_overflow", 1_200),
        ]
    finally:
        detector.stop()
        agent.stop()
