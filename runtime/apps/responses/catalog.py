"""What the front door tells about models and inputs without running anything: ``GET /v1/models`` and
``POST /v1/responses/input_tokens``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from runtime.apps.responses import items as it
from runtime.apps.responses.api import ApiError, CreateResponse, function_tools
from runtime.messages import Message
from runtime.tokens import TokenCounter

if TYPE_CHECKING:
    from runtime.apps.responses.door import FrontDoor


def models(door: FrontDoor) -> list[dict[str, Any]]:
    """``GET /v1/models``: the agent profiles, then the models the configuration names."""
    config = door.runtime.config
    names = list(door.runtime.agents)
    for name in (
        config.agent.model,
        *(p.model for p in door.runtime.agents.values() if p.model),
        *config.models.context_windows,
        *config.models.max_output_tokens,
    ):
        if name not in names:
            names.append(name)
    created = int(door.runtime_started)
    return [{"id": n, "object": "model", "created": created, "owned_by": "agentcell"} for n in names]


async def count_input_tokens(door: FrontDoor, body: CreateResponse) -> int:
    """``POST /v1/responses/input_tokens``: the tokens of what a response with ``body`` would send the
    model (instructions, tools, the history it continues and its input), as the session estimates them."""
    tools = function_tools(body.tools)
    sealer = await asyncio.to_thread(door.sealer)
    try:
        parsed = it.parse_input(body.input if body.input is not None else [], unseal=sealer.open)
    except it.InputError as exc:
        raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from None
    history: list[Message] = []
    if body.previous_response_id:
        previous = await door.response(body.previous_response_id, "previous_response_id")
        await door.hosted(previous.session_id)
        history = await door.runtime.amessages(previous.session_id)
        ids = [m.id for m in history]
        if previous.leaf_id in ids:
            history = history[: ids.index(previous.leaf_id) + 1]
    model = body.model or door.runtime.config.agent.model
    counter = TokenCounter(model, door.runtime.config.tokens)
    instructions = "\n\n".join(t for t in (body.instructions, *parsed.instructions) if t)
    total = counter.count_messages([*history, *parsed.messages]) + counter.count_tools(tools.schemas)
    return total + (counter.count_system(instructions) if instructions else 0)
