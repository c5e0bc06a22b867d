"""Observability (design §7.5): OpenTelemetry spans and Prometheus metrics.

    tracing.py   Tracing: invoke_agent / chat / execute_tool / compaction spans after the GenAI
                 semantic conventions, on ``opentelemetry-api`` only, made from the event bus
    content.py   ContentTap: the prompts and answers spans record with ``telemetry.record_content``
    genai.py     the GenAI semantic conventions' attribute names and message form, as the spans use them
    metrics.py   RuntimeMetrics: Prometheus metrics derived from the event bus (``Runtime.metrics()``,
                 ``GET /metrics`` of ``agentcell serve``)

Neither is imported unless it is used: :func:`tracing_for` decides whether a runtime traces without
importing OpenTelemetry when nothing in the process configured it, and ``prometheus_client`` is imported by
the first ``Runtime.metrics()``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from runtime.config import ConfigError, TelemetryConfig

if TYPE_CHECKING:
    from runtime.observability.tracing import Tracing

__all__ = ["sdk_configured", "tracing_for"]


def sdk_configured() -> bool:
    """Whether this process has set an OpenTelemetry tracer provider that records (an SDK's): False
    without importing anything when nobody imported ``opentelemetry.trace``."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return False
    provider = api.get_tracer_provider()
    return not isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider))


def tracing_for(config: TelemetryConfig, provider: Any = None, *, hold: float = 0.0) -> Tracing | None:
    """The runtime's :class:`Tracing`, or None when it does not trace.

    ``provider`` (a ``TracerProvider``) is used when given, unless ``telemetry.tracing = "off"``. Otherwise
    ``"auto"`` traces when an SDK's tracer provider is set globally when the runtime starts, and ``"on"``
    always traces on the global provider (one set later is used from then on). ``hold``: as ``Tracing``'s.
    """
    if config.tracing == "off":
        return None
    if provider is None and config.tracing == "auto" and not sdk_configured():
        return None
    try:
        from runtime.observability.tracing import Tracing
    except ImportError as exc:  # pragma: no cover - opentelemetry-api is a dependency
        raise ConfigError(
            f"telemetry.tracing needs the opentelemetry-api package (pip install opentelemetry-api): {exc}"
        ) from None
    return Tracing.for_provider(provider, record_content=config.record_content, hold=hold)
