"""Is this provider error a context overflow? (design §6.1, 6.2) — a pure classifier.

Providers say "your prompt is larger than my context window" in many dialects. :func:`is_context_overflow`
reads an exception (litellm's, openai's, or anything with a message), or the loose facts of an error
(message, HTTP status, error code, JSON body), and answers whether compacting the context could help.

How a verdict is reached, first rule that applies wins:

1. litellm's ``ContextWindowExceededError`` (anywhere in the exception's class hierarchy or cause chain)
   → overflow. litellm raises it after running its own checks, so those are trusted as they are.
2. An explicit overflow error code (``context_length_exceeded``, ``request_too_large``, …) → overflow.
3. A request whose *sum* was too large — the prompt plus the output it asked for, stated with both numbers
   (vLLM, SGLang, TGI, DeepSeek, OpenRouter) — is an overflow when a smaller prompt could make room, and not
   one when the requested output alone fills the window (a ``max_tokens`` parameter error that no
   compaction can fix). vLLM's "'max_tokens' … is too large: X. This model's maximum context length is N
   tokens and your request has M input tokens" is one of these, not the parameter error it starts like.
4. A *negative*: rate limits ("tokens per minute" requests are too large for a quota, not for the window),
   ``max_tokens`` parameter validation ("max_tokens is too large: …"), authentication, content policy,
   throttling, overload, or an HTTP 401/402/403/429 status → not an overflow, even when the message also
   contains a phrase from the positive list (Opal's broad ``"max_tokens"`` and ``"request too large"``
   would otherwise fire on exactly these).
5. HTTP 413 (payload too large) → overflow.
6. Any phrase of :data:`OVERFLOW_PATTERNS` (or :data:`OVERFLOW_REGEXES`) in the text → overflow.

The text searched is the union of everything the error says: its message, its ``str()``, its body (nested
JSON included: OpenRouter relays the upstream provider's error as a JSON *string* inside its own JSON), and
the same for its ``__cause__`` chain, all case-insensitively. The classifier never raises: malformed,
recursive or enormous inputs are read defensively and bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Final, TypeVar

__all__ = [
    "LITELLM_PATTERNS",
    "NEGATIVE_CODES",
    "NEGATIVE_PHRASES",
    "NEGATIVE_REGEXES",
    "NEGATIVE_STATUSES",
    "OPAL_PATTERNS",
    "OUTPUT_BUDGET_REGEXES",
    "OVERFLOW_CODES",
    "OVERFLOW_PATTERNS",
    "OVERFLOW_REGEXES",
    "is_context_overflow",
    "is_usage_overflow",
    "overflow_reason",
    "stated_window",
]


_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------------
# Positive phrases, lower case, grouped by who says them. A message matching any of them (and no
# negative) is an overflow.

OPAL_PATTERNS: Final[tuple[str, ...]] = (
    # The 17 substrings of Opal's overflow module (reference 002: lib/opal/agent/overflow.ex).
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
)
"""Opal's 17 substrings, kept verbatim so the union with them holds (design §6.1)."""

LITELLM_PATTERNS: Final[tuple[str, ...]] = (
    # What litellm's exception_mapping_utils maps to ContextWindowExceededError (generic and per provider).
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
)
"""litellm's own substring checks (``ExceptionCheckers.is_error_str_context_window_exceeded`` and the
per-provider mappers), lower-cased."""

OVERFLOW_PATTERNS: Final[Mapping[str, tuple[str, ...]]] = {
    "opal": OPAL_PATTERNS,
    "litellm": LITELLM_PATTERNS,
    # "This model's maximum context length is 128000 tokens. However, your messages resulted in …" (old)
    # "Your input exceeds the context window of this model. Please adjust your input and try again." (new)
    "openai": (
        "exceeds the context window",
        "input exceeds the context window",
        "reduce the length of the messages",
    ),
    # Azure OpenAI relays OpenAI's bodies; its own gateway says "tokens_limit_reached" for Foundry models.
    "azure": ("tokens_limit_reached", "the input tokens exceeded the maximum"),
    # "prompt is too long: 208310 tokens > 200000 maximum"; "input length and `max_tokens` exceed context
    # limit: …"; 413 "request_too_large".
    "anthropic": ("request_too_large", "exceed context limit"),
    # "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575)."
    "gemini": ("input token count", "request payload size exceeds the limit"),
    # "Unable to submit request because the input token count is 1052710 but model only supports up to
    # 1048576. Reduce the input token count and try again. You can also use the CountTokens API …"
    "vertex": ("but model only supports up to", "reduce the input token count"),
    # "Input is too long for requested model."; Mantle: "prompt tokens (210000) exceed model maximum (200000)"
    "bedrock": ("input is too long for requested model", "exceed model maximum"),
    # "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length"
    "mistral": ("too large for model with",),
    # Groq sends OpenAI's code and "Please reduce the length of the messages or completion."
    "groq": ("reduce the length of the messages or completion",),
    # "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 5000."
    # v2: "too many tokens: size limit exceeded by 1234 tokens."
    "cohere": ("total number of tokens in the prompt cannot exceed", "size limit exceeded by"),
    # DeepSeek uses OpenAI's wording ("This model's maximum context length is 65536 tokens. …").
    "deepseek": ("this model's maximum context length",),
    # "This model's maximum prompt length is 131072 but the request contains 150000 tokens."
    "xai": ("maximum prompt length",),
    # "This endpoint's maximum context length is 200000 tokens. However, you requested about …"
    "openrouter": ("endpoint's maximum context length", "middle-out"),
    # "the input length exceeds the context length"; the runner's "prompt too long; exceeded max context
    # length by …"; since 2026-06 (no context shift): "the prompt is longer than the context length currently
    # available to the model; shorten the prompt, …"; MLX: "input length (N tokens) exceeds the model's
    # maximum context length (M tokens)" (server/routes.go, llm/llama_server.go, x/mlxrunner/pipeline.go)
    "ollama": (
        "exceeds the context length",
        "exceeded max context length",
        "prompt too long",
        "longer than the context length",
    ),
    # tools/server: "input is larger than the max context size. skipping" (2024), then "input (N tokens) is
    # larger than the max context size (M tokens). skipping", "the request exceeds the available context
    # size, try increasing it" (2025), "request (N tokens) exceeds the available context size (M tokens), try
    # increasing it"; mid-generation "Context size has been exceeded." Type exceed_context_size_error.
    "llama.cpp": (
        "exceed_context_size_error",
        "available context size",
        "context size has been exceeded",
        "larger than the max context size",
    ),
    # ≤ 0.9: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in
    # the messages, 1000 in the completion). …"; the engine: "The decoder prompt (length 5000) is longer than
    # the maximum model length of 4096. Make sure that `max_model_len` is …"; ≥ 0.10: "… However, your request
    # has 40000 input tokens. Please reduce the length of the input messages." and, for prompt + max_tokens,
    # "'max_tokens' or 'max_completion_tokens' is too large: X. This model's maximum context length is N
    # tokens and your request has M input tokens (X > N - M)." (rule 3).
    # The V1 engine's processor: "The prompt (total length 5000) is too long to fit into the model (context
    # length 4096). Make sure that `max_model_len` is no smaller than the number of text tokens plus …"
    "vllm": (
        "reduce the length of the input",
        "input tokens. please reduce",
        "longer than the maximum model length",
        "too long to fit into the model",
    ),
    # "The input (N tokens) is longer than the model's context length (M tokens)."; with max_new_tokens:
    # "Requested token count exceeds the model's maximum context length of M tokens. You requested a total of
    # T tokens: N tokens from the input messages and X tokens for the completion. …" (tokenizer_manager.py)
    "sglang": ("is longer than the model's context length", "requested token count exceeds"),
    # router/src/validation.rs: "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000"
    # (a 422), and "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: …" (litellm's, above)
    "tgi": ("`inputs` must have less than",),
    # "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded with
    # context length of only 4096 tokens, which is not enough."
    "lm studio": ("when context the overflows", "context length of only", "context overflow"),
    # Others met in the wild: Moonshot/Kimi "exceeded model token limit" and "Input token length too long",
    # MiniMax "context window exceeds limit", Copilot "model_max_prompt_tokens_exceeded", Fireworks "the
    # prompt is too long", DashScope "range of input length should be", Poolside (through OpenRouter) "Input
    # length N exceeds the maximum allowed input length of M tokens.", Z.ai "tokens in request more than max
    # tokens allowed", LM Studio "… tokens to keep from the initial prompt is greater than the context
    # length", a bare 413's reason phrase, and Anthropic's and Z.ai's model_context_window_exceeded.
    "other": (
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
}
"""Overflow phrases by provider (lower case; matched as substrings of the lower-cased error text)."""

OVERFLOW_REGEXES: Final[tuple[re.Pattern[str], ...]] = (
    re.compile(r"current length is \d+ while limit is \d+"),  # Cerebras (litellm checks this too)
    re.compile(r"prompt tokens \(\d+\) exceed model maximum"),  # Bedrock Mantle
    re.compile(r"requested \d+ tokens?,? (?:but|while) (?:the )?(?:model|context)\D{0,40}\d+"),
    re.compile(
        r"maximum input length is [^.\n]{0,40}tokens"
    ),  # litellm: "maximum input length is" + "tokens"
)
"""Overflow messages whose shape, not a fixed phrase, gives them away."""

OVERFLOW_CODES: Final[frozenset[str]] = frozenset(
    {
        "context_length_exceeded",  # OpenAI, Azure, Groq, many OpenAI-compatible servers
        "request_too_large",  # Anthropic 413
        "exceed_context_size_error",  # llama.cpp
        "model_max_prompt_tokens_exceeded",  # GitHub Copilot
        "prompt_tokens_exceeded",
        "content_too_large",
        "tokens_limit_reached",  # Azure AI Foundry
        "model_context_window_exceeded",  # Anthropic, Z.ai
    }
)
"""Error codes / types that mean overflow whatever the message says."""

NEGATIVE_PHRASES: Final[tuple[str, ...]] = (
    # rate limits and quotas: a request too large for a per-minute budget is not too large for the window
    "tokens per min",
    "tokens per day",
    "requests per min",
    "(tpm)",
    "(rpm)",
    "tokens per minute",
    "per minute",
    "quota",
    "resource has been exhausted",
    "resource_exhausted",
    "service tier capacity exceeded",
    "please wait before trying again",  # Bedrock ThrottlingException ("Too many tokens, please wait …")
    "throttlingexception",
    "throttled",
    "overloaded",
    # max_tokens (the *completion* budget) parameter validation
    "max_tokens is too large",
    "max_completion_tokens is too large",
    "'max_tokens' or 'max_completion_tokens' is too large",
    "max_tokens must be",
    "`max_tokens` must be",
    "max_tokens` must be less",
    "maximum allowed number of output tokens",
    "completion tokens, whereas you provided",
    "valid range of max_tokens",
    "range of max_tokens should be",  # DashScope: "Range of max_tokens should be [1, 8192]"
    "invalid max_tokens",
    "invalid 'max_tokens'",
    "invalid 'max_completion_tokens'",
    "invalid 'max_output_tokens'",
    "maxoutputtokens value",
    "unsupported parameter",
    "unsupported value",
    # authentication and permissions
    "incorrect api key",
    "invalid api key",
    "invalid x-api-key",
    "api key not valid",
    "authentication",
    "unauthorized",
    "permission denied",
    "permission_denied",
    # content policy
    "content management policy",
    "content_policy",
    "content policy",
    "content filtering policy",
    "safety system",
    "responsibleaipolicyviolation",
)
"""Phrases that veto the broad positive phrases (lower case)."""

NEGATIVE_REGEXES: Final[tuple[re.Pattern[str], ...]] = (
    re.compile(r"rate[\s_-]*limit"),
    # "Invalid 'user': string too long" is a parameter limit, not the prompt (litellm excludes it too);
    # only message and input content count.
    re.compile(r"invalid '(?!messages|input|prompt|contents)[^']*': string too long"),
)

NEGATIVE_CODES: Final[frozenset[str]] = frozenset(
    {
        "rate_limit_exceeded",
        "rate_limit_error",
        "insufficient_quota",
        "resource_exhausted",
        "throttlingexception",
        "invalid_api_key",
        "authentication_error",
        "permission_error",
        "permission_denied",
        "unauthenticated",
        "content_filter",
        "content_policy_violation",
        "overloaded_error",
        "unsupported_parameter",
        "unsupported_value",
    }
)

NEGATIVE_STATUSES: Final[frozenset[int]] = frozenset({401, 402, 403, 429})
"""Authentication, payment, permission and rate-limit statuses are never an overflow."""

_NUM = r"\d[\d,]*"
_OUT = rf"(?P<output>{_NUM})"
_WIN = rf"(?P<window>{_NUM})"
OUTPUT_BUDGET_REGEXES: Final[tuple[re.Pattern[str], ...]] = (
    # vLLM ≥ 0.10 and NVIDIA NIM
    re.compile(
        rf"is too large: {_OUT}\. this model's maximum context length is {_WIN} tokens and your request has"
    ),
    # vLLM, newest wording
    re.compile(rf"maximum context length is {_WIN} tokens\. however, you requested {_OUT} output tokens"),
    # vLLM ≤ 0.9, DeepSeek, OpenAI's old wording
    re.compile(
        rf"maximum context length is {_WIN} tokens\. however, you requested {_NUM} tokens "
        rf"\({_NUM} in the messages, {_OUT} in the completion\)"
    ),
    # OpenRouter
    re.compile(
        rf"maximum context length is {_WIN} tokens\. however, you requested about {_NUM} tokens "
        rf"\({_NUM} of text input, {_OUT} in the output\)"
    ),
    # SGLang
    re.compile(
        rf"maximum context length of {_WIN} tokens\. you requested a total of {_NUM} tokens: "
        rf"{_NUM} tokens from the input messages and {_OUT} tokens for the completion"
    ),
    # Anthropic
    re.compile(rf"input length and `max_tokens` exceed context limit: {_NUM} \+ {_OUT} > {_WIN}"),
    # TGI
    re.compile(
        rf"`inputs` tokens \+ `max_new_tokens` must be <= {_WIN}\. given: {_NUM} `inputs` tokens and {_OUT} `max_new_tokens`"
    ),
)
"""Messages that state both the window and the output the request asked for (rule 3)."""

WINDOW_REGEXES: Final[tuple[re.Pattern[str], ...]] = (
    # llama.cpp: "request (1431 tokens) exceeds the available context size (1024 tokens)"; older "input (N
    # tokens) is larger than the max context size (M tokens)"
    re.compile(rf"(?:available|max) context size \({_WIN} tokens?\)"),
    # vLLM V1: "The prompt (total length N) is too long to fit into the model (context length M)"
    re.compile(rf"too long to fit into the model \(context length {_WIN}\)"),
    # OpenAI (old), vLLM, DeepSeek, OpenRouter ("this endpoint's …"), NIM: "maximum context length is N tokens";
    # SGLang "maximum context length of N tokens"; Ollama (MLX) "maximum context length (N tokens)"
    re.compile(rf"maximum context length (?:is|of|\() ?{_WIN} tokens"),
    # vLLM ≤ 0.9 engine: "is longer than the maximum model length of N"
    re.compile(rf"longer than the maximum model length of {_WIN}"),
    # Anthropic: "prompt is too long: 208310 tokens > 200000 maximum"
    re.compile(rf"{_NUM} tokens? > {_WIN} maximum"),
    # SGLang: "is longer than the model's context length (N tokens)"
    re.compile(rf"model's context length \({_WIN} tokens?\)"),
    # Mistral: "too large for model with 32768 maximum context length"
    re.compile(rf"too large for model with {_WIN} maximum context length"),
    # Gemini: "exceeds the maximum number of tokens allowed (1048575)"
    re.compile(rf"maximum number of tokens allowed \({_WIN}\)"),
    # Vertex: "but model only supports up to 1048576"
    re.compile(rf"model only supports up to {_WIN}"),
    # xAI: "maximum prompt length is 131072"
    re.compile(rf"maximum prompt length is {_WIN}"),
    # Bedrock Mantle: "exceed model maximum (200000)"; Cerebras: "current length is N while limit is M"
    re.compile(rf"exceed model maximum \({_WIN}\)"),
    re.compile(rf"current length is {_NUM} while limit is {_WIN}"),
    # Cohere: "total number of tokens in the prompt cannot exceed 4081"
    re.compile(rf"tokens in the prompt cannot exceed {_WIN}"),
    # TGI: "`inputs` must have less than 4096 tokens"; "`inputs` tokens + `max_new_tokens` must be <= 4096"
    re.compile(rf"`inputs` must have less than {_WIN} tokens"),
    re.compile(rf"`max_new_tokens` must be <= {_WIN}"),
    # LM Studio: "the model is loaded with context length of only 4096 tokens"
    re.compile(rf"context length of only {_WIN} tokens"),
    # Poolside: "exceeds the maximum allowed input length of N tokens"
    re.compile(rf"maximum allowed input length of {_WIN} tokens"),
)
"""Overflow messages that state the window (the first match wins; see :func:`stated_window`)."""

# A stated window outside these bounds is a misreading, not a model.
_MIN_WINDOW = 16
_MAX_WINDOW = 100_000_000

# Bounds that keep the classifier fast and safe on hostile input (a 100 MB body, a recursive dict).
_MAX_TEXT = 64 * 1024
_MAX_DEPTH = 8
_MAX_ITEMS = 512

_ALL_PATTERNS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(p for ps in OVERFLOW_PATTERNS.values() for p in ps)
)


def is_context_overflow(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> bool:
    """Whether an error says the request did not fit the model's context window.

    ``error`` is read for its message, status, code and body (litellm and openai exceptions, and anything
    shaped like them, including the ``__cause__`` chain); the keyword arguments add facts the caller has
    separately. Never raises.
    """
    return overflow_reason(error, message=message, status_code=status_code, code=code, body=body) is not None


def overflow_reason(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> str | None:
    """Why the error is an overflow (the rule or phrase that matched), or None when it is not one."""
    try:
        facts = _Facts()
        facts.add_text(message)
        facts.add_status(status_code)
        facts.add_code(code)
        facts.add_body(body, 0)
        if error is not None:
            facts.add_exception(error)
        return facts.verdict()
    except Exception:  # a classifier must never turn one error into two
        return None


def is_usage_overflow(input_tokens: int, context_window: int) -> bool:
    """Silent overflow (design §6.2): a successful response that reports more input tokens than the window.

    Some providers (Ollama, some proxies) truncate instead of failing; the reported usage gives it away.
    An unknown window (0 or less) never overflows.
    """
    return context_window > 0 and input_tokens > context_window


def stated_window(
    error: BaseException | None = None,
    *,
    message: str | None = None,
    status_code: int | None = None,
    code: str | None = None,
    body: object = None,
) -> int | None:
    """The context window an overflow error states, or None when it states none (or is no overflow).

    llama.cpp's JSON ``n_ctx`` first (the *slot's* context: ``--ctx-size`` divided by ``--parallel``), then
    the number in the first of :data:`WINDOW_REGEXES` that matches, then the window of a request whose
    prompt plus output did not fit (rule 3, even when the output alone was too large: a cap computed from a
    wrong window is exactly that). Never raises.
    """
    try:
        facts = _Facts()
        facts.add_text(message)
        facts.add_status(status_code)
        facts.add_code(code)
        facts.add_body(body, 0)
        if error is not None:
            facts.add_exception(error)
        text = "\n".join(facts.texts)
        budget = _output_budget(text)
        if facts.verdict() is None and budget is None:
            return None
        candidates: list[int] = list(facts.n_ctx)
        for regex in WINDOW_REGEXES:
            match = regex.search(text)
            if match is not None:
                candidates.append(int(match["window"].replace(",", "")))
                break
        if budget is not None:
            candidates.append(budget[1])
        for window in candidates:
            if _MIN_WINDOW <= window <= _MAX_WINDOW:
                return window
        return None
    except Exception:  # like the classifier: never turn one error into two
        return None


# ---------------------------------------------------------------------------------------------------


class _Facts:
    """What an error says, gathered from every place it may say it."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.codes: set[str] = set()
        self.statuses: set[int] = set()
        self.context_window_error = False
        self.n_ctx: list[int] = []  # llama.cpp's error body states the slot's context as n_ctx
        self._size = 0
        self._seen: set[int] = set()

    # -- gathering ------------------------------------------------------------------------------------
    def add_text(self, text: object) -> None:
        if not isinstance(text, str) or not text or self._size >= _MAX_TEXT:
            return
        text = text[: _MAX_TEXT - self._size]
        self._size += len(text)
        self.texts.append(text.lower())

    def add_status(self, status: object) -> None:
        if isinstance(status, bool):
            return
        if isinstance(status, str) and status.strip().isdigit():
            status = int(status.strip())
        if isinstance(status, int) and 100 <= status <= 599:
            self.statuses.add(status)

    def add_code(self, code: object) -> None:
        if isinstance(code, str) and code and len(code) <= 200:
            self.codes.add(code.strip().lower())
        else:
            self.add_status(code)  # numeric codes (Gemini, OpenRouter) are HTTP statuses

    def add_body(self, body: object, depth: int) -> None:
        if body is None or depth > _MAX_DEPTH or id(body) in self._seen:
            return
        self._seen.add(id(body))
        if isinstance(body, (bytes, bytearray, memoryview)):
            body = bytes(body[:_MAX_TEXT]).decode("utf-8", "replace")
        if isinstance(body, str):
            self.add_text(body)
            nested = _maybe_json(body)
            if nested is not None:
                self.add_body(nested, depth + 1)
        elif isinstance(body, Mapping):
            for key, value in _bounded(body.items()):
                name = key.lower() if isinstance(key, str) else ""
                if name in ("code", "type", "status", "error_code", "errortype", "__type"):
                    self.add_code(value)
                elif name in ("status_code", "statuscode", "http_status"):
                    self.add_status(value)
                elif name == "n_ctx" and isinstance(value, int) and not isinstance(value, bool):
                    self.n_ctx.append(value)
                self.add_body(value, depth + 1)
        elif isinstance(body, (list, tuple)):
            for item in _bounded(body):
                self.add_body(item, depth + 1)

    def add_exception(self, error: BaseException) -> None:
        current: BaseException | None = error
        for _ in range(_MAX_DEPTH):
            if current is None or id(current) in self._seen:
                return
            self._seen.add(id(current))
            if any(cls.__name__ == "ContextWindowExceededError" for cls in type(current).__mro__):
                self.context_window_error = True
            for attr in ("message", "body", "error", "response_text", "detail"):
                value = _attr(current, attr)
                if isinstance(value, str):
                    self.add_text(value)
                    nested = _maybe_json(value)
                    if nested is not None:
                        self.add_body(nested, 1)
                else:
                    self.add_body(value, 1)
            for attr in ("code", "type", "error_code"):
                self.add_code(_attr(current, attr))
            self.add_status(_attr(current, "status_code"))
            self.add_status(_attr(current, "status"))
            response = _attr(current, "response")
            if response is not None:
                self.add_status(_attr(response, "status_code"))
            self.add_text(_safe_str(current))
            current = current.__cause__ or current.__context__

    # -- deciding -------------------------------------------------------------------------------------
    def verdict(self) -> str | None:
        if self.context_window_error:
            return "litellm ContextWindowExceededError"
        explicit = self.codes & OVERFLOW_CODES
        if explicit:
            return f"error code {min(explicit)}"
        text = "\n".join(self.texts)
        budget = _output_budget(text)
        if budget is not None:
            output, window = budget
            if output >= window or self.statuses & NEGATIVE_STATUSES or self.codes & NEGATIVE_CODES:
                return None  # the output asked for fills the window by itself: max_tokens, not the prompt
            return f"the prompt leaves no room for the {output} output tokens asked for (window {window})"
        if self._negative(text):
            return None
        if 413 in self.statuses:
            return "HTTP 413"
        for phrase in _ALL_PATTERNS:
            if phrase in text:
                return f"message contains {phrase!r}"
        for regex in OVERFLOW_REGEXES:
            if regex.search(text):
                return f"message matches {regex.pattern!r}"
        return None

    def _negative(self, text: str) -> bool:
        if self.statuses & NEGATIVE_STATUSES or self.codes & NEGATIVE_CODES:
            return True
        if any(phrase in text for phrase in NEGATIVE_PHRASES):
            return True
        return any(regex.search(text) for regex in NEGATIVE_REGEXES)


def _output_budget(text: str) -> tuple[int, int] | None:
    """The output tokens a request asked for and the window, when its error states both (rule 3)."""
    for regex in OUTPUT_BUDGET_REGEXES:
        match = regex.search(text)
        if match is not None:
            return int(match["output"].replace(",", "")), int(match["window"].replace(",", ""))
    return None


def _bounded(items: Iterable[_T]) -> Iterator[_T]:
    return islice(items, _MAX_ITEMS)


def _maybe_json(text: str) -> object:
    stripped = text.strip()
    if len(stripped) < 2 or stripped[0] not in "{[" or len(stripped) > _MAX_TEXT:
        # litellm often embeds the body after a prefix: "OpenAIException - {...}"
        start = text.find("{")
        if start <= 0 or len(text) - start > _MAX_TEXT:
            return None
        stripped = text[start:].strip()
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def _attr(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Exception:  # properties that raise (httpx.Response.text on a closed stream, ...)
        return None


def _safe_str(obj: object) -> str | None:
    try:
        return str(obj)
    except Exception:
        return None
