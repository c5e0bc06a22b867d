"""The session store actor: owns one session's tree and log (design §2.2, 2.3).

It is the only writer of its session's log. On start it has the log writer take the session lock and read
the log (after any write an earlier incarnation still had queued), replays it (so a restarted store, or a
resumed session, is exactly what was acknowledged before) and reports a torn last line with
``log_recovered``; commands and queries that arrive meanwhile wait, in order, for the log to be read. It
answers queries from its in-memory tree and appends through the runtime's shared
:class:`~runtime.store.writer.LogWriter`, never touching the disk, nor waiting, on a dispatcher thread.

Writes are acknowledged only once the writer has confirmed them:

* with ``reply_to`` (an actor ref, told the reply; or a callable, called with it), the reply is a
  :class:`Stored` sent after the write — ``Stored.error`` says if it failed;
* through ``ask`` without ``reply_to``, the ask is answered later (a deferred reply): its future
  resolves to the :class:`Stored` once the write is done, or fails with the write's ``OSError``.

A command that does not fit the tree (an unknown parent or leaf, a duplicate id) raises ``ValueError``
in the handler: an ``ask`` gets it, a ``tell`` crashes the store, and supervision restarts it from the log.
A failed write (e.g. ENOSPC) is broadcast as ``persistence_error`` and crashes the store on purpose: its
memory is ahead of the disk, and the restart rebuilds it from what was really written.

Queries (:class:`GetContext`, :class:`GetMessages`, :class:`GetTree`) reflect every command received so
far, acknowledged or not. Answers reach ``reply_to`` when given, and are the ``ask`` result otherwise.

Memory bounded by the context (design §2.2): after each compaction, and after replaying a log, the store
trims its tree to the model's view, so a session busy all day keeps what its context holds, not its
history. A command that needs a dropped node (a branch to an old message, :class:`GetTree`, an id that may
be a duplicate of a dropped one) makes the store read its log back on the writer thread — commands that
arrive meanwhile wait, in order — handle it on the whole tree, and trim again. :class:`GetMessages`
answers the part in memory and how many messages come before it; the caller reads those from the log
(:mod:`runtime.store.history`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
import pykka

from actors.protocol import (
    Append,
    Branch,
    ContextView,
    GetContext,
    GetMessages,
    GetTree,
    MessagesView,
    Overlay,
    RecordCompaction,
    RecordSpend,
    RecordStep,
    ReplyTo,
    SetMetadata,
    SetModel,
    SetVisibility,
    Stored,
    SyncTurn,
)
from actors.store_locks import RELEASE_WAIT, lock_holders
from runtime import events as ev
from runtime.actor import ActorStop, PooledActor, Ref
from runtime.context.integrity import unfinished_turn
from runtime.errors import SessionLockedError, SessionNotFound, StoreError
from runtime.ids import validate_session_id
from runtime.messages import Message, new_id
from runtime.store.entries import Entry, Header, MessageEntry, scrub_secrets
from runtime.store.log import RecoveryInfo, SessionLog, read_log, replay, signature
from runtime.store.session_lock import SessionLock
from runtime.store.sessions import SessionDirectory
from runtime.store.tree import SPEND_KEY, TURN_ENDED_KEY, NeedsHistory, SessionTree
from runtime.store.turns import TurnJournal
from runtime.store.writer import FsyncPolicy, LogWriter, WriterClosedError

log = logging.getLogger("agentcell.store")

Publish = Callable[[ev.Event], Any]
Estimator = Callable[[Sequence[Message]], int]
T = TypeVar("T")

_RETRY_DELAY = 0.005  # seconds between two tries while a stopped predecessor still holds the lock

# -- the messages it sends itself (its protocol is in actors.protocol) ------------------------------------


class _WriteFailed(msgspec.Struct, frozen=True):
    error: Exception


class _Opening:
    """What the log writer found opening a store's log (filled on the writer thread, read by the store)."""

    __slots__ = ("deadline", "entries", "error", "info", "lock", "retry", "tree")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # until when a lock held by a stopping store of this process is waited for
        self.retry = False  # the lock was held by such a store: ask again shortly
        self.lock: SessionLock | None = None
        self.tree: SessionTree | None = None  # replayed already by a resume (the log as it still is)
        self.entries: list[Entry] = []
        self.info: RecoveryInfo | None = None
        self.error: Exception | None = None


class _Opened(msgspec.Struct, frozen=True):
    opening: _Opening


class _OpenAgain(msgspec.Struct, frozen=True):
    pass


class _Reread(msgspec.Struct, frozen=True):
    """The log read back on the writer thread (every write queued before it done): the whole tree again."""

    entries: list[Entry]
    error: Exception | None = None


class StoreWriteError(StoreError, RuntimeError):
    """The store stopped because its log could not be written; it restarts from what is on disk."""


# -- the actor --------------------------------------------------------------------------------------------


class SessionStore(PooledActor):
    """Owns one session's tree and log.

    ``header`` starts a new session when there is no log yet (its log file is created with the first
    write, the header first); with a log on disk (a restart) the log wins. ``header=None`` resumes and
    fails with :class:`~runtime.errors.SessionNotFound` when there is no log. ``fsync`` overrides the
    writer's policy for this session; ``estimator`` (e.g. a token counter's
    ``count_messages``) fills :attr:`ContextView.estimated_tokens`. ``turns``: the runtime's open-turns
    journal, told when a turn starts (before its start record is queued) and once its end is in the log.
    """

    def __init__(
        self,
        session_id: str,
        directory: SessionDirectory,
        writer: LogWriter,
        header: Header | None,
        publish: Publish,
        *,
        fsync: FsyncPolicy | None = None,
        estimator: Estimator | None = None,
        turns: TurnJournal | None = None,
    ) -> None:
        super().__init__()
        self.session_id = validate_session_id(session_id)
        self.directory = directory
        self.writer = writer
        self.publish = publish
        self.estimator = estimator
        self.turns = turns
        self._fsync = fsync
        self._header = header
        self._log = SessionLog(directory.log_path(session_id), writer, fsync=fsync)
        self._tree = SessionTree()
        self._lock: SessionLock | None = None
        self._opening: _Opening | None = None  # set from on_start until the log is read
        self._unwritten: Header | None = None  # a new session's header, until its first write
        self._rereading = False  # the log is being read back for a command that needs the whole tree
        self._history = new_id()  # names this tree's history; a new one when the log is read back

    # -- lifecycle --------------------------------------------------------------------------------------

    def on_start(self) -> None:
        """Open the log off the dispatcher: the log writer takes the lock and reads the log (after any
        write an earlier incarnation still has queued to it) and tells the result back (:class:`_Opened`).
        Messages that arrive meanwhile are stashed and handled, in order, once the tree is built."""
        self._opening = _Opening(time.monotonic() + RELEASE_WAIT)
        self._open_on_writer()

    def _open_on_writer(self) -> None:
        opening, me = self._opening, self.actor_ref
        assert opening is not None
        directory, session_id, key = (
            self.directory,
            self.session_id,
            str(self.directory.lock_path(self.session_id)),
        )

        def open_log(path: str) -> None:  # on the writer thread
            opening.retry = False
            try:
                directory.ensure()
                try:
                    # The lock of a predecessor that failed (its close ran before this, on this thread)
                    lock = lock_holders.take(key, me) or directory.lock(session_id)
                except SessionLockedError as exc:
                    # A store of this process that stopped a moment ago lets go of the lock once its last
                    # writes are done: try again shortly. A live second store is refused at once.
                    if (
                        exc.held_by_this_process
                        and not lock_holders.alive(key)
                        and time.monotonic() < opening.deadline
                    ):
                        opening.retry = True
                        return
                    raise
                lock_holders.add(key, me)
                opening.lock = lock
                handed = directory.take_over(session_id)  # a resume that replayed the log just now
                try:
                    if handed is not None and handed[1] == signature(path):
                        opening.tree = handed[0]
                    else:
                        opening.entries, opening.info = read_log(path)
                except FileNotFoundError:
                    pass
            except Exception as exc:
                opening.error = exc

        def told(error: Exception | None) -> None:  # on the writer thread, after open_log
            if error is not None and opening.error is None:
                opening.error = error
            try:
                me.tell(_Opened(opening))
            except pykka.ActorDeadError:  # stopped meanwhile: its _close_log releases what was taken
                pass

        self.writer.call(self._log.path, open_log, told, reset=True)

    def _opened(self, opening: _Opening) -> None:
        """The writer's answer: build the tree (or create the log), then handle what was stashed."""
        if opening.retry:
            me = self.actor_ref

            def again() -> None:
                try:
                    me.tell(_OpenAgain())
                except pykka.ActorDeadError:
                    pass

            assert self.actor_dispatcher is not None
            self.actor_dispatcher.call_later(_RETRY_DELAY, again)
            return
        self._opening, self._lock = None, opening.lock
        try:
            if opening.error is not None:
                raise opening.error
            self._open(opening.entries, opening.info, opening.tree)
        except BaseException as exc:
            self._emit(
                ev.ErrorOccurred, message=f"cannot open session {self.session_id}: {exc}", code="store_open"
            )
            raise  # the stashed asks fail as the store stops; its supervisor restarts it
        self.unstash_all()

    def _open(self, entries: list[Entry], info: RecoveryInfo | None, tree: SessionTree | None) -> None:
        path = self._log.path
        if info is not None and info.torn:
            self._emit(ev.LogRecovered, path=str(path), torn_bytes=info.torn_bytes)
        if tree is not None or entries:
            self._tree = tree if tree is not None else replay(path, entries)
            self._tree.trim()
            self._settle()
            return
        # No log, or one that died before its header was written: a new session.
        if self._header is None:
            raise SessionNotFound(f"no stored session {self.session_id!r} in {self.directory.root}")
        if self._header.session_id != self.session_id:
            raise ValueError(f"header is for session {self._header.session_id!r}, not {self.session_id!r}")
        header = msgspec.structs.replace(self._header, config=scrub_secrets(self._header.config))
        self._tree = SessionTree(header)
        self._unwritten = header  # the log file is created with the first entry worth keeping
        self._settle()

    def _settle(self) -> None:
        """A session the journal of open turns lists (design §3.12) whose log shows no turn under way is
        dropped from it (the line of its turn's end was lost with its process)."""
        turns = self.turns
        if (
            turns is not None
            and self.session_id in turns
            and not unfinished_turn(self._tree.context_snapshot(), self._tree.turn_ended_at)
        ):
            turns.settled(self.session_id)

    def on_stop(self) -> None:
        self._close_log()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self._close_log(park=True)

    def _close_log(self, *, park: bool = False) -> None:
        """Release the lock once the writer has written (and synced) everything queued for this log —
        or, when the store stops while still opening, once the writer has done with the opening. A store
        that failed (``park``) leaves it for the store restarted in its place (see :class:`~actors.store_locks.LockHolders`)."""
        lock, self._lock = self._lock, None
        opening, self._opening = self._opening, None
        if lock is None and opening is None:
            return
        me = self.actor_ref

        def release(_error: Exception | None = None, *, keep: bool = park) -> None:
            held = lock if lock is not None else opening.lock if opening is not None else None
            if held is not None and keep and held.held:
                lock_holders.park(str(held.path), held)
            elif held is not None:
                held.release()
                lock_holders.remove(str(held.path), me)

        try:
            self._log.close(release)
        except WriterClosedError:  # the runtime is closing: no successor will open the log
            release(keep=False)

    def _handle_receive(self, message: Any) -> Any:
        # pykka's own messages (proxy calls and attribute reads) wait for the opening too; a stop does not
        if (self._opening is not None or self._rereading) and not isinstance(message, ActorStop):
            self.stash(message)
            return None
        return super()._handle_receive(message)

    # -- messages ---------------------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if self._opening is not None:  # the log is not read yet
            match message:
                case _Opened(opening=opening):
                    self._opened(opening)
                case _OpenAgain():
                    self._open_on_writer()
                case _:
                    self.stash(message)
            return None
        if self._rereading:
            if isinstance(message, _Reread):
                self._reread(message)
            else:
                self.stash(message)
            return None
        try:
            return self._handle(message)
        except NeedsHistory:  # the tree is unchanged: read the whole of it back, then handle this again
            self.stash(message)
            self._read_back()
            return None

    def _handle(self, message: Any) -> Any:
        tree = self._tree
        match message:
            case GetContext(reply_to=reply_to):
                return self._answer(reply_to, self.view())
            case Append(messages=messages, parent_id=parent_id, reply_to=reply_to, with_view=with_view):
                batch = (messages,) if isinstance(messages, Message) else tuple(messages)
                _check_appendable(tree, batch, parent_id)  # all or nothing
                for step in message.steps:
                    tree.apply(step)
                    if step.kind == "turn" and self.turns is not None:  # (its line goes before the record)
                        self.turns.opened(self.session_id, self._fsync, self._log.name)
                appended = tuple(tree.append(m, parent_id if i == 0 else None) for i, m in enumerate(batch))
                entries: tuple[Entry, ...] = (*message.steps, *appended)
                self._write(entries, reply_to, self.view() if with_view else None)
                if message.end_turn:  # queued with the append: the writer does both in one wake-up
                    self._sync(None, answer=False)
            case SyncTurn(reply_to=reply_to, ended=ended):
                if ended:  # the newest message the model sees: where the turn ended
                    context = tree.context_snapshot()
                    last = context[-1].id if context else None
                    self._write((tree.set_metadata(TURN_ENDED_KEY, last),), None)
                self._sync(reply_to)
            case RecordStep(step=step, reply_to=reply_to):
                tree.apply(step)
                if step.kind == "resumed" and self.turns is not None:  # a turn taken up is open here now
                    self.turns.opened(self.session_id, self._fsync, self._log.name)
                self._write((step,), reply_to, restart_on_failure=False)
            case RecordSpend(usage=usage, reply_to=reply_to):
                spent = tree.unlogged_spend
                total = usage if spent is None else spent + usage
                self._write((tree.set_metadata(SPEND_KEY, msgspec.to_builtins(total)),), reply_to)
            case RecordCompaction():
                summary, spent = message.summary, tree.unlogged_spend
                if spent is not None:  # carried by this summary (the entry clears it)
                    summary = msgspec.structs.replace(
                        summary, usage=spent if summary.usage is None else summary.usage + spent
                    )
                entry = tree.record_compaction(
                    summary,
                    message.first_kept_id,
                    tokens_before=message.tokens_before,
                    tokens_after=message.tokens_after,
                    mode=message.mode,
                    trigger=message.trigger,
                    artifacts=message.artifacts,
                    cause=message.cause,
                )
                self._write((entry,), message.reply_to)
                tree.trim()  # what the compaction summarized is in the log: memory follows the context
            case Overlay(replacements=replacements, reply_to=reply_to):
                self._write((tree.overlay(replacements),), reply_to)
            case SetVisibility(message_ids=ids, reply_to=reply_to):
                change = tree.set_visibility(
                    ids, agent_visible=message.agent_visible, user_visible=message.user_visible
                )
                self._write((change,), reply_to)
            case Branch(leaf_id=leaf_id, reply_to=reply_to):
                self._write((tree.branch(leaf_id),), reply_to)
            case SetMetadata(key=key, value=value, reply_to=reply_to):
                self._write((tree.set_metadata(key, value),), reply_to)
            case SetModel(model=model):  # the session switched models: the log records it
                self._write((tree.set_metadata("model", model),), None)
            case GetMessages(reply_to=reply_to):
                view = MessagesView(
                    session_id=self.session_id,
                    leaf_id=tree.leaf_id,
                    messages=tuple(tree.messages()),
                    before=tree.messages_before,
                    history=self._history,
                )
                return self._answer(reply_to, view)
            case GetTree(reply_to=reply_to):
                return self._answer(reply_to, tree.copy())
            case _WriteFailed(error=error):
                raise StoreWriteError(f"the log {self._log.path} could not be written: {error}") from error
            case _:
                return super().on_receive(message)
        return None  # writes are answered once the writer confirms them (see the module docstring)

    def _read_back(self) -> None:
        """Read the log back on the writer thread (after every write queued for it) to rebuild the whole
        tree; messages wait, in order, until :class:`_Reread` arrives."""
        self._rereading = True
        me = self.actor_ref
        found: list[Entry] = []

        def read(path: str) -> None:  # on the writer thread
            found.extend(read_log(path, repair=False)[0])

        def told(error: Exception | None) -> None:
            try:
                me.tell(_Reread(found, error))
            except pykka.ActorDeadError:
                pass

        self.writer.call(self._log.path, read, told)

    def _reread(self, message: _Reread) -> None:
        self._rereading = False
        if message.error is not None:
            raise StoreError(f"cannot read the log {self._log.path} back: {message.error}") from message.error
        self._tree = replay(self._log.path, message.entries)
        self._history = new_id()  # a branch may change the path: pages read before are another history
        try:
            self.unstash_all()  # the command that needed the whole tree first, then what waited
        finally:
            if not self._rereading:
                self._tree.trim()

    # -- plain methods (usable through a proxy) ---------------------------------------------------------

    def view(self) -> ContextView:
        """The model-facing view (what :class:`GetContext` answers)."""
        tree = self._tree
        messages = tree.context_snapshot()
        return ContextView(
            session_id=self.session_id,
            leaf_id=tree.leaf_id,
            messages=messages,
            usage_floor=tree.usage_floor,
            latest_compaction=tree.latest_compaction,
            model=tree.model,
            estimated_tokens=self.estimator(messages) if self.estimator is not None else 0,
            dead=tree.dead,
            turn_ended_at=tree.turn_ended_at,
            steps=tree.turn_steps,
            spent=tree.spent,
        )

    def context(self) -> list[Message]:
        """The model-facing messages."""
        return self._tree.context()

    def messages(self) -> list[Message]:
        """The user's view of the path."""
        return self._tree.messages()

    def leaf_id(self) -> str | None:
        return self._tree.leaf_id

    def entries(self) -> list[Entry]:
        """Every entry of the session, in log order."""
        return self._tree.entries()

    # -- internals --------------------------------------------------------------------------------------

    def _write(
        self,
        entries: tuple[Entry, ...],
        reply_to: ReplyTo[Stored],
        view: ContextView | None = None,
        *,
        restart_on_failure: bool = True,
    ) -> None:
        """Queue ``entries``; acknowledge (``reply_to``, or the deferred ask) once they are written, with
        ``view`` when the command asked for it. A failed write restarts the store from its log, unless
        ``restart_on_failure`` is False (entries that change nothing the tree's views show: step records)."""
        future: pykka.Future[Stored] | None = None if reply_to is not None else self.defer_reply()
        session_id, publish, me, path = self.session_id, self.publish, self.actor_ref, str(self._log.path)

        def done(error: Exception | None) -> None:
            if error is None:
                for entry in entries:
                    if isinstance(entry, MessageEntry):
                        m = entry.message
                        publish(
                            ev.MessageAppended(
                                session_id=session_id,
                                ts=time.time(),
                                message_id=m.id,
                                role=m.role,
                                kind=m.kind,
                                preview=_preview(m),
                            )
                        )
                _settle(reply_to, future, Stored(session_id, entries, view=view))
                return
            publish(ev.PersistenceFailed(session_id=session_id, ts=time.time(), path=path, error=str(error)))
            _settle(reply_to, future, Stored(session_id, entries, error=str(error)), error)
            if not restart_on_failure:  # (the writer fails the next write to the log too, which restarts it)
                return
            try:
                me.tell(_WriteFailed(error))
            except pykka.ActorDeadError:
                pass

        written = entries
        if self._unwritten is not None:  # the session's first write: its log starts with the header
            written, self._unwritten, restart_on_failure = (self._unwritten, *entries), None, True
        try:
            if len(written) == 1:
                self._log.append(written[0], done)
            else:
                self._log.append_many(list(written), done)
        except (UnicodeEncodeError, msgspec.EncodeError) as exc:  # e.g. a lone surrogate: it cannot be stored
            done(exc)  # like a failed write: the tree is ahead of the log, so the store restarts from it

    def _sync(self, reply_to: ReplyTo[Stored], *, answer: bool = True) -> None:
        """Make the log durable; acknowledge like a write (not when ``answer`` is False: the command that
        asked for it is answered by its own write)."""
        future: pykka.Future[Stored] | None = None
        if reply_to is None and answer:
            future = self.defer_reply()
        session_id, publish, path = self.session_id, self.publish, str(self._log.path)
        turns = self.turns
        mark = turns.mark(session_id) if turns is not None else None  # the turn this sync ends

        def done(error: Exception | None) -> None:
            if error is not None:
                publish(
                    ev.PersistenceFailed(session_id=session_id, ts=time.time(), path=path, error=str(error))
                )
            elif mark is not None and turns is not None:  # its end is in the log: no longer open
                turns.closed(session_id, mark)
            _settle(reply_to, future, Stored(session_id, error=None if error is None else str(error)), error)

        self._log.sync(done)

    def _answer(self, reply_to: ReplyTo[T], value: T) -> T | None:
        if reply_to is None:
            return value
        _deliver(reply_to, value)
        return None

    def _emit(self, event_type: type[ev.Event], **fields: Any) -> None:
        try:
            self.publish(event_type(session_id=self.session_id, ts=time.time(), **fields))
        except Exception:
            log.exception("publishing %s failed", event_type.__name__)


def _check_appendable(tree: SessionTree, batch: tuple[Message, ...], parent_id: str | None) -> None:
    if not batch:
        raise ValueError("Append needs at least one message")
    if parent_id is not None and not tree.has(parent_id):
        raise ValueError(f"parent {parent_id!r} is not in the session")
    seen: set[str] = set()
    for m in batch:
        if tree.has(m.id) or m.id in seen:
            raise ValueError(f"message id {m.id!r} is already in the session")
        seen.add(m.id)


def _settle(
    reply_to: ReplyTo[Stored],
    future: pykka.Future[Stored] | None,
    reply: Stored,
    error: Exception | None = None,
) -> None:
    if reply_to is not None:
        _deliver(reply_to, reply)
    elif future is not None:
        if error is None:
            future.set(reply)
        else:
            future.set_exception((type(error), error, error.__traceback__))


def _deliver(reply_to: Ref[T] | Callable[[T], Any], value: T) -> None:
    try:
        if callable(reply_to):  # (an actor's ref is not callable)
            reply_to(value)
        else:
            reply_to.tell(value)
    except pykka.ActorDeadError:
        log.debug("reply to a stopped actor dropped: %r", value)
    except Exception:
        log.exception("a store reply callback raised")


def _preview(message: Message) -> str | None:
    """The start of a prompt, for a ``message_appended`` event (None for any other message)."""
    if message.role != "user" or message.kind is not None:
        return None
    return " ".join(message.text[: ev.PREVIEW_CHARS * 2].split())[: ev.PREVIEW_CHARS] or None
