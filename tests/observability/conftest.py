"""Fixtures of the observability tests: a runtime whose spans go to an in-memory exporter."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.events import Event


class Seen:
    """Every event of a runtime, read off one subscription when asked. Every event of a turn is queued to
    each subscriber before the turn's handle resolves, so after ``handle.result()`` :meth:`of` sees them all
    (a callback subscriber might not have run for them yet)."""

    def __init__(self, runtime: Any) -> None:
        self.subscription = runtime.subscribe(queue_size=1_000_000)
        self.events: list[Event] = []

    def of(self, kind: str, session_id: str | None = None) -> list[Any]:
        self.events.extend(self.subscription.drain())
        return [
            e for e in self.events if e.type == kind and (session_id is None or e.session_id == session_id)
        ]

    def wait_type(self, kind: str, count: int = 1, timeout: float = 30.0) -> None:
        """Read events (blocking on the subscription) until ``count`` of type ``kind`` have come."""
        deadline = time.monotonic() + timeout
        while len(self.of(kind)) < count:
            event = self.subscription.get(timeout=max(0.0, deadline - time.monotonic()))
            if event is None:
                raise AssertionError(f"no {count} {kind} within {timeout} s: {[e.type for e in self.events]}")
            self.events.append(event)

    def close(self) -> None:
        self.subscription.close()


@pytest.fixture
def seen(rt: Any) -> Iterator[Seen]:
    """The events of the ``rt`` fixture's runtime, from its start."""
    events = Seen(rt)
    yield events
    events.close()


class Traced:
    """A runtime tracing to an in-memory exporter, and the events it publishes."""

    def __init__(self, runtime: Any, exporter: Any, provider: Any, recorder: Seen) -> None:
        self.rt = runtime
        self.exporter = exporter
        self.provider = provider
        self.recorder = recorder
        self.ended = threading.Condition()

    def wait_for(self, predicate: Callable[[list[Any]], bool], timeout: float = 30.0) -> list[Any]:
        """The finished spans, once ``predicate`` holds for them (woken by each span that ends)."""
        with self.ended:
            if not self.ended.wait_for(lambda: predicate(self.spans()), timeout):
                raise AssertionError(f"spans: {[s.name for s in self.spans()]}")
        return self.spans()

    def spans(self) -> list[Any]:
        """The spans ended so far, once the spans of every event published so far are made (they are
        made from the events, on a thread of their own: design §7.5)."""
        assert self.rt._machinery.tracing.flush(timeout=30)
        self.provider.force_flush()
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[Any]:
        return [s for s in self.spans() if s.name.startswith(prefix)]


@pytest.fixture
def traced(sessions_dir: Path) -> Iterator[Callable[..., Traced]]:
    """``traced(record_content=False, **config)``: a started runtime whose spans are kept in memory."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from runtime import Runtime
    from runtime.config import Config

    made: list[tuple[Any, Any]] = []

    class Notify(SimpleSpanProcessor):
        """Exports each span as it ends, then wakes whoever waits for spans."""

        def __init__(self, exporter: Any) -> None:
            super().__init__(exporter)
            self.traced: Traced | None = None

        def on_end(self, span: Any) -> None:
            super().on_end(span)
            if self.traced is not None:
                with self.traced.ended:
                    self.traced.ended.notify_all()

    def make(record_content: bool = False, **config: Any) -> Traced:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        processor = Notify(exporter)
        provider.add_span_processor(processor)
        cfg = Config().with_overrides(
            {
                "retry.base_delay": 0.01,
                "retry.max_delay": 0.05,
                "telemetry.record_content": record_content,
                **config,
            }
        )
        rt = Runtime(cfg, sessions_dir=sessions_dir / f"rt{len(made)}", tracer_provider=provider).start()
        recorder = Seen(rt)
        made.append((rt, recorder))
        processor.traced = Traced(rt, exporter, provider, recorder)
        return processor.traced

    yield make
    for rt, events in made:
        events.close()
        rt.stop()
