"""The overflow detector actor (design §6): classifies provider errors and reported usage for one session.

It answers the agent with a verdict — compact and retry once, or fail with a message the user can act
on — and flags silent overflow (input tokens above the window in a successful response) so the next
request compacts first. The rules live in ``runtime.context.overflow`` and ``runtime.context.recovery``.
"""

from __future__ import annotations

from typing import Any

from actors._base import Publish, Reply, SessionActor
from actors.protocol import CheckUsage, ClassifyError, SetModel, UsageOverflowed, Verdict
from runtime import events as ev
from runtime.context.overflow import is_context_overflow, is_usage_overflow, stated_window
from runtime.context.recovery import decide_overflow

RETRYABLE_KINDS = frozenset({"rate_limit", "transient", "timeout"})


class OverflowDetector(SessionActor):
    def __init__(
        self,
        session_id: str,
        publish: Publish,
        *,
        context_window: int,
        auto_compact: bool,
        has_store: bool = True,
    ) -> None:
        super().__init__(session_id, publish)
        self.context_window = context_window
        self.auto_compact = auto_compact
        self.has_store = has_store
        self.overflows = 0

    def on_receive(self, message: Any) -> Any:
        match message:
            case ClassifyError():
                return self.classify(message)
            case CheckUsage(input_tokens=tokens, notify=notify):
                overflowed = self.check_usage(tokens)
                if overflowed and notify is not None:
                    notify.tell(UsageOverflowed(tokens))
                return overflowed
            case SetModel(context_window=window):
                if window is not None:
                    self.context_window = window
                return None
            case Reply():
                self.handle_reply(message)
                return None
            case _:
                raise TypeError(f"overflow detector: unexpected message {type(message).__name__}")

    def classify(self, request: ClassifyError) -> Verdict:
        error = request.error
        if error.kind == "rate_limited":  # waited past capacity.queue_timeout (design §3.11)
            return Verdict("fail", error.message, code="rate_limited", retryable=True)
        overflow = error.kind == "overflow" or is_context_overflow(
            message=error.message, status_code=error.status_code, code=error.code
        )
        # A smaller window the error states is learned (design §6.3); it also makes an overflow of an error
        # that blamed max_tokens alone: that cap was worked out from the wrong window.
        stated = error.window or stated_window(
            message=error.message, status_code=error.status_code, code=error.code
        )
        learned = stated if stated is not None and stated < self.context_window else None
        if learned is not None:
            overflow = True
            self.context_window = learned
        if not overflow:
            kind = error.kind
            where = f" (HTTP {error.status_code})" if error.status_code else ""
            return Verdict(
                "fail",
                f"The provider call failed{where}: {error.message}",
                code=f"provider_{kind}",
                retryable=kind in RETRYABLE_KINDS,
            )
        self.overflows += 1
        decision = decide_overflow(
            recoveries_this_turn=request.recoveries_this_turn,
            auto_compact=self.auto_compact,
            has_store=self.has_store,
            context_window=self.context_window,
            estimated_tokens=request.estimated_tokens,
            window_learned=learned is not None,
        )
        return Verdict(
            decision.action, decision.message, code=decision.code, overflow=True, learned_window=learned
        )

    def check_usage(self, input_tokens: int) -> bool:
        if not is_usage_overflow(input_tokens, self.context_window):
            return False
        self.emit(ev.UsageOverflow, input_tokens=input_tokens, context_window=self.context_window)
        return True
