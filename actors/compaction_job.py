"""A compactor's job (design §5): one request (a compaction, a tool-result archive) from its view to its
answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from actors import protocol as p
from actors.protocol import CompactorJob, Outcome
from runtime.context.estimate import ContextEstimate
from runtime.messages import Usage

if TYPE_CHECKING:
    from runtime.gateway import CallHandle

__all__ = ["Job", "JobAnswer"]

JobAnswer: TypeAlias = "Outcome | p.ContextView | None"  # an Outcome, or MaybeArchiveTools' answer


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
    # A compaction's plan made again (its summarizer requests sized anew), once, after a refusal taught the
    # compactor the summarizer's count ratio or window; None for a job that is no compaction
    replan: Callable[[], Any] | None = None
    sized: tuple[float, int] = (1.0, 0)  # the count ratio and the window its requests were sized with
    refused: list[int] = field(default_factory=list)  # the requests the summarizer refused as too large
    retried: bool = False
