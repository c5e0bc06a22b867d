"""The window an overflow error states (design §6.3), the answer cap (§4.5), and the recovery a learned
window earns: pure functions, real wording."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.context.estimate import MIN_ANSWER_TOKENS, answer_cap
from runtime.context.overflow import is_context_overflow, stated_prompt_tokens, stated_window
from runtime.context.recovery import decide_overflow
from runtime.provider.errors import OVERFLOW_FORMATS, overflow_error

# (who, facts, the window they state): wording as the servers send it.
STATED: list[tuple[str, dict[str, Any], int]] = [
    (
        "llama.cpp (2025-)",
        {
            "status_code": 400,
            "body": {
                "error": {
                    "code": 400,
                    "message": "request (1431 tokens) exceeds the available context size (1024 tokens), try "
                    "increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 1431,
                    "n_ctx": 1024,
                }
            },
        },
        1024,
    ),
    (
        "llama.cpp (n_ctx only)",
        {
            "message": "the request exceeds the available context size, try increasing it",
            "body": {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 3000, "n_ctx": 2048}},
        },
        2048,
    ),
    (
        "llama.cpp (2024)",
        {"message": "input (5000 tokens) is larger than the max context size (4096 tokens). skipping"},
        4096,
    ),
    (
        "vllm V1",
        {
            "message": "The prompt (total length 5000) is too long to fit into the model (context length 4096). "
            "Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens."
        },
        4096,
    ),
    (
        "openai (old), vllm",
        {
            "message": "This model's maximum context length is 8,192 tokens. However, your messages resulted in "
            "9000 tokens. Please reduce the length of the messages.",
            "code": "context_length_exceeded",
        },
        8192,
    ),
    ("anthropic", {"message": "prompt is too long: 208310 tokens > 200000 maximum"}, 200_000),
    (
        "openrouter",
        {
            "message": "This endpoint's maximum context length is 32768 tokens. However, you requested about 40000 "
            'tokens (40000 of text input). Please reduce the length of either one, or use the "middle-out" '
            "transform to compress your prompt automatically."
        },
        32768,
    ),
    (
        "vllm, prompt + max_tokens (the output alone too large: a cap from a wrong window)",
        {
            "message": "'max_tokens' or 'max_completion_tokens' is too large: 120000. This model's maximum "
            "context length is 4096 tokens and your request has 100 input tokens (120000 > 4096 - 100)."
        },
        4096,
    ),
    (
        "sglang",
        {"message": "The input (5000 tokens) is longer than the model's context length (4096 tokens)."},
        4096,
    ),
    (
        "mistral",
        {
            "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum "
            "context length"
        },
        32768,
    ),
]


@pytest.mark.parametrize(("who", "facts", "window"), STATED, ids=[s[0] for s in STATED])
def test_the_window_an_overflow_states_is_read(who: str, facts: dict[str, Any], window: int) -> None:
    assert stated_window(**facts) == window


def test_vllms_v1_wording_is_an_overflow() -> None:
    message = (
        "The prompt (total length 5000) is too long to fit into the model (context length 4096). Make sure "
        "that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens."
    )
    assert is_context_overflow(message=message, status_code=400)


def test_each_local_dialect_that_names_the_window_is_read() -> None:
    """The local provider's imitations, by their bodies: every dialect that puts the number in its words
    (or llama.cpp's n_ctx) gives it back; the rest give None, never a wrong number."""
    named = 0
    for fmt in OVERFLOW_FORMATS:
        error = overflow_error(fmt, 5_000, 3_000)
        found = stated_window(message=json.dumps(error.body), status_code=error.status, body=error.body)
        assert found in (None, 3_000), fmt
        named += found == 3_000
    assert named >= 15


@pytest.mark.parametrize(
    "facts",
    [
        {"message": "Rate limit reached: 30000 tokens > 20000 maximum per minute", "status_code": 429},
        {"message": "max_tokens is too large: 9000. This model supports at most 4096 completion tokens"},
        {"message": "Invalid API key; maximum context length is 4096 tokens", "status_code": 401},
        {
            "message": "The server had an error. maximum context length is 4096 tokens",
            "status_code": 500,
            "code": "rate_limit_exceeded",
        },
        {"message": "This model's maximum context length is 3 tokens."},  # no model has a window of 3
        {"message": "nothing to see"},
    ],
)
def test_no_window_is_read_where_none_is_stated_for_the_prompt(facts: dict[str, Any]) -> None:
    assert stated_window(**facts) is None


def test_the_answer_asks_for_no_more_than_the_window_leaves() -> None:
    # window 2,048, prompt 1,500: the room less a margin of a sixteenth of the window (128)
    assert answer_cap(window=2_048, prompt_tokens=1_500) == 2_048 - 1_500 - 128
    # the configured or the model's output limit when smaller
    assert answer_cap(window=2_048, prompt_tokens=100, configured=256) == 256
    assert answer_cap(window=128_000, prompt_tokens=100, model_max=16_384) == 16_384
    assert answer_cap(window=128_000, prompt_tokens=100, configured=8_000, model_max=16_384) == 8_000
    # a prompt that leaves nothing still asks for a little (the overflow path handles the rest)
    assert answer_cap(window=1_024, prompt_tokens=5_000) == MIN_ANSWER_TOKENS
    # an unknown window: the output limits alone, or nothing
    assert answer_cap(window=None, prompt_tokens=100_000, model_max=4_096) == 4_096
    assert answer_cap(window=None, prompt_tokens=100) is None


def test_a_learned_window_earns_a_second_compaction_in_a_turn() -> None:
    facts = {"auto_compact": True, "has_store": True, "context_window": 2_048}
    assert decide_overflow(recoveries_this_turn=1, **facts).action == "fail"
    assert decide_overflow(recoveries_this_turn=1, window_learned=True, **facts).action == "compact_and_retry"
    # but never without a store or with compaction off
    off = {**facts, "auto_compact": False}
    assert decide_overflow(recoveries_this_turn=0, window_learned=True, **off).action == "fail"


# (who, message, the prompt's tokens it states): the servers' own wordings, beside the local provider's.
STATED_PROMPTS: list[tuple[str, str, int]] = [
    (
        "llama.cpp",
        "request (1431 tokens) exceeds the available context size (1024 tokens), try increasing it",
        1431,
    ),
    (
        "llama.cpp (2024)",
        "input (5000 tokens) is larger than the max context size (4096 tokens). skipping",
        5000,
    ),
    (
        "vLLM ≤ 0.9, OpenAI (old)",
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4,000 in the "
        "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        4000,
    ),
    (
        "vLLM ≥ 0.10 (max_tokens)",
        "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is "
        "4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500).",
        3500,
    ),
    (
        "vLLM V1",
        "The prompt (total length 5000) is too long to fit into the model (context length 4096).",
        5000,
    ),
    (
        "OpenAI",
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130201 "
        "tokens. Please reduce the length of the messages.",
        130201,
    ),
    ("Anthropic", "prompt is too long: 208310 tokens > 200000 maximum", 208310),
    (
        "Anthropic (max_tokens)",
        "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, "
        "decrease input length or `max_tokens` and try again",
        197000,
    ),
    ("SGLang", "The input (5000 tokens) is longer than the model's context length (4096 tokens).", 5000),
    (
        "Mistral",
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum "
        "context length",
        40000,
    ),
    (
        "Cerebras",
        "Please reduce the length of the messages or completion. Current length is 9000 while limit is 8192",
        9000,
    ),
]


@pytest.mark.parametrize(("who", "message", "prompt"), STATED_PROMPTS, ids=[s[0] for s in STATED_PROMPTS])
def test_an_overflow_states_the_servers_count_of_the_prompt(who: str, message: str, prompt: int) -> None:
    """What a refused request teaches of the server's tokenizer (design §4.5, §5.4): its count of the
    prompt, in each server's words."""
    assert stated_prompt_tokens(message=message) == prompt


def test_the_local_providers_overflows_state_the_prompt_where_their_server_does() -> None:
    """Every imitation that carries the prompt's count reads back as it (llama.cpp's from its JSON
    ``n_prompt_tokens`` too); those whose server says no number (OpenAI's newer wording, Gemini, a 413)
    state none, and an error that is no overflow states none either."""
    silent = {
        "openai_new",
        "request_too_large",
        "gemini",
        "vertex",
        "ollama",
        "ollama_new",
        "bedrock",
        "groq",
        "xai",
        "cohere",
        "lmstudio",
    }
    for name in OVERFLOW_FORMATS:
        error = overflow_error(name, 3210, 4096, 1000)
        expected = None if name in silent else 3210
        assert stated_prompt_tokens(status_code=error.status, body=error.body) == expected, name
    body = {"error": {"n_prompt_tokens": 3000}}
    assert stated_prompt_tokens(body=body) is None  # (no overflow said)
    assert (
        stated_prompt_tokens(
            message="Rate limit: you requested 5000 tokens (4000 in the messages", status_code=429
        )
        is None
    )
