"""Anthropic's prompt caching, as the local provider's Messages endpoint applies it (design §7.3). Pure: the
clock is passed in.

A prompt is a chain of blocks (tools, then system blocks, then each message's content blocks); a block
marked ``cache_control`` is a breakpoint. Only a prefix that ends at a breakpoint is written, when it is at
least the model's minimum long; a lookup finds the longest unexpired prefix written earlier that ends at a
breakpoint of this request or at most :data:`~runtime.dialects.anthropic.LOOKBACK_BLOCKS` blocks before one.
A read refreshes the entry's time to live (5 minutes, or an hour when the breakpoint asked). A block's
identity is its content without the ``cache_control`` marker itself, so a breakpoint that moves does not
change the prefix before it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from runtime.dialects import anthropic


class Block(NamedTuple):
    """One block of a prompt: its identity (canonical bytes), its tokens, and its breakpoint's TTL (or None)."""

    key: bytes
    tokens: int
    mark: str | None = None


class CacheUse(NamedTuple):
    """How a request's prompt met the cache, in tokens."""

    read: int
    write_5m: int
    write_1h: int

    @property
    def write(self) -> int:
        return self.write_5m + self.write_1h


class PromptCache:
    """The prefixes written so far (by digest), each with its expiry; bounded, oldest dropped first."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._entries: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # digest -> (expiry, ttl)
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def use(self, blocks: Sequence[Block], *, min_tokens: int, now: float) -> CacheUse:
        """Look ``blocks`` up and write their breakpoints' prefixes; what was read and written."""
        digest = hashlib.blake2b(digest_size=16)
        digests: list[bytes] = []
        totals: list[int] = []
        running = 0
        for block in blocks:
            digest.update(len(block.key).to_bytes(8, "little"))
            digest.update(block.key)
            digests.append(digest.digest())
            running += block.tokens
            totals.append(running)
        marks = [i for i, block in enumerate(blocks) if block.mark is not None]
        read, hit = 0, -1
        for b in marks:
            for j in range(b, max(-1, b - anthropic.LOOKBACK_BLOCKS - 1), -1):
                entry = self._entries.get(digests[j])
                if entry is not None and entry[0] > now:
                    if totals[j] > read:
                        read, hit = totals[j], j
                    break
        if hit >= 0:
            self._refresh(digests[hit], now)
        write_5m = write_1h = 0
        done = read
        for b in marks:
            if totals[b] < min_tokens:
                continue
            ttl = blocks[b].mark or "5m"
            if totals[b] > done:
                if ttl == "1h":
                    write_1h += totals[b] - done
                else:
                    write_5m += totals[b] - done
                done = totals[b]
            self._store(digests[b], anthropic.TTL_SECONDS.get(ttl, 300.0), now)
        return CacheUse(read=read, write_5m=write_5m, write_1h=write_1h)

    def _refresh(self, key: bytes, now: float) -> None:
        expiry, ttl = self._entries[key]
        self._entries[key] = (max(expiry, now + ttl), ttl)
        self._entries.move_to_end(key)

    def _store(self, key: bytes, ttl: float, now: float) -> None:
        old = self._entries.get(key)
        longest = max(ttl, old[1]) if old is not None else ttl
        self._entries[key] = (now + longest, longest)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
