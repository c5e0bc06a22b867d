"""What the spans record of prompts and answers, with ``telemetry.record_content = true`` (design §7.5).

The spans are made from the events (:mod:`runtime.observability.tracing`), and the events carry no
content beyond a prompt's preview: a whole request on every ``request_start`` would be the prompt again at
every step, for every subscriber and in every transcript. So where a span records content, the actor that
has it puts it here, under the id of the event it belongs to, right before publishing that event, and the
span's rule takes it when it reads the event:

    prompt    a prompt's inputs, by its prompt id      (agent_start's ``prompt_id``)
    request   a call's messages, by its request id     (request_start's ``message_id``, summary_request's
                                                       ``request_id``)
    response  a call's answer, by its request id      (turn_end and summary_response)
    result    a tool call's result text, by call id   (tool_execution_end's ``call_id``)

Only a runtime that records content has a :class:`ContentTap` (``Services.content``); without one, the
actors check one attribute and put nothing. What no event comes to take (a prompt that never ran, events
a full queue lost) is dropped with its session's ``session_stopped``, and at most :data:`HELD` pieces are
held at once (the oldest go first).
"""

from __future__ import annotations

import threading
from typing import Any, Literal

__all__ = ["HELD", "ContentKind", "ContentTap"]

ContentKind = Literal["prompt", "request", "response", "result"]

HELD = 10_000
"""The most pieces of content held for spans at once."""


class ContentTap:
    """Content for the spans, put by the actors and taken by the tracing subscriber; thread-safe."""

    def __init__(self, held: int = HELD) -> None:
        self._held = held
        self._pieces: dict[tuple[str, ContentKind, str], Any] = {}  # (session, kind, id) -> content
        self._lock = threading.Lock()

    def put(self, session_id: str, kind: ContentKind, key: str, content: Any) -> None:
        with self._lock:
            pieces = self._pieces
            pieces[(session_id, kind, key)] = content
            while len(pieces) > self._held:
                del pieces[next(iter(pieces))]

    def take(self, session_id: str, kind: ContentKind, key: str | None) -> Any:
        """The content put under ``key`` (None if none), forgotten."""
        if key is None:
            return None
        with self._lock:
            return self._pieces.pop((session_id, kind, key), None)

    def forget(self, session_id: str) -> None:
        """Drop whatever of ``session_id`` is still held."""
        with self._lock:
            for key in [k for k in self._pieces if k[0] == session_id]:
                del self._pieces[key]

    def __len__(self) -> int:
        return len(self._pieces)
