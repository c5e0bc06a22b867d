"""The open-turns journal: which sessions a runtime has a turn under way in, so that a runtime started after
one that died (kill -9, a crash) finds the turns it cut off without opening a million logs (design §3.12).

Layout, under ``<sessions>/turns/``::

    <pid>-<token>.jsonl     one journal per running runtime: ``+<id>`` when a turn of session <id>
                            starts (or is taken up), ``-<id>`` once its end is in the session's log

A runtime creates its journal on its first turn and holds an exclusive ``flock`` on it as long as it runs:
a journal whose ``flock`` can be taken belongs to a runtime that is gone. :meth:`TurnJournal.interrupted`
reads such journals (only those: a few lines each, whatever the number of sessions), moves the sessions
they leave open into this runtime's own journal, deletes them, and lists the open sessions no running
runtime hosts: resuming one takes its turn up (the agent decides from the log, design §3.12).

Order keeps it exact: a turn's ``+`` line is written before its start record (the writer writes the
journal first in a round, :meth:`~runtime.store.writer.LogWriter.append_from` ``first``) and is as durable
as that record under the session's ``persistence.fsync``: under ``always`` fsynced before it; under
``turn`` fsynced in the first writer round that fsyncs a log (a turn's end anywhere in the runtime), before
that log (:meth:`~runtime.store.writer.LogWriter.sync_along`), so one fsync a round more at most, and none
when the only lines waiting are those of the turns that fsync ends (their ends are durable with it: one
session's turns back to back cost one fsync each, as without a journal); under ``never`` not at all. Its ``-`` line is written once the turn's end is in the log (lazily: with the
writer's next round) and never waits for an fsync of its own: a journal that says a turn is open when its
log says it ended costs a resume that finds nothing to take up (the store then closes it,
:meth:`TurnJournal.settled`); the other way round cannot happen once the log's start record was fsynced.

The journal grows two lines a turn; when its lines outnumber four times the open turns (and at least
:data:`COMPACT_LINES`), it is rewritten with the open ones only (a new file, flocked, renamed over). A
runtime that stops with no turn open deletes its journal.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import threading
from collections.abc import Callable, Container
from pathlib import Path
from typing import Final

from runtime.ids import InvalidSessionId, validate_session_id
from runtime.store.writer import FsyncPolicy, LogWriter, WriterClosedError, fsync_dir

__all__ = ["COMPACT_LINES", "TURNS_DIR", "TurnJournal", "read_journal"]

log = logging.getLogger("agentcell.store")

TURNS_DIR: Final = "turns"
_SUFFIX: Final = ".jsonl"
COMPACT_LINES: Final = 4096  # lines a journal gathers before it is rewritten with the open turns only
_POLICIES: Final[tuple[FsyncPolicy, ...]] = ("never", "turn", "always")  # weakest first


def read_journal(data: bytes) -> list[str]:
    """The sessions a journal's lines leave open, in the order they were opened (a torn last line, or a
    line that names no valid session, is skipped)."""
    state: dict[str, bool] = {}
    for line in data.split(b"\n")[:-1]:  # (the last piece has no newline: empty, or torn)
        if len(line) < 2 or line[:1] not in (b"+", b"-"):
            continue
        try:
            sid = validate_session_id(line[1:].decode("utf-8"))
        except (UnicodeDecodeError, InvalidSessionId):
            continue
        state.pop(sid, None)
        if line[:1] == b"+":
            state[sid] = True
    return list(state)


class TurnJournal:
    """This runtime's open-turns journal under ``root`` (see the module docstring). Thread-safe.

    ``fsync``: the runtime's policy (``always`` fsyncs a ``+`` line before the turn's start record, ``turn``
    with the next log the writer fsyncs); a session's own policy, given to :meth:`opened`, wins."""

    def __init__(self, root: Path, writer: LogWriter, *, fsync: FsyncPolicy) -> None:
        self.folder = root / TURNS_DIR
        self._writer = writer
        self._fsync: FsyncPolicy = fsync
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}  # session id -> the mark of its newest turn's start
        self._mark = 0
        self._pending: list[bytes] = []  # lines not taken by the writer yet
        self._pending_logs: list[str] = []  # the logs whose turns the pending ``+`` lines open
        self._logs: dict[str, str] = {}  # session id -> the log of its open turn (its id if not told)
        self._exposed: set[str] = set()  # logs whose open turn's ``+`` line is written but not fsynced
        self._queued_first = -1  # the strongest policy of the `first` appends queued that took no lines yet
        self._queued_lazy = False  # a lazy append is queued (``-`` lines)
        self._lines = 0  # lines in the file (since its last rewrite)
        self._compacting = False
        self._broken = False  # a write failed: the next change rewrites the whole file
        self.path = os.fspath(self.folder / f"{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}")
        """This runtime's journal (made by its first turn, see :meth:`claim`)."""
        self._claimed = False
        self._claiming = False  # a claim is queued to the writer
        self._flock = -1
        writer.sync_along(
            self.path, self
        )  # (its ``turn`` lines: fsynced with the next log the writer fsyncs)

    # -- a session's turns (any thread) ------------------------------------------------------------------

    def opened(self, session_id: str, fsync: FsyncPolicy | None = None, log: str | None = None) -> int:
        """A turn of ``session_id`` starts (or is taken up): queue its line before its start record (call
        this before queuing that record), as durable as that record under ``fsync`` (the session's policy;
        ``log``: the path the writer knows its log by). Returns the turn's mark, for :meth:`closed`."""
        need = _POLICIES.index(fsync or self._fsync)
        with self._lock:
            self._mark += 1
            mark = self._open[session_id] = self._mark
            self._pending.append(b"+" + session_id.encode() + b"\n")
            self._logs[session_id] = key = log if log is not None else session_id
            self._pending_logs.append(key)
            queue = need > self._queued_first  # (an append that fsyncs as this line needs is not queued yet)
            if queue:
                self._queued_first = need
        if queue:
            self._queue(first=True, fsync=_POLICIES[need])
        return mark

    def mark(self, session_id: str) -> int | None:
        """The mark of ``session_id``'s open turn, or None (read it when queuing the turn's end)."""
        return self._open.get(session_id)

    def closed(self, session_id: str, mark: int | None) -> None:
        """The turn of ``session_id`` marked ``mark`` has its end in the log: it is no longer open (unless a
        newer turn of the session started meanwhile; ``mark`` None: whichever turn is open)."""
        with self._lock:
            current = self._open.get(session_id)
            if current is None or (mark is not None and current != mark):
                return
            del self._open[session_id]
            self._exposed.discard(self._logs.pop(session_id, session_id))  # (its end is durable)
            self._pending.append(b"-" + session_id.encode() + b"\n")
            queue = not (self._queued_first >= 0 or self._queued_lazy)
            self._queued_lazy = self._queued_lazy or queue
        if queue:
            self._queue(lazy=True)

    def settled(self, session_id: str) -> None:
        """``session_id``'s log shows no turn under way (its store read it): forget a turn listed open."""
        if session_id in self._open:
            self.closed(session_id, None)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._open

    # -- the turns other runtimes cut off ----------------------------------------------------------------

    def interrupted(
        self,
        hosted: Container[str],
        held_elsewhere: Callable[[str], bool],
        stored: Callable[[str], bool] = lambda _sid: True,
    ) -> list[str]:
        """The sessions whose turn a runtime that is gone left open, and that neither this runtime hosts
        (``hosted``) nor another running one (``held_elsewhere``: its session lock is live), sorted.

        The journals of runtimes that are gone are moved into this one's (written before they are
        deleted), so each is read once and a session stays listed until it is resumed here, or its turn
        ends, or another runtime holds it, or it is no longer ``stored`` (deleted)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        own = self.claim()
        for name in sorted(os.listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if name.startswith(".") or not name.endswith(_SUFFIX) or path == own:
                continue
            self._adopt(path)
        with self._lock:
            listed = [sid for sid in self._open if sid not in hosted]
        found = []
        for sid in listed:
            if held_elsewhere(sid) or not stored(sid):
                self.closed(sid, None)
            else:
                found.append(sid)
        return sorted(found)

    def _adopt(self, path: str) -> None:
        """Move the open turns of the journal at ``path`` into this one and delete it, if its runtime is
        gone (its flock is free)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # its runtime runs
            try:
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    return  # adopted (deleted) or rewritten meanwhile
            except FileNotFoundError:
                return
            data = b""
            while chunk := os.read(fd, 1 << 20):
                data += chunk
            left_open = read_journal(data)
            if left_open:
                with self._lock:
                    for sid in left_open:
                        if sid not in self._open:
                            self._mark += 1
                            self._open[sid] = self._mark
                            self._pending.append(b"+" + sid.encode() + b"\n")
                if not self._write_now():
                    return  # not in this journal for sure: leave that one where it is
            os.unlink(path)
            fsync_dir(os.fspath(self.folder))
            log.info(
                "open-turns journal %s of a runtime that is gone: %d turns left open", path, len(left_open)
            )
        finally:
            os.close(fd)

    def _write_now(self) -> bool:
        """Write the pending lines now (fsynced unless ``never``) and wait; False if that failed."""
        done = threading.Event()
        failed: list[Exception | None] = [None]

        def told(error: Exception | None) -> None:
            failed[0] = error
            done.set()

        policy: FsyncPolicy = "never" if self._fsync == "never" else "always"
        self._writer.append_from(self.claim(), self._take, told, fsync=policy)
        done.wait()
        if failed[0] is not None:
            log.error("open-turns journal %s: %s", self.path, failed[0])
            self._failed(failed[0])
            return False
        return True

    # -- the file (the writer's thread) -------------------------------------------------------------------

    def claim(self) -> str:
        """This runtime's journal (:attr:`path`), created and flocked on first use: by the writer's thread
        before the first line a turn queues, or by :meth:`interrupted`'s caller (never a dispatcher)."""
        if self._claimed:
            return self.path
        with self._lock:
            if not self._claimed:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._flock = _locked(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
                if self._fsync != "never":
                    fsync_dir(os.fspath(self.folder))
                self._claimed = True
        return self.path

    def _queue(self, *, first: bool = False, lazy: bool = False, fsync: FsyncPolicy = "never") -> None:
        path, writer = self.path, self._writer
        try:
            if not self._claimed and not self._claiming:
                self._claiming = True
                writer.call(path, self._claim_here, self._written)
            if self._broken:
                writer.call(path, self._rewrite, self._rewritten, reset=True)
            else:
                writer.append_from(path, self._take, self._written, fsync=fsync, lazy=lazy, first=first)
        except WriterClosedError:  # the runtime stops: close() writes what is left
            pass

    def _claim_here(self, _path: str) -> None:
        self._claiming = False
        self.claim()

    def _take(self, _path: str) -> bytes:
        """The pending lines, for the first append of the round to take them (one that fsyncs as a line
        needs and finds them taken makes them durable all the same: the writer counts its policy)."""
        if not self._claimed:  # (it could not be made: a rewrite makes it, flocked, with every open turn)
            self._broken = True
            return b""
        with self._lock:
            lines, self._pending = self._pending, []
            self._exposed.update(self._pending_logs)
            self._pending_logs = []
            self._queued_first, self._queued_lazy = -1, False
            self._lines += len(lines)
            compact = not self._compacting and self._lines > max(COMPACT_LINES, 4 * len(self._open))
            self._compacting = self._compacting or compact
        if compact:
            self._writer.call(_path, self._rewrite, self._rewritten)
        return b"".join(lines)

    def needed(self, ending: str | None) -> bool:
        """The writer is about to fsync a log (``ending``: one whose fsync ends its turn): whether this
        journal must be fsynced first, i.e. a turn it lists open has its line written, not fsynced, and
        does not end with that fsync (:class:`~runtime.store.writer.Along`)."""
        with self._lock:
            exposed = self._exposed
            return len(exposed) > (1 if ending in exposed else 0)

    def synced(self) -> None:
        """The writer fsynced this journal: every line written so far is durable."""
        with self._lock:
            self._exposed.clear()

    def _written(self, error: Exception | None) -> None:
        if error is not None:
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        if not self._broken:
            log.error("open-turns journal %s cannot be written: %s", self.path, error)
        self._broken = True

    def _rewrite(self, path: str) -> None:
        """Rewrite the journal with the open turns only: a new file, flocked, then renamed over."""
        with self._lock:
            self._pending.clear()  # (what they said is in the open turns below)
            self._pending_logs.clear()
            self._queued_first, self._queued_lazy = -1, False  # (an append queued meanwhile takes nothing)
            data = b"".join(b"+" + sid.encode() + b"\n" for sid in self._open)
            self._lines = len(self._open)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp")
        fd = _locked(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, data)
            if self._fsync != "never":
                os.fsync(fd)
            os.replace(tmp, path)
            if self._fsync != "never":
                fsync_dir(folder)
        except BaseException:
            os.close(fd)
            raise
        old, self._flock, self._claimed = self._flock, fd, True
        if old >= 0:
            os.close(old)

    def _rewritten(self, error: Exception | None) -> None:
        self._compacting = False
        if error is None:
            self._broken = False
        else:
            self._failed(error)

    def close(self) -> None:
        """The runtime stopped (its writer is closed): delete the journal when no turn is open, else write
        the open ones (a runtime started later takes them up); let go of the flock."""
        try:
            if self._open:
                self._rewrite(self.path)
            elif self._claimed:
                os.unlink(self.path)
        except OSError as exc:
            log.error("open-turns journal %s: %s", self.path, exc)
        finally:
            if self._flock >= 0:
                os.close(self._flock)
            self._flock, self._claimed = -1, False


def _locked(path: str, flags: int) -> int:
    """Open ``path`` with ``flags`` and take its exclusive flock (it is this process's alone)."""
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd
