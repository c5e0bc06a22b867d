"""Scripted replies of the local provider: turns, tool calls and injected faults as msgspec Structs.

A script is a named list of :class:`Turn`. The request's ``model`` field selects the script, and each
request consumes the next turn. A turn carries what the model "says" (reasoning, text, tool calls) and,
optionally, a :class:`Fault` that replaces the reply with a failure.

Scripts can be written as JSON (``--script FILE.json`` on the command line)::

    {"weather": [
        {"reasoning": "The user wants the weather.",
         "tool_calls": [{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}]},
        {"fault": {"kind": "rate_limit", "retry_after": 0.2}},
        {"text": "It is sunny in Paris."}
    ]}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

import msgspec

FaultKind = Literal[
    "rate_limit",
    "server_error",
    "overloaded",
    "hang",
    "stall",
    "keepalive",
    "reset",
    "auth",
    "overflow",
    "stream_error",
]
"""What an injected fault does:

- ``rate_limit``: HTTP 429 with a ``retry-after`` header and OpenAI's rate-limit body.
- ``server_error``: HTTP 500 with OpenAI's server-error body.
- ``overloaded``: HTTP 503 (or ``status``, e.g. 529) with Anthropic's ``overloaded_error`` body.
- ``hang``: never answers, until the client goes away or the provider stops.
- ``stall``: a streamed reply that starts (``after_chunks`` chunks), then sends nothing more, keeping the
  connection open, until the client goes away or the provider stops (a ``hang`` when not streamed).
- ``keepalive``: a streamed reply that starts (``after_chunks`` chunks, 0 for none), then sends only SSE
  comments (``: keep-alive``, every 0.1 s, as proxies do while they wait) until the client goes away or the
  provider stops (a ``hang`` when not streamed).
- ``reset``: the TCP connection is cut abruptly (RST) mid-response, after ``after_chunks`` stream chunks.
- ``auth``: HTTP 401 with OpenAI's ``invalid_api_key`` body.
- ``overflow``: the configured overflow error, whatever the request's size.
- ``stream_error``: a streamed reply that starts (``after_chunks`` chunks), then sends an ``error`` event
  in place of the rest, as OpenAI does when a server fails mid-stream (a plain 500 when not streamed).
"""

FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)


class Fault(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A failure to answer a request with, instead of a reply."""

    kind: FaultKind
    retry_after: float | None = 1.0
    """Seconds sent in the ``retry-after`` header of a ``rate_limit`` fault (None: no header)."""
    rpm: int | None = None
    """The requests-per-minute limit a ``rate_limit`` fault reports, in its message and in the dialect's
    ``*-ratelimit-*-requests`` headers: a client paces the key's later requests to it. None: OpenAI's fault
    says 60 (``x-ratelimit-limit-requests``), Anthropic's says 50 in words only (no header)."""
    status: int | None = None
    """Overrides the HTTP status of ``server_error`` / ``overloaded`` (e.g. 502, 529)."""
    after_chunks: int = 1
    """For ``reset``, ``stream_error``, ``stall`` and ``keepalive`` of a streamed reply: how many SSE chunks are sent before
    the cut (or the silence)."""


class ToolCallSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tool call of a scripted turn.

    ``arguments`` is the raw JSON text sent to the client, unchanged: it may be deliberately malformed.
    """

    name: str
    arguments: str = "{}"
    id: str | None = None


class Turn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One scripted reply (or fault)."""

    text: str = ""
    reasoning: str = ""
    reasoning_signature: str | None = None
    """When set, the reasoning is also sent as an Anthropic-style signed ``thinking`` block."""
    tool_calls: tuple[ToolCallSpec, ...] = ()
    fault: Fault | None = None
    latency: float | None = None
    """Seconds to wait before answering; None = the provider's default latency."""
    finish_reason: str | None = None
    """None = ``tool_calls`` when the turn has tool calls, else ``stop``."""
    prompt_tokens: int | None = None
    """Report this many prompt tokens instead of the exact count: a provider that miscounts, or silently
    truncates an input larger than its window."""
    ignore_max_tokens: bool = False
    """Answer in full past the request's ``max_tokens`` (by default the answer is cut there and ends
    ``length``, as a real server stops a model): a provider that does not honour the cap."""

    @property
    def effective_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


Scripts = dict[str, list[Turn]]

_scripts_decoder = msgspec.json.Decoder(Scripts)


def load_scripts(path: str | os.PathLike[str]) -> Scripts:
    """Read a JSON file mapping script names to lists of turns; raises ``ValueError`` naming the problem."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read script file {os.fspath(path)}: {exc.strerror}") from None
    try:
        return _scripts_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"invalid script file {os.fspath(path)}: {exc}") from None
