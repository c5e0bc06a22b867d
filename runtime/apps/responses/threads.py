"""Stateless clients' threads: which session a request that sends its whole history goes on with (pure, no I/O).

A client such as Codex keeps the conversation itself: every request carries all of it, with ``store: false``
and no ``previous_response_id``. Each such response leaves a :class:`Thread`: its session, the point it
ended at, and a fingerprint of everything the client will send back (its input, then its output as items,
read back as a client reads them). The next request whose input begins with exactly that history goes on
in that session from that point with only what is new, so the session's context management, prompt
caching and accounting see one conversation, not a fresh one per request.

A request is matched by its ``prompt_cache_key`` (when that thread's history is a prefix of its input), else
by the longest history that is a prefix of its input. Fingerprints are chained from the client's owner (a
digest of its credentials): one owner never continues another's thread. A thread is taken while a response
runs on it (a second request with the same history starts a session of its own), and the table holds at most
``limit`` threads, each for at most ``idle`` seconds unused: what falls out is handed back to be let go.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import msgspec

from runtime.messages import ImagePart, Message, ReasoningPart, TextPart, ToolCallPart

_encode = msgspec.json.Encoder()

DEFAULT_LIMIT: Final = 256
DEFAULT_IDLE: Final = 3600.0


def fingerprint(message: Message) -> bytes:
    """What a client sends back of ``message``: role, text, reasoning text, calls, the call a result answers
    (not ids of messages, nor the order of parts, nor signatures: a client's copy differs there)."""
    text = "".join(p.text for p in message.parts if isinstance(p, TextPart))
    reasoning = "".join(p.text for p in message.parts if isinstance(p, ReasoningPart))
    calls = [(c.id, c.name, c.arguments) for c in message.parts if isinstance(c, ToolCallPart)]
    images = [p.url for p in message.parts if isinstance(p, ImagePart)]
    canonical = [message.role, text, reasoning, calls, images, message.tool_call_id or ""]
    return hashlib.sha256(_encode.encode(canonical)).digest()


def chain(owner: str, messages: Sequence[Message]) -> list[bytes]:
    """The running digests of ``messages``: ``[d0, d1, ... dn]`` where ``d0`` is the owner's and ``dk``
    covers the first k messages."""
    digests = [hashlib.sha256(b"agentcell thread\0" + owner.encode()).digest()]
    for message in messages:
        digests.append(hashlib.sha256(digests[-1] + fingerprint(message)).digest())
    return digests


class Thread:
    """A session a stateless client's next request may go on with."""

    __slots__ = ("awaiting", "cache_key", "digest", "ephemeral", "leaf_id", "length", "session_id", "used")

    def __init__(
        self,
        *,
        session_id: str,
        leaf_id: str,
        digest: bytes,
        length: int,
        awaiting: Sequence[str] = (),
        cache_key: str | None = None,
        ephemeral: bool = True,
    ) -> None:
        self.session_id = session_id
        self.leaf_id = leaf_id
        self.digest = digest  # the chain's digest over the ``length`` messages the client holds
        self.length = length
        self.awaiting = list(awaiting)
        self.cache_key = cache_key
        self.ephemeral = ephemeral  # store: false: its session goes when the thread does
        self.used = time.monotonic()


class Threads:
    """The table of threads (most recently used last), bounded by ``limit`` and ``idle`` seconds."""

    def __init__(self, limit: int = DEFAULT_LIMIT, idle: float = DEFAULT_IDLE) -> None:
        self.limit = limit
        self.idle = idle
        self._by_digest: OrderedDict[bytes, Thread] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_digest)

    def take(self, digests: Sequence[bytes], cache_key: str | None) -> Thread | None:
        """The thread whose history is the longest prefix of the input (``digests``: its :func:`chain`),
        short of all of it, preferring the one of ``cache_key``; removed from the table while it runs."""
        found: Thread | None = None
        for length in range(len(digests) - 2, -1, -1):  # (at least one message must be new)
            thread = self._by_digest.get(digests[length])
            if thread is None or thread.length != length:
                continue
            if found is None:
                found = thread
            if cache_key is None or thread.cache_key == cache_key:
                found = thread
                break
        if found is not None:
            del self._by_digest[found.digest]
        return found

    def take_whole(self, digests: Sequence[bytes]) -> Thread | None:
        """The thread whose history is all of the input (``responses.compact``'s), removed."""
        thread = self._by_digest.get(digests[-1])
        if thread is None or thread.length != len(digests) - 1:
            return None
        return self._by_digest.pop(thread.digest)

    def put(self, thread: Thread) -> list[Thread]:
        """Keep ``thread`` (replacing one with the same history); the threads that fall out."""
        gone: list[Thread] = []
        old = self._by_digest.pop(thread.digest, None)
        if old is not None and old.session_id != thread.session_id:
            gone.append(old)
        thread.used = time.monotonic()
        self._by_digest[thread.digest] = thread
        gone.extend(self.expire())
        while len(self._by_digest) > self.limit:
            gone.append(self._by_digest.popitem(last=False)[1])
        return gone

    def expire(self, now: float | None = None) -> list[Thread]:
        """The threads unused for ``idle`` seconds, removed."""
        now = time.monotonic() if now is None else now
        gone: list[Thread] = []
        while self._by_digest:
            oldest = next(iter(self._by_digest.values()))
            if now - oldest.used < self.idle:
                break
            gone.append(self._by_digest.popitem(last=False)[1])
        return gone

    def drain(self) -> list[Thread]:
        gone = list(self._by_digest.values())
        self._by_digest.clear()
        return gone


def extend(digest: bytes, messages: Sequence[Message]) -> bytes:
    """The chain's digest after ``messages`` more, from ``digest``."""
    for message in messages:
        digest = hashlib.sha256(digest + fingerprint(message)).digest()
    return digest


def seed(owner: str, compaction: str | None) -> str:
    """What a stateless chain starts from: the owner (and the compaction its input starts with)."""
    if compaction is None:
        return owner
    return f"{owner}\0{compaction}"
