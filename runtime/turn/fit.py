"""A turn's next request fitted to the window (design §5.13), for the turn machine. Pure.

Whether a prompt can be sent at all, the room a step's tool results may take (the working set's budget),
those results clipped head and tail to fit (the full text saved, named in the notice with its SHA-256),
clipped harder when a compaction's summary took more room than the first clipping left, and the answer's
``max_tokens``. Each function says what to write as :class:`~runtime.turn.effects.SaveOutput` effects; the
machine yields them where the clipping happens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from runtime.context import working_set as ws
from runtime.context.estimate import STAND_IN_COUNT_RATIO, answer_cap
from runtime.messages import Message
from runtime.turn.effects import SaveOutput
from runtime.turn.state import TurnState

if TYPE_CHECKING:
    from runtime.config import Config

__all__ = [
    "CHARS_PER_TOKEN_CEILING",
    "Refit",
    "answer_cap_for",
    "clip_again",
    "clip_results",
    "default_count_ratio",
    "full_output",
    "prompt_refusal",
]

# No tokenizer packs more characters than this into one token of real text: a prompt longer than this
# many characters per token of the window is refused without counting it.
CHARS_PER_TOKEN_CEILING: Final = 16

Count = Callable[[Message], int]

Refit = tuple[tuple[Message, ...], tuple[Message, ...], int]
"""What a harder clipping changed: the results changed, the context with them, and its new estimate."""


def prompt_refusal(
    messages: tuple[Message, ...], *, count: Count, fixed_tokens: int, window: int, limit: int
) -> str | None:
    """Why a prompt cannot be sent at all, or None. A prompt many times the window is refused on its
    length alone: counting 100 MB of text would hold the dispatcher for seconds."""
    chars = sum(len(m.text) for m in messages)
    too_long = chars > CHARS_PER_TOKEN_CEILING * (limit + 1)
    tokens = chars // 4 if too_long else sum(count(m) for m in messages)
    return ws.prompt_too_large(prompt_tokens=tokens, fixed_tokens=fixed_tokens, window=window, limit=limit)


def clip_results(
    run: TurnState, budget: int, *, count: Count, spill_dir: Path, reader: str | None
) -> tuple[tuple[Message, ...], list[SaveOutput]]:
    """The newest step's results, the largest clipped head and tail (from the tools' own text) so that
    together they take at most ``budget`` tokens, and the writes of the full texts not saved yet. A clipped
    result's full text is saved beside the session (or already is, in its spill file) and named in its
    notice with its SHA-256 (``run.saved`` remembers where)."""
    results = run.step_results
    clips = ws.plan_clips([(count(m), len(m.text)) for m in results], budget)
    fitted = list(results)
    saves: list[SaveOutput] = []
    for clip in clips:
        message = results[clip.index]
        saved = run.saved.get(message.id)
        if saved is None:
            saved, save = full_output(message, spill_dir)
            if save is not None:
                saves.append(save)
        run.saved[message.id] = saved
        fitted[clip.index] = ws.clip_result(
            message, clip.max_chars, saved_path=saved[0], sha256=saved[1], reader=reader
        )
    return tuple(fitted), saves


def clip_again(
    run: TurnState,
    context: tuple[Message, ...],
    estimate: int,
    *,
    count: Count,
    limit: int,
    spill_dir: Path,
    reader: str | None,
) -> tuple[Refit | None, list[SaveOutput]]:
    """Once a step: when the request is still over the limit after compaction (the summary took more room
    than the first clipping left for it), clip the step's results harder. The :data:`Refit`, or None when
    that cannot help; and the writes of full texts it clipped first."""
    ids = {m.id for m in run.step_results}
    if run.reclipped or not ids:
        return None, []
    run.reclipped = True
    current = {m.id: m for m in context if m.id in ids}
    now = sum(count(m) for m in current.values())
    margin = 16 + limit // 50
    clipped, saves = clip_results(
        run, now - (estimate - limit) - margin, count=count, spill_dir=spill_dir, reader=reader
    )
    fitted = [m for m in clipped if m.id in current]
    changed = tuple(m for m in fitted if m.text != current[m.id].text)
    saved = now - sum(count(m) for m in fitted)
    if not changed or saved <= 0:
        return None, saves
    replaced = {m.id: m for m in changed}
    return (changed, tuple(replaced.get(m.id, m) for m in context), estimate - saved), saves


def full_output(message: Message, spill_dir: Path) -> tuple[tuple[str, str], SaveOutput | None]:
    """Where the full text of a tool result is (path, SHA-256), and the write that puts it there (None when
    its spill file holds it already)."""
    spilled = message.metadata.get("spill_path"), message.metadata.get("spill_sha256")
    if isinstance(spilled[0], str) and isinstance(spilled[1], str):
        return (spilled[0], spilled[1]), None
    data = message.text.encode("utf-8", errors="replace")
    sha = hashlib.sha256(data).hexdigest()
    name = f"{message.name or 'tool'}-{sha[:16]}.txt".replace("/", "_")
    path = str(spill_dir / name)
    return (path, sha), SaveOutput(path, data)


def answer_cap_for(
    model: str,
    window: int,
    estimate: int,
    config: Config,
    *,
    counted: int | None = None,
    count_ratio: float = 1.0,
) -> int | None:
    """A request's ``max_tokens``: the room the window leaves (when the window is known: the model's, a
    configured one, or one learned from the provider), within the output limits (design §4.5). ``counted``
    of the ``estimate`` was counted here (None: all of it), by a tokenizer the server's counts
    ``count_ratio`` × (the session's :class:`~runtime.context.estimate.CountRatio`)."""
    from runtime.models import model_info

    models = config.models
    info = model_info(model, models)
    known = info.source != "fallback" or window != models.fallback_context_window
    return answer_cap(
        window=window if known else None,
        prompt_tokens=estimate,
        configured=config.agent.max_output_tokens,
        model_max=info.max_output_tokens,
        counted_tokens=estimate if counted is None else counted,
        count_ratio=count_ratio,
    )


def default_count_ratio(model: str, config: Config) -> float:
    """The count ratio a session assumes before a reply has taught it: 1.0 when the counts are the model's
    own (an OpenAI model's tiktoken encoding, one configured, or the server's ``/tokenize``), else
    :data:`~runtime.context.estimate.STAND_IN_COUNT_RATIO` (cl100k standing in for another tokenizer)."""
    from runtime.tokens import CL100K_BASE, encoding_for_model

    tokens = config.tokens
    if tokens.encoding is not None or tokens.server_tokenize:
        return 1.0
    base = model.rsplit("/", 1)[-1].lower().removeprefix("ft:")
    if encoding_for_model(model) != CL100K_BASE or base.startswith(("gpt-4", "gpt-3.5", "text-embedding")):
        return 1.0
    return STAND_IN_COUNT_RATIO
