"""How turns, messages and events cross between a shard and the front: msgpack, one encoder and decoders
built once (msgspec's idiom). Everything else crosses as Ray pickles it.

Also makes :class:`~runtime.store.log.CorruptLogError` picklable (its constructor takes three arguments,
which ``Exception``'s pickling does not pass back), so that a shard's error reaches the front as itself.
"""

from __future__ import annotations

import copyreg
from typing import Any, TypeVar

import msgspec

from runtime.events import AnyEvent, Event
from runtime.handles import CompactionResult, TurnResult
from runtime.messages import Message
from runtime.store.log import CorruptLogError

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_events = msgspec.msgpack.Decoder(list[AnyEvent])
_turn = msgspec.msgpack.Decoder(TurnResult)
_compaction = msgspec.msgpack.Decoder(CompactionResult)
_messages = msgspec.msgpack.Decoder(list[Message])


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def encode_events(events: list[Event]) -> bytes:
    return _encoder.encode(events)


def decode_events(data: bytes) -> list[Event]:
    return list(_events.decode(data))


def decode_turn(data: bytes) -> TurnResult:
    return _turn.decode(data)


def decode_compaction(data: bytes) -> CompactionResult:
    return _compaction.decode(data)


def decode_messages(data: bytes) -> list[Message]:
    return _messages.decode(data)


def decode_turn_options(data: bytes) -> Any:
    """An ``actors.protocol.TurnOptions``, or None (imported here: the front need not import the actors)."""
    global _options
    if _options is None:
        from actors.protocol import TurnOptions

        _options = msgspec.msgpack.Decoder(TurnOptions | None)
    return _options.decode(data)


_options: Any = None


def _reduce_corrupt_log(exc: CorruptLogError) -> tuple[Any, ...]:
    return (CorruptLogError, (exc.path, exc.line, exc.reason))


copyreg.pickle(CorruptLogError, _reduce_corrupt_log)
