"""A tool-heavy workload driven through the public API, and the invariants of the context core it must keep.

The model is a *responder* of the local provider: its reply is a function of the request, as a real model's
is. Each prompt carries its plan as a header (``WORKLOAD {"turn": 3, "steps": [[1200, 80], [40000]]}``):
the model calls the ``blob`` tool once per entry of a step (in parallel), one step per request, then
answers. It finds where it is from the request alone: the turn's prompt (or the verbatim request a
compaction summary carries), and the newest step whose calls it can see. So a compaction that summarized
away the working set makes it redo a step, and a loop shows up as requests without end.

:class:`TurnCheck` then checks, from the events, the provider's request log and the session log, what a
user relies on (design §5.6, 5.11, 5.13, 3.6).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.provider import policy
from runtime.provider.script import ToolCallSpec, Turn

HEADER = "WORKLOAD"
_REQUEST = re.compile(r"<current-request>\n?(.*?)\n?</current-request>", re.DOTALL)
_CALL_ID = re.compile(r"^w(\d+)s(\d+)c(\d+)_")

# How a turn may end besides ok: the codes the README documents for context trouble, and the rest.
DOCUMENTED_CODES = frozenset(
    {
        "prompt_too_large",
        "context_working_set_too_large",
        "turn_budget",
        "context_overflow",
        "context_overflow_after_compaction",
        "max_steps",
        "aborted",
    }
)


def prompt_text(turn: int, steps: Sequence[Sequence[int]], pad_chars: int = 0, answer_words: int = 12) -> str:
    """A prompt whose header tells the workload model what to do in this turn; ``pad_chars`` of filler."""
    header = json.dumps({"turn": turn, "steps": [list(s) for s in steps], "answer": answer_words})
    return f"{HEADER} {header}\nPlease do the work described above.\n{filler(pad_chars, f'p{turn}')}"


def tool_heavy_plan(turn: int) -> list[list[int]]:
    """The tool steps of a long tool-heavy session's ``turn`` (the prompt-cache scenarios and
    ``benchmarks/bench_cache.py``): two or three steps of one to three results of 400-6,000 characters."""
    sizes = (400, 1_200, 2_500, 4_000, 6_000)
    steps = [[sizes[(turn + k) % 5], sizes[(turn * 3 + k) % 5]][: 1 + (turn + k) % 2] for k in range(2)]
    if turn % 3 == 0:
        steps.append([sizes[(turn * 7) % 5], 800, 1_600])
    return steps


def run_tool_heavy(
    rt: Any,
    provider: Any,
    model: str,
    api_base: str,
    *,
    window: int,
    turns: int,
    system_prompt: str,
    timeout: float,
) -> str:
    """Start a session of the tool-heavy workload (:func:`tool_heavy_plan`, the model answering as
    :func:`respond`) at ``window`` tokens, run ``turns`` turns and return its id; a turn that does not end ok
    is an ``AssertionError`` naming it. The prompt-cache scenarios and ``benchmarks/bench_cache.py``."""
    provider.add_responder(model.split("/", 1)[1], respond, context_window=window)
    sid = rt.start_session(
        model=model,
        api_base=api_base,
        api_key="sk-local",
        tools=[blob],
        system_prompt=system_prompt,
        config={"models.context_windows": {model: window}},
    )
    for turn in range(turns):
        result = rt.prompt(sid, prompt_text(turn, tool_heavy_plan(turn))).result(timeout=timeout)
        if result.status != "ok":
            raise AssertionError(f"turn {turn} ended {result.status}: {result.error}")
    return str(sid)


def filler(chars: int, tag: str) -> str:
    """``chars`` characters of varied text (about 4-5 characters per token)."""
    if chars <= 0:
        return ""
    line = f"{tag} the quick brown fox {{}} jumps over the lazy dog near riverbank {{}}\n"
    parts: list[str] = []
    size = 0
    i = 0
    while size < chars:
        piece = line.format(i, i * 7 % 1000)
        parts.append(piece)
        size += len(piece)
        i += 1
    return "".join(parts)[:chars]


def blob(chars: int, tag: str) -> str:
    """Return ``chars`` characters of text labelled ``tag`` (the workload's tool)."""
    return filler(chars, tag) or "(empty)"


def _text(content: Any) -> str:
    return policy.text_of(content)


def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Turn:
    """The workload model: the next step of the current turn's plan, or its answer."""
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    if "summariz" in system.lower() or policy.is_cached_summary_request(messages):
        # a summarizer call (a transcript, or the conversation itself): the provider's own summarizer answers
        return policy.respond(messages, tools)
    start, plan = _current_request(messages)
    if plan is None:
        return Turn(text="I have no workload request in view.")
    turn = int(plan["turn"])
    steps: list[list[int]] = plan["steps"]
    done = -1
    for message in messages[start + 1 :]:
        for call in message.get("tool_calls") or ():
            match = _CALL_ID.match(str(call.get("id", "")))
            if match and int(match.group(1)) == turn:
                done = max(done, int(match.group(2)))
    step = done + 1
    if step < len(steps):
        nonce = os.urandom(4).hex()
        calls = tuple(
            ToolCallSpec(
                name="blob",
                arguments=json.dumps({"chars": chars, "tag": f"t{turn}s{step}c{k}"}),
                id=f"w{turn}s{step}c{k}_{nonce}",
            )
            for k, chars in enumerate(steps[step])
        )
        return Turn(tool_calls=calls)
    words = int(plan.get("answer", 12))
    return Turn(text=f"Turn {turn} done after {len(steps)} steps. " + filler(words * 6, f"a{turn}"))


def _current_request(messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any] | None]:
    """Index and plan of the request being worked on: the newest prompt with a header, or the verbatim
    request a compaction summary carries."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") != "user":
            continue
        text = _text(message.get("content"))
        carried = _REQUEST.search(text)
        if carried:
            text = carried.group(1)
        if text.startswith(HEADER):
            header = text[len(HEADER) :].split("\n", 1)[0]
            return i, json.loads(header)
    return -1, None


# ---------------------------------------------------------------------------------------------------
# The invariants


class EventLog:
    """Every event of one session, in order (a subscriber callback)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._cond = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait_settled(self, position: int, *, turn: bool = True, timeout: float = 30.0) -> None:
        """Until the events after ``position`` hold the turn's ``agent_end`` (a handle may resolve before
        its events reach subscribers) and every compaction started has ended (one may outlive an aborted
        turn)."""

        def settled() -> bool:
            events = self.events[position:]
            ended = not turn or any(e.type == "agent_end" for e in events)
            return ended and _open_compactions(events) == 0

        with self._cond:
            ok = self._cond.wait_for(settled, timeout)
        if not ok:
            raise AssertionError(f"the turn did not settle: {[e.type for e in self.events[position:]][-30:]}")

    def since(self, position: int) -> list[Any]:
        with self._cond:
            return list(self.events[position:])

    def __len__(self) -> int:
        with self._cond:
            return len(self.events)


def _open_compactions(events: Iterable[Any]) -> int:
    """Compactions started and not yet ended. A ``compaction_failed`` or ``compaction_skipped`` with none
    open is a refusal before anything started (nothing to compact), not the end of one."""
    open_ = 0
    for event in events:
        if event.type == "compaction_start":
            open_ += 1
        elif event.type in ("compaction_end", "compaction_failed", "compaction_skipped") and open_:
            open_ -= 1
    return open_


@dataclass
class TurnCheck:
    """What one turn must satisfy; ``problems`` lists every broken promise (empty: all held)."""

    models: frozenset[str]  # the agent's model names at the provider (without the ``openai/`` prefix)
    summarizer: str
    planned_steps: int
    budget: int
    hard_reset: bool = False
    problems: list[str] = field(default_factory=list)

    def check(self, result: Any, events: Sequence[Any], requests: Sequence[Any]) -> None:
        self._compactions(events)
        self._ending(result, events)
        agent = [r for r in requests if r.model in self.models]
        self._requests(agent, [r for r in requests if r.model == self.summarizer], events)
        for request in agent:
            problem = pairing_problem(request.messages)
            if problem:
                self.problems.append(f"a request separates a call from its result: {problem}")
        sent = sum(r.prompt_tokens for r in agent if r.outcome == "ok")
        if sent > self.budget:
            self.problems.append(f"the turn sent {sent:,} input tokens, over its budget of {self.budget:,}")

    def _compactions(self, events: Sequence[Any]) -> None:
        depth = 0
        automatic = {"threshold": 0, "overflow": 0}
        for event in events:
            if event.type == "compaction_start":
                depth += 1
                if depth > 1:
                    self.problems.append("a compaction started before the previous one ended")
                if event.trigger in ("threshold", "usage_overflow"):
                    automatic["threshold"] += 1
                elif event.trigger == "overflow":
                    automatic["overflow"] += 1
            elif event.type in ("compaction_failed", "compaction_skipped") and not depth:
                if event.reason != "nothing_to_compact":  # a refusal before starting is announced too
                    self.problems.append(f"{event.type} ({event.reason}) without a compaction_start")
            elif event.type in ("compaction_end", "compaction_failed", "compaction_skipped"):
                depth -= 1
                if depth < 0:
                    self.problems.append(f"{event.type} without a compaction_start")
                    depth = 0
        if depth:
            self.problems.append("a compaction_start without its end")
        if automatic["threshold"] > 1 or automatic["overflow"] > 1:
            self.problems.append(f"automatic compactions in one turn: {automatic}")

    def _ending(self, result: Any, events: Sequence[Any]) -> None:
        if result.status == "ok":
            return
        codes = [e.code for e in events if e.type == "error"]
        if result.status == "aborted":
            return
        allowed = DOCUMENTED_CODES | {"session_dead"} if self.hard_reset else DOCUMENTED_CODES
        if not codes or codes[-1] not in allowed:
            self.problems.append(f"the turn ended {result.status} with codes {codes}: {result.error}")
        if not self.hard_reset and any(e.type == "session_dead" for e in events):
            self.problems.append(f"a session_dead outside hard_reset: {result.error}")

    def _requests(self, agent: Sequence[Any], summarizer: Sequence[Any], events: Sequence[Any]) -> None:
        # One request per planned step and the answer, one more after an overflow error.
        most = self.planned_steps + 2
        if len(agent) > most:
            self.problems.append(f"{len(agent)} agent requests for {self.planned_steps} planned steps")
        compactions = sum(e.type == "compaction_start" for e in events)
        archives = sum(e.type == "tool_results_archived" for e in events)
        if len(summarizer) > 2 * compactions + archives:
            self.problems.append(f"{len(summarizer)} summarizer requests for {compactions} compactions")
        overflows = sum(r.outcome == "overflow" for r in agent)
        if overflows > 2:
            self.problems.append(f"{overflows} requests overflowed the provider's window in one turn")


def pairing_problem(messages: Sequence[dict[str, Any]]) -> str | None:
    """Whether an OpenAI chat request separates a tool call from its result (each call's results must
    follow it at once, every result must answer a call of the assistant message just before)."""
    expected: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = str(message.get("tool_call_id"))
            if call_id not in expected:
                return f"message {index}: a result for {call_id!r} that does not follow its call"
            expected.discard(call_id)
            continue
        if expected:
            return f"message {index}: calls {sorted(expected)} have no result before it"
        if role == "assistant":
            expected = {str(c.get("id")) for c in message.get("tool_calls") or ()}
    if expected:
        return f"the request ends with calls {sorted(expected)} unanswered"
    return None


def record_problems(user_view: Sequence[Any], prompts: Sequence[str], call_ids: Iterable[str]) -> list[str]:
    """Every prompt sent and every tool call made must still be in the user's view of the session."""
    problems: list[str] = []
    texts = {m.text for m in user_view if m.role == "user"}
    for prompt in prompts:
        if prompt not in texts:
            problems.append(f"a prompt is missing from the user view: {prompt[:60]!r}")
    results = {m.tool_call_id for m in user_view if m.role == "tool"}
    for call_id in call_ids:
        if call_id not in results:
            problems.append(f"the result of call {call_id} is missing from the user view")
    return problems
