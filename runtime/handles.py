"""Handles returned by the public API: wait on them from a thread, or await them from asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Generator, Mapping
from typing import Any, Generic, Literal, TypeVar

import msgspec

from runtime.messages import Message, ToolCallPart, Usage

__all__ = ["CompactionResult", "Handle", "PromptHandle", "TurnResult", "TurnStatus", "UsageReport"]


T = TypeVar("T")


class Handle(Generic[T]):
    """The outcome of an operation that completes later.

    ``handle.result(timeout)`` blocks the calling thread; ``await handle`` suspends a coroutine without
    blocking its event loop. Completed exactly once by the runtime.
    """

    __slots__ = ("_future", "id")

    def __init__(self, id: str = "") -> None:
        self.id = id
        self._future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def result(self, timeout: float | None = None) -> T:
        """Wait for the outcome; raises ``TimeoutError`` if it does not come within ``timeout`` seconds."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no result within {timeout} s") from None

    def done(self) -> bool:
        return self._future.done()

    def __await__(self) -> Generator[Any, None, T]:
        return asyncio.wrap_future(self._future).__await__()

    def add_done_callback(self, fn: Any) -> None:
        self._future.add_done_callback(lambda _f: fn(self))

    # completion, used by the runtime -------------------------------------------------------------
    def set_result(self, value: T) -> None:
        if not self._future.done():
            self._future.set_result(value)

    def set_exception(self, exc: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(exc)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<{type(self).__name__} {self.id or ''} {state}>"


TurnStatus = Literal["ok", "aborted", "error"]


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a prompt produced: the final assistant message, the run's usage, and how it ended."""

    prompt_id: str
    status: TurnStatus
    message: Message | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    steps: int = 0
    error: str | None = None
    awaiting: tuple[ToolCallPart, ...] = ()
    """The client tool calls the run stopped for (``TurnOptions.client_tools``): send their results, as
    ``tool`` messages, to go on."""

    @property
    def text(self) -> str:
        return self.message.text if self.message is not None else ""


class PromptHandle(Handle[TurnResult]):
    """Returned by ``Runtime.prompt``: resolves to a :class:`TurnResult` when the prompt's run ends."""


class CompactionResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a compaction did: ``compacted``; or ``skipped`` when there was nothing to reduce (no failure:
    the conversation is unchanged; ``reason`` says why); or neither, a failure, with ``reason``.
    ``tokens_before`` is the figure its ``compaction_start`` event reported."""

    compacted: bool
    skipped: bool = False
    reason: str | None = None
    messages_before: int = 0
    messages_after: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    summary_chars: int = 0
    fallback: bool = False


class UsageReport(msgspec.Struct, frozen=True, kw_only=True):
    """A session's usage with its sub-agents': ``own`` (its own calls), ``children`` (each sub-agent's
    total, its own sub-agents rolled in) and ``total`` (all of it)."""

    own: Usage
    children: dict[str, Usage]
    total: Usage

    @classmethod
    def of(cls, own: Usage, children: Mapping[str, Usage]) -> UsageReport:
        total = own
        for usage in children.values():
            total = total + usage
        return cls(own=own, children=dict(children), total=total)
