"""Human-in-the-loop approval of tool calls (design §3.4).

An approval policy is either a callable ``(session_id, call) -> bool | str`` (a string is a denial reason),
or, when none is given but approval is required, a subscriber of ``approval_request`` events answers with
``Runtime.approve(session_id, call_id, approved, reason)``. Requests and answers are events either way.
The wait happens on a tool worker thread, never on an actor's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from runtime.events import ApprovalRequest, ApprovalResponse, Event
from runtime.messages import ToolCallPart

__all__ = ["ApprovalBroker", "ApprovalCallable"]


ApprovalCallable = Callable[[str, ToolCallPart], "bool | str"]


class ApprovalBroker:
    """Routes approval requests to a callable or to event subscribers, and their answers back."""

    def __init__(self, publish: Callable[[Event], object], timeout: float = 300.0) -> None:
        self._publish = publish
        self._timeout = timeout
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, str], tuple[threading.Event, list[tuple[bool, str | None]]]] = {}

    def request(
        self, session_id: str, turn_id: str, call: ToolCallPart, policy: ApprovalCallable | None
    ) -> tuple[bool, str | None]:
        """Ask for approval of ``call``; blocks the calling worker until answered (or timed out: denied)."""
        self._publish(
            ApprovalRequest(
                session_id=session_id,
                turn_id=turn_id,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
            )
        )
        if policy is not None:
            try:
                verdict = policy(session_id, call)
            except Exception as exc:  # a broken hook denies rather than crashing the turn
                verdict = f"approval hook failed: {type(exc).__name__}: {exc}"
            approved, reason = (verdict, None) if isinstance(verdict, bool) else (False, str(verdict))
        else:
            approved, reason = self._wait(session_id, call.id)
        self._publish(
            ApprovalResponse(session_id=session_id, call_id=call.id, approved=approved, reason=reason)
        )
        return approved, reason

    def _wait(self, session_id: str, call_id: str) -> tuple[bool, str | None]:
        done = threading.Event()
        box: list[tuple[bool, str | None]] = []
        key = (session_id, call_id)
        with self._lock:
            self._waiting[key] = (done, box)
        try:
            if not done.wait(self._timeout):
                return False, f"no approval within {self._timeout:g} s"
            return box[0]
        finally:
            with self._lock:
                self._waiting.pop(key, None)

    def answer(self, session_id: str, call_id: str, approved: bool, reason: str | None = None) -> bool:
        """Answer a pending request; returns False when no such request is waiting."""
        with self._lock:
            entry = self._waiting.get((session_id, call_id))
        if entry is None:
            return False
        done, box = entry
        box.append((approved, reason))
        done.set()
        return True

    def cancel_session(self, session_id: str, reason: str = "aborted") -> None:
        """Deny every pending request of a session (abort, stop)."""
        with self._lock:
            keys = [k for k in self._waiting if k[0] == session_id]
        for key in keys:
            self.answer(key[0], key[1], False, reason)
