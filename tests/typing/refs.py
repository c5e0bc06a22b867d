"""Checked by mypy, not run: a ref of a session's actor takes only the messages that actor takes.

Each ``# type: ignore[code]`` below marks a send mypy must refuse with that code. mypy's strict mode warns
of an unused ignore, so if a ref took anything (``ActorRef[Any]``), this file would fail mypy.
tests/session/test_protocol.py runs mypy on it without the ignores and checks each error is reported.
"""

from __future__ import annotations

from actors._base import CallFailed, SessionActor
from actors.protocol import (
    Abort,
    AgentStatus,
    Append,
    Compact,
    ContextView,
    GetContext,
    GetState,
    GetTotals,
    MaybeCompact,
    Outcome,
    Prompt,
    RecordResponse,
    SetModel,
    Stored,
)
from actors.session import Session
from actors.wiring import SessionRefs
from runtime.messages import Message, Usage


def told(refs: SessionRefs, prompt: Prompt, message: Message) -> None:
    refs.agent.tell(prompt)
    refs.agent.tell(Abort())
    refs.compactor.tell(Compact())
    refs.store.tell(Append(message))
    refs.usage.tell(RecordResponse(message))
    for ref in refs.running():
        ref.tell(SetModel("model"))

    refs.agent.tell(Compact())  # type: ignore[arg-type]
    refs.agent.tell(GetContext())  # type: ignore[arg-type]
    refs.compactor.tell(prompt)  # type: ignore[arg-type]
    refs.compactor.tell(Append(message))  # type: ignore[arg-type]
    refs.store.tell(prompt)  # type: ignore[arg-type]
    refs.usage.tell(GetState())  # type: ignore[arg-type]
    refs.overflow.tell(Abort())  # type: ignore[arg-type]
    for ref in refs.running():
        ref.tell(Abort())  # type: ignore[arg-type]


def asked(refs: SessionRefs) -> None:
    refs.agent.ask(GetState(), timeout=1.0)
    refs.store.ask(GetContext(), block=False)
    refs.agent.ask(GetContext(), timeout=1.0)  # type: ignore[call-overload]
    refs.compactor.ask(GetTotals(), block=False)  # type: ignore[call-overload]


class Caller(SessionActor):
    def calls(self, refs: SessionRefs, message: Message) -> None:
        self.call(refs.agent, GetState(), self.on_status)
        self.call(refs.compactor, MaybeCompact(), self.on_outcome)
        self.call(refs.store, GetContext(), self.on_view)
        self.call(refs.store, Append(message), self.on_stored)

        self.call(refs.compactor, GetState(), self.on_status)  # type: ignore[misc]
        self.call(refs.agent, Compact(), self.on_outcome)  # type: ignore[misc]
        self.call(refs.store, GetState(), self.on_status)  # type: ignore[misc]
        self.call(refs.agent, GetState(), self.on_outcome)  # type: ignore[arg-type]

    def on_status(self, status: AgentStatus | CallFailed) -> None: ...

    def on_outcome(self, outcome: Outcome | CallFailed) -> None: ...

    def on_view(self, view: ContextView | CallFailed) -> None: ...

    def on_stored(self, stored: Stored | CallFailed) -> None: ...


def session(session: Session, prompt: Prompt) -> Usage:
    session.tell(prompt)
    session.tell(GetState())  # type: ignore[arg-type]
    session.ask(Compact(), 1.0)  # type: ignore[arg-type]
    return session.ask(GetTotals(), 1.0)
