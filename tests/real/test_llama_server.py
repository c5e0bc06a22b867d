"""agentcell against a real model: llama.cpp's server with SmolLM2-135M-Instruct (``pytest -m real_model``).

The model is tiny: these tests check the protocol and the runtime's handling of a real server (its window,
its tokenizer, its refusals, its streams, its slots), never the model's wisdom.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks._llama import server_counts
from benchmarks.bench_real import agents_refused
from tests.conftest import Recorder
from tests.real.conftest import LlamaServer

# A tiny model on two cores: seconds a turn when the machine is quiet, far more when it is not.
pytestmark = [pytest.mark.real_model, pytest.mark.timeout(1800)]

MODEL = "openai/smollm2"  # a name no table knows: what a newcomer types
SYSTEM = "You are a helpful assistant. Answer in one or two sentences."
SHORT = {"agent.max_output_tokens": 128}  # where the length of an answer is not what is tested
# ~250 tokens of notes a prompt: a window of 2,048 fills in a handful of turns
NOTES = " ".join(
    f"Note {i}: the blue house on street {i} has a red door and a green roof." for i in range(16)
)
TOPICS = [
    "the moon", "rivers", "bread", "trains", "owls", "volcanoes", "tea", "bicycles", "glaciers", "bees",
    "lighthouses", "chess", "deserts", "violins", "coral reefs", "windmills", "comets", "maple trees",
    "submarines", "penguins", "castles", "thunderstorms", "libraries", "kites", "salt", "clocks", "foxes",
    "bridges", "honey", "snow",
]  # fmt: skip


@pytest.fixture
def real_rt(tmp_path: Path) -> Iterator[Any]:
    from runtime import Runtime
    from runtime.config import Config

    # Summaries of at most 256 tokens: SmolLM2 writes them at 5-50 tokens a second on two cores. Nothing
    # here configures a window or an answer's length (the tests that bound the answer say so).
    config = Config().with_overrides(
        {"retry.base_delay": 0.05, "retry.max_delay": 0.5, "compaction.summary_max_output_tokens": 256}
    )
    with Runtime(config, sessions_dir=tmp_path / "sessions") as r:
        yield r


class _Caught(Recorder):
    """A recorder whose reads come after its callback has seen every event published so far: the callback runs
    on the subscription's thread, so right after ``handle.result()`` it may not yet hold the turn's last events
    (a race seen in the default suite's tests under load)."""

    subscription: Any = None

    def caught(self) -> list[Any]:
        if self.subscription is not None:
            assert self.subscription.flush(60), "the events' callback did not catch up within 60 s"
        with self._cond:
            return list(self.events)

    def types(self, session_id: str | None = None) -> list[str]:
        self.caught()
        return super().types(session_id)

    def of(self, kind: str, session_id: str | None = None) -> list[Any]:
        self.caught()
        return super().of(kind, session_id)


@pytest.fixture
def events(real_rt: Any) -> Iterator[_Caught]:
    rec = _Caught()
    rec.subscription = real_rt.subscribe(callback=rec)
    yield rec
    rec.subscription.close()


def _turns(rt: Any, sid: str, count: int, timeout: float = 600) -> list[Any]:
    results = []
    for topic in TOPICS[:count]:
        results.append(rt.prompt(sid, f"Tell me about {topic}.").result(timeout=timeout))
    return results


def _refusals(events: _Caught, sid: str) -> int:
    """The session's requests the server refused as larger than its context: a request with no answer
    (no ``turn_end``) that the emergency compaction of an overflow error followed. An emergency compaction
    a turn makes before its request (it would not fit the session's limit) is no refusal."""
    mine = [e for e in events.caught() if e.session_id == sid]
    return len(agents_refused(mine))


class _ServerLog:
    """The requests a shared server refused from now on, read from its own log (the summarizers' too)."""

    def __init__(self, server: LlamaServer) -> None:
        self.server = server
        self.before = server_counts(server.log)

    def refused(self) -> list[str]:
        return list(server_counts(self.server.log).refused[len(self.before.refused) :])

    def requests(self) -> int:
        return server_counts(self.server.log).requests - self.before.requests


def test_a_newcomers_session_finds_the_window_and_never_overflows(
    real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    """``model="openai/smollm2"``, an api_base, nothing configured: the window comes from the server's
    /props (2,048 tokens on one slot), every one of 30 turns ends ok, and the server refuses nothing, across
    the compactions a 2,048-token window needs (made by the real model as summarizer)."""
    # Answers of at most 96 tokens (a CI-sized run: SmolLM2 otherwise rambles up to the room left, ~1,000
    # tokens, 20 s a turn); the window is still nobody's but the server's, and the cap to the room left is
    # the smaller one whenever less than 96 tokens are left.
    sid = real_rt.start_session(
        model=MODEL, api_base=llama_server.url, system_prompt=SYSTEM, config={"agent.max_output_tokens": 96}
    )
    assert real_rt.context_stats(sid).window == llama_server.ctx_per_slot == 2048
    results = _turns(real_rt, sid, 30)
    assert [r.status for r in results] == ["ok"] * 30, [r.error for r in results if r.status != "ok"]
    assert _refusals(events, sid) == 0
    # (one stream the server cut, retried and answered, was seen once in a run beside a busy test suite)
    assert len(events.of("provider_retry", sid)) <= 1
    assert events.of("compaction_end", sid), "30 turns in 2,048 tokens compact at least once"
    # every request asked for no more than the window leaves
    starts = events.of("request_start", sid)
    assert starts and all(s.estimated_tokens < 2048 for s in starts)


def test_a_newcomer_without_discovery_learns_the_window_from_the_first_refusal(
    real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    """Discovery off (or a server that does not say): the first refusal names llama.cpp's n_ctx, the
    session learns it (``window_learned``), compacts with the real model and goes on: every one of 12 turns
    of ~250 tokens each ok, at most one refusal."""
    sid = real_rt.start_session(
        model=MODEL,
        api_base=llama_server.url,
        system_prompt=SYSTEM,
        config={"models.discover_windows": False, **SHORT},
    )
    assert real_rt.context_stats(sid).window == 128_000  # the fallback: nobody said otherwise
    results = [
        real_rt.prompt(sid, f"My notes: {NOTES} Now tell me about {topic}.").result(timeout=900)
        for topic in TOPICS[:12]
    ]  # (each turn may take minutes on a busy machine)
    assert [r.status for r in results] == ["ok"] * 12, [r.error for r in results if r.status != "ok"]
    (learned,) = events.of("window_learned", sid)
    assert (learned.old, learned.new, learned.source) == (128_000, 2048, "overflow")
    assert real_rt.context_stats(sid).window == 2048
    assert _refusals(events, sid) <= 1
    # a later session on the same endpoint starts with the learned window
    later = real_rt.start_session(
        model=MODEL, api_base=llama_server.url, config={"models.discover_windows": False}
    )
    assert real_rt.context_stats(later).window == 2048


def test_tools_and_tool_calls_go_through_the_servers_jinja_template(
    real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    """The protocol, not the model's wisdom (SmolLM2's template has no tool calling, and it does not call
    tools): a session with a tool gets its turn answered (the server takes the tool schema through
    ``--jinja``), and a history holding an assistant tool call and its result, in the chat format the
    runtime sends, is rendered by the server's template and answered."""
    from runtime import messages as m
    from runtime.gateway import CompletionRequest, Gateway, IoLoop, complete_sync
    from runtime.tools.registry import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"It is sunny and 21 degrees in {city}."

    sid = real_rt.start_session(
        model=MODEL,
        api_base=llama_server.url,
        system_prompt="You can call tools. Use get_weather to answer questions about the weather.",
        tools=[get_weather],
        config=SHORT,
    )
    result = real_rt.prompt(sid, "What is the weather in Paris? Call get_weather.").result(timeout=600)
    assert result.status == "ok", result.error
    assert result.text or (result.message is not None and result.message.tool_calls)

    call = m.ToolCallPart(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    history = [
        m.system("You can call tools."),
        m.user("What is the weather in Paris?"),
        m.assistant(tool_calls=[call]),
        m.tool_result("call_1", "get_weather", "It is sunny and 21 degrees in Paris."),
    ]
    io = IoLoop()
    try:
        gateway = Gateway(io)
        request = CompletionRequest(
            model=MODEL,
            messages=history,
            tools=[get_weather.schema()],
            api_base=llama_server.url,
            max_tokens=64,
            timeout=600,
        )
        answer = complete_sync(gateway, request, timeout=600)
    finally:
        io.stop()
    assert answer.error is None, answer.error
    assert answer.message is not None and answer.message.text.strip()
    assert answer.usage.input_tokens > 0 and answer.message.stop_reason in ("stop", "length")


def test_a_stream_is_aborted_midway_and_the_slot_is_free_again(
    real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    sid = real_rt.start_session(model=MODEL, api_base=llama_server.url, system_prompt=SYSTEM)
    handle = real_rt.prompt(sid, "Write a long story about a dragon who learns to bake bread.")
    events.wait_for(lambda evs: sum(e.type == "text_delta" and e.session_id == sid for e in evs) >= 5, 120)
    assert real_rt.abort(sid).result(timeout=10) is True
    result = handle.result(timeout=30)
    assert result.status == "aborted"
    deltas = sum(1 for e in events.of("text_delta", sid))
    time.sleep(0.5)
    assert sum(1 for e in events.of("text_delta", sid)) == deltas, "no delta after the abort"
    # the server's only slot is released (the runtime closed the stream, so llama.cpp stopped generating),
    # not busy writing the rest of a story nobody reads; then the next turn is answered
    assert _slots_idle(llama_server, within=120), "the aborted generation still holds the slot"
    again = real_rt.prompt(sid, "Say hello.").result(timeout=900)
    assert again.status == "ok" and again.text


def _slots_idle(server: LlamaServer, within: float) -> bool:
    import httpx

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        slots = httpx.get(f"{server.root}/slots", timeout=10).json()
        if all(not slot.get("is_processing") for slot in slots):
            return True
        time.sleep(0.5)
    return False


def test_a_real_overflow_is_compacted_by_the_real_model_and_retried(
    real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    """A window believed larger than the server's (configured wrong: 8,000): a prompt the server must
    refuse, the window learned from its n_ctx, a compaction whose summary the real model writes, and the
    same turn retried and answered."""
    sid = real_rt.start_session(
        model=MODEL,
        api_base=llama_server.url,
        system_prompt=SYSTEM,
        config={"models.context_windows": {MODEL: 8_000}, **SHORT},
    )
    # ~380 tokens a turn (notes and an answer of at most 128): a request passes the server's 2,048 around
    # the sixth turn, which the server refuses; that turn learns the window, compacts and is answered
    for topic in TOPICS[:7]:
        assert (
            real_rt.prompt(sid, f"My notes: {NOTES} Tell me about {topic}.").result(timeout=900).status
            == "ok"
        )
    # after it, a prompt that fits the learned window's room (half of it, after the output reserve)
    result = real_rt.prompt(sid, f"My notes: {NOTES} Which colour is the door?").result(timeout=900)
    (learned,) = events.of("window_learned", sid)
    assert (learned.old, learned.new, learned.source) == (8_000, 2048, "overflow")
    overflow = [e for e in events.of("compaction_start", sid) if e.trigger == "overflow"]
    assert overflow
    ends = events.of("compaction_end", sid)
    assert ends and ends[-1].summary_chars > 0 and ends[-1].tokens_after < ends[-1].tokens_before
    summaries = [m for m in real_rt.messages(sid, view="model") if m.kind == "compaction_summary"]
    assert summaries and summaries[-1].text.strip()
    # and the session goes on in the learned window
    assert result.status == "ok", result.error


def test_sessions_share_the_servers_four_slots(
    real_rt: Any, events: _Caught, llama_server_np4: LlamaServer
) -> None:
    """Four sessions at once on ``-np 4``: each discovers its slot's 1,024 tokens, every turn is answered,
    nothing is refused."""
    sids = [
        real_rt.start_session(model=MODEL, api_base=llama_server_np4.url, system_prompt=SYSTEM, config=SHORT)
        for _ in range(4)
    ]
    assert {real_rt.context_stats(s).window for s in sids} == {1024}
    outcomes: dict[str, list[str]] = {}

    def drive(sid: str, offset: int) -> None:
        topics = TOPICS[offset : offset + 4]
        outcomes[sid] = [
            real_rt.prompt(sid, f"Tell me about {t}.").result(timeout=900).status for t in topics
        ]

    threads = [threading.Thread(target=drive, args=(sid, 4 * i)) for i, sid in enumerate(sids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert outcomes == {sid: ["ok"] * 4 for sid in sids}
    assert all(_refusals(events, sid) == 0 for sid in sids)


def test_sessions_compacting_on_small_slots_are_never_refused_once_they_know_the_window(
    real_rt: Any, events: _Caught, llama_server_np4: LlamaServer
) -> None:
    """Four newcomers' sessions at once on four slots of 1,024 tokens, each compacting its context with the
    real model as summarizer again and again (answers of at most 128 tokens, a prompt of ~250 tokens of
    notes every third turn): every turn ends ok and the server refuses none of their requests, the agents'
    nor the summarizers' (its own log says so), the windows known from the first turn."""
    log = _ServerLog(llama_server_np4)
    sids = [
        real_rt.start_session(model=MODEL, api_base=llama_server_np4.url, system_prompt=SYSTEM, config=SHORT)
        for _ in range(4)
    ]
    assert {real_rt.context_stats(s).window for s in sids} == {1024}
    outcomes: dict[str, list[str]] = {}

    def drive(sid: str, offset: int) -> None:
        statuses = []
        for i, topic in enumerate(TOPICS[offset : offset + 6]):
            notes = f"My notes: {NOTES} " if i % 3 == 2 else ""
            statuses.append(real_rt.prompt(sid, f"{notes}Tell me about {topic}.").result(timeout=900).status)
        outcomes[sid] = statuses

    threads = [threading.Thread(target=drive, args=(sid, 6 * i % 24)) for i, sid in enumerate(sids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=1500)
    assert outcomes == {sid: ["ok"] * 6 for sid in sids}
    compacted = [len(events.of("compaction_end", sid)) for sid in sids]
    assert sum(compacted) >= 4, f"the windows were not exercised: compactions {compacted}"
    assert log.refused() == [], f"the server refused requests of {log.requests()}"
    assert [_refusals(events, sid) for sid in sids] == [0, 0, 0, 0]
    assert not events.of("window_learned")  # the windows came from the server before the first turn


def test_the_responses_front_door_on_a_real_model(
    tmp_path: Path, llama_server: LlamaServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/v1/responses`` of ``agentcell serve`` (in process, over real HTTP) driven by the official openai
    SDK, with llama.cpp behind it (named by OPENAI_BASE_URL, as an operator would): a response, a
    continuation by previous_response_id, and a stream. Answers are bounded by the server's own
    ``agent.max_output_tokens``: one cut short ends ``incomplete``, which is the front door's faithful
    answer, not a failure. A client's ``max_output_tokens`` below it is what the real server stops at
    (issue 40): the answer ends ``incomplete`` for ``max_output_tokens`` with at most that many tokens."""
    import openai

    from runtime import Runtime
    from runtime.apps.server import ApiServer
    from runtime.config import Config

    monkeypatch.setenv("OPENAI_BASE_URL", llama_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-none")
    token = "real-token"
    done = ("completed", "incomplete")
    config = Config().with_overrides(SHORT)
    with (
        Runtime(config, sessions_dir=tmp_path / "sessions") as rt,
        ApiServer(rt, token) as server,
        openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0, timeout=900) as client,
    ):
        first = client.responses.create(model=MODEL, input="Name a colour.", instructions=SYSTEM)
        assert first.status in done and first.output_text.strip()
        assert first.usage is not None and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        second = client.responses.create(model=MODEL, input="And another one?", previous_response_id=first.id)
        assert second.status in done and second.previous_response_id == first.id
        kinds: list[str] = []
        text = []
        final = None
        with client.responses.stream(model=MODEL, input="Count to five.") as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    text.append(event.delta)
                elif event.type in ("response.completed", "response.incomplete"):
                    final = event.response  # (the SDK's get_final_response() wants response.completed only)
        assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
        assert final is not None and "".join(text) == final.output_text and final.output_text.strip()
        capped = client.responses.create(
            model=MODEL, input="Write a long story about a dragon and a knight.", max_output_tokens=16
        )
        assert capped.status == "incomplete" and capped.incomplete_details is not None
        assert capped.incomplete_details.reason == "max_output_tokens"
        assert capped.usage is not None and 0 < capped.usage.output_tokens <= 16


# --- Anthropic's Messages API: llama-server also answers POST /v1/messages (streamed and not) ---------------

ANTHROPIC_MODEL = "anthropic/smollm2"


@pytest.mark.parametrize("transport", ["auto", "litellm"])
def test_a_session_on_an_anthropic_model_talks_to_llama_cpp_over_the_messages_api(
    transport: str, real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    """Three turns on the native Anthropic transport (``auto``), one through litellm's Anthropic path."""
    sid = real_rt.start_session(
        model=ANTHROPIC_MODEL,
        api_base=llama_server.root,
        api_key="sk-none",
        system_prompt=SYSTEM,
        config={**SHORT, "gateway.transport": transport},
    )
    turns = 3 if transport == "auto" else 1
    for topic in ("the moon", "rivers", "bread")[:turns]:
        result = real_rt.prompt(sid, f"Tell me about {topic}.").result(timeout=600)
        assert result.status == "ok", result.error
        assert result.text.strip()
    events.wait_type("agent_end", turns)
    starts = events.of("request_start", sid)
    expected = "anthropic" if transport == "auto" else "litellm"
    assert starts and all(e.transport == expected for e in starts), [e.transport for e in starts]
    answers = [m for m in real_rt.messages(sid) if m.role == "assistant"]
    assert len(answers) == turns
    assert all(
        m.usage is not None and m.usage.input_tokens > 0 and m.usage.output_tokens > 0 for m in answers
    )
    # the prompt grows turn by turn: the server counts what the transport sent
    inputs = [m.usage.input_tokens for m in answers if m.usage is not None]
    assert inputs == sorted(inputs)


@pytest.mark.parametrize("stream", [True, False])
def test_tool_blocks_and_both_answer_shapes_through_the_native_transport(
    stream: bool, llama_server: LlamaServer
) -> None:
    """A history with a ``tool_use`` and its ``tool_result``, sent as Anthropic blocks, is rendered by the
    server's template and answered, streamed (message_start, content_block_delta, message_delta) or not."""
    from runtime import messages as m
    from runtime.gateway import CompletionRequest, Gateway, IoLoop, complete_sync

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = m.ToolCallPart(id="toolu_01", name="get_weather", arguments='{"city": "Paris"}')
    history = [
        m.system("You can call tools."),
        m.user("What is the weather in Paris?"),
        m.assistant(tool_calls=[call]),
        m.tool_result("toolu_01", "get_weather", "It is sunny and 21 degrees in Paris."),
    ]
    io = IoLoop()
    try:
        gateway = Gateway(io)
        request = CompletionRequest(
            model=ANTHROPIC_MODEL,
            messages=history,
            tools=tools,
            api_base=llama_server.root,
            api_key="sk-none",
            max_tokens=48,
            stream=stream,
            timeout=600,
        )
        assert gateway.route(request).transport == "anthropic"
        answer = complete_sync(gateway, request, timeout=600)
    finally:
        io.stop()
    assert answer.error is None, answer.error
    assert answer.transport == "anthropic"
    assert answer.message is not None and (answer.message.text.strip() or answer.message.tool_calls)
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0
    assert answer.message.stop_reason in ("stop", "length", "tool_calls")


def test_a_prompt_over_the_window_on_the_messages_api_is_an_overflow_that_states_it(
    llama_server: LlamaServer,
) -> None:
    """llama.cpp refuses a prompt over its slot's context on ``/v1/messages`` too: the native transport's error
    is classified as an overflow (not retried) and the window it states is read."""
    from runtime import messages as m
    from runtime.gateway import CompletionRequest, Gateway, IoLoop, complete_sync

    io = IoLoop()
    try:
        request = CompletionRequest(
            model=ANTHROPIC_MODEL,
            messages=[m.user("word " * 3_000)],
            api_base=llama_server.root,
            api_key="sk-none",
            max_tokens=16,
            timeout=600,
        )
        answer = complete_sync(Gateway(io), request, timeout=600)
    finally:
        io.stop()
    assert answer.transport == "anthropic"
    assert answer.error is not None and answer.error.kind == "overflow", answer.error
    assert answer.error.window == llama_server.ctx_per_slot and answer.attempts == 1


def test_the_summarizers_requests_are_sized_with_the_ratio_learned_from_smollm2s_counts(
    real_rt: Any, events: _Caught, llama_server: LlamaServer
) -> None:
    """SmolLM2's tokenizer counts our prompts ~1.14-1.26 × cl100k (our stand-in count): the session learns
    that ratio from the server's usage at its first reply (a prompt of ~270 tokens of notes), and each of
    its compactions' summarizer requests (the real model writes the summaries) is sized with the learned
    ratio, not the stand-in default, as its ``summary_request`` says; the server refuses none of them, nor
    any other request (its own log says so), and no summary is a fallback."""
    from runtime.context.estimate import STAND_IN_COUNT_RATIO

    log = _ServerLog(llama_server)
    sid = real_rt.start_session(model=MODEL, api_base=llama_server.url, system_prompt=SYSTEM, config=SHORT)
    results = [
        real_rt.prompt(sid, f"My notes: {NOTES} Tell me about {topic}.").result(timeout=900)
        for topic in TOPICS[:5]
    ]
    assert [r.status for r in results] == ["ok"] * 5, [r.error for r in results if r.status != "ok"]
    ends = events.of("compaction_end", sid)
    assert ends and not any(e.fallback for e in ends), ends
    asked = [e for e in events.of("summary_request", sid) if e.purpose == "summary"]
    assert asked
    sized = [e.count_ratio for e in asked]
    assert all(r is not None and r != STAND_IN_COUNT_RATIO and 1.0 <= r <= 1.6 for r in sized), sized
    failed = {e.request_id for e in events.of("request_failed", sid)}
    assert not failed & {e.request_id for e in asked}
    assert len(events.of("summary_response", sid)) >= len(asked)
    assert log.refused() == [], f"the server refused requests of {log.requests()}"
    assert _refusals(events, sid) == 0
