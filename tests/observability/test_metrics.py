"""Prometheus metrics (design §7.5): ``GET /metrics`` of the server scraped over real HTTP after a scripted
workload (tool turns, a compaction, a retried provider fault, an overflow recovery, a failed call, a slow
subscriber), every number checked against the events the test saw; the bearer token rule."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.apps.server import ApiServer
from runtime.observability.metrics import RuntimeMetrics
from runtime.provider.script import Fault, ToolCallSpec, Turn
from tests.conftest import RPM, StopsSeen
from tests.observability.conftest import Seen
from tests.serve import serve_process

TOKEN = "metrics-test-token"


def scrape(url: str, token: str | None = TOKEN) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of ``name`` over every label set that includes ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_metrics_match_the_events_of_a_scripted_workload(rt: Any, seen: Seen, provider: Any) -> None:
    server = ApiServer(rt, TOKEN).start()
    try:
        run_workload(rt, provider)
        assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 401
        samples = scrape(server.url)
    finally:
        server.stop()
    check(samples, rt, seen)


def run_workload(rt: Any, provider: Any) -> None:
    def session(name: str, turns: list[Turn], **kw: Any) -> str:
        provider.add_script(name, turns)
        model = f"openai/{name}"
        config = {
            "models.context_windows": {model: 100_000, "openai/summarizer": 32_000},
            "compaction.summarizer_model": "openai/summarizer",
        }
        return str(
            rt.start_session(model=model, api_base=provider.url, api_key="sk-local", config=config, **kw)
        )

    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    # two tool turns, the first with two parallel calls
    calls = (
        ToolCallSpec(name="add", arguments='{"a": 1, "b": 2}'),
        ToolCallSpec(name="add", arguments='{"a": 3, "b": 4}'),
    )
    tools = session(
        "metrics-tools",
        [
            Turn(tool_calls=calls),
            Turn(text="3 and 7."),
            Turn(tool_calls=(ToolCallSpec(name="nope", arguments="{}"),)),  # an unknown tool: an error result
            Turn(text="That tool does not exist."),
        ],
        tools=[add],
    )
    for text in ("add 1+2 and 3+4", "use a tool that is not there"):
        assert rt.prompt(tools, text).result(timeout=60).status == "ok"
    # a manual compaction of a long session
    long = session("metrics-long", [Turn(text=words(150, f"l{i}-")) for i in range(3)])
    for i in range(3):
        assert rt.prompt(long, f"record part {i} " + words(60, "p")).result(timeout=60).status == "ok"
    assert rt.compact(long).result(timeout=60).compacted
    # a rate-limited call, retried, then answered
    busy = Turn(fault=Fault(kind="rate_limit", retry_after=None, rpm=RPM))
    retried = session("metrics-retry", [busy, Turn(text="Here you go.")])
    assert rt.prompt(retried, "hello").result(timeout=60).status == "ok"
    # an overflow: emergency compaction, then the retry of the turn answers
    overflow = session(
        "metrics-overflow",
        [
            *(Turn(text=words(150, f"t{i}-")) for i in range(3)),
            Turn(fault=Fault(kind="overflow")),
            Turn(text="Recovered."),
        ],
    )
    for i in range(4):
        result = rt.prompt(overflow, f"record part {i} " + words(60, "p")).result(timeout=60)
        assert result.status == "ok", result.error
    # a call that fails for good
    denied = session("metrics-auth", [Turn(fault=Fault(kind="auth"))])
    assert rt.prompt(denied, "hello").result(timeout=60).status == "error"
    # a subscriber that never reads loses events
    slow = rt.subscribe("*", queue_size=1)
    assert rt.prompt(retried, "again").result(timeout=60).status == "error"  # the script is used up
    assert slow.dropped > 0


def check(samples: dict[Any, float], rt: Any, seen: Seen) -> None:
    ends = seen.of("agent_end")
    by_status = Counter(e.status for e in ends)
    for status in ("ok", "error", "aborted"):
        assert value(samples, "agentcell_turns_total", status=status) == by_status[status], status
    assert by_status["ok"] == 10 and by_status["error"] == 2
    assert value(samples, "agentcell_turn_duration_seconds_count") == len(ends)
    assert value(samples, "agentcell_sessions_running") == 0
    assert value(samples, "agentcell_sessions_hosted") == len(rt.hosted_sessions()) == 5

    turn_ends = seen.of("turn_end")
    requests = seen.of("request_start")
    assert total(samples, "agentcell_provider_calls_total", outcome="ok") == len(turn_ends)
    assert value(samples, "agentcell_provider_call_duration_seconds_count") == len(requests)
    assert total(samples, "agentcell_provider_calls_total") == len(requests)
    assert (
        value(samples, "agentcell_provider_calls_total", model="openai/metrics-overflow", outcome="overflow")
        == 1
    )
    # a model neither configured nor ever answering is counted as "other" (clients choose model names)
    assert value(samples, "agentcell_provider_calls_total", model="openai/metrics-auth", outcome="auth") == 0
    assert value(samples, "agentcell_provider_calls_total", model="other", outcome="auth") == 1
    errors = [e.code for e in seen.of("error")]
    assert "provider_auth" in errors and "provider_invalid_request" in errors  # the used-up script: 400
    assert value(samples, "agentcell_provider_retries_total") == len(seen.of("provider_retry")) >= 1

    for kind, field in (
        ("input", "input_tokens"),
        ("output", "output_tokens"),
        ("cache_read", "cache_read_tokens"),
    ):
        assert total(samples, "agentcell_tokens_total", type=kind) == sum(
            getattr(e.usage, field) for e in turn_ends
        )
    model_in = sum(
        e.usage.input_tokens for e in turn_ends if e.session_id == seen.of("agent_end")[0].session_id
    )
    assert (
        value(samples, "agentcell_tokens_total", model="openai/metrics-tools", type="input") == model_in > 0
    )
    costs = sum(e.usage.cost or 0.0 for e in turn_ends)
    assert total(samples, "agentcell_cost_usd_total") == pytest.approx(costs)

    compactions = Counter((e.trigger, "compacted") for e in seen.of("compaction_end"))
    compactions.update((e.trigger or "unknown", "failed") for e in seen.of("compaction_failed"))
    assert compactions[("manual", "compacted")] == 1 and compactions[("overflow", "compacted")] == 1
    for (trigger, result), n in compactions.items():
        assert value(samples, "agentcell_compactions_total", trigger=trigger, result=result) == n
    assert total(samples, "agentcell_compactions_total") == sum(compactions.values())
    recovered = {"trigger": "overflow", "cause": "refused", "result": "compacted"}  # the provider refused
    assert value(samples, "agentcell_overflow_recoveries_total", **recovered) == 1

    tools = Counter("error" if e.is_error else "ok" for e in seen.of("tool_execution_end"))
    assert tools == {"ok": 2, "error": 1}
    for outcome, n in tools.items():
        assert value(samples, "agentcell_tool_calls_total", outcome=outcome) == n
    assert value(samples, "agentcell_tool_call_duration_seconds_count") == 3

    dropped = value(samples, "agentcell_event_bus_dropped_events_total")
    assert dropped == rt.bus.dropped > 0


def test_metrics_need_the_token_unless_public(rt: Any) -> None:
    with ApiServer(rt, TOKEN) as server:
        assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 401
        wrong = httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401
        assert value(scrape(server.url), "agentcell_sessions_hosted") == 0
    with ApiServer(rt, TOKEN, metrics_public=True) as server:
        samples = scrape(server.url, token=None)
        assert ("agentcell_sessions_running", frozenset()) in samples
        assert httpx.get(f"{server.url}/sessions", timeout=30).status_code == 401  # only /metrics is public
        assert httpx.post(f"{server.url}/metrics", timeout=30).status_code == 401


def test_without_prometheus_client_metrics_say_what_to_install(
    rt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import prometheus_client fails
    from runtime.errors import AgentcellError
    from runtime.observability.metrics import MetricsUnavailable

    with pytest.raises(MetricsUnavailable, match="pip install prometheus-client") as raised:
        rt.metrics()
    assert isinstance(raised.value, AgentcellError)
    with ApiServer(rt, TOKEN) as server:
        response = httpx.get(
            f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        assert response.status_code == 503
        assert "pip install prometheus-client" in response.json()["error"]
        assert (
            httpx.get(f"{server.url}/sessions", headers={"Authorization": f"Bearer {TOKEN}"}).status_code
            == 200
        )


def test_embedders_get_one_collector_and_registry(rt: Any, provider: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    metrics = rt.metrics()
    assert rt.metrics() is metrics
    provider.add_script("metrics-embed", [Turn(text="hi")])
    sid = rt.start_session(model="openai/metrics-embed", api_base=provider.url, api_key="sk-local")
    assert rt.prompt(sid, "hello").result(timeout=60).status == "ok"
    text = generate_latest(metrics.registry).decode()
    assert 'agentcell_turns_total{status="ok"} 1.0' in text
    mine = CollectorRegistry()
    mine.register(metrics)  # a collector: it joins an application's own registry too
    assert 'agentcell_turns_total{status="ok"} 1.0' in generate_latest(mine).decode()


def test_scrapes_while_turns_run_never_break_the_counting(rt: Any, provider: Any) -> None:
    provider.add_script("metrics-busy", [Turn(text="ok", latency=0.01)], loop=True)
    metrics = rt.metrics()
    sids = [
        rt.start_session(model="openai/metrics-busy", api_base=provider.url, api_key="sk-local")
        for _ in range(4)
    ]
    stop = threading.Event()
    scrapes: list[int] = []

    def scraper() -> None:
        while not stop.is_set():
            metrics.exposition()
            scrapes.append(1)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        handles = [rt.prompt(sid, f"turn {i}") for i in range(5) for sid in sids]
        assert all(h.result(timeout=60).status == "ok" for h in handles)
    finally:
        stop.set()
        thread.join()
    assert scrapes
    text = metrics.exposition()[0].decode()
    assert 'agentcell_turns_total{status="ok"} 20.0' in text
    assert 'agentcell_provider_calls_total{model="openai/metrics-busy",outcome="ok"} 20.0' in text


def test_a_call_cut_off_by_an_agent_crash_counts_as_cancelled(rt: Any, seen: Seen, provider: Any) -> None:
    metrics = rt.metrics()
    # Every call answers after 2 s: the first is still open when the agent crashes (whether or not it had
    # reached the provider by then, so either call may take the script's turn), the second answers.
    provider.add_script("metrics-crash", [Turn(text="after the crash", latency=2.0)], loop=True)
    sid = rt.start_session(model="openai/metrics-crash", api_base=provider.url, api_key="sk-local")
    handle = rt.prompt(sid, "hello")
    seen.wait_type("request_start", timeout=30)
    rt._session(sid).refs.agent.tell(object())  # an unexpected message: the agent crashes mid-call
    assert handle.result(timeout=30).text == "after the crash"  # its successor makes the call again
    assert len(seen.of("request_start", sid)) == 2
    text = metrics.exposition()[0].decode()
    # (cut off before the model ever answered: counted as "other", see the bounded labels)
    assert 'agentcell_provider_calls_total{model="other",outcome="cancelled"} 1.0' in text
    assert 'agentcell_provider_calls_total{model="openai/metrics-crash",outcome="ok"} 1.0' in text
    assert 'agentcell_turns_total{status="ok"} 1.0' in text
    assert "agentcell_sessions_running 0.0" in text


def test_the_serve_command_takes_metrics_public() -> None:
    from runtime.apps.cli import build_parser

    assert build_parser().parse_args(["serve", "--metrics-public"]).metrics_public is True
    assert build_parser().parse_args(["serve"]).metrics_public is False


@pytest.mark.slow  # ~30 s here: the server process imports litellm and waits for it to stop
def test_serve_with_metrics_public_lets_a_scraper_in_without_the_token(tmp_path: Any) -> None:
    with serve_process(tmp_path / "sessions", "--token", TOKEN, "--metrics-public") as served:
        assert "/metrics public" in served.banner.splitlines()[-1]
        samples = scrape(served.url, token=None)
        assert value(samples, "agentcell_sessions_hosted") == 0
        assert httpx.get(f"{served.url}/sessions", timeout=10).status_code == 401


def test_a_hand_built_metrics_lets_a_runtime_stop_without_an_event_for_every_idle_session(
    rt: Any, provider: Any
) -> None:
    """``RuntimeMetrics(rt)`` (not ``rt.metrics()``, which the stop closes first) makes the runtime's stop
    publish no ``session_stopped`` for each idle session it hosts, and still shows nothing running after it:
    the turn the stop cut off ends aborted, its call cancelled."""
    metrics = RuntimeMetrics(rt)
    idle = [rt.start_session(model="openai/idle") for _ in range(20)]
    provider.add_script("metrics-stop", [Turn(fault=Fault(kind="hang"))])
    sid = rt.start_session(model="openai/metrics-stop", api_base=provider.url, api_key="sk-local")
    with rt.subscribe(sid, {"request_start"}) as started:  # (one session's: not every session's stop)
        rt.prompt(sid, "hello")
        assert started.get(timeout=30) is not None
    assert metrics.registry.get_sample_value("agentcell_sessions_running") == 1.0
    stops = StopsSeen()
    rt.bus.add_sink(stops)
    rt.stop()
    assert stops == [sid]  # (its transcript's clean end; on dce1364: 21)
    assert all(rt.bus.last_seq(s) <= 1 for s in idle)  # (their session_started at most)
    sample = metrics.registry.get_sample_value
    assert sample("agentcell_sessions_running") == 0.0
    assert sample("agentcell_turns_total", {"status": "aborted"}) == 1.0
    assert sample("agentcell_provider_calls_total", {"model": "other", "outcome": "cancelled"}) == 1.0
    metrics.close()
