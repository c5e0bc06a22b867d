"""The usage tracker actor (design §4): one session's token accounting.

It holds the session's usage state and nothing else: totals (input, output, reasoning, cache read/write,
cost), the last prompt size (``current_context_tokens``, distinct from the totals), the calibration of
estimates against actual input tokens, and the model's window. The rules live in
:mod:`runtime.context.estimate` and :mod:`runtime.tokens`; this shell applies them and broadcasts
``usage_update`` and ``calibration`` events.

Messages (tell or ask; declared in :mod:`actors.protocol`): :class:`RecordResponse` after every provider
response, :class:`SetModel`, :class:`Reset` after a compaction, :class:`Restore` to rebuild the totals from
the log (sent by the agent's recovery; a tracker started ``restoring`` answers queries only after it).
Asked: :class:`GetTotals` (the session's :class:`Usage`) and :class:`GetCalibration` (a :class:`Calibration`), which is how the runtime's queries reach it: no proxy to build (pykka inspects every
attribute of the actor for one) or to keep. Queries through a proxy, for the tests and tools:
``totals()``, ``current_context_tokens()``, ``context_window()``, ``calibration_ratio()``,
``calibration_error()``, ``estimate(...)`` and ``stats(...)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.protocol import (
    Calibration,
    GetCalibration,
    GetTotals,
    RecordResponse,
    Reset,
    Restore,
    SetModel,
)
from runtime import events as ev
from runtime.actor import PooledActor
from runtime.config import Config
from runtime.context.estimate import (
    ContextEstimate,
    ContextStats,
    context_stats,
    estimate_context,
    usable_response,
)
from runtime.messages import Message, Usage
from runtime.models import ModelInfo, model_info
from runtime.tokens import TokenCounter

log = logging.getLogger("agentcell.usage")

Publish = Callable[[ev.Event], Any]


# -- the actor --------------------------------------------------------------------------------------------


class UsageTracker(PooledActor):
    """Per-session usage state. Never blocks: every handler is arithmetic and event publishing."""

    def __init__(
        self,
        session_id: str,
        model: str,
        config: Config,
        publish: Publish,
        *,
        counter: TokenCounter | None = None,
        context_window: int | None = None,
        restoring: bool = False,
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self.config = config
        self.publish = publish
        self._totals = Usage()
        # input + output of the last usable response since the latest compaction: what the next estimate
        # is anchored on. 0: the next estimate is a full count; None: unknown (after a Restore).
        self._anchor: int | None = 0
        self._current = 0
        self._estimated_current = False
        # Calibration: sums over calls of the counted part of the estimate (raw, before any calibration
        # factor) and the actual tokens that part turned out to be.
        self._estimated_sum = 0.0
        self._actual_sum = 0.0
        self._last_error: float | None = None
        # Made here, in the caller's thread: loading an encoding the first time is disk work.
        self._counter = counter if counter is not None else TokenCounter(model, config.tokens)
        self._info = self._model_info(model, context_window)
        # Started for a session with a history (a resume, a wake, a restart): its totals are the log's, which
        # the agent's recovery sends (Restore); queries wait for them rather than answer zeros.
        self._restoring = restoring

    # -- mailbox ----------------------------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        match message:
            case RecordResponse(message=response, estimated_input=estimated):
                self._record(response, estimated)
            case SetModel(model=model, context_window=window, counter=counter):
                self._info = self._model_info(model, window)
                if counter is not None:
                    self._counter = counter
                elif model != self._counter.model:
                    self._counter = TokenCounter(model, self.config.tokens)
                self._publish_update(Usage())
            case Reset(context_tokens=tokens):
                self._anchor = 0
                if tokens is not None:
                    self._current, self._estimated_current = tokens, True
                    self._publish_update(Usage())
            case Restore(messages=messages, spent=spent, read=read):
                if read:
                    self._restore(messages, spent)
                if self._restoring:
                    self._restoring = False
                    self.unstash_all()
            case GetTotals() | GetCalibration() if self._restoring:
                self.stash(message)
            case GetTotals():
                return self._totals
            case GetCalibration():
                return Calibration(ratio=self.calibration_ratio(), last_error=self._last_error)
            case _:
                raise TypeError(f"usage tracker: unexpected message {type(message).__name__}")
        return None

    # -- queries (call through a proxy) ----------------------------------------------------------------
    def totals(self) -> Usage:
        """Cumulative usage of the session: input, output, reasoning, cache read/write, cost."""
        return self._totals

    def current_context_tokens(self) -> int:
        """The size of the last prompt (input tokens of the last usable response), or the compacted
        context's estimate after a :class:`Reset`; 0 before the first response."""
        return self._current

    def context_window(self) -> int:
        return self._info.context_window

    def model_info(self) -> ModelInfo:
        return self._info

    def counter(self) -> TokenCounter:
        return self._counter

    def calibration_ratio(self) -> float | None:
        """Running ratio of actual to estimated tokens over the counted parts of past estimates; None
        before the first calibrated call."""
        return self._actual_sum / self._estimated_sum if self._estimated_sum > 0 else None

    def calibration_error(self) -> float | None:
        """The last estimate's relative error, (estimated − actual) ÷ actual; None before one."""
        return self._last_error

    def estimate(
        self,
        messages: Sequence[Message],
        usage_floor: int = 0,
        system_prompt: str = "",
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ContextEstimate:
        """The estimate of design §4.2 for the model-facing ``messages`` (see :func:`estimate_context`)."""
        counter = self._counter
        return estimate_context(
            messages,
            count=counter.count_message,
            system_tokens=counter.count_system(system_prompt),
            tools_tokens=counter.count_tools(tools),
            usage_floor=usage_floor,
        )

    def stats(
        self,
        messages: Sequence[Message],
        usage_floor: int = 0,
        system_prompt: str = "",
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ContextStats:
        """The context breakdown of design §4.6, with this session's window and calibration."""
        counter = self._counter
        return context_stats(
            messages,
            count=counter.count_message,
            system_tokens=counter.count_system(system_prompt),
            tools_tokens=counter.count_tools(tools),
            window=self._info.context_window,
            config=self.config.compaction,
            usage_floor=usage_floor,
            last_error=self._last_error,
            calibration_ratio=self.calibration_ratio(),
        )

    # -- internals --------------------------------------------------------------------------------------
    def _model_info(self, model: str, window: int | None) -> ModelInfo:
        info = model_info(model, self.config.models)
        return info if window is None else ModelInfo(window, info.max_output_tokens, "override")

    def _record(self, response: Message, estimated_input: int | None) -> None:
        usage = response.usage
        if usage is None:
            return
        self._totals = self._totals + usage
        if not usable_response(response):
            # Billed, so counted in the totals, but an aborted or failed call says nothing about the context.
            self._publish_update(usage)
            return
        if estimated_input:
            self._calibrate(estimated_input, usage.input_tokens)
        self._anchor = usage.input_tokens + usage.output_tokens
        self._current, self._estimated_current = usage.input_tokens, False
        self._publish_update(usage)

    def _calibrate(self, estimated: int, actual: int) -> None:
        self._last_error = (estimated - actual) / actual
        # The estimate was the last response's actual usage (the anchor) plus a counted part, or all
        # counted when there was no usable response. Only the counted part says how good counting is.
        if self._anchor is not None:
            counted, actual_part = estimated - self._anchor, actual - self._anchor
            if counted > 0 and actual_part > 0:
                self._estimated_sum += counted / self._counter.calibration  # the raw count
                self._actual_sum += actual_part
        ratio = self.calibration_ratio()
        log.info(
            "session %s: context estimate %d, actual %d, error %+d (%+.1f%%), calibration ratio %s",
            self.session_id,
            estimated,
            actual,
            estimated - actual,
            100 * self._last_error,
            f"{ratio:.3f}" if ratio is not None else "n/a",
        )
        if ratio is not None:
            self._counter.set_calibration(ratio)
        self.publish(
            ev.Calibration(
                session_id=self.session_id,
                ts=time.time(),
                estimated_tokens=estimated,
                actual_tokens=actual,
                error=self._last_error,
                ratio=ratio if ratio is not None else 1.0,
            )
        )

    def _restore(self, messages: Sequence[Message], spent: Usage | None = None) -> None:
        """The totals are ``spent`` (the log's record of the session's spend, every branch and compaction
        included: design §4.1), or the sum over ``messages`` without it; the last prompt size is the newest
        usable response's of ``messages``."""
        totals = Usage()
        last: Message | None = None
        for msg in messages:
            if msg.usage is not None:
                if spent is None:
                    totals = totals + msg.usage
                if usable_response(msg):
                    last = msg
        self._totals = totals if spent is None else spent
        self._anchor = None  # whether a compaction came after `last` is not known here
        if last is not None and last.usage is not None:
            self._current, self._estimated_current = last.usage.input_tokens, False

    def _publish_update(self, usage: Usage) -> None:
        self.publish(
            ev.UsageUpdate(
                session_id=self.session_id,
                ts=time.time(),
                usage=usage,
                totals=self._totals,
                context_window=self._info.context_window,
                context_tokens=self._current,
                estimated=self._estimated_current,
            )
        )
