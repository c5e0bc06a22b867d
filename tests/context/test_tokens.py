"""Token counting (design §4.3): exact counts with the chat format's framing, caching, and the heuristic."""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import pytest
import tiktoken

import runtime.tokens as tokens_module
from runtime.config import ConfigError, TokenConfig
from runtime.messages import ImagePart, Message, TextPart, ToolCallPart, assistant, system, tool_result, user
from runtime.tokens import (
    CL100K_BASE,
    O200K_BASE,
    REPLY_PRIMING,
    TOKENS_PER_MESSAGE,
    TOOLS_OVERHEAD,
    TokenCounter,
    encoding_for_model,
    heuristic_tokens,
    render_tools,
)

HEURISTIC = TokenConfig(exact=False)

# Prose and CJK text written for these tests.
PROSE = [
    """The committee met on a grey Tuesday morning to discuss the budget for the coming year. Most of the
members had read the report in advance, but a few had not, and the chair spent the first twenty minutes
summarizing its findings. Revenue had grown modestly, costs had grown faster, and the reserve fund was
smaller than anyone liked. Several proposals were put forward: delay the new building, raise fees
slightly, or cut the travel allowance. None of them was popular. After a long discussion, the members
agreed to postpone the decision until the next meeting, when updated figures from the finance office
would be available.""",
    """When you open a session, the runtime loads its history from the log and replays it into memory.
Each message keeps its own identifier, so later requests can refer to it without copying the text.
If the process stops while a line is being written, the next start notices the torn line, skips it,
and tells you how many bytes were lost. Nothing that was acknowledged before the crash goes missing.
This makes it safe to run many sessions side by side on one machine, even when the machine is busy
and the disk is slow.""",
    """My grandmother kept a garden behind the house, a narrow strip of soil between the kitchen wall and
the fence. She grew beans, tomatoes and a row of sunflowers that leaned toward the street every August.
In the evenings she would sit on an upturned bucket with a cup of tea and watch the bees move from one
flower to the next. She said the garden taught her patience: you cannot hurry a tomato, and you cannot
argue with the weather. I did not understand her then, but I think I do now.""",
]
CODE_MODULES = ["json.decoder", "textwrap", "string", "dataclasses", "functools", "shlex"]
CHINESE = (
    "今天早上我们在会议室讨论了明年的预算。大多数成员事先读过报告，但也有几个人没有读。"
    "收入略有增长，成本增长得更快，储备金比大家希望的要少。经过长时间的讨论，大家同意把决定推迟到下次会议。"
)
JAPANESE = (
    "祖母は家の裏に小さな庭を持っていました。豆やトマトを育て、夏になるとひまわりが道の方へ傾いていました。"
    "夕方になると、祖母はお茶を飲みながら、花から花へと飛ぶ蜂を眺めていました。"
)


def pieces(encoding: str, text: str) -> list[str]:
    enc = tiktoken.get_encoding(encoding)
    return [enc.decode([t]) for t in enc.encode_ordinary(text)]


# -- choosing the encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", O200K_BASE),
        ("gpt-4o-mini-2024-07-18", O200K_BASE),
        ("openai/gpt-4.1-mini", O200K_BASE),
        ("gpt-5", O200K_BASE),
        ("gpt-5.1-codex", O200K_BASE),
        ("o1", O200K_BASE),
        ("o3-pro", O200K_BASE),
        ("o4-mini", O200K_BASE),
        ("chatgpt-4o-latest", O200K_BASE),
        ("openrouter/openai/gpt-4o", O200K_BASE),
        ("ft:gpt-4o-mini:acme::abc123", O200K_BASE),
        ("gpt-4", CL100K_BASE),
        ("gpt-4-turbo", CL100K_BASE),
        ("gpt-3.5-turbo", CL100K_BASE),
        ("anthropic/claude-sonnet-4-5", CL100K_BASE),
        ("gemini/gemini-2.5-pro", CL100K_BASE),
        ("omni-model", CL100K_BASE),  # starts with "o" but is not the o-series
        ("agentcell-local", CL100K_BASE),
    ],
)
def test_encoding_is_chosen_per_model(model: str, encoding: str) -> None:
    assert encoding_for_model(model) == encoding
    assert TokenCounter(model).encoding_name == encoding


def test_configured_encoding_overrides_the_model_choice() -> None:
    counter = TokenCounter("gpt-4o", TokenConfig(encoding=CL100K_BASE))
    assert counter.encoding_name == CL100K_BASE
    text = "naïve café ☕ — déjà vu"
    assert counter.count_text(text) == len(tiktoken.get_encoding(CL100K_BASE).encode(text))


def test_unknown_encoding_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"tokens\.encoding.*no_such_base"):
        TokenCounter("gpt-4o", TokenConfig(encoding="no_such_base"))


# -- exact counts, checked by hand ------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [O200K_BASE, CL100K_BASE])
def test_hand_checked_plain_messages(encoding: str) -> None:
    counter = TokenCounter("any", TokenConfig(encoding=encoding))
    # "hello world" is two tokens, "hello" and " world"; every role name is one token.
    assert pieces(encoding, "hello world") == ["hello", " world"]
    assert counter.count_text("hello world") == 2
    # A message: 3 framing tokens + 1 for the role + its content.
    assert counter.count_message(user("hello world")) == 3 + 1 + 2
    # "You are a helpful assistant." is six tokens.
    assert pieces(encoding, "You are a helpful assistant.") == [
        "You",
        " are",
        " a",
        " helpful",
        " assistant",
        ".",
    ]
    conversation = [system("You are a helpful assistant."), user("hello world")]
    # Both messages, plus 3 tokens priming the reply.
    assert counter.count_messages(conversation) == (3 + 1 + 6) + (3 + 1 + 2) + 3
    assert TOKENS_PER_MESSAGE == 3 and REPLY_PRIMING == 3


def test_hand_checked_tool_call_and_result() -> None:
    counter = TokenCounter("gpt-4o")
    assert pieces(O200K_BASE, "read_file") == ["read", "_file"]
    args = '{"path": "a.txt"}'
    args_tokens = len(pieces(O200K_BASE, args))
    call = assistant("", tool_calls=[ToolCallPart(id="c1", name="read_file", arguments=args)])
    assert counter.count_message(call) == 3 + 1 + 2 + args_tokens
    assert pieces(O200K_BASE, "ok") == ["ok"]
    assert counter.count_message(tool_result("c1", "read_file", "ok")) == 3 + 1 + 1


def test_reasoning_and_images_are_counted() -> None:
    counter = TokenCounter("gpt-4o")
    thought = assistant("hello world", reasoning="hello world")
    assert counter.count_message(thought) == 3 + 1 + 2 + 2
    pictured = user("hello world", "https://example.com/cat.png")
    assert counter.count_message(pictured) == 3 + 1 + 2 + 1_200
    measured = Message(role="user", parts=(TextPart("hello world"), ImagePart("data:,", tokens=85)))
    assert counter.count_message(measured) == 3 + 1 + 2 + 85
    cheap_images = TokenCounter("gpt-4o", TokenConfig(image_tokens=500))
    assert cheap_images.count_message(pictured) == 3 + 1 + 2 + 500


def test_counts_match_litellms_token_counter_for_plain_conversations() -> None:
    # litellm implements the same chat-format arithmetic; an independent check of ours.
    import litellm

    from runtime.messages import to_openai

    conversation = [
        system("You are terse."),
        user("Name three primes."),
        assistant("2, 3 and 5."),
        user("And the next one?"),
    ]
    for model in ("gpt-4o", "gpt-4"):
        expected = litellm.token_counter(model=model, messages=to_openai(conversation))
        assert TokenCounter(model).count_messages(conversation) == expected


def test_system_prompt_counts_as_a_system_message() -> None:
    counter = TokenCounter("gpt-4o")
    prompt = "You are a careful assistant. Answer in one sentence."
    assert counter.count_system(prompt) == counter.count_message(system(prompt))
    assert counter.count_system("") == 0


def test_hidden_messages_are_not_part_of_a_request() -> None:
    counter = TokenCounter("gpt-4o")
    shown, hidden = user("hello world"), user("a long archived tool output", agent_visible=False)
    assert counter.count_messages([shown, hidden]) == counter.count_messages([shown])


# -- tool definitions -------------------------------------------------------------------------------------

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file from the workspace",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace"},
                "limit": {"type": "integer"},
                "mode": {"type": "string", "enum": ["text", "bytes"]},
                "ranges": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"start": {"type": "integer"}}},
                },
            },
            "required": ["path"],
        },
    },
}


def test_tools_are_rendered_as_the_model_sees_them() -> None:
    expected = textwrap.dedent(
        """\
        namespace functions {

        // Read a file from the workspace
        type read_file = (_: {
        // Path relative to the workspace
        path: string,
        limit?: number,
        mode?: "text" | "bytes",
        ranges?: {
          start?: number,
        }[],
        }) => any;

        // Current time
        type now = () => any;

        } // namespace functions"""
    )
    bare = {"name": "now", "description": "Current time", "parameters": {"type": "object", "properties": {}}}
    assert render_tools([READ_FILE, bare]) == expected


def test_tool_tokens() -> None:
    counter = TokenCounter("gpt-4o")
    assert counter.count_tools([]) == 0
    assert counter.count_tools([READ_FILE]) == TOOLS_OVERHEAD + counter.count_text(render_tools([READ_FILE]))
    assert counter.count_tools([READ_FILE, READ_FILE]) > counter.count_tools([READ_FILE])


# -- the per-message cache ----------------------------------------------------------------------------------


def test_a_message_is_tokenized_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = tokens_module.heuristic_tokens

    def spy(text: str) -> int:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(tokens_module, "heuristic_tokens", spy)
    counter = TokenCounter("gpt-4o", HEURISTIC)
    history = [user(f"question {i}") for i in range(50)]
    first = counter.count_messages(history)
    calls.clear()
    assert counter.count_messages(history) == first
    assert calls == []
    newer = user("one more question")
    counter.count_messages([*history, newer])
    assert calls == ["one more question"]


def test_a_rewritten_message_with_the_same_id_is_recounted() -> None:
    counter = TokenCounter("gpt-4o")
    original = tool_result("c1", "grep", "match " * 500, id="m1")
    cleared = tool_result("c1", "grep", "[output cleared]", id="m1")
    assert counter.count_message(original) > counter.count_message(cleared)
    assert counter.count_message(cleared) == 3 + 1 + counter.count_text("[output cleared]")


def test_the_cache_is_bounded_and_safe_across_threads() -> None:
    counter = TokenCounter("gpt-4o", cache_size=64)
    messages = [user(f"message number {i}") for i in range(2_000)]
    expected = [3 + 1 + counter.count_text(m.text) for m in messages]
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(offset, len(messages), 3):
                assert counter.count_message(messages[i]) == expected[i]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(counter._messages) <= 64


# -- the heuristic ----------------------------------------------------------------------------------------


def test_heuristic_basics() -> None:
    assert heuristic_tokens("") == 0
    assert heuristic_tokens("a") == 1
    # Non-ASCII characters cost 1.3 tokens each.
    assert heuristic_tokens("日本語の文") == 7  # ceil(5 * 1.3)
    # A very long "word" is not one token.
    assert heuristic_tokens("x" * 6_000) >= 1_000


@pytest.mark.parametrize("encoding", [O200K_BASE, CL100K_BASE])
def test_heuristic_is_within_15_percent_on_english_prose_and_code(encoding: str) -> None:
    enc = tiktoken.get_encoding(encoding)
    code = [inspect.getsource(importlib.import_module(name)) for name in CODE_MODULES]
    for text in [*PROSE, *code]:
        exact = len(enc.encode_ordinary(text))
        assert abs(heuristic_tokens(text) - exact) <= 0.15 * exact, text[:60]


@pytest.mark.parametrize("encoding", [O200K_BASE, CL100K_BASE])
@pytest.mark.parametrize("text", [CHINESE, JAPANESE], ids=["chinese", "japanese"])
def test_heuristic_is_not_3x_off_on_chinese_or_japanese(encoding: str, text: str) -> None:
    exact = len(tiktoken.get_encoding(encoding).encode_ordinary(text))
    assert exact / 3 < heuristic_tokens(text) < exact * 3


def test_heuristic_counter_uses_the_configured_overheads() -> None:
    counter = TokenCounter("gpt-4o", TokenConfig(exact=False, message_overhead=5, image_tokens=1_000))
    # "hello world": two words and a space, 2.1 tokens, rounded up.
    assert heuristic_tokens("hello world") == 3
    assert counter.count_message(user("hello world", "https://example.com/a.png")) == 5 + 3 + 1_000
    assert counter.count_text(PROSE[0]) == heuristic_tokens(PROSE[0])


def test_calibration_scales_heuristic_counts_only_when_enabled() -> None:
    text = PROSE[1]
    raw = heuristic_tokens(text)
    calibrated = TokenCounter("gpt-4o", TokenConfig(exact=False, apply_calibration=True))
    calibrated.set_calibration(1.5)
    assert calibrated.calibration == 1.5
    assert calibrated.count_text(text) == round(raw * 1.5)
    assert calibrated.count_message(user(text)) == round((4 + raw) * 1.5)
    calibrated.set_calibration(100.0)  # absurd ratios are clamped
    assert calibrated.calibration == 4.0

    off = TokenCounter("gpt-4o", HEURISTIC)
    off.set_calibration(1.5)
    assert off.calibration == 1.0 and off.count_text(text) == raw
    exact = TokenCounter("gpt-4o", TokenConfig(apply_calibration=True))
    exact.set_calibration(1.5)
    assert exact.calibration == 1.0  # exact counts are never scaled


# -- offline ----------------------------------------------------------------------------------------------


def test_counting_works_without_network() -> None:
    code = textwrap.dedent(
        """
        import socket
        def refuse(*args, **kwargs):
            raise OSError("network disabled by the test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse

        import runtime, tiktoken
        from runtime.tokens import TokenCounter
        for name in ("o200k_base", "cl100k_base"):
            print(len(tiktoken.get_encoding(name).encode("hello world")))
        print(TokenCounter("gpt-4o").count_text("hello world"), TokenCounter("gpt-4").count_text("hello world"))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2", "2", "2"]


def test_a_cached_count_keeps_no_message_alive_and_goes_with_it() -> None:
    """Issue 46: the count cache held each message's parts, so a busy session's history stayed in memory."""
    counter = TokenCounter("gpt-4o", HEURISTIC)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            counter.count_message(user(f"{i} " + "long text " * 10_000))  # 100 KB each, dropped at once
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept < 200_000, f"{kept} bytes kept for 200 messages no one holds"
    live = [user(f"live {i}") for i in range(10)]
    for m in live:
        counter.count_message(m)
    counter.count_message(user("one more"))  # the dead messages' entries go with the next count
    assert len(counter._messages) <= len(live) + 1
