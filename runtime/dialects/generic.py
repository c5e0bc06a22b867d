"""What no single vendor owns: Opal's 17 overflow substrings, litellm's own checks, wordings met in the wild
(Moonshot, MiniMax, Copilot, Fireworks, DashScope, Poolside, Z.ai, Cerebras...), and the vetoes every
provider's errors share (rate limits, quotas, ``max_tokens`` validation, authentication, content policy)."""

from __future__ import annotations

import re
from typing import Final

from runtime.dialects._base import NUM, PROMPT, WIN, Dialect

OPAL: Final = Dialect(
    name="opal",
    # The 17 substrings of Opal's overflow module (reference 002: lib/opal/agent/overflow.ex).
    overflow_phrases=(
        "context_length_exceeded",
        "maximum context length",
        "max_tokens",
        "max_prompt_tokens",
        "too many tokens",
        "prompt is too long",
        "prompt_tokens_exceeded",
        "request too large",
        "context window",
        "token limit",
        "exceeds the limit",
        "input too long",
        "exceeds the model's maximum",
        "reduce the length",
        "maximum number of tokens",
        "content_too_large",
        "string_above_max_length",
    ),
    overflow_codes=frozenset({"prompt_tokens_exceeded", "content_too_large"}),
)
"""Opal's 17 substrings, kept verbatim so the union with them holds (design §6.1)."""

LITELLM: Final = Dialect(
    name="litellm",
    # What litellm's exception_mapping_utils maps to ContextWindowExceededError (generic and per provider).
    overflow_phrases=(
        "exceed context limit",
        "this model's maximum context length is",
        "string too long. expected a string with maximum length",
        "model's maximum context limit",
        "is longer than the model's context length",
        "input tokens exceed the configured limit",
        "`inputs` tokens + `max_new_tokens` must be",
        "exceeds the available context size",
        "exceeds the maximum number of tokens allowed",
        "input is too long",
        "prompt: length",
        "expected maxlength:",
        "too many input tokens",
        "request payload size exceeds",
        "length limit exceeded",
        "prompt has too many tokens",
        "input text length should not exceed",
        "this is longer than the model's maximum context length",
    ),
    overflow_regexes=(
        re.compile(r"current length is \d+ while limit is \d+"),  # Cerebras (litellm checks this too)
        re.compile(r"maximum input length is [^.\n]{0,40}tokens"),  # "maximum input length is" + "tokens"
    ),
)
"""litellm's own substring checks (``ExceptionCheckers.is_error_str_context_window_exceeded`` and the
per-provider mappers), lower-cased."""

OTHER: Final = Dialect(
    name="other",
    # Others met in the wild: Moonshot/Kimi "exceeded model token limit" and "Input token length too long",
    # MiniMax "context window exceeds limit", Copilot "model_max_prompt_tokens_exceeded", Fireworks "the
    # prompt is too long", DashScope "range of input length should be", Poolside (through OpenRouter) "Input
    # length N exceeds the maximum allowed input length of M tokens.", Z.ai "tokens in request more than max
    # tokens allowed", LM Studio "… tokens to keep from the initial prompt is greater than the context
    # length", a bare 413's reason phrase, and Anthropic's and Z.ai's model_context_window_exceeded.
    overflow_phrases=(
        "input token count",
        "greater than the context length",
        "context window exceeds limit",
        "exceeded model token limit",
        "token length too long",
        "token limit exceeded",
        "model_max_prompt_tokens_exceeded",
        "range of input length should be",
        "exceeds the limit of",
        "maximum allowed input length",
        "exceeds the maximum input length",
        "tokens in request more than max tokens allowed",
        "request entity too large",
        "model_context_window_exceeded",
    ),
    overflow_codes=frozenset({"model_max_prompt_tokens_exceeded"}),  # GitHub Copilot
    overflow_regexes=(
        re.compile(r"requested \d+ tokens?,? (?:but|while) (?:the )?(?:model|context)\D{0,40}\d+"),
    ),
    window_regexes=(
        # Cerebras: "current length is N while limit is M"
        re.compile(rf"current length is {NUM} while limit is {WIN}"),
        # Poolside: "exceeds the maximum allowed input length of N tokens"
        re.compile(rf"maximum allowed input length of {WIN} tokens"),
    ),
    prompt_regexes=(re.compile(rf"current length is {PROMPT} while limit is"),),  # Cerebras
    negative_phrases=(
        # rate limits and quotas: a request too large for a per-minute budget is not too large for the window
        "tokens per day",
        "per minute",
        "quota",
        "service tier capacity exceeded",
        "throttled",
        # max_tokens (the *completion* budget) parameter validation
        "max_tokens is too large",
        "max_completion_tokens is too large",
        "max_tokens must be",
        "valid range of max_tokens",
        "range of max_tokens should be",  # DashScope: "Range of max_tokens should be [1, 8192]"
        "invalid max_tokens",
        # authentication and permissions
        "authentication",
        "unauthorized",
        "permission denied",
        # content policy
        "content_policy",
        "content policy",
    ),
    negative_regexes=(
        re.compile(r"rate[\s_-]*limit"),
        # "Invalid 'user': string too long" is a parameter limit, not the prompt (litellm excludes it too);
        # only message and input content count.
        re.compile(r"invalid '(?!messages|input|prompt|contents)[^']*': string too long"),
    ),
)
"""Wordings of providers without a module of their own, and the vetoes all share."""
