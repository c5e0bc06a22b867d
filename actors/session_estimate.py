"""A session's context estimate (design §4.2), as its agent and its compactor make it from a store view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors import protocol as p
from actors.wiring import SessionSpec
from runtime.context.estimate import ContextEstimate, estimate_context
from runtime.messages import Message
from runtime.tokens import TokenCounter

__all__ = ["SessionEstimate"]


class SessionEstimate:
    """A session's context estimate (design §4.2): the input size of a request made from a store view now.

    The agent uses it to see whether a request can go out at once; the compactor, to decide and to
    report. The system prompt and tools are counted once; messages through the counter's cache.
    """

    def __init__(self, spec: SessionSpec, counter: TokenCounter) -> None:
        self._spec = spec
        self._counter = counter
        self._count = counter.count_message
        self._system_tokens = counter.count_system(spec.system_prompt) if spec.system_prompt else 0
        self._tools: Any = None
        self._tools_count = 0

    @property
    def _tools_tokens(self) -> int:
        """The tool schemas' tokens, counted again when the session's registry is replaced (its MCP
        servers' tools arrived or changed)."""
        tools = self._spec.tools
        if tools is not self._tools:
            self._tools_count = self._counter.count_tools(tools.schemas()) if len(tools) else 0
            self._tools = tools
        return self._tools_count

    @property
    def fixed_tokens(self) -> int:
        """What every request costs before its messages: the system prompt and the tool schemas."""
        return self._system_tokens + self._tools_tokens

    def full(self, messages: Sequence[Message]) -> int:
        """A full count of a request made from ``messages``: no provider usage to anchor on."""
        return self.fixed_tokens + sum(self._count(m) for m in messages if m.agent_visible)

    def __call__(self, view: p.ContextView) -> ContextEstimate:
        return estimate_context(
            view.messages,
            count=self._count,
            system_tokens=self._system_tokens,
            tools_tokens=self._tools_tokens,
            usage_floor=view.usage_floor,
        )
