"""Events: a tagged union with session id, sequence number and timestamp (design §1.4, 5.10)."""

from __future__ import annotations

import msgspec
import pytest

from runtime import events as ev
from runtime.messages import Usage


def test_every_event_round_trips_through_json() -> None:
    for cls in ev.AnyEvent.__args__:  # type: ignore[attr-defined]
        fields = {}
        for f in msgspec.structs.fields(cls):
            if f.required and f.name != "session_id":
                fields[f.name] = _sample(f.type)
        event = cls(session_id="s1", seq=7, ts=1.5, **fields)
        data = ev.encode_event(event)
        decoded = ev.decode_event(data)
        assert decoded == event
        assert msgspec.json.decode(data)["type"] == event.type


def _sample(tp: object) -> object:
    if tp is int:
        return 3
    if tp is float:
        return 0.25
    if tp is bool:
        return True
    if tp is Usage:
        return Usage(input_tokens=1)
    args = getattr(tp, "__args__", ())
    if getattr(tp, "__origin__", None) is list:
        return [_sample(args[0])]
    if args and all(isinstance(a, str) for a in args):  # Literal
        return args[0]
    if args:
        return _sample(args[0])
    return "x"


def test_compaction_events_carry_the_spec_fields() -> None:
    start = ev.CompactionStart(session_id="s", trigger="overflow", messages_before=40, tokens_before=9000)
    end = ev.CompactionEnd(
        session_id="s",
        trigger="overflow",
        messages_before=40,
        messages_after=6,
        tokens_before=9000,
        tokens_after=1200,
        summary_chars=800,
        mode="summarize",
    )
    failed = ev.CompactionFailed(session_id="s", error="x", context_exceeded=True, tokens=10, window=8)
    as_dict = ev.event_to_builtins(end)
    assert as_dict["type"] == "compaction_end" and as_dict["tokens_after"] == 1200
    assert start.type == "compaction_start" and failed.type == "compaction_failed"


def test_events_are_left_out_of_the_garbage_collectors_count() -> None:
    """A cluster front decodes a thousand sessions' deltas a few milliseconds apart: counted, they set off a
    full collection of its heap every few seconds, which stops every stream's delivery meanwhile."""
    import gc

    from runtime.cluster._stream import PUSH, Push, _encoder, decode_push

    made = ev.McpServerStarted(session_id="s", server="fs", transport="stdio", tools=["fs__read"])
    decoded = ev.decode_event(ev.encode_event(made))
    assert not gc.is_tracked(made) and not gc.is_tracked(decoded)
    deltas = [ev.TextDelta(session_id="s", seq=n, turn_id="t", delta="x") for n in range(5_000)]
    frame = bytes((PUSH,)) + _encoder.encode(Push(1, deltas, [1] * len(deltas)))  # type: ignore[arg-type]
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        batch = decode_push(frame)
        assert len(batch.events) == 5_000
        # The batch and its lists, not an object an event (5,000 if events were counted); the count is the
        # process's, so other threads allocating meanwhile add a few dozen on a loaded machine.
        assert gc.get_count()[0] - before < 500
    finally:
        gc.enable()


def test_unknown_event_type_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError):
        ev.decode_event(b'{"type": "nope", "session_id": "s"}')


def test_event_types_lists_every_tag() -> None:
    assert {"compaction_start", "compaction_end", "usage_update", "subscriber_lagged"} <= ev.EVENT_TYPES


def test_each_event_is_declared_once_and_the_lists_come_from_the_declarations() -> None:
    import runtime

    declared = [
        obj
        for obj in vars(ev).values()
        if isinstance(obj, type) and issubclass(obj, ev.Event) and obj is not ev.Event
    ]
    assert list(ev.EVENTS) == declared  # every Event subclass of the module, in the order declared
    assert ev.AnyEvent.__args__ == ev.EVENTS  # type: ignore[attr-defined]  # what the decoders read
    names = [cls.wire_name() for cls in ev.EVENTS]
    assert len(set(names)) == len(names) and set(names) == ev.EVENT_TYPES
    classes = {cls.__name__ for cls in ev.EVENTS}
    assert classes <= set(ev.__all__) and classes <= set(runtime.__all__)
    assert all(getattr(runtime, name) is getattr(ev, name) for name in classes)


def test_the_transcript_dashboard_and_metrics_read_the_declarations() -> None:
    from runtime.apps.dashboard import STREAM_TYPES
    from runtime.observability import metrics
    from runtime.store import transcript

    idle = {"session_started", "session_stopped", "session_hibernated"}
    assert {cls.wire_name() for cls in ev.EVENTS if not cls.opens_transcript} == idle
    assert idle == transcript._IDLE_TYPES
    assert {"text_delta", "reasoning_delta", "tool_call_delta", "tool_output"} == ev.FRAGMENT_TYPES
    assert tuple(sorted(ev.EVENT_TYPES - ev.FRAGMENT_TYPES)) == STREAM_TYPES
    assert {
        "agent_start",
        "agent_end",
        "agent_abort",
        "request_start",
        "turn_end",
        "error",
        "provider_retry",
        "compaction_start",
        "compaction_end",
        "compaction_failed",
        "compaction_skipped",
        "tool_execution_end",
        "session_stopped",
    } == metrics.EVENT_TYPES


def test_every_event_is_documented_where_it_is_declared() -> None:
    """The class is the event's documentation (design §7.6): when it is emitted and what its fields mean."""
    missing = [cls.__name__ for cls in ev.EVENTS if not (cls.__doc__ or "").strip()]
    assert missing == []


def test_the_fields_the_docs_give_an_event_are_its_fields() -> None:
    """README and design name events with some of their fields (``compaction_end{tokens_after, ...}``): those
    are checked against the declarations, not kept as a second list."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    fields = {cls.wire_name(): {f.name for f in msgspec.structs.fields(cls)} for cls in ev.EVENTS}
    seen = 0
    for doc in ("README.md", "docs/design.md"):
        for match in re.finditer(r"`([a-z_]+)\{([^}`]*)\}", (root / doc).read_text(encoding="utf-8")):
            name = match.group(1)
            if name not in fields:
                continue
            named = [part.strip().split(":")[0].split("=")[0].strip() for part in match.group(2).split(",")]
            named = [n for n in named if n not in ("...", "…")]  # (some of its fields)
            assert set(named) <= fields[name], f"{doc}: {match.group(0)} names fields {name} does not have"
            seen += 1
    assert seen >= 10  # (the check reads what it means to)
