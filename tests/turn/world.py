"""A world for the turn machine, in the test's own thread: it performs the machine's effects the way the
agent and its collaborators would (a log in a list, a store's views, a compactor's outcomes), answers the
provider and the tools from a script, and records everything the machine said."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from actors.protocol import ContextView, Outcome, Stored, Verdict
from runtime import events as ev
from runtime.config import Config
from runtime.context.integrity import repair_tool_calls
from runtime.gateway import CompletionResult, ProviderError
from runtime.handles import PromptHandle, TurnResult
from runtime.messages import Message, ToolCallPart, Usage, assistant, new_id, tool_result, user
from runtime.tools.executor import ToolRunResult
from runtime.tools.registry import ToolRegistry
from runtime.turn import TurnMachine
from runtime.turn import effects as fx

WINDOW = 10_000  # with reserve 1,000: limit 9,000, threshold 7,200
FIXED = 20  # the system prompt and tools


def count(message: Message) -> int:
    return (len(message.text) + sum(len(c.arguments) for c in message.tool_calls)) // 4 + 4


class Counter:
    def count_message(self, message: Message) -> int:
        return count(message)

    def count_tools(self, tools: Any) -> int:
        return 10 * len(tools)


@dataclass(frozen=True)
class Estimate:
    tokens: int
    anchored_tokens: int = 0


class Measure:
    fixed_tokens = FIXED

    def __call__(self, view: Any) -> Estimate:
        return Estimate(FIXED + sum(count(m) for m in view.messages if m.agent_visible))


@dataclass
class Spec:
    config: Config
    session_id: str = "s1"
    system_prompt: str = "be brief"
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    mcp: Any = "servers"  # the session has MCP servers: each turn refreshes their tools first


@dataclass(frozen=True)
class FakePrompt:
    message: Message
    handle: PromptHandle
    steer: bool = False
    lead: tuple[Message, ...] = ()
    options: Any = None

    @property
    def inputs(self) -> tuple[Message, ...]:
        return (*self.lead, self.message) if self.lead else (self.message,)


def prompt(text: str, *, steer: bool = False) -> FakePrompt:
    return FakePrompt(user(text), PromptHandle(new_id()), steer=steer)


def config(**overrides: Any) -> Config:
    return Config().with_overrides({"compaction.reserve_tokens": 1_000, **overrides})


def machine(
    cfg: Config | None = None,
    window: int = WINDOW,
    *,
    recovering: bool = False,
    count_ratio: float | None = None,
) -> TurnMachine:
    """A machine of a fresh session, or (``recovering``) of one whose agent starts again and reads its log
    (with the ``count_ratio`` the session had learned)."""
    return TurnMachine(
        Spec(cfg or config()),
        counter=Counter(),
        measure=Measure(),
        model="openai/gpt-4o-mini",
        context_window=window,
        spill_dir=Path("/nonexistent/s1.spill"),
        recovering=recovering,
        count_ratio=count_ratio,
    )


def answer(text: str = "done", *, input_tokens: int = 100) -> CompletionResult:
    return CompletionResult(message=assistant(text, usage=Usage(input_tokens=input_tokens, output_tokens=5)))


def calls(*names: str, input_tokens: int = 100) -> CompletionResult:
    parts = tuple(ToolCallPart(f"call-{new_id()[:12]}", n, "{}") for n in names)
    message = assistant("", tool_calls=parts, usage=Usage(input_tokens=input_tokens, output_tokens=5))
    return CompletionResult(message=message)


def failure(kind: str = "context_overflow", message: str = "too long") -> CompletionResult:
    return CompletionResult(message=None, error=ProviderError(kind=kind, message=message))  # type: ignore[arg-type]


Script = Callable[[fx.Awaited], Any]


class World:
    """Performs effects; answers the awaited ones with :meth:`auto` (the collaborators' ordinary answers) or
    whatever a test says."""

    def __init__(self, m: TurnMachine) -> None:
        self.m = m
        self.log: list[Message] = []
        self.seen: list[fx.Said] = []
        self.pending: fx.Awaited | None = None
        self.results: dict[str, list[TurnResult]] = {}
        self.abort_answers: list[bool] = []
        self.tool_output = "ok"

    # -- what the machine says ------------------------------------------------------------------------
    def take(self, effects: list[fx.Said]) -> list[fx.Said]:
        for effect in effects:
            self.seen.append(effect)
            match effect:
                case fx.Resolve(prompt=p, result=result):
                    self.results.setdefault(p.handle.id, []).append(result)
                case fx.Reject(prompt=p):
                    self.results.setdefault(p.handle.id, []).append(
                        TurnResult(prompt_id=p.handle.id, status="error", error="rejected")
                    )
                case fx.ResolveAbort(value=value):
                    self.abort_answers.append(value)
                case fx.Awaited():
                    assert self.pending is None or self.pending.ticket < effect.ticket
                    self.pending = effect
        return effects

    @property
    def events(self) -> list[ev.Event]:
        return [e.event if isinstance(e, fx.PublishBestEffort) else e for e in self.seen if _published(e)]

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, kind: str) -> list[Any]:
        """The events of type ``kind`` published so far."""
        return [e for e in self.events if e.type == kind]

    def result(self, p: FakePrompt) -> TurnResult:
        (result,) = self.results[p.handle.id]
        return result

    # -- inputs ---------------------------------------------------------------------------------------
    def prompt(self, p: FakePrompt) -> None:
        self.take(self.m.prompt(p))

    def abort(self, handle: Any = None) -> None:
        if self.m.run is not None:  # (else nothing runs that an abort could stop: the effect still waits)
            self.pending = None
        self.take(self.m.abort(handle))

    def give(self, value: Any) -> None:
        """Answer the pending effect with ``value``."""
        pending, self.pending = self.pending, None
        assert pending is not None, "nothing awaited"
        self.take(self.m.answer(pending.ticket, value))

    def view(self) -> ContextView:
        return ContextView(session_id="s1", leaf_id=None, messages=tuple(m for m in self.log))

    def stored(self, with_view: bool = False) -> Stored:
        return Stored("s1", view=self.view() if with_view else None)

    def auto(self, effect: fx.Awaited) -> Any:
        """The ordinary answer of an effect's collaborator (a provider answer must come from the script)."""
        match effect:
            case fx.RefreshTools() | fx.TakeHandover():
                return None
            case fx.Route():
                return fx.Routed(transport="fake")
            case fx.Persist(messages=messages, with_view=with_view):
                self.log.extend(messages)
                return self.stored(with_view)
            case fx.ReadContext():
                return self.view()
            case fx.ArchiveTools():
                return None
            case fx.RecordAnswer(message=message):
                self.log.append(message)
                return None
            case fx.Overlay(messages=messages):
                byid = {m.id: m for m in messages}
                self.log[:] = [byid.get(m.id, m) for m in self.log]
                return self.stored()
            case fx.Hide(message_ids=ids):
                self.log[:] = [
                    msgspec.structs.replace(m, agent_visible=False) if m.id in ids else m for m in self.log
                ]
                return self.stored()
            case fx.RunTools(calls=calls):
                return [
                    ToolRunResult(call=c, message=tool_result(c.id, c.name, self.tool_output), duration=0.0)
                    for c in calls
                ]
            case fx.Compact():
                return self.compacted()
            case fx.Classify():
                return Verdict("compact_and_retry", "overflow", code="context_overflow", overflow=True)
        raise AssertionError(f"no ordinary answer to {effect}")

    def compacted(self) -> Outcome:
        """A compaction that keeps the last two messages."""
        kept = [m for m in self.log if m.agent_visible][-2:]
        self.log[:] = [user("[summary]"), *kept]
        est = Measure()(self.view()).tokens
        return Outcome(messages=tuple(self.log), estimate=est, attempted=True, compacted=True)

    def run(self, replies: list[Any], *, limit: int = 200, **answers: Any) -> None:
        """Answer every awaited effect until nothing is awaited: ``CallModel`` from ``replies`` in order
        (a ``CompletionResult``), the others with ``answers[effect class name]`` when given, else :meth:`auto`."""
        for _ in range(limit):
            effect = self.pending
            if effect is None:
                return
            name = type(effect).__name__
            if isinstance(effect, fx.CallModel):
                value: Any = fx.ModelReply(replies.pop(0), effect.message_id)
            elif name in answers:
                given = answers[name]
                value = given(effect) if callable(given) else given
            else:
                value = self.auto(effect)
            self.give(value)
        raise AssertionError("the turn did not settle")

    def run_until(self, kind: type[fx.Awaited], replies: list[Any], **answers: Any) -> fx.Awaited:
        """As :meth:`run`, but stop at the first awaited ``kind`` (left pending)."""
        for _ in range(200):
            effect = self.pending
            assert effect is not None, f"the turn ended before {kind.__name__}"
            if isinstance(effect, kind):
                return effect
            if isinstance(effect, fx.CallModel):
                self.give(fx.ModelReply(replies.pop(0), effect.message_id))
            elif type(effect).__name__ in answers:
                self.give(answers[type(effect).__name__])
            else:
                self.give(self.auto(effect))
        raise AssertionError("never reached")

    def orphans(self) -> list[Message]:
        return repair_tool_calls(self.log)


def _published(said: fx.Said) -> bool:
    return isinstance(said, ev.Event | fx.PublishBestEffort)
