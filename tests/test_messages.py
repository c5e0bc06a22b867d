"""The message model (design §2.1) and its OpenAI-format round trip."""

from __future__ import annotations

import msgspec
import pytest

from runtime import messages as m


def test_message_defaults_and_visibility() -> None:
    msg = m.user("hello")
    assert msg.role == "user"
    assert msg.text == "hello"
    assert msg.agent_visible and msg.user_visible
    assert msg.kind is None
    assert len(msg.id) == 16 and msg.id != m.user("hello").id


def test_messages_are_frozen() -> None:
    msg = m.user("x")
    with pytest.raises(AttributeError):
        msg.role = "assistant"  # type: ignore[misc]


def test_encode_decode_round_trip_keeps_every_part() -> None:
    msg = m.Message(
        role="assistant",
        parts=(
            m.ReasoningPart("think", signature="sig", provider_metadata={"anthropic": {"x": 1}}),
            m.TextPart("answer"),
            m.ToolCallPart("c1", "read_file", '{"path": "a.py"}'),
            m.ImagePart("data:image/png;base64,AAA", tokens=85),
        ),
        usage=m.Usage(input_tokens=10, output_tokens=5, reasoning_tokens=2, cache_read_tokens=3),
        stop_reason="tool_calls",
        kind="x",
        metadata={"k": [1, 2]},
    )
    assert m.decode_message(m.encode_message(msg)) == msg


def test_usage_adds_all_fields_and_cost() -> None:
    a = m.Usage(
        input_tokens=1, output_tokens=2, reasoning_tokens=3, cache_read_tokens=4, cache_write_tokens=5
    )
    b = m.Usage(input_tokens=10, output_tokens=20, cost=0.5)
    total = a + b
    assert (total.input_tokens, total.output_tokens, total.reasoning_tokens) == (11, 22, 3)
    assert (total.cache_read_tokens, total.cache_write_tokens, total.cost) == (4, 5, 0.5)
    assert (a + a).cost is None
    assert total.total_tokens == 33


def test_to_openai_skips_hidden_messages() -> None:
    visible = m.user("keep")
    hidden = m.user("archived", agent_visible=False)
    assert m.to_openai([visible, hidden]) == [{"role": "user", "content": "keep"}]


def test_assistant_with_tool_calls_and_reasoning_to_openai() -> None:
    msg = m.Message(
        role="assistant",
        parts=(
            m.ReasoningPart("first ", signature="s1"),
            m.ReasoningPart("second"),
            m.TextPart("ok"),
            m.ToolCallPart("call_1", "grep", '{"pattern": "x"}'),
        ),
    )
    out = m.message_to_openai(msg)
    assert out["content"] == "ok"
    assert out["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}}
    ]
    assert out["reasoning_content"] == "first second"
    assert out["thinking_blocks"] == [{"type": "thinking", "thinking": "first ", "signature": "s1"}]
    assert "reasoning_content" not in m.message_to_openai(msg, include_reasoning=False)


def test_round_trip_through_openai_format() -> None:
    original = [
        m.system("sys"),
        m.user("look", "https://example.invalid/cat.png"),
        m.Message(
            role="assistant",
            parts=(
                m.ReasoningPart("hmm", signature="abc"),
                m.TextPart("reading"),
                m.ToolCallPart("c9", "read_file", '{"path": "x"}'),
            ),
        ),
        m.tool_result("c9", "read_file", "contents"),
    ]
    back = [m.message_from_openai(d) for d in m.to_openai(original)]
    for a, b in zip(original, back, strict=True):
        assert a.role == b.role
        assert a.parts == b.parts
    assert back[3].tool_call_id == "c9" and back[3].kind == m.KIND_TOOL_RESULT


def test_reasoning_content_without_blocks_is_kept() -> None:
    msg = m.message_from_openai({"role": "assistant", "content": "hi", "reasoning_content": "because"})
    assert msg.reasoning == "because" and msg.text == "hi"


def test_redacted_thinking_round_trips() -> None:
    data = {
        "role": "assistant",
        "content": "",
        "thinking_blocks": [{"type": "redacted_thinking", "data": "ENC"}],
    }
    msg = m.message_from_openai(data)
    assert msg.parts[0] == m.ReasoningPart("", redacted=True, provider_metadata={"data": "ENC"})
    assert m.message_to_openai(msg)["thinking_blocks"] == [{"type": "redacted_thinking", "data": "ENC"}]


def test_from_litellm_objects() -> None:
    import litellm

    resp = litellm.completion(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        mock_response="hello there",
    )
    msg = m.message_from_openai(resp.choices[0].message)
    assert msg.role == "assistant" and msg.text == "hello there"


def test_parsed_arguments_errors_are_readable() -> None:
    assert m.ToolCallPart("1", "t", '{"a": 1}').parsed_arguments() == {"a": 1}
    with pytest.raises(ValueError, match="not valid JSON"):
        m.ToolCallPart("1", "t", '{"a": ').parsed_arguments()
    with pytest.raises(ValueError, match="must be a JSON object"):
        m.ToolCallPart("1", "t", "[1]").parsed_arguments()


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown message role"):
        m.message_from_openai({"role": "wizard", "content": "x"})
    with pytest.raises(msgspec.ValidationError):
        m.decode_message(b'{"role": "wizard"}')


def test_ids_are_16_hex_chars_and_a_forked_child_does_not_repeat_its_parents() -> None:
    import os
    import re

    ids = {m.new_id() for _ in range(20_000)}
    assert len(ids) == 20_000 and all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(write, ",".join(m.new_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        child = set(pipe.read().decode().split(","))
    parent = {m.new_id() for _ in range(100)}
    assert len(child) == 100 and not child & parent, "the random state is reseeded in a forked child"
