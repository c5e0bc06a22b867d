"""Monitors: how a supervisor (or anyone) learns that a pooled actor ended, and why; and :func:`kill`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pykka import ActorDeadError, ActorRef

from runtime.actor._exit import ActorExit as ActorExit
from runtime.actor._exit import ExitReason as ExitReason
from runtime.actor._mailbox import Mailbox

__all__ = ["ActorExit", "ExitReason", "Monitor", "kill", "monitor"]

logger = logging.getLogger("agentcell.actor")


class Monitor:
    """A registration made by :func:`monitor`; :meth:`cancel` it to stop caring."""

    __slots__ = ("_mailbox", "_notify", "ref")

    def __init__(
        self,
        ref: ActorRef[Any],
        mailbox: Mailbox,
        notify: ActorRef[Any] | Callable[[ActorExit], None],
    ) -> None:
        self.ref = ref
        self._mailbox = mailbox
        self._notify = notify

    def cancel(self) -> None:
        """Do not deliver the exit notice (no-op if it was already delivered)."""
        self._mailbox.remove_monitor(self)

    def _deliver(self, exit_notice: ActorExit) -> None:
        notify = self._notify
        if isinstance(notify, ActorRef):
            try:
                notify.tell(exit_notice)
            except ActorDeadError:
                pass
            return
        try:
            notify(exit_notice)
        except Exception:
            logger.exception("monitor callback %r failed", notify)


def monitor(ref: ActorRef[Any], notify: ActorRef[Any] | Callable[[ActorExit], None]) -> Monitor:
    """Tell ``notify`` (an actor, or a function) how the pooled actor behind ``ref`` ends.

    ``notify`` receives exactly one :class:`ActorExit`: an actor ref gets it as a message, a function is
    called with it on the thread where the actor ended (keep it short). Monitoring an actor that has
    already ended delivers its exit at once.

    Raises:
        TypeError: ``ref`` is not a :class:`PooledActor`'s ref.
    """
    mailbox = ref.actor_inbox
    if not isinstance(mailbox, Mailbox):
        raise TypeError(f"only pooled actors can be monitored, not {ref}")
    registration = Monitor(ref, mailbox, notify)
    exit_notice = mailbox.add_monitor(registration)
    if exit_notice is not None:
        registration._deliver(exit_notice)
    return registration


def kill(ref: ActorRef[Any]) -> bool:
    """Stop a pooled actor without running ``on_stop`` and without waiting for it (OTP's ``brutal_kill``).

    It handles no further messages, its monitors get ``ActorExit(reason="killed")`` now, and asks still in
    its inbox fail with :class:`pykka.ActorDeadError`. A handler that is running right now cannot be
    interrupted; it finishes on its thread and its reply is discarded. Returns False if ``ref`` is not a
    pooled actor (nothing can be done to it), True otherwise.
    """
    mailbox = ref.actor_inbox
    if not isinstance(mailbox, Mailbox):
        return False
    mailbox.kill()
    return True
