"""Spans of a cluster (design §10.6): a ``ClusterRuntime`` given a tracer provider makes the spans at its front,
from the events of every shard, so each turn is one trace in the front's exporter wherever it runs, with the
same tree as on one process; its stop ends a turn it cuts off as on one process.

A module of its own, with a cluster runtime of its own (its tracer provider is the test's).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from runtime.cluster import ClusterRuntime
from runtime.config import Config
from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.cluster.test_cluster import ids_on_each_shard

pytestmark = pytest.mark.slow  # (a cluster of its own: two shards start in seconds)

ANSWER = "3 and 5."


def add(a: int, b: int) -> str:
    """Add two integers."""
    return f"sum={a + b}"


@pytest.fixture
def traced(ray_cluster: Any, tmp_path: Any) -> Iterator[tuple[ClusterRuntime, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    rt = ClusterRuntime(
        config, sessions_dir=tmp_path / "sessions", shards=2, shard_cpus=0.5, tracer_provider=provider
    )
    with rt:
        yield rt, exporter


def test_each_turn_is_one_trace_at_the_front_wherever_it_runs_and_stop_ends_a_cut_off_one(
    traced: tuple[ClusterRuntime, InMemorySpanExporter], provider: Any
) -> None:
    rt, exporter = traced
    calls = tuple(
        ToolCallSpec(name="add", arguments=f'{{"a": {i}, "b": {i + 1}}}', id=f"call_{i}") for i in (1, 2)
    )
    provider.add_script(
        "cluster-otel", [Turn(text="Adding.", tool_calls=calls), Turn(text=ANSWER)], loop=True
    )
    sids = ids_on_each_shard(rt, "traced", 1)
    assert len({rt.placement(sid) for sid in sids}) == 2
    for sid in sids:
        rt.start_session(
            sid, model="openai/cluster-otel", tools=[add], api_base=provider.url, api_key="sk-local"
        )
        result = rt.prompt(sid, "Add 1+2 and 2+3.").result(timeout=60)
        assert result.status == "ok" and result.text == ANSWER, result.error

    # a sub-agent (on its parent's shard): its turn is a child of the delegating call, in the parent's trace
    provider.add_script("cluster-child", [Turn(text="The answer is 42.")])
    task = json.dumps({"profile": "researcher", "task": "Find it."})
    delegating = ToolCallSpec(name="agent", arguments=task, id="call_d1")
    provider.add_script("cluster-parent", [Turn(tool_calls=(delegating,)), Turn(text="It is 42.")])
    agents = {"researcher": {"description": "finds", "model": "openai/cluster-child", "tools": "none"}}
    parent = rt.start_session(
        model="openai/cluster-parent", api_base=provider.url, api_key="sk-local", agents=agents
    )
    assert rt.prompt(parent, "What is the answer?").result(timeout=60).text == "It is 42."

    provider.add_script("cluster-hang", [Turn(fault=Fault(kind="hang"))])
    hung = sids[0]
    rt.set_model(hung, "openai/cluster-hang")
    calling = threading.Event()
    with rt.subscribe(hung, ["request_start"], callback=lambda event: calling.set()):
        rt.prompt(hung, "never answered")
        assert calling.wait(30)
    rt.stop()  # (the spans of every event the shards sent are made before it returns)

    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.attributes["agentcell.session.id"] == parent and s.parent is None]
    family = [s for s in spans if s.context.trace_id == root.context.trace_id]
    (tool,) = [s for s in family if s.name == "execute_tool agent"]
    (child,) = [s for s in family if s.parent is not None and s.parent.span_id == tool.context.span_id]
    assert child.name == "invoke_agent agentcell" and child.attributes["agentcell.session.id"] != parent
    spans = [s for s in spans if s not in family]
    turns = [s for s in spans if s.name == "invoke_agent agentcell"]
    assert sorted(t.attributes["agentcell.session.id"] for t in turns) == sorted([*sids, hung])
    for turn in turns:
        assert turn.parent is None and turn.kind is SpanKind.INTERNAL
        trace = [s for s in spans if s.context.trace_id == turn.context.trace_id]
        kids = sorted((s for s in trace if s is not turn), key=lambda s: s.start_time)
        assert all(s.parent.span_id == turn.context.span_id for s in kids)  # one trace, one level under it
        if turn.attributes["agentcell.turn.status"] == "ok":
            assert [s.name for s in kids] == [
                "chat openai/cluster-otel",
                "execute_tool add",
                "execute_tool add",
                "chat openai/cluster-otel",
            ]
            assert turn.attributes["agentcell.turn.steps"] == 2
        else:  # the turn the stop cut off
            assert turn.attributes["agentcell.session.id"] == hung
            assert turn.attributes["agentcell.turn.status"] == "aborted"
            assert [(s.name, s.attributes["error.type"]) for s in kids] == [
                ("chat openai/cluster-hang", "cancelled")
            ]
