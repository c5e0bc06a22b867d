"""The fair queue (runtime.capacity._queue): strict priorities, deficit round robin by weight."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import count

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.capacity import FairQueue, Priority

_ids = count()


@dataclass(eq=False)
class Item:
    flow: str
    priority: int = Priority.NEW_TURN
    weight: float = 1.0
    id: int = field(default_factory=lambda: next(_ids))


def test_a_busy_flow_does_not_starve_the_others() -> None:
    q: FairQueue[Item] = FairQueue()
    for _ in range(100):
        q.push(Item("busy"))
    for name in ("a", "b", "c"):
        q.push(Item(name))
    served = [q.pop().flow for _ in range(8)]
    assert set(served[:4]) == {"busy", "a", "b", "c"}  # the three quiet ones within the first round
    assert served[4:] == ["busy"] * 4


def test_priorities_are_strict_and_fifo_within_a_flow() -> None:
    q: FairQueue[Item] = FairQueue()
    new = [Item("s1", Priority.NEW_TURN) for _ in range(3)]
    step = Item("s2", Priority.NEXT_STEP)
    unblock = Item("s3", Priority.UNBLOCK)
    background = Item("s4", Priority.BACKGROUND)
    for item in (background, *new, step, unblock):
        q.push(item)
    assert [q.pop() for _ in range(6)] == [unblock, step, *new, background]
    assert not q and q.head() is None


def test_weights_share_the_service() -> None:
    q: FairQueue[Item] = FairQueue()
    for _ in range(300):
        q.push(Item("heavy", weight=3.0))
        q.push(Item("light", weight=1.0))
    served = Counter(q.pop().flow for _ in range(200))
    assert served["heavy"] == 150 and served["light"] == 50


def test_remove_takes_out_exactly_that_item() -> None:
    q: FairQueue[Item] = FairQueue()
    items = [Item(f"f{i % 3}") for i in range(9)]
    for item in items:
        q.push(item)
    assert q.remove(items[4]) and not q.remove(items[4])
    rest = [q.pop() for _ in range(8)]
    assert items[4] not in rest and sorted(i.id for i in rest) == sorted(
        i.id for i in items if i is not items[4]
    )
    assert len(q) == 0 and q.flows() == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=2, max_size=6),
    st.integers(1, 60),
)
def test_backlogged_flows_of_equal_weight_are_served_within_one_of_each_other(
    flows: list[tuple[int, int]], pops: int
) -> None:
    """Every flow that still has requests waiting has been served as often as any other, give or take one."""
    q: FairQueue[Item] = FairQueue()
    sizes = {f"f{i}": size for i, (_, size) in enumerate(flows)}
    for name, size in sizes.items():
        for _ in range(size):
            q.push(Item(name))
    served: Counter[str] = Counter()
    for _ in range(min(pops, len(q))):
        served[q.pop().flow] += 1
        waiting = [n for n in sizes if served[n] < sizes[n]]
        if waiting:
            counts = [served[n] for n in waiting]
            assert max(counts) - min(counts) <= 1
