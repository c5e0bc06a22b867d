"""How a pooled actor ended (:class:`ActorExit`): what its monitors receive (``_monitor``) and its mailbox keeps
(``_mailbox``), so it lies below both."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from pykka import ActorRef

__all__ = ["ActorExit", "ExitReason"]

ExitReason = Literal["normal", "failure", "killed"]


class ActorExit(msgspec.Struct, frozen=True):
    """What a monitor receives when a pooled actor ends.

    ``reason`` is ``"normal"`` (it was stopped), ``"failure"`` (an exception escaped a handler or a hook;
    ``exception`` says which) or ``"killed"`` (:func:`kill`).
    """

    ref: ActorRef[Any]
    reason: ExitReason
    exception: BaseException | None = None

    @property
    def abnormal(self) -> bool:
        """True unless the actor stopped normally (what a ``transient`` restart policy looks at)."""
        return self.reason != "normal"
