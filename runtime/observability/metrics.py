"""Prometheus metrics of a runtime (design §7.5), derived from its event bus.

:class:`RuntimeMetrics` subscribes once to every session's events of the types it counts (no deltas) and
turns them into counters, gauges and histograms. Nothing on the runtime's hot path calls it: publishing an
event appends it to the subscription's queue as for any subscriber, and the queue is drained in batches,
once a second by a thread of its own and at every scrape (so a scrape sees every event published before
it). Durations come from the events' own timestamps, so a batch drained late measures the same.

The metrics (``agentcell_`` prefix)::

    sessions_hosted                 gauge      sessions the runtime hosts (awake or hibernated)
    sessions_running                gauge      sessions with a turn in progress
    turns_total{status}             counter    finished turns: ok, aborted, error
    turn_duration_seconds           histogram  agent_start to agent_end
    provider_calls_total{model, outcome}  counter  a turn's provider calls: ok, overflow, cancelled, or
                                               the error kind (rate_limit, transient, timeout, auth, ...)
    provider_call_duration_seconds  histogram  request_start to the call's end, its retries included
    provider_retries_total          counter    failed attempts that were retried (summarizer calls too)
    tokens_total{model, type}       counter    input, output, cache_read, cache_write, reasoning
    cost_usd_total{model}           counter    where litellm knows the model's prices
    cost_split_usd_total{model, type}  counter  input, cache_read, cache_write, output (priced from litellm's map)
    cache_saved_usd_total{model}    counter    what the cache saved against the same calls without it
    compactions_total{trigger, result}   counter    compacted, skipped (nothing to reduce) or failed
    overflow_recoveries_total{trigger, cause, result}  counter  compactions after an overflow (trigger
                                               overflow; cause refused: the provider refused the request,
                                               counted: counted over the limit, not sent) or a silent one
                                               (usage_overflow; cause none)
    tool_calls_total{outcome}       counter    ok or error
    tool_call_duration_seconds      histogram
    event_bus_dropped_events_total  counter    events lost by subscribers that fell behind (all of them)
    capacity_*{pool, shard}         the capacity pools (design §3.11): queued, running, limits, refused,
                                               admitted calls and tokens, wait histogram (capacity_metrics.py)

Label values are bounded, whatever clients send (a model name is free text): ``model`` is a model the host
configured (``agent.model``, ``compaction.summarizer_model``, the ``models.*`` tables, agent profiles) or
one that answered a provider call successfully, at most ``telemetry.metrics_max_models`` of them; every other
model is counted as ``other`` (so a call that fails for a model not seen working yet is counted under
``other``). ``outcome`` is bounded the same way. A scrape is then a few hundred series at most.

``RuntimeMetrics`` is a collector: ``metrics.registry`` holds it alone (``prometheus_client.generate_latest
(metrics.registry)``), and it can be registered in another registry too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from runtime import events as ev
from runtime.errors import RuntimeStateError
from runtime.observability.capacity_metrics import capacity_families

__all__ = [
    "EVENT_TYPES",
    "OTHER",
    "BoundedLabels",
    "MetricsUnavailable",
    "RuntimeMetrics",
    "ServedMetrics",
    "configured_models",
]

log = logging.getLogger("agentcell.metrics")

TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CALL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)
_OVERFLOW_TRIGGERS = ("overflow", "usage_overflow")

_Rule = TypeVar("_Rule", bound=Callable[..., None])
_RULES: dict[type[ev.Event], Callable[[Any, Any], None]] = {}
"""Each event type the metrics count -> its rule (a method of :class:`RuntimeMetrics`)."""


def _counts(kind: type[ev.Event]) -> Callable[[_Rule], _Rule]:
    """Declares a method of :class:`RuntimeMetrics` the rule for events of ``kind``: the metrics subscribe
    to the types that have a rule (:data:`EVENT_TYPES`), so a new metric of an event is its rule alone."""

    def register(rule: _Rule) -> _Rule:
        _RULES[kind] = rule
        return rule

    return register


OTHER = "other"
"""The label value of every model (or outcome) past the bound."""
MAX_OUTCOMES = 32


class BoundedLabels:
    """Label values from a bounded set: the ``known`` ones, and up to ``cap`` more admitted as they prove
    themselves (:meth:`label` with ``admit``); everything else is :data:`OTHER`. Not thread-safe."""

    def __init__(self, cap: int, known: Iterable[str] = ()) -> None:
        self._known = frozenset(known)
        self._admitted: set[str] = set()
        self._cap = cap

    def label(self, value: str, *, admit: bool) -> str:
        if value in self._known or value in self._admitted:
            return value
        if admit and len(self._admitted) < self._cap:
            self._admitted.add(value)
            return value
        return OTHER


def configured_models(runtime: Any) -> set[str]:
    """The models ``runtime``'s host configured: its default, summarizer, ``models.*`` tables and profiles."""
    config = getattr(runtime, "config", None)
    if config is None:
        return set()
    models = {config.agent.model, *config.models.context_windows, *config.models.max_output_tokens}
    if config.compaction.summarizer_model:
        models.add(config.compaction.summarizer_model)
    profiles = {**config.agents, **(getattr(runtime, "agents", None) or {})}
    models.update(p.model for p in profiles.values() if getattr(p, "model", None))
    return models


class MetricsUnavailable(RuntimeStateError):
    """The metrics cannot be had: ``prometheus-client`` is missing, or the runtime is not running."""


def _load() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable(
            "metrics need the prometheus-client package: pip install prometheus-client"
        ) from None
    return prometheus_client


class RuntimeMetrics:
    """The Prometheus metrics of ``runtime`` (a ``Runtime`` or a ``ClusterRuntime``), counted from now on.

    ``interval``: seconds between background drains of the event queue. ``queue_size``: the subscription's
    bound; events beyond it between two drains are lost to the metrics (and counted as dropped).
    """

    def __init__(self, runtime: Any, *, interval: float = 1.0, queue_size: int = 100_000) -> None:
        prom = _load()
        self._prom = prom
        self._runtime = runtime
        self._lock = threading.Lock()
        self._turns: dict[str, float] = {}  # session id -> its running turn's start time
        self._requests: dict[str, tuple[float, str]] = {}  # session id -> its open provider call
        self._lost = 0  # events this subscription lost (a runtime without a local bus reports these)
        self._stop = threading.Event()  # set by close()
        config = getattr(runtime, "config", None)
        cap = config.telemetry.metrics_max_models if config is not None else 100
        self._models = BoundedLabels(cap, configured_models(runtime))
        self._outcomes = BoundedLabels(MAX_OUTCOMES, ("ok", "overflow", "cancelled", "error"))

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return prom.Counter(f"agentcell_{name}", doc, labels, registry=None)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return prom.Histogram(f"agentcell_{name}", doc, buckets=buckets, registry=None)

        self.turns = counter("turns", "Finished turns, by status (ok, aborted, error).", ("status",))
        self.turn_duration = histogram(
            "turn_duration_seconds", "Turn duration (agent_start to agent_end).", TURN_BUCKETS
        )
        self.provider_calls = counter(
            "provider_calls",
            "Provider calls of turns, by model and outcome (ok, overflow, cancelled, or the error kind).",
            ("model", "outcome"),
        )
        self.provider_call_duration = histogram(
            "provider_call_duration_seconds", "Provider call duration, retries included.", CALL_BUCKETS
        )
        self.provider_retries = counter("provider_retries", "Failed provider attempts that were retried.")
        self.tokens = counter(
            "tokens",
            "Tokens of provider responses, by model and type (input, output, cache_read, cache_write, reasoning).",
            ("model", "type"),
        )
        self.cost = counter(
            "cost_usd", "Cost of provider calls in USD, where the model's prices are known.", ("model",)
        )
        self.cost_split = counter(
            "cost_split_usd",
            "Cost of provider calls in USD by kind of token (input, cache_read, cache_write, output), where "
            "litellm's price map knows the model.",
            ("model", "type"),
        )
        self.cache_saved = counter(
            "cache_saved_usd",
            "What the provider's cache saved in USD against the same calls without it (a call whose cache "
            "writes cost more than its reads saved counts nothing).",
            ("model",),
        )
        self.compactions = counter(
            "compactions", "Compactions by trigger and result (compacted, failed).", ("trigger", "result")
        )
        self.overflow_recoveries = counter(
            "overflow_recoveries",
            "Compactions that recover from a context overflow (trigger overflow; cause refused: the provider "
            "refused the request, counted: the runtime counted it over the limit and did not send it) or a "
            "silent one (usage_overflow), by result.",
            ("trigger", "cause", "result"),
        )
        self.tool_calls = counter("tool_calls", "Tool calls by outcome (ok, error).", ("outcome",))
        self.tool_duration = histogram("tool_call_duration_seconds", "Tool call duration.", TOOL_BUCKETS)
        self._families = (
            self.turns,
            self.turn_duration,
            self.provider_calls,
            self.provider_call_duration,
            self.provider_retries,
            self.tokens,
            self.cost,
            self.cost_split,
            self.cache_saved,
            self.compactions,
            self.overflow_recoveries,
            self.tool_calls,
            self.tool_duration,
        )
        # (bulk=False: the runtime's stop makes no session_stopped for each idle session for it; the
        # subscription's end tells it that nothing runs any more, see drain)
        self._subscription = runtime.subscribe("*", EVENT_TYPES, queue_size=queue_size, bulk=False)
        self.registry = prom.CollectorRegistry()
        self.registry.register(self)
        self._thread = threading.Thread(
            target=self._drain_every, args=(interval,), name="agentcell-metrics", daemon=True
        )
        self._thread.start()

    # -- prometheus_client's collector protocol --------------------------------------------------------
    def collect(self) -> Iterator[Any]:
        """Every metric, after the events published so far have been counted."""
        self.drain()
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        hosted = getattr(self._runtime, "hosted_sessions", None)
        try:
            count = len(hosted()) if hosted is not None and getattr(self._runtime, "running", True) else 0
        except Exception:  # a stopping runtime: no sessions to report
            count = 0
        yield GaugeMetricFamily(
            "agentcell_sessions_hosted", "Sessions the runtime hosts (awake or hibernated).", value=count
        )
        with self._lock:
            running = len(self._turns)
            lost = self._lost
        yield GaugeMetricFamily(
            "agentcell_sessions_running", "Sessions with a turn in progress.", value=running
        )
        bus = getattr(self._runtime, "bus", None)
        dropped = bus.dropped if bus is not None and hasattr(bus, "dropped") else lost
        yield CounterMetricFamily(
            "agentcell_event_bus_dropped_events",
            "Events lost by event-bus subscribers that fell behind (all subscribers).",
            value=dropped,
        )
        for family in self._families:
            yield from family.collect()
        capacity = getattr(self._runtime, "capacity", None)
        if capacity is not None:
            try:
                pools = capacity() if getattr(self._runtime, "running", True) else []
            except Exception:  # a stopping runtime: no pools to report
                pools = []
            yield from capacity_families(pools)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST

    def close(self) -> None:
        """Stop counting: the subscription is closed and the drain thread ends."""
        self._stop.set()
        self._subscription.close()

    # -- counting --------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Count every event queued so far."""
        with self._lock:
            ended = self._subscription.closed and not self._stop.is_set()  # before the drain: all is queued
            for event in self._subscription.drain():
                try:
                    self._count(event)
                except Exception:  # a metric must never stop the counting of the rest
                    log.exception("metrics: could not count a %s event", event.type)
            if ended:  # the runtime stopped: no turn nor call runs (what a session_stopped of each did)
                self._turns.clear()
                self._requests.clear()

    def _drain_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.drain()
            if self._subscription.closed and not self._subscription.pending:  # the runtime stopped
                return

    def _count(self, event: ev.Event) -> None:
        if isinstance(event, ev.SubscriberLagged):  # (the subscription's own: sent whatever the filter)
            self._lost += event.dropped
            return
        rule = _RULES.get(type(event))
        if rule is not None:
            rule(self, event)

    @_counts(ev.RequestStart)
    def _request_start(self, event: ev.RequestStart) -> None:
        # a call still open was cut off without an event of its own (an agent crash mid-call)
        self._end_request(event.session_id, event.ts, "cancelled")
        self._requests[event.session_id] = (event.ts, event.model)

    @_counts(ev.TurnEnd)
    def _turn_end(self, event: ev.TurnEnd) -> None:
        model = self._end_request(event.session_id, event.ts, "ok")
        self._count_usage(model, event.usage)

    @_counts(ev.ErrorOccurred)
    def _error(self, event: ev.ErrorOccurred) -> None:
        code = event.code
        outcome = code.removeprefix("provider_") if code.startswith("provider_") else "error"
        self._end_request(event.session_id, event.ts, "overflow" if "overflow" in code else outcome)

    @_counts(ev.AgentAbort)
    def _agent_abort(self, event: ev.AgentAbort) -> None:
        self._end_request(event.session_id, event.ts, "cancelled")

    @_counts(ev.AgentStart)
    def _agent_start(self, event: ev.AgentStart) -> None:
        self._turns[event.session_id] = event.ts

    @_counts(ev.AgentEnd)
    def _agent_end(self, event: ev.AgentEnd) -> None:
        sid = event.session_id
        self._end_request(sid, event.ts, "cancelled" if event.status == "aborted" else "error")
        started = self._turns.pop(sid, None)
        self.turns.labels(event.status).inc()
        if started is not None:
            self.turn_duration.observe(max(0.0, event.ts - started))

    @_counts(ev.ProviderRetry)
    def _provider_retry(self, event: ev.ProviderRetry) -> None:
        self.provider_retries.inc()

    @_counts(ev.CompactionStart)
    def _compaction_start(self, event: ev.CompactionStart) -> None:
        if (
            event.trigger == "overflow" and event.cause != "counted"
        ):  # a call that overflowed: recovery starts
            self._end_request(event.session_id, event.ts, "overflow")

    @_counts(ev.CompactionEnd)
    def _compaction_end(self, event: ev.CompactionEnd) -> None:
        self._compaction(event.trigger, event.cause, "compacted")

    @_counts(ev.CompactionFailed)
    def _compaction_failed(self, event: ev.CompactionFailed) -> None:
        if event.trigger == "overflow" and event.cause != "counted":
            self._end_request(event.session_id, event.ts, "overflow")
        self._compaction(event.trigger or "unknown", event.cause, "failed")

    @_counts(ev.CompactionSkipped)
    def _compaction_skipped(self, event: ev.CompactionSkipped) -> None:
        self._compaction(event.trigger or "unknown", event.cause, "skipped")

    @_counts(ev.ToolExecutionEnd)
    def _tool_execution_end(self, event: ev.ToolExecutionEnd) -> None:
        self.tool_calls.labels("error" if event.is_error else "ok").inc()
        self.tool_duration.observe(event.duration)

    @_counts(ev.SessionStopped)
    def _session_stopped(self, event: ev.SessionStopped) -> None:
        self._turns.pop(event.session_id, None)
        self._requests.pop(event.session_id, None)

    def _end_request(self, sid: str, ts: float, outcome: str) -> str:
        """Count the session's open provider call (if any) with ``outcome``; its model's label ('' if none)."""
        open_call = self._requests.pop(sid, None)
        if open_call is None:
            return ""
        started, model = open_call
        label = self._models.label(model, admit=outcome == "ok")
        self.provider_calls.labels(label, self._outcomes.label(outcome, admit=True)).inc()
        self.provider_call_duration.observe(max(0.0, ts - started))
        return label

    def _count_usage(self, model: str, usage: Any) -> None:
        for kind, value in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
            ("reasoning", usage.reasoning_tokens),
        ):
            if value:
                self.tokens.labels(model, kind).inc(value)
        if usage.cost:
            self.cost.labels(model).inc(usage.cost)
        costs = usage.costs
        if costs is not None:
            for kind, dollars in (
                ("input", costs.input),
                ("cache_read", costs.cache_read),
                ("cache_write", costs.cache_write),
                ("output", costs.output),
            ):
                if dollars:
                    self.cost_split.labels(model, kind).inc(dollars)
            if costs.saved > 0:
                self.cache_saved.labels(model).inc(costs.saved)

    def _compaction(self, trigger: str, cause: str | None, result: str) -> None:
        self.compactions.labels(trigger, result).inc()
        if trigger in _OVERFLOW_TRIGGERS:
            self.overflow_recoveries.labels(trigger, cause or "none", result).inc()


EVENT_TYPES: frozenset[str] = frozenset(kind.wire_name() for kind in _RULES)
"""The event types the metrics are made from: those with a rule."""


class ServedMetrics:
    """The metrics a server exposes for ``runtime`` (its own ``metrics()`` where it has one): made with the
    server, so they count from its start, or else at the first scrape that can have them."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._metrics: RuntimeMetrics | None = None
        self._why = "metrics are unavailable"
        self._lock = threading.Lock()
        self._make()

    def _make(self) -> RuntimeMetrics | None:
        with self._lock:
            if self._metrics is None:
                try:
                    own = getattr(self._runtime, "metrics", None)
                    self._metrics = own() if own is not None else RuntimeMetrics(self._runtime)
                except RuntimeError as exc:  # no prometheus-client, or a runtime not (yet) running
                    self._why = str(exc) or type(exc).__name__
                    log.warning("GET /metrics is unavailable for now: %s", self._why)
            return self._metrics

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format and its content type; :class:`MetricsUnavailable` if none."""
        metrics = self._metrics or self._make()
        if metrics is None:
            raise MetricsUnavailable(self._why)
        return metrics.exposition()
