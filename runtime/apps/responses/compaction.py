"""``responses.compact``: a session compacted on a client's request, and the ``compaction`` item that stands
for what it holds.

The item's ``encrypted_content`` seals the compacted session's point (owner, session, leaf) with the server's
key (``door.compacted_point`` opens it); a stateless client's chain of digests starts from its owner and that
token (``threads.seed``), so the next input, which starts with the compacted window, finds the thread left
here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from runtime.apps.responses import items as it
from runtime.apps.responses.api import ApiError, CreateResponse, ResponseRecord, usage_object
from runtime.apps.responses.records import new_response_id
from runtime.apps.responses.threads import Thread, chain, seed
from runtime.messages import Usage

if TYPE_CHECKING:
    from runtime.apps.responses.door import FrontDoor

log = logging.getLogger("agentcell.responses")


async def compact(door: FrontDoor, body: CreateResponse, owner: str) -> dict[str, Any]:
    """``POST /v1/responses/compact``: compact the session the request names (``previous_response_id``,
    or the stateless thread whose history is all of ``input``) and answer the compacted window: the
    conversation's user messages and one ``compaction`` item, whose ``encrypted_content`` names the
    compacted session's point (sealed). An input that holds that item goes on from there; with
    ``previous_response_id``, the compacted response's ``id`` does too."""
    sealer = await asyncio.to_thread(door.sealer)
    try:
        parsed = it.parse_input(body.input if body.input is not None else [], unseal=sealer.open)
    except it.InputError as exc:
        raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from None
    thread: Thread | None = None
    if body.previous_response_id:
        previous = await door.response(body.previous_response_id, "previous_response_id")
        if previous.leaf_id is None:
            raise ApiError(400, "that response left nothing to compact", param="previous_response_id")
        session_id, leaf_id = previous.session_id, previous.leaf_id
    else:
        thread = door.threads.take_whole(chain(seed(owner, parsed.compaction), parsed.messages))
        if thread is None:
            raise ApiError(
                400,
                "Nothing to compact: give previous_response_id, or the whole input of a conversation this "
                "server is holding (the history of your last response, as you would send it next).",
                param="input",
            )
        session_id, leaf_id = thread.session_id, thread.leaf_id
    try:
        async with door.lock(session_id):
            await door.hosted(session_id)
            before = await door.runtime.amessages(session_id)
            if (before[-1].id if before else None) != leaf_id:
                await door.runtime.abranch(session_id, leaf_id)
            result = await door.runtime.compact(session_id, keep_recent_tokens=0)  # (all in the summary)
            messages = await door.runtime.amessages(session_id)
    except BaseException:
        if thread is not None:
            await door.let_go(door.threads.put(thread))
        raise
    if not result.compacted and result.reason not in ("nothing_to_compact", None):
        log.warning("compaction of %s: %s", session_id, result.reason)
    leaf = messages[-1].id if messages else leaf_id
    point = msgspec.json.encode({"o": owner, "s": session_id, "l": leaf})
    token = sealer.seal_bytes(point, b"compaction")
    users = it.to_items([m for m in messages if m.role == "user" and it.is_shown(m)])
    output = [*users, {"id": f"cmp_{leaf}", "type": "compaction", "encrypted_content": token}]
    record = ResponseRecord(
        id=new_response_id(), session_id=session_id, model=body.model or "", status="completed"
    )
    record.leaf_id, record.output, record.usage = leaf, output, usage_object(Usage())
    record.completed_at = time.time()
    if thread is not None:  # the client's next input starts with the compacted window
        after = Thread(
            session_id=session_id,
            leaf_id=leaf,
            digest=chain(seed(owner, token), [])[0],
            length=0,
            ephemeral=thread.ephemeral,
        )
        await door.let_go(door.threads.put(after))
    else:
        await asyncio.to_thread(door.records.save_response, record)
    return {
        "id": record.id,
        "object": "response.compaction",
        "created_at": int(record.created_at),
        "output": output,
        "usage": record.usage,
    }
