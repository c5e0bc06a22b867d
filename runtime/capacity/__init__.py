"""Admission control: many sessions sharing a provider key's limits (design §3.11).

The pure core, no actors and no I/O (the gateway's :mod:`runtime.gateway._admission` is its shell on the
I/O loop):

    _headers.py    what an answer says of the limits: OpenAI's x-ratelimit-*, Anthropic's
                   anthropic-ratelimit-*, retry-after(-ms)
    _pool.py       Pool: token buckets per limit (requests, tokens, input, output per minute) and the
                   requests in flight, configured and learned; 429 pauses; AIMD without headers
    _queue.py      FairQueue: strict priorities, deficit round robin across flows (sessions) by weight
    _grouping.py   which pool a call draws on, and its configured limits
"""

from runtime.capacity._grouping import GroupBy, pool_for
from runtime.capacity._headers import Dimension, RateLimitInfo, parse_duration, parse_rate_limit_headers
from runtime.capacity._pool import Limits, Pool, PoolStats, Ticket
from runtime.capacity._queue import FairQueue, Priority, Queued

__all__ = [
    "Dimension",
    "FairQueue",
    "GroupBy",
    "Limits",
    "Pool",
    "PoolStats",
    "Priority",
    "Queued",
    "RateLimitInfo",
    "Ticket",
    "parse_duration",
    "parse_rate_limit_headers",
    "pool_for",
]
