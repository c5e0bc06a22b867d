"""The local provider's Anthropic Messages API (design §7.3), checked with Anthropic's official Python SDK (a
client nobody here wrote): content blocks, tool use, signed thinking, the SSE events, Anthropic's caching
rules and usage, and its errors (overflow, 429 with its headers, 529, a 5th breakpoint, a changed signature)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from runtime.capacity import parse_rate_limit_headers
from runtime.dialects import anthropic as dialect
from runtime.provider import Fault, LocalProvider, ToolCallSpec, Turn

TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file of the workspace.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]
SYSTEM = "You are a careful coding agent. Read before you write, and say what you changed. " * 8


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def provider() -> Iterator[LocalProvider]:
    with LocalProvider(api_key="sk-ant-local", context_window=8_000) as p:
        p.cache_min_tokens = 64
        yield p


@pytest.fixture
def client(provider: LocalProvider) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{provider.port}", api_key="sk-ant-local", max_retries=0
    ) as c:
        yield c


def marked_system() -> list[Any]:
    return [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]


def tool_turns() -> list[Turn]:
    return [
        Turn(
            reasoning="The user wants a.txt: read it first.",
            tool_calls=(ToolCallSpec(name="read_file", arguments='{"path": "a.txt"}'),),
        ),
        Turn(reasoning="It says hello.", text="a.txt says hello."),
    ]


def test_a_tool_call_streams_as_anthropics_events_and_its_signed_thinking_is_accepted_back(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    provider.add_script("claude-t", tool_turns())
    first = [{"role": "user", "content": "What does a.txt say?"}]
    names: list[str] = []
    with client.messages.stream(
        model="claude-t", max_tokens=512, system=SYSTEM, tools=TOOLS, messages=first
    ) as s:
        for event in s:
            names.append(event.type)
        message = s.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(names)
    thinking, call = message.content
    assert thinking.type == "thinking" and thinking.thinking == "The user wants a.txt: read it first."
    assert thinking.signature
    assert call.type == "tool_use" and call.name == "read_file" and call.input == {"path": "a.txt"}
    assert message.stop_reason == "tool_use"
    second = [
        *first,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}]},
    ]
    answer = client.messages.create(
        model="claude-t", max_tokens=512, system=SYSTEM, tools=TOOLS, messages=second
    )
    assert [b.type for b in answer.content] == ["thinking", "text"]
    assert answer.stop_reason == "end_turn"


def test_a_changed_thinking_or_signature_is_refused_as_anthropic_refuses_it(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    provider.add_script("claude-s", tool_turns(), loop=True)
    first = [{"role": "user", "content": "What does a.txt say?"}]
    message = client.messages.create(model="claude-s", max_tokens=512, tools=TOOLS, messages=first)
    thinking, call = (b.model_dump(exclude_none=True) for b in message.content)
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "hi"}],
    }
    for changed in ({**thinking, "thinking": thinking["thinking"] + " "}, {**thinking, "signature": "c2ln"}):
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature` in `thinking` block"):
            client.messages.create(
                model="claude-s",
                max_tokens=512,
                tools=TOOLS,
                messages=[*first, {"role": "assistant", "content": [changed, call]}, result],
            )


def test_with_thinking_enabled_a_tool_loops_assistant_message_must_start_with_its_thinking(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    """Anthropic's rule: with ``thinking`` enabled, the assistant message whose ``tool_use`` the last message
    answers must start with its thinking block (sent back as given): without it, a 400; with it, or with
    thinking off, the loop goes on."""
    provider.add_script("claude-k", tool_turns(), loop=True)
    enabled: Any = {"type": "enabled", "budget_tokens": 1024}
    first = [{"role": "user", "content": "What does a.txt say?"}]
    message = client.messages.create(
        model="claude-k", max_tokens=2048, tools=TOOLS, messages=first, thinking=enabled
    )
    thinking, call = (b.model_dump(exclude_none=True) for b in message.content)
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "hi"}],
    }
    bare = [*first, {"role": "assistant", "content": [call]}, result]
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block") as refused:
        client.messages.create(
            model="claude-k", max_tokens=2048, tools=TOOLS, messages=bare, thinking=enabled
        )
    assert refused.value.status_code == 400 and "messages.1.content.0.type" in str(refused.value)
    whole = [*first, {"role": "assistant", "content": [thinking, call]}, result]
    assert client.messages.create(
        model="claude-k", max_tokens=2048, tools=TOOLS, messages=whole, thinking=enabled
    ).content
    assert client.messages.create(model="claude-k", max_tokens=2048, tools=TOOLS, messages=bare).content


def test_only_a_prefix_ending_at_a_breakpoint_is_cached_and_usage_splits_reads_writes_and_the_rest(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    provider.add_script("claude-c", [Turn(text="ok")], loop=True)
    plain = client.messages.create(
        model="claude-c", max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
    )
    again = client.messages.create(
        model="claude-c", max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
    )
    assert plain.usage.cache_read_input_tokens == again.usage.cache_read_input_tokens == 0  # no breakpoint
    assert again.usage.cache_creation_input_tokens == 0
    first = client.messages.create(
        model="claude-c", max_tokens=64, system=marked_system(), messages=[{"role": "user", "content": "hi"}]
    )
    written = first.usage.cache_creation_input_tokens
    assert written > 64 and first.usage.cache_read_input_tokens == 0
    assert first.usage.input_tokens + written == plain.usage.input_tokens  # the same prompt, split
    second = client.messages.create(
        model="claude-c", max_tokens=64, system=marked_system(), messages=[{"role": "user", "content": "bye"}]
    )
    assert second.usage.cache_read_input_tokens == written  # the system prefix, whatever follows it
    assert second.usage.cache_creation_input_tokens == 0


def test_a_prefix_under_the_minimum_is_not_cached_and_the_models_minimum_applies(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    provider.add_script("claude-m", [Turn(text="ok")], loop=True)
    short = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    for _ in range(2):
        usage = client.messages.create(
            model="claude-m", max_tokens=64, system=short, messages=[{"role": "user", "content": "hi"}]
        ).usage
        assert usage.cache_creation_input_tokens == 0 and usage.cache_read_input_tokens == 0
    provider.cache_min_tokens = (
        None  # the model's own minimum: 1,024 tokens for a Claude model not named in the table
    )
    provider.add_script("claude-sonnet-local", [Turn(text="ok")], loop=True)
    assert dialect.min_cacheable_tokens("claude-sonnet-local") == 1_024
    assert dialect.min_cacheable_tokens("claude-opus-4-5-20251101") == 4_096
    usage = client.messages.create(
        model="claude-sonnet-local",
        max_tokens=64,
        system=marked_system(),
        messages=[{"role": "user", "content": "hi"}],
    ).usage
    assert usage.cache_creation_input_tokens == 0  # ~150 tokens of system prompt: under 1,024


def test_entries_live_five_minutes_refreshed_by_reads_or_an_hour_when_asked(provider: LocalProvider) -> None:
    clock = Clock()
    provider.messages.clock = clock
    provider.add_script("claude-ttl", [Turn(text="ok")], loop=True)
    with anthropic.Anthropic(base_url=f"http://127.0.0.1:{provider.port}", api_key="sk-ant-local") as c:

        def read(ttl: str | None) -> tuple[int, int]:
            control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
            system: Any = [{"type": "text", "text": SYSTEM + (ttl or ""), "cache_control": control}]
            u = c.messages.create(
                model="claude-ttl", max_tokens=8, system=system, messages=[{"role": "user", "content": "x"}]
            ).usage
            return u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0

        assert read(None)[0] == 0
        clock.now += 299
        assert read(None)[0] > 0  # read at 4:59, which refreshes it
        clock.now += 299
        assert read(None)[0] > 0
        clock.now += 301
        assert read(None)[0] == 0  # 5:01 after the last read: gone, written again
        first = c.messages.create(
            model="claude-ttl",
            max_tokens=8,
            system=[
                {"type": "text", "text": SYSTEM + "1h", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ],
            messages=[{"role": "user", "content": "x"}],
        ).usage
        assert first.cache_creation is not None and first.cache_creation.ephemeral_1h_input_tokens > 0
        assert first.cache_creation.ephemeral_5m_input_tokens == 0
        clock.now += 3_000
        assert read("1h")[0] > 0


def test_a_fifth_breakpoint_is_a_400(client: anthropic.Anthropic, provider: LocalProvider) -> None:
    provider.add_script("claude-b", [Turn(text="ok")], loop=True)
    blocks: Any = [
        {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(4)
    ]
    client.messages.create(model="claude-b", max_tokens=8, messages=[{"role": "user", "content": blocks}])
    with pytest.raises(
        anthropic.BadRequestError, match=r"A maximum of 4 blocks with cache_control may be provided\. Found 5"
    ):
        client.messages.create(
            model="claude-b",
            max_tokens=8,
            system=marked_system(),
            messages=[{"role": "user", "content": blocks}],
        )


def test_anthropics_errors_overflow_overload_auth_and_a_tool_use_left_unanswered(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    provider.add_script("claude-e", [Turn(text="ok")], loop=True)
    provider.context_window = 100
    with pytest.raises(anthropic.BadRequestError) as overflow:
        client.messages.create(
            model="claude-e", max_tokens=8, system=SYSTEM, messages=[{"role": "user", "content": "x"}]
        )
    assert "prompt is too long:" in overflow.value.message and "> 100 maximum" in overflow.value.message
    provider.context_window = 8_000
    provider.inject_fault("overloaded")
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        client.messages.create(model="claude-e", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    with (
        anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{provider.port}", api_key="wrong", max_retries=0
        ) as other,
        pytest.raises(anthropic.AuthenticationError),
    ):
        other.messages.create(model="claude-e", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    call = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}
    with pytest.raises(anthropic.BadRequestError, match="without `tool_result` blocks immediately after"):
        client.messages.create(
            model="claude-e",
            max_tokens=8,
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": "go on"},
            ],
        )


def test_a_mid_stream_error_arrives_as_an_error_event(
    provider: LocalProvider, client: anthropic.Anthropic
) -> None:
    provider.add_script("claude-x", [Turn(text="ok")], loop=True)
    provider.inject_fault("stream_error", after_chunks=2)
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        client.messages.stream(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        ) as s,
    ):
        s.get_final_message()


def test_over_its_limits_a_429_carries_retry_after_and_anthropics_rate_limit_headers() -> None:
    with LocalProvider(rpm=60) as provider:
        provider.add_script("claude-r", [Turn(text="ok")], loop=True)
        url = f"http://127.0.0.1:{provider.port}/v1/messages"
        headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
        body = {"model": "claude-r", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        ok = httpx.post(url, json=body, headers=headers)
        refused = httpx.post(url, json=body, headers=headers)
    assert ok.status_code == 200 and "anthropic-ratelimit-requests-remaining" in ok.headers
    assert "x-ratelimit-limit-requests" not in ok.headers
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1
    info = parse_rate_limit_headers(refused.headers, now=time.time())
    assert info is not None and info.requests is not None
    assert info.requests.limit == 60 and info.requests.remaining == 0


def test_a_rate_limit_fault_reports_the_request_limit_it_is_given(provider: LocalProvider) -> None:
    fault = Fault(kind="rate_limit", retry_after=0.2, rpm=6_000)
    provider.add_script("claude-f", [Turn(fault=Fault(kind="rate_limit")), Turn(fault=fault)])
    url = f"http://127.0.0.1:{provider.port}/v1/messages"
    headers = {"x-api-key": "sk-ant-local", "anthropic-version": "2023-06-01"}
    body = {"model": "claude-f", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    plain, told = httpx.post(url, json=body, headers=headers), httpx.post(url, json=body, headers=headers)
    assert plain.status_code == told.status_code == 429
    plain_info = parse_rate_limit_headers(plain.headers, now=time.time())
    assert plain_info is not None and plain_info.requests is None  # the limit in words only, as before
    assert "rate limit of 50 requests per minute" in plain.json()["error"]["message"]
    info = parse_rate_limit_headers(told.headers, now=time.time())
    assert info is not None and info.requests is not None
    assert info.requests.limit == 6_000 and info.requests.remaining == 0
    assert told.headers["retry-after"] == "1"  # whole seconds, as Anthropic sends it
    assert "rate limit of 6000 requests per minute" in told.json()["error"]["message"]


def test_a_request_anthropic_would_refuse_gets_its_400(provider: LocalProvider) -> None:
    url = f"http://127.0.0.1:{provider.port}/v1/messages"
    headers = {"x-api-key": "sk-ant-local", "anthropic-version": "2023-06-01"}
    base = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    cases = [
        ({k: v for k, v in base.items() if k != "max_tokens"}, "max_tokens: Field required"),
        ({**base, "messages": [{"role": "system", "content": "x"}]}, 'Unexpected role "system"'),
        ({**base, "messages": []}, "at least one message"),
    ]
    for body, wording in cases:
        answer = httpx.post(url, json=body, headers=headers)
        assert answer.status_code == 400 and wording in answer.json()["error"]["message"]
    no_version = httpx.post(url, json=base, headers={"x-api-key": "sk-ant-local"})
    assert no_version.status_code == 400 and "anthropic-version" in no_version.json()["error"]["message"]
