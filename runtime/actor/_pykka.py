"""Every use of pykka's private internals, fenced in one module.

:class:`~runtime.actor.PooledActor` plugs into the seam pykka keeps for actor implementations
(``Actor._create_actor_inbox``, ``_create_future``, ``_start_actor_loop``, ``_handle_receive``,
``_handle_failure``, ``_stop``), puts pykka's :class:`Envelope`\\ s in its own inbox, and a supervisor
recognises pykka's stop message. None of these names is public pykka API: they are imported here and
nowhere else, pykka is pinned in ``pyproject.toml`` to the releases this was tested with, and the hooks
are checked at import so that a pykka release that changes them fails at once, with a clear message,
instead of misbehaving later.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import TYPE_CHECKING, Final

import pykka
from pykka._envelope import Envelope
from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr
from pykka.messages import _ActorStop as ActorStop  # pykka's stop message: what ActorRef.stop() sends

if TYPE_CHECKING:
    from pykka._actor import ActorInbox as ActorInbox  # for annotations only

__all__ = ["PYKKA_MESSAGES", "ActorStop", "Envelope"]

PYKKA_MESSAGES: Final = frozenset((ActorStop, ProxyCall, ProxyGetAttr, ProxySetAttr))
"""The messages pykka handles itself (a stop, proxy calls) in ``Actor._handle_receive``."""

_HOOKS: Final = (
    "_create_actor_inbox",
    "_create_future",
    "_start_actor_loop",
    "_handle_receive",
    "_handle_failure",
    "_stop",
)

_missing = [name for name in _HOOKS if not callable(getattr(pykka.Actor, name, None))]
if _missing:  # pragma: no cover - only with an untested pykka release
    raise ImportError(
        f"pykka {version('pykka')} lacks the actor hooks runtime.actor builds on ({', '.join(_missing)}); "
        "install the pykka release pinned in agentcell's pyproject.toml"
    )
