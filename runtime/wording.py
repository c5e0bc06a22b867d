"""Counted nouns in what agentcell prints and writes: "1 compaction", "2 compactions", never "compaction(s)"."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, singular: str, plural: str | None = None) -> str:
    """``count`` (thousands separated) and the noun form that agrees with it.

    ``plural(1, "tool call")`` is ``"1 tool call"``, ``plural(3, "recovery", "recoveries")`` is
    ``"3 recoveries"``; the plural defaults to ``singular + "s"``. Zero takes the plural, as in English.
    """
    return f"{count:,} {singular if count == 1 else plural or singular + 's'}"
