"""A session's usage totals when its shard dies (design §4.1, §10.2): the shard that takes the session up
reports what the session had paid for on the dead one, plus what it pays for after, and nothing twice."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.cluster import ClusterRuntime
from runtime.config import Config
from runtime.messages import Usage
from runtime.provider import LocalProvider
from runtime.provider.script import ToolCallSpec, Turn
from tests.conftest import wait_until
from tests.reliability.durable_support import TOOLS
from tests.session.test_usage_after_restart import assert_same

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

MODEL = "gpt-4.1"  # a model litellm prices, answered by a provider of this test's own: the totals have a cost


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        yield p


@pytest.fixture
def cluster(ray_cluster: Any, tmp_path: Path) -> Iterator[ClusterRuntime]:
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.05})
    with ClusterRuntime(config, sessions_dir=tmp_path / "sessions", shards=2, shard_cpus=0.5) as rt:
        yield rt


def totals(cluster: ClusterRuntime, sid: str) -> Usage:
    usage = cluster.usage(sid)
    assert isinstance(usage, Usage)
    return usage


@pytest.mark.slow  # a cluster of its own (two shard processes), one of them SIGKILLed
def test_a_session_taken_up_by_another_shard_reports_what_it_paid_for_on_the_dead_one(
    cluster: ClusterRuntime, provider: LocalProvider
) -> None:
    """Turns and a compaction on one shard, then the shard SIGKILLed while the model answers a turn: the
    turn finishes on the other shard, and ``usage()`` there is what the session reported before the kill
    plus that turn's answer, then plus each later turn's (the answer the dead shard never got is not
    counted: nobody reported it)."""
    sid = "usage-failover"
    cluster.start_session(sid, model=f"openai/{MODEL}", api_base=provider.url, api_key="k")
    for i in range(3):
        assert cluster.prompt(sid, f"hello {i} " * 50).result(timeout=60).status == "ok"
    assert cluster.compact(sid).result(timeout=60).compacted
    assert cluster.prompt(sid, "after the compaction").result(timeout=60).status == "ok"
    before = totals(cluster, sid)
    paid = [r for r in provider.request_log if r.outcome == "ok"]
    assert len(paid) == 5 and before.input_tokens == sum(r.prompt_tokens for r in paid)

    provider.add_script(
        MODEL,
        [Turn(text="never delivered", latency=60), Turn(text="taken up", latency=5), Turn(text="later")],
    )
    victim = cluster.shard_of(sid)
    in_flight = cluster.prompt(sid, "the turn in flight")
    wait_until(lambda: provider.remaining_turns(MODEL) == 2, "the turn never reached the model", 60)
    os.kill(cluster.shard_info(victim).pid, signal.SIGKILL)
    assert_same(totals(cluster, sid), before)  # asked at once: the take-up's answer is 5 s away
    result = in_flight.result(timeout=120)  # taken up on the other shard from the log (design §3.12)
    assert result.status == "ok" and result.text == "taken up", result
    assert cluster.shard_of(sid) != victim

    taken_up = totals(cluster, sid)
    assert_same(taken_up, before + result.usage)
    later = cluster.prompt(sid, "and one more").result(timeout=60)
    assert later.status == "ok" and later.text == "later"
    assert_same(totals(cluster, sid), before + result.usage + later.usage)


@pytest.mark.slow  # a cluster of its own (two shard processes), one of them SIGKILLed
def test_a_turn_killed_in_its_tools_counts_its_reported_answer_once_on_the_shard_that_takes_it_up(
    cluster: ClusterRuntime, provider: LocalProvider, workspace: Path
) -> None:
    """The shard dies while a turn's tool runs: the turn's first answer is in the log and in the totals
    reported meanwhile. The shard that takes the turn up goes on from the log: its totals are those reported
    mid-turn plus the answers that came after, the first answer counted once."""
    sid = "usage-failover-tools"
    cluster.start_session(
        sid,
        model=f"openai/{MODEL}",
        api_base=provider.url,
        api_key="k",
        tools=list(TOOLS),
        workspace=workspace,
    )
    assert cluster.prompt(sid, "hello " * 50).result(timeout=60).status == "ok"
    bump = ToolCallSpec(name="bump", arguments='{"note": "n"}', id="c1")
    provider.add_script(
        MODEL, [Turn(tool_calls=(bump,)), Turn(text="taken up", latency=5), Turn(text="later")]
    )
    (workspace / "hold-in").write_text(f"{sid}--c1")  # the call waits there: its shard dies in it
    victim = cluster.shard_of(sid)
    in_flight = cluster.prompt(sid, "call bump")
    counter = workspace / "counters" / f"{sid}--c1"
    wait_until(counter.exists, "the tool never ran", 60)
    mid_turn = totals(cluster, sid)  # the turn's first answer is in
    assert mid_turn.input_tokens == sum(r.prompt_tokens for r in provider.request_log if r.outcome == "ok")
    os.kill(cluster.shard_info(victim).pid, signal.SIGKILL)
    assert_same(totals(cluster, sid), mid_turn)  # asked at once: the take-up's answer is 5 s away
    result = in_flight.result(timeout=120)
    assert result.status == "ok" and result.text == "taken up", result
    assert cluster.shard_of(sid) != victim and len(counter.read_text().splitlines()) == 1  # (not run again)

    assert result.message is not None and result.message.usage is not None
    assert_same(totals(cluster, sid), mid_turn + result.message.usage)
    later = cluster.prompt(sid, "and one more").result(timeout=60)
    assert later.status == "ok" and later.text == "later"
    assert_same(totals(cluster, sid), mid_turn + result.message.usage + later.usage)
