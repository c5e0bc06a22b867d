"""A compactor's job (design §5): one request (a compaction, a tool-result archive) from its view to its
answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from actors import protocol as p
from actors.protocol import CompactorJob, Outcome
from runtime.context.estimate import ContextEstimate
from runtime.messages import Message, Usage

if TYPE_CHECKING:
    from runtime.events import CompactionTrigger
    from runtime.gateway import CallHandle

__all__ = ["Job", "JobAnswer"]

JobAnswer: TypeAlias = "Outcome | p.ContextView | None"  # an Outcome, or MaybeArchiveTools' answer
PlanInputs: TypeAlias = "tuple[list[Message], CompactionTrigger, bool, int | None, str | None]"


@dataclass
class Job:
    """One request to the compactor, from the view it starts from to its answer (``reply``, or ``fail``
    when the compactor stops first)."""

    id: int
    request: CompactorJob
    reply: Callable[[JobAnswer], None]
    fail: Callable[[str], None]
    view: Any = None  # the ContextView the job started from (set before anything reads it)
    estimate: ContextEstimate | None = None
    plan: Any = None
    answers: list[str | None] = field(default_factory=list)
    outstanding: int = 0
    tokens_before: int = 0  # the full count before (design §4.2): every event of the compaction reports it
    artifacts: list[str] = field(default_factory=list)
    calls: list[CallHandle] = field(default_factory=list)  # the summarizer calls in flight
    number: int = 0  # the compaction's number in its artifacts' names
    spent: Usage = field(default_factory=Usage)  # what its summarizer calls cost (design §4.1)
    # What a compaction's plan is made from (its messages, trigger, emergency, keep, instructions), to make it
    # again (its summarizer requests sized anew) once a refusal taught the compactor the summarizer's count
    # ratio or window; None for a job that is no compaction. (Data, not a closure over the job: a job that
    # held a function holding the job was a cycle, freed only by the collector, and a long session kept
    # ~50 bytes a turn more: tests/scenarios/test_long_session.py.)
    planned_from: PlanInputs | None = None
    sized: tuple[float, int] = (1.0, 0)  # the count ratio and the window its requests were sized with
    refused: list[int] = field(default_factory=list)  # the requests the summarizer refused as too large
    retried: bool = False
