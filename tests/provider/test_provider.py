"""The local OpenAI-compatible provider over real HTTP on 127.0.0.1 (design §7.3)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tiktoken

import runtime  # noqa: F401  (offline environment for tiktoken)
from runtime.context.overflow import is_context_overflow, stated_window
from runtime.provider import OVERFLOW_FORMATS, Fault, LocalProvider, ToolCallSpec, Turn, cli_main, policy
from runtime.provider.script import load_scripts

ENC = tiktoken.get_encoding("o200k_base")


def tokens(text: str) -> int:
    return len(ENC.encode(text))


def expected_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """OpenAI's chat accounting, written out independently of the provider's code."""
    total = 3  # reply priming
    for m in messages:
        total += 3 + tokens(m["role"]) + tokens(m.get("content") or "")
    if tools:
        total += tokens(json.dumps(tools, separators=(",", ":")))
    return total


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalProvider]:
    with LocalProvider(context_window=4_000) as p:
        yield p


@pytest.fixture
def client(provider: LocalProvider) -> Iterator[httpx.Client]:
    provider.clear_faults()
    provider.context_window = 4_000
    provider.overflow_format = "openai"
    provider.chunk_chars = 24
    provider.prompt_ratio = 1.0
    provider.refuse_answer_overflow = False
    with httpx.Client(base_url=provider.url, timeout=5.0) as c:
        yield c


def chat(client: httpx.Client, model: str, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
    return client.post("/chat/completions", json={"model": model, "messages": messages, **body})


def sse_events(response: httpx.Response) -> list[Any]:
    events: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_scripted_reply_with_reasoning_and_tool_calls_has_exact_usage(
    provider: LocalProvider, client: httpx.Client
) -> None:
    args = '{"path": "src/app.py", "limit": 40}'
    provider.add_script(
        "scripted",
        [
            Turn(
                text="Reading it now.",
                reasoning="The user wants app.py.",
                tool_calls=(ToolCallSpec(name="read_file", arguments=args),),
            )
        ],
    )
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Open src/app.py"},
    ]
    response = chat(client, "scripted", messages)
    assert response.status_code == 200
    body = response.json()
    message = body["choices"][0]["message"]
    assert message["content"] == "Reading it now."
    assert message["reasoning_content"] == "The user wants app.py."
    assert message["tool_calls"][0]["function"] == {"name": "read_file", "arguments": args}
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    usage = body["usage"]
    assert usage["prompt_tokens"] == expected_prompt(messages)
    reasoning = tokens("The user wants app.py.")
    assert usage["completion_tokens_details"]["reasoning_tokens"] == reasoning
    assert usage["completion_tokens"] == tokens("Reading it now.") + reasoning + tokens("read_file") + tokens(
        args
    )
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("cap_field", ["max_tokens", "max_completion_tokens"])
def test_an_answer_longer_than_max_tokens_is_cut_there_and_ends_length(
    provider: LocalProvider, client: httpx.Client, cap_field: str
) -> None:
    """As a real server stops a model at the request's cap: the first tokens, ``length``, no tool call."""
    text = "The lighthouse stands on a rock where the river meets the sea, and its lamp turns all night."
    call = ToolCallSpec(name="read_file", arguments='{"path": "a"}')
    provider.add_script(f"cut-{cap_field}", [Turn(text=text, tool_calls=(call,)), Turn(text=text)])
    messages = [{"role": "user", "content": "Tell me about lighthouses."}]
    body = chat(client, f"cut-{cap_field}", messages, **{cap_field: 5}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and not choice["message"].get("tool_calls")
    assert choice["message"]["content"] == ENC.decode(ENC.encode(text)[:5])
    assert body["usage"]["completion_tokens"] == 5
    whole = chat(
        client, f"cut-{cap_field}", messages, **{cap_field: 500}
    ).json()  # room to spare: as scripted
    assert (
        whole["choices"][0]["finish_reason"] == "stop" and whole["choices"][0]["message"]["content"] == text
    )
    provider.add_script("cut-stream", [Turn(text=text)])
    streamed = sse_events(
        client.post(
            "/chat/completions",
            json={"model": "cut-stream", "messages": messages, "stream": True, cap_field: 5},
        )
    )
    chunks = [e for e in streamed if e != "[DONE]" and e["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ENC.decode(
        ENC.encode(text)[:5]
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_tools_are_counted_in_the_prompt(provider: LocalProvider, client: httpx.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "list_dir", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    provider.add_script("tools", [Turn(text="ok"), Turn(text="ok")])
    messages = [{"role": "user", "content": "What is here?"}]
    without = chat(client, "tools", messages).json()["usage"]["prompt_tokens"]
    with_tools = chat(client, "tools", messages, tools=tools).json()["usage"]["prompt_tokens"]
    assert without == expected_prompt(messages)
    assert with_tools == expected_prompt(messages, tools)


def test_streaming_splits_reasoning_text_and_tool_arguments_and_ends_with_usage(
    provider: LocalProvider, client: httpx.Client
) -> None:
    provider.chunk_chars = 5
    malformed = '{"path": "notes.md", "content": "unterminated'
    turn = Turn(
        text="Let me write that file.",
        reasoning="Write it.",
        tool_calls=(ToolCallSpec(name="write_file", arguments=malformed, id="call_1"),),
    )
    provider.add_script("streamed", [turn, turn])
    messages = [{"role": "user", "content": "write notes.md"}]
    response = chat(client, "streamed", messages, stream=True, stream_options={"include_usage": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Write it."
    assert "".join(d.get("content") or "" for d in deltas) == "Let me write that file."
    fragments = [tc["function"]["arguments"] for d in deltas for tc in d.get("tool_calls", [])]
    assert len([f for f in fragments if f]) > 1, "arguments arrive split across chunks"
    assert "".join(fragments) == malformed
    head = next(tc for d in deltas for tc in d.get("tool_calls", []) if tc.get("id"))
    assert head["id"] == "call_1"
    assert head["function"]["name"] == "write_file"
    finish = [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finish == ["tool_calls"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == expected_prompt(messages)

    without_usage = sse_events(chat(client, "streamed", messages, stream=True))
    assert all("usage" not in c for c in without_usage[:-1])


def test_cached_tokens_count_the_longest_prefix_seen_before(
    provider: LocalProvider, client: httpx.Client
) -> None:
    provider.add_script("cache", [Turn(text="one"), Turn(text="two"), Turn(text="three")])
    first = [
        {"role": "system", "content": "Cache test system prompt, unique 7f3a."},
        {"role": "user", "content": "first question"},
    ]
    usage1 = chat(client, "cache", first).json()["usage"]
    assert usage1["prompt_tokens_details"]["cached_tokens"] == 0
    second = [*first, {"role": "assistant", "content": "one"}, {"role": "user", "content": "second question"}]
    usage2 = chat(client, "cache", second).json()["usage"]
    assert (
        usage2["prompt_tokens_details"]["cached_tokens"] == usage1["prompt_tokens"] - 3
    )  # all but the priming
    assert usage2["prompt_tokens"] == expected_prompt(second)
    other = [
        {"role": "system", "content": "A different system prompt, unique 9c1d."},
        {"role": "user", "content": "first question"},
    ]
    assert chat(client, "cache", other).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("fmt", sorted(OVERFLOW_FORMATS))
def test_overflow_answers_in_the_vendor_format_without_consuming_a_turn(
    fmt: str, provider: LocalProvider, client: httpx.Client
) -> None:
    provider.context_window = 50
    provider.overflow_format = fmt
    provider.add_script(f"overflow-{fmt}", [Turn(text="after compaction")])
    big = [{"role": "user", "content": "lorem ipsum " * 100}]
    response = chat(client, f"overflow-{fmt}", big)
    prompt = expected_prompt(big)
    assert response.status_code in (400, 413, 422, 500)  # 422: TGI's input validation
    text = response.text
    if fmt not in ("openai_new", "groq", "ollama", "ollama_new", "bedrock", "request_too_large", "llamacpp"):
        assert str(prompt) in text and "50" in text, "the message states the sizes"
    if fmt == "llamacpp":
        assert response.json()["error"]["n_prompt_tokens"] == prompt
        assert response.json()["error"]["n_ctx"] == 50
    assert provider.request_log[-1].outcome == "overflow"
    small = chat(client, f"overflow-{fmt}", [{"role": "user", "content": "hi"}])
    assert small.json()["choices"][0]["message"]["content"] == "after compaction"


def test_a_vllm_like_server_refuses_prompt_plus_max_tokens_and_counts_with_its_own_ratio(
    provider: LocalProvider, client: httpx.Client
) -> None:
    messages = [{"role": "user", "content": "lorem ipsum " * 100}]
    prompt = expected_prompt(messages)
    provider.add_script("vllm-like", [Turn(text="fits")], loop=True)
    # by default (llama.cpp's way) a max_tokens past the window is no refusal: the model stops at the end
    provider.context_window = prompt + 100
    assert chat(client, "vllm-like", messages, max_tokens=150).status_code == 200
    # vLLM's way: prompt + max_tokens > window is refused, in vLLM's words, the window learnable from them
    provider.refuse_answer_overflow = True
    provider.overflow_format = "vllm"
    response = chat(client, "vllm-like", messages, max_tokens=150)
    assert response.status_code == 400
    message = response.json()["message"]
    assert message == (
        f"This model's maximum context length is {prompt + 100} tokens. However, you requested {prompt + 150} "
        f"tokens ({prompt} in the messages, 150 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    assert stated_window(message=message, status_code=400) == prompt + 100
    assert is_context_overflow(message=message, status_code=400)
    assert provider.request_log[-1].outcome == "overflow"
    assert chat(client, "vllm-like", messages, max_completion_tokens=100).status_code == 200
    # a tokenizer that counts 1.25 × ours: in the usage and against the window
    provider.prompt_ratio = 1.25
    usage = chat(client, "vllm-like", messages).json()["usage"]
    assert usage["prompt_tokens"] == math.ceil(prompt * 1.25)
    room = provider.context_window - math.ceil(prompt * 1.25)
    assert chat(client, "vllm-like", messages, max_tokens=room).status_code == 200
    assert chat(client, "vllm-like", messages, max_tokens=room + 1).status_code == 400


def test_overflow_bodies_follow_each_vendor_shape(provider: LocalProvider, client: httpx.Client) -> None:
    provider.context_window = 20
    big = [{"role": "user", "content": "word " * 60}]
    prompt = expected_prompt(big)
    provider.overflow_format = "openai"
    openai = chat(client, "x", big)
    assert openai.status_code == 400
    assert openai.json()["error"]["code"] == "context_length_exceeded"
    assert openai.json()["error"]["message"].startswith(
        f"This model's maximum context length is 20 tokens. However, your messages resulted in {prompt} tokens."
    )
    provider.overflow_format = "anthropic"
    anthropic = chat(client, "x", big).json()
    assert anthropic["type"] == "error"
    assert anthropic["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {prompt} tokens > 20 maximum",
    }
    provider.overflow_format = "gemini"
    gemini = chat(client, "x", big).json()["error"]
    assert gemini["status"] == "INVALID_ARGUMENT"
    assert (
        gemini["message"]
        == f"The input token count ({prompt}) exceeds the maximum number of tokens allowed (20)."
    )
    provider.overflow_format = "vllm"
    vllm = chat(client, "x", big, max_tokens=100).json()
    assert (
        f"you requested {prompt + 100} tokens ({prompt} in the messages, 100 in the completion)"
        in vllm["message"]
    )
    provider.overflow_format = "request_too_large"
    too_large = chat(client, "x", big)
    assert too_large.status_code == 413
    assert too_large.json()["error"]["type"] == "request_too_large"


def test_rate_limit_server_error_and_overloaded_faults(provider: LocalProvider, client: httpx.Client) -> None:
    provider.inject_fault("rate_limit", retry_after=2.5)
    limited = chat(client, "x", [{"role": "user", "content": "hi"}])
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "2.5"
    assert limited.headers["retry-after-ms"] == "2500"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    provider.inject_fault("server_error")
    assert chat(client, "x", [{"role": "user", "content": "hi"}]).status_code == 500
    provider.inject_fault("overloaded")
    overloaded = chat(client, "x", [{"role": "user", "content": "hi"}])
    assert overloaded.status_code == 503
    assert overloaded.json()["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    provider.inject_fault("overloaded", status=529)
    assert chat(client, "x", [{"role": "user", "content": "hi"}]).status_code == 529
    assert chat(client, "x", [{"role": "user", "content": "hi"}]).status_code == 200, "faults are used up"


def test_a_rate_limit_fault_reports_the_request_limit_it_is_given(
    provider: LocalProvider, client: httpx.Client
) -> None:
    fault = Fault(kind="rate_limit", retry_after=0.2, rpm=6_000)
    provider.add_script("limited", [Turn(fault=Fault(kind="rate_limit")), Turn(fault=fault)])
    plain, told = (chat(client, "limited", [{"role": "user", "content": "hi"}]) for _ in range(2))
    assert plain.status_code == told.status_code == 429
    assert (
        plain.headers["x-ratelimit-limit-requests"] == "60"
        and "Limit 60," in plain.json()["error"]["message"]
    )
    assert (
        told.headers["x-ratelimit-limit-requests"] == "6000"
        and "Limit 6000," in told.json()["error"]["message"]
    )
    assert told.headers["x-ratelimit-remaining-requests"] == "0" and told.headers["retry-after-ms"] == "200"


def test_a_fault_in_a_script_turn_consumes_that_turn(provider: LocalProvider, client: httpx.Client) -> None:
    provider.add_script("flaky", [Turn(fault=Fault(kind="server_error")), Turn(text="recovered")])
    assert chat(client, "flaky", [{"role": "user", "content": "hi"}]).status_code == 500
    assert (
        chat(client, "flaky", [{"role": "user", "content": "hi"}]).json()["choices"][0]["message"]["content"]
        == "recovered"
    )
    exhausted = chat(client, "flaky", [{"role": "user", "content": "hi"}])
    assert exhausted.status_code == 400
    assert exhausted.json()["error"]["code"] == "script_exhausted"


def test_looping_script_starts_over(provider: LocalProvider, client: httpx.Client) -> None:
    provider.add_script("loop", [Turn(text="a"), Turn(text="b")], loop=True)
    texts = [
        chat(client, "loop", [{"role": "user", "content": "?"}]).json()["choices"][0]["message"]["content"]
        for _ in range(5)
    ]
    assert texts == ["a", "b", "a", "b", "a"]


def test_hang_never_answers_until_the_client_gives_up(provider: LocalProvider, client: httpx.Client) -> None:
    provider.inject_fault("hang")
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
            timeout=0.3,
        )
    assert time.monotonic() - started >= 0.3
    assert chat(client, "x", [{"role": "user", "content": "hi"}]).status_code == 200


def test_stop_ends_a_hung_request() -> None:
    provider = LocalProvider().start()
    provider.inject_fault("hang")
    with httpx.Client(base_url=provider.url, timeout=10.0) as c:
        outcome: list[object] = []
        thread = threading.Thread(
            target=lambda: outcome.append(_try(lambda: chat(c, "x", [{"role": "user", "content": "hi"}])))
        )
        thread.start()
        time.sleep(0.2)
        started = time.monotonic()
        provider.stop()
        thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 3.0
    assert not provider.running


def _try(fn: Any) -> object:
    try:
        return fn()
    except httpx.HTTPError as exc:
        return exc


def test_answers_on_a_kept_alive_connection_are_not_held_back_by_nagle(
    provider: LocalProvider, client: httpx.Client
) -> None:
    """Every connection the provider serves has Nagle's algorithm off: with it on, the second answer on a
    kept-alive connection waited ~40 ms for the client's delayed ACK (its head and body go out separately)."""
    for _ in range(2):
        assert client.get("/models").status_code == 200
    sockets = [conn.transport.get_extra_info("socket") for conn in provider._connections()]
    assert sockets
    assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_reset_cuts_the_connection(provider: LocalProvider, client: httpx.Client) -> None:
    provider.inject_fault("reset")
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        chat(client, "x", [{"role": "user", "content": "hi"}])
    provider.inject_fault("reset", after_chunks=2)
    received: list[bytes] = []
    with (
        pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
        client.stream(
            "POST",
            "/chat/completions",
            json={"model": "x", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        ) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            received.append(chunk)
    assert b"data: " in b"".join(received), "some chunks arrived before the cut"
    assert b"[DONE]" not in b"".join(received)
    assert chat(client, "x", [{"role": "user", "content": "hi"}]).status_code == 200


def test_api_key_is_checked_and_never_logged() -> None:
    secret = "sk-very-secret-key-123"
    with LocalProvider(api_key=secret) as provider, httpx.Client(base_url=provider.url, timeout=5.0) as c:
        denied = chat(c, "x", [{"role": "user", "content": "hi"}])
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "invalid_api_key"
        assert secret not in denied.text
        allowed = c.post(
            "/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {secret}"},
        )
        assert allowed.status_code == 200
        log = provider.request_log
        assert [entry.authorized for entry in log] == [False, True]
        assert secret not in repr(log)


def test_latency_delays_the_reply(provider: LocalProvider, client: httpx.Client) -> None:
    provider.add_script("slow", [Turn(text="late", latency=0.25)])
    started = time.monotonic()
    assert chat(client, "slow", [{"role": "user", "content": "hi"}]).status_code == 200
    assert time.monotonic() - started >= 0.25


def test_models_lists_the_scripts(provider: LocalProvider, client: httpx.Client) -> None:
    provider.add_script("listed-model", [Turn(text="x")])
    ids = [m["id"] for m in client.get("/models").json()["data"]]
    assert "listed-model" in ids
    assert "agentcell-local" in ids


def test_model_prefix_is_ignored_when_selecting_a_script(
    provider: LocalProvider, client: httpx.Client
) -> None:
    provider.add_script("prefixed", [Turn(text="matched")])
    reply = chat(client, "openai/prefixed", [{"role": "user", "content": "hi"}]).json()
    assert reply["choices"][0]["message"]["content"] == "matched"


def test_malformed_request_is_a_clear_400(client: httpx.Client) -> None:
    response = client.post(
        "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    missing = client.post("/chat/completions", json={"model": "x"})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "messages"


# --- the built-in policy -----------------------------------------------------------------------------

FILE_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}
    for name, props in {
        "read_file": {"path": {"type": "string"}},
        "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
        "edit_file": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
        "list_dir": {"path": {"type": "string"}},
    }.items()
]


def _tool_round(messages: list[dict[str, Any]], result: str) -> list[dict[str, Any]]:
    """Run one policy step that must be tool calls; append them and their (same) result."""
    turn = policy.respond(messages, FILE_TOOLS)
    assert turn.tool_calls, f"expected tool calls, got text {turn.text!r}"
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in turn.tool_calls
    ]
    out = [*messages, {"role": "assistant", "content": None, "tool_calls": calls}]
    out += [{"role": "tool", "tool_call_id": c.id, "content": result} for c in turn.tool_calls]
    return out


def test_policy_reads_then_edits_then_answers() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": 'In notes.md, replace "draft" with "final", please.'},
    ]
    first = policy.respond(messages, FILE_TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("read_file", {"path": "notes.md"})
    ]
    assert first.reasoning
    messages = _tool_round(messages, "# Notes\nThis is a draft.\n")
    second = policy.respond(messages, FILE_TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in second.tool_calls] == [
        ("edit_file", {"path": "notes.md", "old": "draft", "new": "final"})
    ]
    messages = _tool_round(messages, "Edited notes.md: 1 replacement.")
    final = policy.respond(messages, FILE_TOOLS)
    assert not final.tool_calls
    assert "notes.md" in final.text
    assert "# Notes" in final.text, "the answer reports what the file said"


def test_policy_reasoning_counts_its_tool_calls_in_real_plurals() -> None:
    one: list[dict[str, Any]] = [{"role": "user", "content": "What does notes.md say?"}]
    one = _tool_round(one, "# Notes\n")
    assert policy.respond(one, FILE_TOOLS).reasoning == (
        "The tool call of this turn has its result; time to report back."
    )
    two: list[dict[str, Any]] = [{"role": "user", "content": 'In notes.md, replace "draft" with "final".'}]
    two = _tool_round(_tool_round(two, "This is a draft.\n"), "Edited notes.md: 1 replacement.")
    reasoning = policy.respond(two, FILE_TOOLS).reasoning
    assert reasoning == "All 2 tool calls of this turn have results; time to report back."


def test_policy_uses_the_tools_own_parameter_names_and_reads_files_in_parallel() -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "read_file", "parameters": {"properties": {"file_path": {}}}},
        }
    ]
    turn = policy.respond([{"role": "user", "content": "Compare a/one.py and b/two.py"}], tools)
    assert [json.loads(c.arguments) for c in turn.tool_calls] == [
        {"file_path": "a/one.py"},
        {"file_path": "b/two.py"},
    ]
    assert len({c.id for c in turn.tool_calls}) == 2


def test_policy_lists_a_directory_and_reports_errors() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "List the folder src/ and open missing.txt"}
    ]
    turn = policy.respond(messages, FILE_TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [("list_dir", {"path": "src"})]
    messages = _tool_round(messages, "src/ (2 entries)\napp.py  (120 bytes)\nutil.py  (64 bytes)")
    messages = _tool_round(messages, "Error: file not found: missing.txt")
    final = policy.respond(messages, FILE_TOOLS)
    assert "2 entries: `app.py`, `util.py`" in final.text
    assert "not found" in final.text


def test_policy_notes_a_free_form_edit_as_a_comment_in_the_files_language() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Update tools/build.py to mention the new flag."}
    ]
    messages = _tool_round(messages, "     1\timport sys\n     2\t\n     3\tsys.exit(main())")
    turn = policy.respond(messages, FILE_TOOLS)
    [call] = turn.tool_calls
    args = json.loads(call.arguments)
    assert call.name == "edit_file"
    assert args["old"] == "sys.exit(main())", "line numbers of the read output are not part of the anchor"
    assert args["new"].startswith("sys.exit(main())\n# Note added by agentcell: Update tools/build.py")


def test_policy_without_files_answers_directly() -> None:
    turn = policy.respond([{"role": "user", "content": "How are you today?"}], FILE_TOOLS)
    assert not turn.tool_calls
    assert "How are you today?" in turn.text


SUMMARY_SYSTEM = "You are a summarization component. Never continue the conversation."


def test_policy_summarizes_a_conversation_in_the_structured_format() -> None:
    transcript = "\n".join(
        [
            "[User]:\nRefactor the parser in src/parser.py. You must keep the public API unchanged.",
            '[Assistant tool call]: read_file({"path": "src/parser.py"})',
            "[Tool result read_file]:\ndef parse(text): ...",
            "[Assistant]:\nI will split parse() into a tokenizer and a reducer.",
            "[Tool result edit_file (error)]:\nError: old text not found in src/parser.py",
            "[User]:\nNow add tests in tests/test_parser.py.",
        ]
    )
    prompt = (
        "Summarize the conversation below.\n\n<conversation>\n"
        + transcript
        + "\n</conversation>\n\nWrite the summary in this format:\n\n## Goal\n...\n## Constraints & Preferences\n...\n"
        "## Progress\n...\n## Key Decisions\n...\n## Next Steps\n...\n## Critical Context\n..."
    )
    turn = policy.respond(
        [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": prompt}]
    )
    summary = turn.text
    assert not turn.tool_calls
    headings = [line for line in summary.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
    ]
    assert "Refactor the parser in src/parser.py" in summary
    assert "must keep the public API unchanged" in summary
    assert "split parse() into a tokenizer" in summary
    assert "old text not found" in summary
    assert "tests/test_parser.py" in summary


def test_policy_summary_stays_short_for_a_long_conversation() -> None:
    blocks = []
    for i in range(300):
        blocks.append(f"[User]:\nStep {i}: look at module_{i}.py and keep going.")
        blocks.append(f"[Assistant]:\nI will inspect module_{i}.py next. " + "Details. " * 30)
    prompt = "<conversation>\n" + "\n".join(blocks) + "\n</conversation>\nSummarize it."
    summary = policy.respond(
        [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": prompt}]
    ).text
    assert summary.startswith("## Goal")
    assert "Step 0: look at module_0.py" in summary, "the goal is the first request"
    assert "Step 299" in summary, "next steps follow the latest request"
    assert len(summary) < 3_000
    assert len(summary) < len(prompt) // 10


def test_policy_summary_follows_the_headings_it_is_asked_for_and_keeps_the_previous_goal() -> None:
    prompt = (
        "<previous-summary>\n## Goal\n- Ship version 2 of the CLI\n</previous-summary>\n"
        "<conversation>\n[User]:\nAlso fix the help text.\n</conversation>\n"
        "Summarize in this format:\n## Original Request\n...\n## Early Progress\n..."
    )
    summary = policy.respond(
        [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": prompt}]
    ).text
    assert [line for line in summary.splitlines() if line.startswith("## ")] == [
        "## Original Request",
        "## Early Progress",
    ]
    assert "Ship version 2 of the CLI" in summary


def test_policy_over_http_is_deterministic(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "Please read README.md"}]
    first = chat(client, "no-such-script", messages, tools=FILE_TOOLS).json()["choices"][0]["message"]
    second = chat(client, "no-such-script", messages, tools=FILE_TOOLS).json()["choices"][0]["message"]
    assert first["tool_calls"] == second["tool_calls"]
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"path": "README.md"}


# --- scripts from files and the command line ---------------------------------------------------------


def test_scripts_load_from_json(tmp_path: Any) -> None:
    path = tmp_path / "scripts.json"
    path.write_text(
        json.dumps(
            {
                "demo": [
                    {"text": "hi", "tool_calls": [{"name": "f", "arguments": "{bad"}]},
                    {"fault": {"kind": "hang"}},
                ]
            }
        )
    )
    scripts = load_scripts(path)
    assert scripts["demo"][0].tool_calls[0].arguments == "{bad"
    assert scripts["demo"][1].fault is not None and scripts["demo"][1].fault.kind == "hang"
    path.write_text(json.dumps({"demo": [{"fault": {"kind": "explode"}}]}))
    with pytest.raises(ValueError, match="invalid script file"):
        load_scripts(path)


def test_cli_rejects_a_bad_script_file(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_text("[1, 2")
    assert cli_main(["--port", "0", "--script", str(path)]) == 2
    assert "invalid script file" in capsys.readouterr().err


def test_cli_serves_until_terminated(tmp_path: Any) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"greeter": [{"text": "hello from the CLI"}]}))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime.provider",
            "--port",
            "0",
            "--script",
            str(script),
            "--context-window",
            "1000",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line
        url = line.split("listening on ")[1].split()[0]
        reply = httpx.post(
            f"{url}/chat/completions",
            json={"model": "greeter", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply.json()["choices"][0]["message"]["content"] == "hello from the CLI"
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
