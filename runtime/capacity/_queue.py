"""Fair queuing of the requests that wait for a pool: priorities first, then deficit round robin.

Requests wait in classes of :class:`Priority`, served strictly highest first (a compaction that unblocks a
turn, then a running turn's next step, then a new turn's first request, then background work). Within a
class each *flow* (a session, or whatever the caller groups by: a tenant) has its own FIFO, and the flows are
served by deficit round robin: each visit adds the flow's ``weight`` to its deficit, and a request costs 1, so
a flow of weight 2 is served twice as often as one of weight 1, and a flow with a thousand requests waiting
gets no more turns than one with one. One busy session cannot starve the others.

Pure and single-threaded; O(1) per push and pop, O(requests of the flow) to remove one.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Generic, Protocol, TypeVar

__all__ = ["FairQueue", "Priority", "Queued"]


class Priority(IntEnum):
    """Who goes first when a pool has capacity for one more request."""

    BACKGROUND = 0
    """Work no turn waits for (a manual compaction, summaries of old tool output)."""
    NEW_TURN = 1
    """The first request of a turn."""
    NEXT_STEP = 2
    """A running turn's next request (after its tools ran): finishing turns before starting new ones."""
    UNBLOCK = 3
    """A compaction a turn waits for."""


class Queued(Protocol):
    """What the queue needs of a waiting request."""

    @property
    def flow(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def weight(self) -> float: ...


Q = TypeVar("Q", bound=Queued)


@dataclass
class _Flow(Generic[Q]):
    items: deque[Q] = field(default_factory=deque)
    deficit: float = 0.0
    weight: float = 1.0


class _Class(Generic[Q]):
    """One priority class: its active flows in round-robin order (the front is served next)."""

    def __init__(self) -> None:
        self.flows: OrderedDict[str, _Flow[Q]] = OrderedDict()
        self.size = 0

    def front(self) -> _Flow[Q]:
        """The flow DRR serves next: visits flows, adding their weight, until one has a request's worth."""
        while True:
            name, flow = next(iter(self.flows.items()))
            if flow.deficit >= 1.0:
                return flow
            flow.deficit += flow.weight
            if flow.deficit >= 1.0:
                return flow
            self.flows.move_to_end(name)


class FairQueue(Generic[Q]):
    """Waiting requests by priority class, fair across flows within a class (see the module docstring)."""

    def __init__(self) -> None:
        self._classes: dict[int, _Class[Q]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def push(self, item: Q) -> None:
        cls = self._classes.get(item.priority)
        if cls is None:
            cls = self._classes[item.priority] = _Class()
        flow = cls.flows.get(item.flow)
        if flow is None:
            flow = cls.flows[item.flow] = _Flow(weight=max(1e-3, item.weight))
        flow.items.append(item)
        cls.size += 1
        self._size += 1

    def _top(self) -> _Class[Q] | None:
        best: _Class[Q] | None = None
        best_priority = 0
        for priority, cls in self._classes.items():
            if cls.size and (best is None or priority > best_priority):
                best, best_priority = cls, priority
        return best

    def head(self) -> Q | None:
        """The request served next (it stays the head until popped or removed)."""
        cls = self._top()
        return cls.front().items[0] if cls is not None else None

    def pop(self) -> Q:
        """Take the head. Raises IndexError when empty."""
        cls = self._top()
        if cls is None:
            raise IndexError("pop from an empty FairQueue")
        flow = cls.front()
        item = flow.items.popleft()
        flow.deficit -= 1.0
        self._taken(cls, item.flow, flow)
        return item

    def remove(self, item: Q) -> bool:
        """Take ``item`` out wherever it waits (it gave up); False if it is not queued."""
        cls = self._classes.get(item.priority)
        flow = cls.flows.get(item.flow) if cls is not None else None
        if cls is None or flow is None:
            return False
        try:
            flow.items.remove(item)
        except ValueError:
            return False
        self._taken(cls, item.flow, flow, served=False)
        return True

    def _taken(self, cls: _Class[Q], name: str, flow: _Flow[Q], *, served: bool = True) -> None:
        cls.size -= 1
        self._size -= 1
        if not flow.items:  # an idle flow keeps no credit (DRR)
            del cls.flows[name]
        elif served and flow.deficit < 1.0:  # its share of this round is spent: the next flow's turn
            cls.flows.move_to_end(name)

    def flows(self) -> int:
        """Flows with a request waiting."""
        return sum(len(cls.flows) for cls in self._classes.values())
