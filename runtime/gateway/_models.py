"""What goes into a provider call and what comes out of it: requests, results, errors, deltas, retries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from runtime.dialects import ErrorKind as ErrorKind
from runtime.messages import Message, Usage

RETRYABLE_KINDS: Final[frozenset[str]] = frozenset({"rate_limit", "transient", "timeout"})


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """Who asks for capacity (design §3.11): the flow the fair queue serves it in (its session), its
    priority (:class:`runtime.capacity.Priority`) and weight, its exact input tokens, and how long it may wait
    for capacity (the rest of its turn's ``capacity.queue_timeout``; None: all of it)."""

    flow: str = ""
    priority: int = 1
    weight: float = 1.0
    input_tokens: int = 0
    wait_budget: float | None = None


CacheTTL = Literal["5m", "1h"]


class CacheHints(msgspec.Struct, frozen=True, kw_only=True):
    """Where a request's cacheable prefixes end (design §4.7), in no provider's dialect.

    The runtime places them (:func:`runtime.context.caching.place_breakpoints`); each transport renders
    them in its provider's terms: ``cache_control`` for the providers that cache only where a request marks
    it (Anthropic, also on Bedrock and Vertex), ``prompt_cache_key`` for OpenAI-style automatic caching.
    """

    breakpoints: tuple[int, ...] = ()
    """Positions in ``request.messages`` (the list as given, ascending): a cached prefix ends with that
    message (rendered on its last content block). With ``tools``, at most 4 in all."""
    tools: bool = False
    """A breakpoint on the last tool definition (when there is no system message to mark)."""
    key: str | None = None
    """``prompt_cache_key`` for OpenAI-style providers (the session id: requests that share it share a
    cache machine)."""
    ttl: CacheTTL = "5m"
    """How long a written prefix lives (Anthropic: 5 minutes, or 1 hour at twice the write price)."""


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
    admission: Admission | None = None
    cache: CacheHints | None = None

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
    prompt_tokens: int | None = None  # an overflow's count of the prompt, as the server states it

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
    waited: float = 0.0
    """Seconds the call waited for capacity (design §3.11), in all its attempts."""
    pool: str = ""
    """The capacity pool it drew on (empty when admission control is off)."""

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
