"""Counted nouns (runtime.wording): what the demo, the local provider and the summaries write."""

from __future__ import annotations

from runtime.wording import plural


def test_plural_agrees_with_the_count() -> None:
    assert plural(1, "tool call") == "1 tool call"
    assert plural(0, "tool call") == "0 tool calls"
    assert plural(2, "overflow recovery", "overflow recoveries") == "2 overflow recoveries"
    assert plural(1, "overflow recovery", "overflow recoveries") == "1 overflow recovery"
    assert plural(12_000, "message") == "12,000 messages"
