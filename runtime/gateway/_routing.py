"""Which transport serves a call, and where it goes."""

from __future__ import annotations

import msgspec

from runtime.gateway._models import CompletionRequest


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """Where a call goes: the transport and the provider (litellm's name for it)."""

    transport: str
    provider: str | None = None


class Router:
    """Resolves each request to a :class:`Route`."""

    def route(self, request: CompletionRequest) -> Route:
        provider = request.model.split("/", 1)[0] if "/" in request.model else None
        return Route(transport="litellm", provider=provider)
