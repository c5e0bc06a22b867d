"""A provider that goes silent: the headers, first-byte and stall limits (``retry.headers_timeout``,
``retry.first_byte_timeout``, ``retry.stall_timeout``) cancel the attempt and retry it as a timeout, on both
transports, instead of waiting out ``request_timeout`` (600 s by default) on every attempt. Keep-alives (SSE
comments) are not an answer: they reset none of those clocks, and ``request_timeout`` bounds every attempt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import msgspec
import pytest

import runtime
from runtime import messages as m
from runtime.config import Config, RetryConfig
from runtime.gateway import CompletionRequest, CompletionResult, Gateway, IoLoop, RetryInfo, complete_sync
from runtime.provider import LocalProvider, Turn

TRANSPORTS = ("litellm", "openai_compat", "anthropic")
"""``anthropic``: an ``anthropic/`` model over the local provider's Messages API (natively, under ``auto``),
whose keep-alives are ``ping`` events rather than SSE comments."""
SILENCE = 0.4


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider() as p:
        yield p


@pytest.fixture(autouse=True)
def _reset(provider: LocalProvider) -> None:
    provider.clear_faults()
    provider.chunk_chars = 24
    provider.chunk_delay = 0.0


@pytest.fixture(scope="module")
def io() -> Iterator[IoLoop]:
    loop = IoLoop()
    yield loop
    loop.stop()


def gateway(io: IoLoop, **limits: float) -> Gateway:
    retry = RetryConfig(max_attempts=2, base_delay=0.01, max_delay=0.02, **limits)
    gw = Gateway(io, retry)
    gw.preload().result(timeout=60)
    return gw


def request(provider: LocalProvider, model: str, transport: str) -> CompletionRequest:
    # request_timeout stays long: only the silence limits may end these attempts early.
    anthropic = transport == "anthropic"
    return CompletionRequest(
        model=f"anthropic/{model}" if anthropic else f"openai/{model}",
        messages=[m.user("hi")],
        api_base=provider.base_url if anthropic else provider.url,
        api_key="sk-local",
        transport="auto" if anthropic else transport,  # type: ignore[arg-type]
        timeout=60,
    )


class Recorder:
    def __init__(self) -> None:
        self.retries: list[RetryInfo] = []
        self.results: list[CompletionResult] = []
        self.done = threading.Event()

    def on_result(self, result: CompletionResult) -> None:
        self.results.append(result)
        self.done.set()

    def call(self, gw: Gateway, req: CompletionRequest) -> CompletionResult:
        gw.complete(req, self.on_result, on_retry=self.retries.append)
        assert self.done.wait(20), "no result delivered"
        (result,) = self.results
        return result


def wait_until_released(provider: LocalProvider) -> None:
    deadline = time.monotonic() + 10
    while provider.hanging and time.monotonic() < deadline:
        time.sleep(0.02)
    assert provider.hanging == 0, "the silent attempt's connection was never closed"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_that_stalls_midway_is_cancelled_and_retried(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    provider.add_script(f"stall-{transport}", [Turn(text="second wind")])
    provider.inject_fault("stall", after_chunks=2)
    rec = Recorder()
    result = rec.call(gateway(io, stall_timeout=SILENCE), request(provider, f"stall-{transport}", transport))
    assert result.message is not None and result.message.text == "second wind"
    assert result.attempts == 2 and result.transport == transport
    (retry,) = rec.retries
    assert retry.kind == "timeout"
    assert "stalled" in retry.error and "retry.stall_timeout" in retry.error  # not request_timeout (60 s)
    wait_until_released(provider)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_provider_that_never_answers_hits_the_first_byte_limit(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    provider.add_script(f"mute-{transport}", [Turn(text="late but here")])
    provider.inject_fault("hang")
    rec = Recorder()
    gw = gateway(io, first_byte_timeout=SILENCE, stall_timeout=0)
    result = rec.call(gw, request(provider, f"mute-{transport}", transport))
    assert result.message is not None and result.message.text == "late but here"
    (retry,) = rec.retries
    assert retry.kind == "timeout" and "no answer" in retry.error and "first_byte_timeout" in retry.error
    wait_until_released(provider)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_silence_on_every_attempt_ends_the_call_as_a_timeout(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    provider.inject_fault("stall", count=2, after_chunks=1)
    result = Recorder().call(gateway(io, stall_timeout=SILENCE), request(provider, "x", transport))
    assert result.message is None and result.error is not None
    assert result.error.kind == "timeout" and result.attempts == 2
    wait_until_released(provider)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_slow_stream_that_keeps_sending_is_not_cut(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    text = "A slow but steady answer, one small piece at a time, well past the stall limit in all."
    provider.add_script(f"slow-{transport}", [Turn(text=text)])
    provider.chunk_chars = 8
    provider.chunk_delay = SILENCE / 4  # ~12 chunks: the whole stream takes far longer than the limit
    gw, rec = gateway(io, stall_timeout=SILENCE), Recorder()
    started = time.monotonic()
    result = rec.call(gw, request(provider, f"slow-{transport}", transport))
    assert time.monotonic() - started > SILENCE
    assert result.message is not None and result.message.text == text
    assert result.attempts == 1 and rec.retries == []


def test_cancelling_a_watched_call_ends_it_and_frees_the_connection(
    provider: LocalProvider, io: IoLoop
) -> None:
    provider.inject_fault("stall", after_chunks=1)
    gw = gateway(io, stall_timeout=30)
    rec = Recorder()
    handle = gw.complete(request(provider, "x", "openai_compat"), rec.on_result)
    deadline = time.monotonic() + 10
    while not provider.hanging and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.cancel()
    assert rec.done.wait(10)
    (result,) = rec.results
    assert result.error is not None and result.error.kind == "cancelled"
    wait_until_released(provider)


def test_a_session_rides_out_a_stalled_stream(provider: LocalProvider, tmp_path: object) -> None:
    """Through the public API: the runtime's retry config sets the limit; the turn ends with the retried
    answer, and subscribers saw the retry with its reason."""
    provider.add_script("steady", [Turn(text="made it")])
    provider.inject_fault("stall", after_chunks=2)
    config = Config().with_overrides({"retry.stall_timeout": SILENCE, "retry.base_delay": 0.01})
    with runtime.Runtime(config, sessions_dir=str(tmp_path)) as rt:
        sid = rt.start_session(model="openai/steady", api_base=provider.url, api_key="sk-local")
        with rt.subscribe(sid, ["provider_retry"]) as events:
            assert rt.prompt(sid, "go").result(timeout=30).text == "made it"
            retries = events.drain()
    assert len(retries) == 1 and "stalled" in retries[0].error
    wait_until_released(provider)


def test_complete_sync_is_unchanged_for_calls_not_streamed(provider: LocalProvider, io: IoLoop) -> None:
    """A call not streamed has no first byte before its whole answer: only request_timeout applies."""
    provider.add_script("whole", [Turn(text="all at once")])
    provider.latency = SILENCE * 2
    try:
        req = msgspec.structs.replace(request(provider, "whole", "openai_compat"), stream=False)
        result = complete_sync(gateway(io, first_byte_timeout=SILENCE), req, timeout=20)
    finally:
        provider.latency = 0.0
    assert result.message is not None and result.message.text == "all at once" and result.attempts == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_keep_alives_before_any_data_count_toward_the_first_byte_limit(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    """Headers, then only ``: keep-alive`` comments every 0.1 s: not an answer; the first-byte limit ends the
    attempt (the comments would reset a clock that counted them, and the attempt would run forever)."""
    provider.add_script(f"kept-{transport}", [Turn(text="an answer at last")])
    provider.inject_fault("keepalive", after_chunks=0)
    rec = Recorder()
    gw = gateway(io, first_byte_timeout=SILENCE, stall_timeout=SILENCE / 2)
    result = rec.call(gw, request(provider, f"kept-{transport}", transport))
    assert result.message is not None and result.message.text == "an answer at last"
    (retry,) = rec.retries
    assert retry.kind == "timeout" and "retry.first_byte_timeout" in retry.error
    assert "headers, then no data" in retry.error
    wait_until_released(provider)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_keep_alives_after_data_count_toward_the_stall_limit(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    provider.add_script(f"kept2-{transport}", [Turn(text="second wind")])
    provider.inject_fault("keepalive", after_chunks=2)
    rec = Recorder()
    result = rec.call(gateway(io, stall_timeout=SILENCE), request(provider, f"kept2-{transport}", transport))
    assert result.message is not None and result.message.text == "second wind"
    (retry,) = rec.retries
    assert retry.kind == "timeout" and "stalled" in retry.error and "retry.stall_timeout" in retry.error
    wait_until_released(provider)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_request_timeout_bounds_a_stream_of_keep_alives(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    """With the silence limits off, ``request_timeout`` still ends each attempt, streamed or not (the
    transports' own read timeouts never fire: something arrives every 0.1 s)."""
    provider.inject_fault("keepalive", count=2, after_chunks=1)
    gw = gateway(io, headers_timeout=0, first_byte_timeout=0, stall_timeout=0)
    req = msgspec.structs.replace(request(provider, "x", transport), timeout=SILENCE * 2)
    started = time.monotonic()
    rec = Recorder()
    result = rec.call(gw, req)
    assert time.monotonic() - started < 10
    assert result.message is None and result.error is not None
    assert result.error.kind == "timeout" and result.attempts == 2
    assert "retry.request_timeout" in result.error.message
    wait_until_released(provider)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_dead_provider_fails_on_the_headers_limit(
    transport: str, provider: LocalProvider, io: IoLoop
) -> None:
    """No headers at all: ``retry.headers_timeout`` ends the attempt long before the first-byte limit a
    reasoning model needs."""
    provider.add_script(f"dead-{transport}", [Turn(text="back")])
    provider.inject_fault("hang")
    rec = Recorder()
    gw = gateway(io, headers_timeout=SILENCE, first_byte_timeout=60)
    result = rec.call(gw, request(provider, f"dead-{transport}", transport))
    assert result.message is not None and result.message.text == "back"
    (retry,) = rec.retries
    assert (
        retry.kind == "timeout"
        and "retry.headers_timeout" in retry.error
        and "not even headers" in retry.error
    )
    wait_until_released(provider)


def test_the_defaults_fail_a_dead_provider_within_a_minute_an_attempt() -> None:
    retry = RetryConfig()
    assert retry.headers_timeout <= 60
    assert (
        retry.first_byte_timeout >= retry.headers_timeout
    )  # reasoning models think before their first token


def test_a_session_turn_on_keep_alives_ends_at_its_request_timeout(
    provider: LocalProvider, tmp_path: object
) -> None:
    """The issue's case through the public API: a session's ``retry.request_timeout`` ends a turn whose
    provider sends only keep-alives, with a clear timeout error (it ran until the provider stopped)."""
    provider.inject_fault("keepalive", count=3, after_chunks=0)
    config = Config().with_overrides({"retry.base_delay": 0.01, "retry.max_delay": 0.02})
    with runtime.Runtime(config, sessions_dir=str(tmp_path)) as rt:
        sid = rt.start_session(
            model="openai/x",
            api_base=provider.url,
            api_key="sk-local",
            config={"retry.request_timeout": SILENCE * 2},
        )
        started = time.monotonic()
        result = rt.prompt(sid, "go").result(timeout=30)
        assert time.monotonic() - started < 20
    assert result.status == "error" and result.error is not None
    assert "retry.request_timeout" in result.error
    wait_until_released(provider)
