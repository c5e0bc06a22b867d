"""Fixtures of the observability tests: a runtime whose spans go to an in-memory exporter."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Recorder


class Traced:
    """A runtime tracing to an in-memory exporter, and a recorder of its events."""

    def __init__(self, runtime: Any, exporter: Any, provider: Any, recorder: Recorder) -> None:
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
        recorder = Recorder()
        sub = rt.subscribe(callback=recorder)
        made.append((rt, sub))
        processor.traced = Traced(rt, exporter, provider, recorder)
        return processor.traced

    yield make
    for rt, sub in made:
        sub.close()
        rt.stop()
