"""The front door's work: a response request checked and prepared (where it goes on from, on which session),
its run ordered on its session, and what is kept of it (I/O lives here).

:class:`FrontDoor` owns the records (:mod:`records`), one lock per session (or new conversation: two
requests never run on one tree at once; the second waits), and the runs in progress. Each run is an
asyncio task of its own: a client that goes away mid-stream leaves it running to the end, and its
response is kept and can be retrieved or continued. A run's turn on its session is :mod:`runs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from actors.protocol import TurnOptions
from runtime.apps.responses import items as it
from runtime.apps.responses.api import (
    AGENTCELL_EVENTS,
    ENCRYPTED_REASONING,
    ApiError,
    CreateResponse,
    ResponseRecord,
    check_max_output_tokens,
    failure,
    function_tools,
    metadata_of,
    not_found,
    request_tools,
    unsupported,
)
from runtime.apps.responses.records import ConversationRecord, Records, new_response_id
from runtime.apps.responses.runs import STREAM_END, Run, Stateless, run_turn
from runtime.apps.responses.sealing import Sealer
from runtime.apps.responses.threads import Thread, Threads, chain, extend, seed
from runtime.errors import SessionNotFound
from runtime.messages import Message
from runtime.served import served

log = logging.getLogger("agentcell.responses")

MAX_QUEUED = 16
"""Responses that may wait for one session at a time; past it a request is a 429 (``too_many_queued_responses``)."""


class FrontDoor:
    """Responses and conversations over ``runtime``; ``hosted(session_id)`` hosts a stored session (under
    the server's policy) or raises ``SessionNotFound``; ``check_config`` applies the policy to a profile's
    config."""

    def __init__(
        self,
        runtime: Any,
        hosted: Callable[[str], Awaitable[str]],
        check_config: Callable[[dict[str, Any]], None],
    ) -> None:
        self.runtime = runtime
        self.hosted = hosted
        self.check_config = check_config
        self.records = Records(runtime.sessions_path)
        self.runs: dict[str, Run] = {}
        self._sealer: Sealer | None = None
        self.threads = Threads()
        self.max_queued = MAX_QUEUED
        self._queued: dict[str, int] = {}  # responses waiting for each session (one runs at a time)
        for session_id in self.records.ephemeral_sessions():  # store: false sessions a stop left behind
            with contextlib.suppress(Exception):
                runtime.delete_session(session_id)
            self.records.unmark_ephemeral(session_id)
        self.runtime_started = time.time()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def sealer(self) -> Sealer:
        """Seals reasoning into ``encrypted_content`` with the server's key (made once, kept on disk)."""
        if self._sealer is None:
            self._sealer = Sealer(self.records.sealing_key())
        return self._sealer

    # -- reading ----------------------------------------------------------------------------------------
    async def response(self, response_id: str, param: str | None = None) -> ResponseRecord:
        run = self.runs.get(response_id)
        if run is not None and not run.deleted:
            return run.record
        record = await asyncio.to_thread(self.records.load_response, response_id)
        if record is None:
            raise not_found("Response", response_id, param)
        if record.status == "in_progress" and response_id not in self.runs:  # the server stopped mid-run
            record.status, record.interrupted = "failed", True
            record.error = {
                "code": "server_error",
                "message": "The server stopped while this response was in progress; what its session recorded "
                "is kept, and a response with previous_response_id set to this one goes on from there.",
            }
        return record

    async def conversation(self, conversation_id: str, param: str | None = None) -> ConversationRecord:
        record = await asyncio.to_thread(self.records.load_conversation, conversation_id)
        if record is None:
            raise not_found("Conversation", conversation_id, param)
        return record

    async def conversation_items(self, record: ConversationRecord) -> list[dict[str, Any]]:
        """The conversation's items, oldest first: its session's path up to its leaf, then pending items."""
        out: list[dict[str, Any]] = []
        if record.session_id is not None:
            await self.hosted(record.session_id)
            messages = await self.runtime.amessages(record.session_id)
            ids = [m.id for m in messages]
            if record.leaf_id in ids:
                messages = messages[: ids.index(record.leaf_id) + 1]
            out.extend(it.to_items(messages))
        out.extend(record.pending)
        return out

    def conversation_lock(self, conversation_id: str) -> asyncio.Lock:
        """Held by a response in the conversation from when it reads it until it recorded where it left it."""
        return self.lock(conversation_id)

    @staticmethod
    def check_added_outputs(record: ConversationRecord, added: list[dict[str, Any]]) -> None:
        """Items added to a conversation: each ``function_call_output`` answers a call the conversation
        waits for, or one among its pending and added items (else the next response could not run)."""
        known = set(record.awaiting)
        known |= {
            str(i.get("call_id")) for i in (*record.pending, *added) if i.get("type") == "function_call"
        }
        for index, item in enumerate(added):
            if item.get("type") == "function_call_output" and item.get("call_id") not in known:
                raise ApiError(
                    400,
                    f"No tool call found for function call output with call_id {item.get('call_id')}.",
                    param=f"items[{index}].call_id",
                )

    async def delete_item(self, record: ConversationRecord, item_id: str) -> None:
        """Delete an item of a conversation. A pending one is dropped; one its session recorded leaves the
        conversation's other items pending for its next response, which starts a new session from them
        (the model then sees the conversation without it)."""
        if any(i.get("id") == item_id for i in record.pending):
            record.pending = [i for i in record.pending if i.get("id") != item_id]
        else:
            items = await self.conversation_items(record)
            if not any(i.get("id") == item_id for i in items):
                raise not_found("Item", item_id)
            record.pending = [_unnamed(i) for i in items if i.get("id") != item_id]
            record.session_id, record.leaf_id, record.awaiting = None, None, []
        await asyncio.to_thread(self.records.save_conversation, record)

    # -- a response -------------------------------------------------------------------------------------
    async def create(self, body: CreateResponse, owner: str = "") -> Run:
        """Check ``body``, start its run, and return it (its task runs on). ``owner`` (a digest of the
        client's credentials) scopes the stateless threads a request may go on with.

        A response in a conversation holds the conversation from before it reads where the conversation is
        until it has recorded where it left it: the next one goes on after it, not beside it."""
        held: asyncio.Lock | None = None
        if body.conversation is not None and not body.previous_response_id and body.conversation_id:
            held = self.lock(body.conversation_id)
            await held.acquire()
        try:
            run, messages, options, model, conversation = await self._prepare(body, owner)
            assert run.session_id is not None
            if self._queued.get(run.session_id, 0) >= self.max_queued:
                await self._drop(run)
                raise ApiError(
                    429,
                    f"{self.max_queued} responses already wait for this session (one runs at a time): "
                    "wait for one to finish, or cancel one.",
                    type="rate_limit_error",
                    code="too_many_queued_responses",
                )
            if run.record.store:  # before the first byte: the id a client holds survives a crash
                try:
                    await asyncio.to_thread(self.records.save_response, run.record)
                except BaseException:
                    self.runs.pop(run.record.id, None)
                    raise
        except BaseException:
            if held is not None:
                held.release()
            raise
        self._queued[run.session_id] = self._queued.get(run.session_id, 0) + 1
        run.queued = True
        run.task = asyncio.create_task(self._run(run, messages, options, model, conversation, held))
        return run

    async def _drop(self, run: Run) -> None:
        """Forget a run refused before it started (its thread goes back to the table)."""
        self.runs.pop(run.record.id, None)
        if run.stateless is not None and run.stateless.thread is not None:
            await self.let_go(self.threads.put(run.stateless.thread))

    def abandon(self, run: Run) -> None:
        """The client went away from ``run``'s stream: a run still waiting for its session (behind another
        response) is cancelled, as nobody will read it; one that has its session finishes and is kept."""
        if run.queued:  # behind another response on its session
            run.cancelled = True  # (it ends as soon as it has the session, without a turn)
            self._leave_queue(run)

    async def _prepare(
        self, body: CreateResponse, owner: str
    ) -> tuple[Run, list[Message], TurnOptions, str, ConversationRecord | None]:
        names = unsupported(body)
        if names:
            raise ApiError(
                400,
                f"Unsupported parameter(s) for this server: {', '.join(names)}.",
                param=names[0],
                code="unsupported_parameter",
            )
        check_max_output_tokens(body.max_output_tokens)
        if not body.model:
            raise ApiError(
                400, "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
            )
        if body.previous_response_id and body.conversation is not None:
            raise ApiError(
                400,
                "previous_response_id and conversation cannot be used together.",
                param="previous_response_id",
            )
        client_tools = function_tools(body.tools)
        metadata = metadata_of(body)
        sealer = await asyncio.to_thread(self.sealer)
        try:
            parsed = it.parse_input(body.input if body.input is not None else [], unseal=sealer.open)
        except it.InputError as exc:
            raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from None
        previous = conversation = None
        if body.previous_response_id:
            running = self.runs.get(body.previous_response_id)
            if running is not None and running.task is not None:  # it goes on from where that one ends
                with contextlib.suppress(Exception):
                    await asyncio.shield(running.task)
            previous = await self.response(body.previous_response_id, "previous_response_id")
        elif body.conversation is not None:
            conversation_id = body.conversation_id
            if not conversation_id:
                raise ApiError(400, "conversation must be an id or {'id': ...}", param="conversation")
            conversation = await self.conversation(conversation_id, "conversation")
            pending = it.parse_input(conversation.pending, keep_ids=True)
            parsed.messages[:0] = pending.messages
            parsed.instructions[:0] = pending.instructions
            parsed.calls[:0] = pending.calls
            parsed.outputs[:0] = pending.outputs
        if not parsed.messages:
            raise ApiError(400, "input is empty: send a message or function call outputs.", param="input")
        if parsed.messages[-1].role not in ("user", "tool"):
            raise ApiError(
                400, "input must end with a user message or a function_call_output.", param="input"
            )
        model, profile = await self._model(body.model)
        awaiting = previous.awaiting if previous else conversation.awaiting if conversation else []
        session_id = previous.session_id if previous else conversation.session_id if conversation else None
        start_leaf = previous.leaf_id if previous else conversation.leaf_id if conversation else None
        if previous is not None and previous.interrupted and not await self._stored(previous.session_id):
            # the server stopped before the session of a thread's first response was written: the thread
            # starts again in a session of its own, with that response's input sent again (run.replay)
            session_id = start_leaf = None
        digests: list[bytes] = []
        thread: Thread | None = None
        sent = parsed.messages
        if parsed.compaction is not None and (previous is not None or conversation is not None):
            raise ApiError(
                400, "a compaction item goes without previous_response_id or conversation", param="input"
            )
        if previous is None and conversation is None:  # a stateless client: does it go on with a thread?
            digests = chain(seed(owner, parsed.compaction), parsed.messages)
            thread = self.threads.take(digests, body.prompt_cache_key)
            if thread is not None:
                session_id, start_leaf, awaiting = thread.session_id, thread.leaf_id, thread.awaiting
                sent = parsed.messages[thread.length :]
            elif parsed.compaction is not None:  # (its thread was let go: the session may still be there)
                session_id, start_leaf = compacted_point(owner, parsed.compaction, sealer)
        copy_of: tuple[str, str | None] | None = None
        copied = body.store is False and (previous is not None or conversation is not None)
        if copied and session_id is not None:
            copy_of, session_id, start_leaf = (session_id, start_leaf), None, None  # (see _copy)
        try:
            _check_outputs(parsed, awaiting)
        except ApiError:
            if thread is not None:
                await self.let_go(self.threads.put(thread))
            raise
        # the model sees the input's system and developer messages after the instructions; the response's
        # ``instructions`` are the request's own
        instructions = "\n\n".join(t for t in (body.instructions, *parsed.instructions) if t) or None
        shape = it.Shape(
            seal=sealer.seal if ENCRYPTED_REASONING in (body.include or ()) else None,
            namespaces=client_tools.namespaces,
        )
        record = ResponseRecord(
            id=new_response_id(),
            session_id=session_id or "",
            model=body.model,
            start_leaf=start_leaf,
            input_items=it.to_items(parsed.messages),
            instructions=body.instructions,
            previous_response_id=body.previous_response_id,
            conversation_id=conversation.id if conversation else None,
            tools=request_tools(body),
            metadata=metadata,
            truncation=body.truncation or "auto",
            store=body.store is not False,
            user=body.user,
            safety_identifier=body.safety_identifier,
            prompt_cache_key=body.prompt_cache_key,
            text=body.text,
            reasoning=body.reasoning,
            service_tier=body.service_tier,
            max_output_tokens=body.max_output_tokens,
            parallel_tool_calls=body.parallel_tool_calls is not False,
        )
        options = TurnOptions(
            client_tools=tuple(client_tools.schemas),
            instructions=instructions,
            compaction=body.truncation != "disabled",
            max_output_tokens=body.max_output_tokens,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            reasoning_effort=(body.reasoning or {}).get("effort"),
            verbosity=(body.text or {}).get("verbosity"),
        )
        extra = AGENTCELL_EVENTS in (body.include or ())
        run = Run(record, bool(body.stream), client_tools, shape, extra)
        run.copied = copied  # store: false goes on in a copy: nothing is added to the stored session
        system_prompt: str | None = None
        if copy_of is not None:
            history, system_prompt = await self._copy(*copy_of)
            sent = [*history, *sent]
        if session_id is None:
            run.session_id = await self._start_session(model, profile, instructions or system_prompt)
            record.session_id = run.session_id
            if not record.store:  # (gone at the latest when the server next starts: see _let_go)
                await asyncio.to_thread(self.records.mark_ephemeral, run.session_id)
        else:
            run.session_id = session_id
        if previous is not None and previous.interrupted:
            run.replay = it.parse_input(previous.input_items, keep_ids=True).messages
        if previous is None and conversation is None:
            run.stateless = Stateless(digests[-1], len(parsed.messages), thread, body.prompt_cache_key)
        self.runs[record.id] = run
        return run, sent, options, model, conversation

    async def _model(self, name: str) -> tuple[str, Any]:
        """The model to run, and the agent profile ``name`` names (or None). A name that is neither a
        profile nor a model any provider serves (``two``: the OpenAI Agents SDK's default client strips
        the ``openai/`` of ``openai/two``) is a 400 ``model_not_found`` naming the ways to say it."""
        from runtime.models import validate_model_name

        profile = self.runtime.agents.get(name)
        if profile is not None:
            return profile.model or self.runtime.config.agent.model, profile
        try:
            model = validate_model_name(name)
        except ValueError as exc:
            raise ApiError(400, f"model: {exc}", param="model", code="model_not_found") from None
        if "/" not in model and not await asyncio.to_thread(_has_provider, model):
            profiles = ", ".join(sorted(self.runtime.agents)[:20]) or "none"
            raise ApiError(
                400,
                f"The model '{model}' is neither an agent profile of this server (profiles: {profiles}) nor "
                f"a model with a provider: name its provider ('openai/{model}'). A client that strips a "
                f"leading 'openai/' (the OpenAI Agents SDK's default client does) needs 'openai/openai/{model}'"
                ", or a profile of that name.",
                param="model",
                code="model_not_found",
            )
        return model, None

    async def _stored(self, session_id: str) -> bool:
        """Whether ``session_id`` is a session of this runtime (hosted, or stored and now hosted again)."""
        try:
            await self.hosted(session_id)
        except SessionNotFound:
            return False
        return True

    async def _start_session(self, model: str, profile: Any, instructions: str | None) -> str:
        tools: Any = None
        config: dict[str, Any] | None = None
        system_prompt = instructions or ""
        if profile is not None:
            config = dict(profile.config) or None
            if config:
                self.check_config(config)
            system_prompt = instructions or profile.system_prompt
            tools = _profile_tools(profile.tools, self.runtime)
        sid: str = await self.runtime.astart_session(
            model=model, system_prompt=system_prompt, tools=tools, config=config
        )
        return sid

    async def _run(
        self,
        run: Run,
        messages: list[Message],
        options: TurnOptions,
        model: str,
        conversation: ConversationRecord | None,
        held: asyncio.Lock | None,
    ) -> None:
        try:
            await self._run_held(run, messages, options, model, conversation)
        finally:
            if held is not None:  # the conversation's lock, taken in create
                held.release()

    async def _run_held(
        self,
        run: Run,
        messages: list[Message],
        options: TurnOptions,
        model: str,
        conversation: ConversationRecord | None,
    ) -> None:
        record = run.record
        run.send(run.translator.start(record.to_api()))
        assert run.session_id is not None
        try:
            async with self.lock(run.session_id):
                self._leave_queue(run)
                if run.cancelled:
                    run.end("cancelled", None)
                else:
                    await run_turn(self.runtime, self.hosted, run, messages, options, model)
        except Exception as exc:  # the run fails, in the API's shape; the server goes on
            log.exception("response %s failed", record.id)
            status, error = failure("internal", f"{type(exc).__name__}: {exc}")
            run.http_status = status
            run.end("failed", error)
        finally:
            self._leave_queue(run)
        record.completed_at = time.time() if record.status == "completed" else None
        final: list[dict[str, Any]] = []
        if run.queue is not None:  # the output as streamed (a failed attempt's items included)
            response = record.to_api()
            final = run.translator.finish(response)
            record.output = response["output"]
        try:
            await self._keep(run, conversation)
        finally:
            run.send(final)
            if run.queue is not None:
                run.queue.put_nowait(STREAM_END)
            self.runs.pop(record.id, None)

    def _leave_queue(self, run: Run) -> None:
        if not run.queued or run.session_id is None:
            return
        run.queued = False
        left = self._queued.get(run.session_id, 1) - 1
        if left > 0:
            self._queued[run.session_id] = left
        else:
            self._queued.pop(run.session_id, None)

    async def _copy(self, session_id: str, leaf_id: str | None) -> tuple[list[Message], str | None]:
        """What a ``store: false`` response that goes on from a stored one (or in a conversation) sends a
        session of its own: the stored session's conversation up to ``leaf_id``, and its system prompt."""
        await self.hosted(session_id)
        messages = await self.runtime.amessages(session_id)
        ids = [m.id for m in messages]
        if leaf_id in ids:
            messages = messages[: ids.index(leaf_id) + 1]
        header = await asyncio.to_thread(self.runtime.services.directory.read_header, session_id)
        return [m for m in messages if it.is_shown(m)], header.system_prompt if header is not None else None

    async def _keep(self, run: Run, conversation: ConversationRecord | None) -> None:
        """Save what the response leaves: its record (when stored), its conversation's place."""
        record = run.record
        if run.copied:  # store: false in a copy: nothing of it is kept, the copy goes at once
            await self.let_go([Thread(session_id=record.session_id, leaf_id="", digest=b"", length=0)])
            return
        if conversation is not None and record.leaf_id is not None:
            conversation.session_id, conversation.leaf_id = record.session_id, record.leaf_id
            conversation.awaiting, conversation.pending = list(record.awaiting), []
            await asyncio.to_thread(self.records.save_conversation, conversation)
        if record.store and not run.deleted:
            await asyncio.to_thread(self.records.save_response, record)
        stateless = run.stateless
        if stateless is None:
            return
        # a session only store: false responses wrote is let go with its thread (or at once, without one)
        ephemeral = not record.store and (stateless.thread is None or stateless.thread.ephemeral)
        if record.store and stateless.thread is not None and stateless.thread.ephemeral:
            await asyncio.to_thread(
                self.records.unmark_ephemeral, record.session_id
            )  # a response keeps it now
        if record.status == "completed" and record.leaf_id is not None:  # the client's next request may go on
            sealer = await asyncio.to_thread(self.sealer)
            shown = [i for i in record.output if i.get("status") != "incomplete"]
            try:
                echoed = it.parse_input(shown, unseal=sealer.open).messages  # (as the client will send it)
            except it.InputError:
                echoed = None
            if echoed is not None:
                thread = Thread(
                    session_id=record.session_id,
                    leaf_id=record.leaf_id,
                    digest=extend(stateless.digest, echoed),
                    length=stateless.length + len(echoed),
                    awaiting=record.awaiting,
                    cache_key=stateless.cache_key,
                    ephemeral=ephemeral,
                )
                await self.let_go(self.threads.put(thread))
                return
        if ephemeral:  # store: false keeps nothing of a session it started, nor of its thread's
            await self.let_go([Thread(session_id=record.session_id, leaf_id="", digest=b"", length=0)])

    async def let_go(self, threads: list[Thread]) -> None:
        """Threads out of the table: the sessions of ``store: false`` ones are deleted."""
        for thread in threads:
            if thread.ephemeral:
                with contextlib.suppress(Exception):
                    await self.runtime.adelete_session(thread.session_id)
                await asyncio.to_thread(self.records.unmark_ephemeral, thread.session_id)

    async def cancel(self, response_id: str) -> ResponseRecord:
        run = self.runs.get(response_id)
        if run is None:
            record = await self.response(response_id)
            raise ApiError(
                400, f"Response '{record.id}' is {record.status}: only one in progress can be cancelled."
            )
        run.cancelled = True
        if run.sent and run.session_id is not None and served(self.runtime).is_hosted(run.session_id):
            await self.runtime.abort(
                run.session_id
            )  # (before it is sent, another run may be the one running)
        if run.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(run.task)
        return run.record

    async def delete(self, response_id: str) -> None:
        run = self.runs.get(response_id)
        if run is not None:
            run.deleted = True
            await asyncio.to_thread(self.records.delete_response, response_id)
            return
        if not await asyncio.to_thread(self.records.delete_response, response_id):
            raise not_found("Response", response_id)


def _unnamed(item: dict[str, Any]) -> dict[str, Any]:
    """An item without its id (it is recorded again, as a new message)."""
    return {k: v for k, v in item.items() if k != "id"}


def _has_provider(model: str) -> bool:
    """Whether litellm's provider resolution places ``model`` (``gpt-4o`` yes, ``two`` no)."""
    from runtime.gateway import load_litellm

    try:
        load_litellm().get_llm_provider(model)
    except Exception:
        return False
    return True


def _check_outputs(parsed: it.ParsedInput, awaiting: list[str]) -> None:
    """Every ``function_call_output`` answers a call waiting for it (or one of the input's own), and every
    waiting call gets its output."""
    known = set(awaiting) | set(parsed.calls)
    for call_id in parsed.outputs:
        if call_id not in known:
            raise ApiError(
                400, f"No tool call found for function call output with call_id {call_id}.", param="input"
            )
    for call_id in awaiting:
        if call_id not in parsed.outputs:
            raise ApiError(400, f"No tool output found for function call {call_id}.", param="input")


def _profile_tools(tools: Any, runtime: Any) -> Any:
    """A profile's ``tools`` for a session of its own: ``builtin``, a list of built-in tools, or none."""
    if tools == "builtin":
        return "builtin"
    if not isinstance(tools, list):
        return None  # "none", or "inherit" (a session started here has no parent to inherit from)
    from runtime.tools.builtin import builtin_registry

    available = {t.name: t for t in builtin_registry(shell=runtime.config.agent.shell_enabled).tools()}
    return [available[name] for name in tools if name in available]


def compacted_point(owner: str, token: str, sealer: Sealer) -> tuple[str, str]:
    """The session and point a ``compaction`` item names (the owner's only; ``compaction.compact`` seals
    them)."""
    try:
        point = msgspec.json.decode(sealer.open_bytes(token, b"compaction"))
        if point["o"] != owner:
            raise ValueError("another client's")
        return str(point["s"]), str(point["l"])
    except (ValueError, KeyError, TypeError, msgspec.DecodeError):
        raise ApiError(
            400,
            "input: a compaction item this server did not give you",
            param="input",
            code="invalid_value",
        ) from None
