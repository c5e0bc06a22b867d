"""The gateway against the local provider over real HTTP on 127.0.0.1 (design §3.2, 3.3, 3.7).

Every test that makes calls runs on each transport (``litellm`` and the native ``openai_compat`` over chat
completions, and the native ``anthropic`` over the local provider's Messages API, as ``anthropic/`` models go):
the same deltas, messages, usage, error kinds, retries, cancellation and stall reports from each.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import tiktoken

import runtime  # noqa: F401  (offline environment)
from runtime import messages as m
from runtime.config import RetryConfig
from runtime.gateway import (
    CompletionRequest,
    CompletionResult,
    Delta,
    Gateway,
    IoLoop,
    RetryInfo,
    accepts_reasoning,
    backoff_delay,
    classify_error,
    complete_sync,
    normalize_usage,
    retry_after_seconds,
)
from runtime.provider import OVERFLOW_FORMATS, Fault, LocalProvider, ToolCallSpec, Turn
from tests.reliability.support import Resources, wait_for_no_leaks

ENC = tiktoken.get_encoding("o200k_base")
pytestmark = pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning")  # litellm's own

FAST_RETRY = RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.05, jitter=0.25)
TRANSPORTS = ("litellm", "openai_compat", "anthropic")


def tokens(text: str) -> int:
    return len(ENC.encode(text))


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider(context_window=2_000) as p:
        yield p


@pytest.fixture(scope="module")
def io() -> Iterator[IoLoop]:
    loop = IoLoop()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def gateway(io: IoLoop) -> Gateway:
    gw = Gateway(io, FAST_RETRY)
    gw.preload().result(timeout=60)
    return gw


_FORCED: dict[str, Any] = {"transport": "auto"}


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The transport a test's calls are forced onto (each test using it runs once per transport): the
    ``request`` helper below sends its requests there, and every result is checked to have gone there."""
    name: str = request.param
    _FORCED["transport"] = name
    yield name
    _FORCED["transport"] = "auto"


def check_transport(result: CompletionResult) -> CompletionResult:
    forced = _FORCED["transport"]
    if forced != "auto" and result.attempts:
        assert result.transport == forced, f"the call went over {result.transport}, not {forced}"
        if result.message is not None:
            assert result.usage.transport == forced and result.message.usage.transport == forced
    return result


def sync_call(gateway: Gateway, req: CompletionRequest, timeout: float | None = 10) -> CompletionResult:
    """``complete_sync``, checked to have gone over the forced transport."""
    return check_transport(complete_sync(gateway, req, timeout=timeout))


@pytest.fixture(autouse=True)
def _reset(provider: LocalProvider) -> None:
    provider.clear_faults()
    provider.context_window = 2_000
    provider.overflow_format = "openai"
    provider.chunk_chars = 24
    provider.chunk_delay = 0.0
    provider.reasoning_field = "reasoning_content"


def request(provider: LocalProvider, model: str, messages: list[Any], **kw: Any) -> CompletionRequest:
    if _FORCED["transport"] == "anthropic":  # an anthropic/ model: the Messages API, natively under auto
        kw.setdefault("transport", "auto")
        return CompletionRequest(
            model=f"anthropic/{model}",
            messages=messages,
            api_base=provider.base_url,
            api_key="sk-local",
            **kw,
        )
    kw.setdefault("transport", _FORCED["transport"])
    return CompletionRequest(
        model=f"openai/{model}", messages=messages, api_base=provider.url, api_key="sk-local", **kw
    )


class Recorder:
    """Collects every callback of one call."""

    def __init__(self) -> None:
        self.results: list[CompletionResult] = []
        self.deltas: list[Delta] = []
        self.retries: list[RetryInfo] = []
        self.stalls: list[float] = []
        self.done = threading.Event()

    def on_result(self, result: CompletionResult) -> None:
        self.results.append(result)
        self.done.set()

    def start(self, gateway: Gateway, req: CompletionRequest, **kw: Any) -> Any:
        return gateway.complete(
            req,
            self.on_result,
            on_delta=self.deltas.append,
            on_retry=self.retries.append,
            on_stall=self.stalls.append,
            **kw,
        )

    def result(self, timeout: float = 10.0) -> CompletionResult:
        assert self.done.wait(timeout), "no result delivered"
        time.sleep(0.02)  # a second delivery would arrive now
        assert len(self.results) == 1, "on_result fires exactly once"
        return check_transport(self.results[0])


def test_streamed_text_arrives_as_deltas_and_as_the_final_message(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    text = "The quick brown fox jumps over the lazy dog, twice over, to make several chunks."
    provider.add_script("text", [Turn(text=text)])
    rec = Recorder()
    rec.start(gateway, request(provider, "text", [m.system("Be brief."), m.user("Tell me about the fox.")]))
    result = rec.result()
    assert result.ok and result.error is None
    assert result.message is not None
    assert result.message.role == "assistant"
    assert result.message.text == text
    assert result.message.stop_reason == "stop"
    assert len([d for d in rec.deltas if d.kind == "text"]) > 1
    assert "".join(d.text for d in rec.deltas if d.kind == "text") == text
    assert result.attempts == 1
    body = provider.request_log[-1].body
    if transport == "anthropic":  # the Messages API streams its usage unasked
        assert body["stream"] is True and "stream_options" not in body
    else:
        assert body["stream_options"] == {"include_usage": True}


def test_usage_is_exact_and_normalized(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    provider.add_script("usage", [Turn(text="Fine, thanks.", reasoning="Be polite.")])
    history = [m.system("You are helpful."), m.user("How are you?")]
    result = sync_call(gateway, request(provider, "usage", history), timeout=10)
    system = 3 + tokens("system") + tokens("You are helpful.")
    if transport == "anthropic":  # a system prompt is a block of text, not a message with its framing
        system = tokens("You are helpful.")
    expected_prompt = 3 + system + (3 + tokens("user") + tokens("How are you?"))
    assert result.usage.input_tokens == expected_prompt
    # Anthropic counts thinking in the output tokens and reports no reasoning tokens apart
    assert result.usage.reasoning_tokens == (0 if transport == "anthropic" else tokens("Be polite."))
    assert result.usage.output_tokens == tokens("Fine, thanks.") + tokens("Be polite.")
    assert result.message is not None and result.message.usage == result.usage
    assert result.usage.cost is None, "litellm has no price for a local model"


def test_a_repeated_prefix_reports_cache_reads(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("cached", [Turn(text="first answer"), Turn(text="second answer")])
    history = [m.system(f"Cache me: gateway test 41b2 over {transport}."), m.user("one")]
    first = sync_call(gateway, request(provider, "cached", history), timeout=10)
    assert first.usage.cache_read_tokens == 0
    assert first.message is not None
    history += [first.message, m.user("two")]
    second = sync_call(gateway, request(provider, "cached", history), timeout=10)
    if transport == "anthropic":  # Anthropic caches only up to a cache_control breakpoint: none here
        assert second.usage.cache_read_tokens == 0
    else:
        assert second.usage.cache_read_tokens == first.usage.input_tokens - 3
    assert second.usage.input_tokens > first.usage.input_tokens


def test_non_streamed_call_gives_the_same_message(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    call = ToolCallSpec(name="read_file", arguments='{"path": "a.txt"}', id="call_ns")
    provider.add_script("plain", [Turn(text="Reading.", reasoning="Need a.txt.", tool_calls=(call,))])
    result = sync_call(gateway, request(provider, "plain", [m.user("read a.txt")], stream=False), timeout=10)
    assert result.message is not None
    assert result.message.text == "Reading."
    assert result.message.reasoning == "Need a.txt."
    assert result.message.tool_calls == (
        m.ToolCallPart(id="call_ns", name="read_file", arguments='{"path": "a.txt"}'),
    )
    assert result.message.stop_reason == "tool_calls"
    assert result.usage.input_tokens > 0
    assert provider.request_log[-1].stream is False


def test_tool_call_arguments_split_across_chunks_are_reassembled(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.chunk_chars = 4
    good = '{"path": "src/main.py", "old": "a", "new": "b"}'
    malformed = '{"path": "x.py", "content": "no closing brace'
    calls = (
        ToolCallSpec(name="edit_file", arguments=good, id="call_a"),
        ToolCallSpec(name="write_file", arguments=malformed, id="call_b"),
    )
    provider.add_script("tools", [Turn(tool_calls=calls)])
    rec = Recorder()
    rec.start(gateway, request(provider, "tools", [m.user("edit things")]))
    result = rec.result()
    assert result.message is not None
    assert [(c.id, c.name, c.arguments) for c in result.message.tool_calls] == [
        ("call_a", "edit_file", good),
        ("call_b", "write_file", malformed),
    ]
    assert result.message.stop_reason == "tool_calls"
    fragments = [d for d in rec.deltas if d.kind == "tool_call" and d.index == 0]
    assert len(fragments) > 5
    assert fragments[0].call_id == "call_a" and fragments[0].name == "edit_file"
    with pytest.raises(ValueError, match="not valid JSON"):
        result.message.tool_calls[1].parsed_arguments()


def test_reasoning_is_stored_with_its_signature_and_sent_back(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script(
        "thinker",
        [Turn(text="42.", reasoning="Six times seven.", reasoning_signature="sig-abc"), Turn(text="Yes.")],
    )
    rec = Recorder()
    rec.start(gateway, request(provider, "thinker", [m.user("6*7?")]))
    first = rec.result()
    assert first.message is not None
    reasoning = [p for p in first.message.parts if isinstance(p, m.ReasoningPart)]
    assert reasoning == [m.ReasoningPart("Six times seven.", signature="sig-abc")]
    assert "".join(d.text for d in rec.deltas if d.kind == "reasoning") == "Six times seven."

    sync_call(
        gateway, request(provider, "thinker", [m.user("6*7?"), first.message, m.user("Sure?")]), timeout=10
    )
    sent = provider.request_log[-1].messages[1]
    assert sent["role"] == "assistant"
    if transport == "anthropic":  # the signed thinking block, first in the assistant's content
        assert sent["content"][0] == {
            "type": "thinking",
            "thinking": "Six times seven.",
            "signature": "sig-abc",
        }
    else:
        assert sent["reasoning_content"] == "Six times seven."
        assert sent["thinking_blocks"] == [
            {"type": "thinking", "thinking": "Six times seven.", "signature": "sig-abc"}
        ]

    provider.add_script("thinker", [Turn(text="ok")])
    no_reasoning = request(
        provider, "thinker", [m.user("6*7?"), first.message, m.user("Sure?")], include_reasoning=False
    )
    sync_call(gateway, no_reasoning, timeout=10)
    assert "reasoning_content" not in provider.request_log[-1].messages[1]
    assert "thinking" not in str(provider.request_log[-1].messages[1])


def test_hidden_messages_are_not_sent_and_dicts_pass_through(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("mixed", [Turn(text="ok")])
    hidden = m.user("archived output", agent_visible=False)
    raw = {"role": "user", "content": "raw dict message"}
    sync_call(gateway, request(provider, "mixed", [m.system("sys"), hidden, raw]), timeout=10)
    if transport == "anthropic":
        body = provider.request_log[-1].body
        assert body["system"] == [{"type": "text", "text": "sys"}]
        assert body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "raw dict message"}]}
        ]
        return
    assert provider.request_log[-1].messages == [{"role": "system", "content": "sys"}, raw]


@pytest.mark.parametrize("fmt", sorted(OVERFLOW_FORMATS))
def test_every_vendor_overflow_is_classified_as_overflow_and_not_retried(
    transport: str, fmt: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.context_window = 30
    provider.overflow_format = fmt
    rec = Recorder()
    rec.start(gateway, request(provider, "anything", [m.user("far too long " * 50)]))
    result = rec.result()
    assert result.error is not None
    assert result.error.kind == "overflow", f"{fmt}: {result.error}"
    assert result.error.is_overflow and not result.error.retryable
    assert result.attempts == 1
    assert rec.retries == []
    assert result.message is None


def test_rate_limit_is_retried_after_the_servers_retry_after(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("limited", [Turn(text="finally")])
    provider.inject_fault("rate_limit", retry_after=0.3)
    rec = Recorder()
    started = time.monotonic()
    rec.start(gateway, request(provider, "limited", [m.user("hi")]))
    result = rec.result()
    assert result.message is not None and result.message.text == "finally"
    assert time.monotonic() - started >= 0.3
    assert result.attempts == 2
    # Anthropic's retry-after is whole seconds: 0.3 s is sent as 1
    wait = 1.0 if transport == "anthropic" else 0.3
    assert [(r.attempt, r.max_attempts, r.delay, r.status_code, r.kind) for r in rec.retries] == [
        (1, 3, wait, 429, "rate_limit")
    ]
    wording = (
        "would exceed your organization's rate limit" if transport == "anthropic" else "Rate limit reached"
    )
    assert wording in rec.retries[0].error


def test_server_errors_and_overload_are_retried_then_succeed(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("flaky", [Turn(text="made it")])
    provider.inject_fault("server_error")
    provider.inject_fault("overloaded")
    rec = Recorder()
    rec.start(gateway, request(provider, "flaky", [m.user("hi")]))
    result = rec.result()
    assert result.message is not None and result.message.text == "made it"
    assert result.attempts == 3
    assert [r.status_code for r in rec.retries] == [500, 529 if transport == "anthropic" else 503]
    assert all(r.kind == "transient" and 0 < r.delay <= FAST_RETRY.max_delay for r in rec.retries)


def test_retries_stop_at_max_attempts(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    provider.inject_fault("server_error", count=3)
    rec = Recorder()
    rec.start(gateway, request(provider, "x", [m.user("hi")]))
    result = rec.result()
    assert result.error is not None and result.error.kind == "transient"
    assert result.error.status_code == 500
    assert result.attempts == 3
    assert len(rec.retries) == 2


def test_auth_errors_are_not_retried(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    provider.inject_fault("auth", count=3)
    rec = Recorder()
    rec.start(gateway, request(provider, "x", [m.user("hi")]))
    result = rec.result()
    assert result.error is not None and result.error.kind == "auth"
    assert result.error.status_code == 401
    assert result.attempts == 1 and rec.retries == []
    provider.clear_faults()


def test_a_hung_provider_times_out_and_the_timeout_is_retried(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("hung", [Turn(text="awake")])
    provider.inject_fault("hang")
    rec = Recorder()
    rec.start(gateway, request(provider, "hung", [m.user("hi")], timeout=1.0))
    result = rec.result()
    assert result.message is not None and result.message.text == "awake"
    assert [r.kind for r in rec.retries] == ["timeout"]


def test_a_hang_on_every_attempt_ends_as_a_timeout(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    gateway = Gateway(io, RetryConfig(max_attempts=1))
    provider.inject_fault("hang")
    result = sync_call(gateway, request(provider, "x", [m.user("hi")], timeout=0.3), timeout=10)
    assert result.error is not None and result.error.kind == "timeout"
    assert result.attempts == 1


@pytest.mark.parametrize("after_chunks", [0, 2])
def test_a_reset_connection_is_retried(
    transport: str, after_chunks: int, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("reset", [Turn(text="second time lucky")])
    provider.inject_fault("reset", after_chunks=after_chunks)
    rec = Recorder()
    rec.start(gateway, request(provider, "reset", [m.user("hi")]))
    result = rec.result()
    assert result.message is not None and result.message.text == "second time lucky"
    if after_chunks == 0 and transport in ("openai_compat", "anthropic") and not rec.retries:
        # a reset before a word of the answer, on a kept-alive connection: the native transport sent the
        # request again on a new connection itself, as HTTP clients do (tests/gateway/test_http_client.py)
        return
    assert len(rec.retries) == 1 and rec.retries[0].kind in ("transient", "timeout")


def test_cancel_stops_an_in_flight_stream(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    provider.chunk_delay = 0.2
    provider.add_script("slow", [Turn(text="word " * 40)])
    rec = Recorder()
    handle = rec.start(gateway, request(provider, "slow", [m.user("hi")]))
    deadline = time.monotonic() + 5
    while not rec.deltas and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.deltas, "the stream had started"
    started = time.monotonic()
    handle.cancel()
    result = rec.result()
    assert time.monotonic() - started < 1.0
    assert result.error is not None and result.error.kind == "cancelled"
    assert result.message is None
    assert handle.done
    handle.cancel()  # a second cancel is harmless
    time.sleep(0.05)
    assert len(rec.results) == 1
    assert gateway.in_flight == 0


def test_cancel_before_the_loop_starts_the_call(
    transport: str, provider: LocalProvider, io: IoLoop, gateway: Gateway
) -> None:
    blocker = threading.Event()
    io.call_soon(blocker.wait, 5)  # keep the loop busy so the call cannot start yet
    rec = Recorder()
    handle = rec.start(gateway, request(provider, "x", [m.user("hi")]))
    handle.cancel()
    blocker.set()
    result = rec.result()
    assert result.error is not None and result.error.kind == "cancelled"
    assert result.attempts == 0


def hang_on_request(messages: list[dict[str, Any]], tools: Any) -> Turn:
    """A responder: a request whose last message says "hang" hangs (until its client goes away); any other
    is answered. Unlike a script or an injected fault, what hangs does not depend on which request
    reaches the provider first (a call cancelled before it was sent never takes the hang for itself)."""
    return Turn(fault=Fault(kind="hang")) if messages[-1].get("content") == "hang" else Turn(text="next")


def cancel_a_hung_call_then_call_again(
    provider: LocalProvider, gateway: Gateway, delay: float, **kw: Any
) -> Recorder:
    """Start a call the provider hangs, cancel it after ``delay`` seconds, and check that it ends cancelled
    at once, that the provider lets go of it, and that the next call gets its answer."""
    provider.add_responder("hang-on-request", hang_on_request)
    hung = Recorder()
    handle = hung.start(gateway, request(provider, "hang-on-request", [m.user("hang")], timeout=60), **kw)
    if delay:
        time.sleep(delay)
    handle.cancel()
    result = hung.result(timeout=3)
    assert result.error is not None and result.error.kind == "cancelled", result
    again = Recorder()
    again.start(gateway, request(provider, "hang-on-request", [m.user("again")], timeout=60))
    answer = again.result(timeout=5)
    assert answer.message is not None and answer.message.text == "next", answer
    deadline = time.monotonic() + 3
    while provider.hanging and time.monotonic() < deadline:
        time.sleep(0.01)
    assert provider.hanging == 0, "the provider still holds the cancelled request: its connection is open"
    assert gateway.in_flight == 0
    return hung


@pytest.mark.parametrize("delay", [0.0, 0.001, 0.005, 0.02, 0.05, 0.2])
def test_a_call_cancelled_before_its_first_byte_leaves_nothing_behind(
    transport: str, delay: float, provider: LocalProvider, gateway: Gateway
) -> None:
    """Cancelled while it waits for the provider's first byte (or before it was even sent), a call ends
    cancelled, closes its connection (none goes back to a pool) and the next call is answered."""
    cancel_a_hung_call_then_call_again(provider, gateway, delay)


def test_a_cancel_that_arrives_as_the_call_connects_is_not_lost(
    provider: LocalProvider, io: IoLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The native transport, cancelled in the loop iteration its connection is made. (On Python 3.11,
    ``asyncio.wait_for`` around the connect dropped that cancel: the request went out anyway, the provider
    hung it, and the call ended only at its read timeout, holding its connection.)"""
    real_connect = asyncio.open_connection
    handles: list[Any] = []

    async def connect_then_cancel(*args: Any, **kwargs: Any) -> Any:
        for _ in range(5_000):  # the test thread keeps the call's handle once complete() returns
            if handles:
                break
            await asyncio.sleep(0.001)
        connection = await real_connect(*args, **kwargs)
        if handles:
            handles.pop().cancel()  # from the loop thread: the task's cancel is due in the next iteration
        return connection

    gateway = Gateway(io, FAST_RETRY)  # its own pools: the call must open a connection
    monkeypatch.setattr(asyncio, "open_connection", connect_then_cancel)
    _FORCED["transport"] = "openai_compat"
    try:
        provider.add_responder("hang-on-request", hang_on_request)
        hung = Recorder()
        req = request(provider, "hang-on-request", [m.user("hang")], timeout=60)
        handles.append(hung.start(gateway, req))
        result = hung.result(timeout=3)
        assert result.error is not None and result.error.kind == "cancelled", result
        assert not handles, "the call connected"
        monkeypatch.setattr(asyncio, "open_connection", real_connect)
        cancel_a_hung_call_then_call_again(provider, gateway, 0.05)
    finally:
        _FORCED["transport"] = "auto"


def test_a_stalled_stream_is_reported_once_per_stall(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.chunk_delay = 0.3
    provider.chunk_chars = 1000
    provider.add_script("stally", [Turn(text="abc")])
    rec = Recorder()
    rec.start(gateway, request(provider, "stally", [m.user("hi")]), stall_after=0.05)
    result = rec.result()
    assert result.ok
    # Frames: role, text, finish, usage, [DONE], 0.3 s apart: 4 gaps, each six times stall_after. Reporting
    # every 0.05 s of silence would give ~20 stalls; once per stall gives one per gap (and maybe one more
    # while the request itself is sent).
    # Anthropic's events: message_start, ping, block start, delta, block stop, message_delta, message_stop.
    assert 3 <= len(rec.stalls) <= (7 if transport == "anthropic" else 5), rec.stalls
    assert all(s >= 0.05 for s in rec.stalls)


def test_callbacks_that_raise_do_not_break_the_call(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("robust", [Turn(text="still fine")])
    box: list[CompletionResult] = []
    done = threading.Event()

    def bad_delta(delta: Delta) -> None:
        raise RuntimeError("subscriber bug")

    def on_result(result: CompletionResult) -> None:
        box.append(result)
        done.set()

    gateway.complete(request(provider, "robust", [m.user("hi")]), on_result, on_delta=bad_delta)
    assert done.wait(10)
    assert box[0].message is not None and box[0].message.text == "still fine"


def test_concurrent_calls_share_the_loop(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    provider.add_script("many", [Turn(text="same")], loop=True)
    recs = [Recorder() for _ in range(20)]
    for rec in recs:
        rec.start(gateway, request(provider, "many", [m.user("hi")]))
    assert all(rec.result().ok for rec in recs)


def test_stopping_the_io_loop_closes_the_connections_its_calls_opened(
    transport: str, provider: LocalProvider
) -> None:
    provider.add_script("pooled", [Turn(text="kept alive")], loop=True)
    before = Resources.now()
    io = IoLoop(name="test-io-pool")
    gateway = Gateway(io, FAST_RETRY)
    recs = [Recorder() for _ in range(6)]
    for rec in recs:
        rec.start(gateway, request(provider, "pooled", [m.user("hi")]))
    assert all(rec.result().ok for rec in recs)
    _, during = Resources.now().leaked_since(before)
    assert any("socket:" in fd for fd in during), "the calls keep their connections open for reuse"
    io.stop()
    threads, fds = wait_for_no_leaks(before, timeout=5)
    assert not threads, f"threads left after stop: {threads}"
    assert not fds, f"connections left open after stop: {fds}"


def test_policy_replies_work_through_the_gateway(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    result = sync_call(
        gateway, request(provider, "agentcell-local", [m.user("Summarize docs/guide.md")], tools=tools)
    )
    assert result.message is not None
    assert [(c.name, c.parsed_arguments()) for c in result.message.tool_calls] == [
        ("read_file", {"path": "docs/guide.md"})
    ]
    sent = provider.request_log[-1].body
    if transport == "anthropic":
        function = tools[0]["function"]
        assert sent["tools"] == [
            {"name": "read_file", "input_schema": function["parameters"], "type": "custom"}
        ]
        assert set(sent) <= {"model", "messages", "tools", "stream", "max_tokens"}, "no internal flags leak"
        return
    assert sent["tools"] == tools
    assert set(sent) <= {"model", "messages", "tools", "stream", "stream_options"}, "no internal flags leak"


@pytest.mark.parametrize("mode", ["auto", "openai_compat"])
def test_mock_response_needs_no_network_and_goes_to_litellm(mode: Any, gateway: Gateway) -> None:
    req = CompletionRequest(
        model="gpt-4o-mini", messages=[m.user("hi")], mock_response="mocked!", api_key="sk-x", transport=mode
    )
    assert gateway.route(req).transport == "litellm", "only litellm has an in-process fake"
    result = complete_sync(gateway, req, timeout=10)
    assert result.transport == "litellm"
    assert result.message is not None and result.message.text == "mocked!"
    assert result.usage.cost is not None and result.usage.cost > 0, "litellm knows gpt-4o-mini's prices"


def test_the_api_key_never_shows(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    secret = "sk-secret-never-shown-9f8e"
    req = msgspec.structs.replace(request(provider, "x", [m.user("hi")]), api_key=secret)
    assert secret not in repr(req) and secret not in str(req)
    provider.inject_fault("auth")
    result = sync_call(gateway, req, timeout=10)
    assert result.error is not None
    assert secret not in repr(result)


def test_complete_sync_cancels_on_timeout(transport: str, provider: LocalProvider, gateway: Gateway) -> None:
    provider.inject_fault("hang")
    result = sync_call(gateway, request(provider, "x", [m.user("hi")], timeout=30), timeout=0.3)
    assert result.error is not None and result.error.kind == "cancelled"


def test_an_injected_overflow_fault_is_an_overflow(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.overflow_format = "anthropic"
    provider.inject_fault("overflow")
    result = sync_call(gateway, request(provider, "x", [m.user("short")]))
    assert result.error is not None and result.error.kind == "overflow"
    assert result.attempts == 1


@pytest.mark.parametrize("after_chunks", [0, 3])
def test_an_error_event_mid_stream_is_transient_and_retried(
    after_chunks: int, transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("broken", [Turn(text="whole at last")])
    provider.inject_fault("stream_error", after_chunks=after_chunks)
    rec = Recorder()
    rec.start(gateway, request(provider, "broken", [m.user("hi")]))
    result = rec.result()
    assert result.message is not None and result.message.text == "whole at last"
    assert [r.kind for r in rec.retries] == ["transient"]
    # OpenAI's server error; Anthropic's mid-stream error event is an overloaded_error
    assert ("Overloaded" if transport == "anthropic" else "The server had an error") in rec.retries[0].error


def test_an_error_event_on_every_attempt_ends_as_a_transient_error(
    transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.inject_fault("stream_error", count=3)
    result = sync_call(gateway, request(provider, "x", [m.user("hi")]))
    assert result.error is not None and result.error.kind == "transient"
    assert result.attempts == 3


@pytest.mark.parametrize("stream", [True, False])
def test_reasoning_sent_as_reasoning_is_read_as_reasoning_content(
    stream: bool, transport: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.reasoning_field = "reasoning"  # OpenRouter's, recent vLLM's and Ollama's name for it
    provider.add_script("router", [Turn(text="Paris.", reasoning="The capital of France.")])
    rec = Recorder()
    rec.start(gateway, request(provider, "router", [m.user("Capital of France?")], stream=stream))
    result = rec.result()
    assert result.message is not None
    assert (result.message.reasoning, result.message.text) == ("The capital of France.", "Paris.")
    if stream:
        assert "".join(d.text for d in rec.deltas if d.kind == "reasoning") == "The capital of France."


# Anthropic's model_context_window_exceeded: the output stopped because the window is full.
@pytest.mark.parametrize("finish_reason", ["length", "max_tokens", "model_context_window_exceeded"])
def test_a_length_stop_and_its_usage_come_through(
    transport: str, finish_reason: str, provider: LocalProvider, gateway: Gateway
) -> None:
    provider.add_script("long", [Turn(text="cut short", finish_reason=finish_reason)])
    result = sync_call(gateway, request(provider, "long", [m.user("go on")], max_tokens=3))
    assert result.message is not None and result.message.stop_reason == "length"
    assert provider.request_log[-1].body["max_tokens"] == 3
    assert result.usage.output_tokens == tokens("cut short")


def test_the_api_key_comes_from_the_environment_as_litellm_reads_it(
    transport: str, monkeypatch: pytest.MonkeyPatch, io: IoLoop
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    with LocalProvider(api_key="sk-from-env") as keyed:
        keyed.add_script("env", [Turn(text="authorized")])
        gateway = Gateway(io, FAST_RETRY)  # a new gateway resolves its routes anew
        req = msgspec.structs.replace(request(keyed, "env", [m.user("hi")]), api_key=None)
        result = sync_call(gateway, req)
        assert result.message is not None and result.message.text == "authorized"
        assert "sk-from-env" not in repr(gateway.route(req))


# --- pure helpers ------------------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    cfg = RetryConfig(base_delay=1.0, max_delay=30.0, jitter=0.25)
    rng = random.Random(7)
    for attempt, nominal in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (6, 30.0), (10, 30.0)]:
        delays = [backoff_delay(attempt, cfg, rng=rng) for _ in range(200)]
        assert all(0.75 * nominal <= d <= nominal for d in delays)
        assert len(set(delays)) > 100, "jittered"
    assert backoff_delay(1, cfg, retry_after=7.0) == 7.0
    assert 0.75 <= backoff_delay(1, cfg, retry_after=3600.0) <= 1.0, "an absurd retry-after is not honoured"


def test_retry_after_headers_are_parsed() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after": "1.5", "retry-after-ms": "250"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 10, usegmt=True)
    parsed = retry_after_seconds({"retry-after": date}, now=now)
    assert parsed is not None and 9.0 <= parsed <= 10.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds(None) is None


def test_usage_normalization_covers_openai_and_anthropic_shapes() -> None:
    openai = {
        "prompt_tokens": 1200,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "completion_tokens_details": {"reasoning_tokens": 120},
    }
    assert normalize_usage(openai, cost=0.5) == m.Usage(
        input_tokens=1200, output_tokens=300, reasoning_tokens=120, cache_read_tokens=1024, cost=0.5
    )
    anthropic = {
        "input_tokens": 50,
        "output_tokens": 10,
        "cache_read_input_tokens": 900,
        "cache_creation_input_tokens": 40,
    }
    assert normalize_usage(anthropic) == m.Usage(
        input_tokens=50, output_tokens=10, cache_read_tokens=900, cache_write_tokens=40
    )
    assert normalize_usage(None) == m.Usage()


def test_fields_are_read_from_litellm_objects_dicts_and_plain_objects() -> None:
    import litellm
    import pydantic

    from runtime.gateway._usage import field as _field

    usage = litellm.Usage(prompt_tokens=7, completion_tokens=3)
    assert _field(usage, "prompt_tokens") == 7
    assert _field(usage, "no_such_field") is None
    del usage.completion_tokens_details  # litellm deletes unset optional fields
    assert _field(usage, "completion_tokens_details") is None
    delta = litellm.utils.Delta(content="hi", reasoning_content="thinking")
    assert (_field(delta, "content"), _field(delta, "reasoning_content")) == ("hi", "thinking")

    class WithProperty(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        base: int = 2

        @property
        def doubled(self) -> int:
            return self.base * 2

    shaped = WithProperty(note="extra")  # type: ignore[call-arg]
    for _ in range(2):  # the second lookup answers from the per-class cache
        assert _field(shaped, "doubled") == 4, "a property is computed"
        assert _field(shaped, "note") == "extra", "an extra field is read"
        assert _field(shaped, "base") == 2
        assert _field(shaped, "missing") is None

    class Plain:
        def __init__(self) -> None:
            self.content = "plain"

        @property
        def computed(self) -> str:
            return "yes"

    assert (_field(Plain(), "content"), _field(Plain(), "computed"), _field(Plain(), "x")) == (
        "plain",
        "yes",
        None,
    )
    assert _field({"a": 1}, "a") == 1 and _field({"a": 1}, "b") is None and _field(None, "a") is None


def test_a_cost_stamped_on_the_usage_is_taken_as_it_is() -> None:
    import litellm

    from runtime.gateway._cost import prices_for, usage_with_cost

    prices = prices_for(litellm, "gpt-4o-mini")
    stamped = litellm.Usage(prompt_tokens=1000, completion_tokens=100)
    stamped.cost = 0.25  # what litellm (or the provider) reported for this call
    assert usage_with_cost(stamped, prices, "litellm").cost == 0.25
    breakdown = {"prompt_tokens": 1000, "completion_tokens": 100, "cost": {"total_cost": 0.125}}
    assert usage_with_cost(breakdown, prices, "x").cost == 0.125, "a provider's breakdown gives its total"
    unstamped = litellm.Usage(prompt_tokens=1000, completion_tokens=100)
    rates = litellm.model_cost["gpt-4o-mini"]
    expected = 1000 * rates["input_cost_per_token"] + 100 * rates["output_cost_per_token"]
    priced = usage_with_cost(unstamped, prices, "openai_compat")
    assert priced.cost == pytest.approx(expected), "priced by litellm's map"
    assert priced.transport == "openai_compat"
    assert prices_for(litellm, "openai/no-such-model-here") is None, "no price known"
    assert usage_with_cost(unstamped, None, "x").cost is None
    assert usage_with_cost(None, prices, "x").cost is None


def test_an_hours_cache_writes_are_priced_at_the_hour_rate_as_litellm_prices_them() -> None:
    """Anthropic bills a write kept for an hour at 2x input, one kept 5 minutes at 1.25x: usage that says
    how many were written for an hour (``cache_creation``: the native transport's and litellm's) costs what
    litellm's own ``cost_per_token`` says, which prices each lifetime from its map."""
    import litellm
    from litellm.types.utils import CacheCreationTokenDetails, PromptTokensDetailsWrapper

    from runtime.gateway._cost import prices_for
    from runtime.gateway._usage import normalize_usage
    from runtime.gateway.transports.anthropic import raw_usage

    prices = prices_for(litellm, "claude-sonnet-4-5")
    assert prices is not None
    rates = prices.base
    assert rates.hour_write == pytest.approx(2 * rates.input) and rates.cache_write == pytest.approx(
        1.25 * rates.input
    )
    details = CacheCreationTokenDetails(ephemeral_5m_input_tokens=500, ephemeral_1h_input_tokens=1500)
    usage = litellm.Usage(
        prompt_tokens=5000,
        completion_tokens=50,
        total_tokens=5050,
        prompt_tokens_details=PromptTokensDetailsWrapper(
            cached_tokens=1000, cache_creation_tokens=2000, cache_creation_token_details=details
        ),
        cache_creation_input_tokens=2000,
        cache_read_input_tokens=1000,
    )
    prompt_cost, completion_cost = litellm.cost_per_token(model="claude-sonnet-4-5", usage_object=usage)
    ours = normalize_usage(usage)
    assert (ours.cache_write_tokens, ours.cache_write_1h_tokens) == (2000, 1500)
    assert prices.cost(ours) == pytest.approx(prompt_cost + completion_cost, rel=1e-9)
    assert prices.split(ours).cache_write == pytest.approx(500 * rates.cache_write + 1500 * rates.hour_write)
    # the same usage as Anthropic's Messages API sends it, read by the native transport
    native = normalize_usage(
        raw_usage(
            {
                "input_tokens": 2000,
                "output_tokens": 50,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 2000,
                "cache_creation": {"ephemeral_5m_input_tokens": 500, "ephemeral_1h_input_tokens": 1500},
            }
        )
    )
    assert native.cache_write_1h_tokens == 1500
    assert prices.cost(native) == pytest.approx(prompt_cost + completion_cost, rel=1e-9)
    # a sum of usages keeps the split
    assert (ours + native).cache_write_1h_tokens == 3000


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4o-mini",
        "openai/gpt-4o",
        "o3-mini",
        "gpt-5",
        "claude-sonnet-4-5",
        "deepseek/deepseek-chat",
        "gemini/gemini-2.5-pro",
    ],
)
def test_prices_read_once_give_litellms_cost(model: str) -> None:
    import litellm
    from litellm.types.utils import CompletionTokensDetailsWrapper, PromptTokensDetailsWrapper

    from runtime.gateway._cost import prices_for

    prices = prices_for(litellm, model)
    assert prices is not None
    assert prices_for(litellm, model) is prices, "looked up once, then cached"
    # (prompt, completion, cache read, cache write, reasoning); 250,000 is over Gemini's 200k tier
    for prompt, completion, read, write, reasoning in [
        (1000, 100, 0, 0, 0),
        (1000, 300, 600, 0, 120),
        (250_000, 1000, 10_000, 0, 0),
        (5000, 50, 1000, 2000, 0),
    ]:
        usage = litellm.Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetailsWrapper(cached_tokens=read, cache_creation_tokens=write),
            completion_tokens_details=CompletionTokensDetailsWrapper(reasoning_tokens=reasoning),
            cache_creation_input_tokens=write,
            cache_read_input_tokens=read,
        )
        prompt_cost, completion_cost = litellm.cost_per_token(model=model, usage_object=usage)
        expected = prompt_cost + completion_cost
        ours = m.Usage(
            input_tokens=prompt,
            output_tokens=completion,
            cache_read_tokens=read,
            cache_write_tokens=write,
            reasoning_tokens=reasoning,
        )
        assert prices.cost(ours) == pytest.approx(expected, rel=1e-9, abs=1e-15), (
            prompt,
            completion,
            read,
            write,
        )
        # split by kind of token: the prompt's three kinds are litellm's prompt cost, output its completion cost
        split = prices.split(ours)
        assert split.input + split.cache_read + split.cache_write == pytest.approx(
            prompt_cost, rel=1e-9, abs=1e-15
        )
        assert split.output == pytest.approx(completion_cost, rel=1e-9, abs=1e-15)
        rates = next((r for t, r in reversed(prices.tiers) if prompt > t), prices.base)
        assert split.cache_read == pytest.approx(read * rates.cache_read, rel=1e-9, abs=1e-15)
        assert split.without_cache == pytest.approx(
            prompt * rates.input + completion_cost, rel=1e-9, abs=1e-15
        )
        assert split.saved == pytest.approx(split.without_cache - expected, rel=1e-9, abs=1e-15)


def test_classification_of_litellm_exceptions() -> None:
    import litellm

    overflow = litellm.ContextWindowExceededError(message="too long", model="m", llm_provider="openai")
    assert classify_error(overflow).kind == "overflow"
    rate = litellm.RateLimitError(message="Rate limit reached for requests", model="m", llm_provider="openai")
    assert classify_error(rate).kind == "rate_limit"
    param = litellm.BadRequestError(
        message="max_tokens is too large: 99999", model="m", llm_provider="openai"
    )
    assert classify_error(param).kind == "invalid_request"
    assert classify_error(ConnectionResetError(104, "Connection reset by peer")).kind == "transient"
    assert classify_error(TimeoutError()).kind == "timeout"
    assert classify_error(ValueError("something odd")).kind == "unknown"


def test_reasoning_goes_back_only_where_the_provider_accepts_it() -> None:
    assert accepts_reasoning("anthropic/claude-sonnet-4-5", None)
    assert accepts_reasoning("openai/local-model", "http://127.0.0.1:8400/v1")
    assert not accepts_reasoning("gpt-4o", None)
    assert not accepts_reasoning("openai/gpt-4o", None)
    assert not accepts_reasoning("deepseek/deepseek-reasoner", None)


def test_io_loop_runs_submitted_work_and_stops() -> None:
    loop = IoLoop(name="test-io")

    async def add(a: int, b: int) -> int:
        return a + b

    assert loop.submit(add(2, 3)).result(timeout=5) == 5
    seen = threading.Event()
    loop.call_soon(seen.set)
    assert seen.wait(5)
    loop.stop()
    assert not loop.running
    loop.stop()  # idempotent
    with pytest.raises(RuntimeError, match="I/O loop is stopped"):
        Gateway(loop).complete(CompletionRequest(model="m", messages=[]), lambda result: None)
