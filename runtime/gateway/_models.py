"""What goes into a provider call and what comes out of it: requests, results, errors, deltas, retries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from runtime.messages import Message, Usage

ErrorKind = Literal[
    "overflow",
    "rate_limit",
    "transient",
    "auth",
    "invalid_request",
    "timeout",
    "cancelled",
    "content_policy",
    "unknown",
]
RETRYABLE_KINDS: Final[frozenset[str]] = frozenset({"rate_limit", "transient", "timeout"})

TransportMode = Literal["auto", "litellm", "openai_compat"]
"""Which transport serves a call: ``auto`` (the native one where it does what litellm does), or one forced."""


class CompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One provider call. ``messages`` are ours (converted here) or already in the OpenAI chat format.

    ``api_key`` is never logged and never shown by ``repr``; keep requests out of events and the store.
    ``mock_response`` uses litellm's in-process fake instead of the network (tests, dry runs).
    ``transport`` picks the transport (``gateway.transport`` of the config; see :mod:`runtime.gateway`).
    """

    model: str
    messages: Sequence[Message | dict[str, Any]]
    tools: Sequence[dict[str, Any]] = ()
    api_base: str | None = None
    api_key: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    timeout: float = 600.0
    stream: bool = True
    include_reasoning: bool = True
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    mock_response: str | None = None
    transport: TransportMode = "auto"

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else "None"
        return (
            f"CompletionRequest(model={self.model!r}, messages=<{len(self.messages)}>, tools=<{len(self.tools)}>, "
            f"api_base={self.api_base!r}, api_key={key}, stream={self.stream}, transport={self.transport!r})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> Any:
        yield "model", self.model
        yield "messages", len(self.messages)
        yield "api_base", self.api_base
        yield "api_key", "***" if self.api_key else None


class ProviderError(msgspec.Struct, frozen=True, kw_only=True):
    """A failed provider call, classified. ``retryable`` says whether the gateway would retry it."""

    kind: ErrorKind
    message: str
    status_code: int | None = None
    code: str | None = None
    retry_after: float | None = None
    provider: str | None = None
    window: int | None = None  # the context window the error states (llama.cpp's n_ctx, "… is N tokens")

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    @property
    def is_overflow(self) -> bool:
        return self.kind == "overflow"


class CompletionResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a call produced: an assistant message (with usage and stop reason) or an error.

    ``transport`` names the transport that made the call (``litellm`` or ``openai_compat``; empty when
    it never started).
    """

    message: Message | None
    usage: Usage = msgspec.field(default_factory=Usage)
    error: ProviderError | None = None
    attempts: int = 0
    latency: float = 0.0
    transport: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.message is not None


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """A streamed piece: text, reasoning, or a tool call's (name and) argument fragment, by call index."""

    kind: Literal["text", "reasoning", "tool_call"]
    text: str = ""
    index: int = 0
    call_id: str | None = None
    name: str | None = None


class RetryInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Attempt ``attempt`` of ``max_attempts`` failed with ``error``; the next starts after ``delay`` s."""

    attempt: int
    max_attempts: int
    delay: float
    error: str
    status_code: int | None = None
    kind: ErrorKind = "transient"
