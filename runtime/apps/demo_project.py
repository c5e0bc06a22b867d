"""The project ``agentcell demo``'s sessions work on, and the coding task they are given, one prompt at a
time: an inventory library with a bug, its tests, pricing and reports."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DELEGATION", "PROJECT", "TASK", "write_project"]

# The project every session works on: an inventory module with a bug, its tests, pricing and reports.
PROJECT: dict[str, str] = {
    "README.md": """\
# stockroom

A tiny inventory library: items with a quantity and a unit price, restocking, and a value report.

- `inventory.py`: the `Item` and `Inventory` classes
- `pricing.py`: bulk discounts and tax
- `reports.py`: the text report
- `test_inventory.py`: the tests (run them with `python -m pytest`)

Bulk orders of at least `BULK_THRESHOLD` units get `BULK_DISCOUNT` off.
""",
    "inventory.py": '''\
"""Items and the inventory that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Item:
    """One stock-keeping unit."""

    sku: str
    name: str
    quantity: int
    unit_price: float

    def value(self) -> float:
        """What the units in stock are worth."""
        return self.quantity - self.unit_price

    def restock(self, units: int) -> None:
        """Add ``units`` to the stock; a negative number is a mistake, not a sale."""
        if units < 0:
            raise ValueError(f"cannot restock {units} units of {self.sku}")
        self.quantity += units

    def sell(self, units: int) -> None:
        """Take ``units`` out of the stock."""
        if units > self.quantity:
            raise ValueError(f"only {self.quantity} units of {self.sku} left, asked for {units}")
        self.quantity -= units


@dataclass
class Inventory:
    """All the items of one stockroom, by SKU."""

    items: dict[str, Item] = field(default_factory=dict)

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            raise KeyError(f"duplicate SKU {item.sku}")
        self.items[item.sku] = item

    def get(self, sku: str) -> Item:
        try:
            return self.items[sku]
        except KeyError:
            raise KeyError(f"unknown SKU {sku}") from None

    def low_stock(self, below: int = 5) -> list[Item]:
        """Items with fewer than ``below`` units, fewest first."""
        return sorted((i for i in self.items.values() if i.quantity < below), key=lambda i: i.quantity)

    def total_value(self) -> float:
        return sum(item.value() for item in self.items.values())
''',
    "pricing.py": '''\
"""Prices for orders: bulk discounts and tax."""

from __future__ import annotations

BULK_THRESHOLD = 100
BULK_DISCOUNT = 0.05
TAX_RATE = 0.2


def order_price(unit_price: float, units: int) -> float:
    """The price of ``units`` units before tax, with the bulk discount when it applies."""
    if units <= 0:
        raise ValueError("an order has at least one unit")
    price = unit_price * units
    if units >= BULK_THRESHOLD:
        price *= 1 - BULK_DISCOUNT
    return round(price, 2)


def with_tax(amount: float) -> float:
    """``amount`` with tax added, rounded to cents."""
    return round(amount * (1 + TAX_RATE), 2)


def quote(unit_price: float, units: int) -> dict[str, float]:
    """A quote a customer can read: net, tax and gross."""
    net = order_price(unit_price, units)
    gross = with_tax(net)
    return {"net": net, "tax": round(gross - net, 2), "gross": gross}
''',
    "reports.py": '''\
"""The stock report."""

from __future__ import annotations

from inventory import Inventory
from pricing import with_tax


def stock_report(inventory: Inventory) -> str:
    """One line per item, the low-stock warnings, and the total value with tax."""
    lines = []
    for item in sorted(inventory.items.values(), key=lambda i: i.sku):
        lines.append(f"{item.sku:<8} {item.name:<20} {item.quantity:>5} x {item.unit_price:>8.2f}")
    low = inventory.low_stock()
    if low:
        lines.append("")
        lines.append("low stock: " + ", ".join(f"{i.sku} ({i.quantity})" for i in low))
    lines.append("")
    lines.append(f"total value (with tax): {with_tax(inventory.total_value()):.2f}")
    return "\\n".join(lines)
''',
    "test_inventory.py": """\
import pytest

from inventory import Inventory, Item
from pricing import order_price, quote


def make() -> Inventory:
    inventory = Inventory()
    inventory.add(Item("A-1", "bolt", 40, 0.25))
    inventory.add(Item("B-2", "bracket", 3, 4.00))
    return inventory


def test_value_is_quantity_times_price() -> None:
    assert make().get("A-1").value() == 10.0


def test_total_value() -> None:
    assert make().total_value() == 22.0


def test_restock_and_sell() -> None:
    item = make().get("B-2")
    item.restock(7)
    item.sell(4)
    assert item.quantity == 6
    with pytest.raises(ValueError):
        item.sell(100)


def test_low_stock() -> None:
    assert [i.sku for i in make().low_stock()] == ["B-2"]


def test_bulk_discount() -> None:
    assert order_price(1.0, 100) == 95.0
    assert quote(1.0, 10) == {"net": 10.0, "tax": 2.0, "gross": 12.0}
""",
}

# The coding task, one prompt at a time. The policy reads every file a prompt names, edits when asked
# (``replace "old" with "new"`` is an exact edit), and answers with what it did.
TASK: tuple[str, ...] = (
    "List the directory so we know what the project holds.",
    "Read inventory.py and test_inventory.py: why does test_value_is_quantity_times_price fail?",
    'Fix inventory.py: replace "quantity - self" with "quantity * self".',
    "Read pricing.py and reports.py and tell me how the bulk discount reaches the report.",
    'In pricing.py replace "BULK_DISCOUNT = 0.05" with "BULK_DISCOUNT = 0.08".',
    "Update README.md to mention that the bulk discount is now 8 percent.",
    "Read test_inventory.py again: which assertion of test_bulk_discount needs a new number?",
    'Fix test_inventory.py: replace "order_price(1.0, 100) == 95.0" with "order_price(1.0, 100) == 92.0".',
    "Read inventory.py and reports.py once more and check the report uses the value method.",
    "Edit reports.py to note that item values come from the value method of each item.",
)

DELEGATION = "Delegate to a sub-agent: read inventory.py and say which classes it defines."
"""The lead session's prompt: it hands a reading task to a sub-agent."""


def write_project(workspace: Path) -> None:
    """Write the project into ``workspace`` (a new folder)."""
    workspace.mkdir(parents=True)
    for name, text in PROJECT.items():
        (workspace / name).write_text(text, encoding="utf-8")
