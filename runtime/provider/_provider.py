"""What an endpoint of the local provider uses of the :class:`~runtime.provider.server.LocalProvider` that
builds it, declared as a ``Protocol``: the server module imports the endpoints, not the other way round."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from starlette.requests import Request

    from runtime.dialects._base import ErrorResponse
    from runtime.provider._faults import FaultPlayer
    from runtime.provider.limits import ProviderLimiter
    from runtime.provider.script import Fault, Turn
    from runtime.provider.usage import PromptCount, TokenCounter


class Provider(Protocol):
    """What an endpoint uses of its :class:`~runtime.provider.server.LocalProvider` (which builds it: the
    server module imports the endpoints, not the other way round)."""

    limiter: ProviderLimiter
    context_window: int
    overflow_format: str
    refuse_answer_overflow: bool
    prompt_ratio: float
    latency: float
    chunk_chars: int
    chunk_delay: float
    reasoning_field: str
    cache_min_tokens: int | None
    faults: FaultPlayer
    _counter: TokenCounter

    def _authorized(self, request: Request) -> bool: ...
    def _take_fault(self) -> Fault | None: ...
    def _window_of(self, model: str) -> int: ...
    def _record(
        self,
        request: Request,
        body: dict[str, Any],
        model: str,
        stream: bool,
        count: PromptCount | None,
        status: int,
        outcome: str,
        source: str,
        authorized: bool,
        received: float,
    ) -> None: ...
    def _next_turn(
        self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[Turn, str, ErrorResponse | None]: ...
