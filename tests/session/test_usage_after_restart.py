"""A session's usage totals across a restart, through the public API (design §4.1): what a user bills by is
every response the session paid for, its compactions' summarizer calls and the branches it left included,
and a restarted runtime reports what the live one did, from its first answer on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.messages import Usage
from runtime.provider import LocalProvider

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

MODEL = "openai/gpt-4.1"  # a model litellm prices, answered by the local provider: the totals have a cost


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        yield p


def assert_same(restored: Usage, live: Usage) -> None:
    """The same tokens, and the same cost up to the order its floats were added in."""
    tokens = ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read_tokens", "cache_write_tokens")
    assert [getattr(restored, t) for t in tokens] == [getattr(live, t) for t in tokens]
    assert live.cost is not None and live.costs is not None
    assert restored.cost == pytest.approx(live.cost, rel=1e-12)
    assert restored.costs is not None
    assert restored.costs.total == pytest.approx(live.costs.total, rel=1e-12)
    assert restored.costs.cache_read == pytest.approx(live.costs.cache_read, rel=1e-12)


def test_a_restarted_session_reports_everything_it_paid_for_before_its_compaction_and_on_other_branches(
    provider: LocalProvider, tmp_path: Path
) -> None:
    """Before, the totals rebuilt after a restart summed the model's view: what the turns before the latest
    compaction (and a branch left behind) cost was gone (2,228 input tokens of 2,824 in the lead's run), and
    the first ``usage()`` after the resume answered zeros."""
    with Runtime(Config(), sessions_dir=tmp_path) as rt:
        sid = rt.start_session(model=MODEL, api_base=provider.url, api_key="k")
        for i in range(3):
            assert rt.prompt(sid, f"hello {i} " * 50).result(timeout=30).status == "ok"
        assert rt.compact(sid).result(timeout=60).compacted
        fork = rt.messages(sid)[-1].id
        assert rt.prompt(sid, "after the compaction").result(timeout=30).status == "ok"
        rt.branch(sid, fork)  # the last turn's answer stays on a branch the view no longer shows
        assert rt.prompt(sid, "on another branch").result(timeout=30).status == "ok"
        live = rt.usage(sid)
        assert isinstance(live, Usage)
    paid = [r for r in provider.request_log if r.outcome == "ok"]
    assert len(paid) == 6  # five turns and the summary
    assert live.input_tokens == sum(r.prompt_tokens for r in paid)  # every response paid for, counted once
    with Runtime(Config(), sessions_dir=tmp_path) as rt:
        rt.resume_session(sid, api_key="k", api_base=provider.url)
        at_once = rt.usage(sid)  # the first answer, with no wait
        assert isinstance(at_once, Usage)
        assert_same(at_once, live)
        assert rt.prompt(sid, "again").result(timeout=30).status == "ok"
        after = rt.usage(sid)
        assert isinstance(after, Usage)
    last = [r for r in provider.request_log if r.outcome == "ok"][-1]
    assert after.input_tokens == live.input_tokens + last.prompt_tokens


def test_a_resumed_session_answers_usage_at_once_with_the_totals_of_its_log(
    provider: LocalProvider, tmp_path: Path
) -> None:
    """A session resumed and asked at once (no turn, no wait) reports its totals, not zeros; so does one that
    hibernated and is woken by the question."""
    with Runtime(Config(), sessions_dir=tmp_path) as rt:
        sid = rt.start_session(model=MODEL, api_base=provider.url, api_key="k")
        assert rt.prompt(sid, "hello").result(timeout=30).status == "ok"
        live = rt.usage(sid)
        assert isinstance(live, Usage) and live.input_tokens > 0
    for _ in range(3):  # each start races the agent's recovery anew
        with Runtime(Config(), sessions_dir=tmp_path) as rt:
            rt.resume_session(sid, api_key="k", api_base=provider.url)
            at_once = rt.usage(sid)
            assert isinstance(at_once, Usage)
            assert_same(at_once, live)
            assert rt.hibernate(sid)
            woken = rt.usage(sid)  # its actors start again for the question
            assert isinstance(woken, Usage)
            assert_same(woken, live)
