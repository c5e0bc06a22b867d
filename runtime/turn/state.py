"""The states of an agent and the record of one turn (design §3.1). Pure data.

idle ──prompt──▶ running ──request──▶ streaming (⇄ queued) ──tool calls──▶ executing_tools ──▶ running
  ▲                 │                      │                                                   │
  └──── agent_end ◀─┴──── final answer ◀───┘◀───────────────── next request ◀──────────────────┘
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

import msgspec

from runtime.errors import RuntimeStateError
from runtime.messages import Message, ToolCallPart, Usage, new_id

__all__ = [
    "TRANSITIONS",
    "AgentState",
    "Handover",
    "IllegalTransition",
    "OptionsLike",
    "PromptLike",
    "TakenUpPrompt",
    "TurnState",
]


class AgentState(StrEnum):
    """What the agent is doing; every change is a ``status_update`` event."""

    IDLE = "idle"
    RUNNING = "running"
    STREAMING = "streaming"
    QUEUED = "queued"  # the step's call waits for capacity of its provider key (design §3.11)
    EXECUTING_TOOLS = "executing_tools"


# The legal moves (see the module docstring). Any other is a bug: it raises, the agent crashes, and its
# supervisor restarts it from the log.
TRANSITIONS: Final[dict[AgentState, frozenset[AgentState]]] = {
    AgentState.IDLE: frozenset({AgentState.RUNNING}),
    AgentState.RUNNING: frozenset({AgentState.STREAMING, AgentState.EXECUTING_TOOLS, AgentState.IDLE}),
    AgentState.STREAMING: frozenset({AgentState.RUNNING, AgentState.IDLE, AgentState.QUEUED}),
    AgentState.QUEUED: frozenset({AgentState.STREAMING, AgentState.RUNNING, AgentState.IDLE}),
    AgentState.EXECUTING_TOOLS: frozenset({AgentState.RUNNING, AgentState.IDLE}),
}


class IllegalTransition(RuntimeStateError):
    """The agent was asked to move between two states the state machine does not link."""


class OptionsLike(Protocol):
    """What a client that keeps part of a turn on its side asks of it (``actors.protocol.TurnOptions``)."""

    @property
    def client_tools(self) -> tuple[dict[str, Any], ...]: ...
    @property
    def instructions(self) -> str | None: ...
    @property
    def compaction(self) -> bool: ...
    @property
    def parallel_tool_calls(self) -> bool: ...
    @property
    def client_tool_names(self) -> frozenset[str]: ...
    def answer_cap(self, runtime_cap: int | None) -> int | None: ...
    def extra(self, *, tools: bool) -> dict[str, Any]: ...


class _HandleLike(Protocol):
    """A prompt's handle: its id; its driver answers it (the machine only says with what)."""

    @property
    def id(self) -> str: ...
    def set_result(self, value: Any) -> None: ...
    def set_exception(self, exc: BaseException) -> None: ...


class PromptLike(Protocol):
    """A user's prompt (``actors.protocol.Prompt``): what it records, how it runs, and its handle."""

    @property
    def handle(self) -> _HandleLike: ...
    @property
    def message(self) -> Message: ...
    @property
    def steer(self) -> bool: ...
    @property
    def options(self) -> OptionsLike | None: ...
    @property
    def inputs(self) -> tuple[Message, ...]: ...


class _NoOptions(msgspec.Struct, frozen=True):
    client_tools: tuple[dict[str, Any], ...] = ()
    instructions: str | None = None
    compaction: bool = True
    parallel_tool_calls: bool = True

    @property
    def client_tool_names(self) -> frozenset[str]:
        return frozenset()

    def answer_cap(self, runtime_cap: int | None) -> int | None:
        return runtime_cap

    def extra(self, *, tools: bool) -> dict[str, Any]:
        return {}


_DEFAULT_OPTIONS: Final = _NoOptions()


@dataclass(frozen=True)
class TakenUpPrompt:
    """The prompt of a turn taken up from the log after its process stopped (design §3.12): its message as
    the model sees it, and a new handle under the original prompt's id."""

    message: Message
    handle: Any
    steer: bool = False
    options: OptionsLike | None = None

    @property
    def inputs(self) -> tuple[Message, ...]:
        return (self.message,)


@dataclass
class TurnState:
    """The record of one prompt's turn (one or more provider calls with tools between them): everything
    the machine decides from, and what a successor needs to take the turn up (:class:`Handover`)."""

    prompt: PromptLike
    turn_id: str = field(default_factory=new_id)
    step: int = 0
    usage: Usage = field(default_factory=Usage)
    overflow_recoveries: int = 0  # emergency compactions of this turn: after an overflow, or to prevent one
    compacted: bool = False  # the turn had its automatic (threshold) compaction: no second one (design §5.13)
    step_results: tuple[Message, ...] = ()  # the newest step's tool results, as the tools returned them
    saved: dict[str, tuple[str, str]] = field(default_factory=dict)  # result id -> full text's path, SHA-256
    reclipped: bool = False  # the newest step's results were clipped again to fit after compaction
    continued: bool = False  # the turn was cut off by a crash of the agent and taken up by its successor
    joined: list[PromptLike] = field(default_factory=list)  # steering messages applied to this turn
    child_input_tokens: int = 0  # what its sub-agents sent, counted against its spend guard (design §3.10)
    synced: bool = False  # the last message was appended with end_turn: the log is made durable already
    awaiting: tuple[ToolCallPart, ...] = ()  # the client tool calls the turn stops for (TurnOptions)
    message_id: str | None = None  # the id the current step's answer gets (announced by request_start)
    estimated_tokens: int = 0
    counted_tokens: int = 0  # the part of estimated_tokens counted here (not the provider's own count)
    waited: float = 0.0  # seconds its calls waited for capacity (against capacity.queue_timeout)
    queued_pool: str = ""  # the pool its current call waits for
    last_message: Message | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def options(self) -> OptionsLike:
        """The prompt's options, or the defaults."""
        return self.prompt.options or _DEFAULT_OPTIONS


@dataclass
class Handover:
    """What a crashed agent leaves its successor: the turn it was in and the prompts queued behind it, so
    the turn goes on from the log instead of failing (:meth:`TurnMachine.recover`)."""

    run: TurnState | None
    queue: list[PromptLike]
