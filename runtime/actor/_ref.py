"""A ref typed by the messages its actor takes: what a sender holds instead of ``ActorRef[Any]``."""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar, overload

import pykka

__all__ = ["Ref"]

M = TypeVar("M", contravariant=True)


class Ref(Protocol[M]):
    """The part of a :class:`pykka.ActorRef` a sender uses, typed by ``M``, the messages its actor takes.

    pykka's ``ActorRef[A]`` is typed by the actor's class, and its ``tell`` and ``ask`` take ``Any``: a
    module that must not import the actor's class (it is above) has nothing to name but ``ActorRef[Any]``,
    and nothing checks what is sent anywhere. A ``Ref[M]`` is typed by the message union instead, a type
    of the protocol below both: any ``ActorRef`` is one (the protocol is structural), and mypy refuses a
    ``tell`` or ``ask`` of anything outside ``M``.

    ``M`` is contravariant: a ``Ref[StoreMessage]`` is a ``Ref[SetModel]`` when ``SetModel`` is among the
    store's messages, so the refs of every actor that takes a message can be held as refs of that message.
    The protocol is for the type checker only: at run time the object is pykka's ``ActorRef``, unchanged.
    """

    def tell(self, message: M) -> None: ...

    @overload
    def ask(
        self, message: M, *, block: Literal[False], timeout: float | None = None
    ) -> pykka.Future[Any]: ...

    @overload
    def ask(self, message: M, *, timeout: float | None = None) -> Any: ...
