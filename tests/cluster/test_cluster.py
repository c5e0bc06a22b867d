"""The cluster runtime on a local Ray cluster with 2 CPUs (design §10): sessions on two shards, events from
both, the same API as ``Runtime``, shards joining and leaving, the turn channel (its token, a broken
connection), a shard SIGKILLed mid-turn (the turn finishes on the other shard), the HTTP server in front of it, and bad addresses.

One cluster runtime with two shards serves the whole module (the tests run in file order: the one that
kills a shard comes last).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from runtime import events as ev
from runtime.apps.server import ApiServer
from runtime.cluster import ClusterError, ClusterRuntime, ClusterUnavailable, _feeds, owner
from runtime.host import Runtime, RuntimeStopped, SessionNotFound
from runtime.provider.script import Turn
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import read_transcript
from runtime.subagents import UsageReport
from tests.conftest import Recorder, wait_until
from tests.reliability.durable_support import TOOLS, PlanModel, check_turn, counts, session_config

TOKEN = "cluster-token"


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRuntime]:
    sessions = tmp_path_factory.mktemp("cluster") / "sessions"
    config_overrides = {"retry.base_delay": 0.01, "retry.max_delay": 0.05}
    from runtime.config import Config

    rt = ClusterRuntime(
        Config().with_overrides(config_overrides), sessions_dir=sessions, shards=2, shard_cpus=0.5
    )
    with rt:
        yield rt


def start(rt: ClusterRuntime, provider: Any, sid: str, model: str = "openai/agentcell-local") -> str:
    return rt.start_session(sid, model=model, api_base=provider.url, api_key="sk-local")


def ids_on_each_shard(rt: ClusterRuntime, prefix: str, per_shard: int) -> list[str]:
    """Session ids that the placement puts ``per_shard`` on each live shard."""
    found: dict[str, list[str]] = {name: [] for name in rt.shards}
    n = 0
    while any(len(v) < per_shard for v in found.values()):
        sid = f"{prefix}-{n}"
        n += 1
        bucket = found[rt.placement(sid)]
        if len(bucket) < per_shard:
            bucket.append(sid)
    return [sid for bucket in found.values() for sid in bucket]


def test_the_cluster_runtime_has_the_public_api_of_runtime() -> None:
    public = {name for name in dir(Runtime) if not name.startswith("_")}
    missing = public - set(dir(ClusterRuntime))
    assert not missing, f"ClusterRuntime lacks {sorted(missing)}"
    for name in ("prompt", "abort", "compact", "subscribe", "messages", "resume_session", "set_model"):
        local = inspect.signature(getattr(Runtime, name)).parameters
        remote = inspect.signature(getattr(ClusterRuntime, name)).parameters
        assert set(local) - {"prompt_id"} <= set(remote), name


def test_sessions_on_two_shards_and_events_from_both(cluster: ClusterRuntime, provider: Any) -> None:
    sids = [start(cluster, provider, sid) for sid in ids_on_each_shard(cluster, "both", 3)]
    assert {cluster.shard_of(sid) for sid in sids} == set(cluster.shards) and len(cluster.shards) == 2
    pids = {cluster.shard_info(name).pid for name in cluster.shards}
    assert len(pids) == 2 and os.getpid() not in pids  # two processes of their own

    recorder = Recorder()
    with cluster.subscribe(sids, types={"agent_start", "text_delta", "agent_end"}, callback=recorder) as sub:
        handles = {sid: cluster.prompt(sid, f"Hello from {sid}") for sid in sids}
        results = {sid: handle.result(timeout=60) for sid, handle in handles.items()}
        assert all(r.status == "ok" and r.prompt_id == handles[sid].id for sid, r in results.items())
        assert sub.flush(timeout=10)
        recorder.wait_for(lambda evs: sum(e.type == "agent_end" for e in evs) == len(sids), timeout=10)
    for sid in sids:
        mine = [e for e in recorder.events if e.session_id == sid]
        assert mine[0].type == "agent_start" and mine[-1].type == "agent_end"
        assert mine[0].prompt_id == handles[sid].id  # the front's handle and the shard's events agree
        assert [e.seq for e in mine] == sorted(e.seq for e in mine)  # in order, numbered by the shard
        assert "".join(e.delta for e in mine if isinstance(e, ev.TextDelta)) == results[sid].text
    assert {e.type for e in recorder.events} == {"agent_start", "text_delta", "agent_end"}


def test_metrics_count_the_turns_of_every_shard(cluster: ClusterRuntime, provider: Any) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    metrics = cluster.metrics()
    assert cluster.metrics() is metrics
    sids = [start(cluster, provider, sid) for sid in ids_on_each_shard(cluster, "metered", 1)]
    assert {cluster.shard_of(sid) for sid in sids} == set(cluster.shards)
    assert all(cluster.prompt(sid, "count me").result(timeout=60).status == "ok" for sid in sids)
    cluster.prompt(sids[0], "and me").result(timeout=60)
    deadline = time.monotonic() + 10  # the front counts events as they arrive from the shards
    text = ""
    while time.monotonic() < deadline:
        text = generate_latest(metrics.registry).decode()
        if 'agentcell_turns_total{status="ok"} 3.0' in text:
            break
        time.sleep(0.05)
    assert 'agentcell_turns_total{status="ok"} 3.0' in text, text


def test_queries_and_controls_reach_the_sessions_shard(cluster: ClusterRuntime, provider: Any) -> None:
    sid = start(cluster, provider, "controls")
    with pytest.raises(ValueError, match="already exists"):
        start(cluster, provider, "controls")
    with pytest.raises(SessionNotFound):
        cluster.prompt("nobody-here", "hi")
    with pytest.raises(ValueError, match="must not be empty"):
        cluster.prompt(sid, "   ")

    first = cluster.prompt(sid, "one", prompt_id="controls-p1").result(timeout=60)
    assert first.status == "ok" and first.prompt_id == "controls-p1"
    messages = cluster.messages(sid)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].text == "one"
    assert cluster.messages(sid, view="model")[-1].text == first.text
    assert cluster.usage(sid).input_tokens > 0
    report = cluster.usage(sid, include_children=True)  # (the README's call; a TypeError before)
    assert isinstance(report, UsageReport) and report.children == {} and report.total == cluster.usage(sid)
    assert cluster.context_stats(sid).total > 0
    assert cluster.set_model(sid, "openai/gpt-4o-mini") == 128_000
    cluster.branch(sid, None)
    assert cluster.messages(sid) == []
    assert cluster.abort(sid).result(timeout=10) is False
    compaction = cluster.compact(sid).result(timeout=30)
    assert compaction.compacted is False and compaction.reason
    assert sid in cluster.hosted_sessions() and sid in {i.id for i in cluster.list_sessions()}
    assert cluster.session_summary(sid).model == "openai/gpt-4o-mini"

    cluster.stop_session(sid)
    with pytest.raises(SessionNotFound):
        cluster.usage(sid)
    assert cluster.is_stored(sid) and not cluster.is_hosted(sid)
    assert cluster.resume_session(sid, api_key="sk-local") == sid
    assert [m.text for m in cluster.messages(sid)] == []  # the branch was logged
    cluster.delete_session(sid)
    assert not cluster.is_stored(sid)
    with pytest.raises(SessionNotFound):
        cluster.resume_session(sid)


def test_send_with_client_tools_crosses_to_the_shard(cluster: ClusterRuntime, provider: Any) -> None:
    from actors.protocol import TurnOptions
    from runtime.messages import tool_result, user
    from runtime.provider.script import ToolCallSpec

    provider.add_script(
        "cluster-client-tools",
        [Turn(tool_calls=(ToolCallSpec(name="lookup", id="call_c"),)), Turn(text="looked up")],
    )
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    options = TurnOptions(client_tools=(tool,), instructions="Be brief.")
    sid = start(cluster, provider, "send-1", model="openai/cluster-client-tools")
    first = cluster.send(sid, [user("look it up")], options=options).result(timeout=60)
    assert [c.id for c in first.awaiting] == ["call_c"]
    done = cluster.send(sid, [tool_result("call_c", "lookup", "found")], options=options).result(timeout=60)
    assert done.text == "looked up" and not done.awaiting


def test_the_cluster_works_from_asyncio(cluster: ClusterRuntime, provider: Any) -> None:
    async def main() -> list[str]:
        sid = await cluster.astart_session(
            "async-1", model="openai/agentcell-local", api_base=provider.url, api_key="sk-local"
        )
        events = cluster.subscribe(sid, types={"agent_end"})
        result = await cluster.prompt(sid, "hi")
        seen = []
        async for event in events:
            seen.append(event.type)
            break
        events.close()
        stats = await cluster.acontext_stats(sid)
        assert stats.total > 0 and (await cluster.amessages(sid))[-1].text == result.text
        await cluster.adelete_session(sid)
        return seen

    assert asyncio.run(main()) == ["agent_end"]


def test_a_slow_subscriber_lags_as_on_the_local_bus(
    cluster: ClusterRuntime, provider: Any, script: Any
) -> None:
    model = script(Turn(text=" ".join(f"word{n}" for n in range(300))))
    provider.chunk_chars, chunk_chars = 4, provider.chunk_chars
    try:
        sid = start(cluster, provider, "laggy", model)
        sub = cluster.subscribe(sid, types={"text_delta", "agent_end"}, queue_size=5)
        assert cluster.prompt(sid, "talk").result(timeout=60).status == "ok"
        time.sleep(0.5)  # the relay has everything by now; the subscriber has read nothing
        events = sub.drain()
    finally:
        provider.chunk_chars = chunk_chars
    lagged = [e for e in events if isinstance(e, ev.SubscriberLagged)]
    assert lagged and sum(e.dropped for e in lagged) == sub.dropped > 0
    rest = [e for e in events if not isinstance(e, ev.SubscriberLagged)]
    assert len(rest) == 5 and rest[-1].type == "agent_end"  # the newest kept, the oldest lost
    assert [e.seq for e in rest] == sorted(e.seq for e in rest)
    sub.close()


def test_the_http_server_fronts_the_cluster(cluster: ClusterRuntime, provider: Any) -> None:
    with (
        ApiServer(cluster, TOKEN) as server,
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client,
    ):
        sids = ids_on_each_shard(cluster, "http", 1)
        for sid in sids:
            body = {
                "session_id": sid,
                "model": "openai/agentcell-local",
                "api_base": provider.url,
                "api_key": "k",
            }
            created = client.post("/sessions", json=body)
            assert created.status_code == 201, created.text
            assert created.json()["context_window"] > 0
        seen: list[dict[str, Any]] = []
        ready = threading.Event()

        def listen() -> None:
            with client.stream("GET", "/events", params={"type": "agent_end"}) as stream:
                ready.set()
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        import json

                        seen.append(json.loads(line[6:]))
                        if len(seen) == len(sids):
                            return

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        assert ready.wait(30)
        for sid in sids:
            reply = client.post(f"/sessions/{sid}/prompt", json={"text": "over http", "wait": True})
            assert reply.status_code == 200 and reply.json()["status"] == "ok", reply.text
        listener.join(30)
        assert {e["session_id"] for e in seen} == set(sids)  # events from both shards on one stream
        got = client.get(f"/sessions/{sids[0]}").json()
        assert got["model"] == "openai/agentcell-local" and got["usage"]["input_tokens"] > 0
        assert client.get("/sessions/nobody").status_code == 404
        listed = {s["id"]: s["hosted"] for s in client.get("/sessions").json()["sessions"]}
        assert all(listed[sid] for sid in sids)
        assert client.delete(f"/sessions/{sids[0]}").status_code == 200


def test_shards_joining_and_leaving_move_only_the_sessions_that_must(
    cluster: ClusterRuntime, provider: Any
) -> None:
    sids = [start(cluster, provider, f"move-{n}") for n in range(12)]
    for sid in sids:
        assert cluster.prompt(sid, f"before {sid}").result(timeout=60).status == "ok"
    before = {sid: cluster.shard_of(sid) for sid in sids}
    recorder = Recorder()
    sub = cluster.subscribe(sids, types={"session_stopped", "session_started"}, callback=recorder)

    new = cluster.add_shard()
    try:
        after = {sid: cluster.shard_of(sid) for sid in sids}
        moved = {sid for sid in sids if after[sid] != before[sid]}
        assert moved == {sid for sid in sids if owner(sid, cluster.shards) == new}
        assert all(after[sid] == new for sid in moved)  # nothing moved between the old shards
        for sid in sids:  # every session goes on where it was, moved or not
            assert cluster.prompt(sid, f"after {sid}").result(timeout=60).status == "ok"
            assert [m.text for m in cluster.messages(sid) if m.role == "user"] == [
                f"before {sid}",
                f"after {sid}",
            ]
        sub.flush(timeout=10)
        for sid in moved:  # subscribers see it stop on the old shard, then start on the new one
            mine = [(e.type, getattr(e, "resumed", None)) for e in recorder.events if e.session_id == sid]
            assert mine == [("session_stopped", None), ("session_started", True)]
    finally:
        cluster.remove_shard(new)
    assert {sid: cluster.shard_of(sid) for sid in sids} == before  # back where they were
    assert len(cluster.shards) == 2
    for sid in moved:
        assert cluster.prompt(sid, "home again").result(timeout=60).status == "ok"
    sub.close()


def test_a_call_right_after_a_prompt_reaches_the_session_after_it(
    cluster: ClusterRuntime, provider: Any, script: Any
) -> None:
    sid = start(cluster, provider, "ordered", model=script(Turn(text="cut short", latency=10)))
    # The front's loop is held a moment: the prompt waits there to be written to the shard's turn channel,
    # while stop_session (a Ray call) could overtake it.
    loop = cluster._fleet.loop
    assert loop is not None
    loop.loop.call_soon_threadsafe(time.sleep, 0.5)
    first = cluster.prompt(sid, "a long turn")
    cluster.stop_session(sid)
    result = first.result(timeout=60)  # as on one Runtime: stopped after it started, not before
    assert (result.status, result.error) == ("aborted", "session stopped")


def test_a_shards_turn_channel_drops_a_connection_without_its_token(
    cluster: ClusterRuntime, provider: Any, ray_cluster: Any
) -> None:
    sid = start(cluster, provider, "channel-token")
    assert cluster.prompt(sid, "first").result(timeout=60).status == "ok"
    shard = cluster._fleet.shards[cluster.shard_of(sid)]
    address = ray_cluster.get(shard.actor.open_channel.remote())  # where the front connected (from Ray)
    assert address.path and address.port
    request = msgspec.msgpack.encode([0, "prompt", sid, "smuggled in", [], False, "p-smuggled"])
    for family, where in ((socket.AF_UNIX, address.path), (socket.AF_INET, (address.ip, address.port))):
        with socket.socket(family) as conn:
            conn.settimeout(10)
            conn.connect(where)
            conn.sendall(frame(b"not the token") + frame(request))
            try:
                answer = conn.recv(100)
            except ConnectionResetError:
                answer = b""
            assert answer == b""  # dropped, nothing answered
    assert [m.text for m in cluster.messages(sid) if m.role == "user"] == ["first"]  # nothing ran
    assert cluster.prompt(sid, "second").result(timeout=60).status == "ok"  # the front's channel goes on


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def test_a_broken_tcp_turn_channel_is_connected_again_and_loses_no_event(
    cluster: ClusterRuntime, provider: Any, script: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_feeds, "TCP", True)  # as a front on another host connects
    new = cluster.add_shard()  # a shard of its own, whose connection breaks (as a network dropping it would)
    try:
        sid = next(f"broken-{n}" for n in itertools.count() if cluster.placement(f"broken-{n}") == new)
        start(cluster, provider, sid)
        shard = cluster._fleet.shards[new]
        old = shard.channel
        assert old is not None and old._writer is not None
        assert isinstance(old._writer.get_extra_info("peername"), tuple)  # (host, port): TCP
        recorder = Recorder()
        sub = cluster.subscribe(sid, callback=recorder)
        cluster.set_model(sid, script(Turn(text="answered to nobody", latency=2)))
        in_flight = cluster.prompt(sid, "in flight when the channel breaks")
        recorder.wait_for(lambda evs: any(e.type == "agent_start" for e in evs), timeout=30)
        loop = cluster._fleet.loop
        assert loop is not None
        loop.loop.call_soon_threadsafe(old._writer.transport.abort)  # the connection drops
        with pytest.raises(ClusterError, match=f"turn channel to {new} broke"):
            in_flight.result(timeout=60)  # its outcome is unknown to the front
        deadline = time.monotonic() + 30
        while (shard.channel is None or shard.channel is old) and time.monotonic() < deadline:
            time.sleep(0.05)
        again = shard.channel
        assert again is not None and again is not old and again._writer is not None  # connected again
        assert isinstance(again._writer.get_extra_info("peername"), tuple)
        # The turn cut off from the front ends on the shard; its end comes on the new connection.
        recorder.wait_for(lambda evs: any(e.type == "agent_end" for e in evs), timeout=30)
        cluster.set_model(sid, "openai/agentcell-local")
        after = cluster.prompt(sid, "after the break").result(timeout=60)
        assert after.status == "ok" and new in cluster.shards
        assert [m.text for m in cluster.messages(sid) if m.role == "user"][-1] == "after the break"
        assert sub.flush(timeout=10)
        mine = recorder.events
        # Every event of the session, in order, none twice or missing: the end of the turn that ran while
        # the connection was down came on the new one.
        assert [e.seq for e in mine] == list(range(mine[0].seq, mine[0].seq + len(mine)))
        assert [e.type for e in mine].count("agent_end") == 2
        deltas = "".join(e.delta for e in mine if isinstance(e, ev.TextDelta))
        assert deltas == "answered to nobody" + after.text
        sub.close()
    finally:
        cluster.remove_shard(new)


def test_a_shard_whose_channel_cannot_be_reached_gets_turns_and_events_by_ray_calls(
    cluster: ClusterRuntime, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unreachable(*_: Any, **__: Any) -> Any:
        raise OSError("no route to host")  # a port its network does not let through

    monkeypatch.setattr(_feeds, "connect", unreachable)
    new = cluster.add_shard()
    try:
        shard = cluster._fleet.shards[new]
        assert shard.channel is None
        sid = next(f"pulled-{n}" for n in itertools.count() if cluster.placement(f"pulled-{n}") == new)
        start(cluster, provider, sid)
        recorder = Recorder()
        with cluster.subscribe(sid, types={"text_delta", "agent_end"}, callback=recorder) as sub:
            result = cluster.prompt(sid, "over Ray").result(timeout=60)
            assert result.status == "ok" and sub.flush(timeout=10)
            assert recorder.types(sid)[-1] == "agent_end"
            deltas = "".join(e.delta for e in recorder.events if isinstance(e, ev.TextDelta))
            assert deltas == result.text
        assert shard.pumping
    finally:
        cluster.remove_shard(new)


def test_a_cluster_lists_the_turns_a_dead_runtime_left_open_and_takes_them_up(
    cluster: ClusterRuntime, provider: Any
) -> None:
    """Design §3.12 on the cluster: a runtime that shared the cluster's sessions directory died mid-turn (its
    log and journal of open turns as it left them); ``interrupted_sessions`` on the front lists the session,
    and resuming it there takes the turn up on its shard, the front's handle under the original prompt id."""
    model = f"cut-cluster-{os.getpid()}"
    provider.add_script(model, [Turn(text="never delivered", latency=30), Turn(text="taken up on a shard")])
    sid = f"cut-off-{os.getpid()}"
    with Runtime(sessions_dir=cluster.sessions_path) as gone:
        gone.start_session(sid, model=f"openai/{model}", api_base=provider.url, api_key="sk-local")
        prompt_id = gone.prompt(sid, "finish this").id
        deadline = time.monotonic() + 30
        while provider.remaining_turns(model) == 2:
            assert time.monotonic() < deadline, "the turn never reached the model"
            time.sleep(0.02)
        gone.flush()
        (log,) = cluster.sessions_path.rglob(f"{sid}.jsonl")
        log_then = log.read_bytes()
        journal_then = Path(gone._machinery.turns.path).read_bytes()
    log.write_bytes(log_then)  # as the runtime that died left them
    (cluster.sessions_path / "turns" / f"{os.getpid()}-gone.jsonl").write_bytes(journal_then)

    assert sid in cluster.interrupted_sessions()
    cluster.resume_session(sid, api_key="sk-local")
    handle = cluster.resumed_turn(sid)
    assert handle is not None and handle.id == prompt_id
    assert handle.result(timeout=60).text == "taken up on a shard"
    assert sid not in cluster.interrupted_sessions()


def test_a_tool_heavy_turn_whose_shard_is_killed_finishes_on_another(
    cluster: ClusterRuntime, provider: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Design §3.12 on the cluster: a shard SIGKILLed while a turn's ``bump`` call runs (its effect done,
    its result not recorded). The session is resumed on the other shard, which takes the turn up: the
    front's handle resolves with the turn's real answer, ``bump`` ran once (its result says the outcome is
    unknown), the idempotent calls beside it ran again, and no request held two results for one call.

    The front's catch-up after the death (the dead shard's connection read to its end, the transcript
    replayed; until then the relays hold the new shard's events) is late here, as on a loaded machine: it
    waits until the taken-up turn has ended on the survivor. The handle resolves only once the turn's events
    have reached the subscriber all the same, as on one process."""
    model = f"plan-cluster-{os.getpid()}"
    provider.add_responder(model, PlanModel())
    sid = "durable-cluster"
    victim = cluster.placement(sid)
    survivor = next(name for name in cluster.shards if name != victim)
    cluster.start_session(
        sid,
        model=f"openai/{model}",
        api_base=provider.url,
        api_key="sk-local",
        tools=list(TOOLS),
        config=session_config(model),
        workspace=workspace,
    )
    transcript = SessionDirectory(cluster.sessions_path).transcript_path(sid)
    looked = threading.Event()  # the test has read what its subscriber got
    catch_up = cluster._fleet.after_failover
    assert catch_up is not None

    def turn_ended() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            e.type == "agent_end" for e in read_transcript(transcript)
        ):
            time.sleep(0.02)
        looked.wait(2.0)

    async def late_catch_up(dead: Any, sessions: list[str]) -> None:
        await asyncio.to_thread(turn_ended)
        await catch_up(dead, sessions)

    monkeypatch.setattr(cluster._fleet, "after_failover", late_catch_up)
    (workspace / "hold-in").write_text(f"{sid}--{sid}-s2c1")  # that call waits: the shard dies in it
    recorder = Recorder()
    sub = cluster.subscribe(sid, callback=recorder)
    handle = cluster.prompt(sid, f"task {sid} run the plan")
    counter = workspace / "counters" / f"{sid}--{sid}-s2c1"
    deadline = time.monotonic() + 60
    while not counter.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert counter.exists(), handle.result(timeout=1) if handle.done() else "the turn did not get there"
    os.kill(cluster.shard_info(victim).pid, signal.SIGKILL)
    try:
        result = handle.result(timeout=120)
        assert sub.flush(timeout=10)
        types = recorder.types(sid)
        looked.set()
        assert "turn_resumed" in types, types  # the take-up's events, not still held by the front
        assert "agent_end" in types[types.index("turn_resumed") :], types
        assert cluster.shard_of(sid) == survivor
        requests = [r for r in provider.request_log if r.model == model]
        figures = check_turn(result, cluster.messages(sid), counts(workspace, sid), requests)
        assert figures["unknown"] == 1 and counts(workspace, sid)[f"{sid}-s2c1"] == 1
        assert result.prompt_id == handle.id
        (resumed,) = recorder.of("turn_resumed", sid)
        assert resumed.resume_from == "tool_started" and resumed.prompt_id == handle.id
        assert str(cluster.shard_info(survivor).pid) == resumed.process.rsplit(":", 1)[1]
        sub.close()
    finally:
        looked.set()
        if len(cluster.shards) < 2:
            cluster.add_shard()  # two shards again, for the test below


def test_a_shard_killed_mid_turn_loses_nothing_acknowledged(
    cluster: ClusterRuntime, provider: Any, script: Any
) -> None:
    sids = ids_on_each_shard(cluster, "kill", 2)
    for sid in sids:
        start(cluster, provider, sid)
    acknowledged: dict[str, list[str]] = {sid: [] for sid in sids}
    for n in range(2):
        for sid in sids:
            result = cluster.prompt(sid, f"turn {n} of {sid}").result(timeout=60)
            assert result.status == "ok"
            acknowledged[sid] += [f"turn {n} of {sid}", result.text]
    victim_shard = cluster.shard_of(sids[0])
    survivor = next(name for name in cluster.shards if name != victim_shard)
    doomed = [sid for sid in sids if cluster.shard_of(sid) == victim_shard]
    safe = [sid for sid in sids if sid not in doomed]

    recorder = Recorder()
    sub = cluster.subscribe("*", callback=recorder)
    slow = script(Turn(text="never finished", latency=10), Turn(text="finished on the survivor"))
    cluster.set_model(doomed[0], slow)
    in_flight = cluster.prompt(doomed[0], "the turn in flight")
    recorder.wait_for(lambda evs: any(e.type == "agent_start" and e.session_id == doomed[0] for e in evs), 30)
    # In flight and written down: the log holds the prompt (the shard's writer thread writes it a moment
    # after the turn starts, later still on a loaded machine; a prompt not yet written is not yet durable)
    log = SessionDirectory(cluster.sessions_path).log_path(doomed[0])
    deadline = time.monotonic() + 30
    while b"the turn in flight" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    # ... and asked of the model, which answers slowly (killed before it asked, the survivor would be the
    # one to get the slow answer, ten seconds later)
    wait_until(lambda: provider.remaining_turns(slow.split("/", 1)[1]) == 1, "the shard asked the model")
    elsewhere = cluster.prompt(safe[0], "a turn on the other shard")
    numbered = max(e.seq for e in recorder.events if e.session_id == doomed[0])

    os.kill(cluster.shard_info(victim_shard).pid, signal.SIGKILL)
    result = in_flight.result(timeout=60)  # taken up on the survivor from the log (design §3.12)
    assert result.status == "ok" and result.text and result.prompt_id == in_flight.id, result
    assert elsewhere.result(timeout=60).status == "ok"  # the other shard's sessions never noticed

    assert cluster.shards == [survivor]
    for sid in doomed:  # resumed on the survivor from their logs, everything acknowledged there
        assert cluster.shard_of(sid) == survivor
        texts = [m.text for m in cluster.messages(sid)]
        assert texts[: len(acknowledged[sid])] == acknowledged[sid], sid
    cluster.set_model(doomed[0], "openai/agentcell-local")
    assert cluster.prompt(doomed[0], "after the crash").result(timeout=60).status == "ok"
    sub.flush(timeout=10)
    later = [e for e in recorder.events if e.session_id == doomed[0] and e.seq > numbered]
    assert "agent_end" in [e.type for e in later]  # the same subscription goes on, numbers above the old
    assert any(isinstance(e, ev.SessionStarted) and e.resumed for e in later)
    sub.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bad_addresses_are_clear_errors(ray_cluster: Any, provider: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        ClusterRuntime(sessions_dir=tmp_path, address="no-port-here")
    with pytest.raises(ValueError, match="HOST:PORT"):
        ClusterRuntime(sessions_dir=tmp_path, address="localhost:99999")
    began = time.monotonic()
    with pytest.raises(ClusterUnavailable, match=r"no Ray cluster answers at 127\.0\.0\.1:"):
        ClusterRuntime(sessions_dir=tmp_path, address=f"127.0.0.1:{closed_port()}").start()
    address = f"127.0.0.1:{provider.port}"  # something answers there, but it is not Ray
    with pytest.raises(ClusterUnavailable, match="not as a Ray cluster"):
        ClusterRuntime(sessions_dir=tmp_path, address=address).start()
    assert time.monotonic() - began < 15  # not Ray's minutes of retrying
    with pytest.raises(RuntimeStopped):
        ClusterRuntime(sessions_dir=tmp_path).prompt("s", "not started")
