"""The log writer: one background thread per runtime that appends to every session's files (design §2.3).

Callers never touch the disk. They hand a line (or several) to :meth:`LogWriter.append` and get on with
their work; the writer thread takes everything queued since its last round, groups it per file, writes
each file's lines with one ``write`` and, depending on the fsync policy, makes them durable:

* ``always`` — every batch is fsynced before it is acknowledged: an acknowledged line survives power loss.
* ``turn`` (default) — lines are written to the OS at once (they survive a crash of the process) and
  fsynced when the session calls :meth:`LogWriter.sync` at the end of a turn.
* ``never`` — written to the OS, never fsynced by us.

Acknowledgement is a callback, ``on_done(error)``, run on the writer thread once the operation is done
(``None``) or failed (the ``OSError``, e.g. ENOSPC). Callbacks must be quick and must not block: tell an
actor, set a future. Nothing is dropped silently: a failed write is undone (the file is truncated back),
and every later write to that file fails too until :meth:`LogWriter.reset`, so a log never gets a gap.

One thread serves any number of sessions; open files are kept in a small LRU so 100,000 sessions do not
need 100,000 descriptors. Operations marked ``lazy`` (the event transcript's lines) do not wake the thread
themselves: they go with the next operation that does, or after ``lazy_delay`` seconds.

One file may go *along* with the logs (:meth:`LogWriter.sync_along`: the runtime's journal of open turns):
what was appended to it under ``turn`` is fsynced in the first round that fsyncs another file, before that
file, when it says it must be (not for the turn the fsync ends), so it is as durable as the logs it guards
at one fsync more a round at most.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from runtime.affinity import place_thread
from runtime.errors import LogWriteError, WriterClosedError

__all__ = [
    "FSYNC_POLICIES",
    "LAZY_DELAY",
    "MAX_OPEN_FILES",
    "Along",
    "FsyncPolicy",
    "LogWriteError",
    "LogWriter",
    "OnDone",
    "StrPath",
    "WriterClosedError",
    "WriterStats",
    "default_max_open_files",
    "fsync_dir",
]


FsyncPolicy = Literal["always", "turn", "never"]
OnDone = Callable[[Exception | None], None]
StrPath = str | os.PathLike[str]

FSYNC_POLICIES: Final = ("always", "turn", "never")
MAX_OPEN_FILES: Final = 4_096  # the most descriptors default_max_open_files() chooses
LAZY_DELAY: Final = 0.1  # seconds a lazy operation (transcript lines) may wait for a wake-up due anyway

log = logging.getLogger("agentcell.store")

_APPEND, _SYNC, _WRITE_FILE, _CALL, _CLOSE, _BARRIER = range(6)
_OPEN_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_FILE_MODE: Final = 0o600  # transcripts and logs hold conversations: owner only
_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class Along(Protocol):
    """A file fsynced along with the others (:meth:`LogWriter.sync_along`): the journal of open turns."""

    def needed(self, ending: str | None) -> bool:
        """Whether what was written to it must be durable before another file is fsynced: ``ending`` is
        that file when its fsync ends a turn (the turn's own line need not be), else None."""
        ...

    def synced(self) -> None:
        """What was written to it is durable now (called on the writer's thread)."""
        ...


@dataclass(slots=True)
class _Op:
    kind: int
    path: str
    data: bytes = b""
    on_done: OnDone | None = None
    policy: FsyncPolicy = "turn"
    fn: Callable[[str], object] | None = None
    event: threading.Event | None = None
    reset: bool = False
    first: bool = False  # its file is written before the other files of its round
    ends_turn: bool = False  # a sync that makes a turn's end durable


@dataclass(slots=True)
class WriterStats:
    """Counters since the writer started (read them for benchmarks)."""

    operations: int = 0
    batches: int = 0
    writes: int = 0
    bytes: int = 0
    fsyncs: int = 0
    errors: int = 0


class LogWriter:
    """Batches and writes log lines for every session of a runtime on one background thread.

    ``fsync`` is the default policy; each call may override it (a session configured differently).
    ``max_open_files`` bounds the descriptors kept open between writes (None: :func:`default_max_open_files`).
    """

    def __init__(
        self,
        fsync: FsyncPolicy = "turn",
        *,
        max_open_files: int | None = None,
        lazy_delay: float = LAZY_DELAY,
        name: str = "agentcell-log-writer",
        cpus: frozenset[int] | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        if max_open_files is None:
            max_open_files = default_max_open_files()
        if max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        if not lazy_delay > 0:
            raise ValueError("lazy_delay must be positive")
        self.fsync: FsyncPolicy = fsync
        self.lazy_delay = lazy_delay
        self.max_open_files = max_open_files
        self.stats = WriterStats()
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Op] = []
        self._urgent = False  # an operation that is not lazy is queued: the thread is (being) woken
        self._lazy_since: float | None = None  # when the oldest lazy operation still queued was queued
        self._closed = False
        self._files: OrderedDict[str, int] = OrderedDict()  # path -> fd, least recently used first
        self._unsynced: set[str] = set()  # written since their last fsync
        self._new_names: set[str] = set()  # created, but their directory entry is not fsynced yet
        self._new_folders: dict[str, list[str]] = {}  # file -> folders made for it, their names not fsynced
        self._failed: dict[str, OSError] = {}  # files with an undone write: refuse until reset()
        self._along: str | None = None  # the file fsynced along with the others (sync_along)
        self._along_file: Along | None = None
        self._along_due = False  # ... and lines appended to it under ``turn`` wait for an fsync
        self._inflight: dict[str, int] = {}  # operations queued per file and not yet done (under _cond)
        self._cpus = cpus  # where the thread runs (runtime.cpu); None: wherever the OS puts it
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- operations (any thread) -----------------------------------------------------------------------

    def append(
        self, path: StrPath, data: bytes, on_done: OnDone | None = None, *, fsync: FsyncPolicy | None = None
    ) -> None:
        """Append ``data`` (whole lines) to ``path``, creating it; ``on_done`` once written (and fsynced
        under ``always``)."""
        self._put(_Op(_APPEND, os.fspath(path), data, on_done, fsync or self.fsync))

    def append_from(
        self,
        path: StrPath,
        take: Callable[[str], bytes],
        on_done: OnDone | None = None,
        *,
        fsync: FsyncPolicy | None = None,
        lazy: bool = False,
        first: bool = False,
    ) -> None:
        """Like :meth:`append`, but the lines are ``take(path)``, asked for on the writer thread when this
        operation's turn comes: a producer can keep adding lines to one queued operation.

        A ``lazy`` operation does not wake the writer: it is done with the next operation that does, or
        ``lazy_delay`` seconds after it was queued (twice that at most), whichever comes first. A ``first``
        one's file is written before the other files of the round that takes it, so its lines are on disk
        before those queued after it elsewhere (the open-turns journal before a turn's start record).
        """
        op = _Op(_APPEND, os.fspath(path), b"", on_done, fsync or self.fsync, fn=take, first=first)
        self._put(op, lazy=lazy)

    def sync(
        self,
        path: StrPath,
        on_done: OnDone | None = None,
        *,
        fsync: FsyncPolicy | None = None,
        ends_turn: bool = False,
    ) -> None:
        """Make everything appended to ``path`` so far durable (a no-op under ``never``): a turn's end
        (``ends_turn``: the turn's line in the file that goes along, :meth:`sync_along`, need not be)."""
        self._put(
            _Op(_SYNC, os.fspath(path), on_done=on_done, policy=fsync or self.fsync, ends_turn=ends_turn)
        )

    def write_file(
        self, path: StrPath, data: bytes, on_done: OnDone | None = None, *, fsync: FsyncPolicy | None = None
    ) -> None:
        """Write a whole file (an artifact), creating its folder; replaces an existing file atomically."""
        self._put(_Op(_WRITE_FILE, os.fspath(path), data, on_done, fsync or self.fsync))

    def call(
        self,
        path: StrPath,
        fn: Callable[[str], object],
        on_done: OnDone | None = None,
        *,
        reset: bool = False,
    ) -> None:
        """Run ``fn(path)`` on the writer thread, in order with the other operations on ``path``.

        With ``reset``, a failed earlier write to ``path`` is forgotten first, as :meth:`reset` does: a
        store opening its log this way reads it after every write queued before, without waiting for them.
        """
        self._put(_Op(_CALL, os.fspath(path), on_done=on_done, fn=fn, reset=reset))

    def close_file(
        self, path: StrPath, on_done: OnDone | None = None, *, fsync: FsyncPolicy | None = None
    ) -> None:
        """After the operations queued for ``path``, make it durable (unless ``never``) and close it."""
        self._put(_Op(_CLOSE, os.fspath(path), on_done=on_done, policy=fsync or self.fsync))

    def sync_along(self, path: StrPath | None, along: Along | None = None) -> None:
        """Make ``path`` (the journal of open turns, ``along``) as durable as the files it guards: lines
        appended to it with the ``turn`` policy are fsynced in the first round that fsyncs another file (a
        turn's end, :meth:`sync`, :meth:`close_file`), before that file, if ``along`` says they must be
        (``along.needed``); once a round at most, and not at all in a round that fsyncs nothing. ``None``:
        no such file."""
        with self._cond:
            self._along = None if path is None else os.fspath(path)
            self._along_file, self._along_due = along, False

    def reset(self, path: StrPath, timeout: float | None = None) -> None:
        """Block until every operation queued for ``path`` is done, and forget a failed write to it.

        A session calls this before reading its log at start, so no write of an earlier incarnation can
        land after it has read the file.
        """
        name = os.fspath(path)
        with self._cond:
            if not self._inflight.get(name):  # nothing queued: no need to wait for the thread
                self._failed.pop(name, None)
                return
        done = threading.Event()
        self._put(_Op(_BARRIER, name, event=done))
        if not done.wait(timeout):
            raise TimeoutError(f"the log writer did not reach {name} within {timeout} s")

    def flush(self, timeout: float | None = None) -> None:
        """Block until every operation queued so far is done."""
        done = threading.Event()
        self._put(_Op(_BARRIER, "", event=done))
        if not done.wait(timeout):
            raise TimeoutError(f"the log writer did not drain within {timeout} s")

    def close(self, timeout: float | None = 30.0) -> None:
        """Drain the queue, make files durable (unless ``never``), close them and stop the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        atexit.unregister(self.close)

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        """Operations queued and not yet taken by the writer thread."""
        with self._cond:
            return len(self._queue)

    def open_files(self) -> int:
        """Descriptors currently held open."""
        return len(self._files)

    def _put(self, op: _Op, *, lazy: bool = False) -> None:
        with self._cond:
            if self._closed:
                raise WriterClosedError("the log writer is closed")
            if op.path:
                self._inflight[op.path] = self._inflight.get(op.path, 0) + 1
            self._queue.append(op)
            if lazy:
                if self._lazy_since is None:
                    self._lazy_since = time.monotonic()
            elif not self._urgent:
                self._urgent = True
                self._cond.notify()

    # -- the writer thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        place_thread(self._cpus)
        # Every wake-up of this thread takes the GIL from whichever thread holds it, and so does each
        # system call it makes: lazy operations (transcript lines) wait for a wake-up that is due anyway.
        # When only lazy work is queued the thread looks again every ``lazy_delay`` seconds.
        while True:
            with self._cond:
                while not self._urgent and not self._closed:
                    since = self._lazy_since
                    if since is not None and time.monotonic() - since >= self.lazy_delay:
                        break
                    self._cond.wait(self.lazy_delay)
                batch, self._queue = self._queue, []
                self._urgent, self._lazy_since = False, None
                closing = self._closed
            if batch:
                self._process(batch)
            if closing and not batch:
                break
        self._shutdown()

    def _process(self, batch: list[_Op]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.operations += len(batch)
        per_file: dict[str, list[_Op]] = {}
        barriers: list[_Op] = []
        first: str | None = None
        for op in batch:
            if op.kind == _BARRIER and not op.path:
                barriers.append(op)
            else:
                per_file.setdefault(op.path, []).append(op)
                if op.first:
                    first = op.path
        if first is not None:  # (its file before the others: see append_from)
            per_file = {first: per_file.pop(first), **per_file}
        for path, ops in per_file.items():
            try:
                self._process_file(path, ops)
            except Exception as exc:  # a bug, not an I/O error: fail the operations, keep the thread alive
                log.exception("log writer failed on %s", path)
                for op in ops:
                    _finish(op, exc)
            with self._cond:
                left = self._inflight.pop(path) - len(ops)
                if left:
                    self._inflight[path] = left
        for op in barriers:
            _finish(op, None)

    def _process_file(self, path: str, ops: list[_Op]) -> None:
        run: list[_Op] = []  # consecutive appends, written together
        for op in ops:
            if op.kind == _APPEND:
                if op.fn is not None:  # append_from: the lines are taken now
                    lines = op.fn(path)
                    assert isinstance(lines, bytes), f"append_from gave {type(lines).__name__}, not bytes"
                    op.data = lines
                    if not lines:  # taken by an earlier operation (or dropped): nothing to write
                        self._taken_before(path, op, run)
                        continue
                run.append(op)
                continue
            if run:
                self._write_run(path, run)
                run = []
            error: Exception | None = None
            try:
                if op.kind == _SYNC:
                    self._sync(path, op.policy, ends_turn=op.ends_turn)
                elif op.kind == _WRITE_FILE:
                    self._write_whole(path, op.data, op.policy)
                elif op.kind == _CALL:
                    assert op.fn is not None
                    self._release(path)
                    if op.reset:
                        self._failed.pop(path, None)
                    op.fn(path)
                elif op.kind == _CLOSE:
                    self._sync(path, op.policy)
                    self._release(path)
                elif op.kind == _BARRIER:
                    self._release(path)
                    self._failed.pop(path, None)
            except OSError as exc:
                self.stats.errors += 1
                error = exc
            _finish(op, error)
        if run:
            self._write_run(path, run)

    def _taken_before(self, path: str, op: _Op, run: list[_Op]) -> None:
        """``op``'s lines were taken by an earlier operation, which may fsync less: ``op``'s policy holds for
        them all the same (the open-turns journal queues an ``always`` append behind a ``never`` one)."""
        if run:  # taken in this round: written with the run, fsynced as its strongest operation says
            run.append(op)
            return
        error: Exception | None = None
        if path in self._unsynced:  # written in an earlier round, not fsynced since
            if op.policy == "always":
                try:
                    self._fsync_file(path)
                    self._unsynced.discard(path)
                    if path == self._along:
                        self._along_synced()
                except OSError as exc:
                    self.stats.errors += 1
                    error = exc
            elif op.policy == "turn" and path == self._along:
                self._along_due = True
        _finish(op, error)

    def _write_run(self, path: str, run: list[_Op]) -> None:
        failed = self._failed.get(path)
        if failed is not None:
            error: OSError = LogWriteError(
                failed.errno or errno.EIO, f"an earlier write to {path} failed ({failed.strerror or failed})"
            )
            for op in run:
                _finish(op, error)
            return
        data = run[0].data if len(run) == 1 else b"".join(op.data for op in run)
        try:
            fd, start = self._fd(path, run[0].policy)
            try:
                _write_all(fd, data)
                if any(op.policy == "always" for op in run):
                    _fdatasync(fd)
                    self.stats.fsyncs += 1
                    if path == self._along:
                        self._along_synced()
                else:
                    self._unsynced.add(path)
                    if path == self._along and any(op.policy == "turn" for op in run):
                        self._along_due = True
            except OSError:
                self._undo(path, fd, start)
                raise
        except OSError as exc:
            self.stats.errors += 1
            for op in run:
                _finish(op, exc)
            return
        self.stats.writes += 1
        self.stats.bytes += len(data)
        for op in run:
            _finish(op, None)

    def _undo(self, path: str, fd: int, size: int) -> None:
        """Cut a failed write back to ``size``; if that fails too, refuse the file until reset()."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            self._failed[path] = exc
        self._release(path)

    def _sync(self, path: str, policy: FsyncPolicy, *, ends_turn: bool = False) -> None:
        if policy == "never" or path not in self._unsynced:
            return
        if self._along_due and path != self._along:  # (what guards the turns under way, first)
            along = self._along_file
            if along is None or along.needed(path if ends_turn else None):
                self._sync_along()
        self._fsync_file(path)
        self._unsynced.discard(path)
        if path in self._new_names:
            self._new_names.discard(path)
            for folder in self._new_folders.pop(path, ()):  # a shard folder made for it: its name first
                if folder in self._new_names:
                    self._new_names.discard(folder)
                    fsync_dir(os.path.dirname(folder) or ".")
            fsync_dir(os.path.dirname(path) or ".")

    def _fsync_file(self, path: str) -> None:
        fd = self._files.get(path)
        if fd is None:  # evicted since the write: fsync through a fresh descriptor (same inode)
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                _fdatasync(fd)
            finally:
                os.close(fd)
        else:
            _fdatasync(fd)
        self.stats.fsyncs += 1

    def _sync_along(self) -> None:
        """fsync the file that goes along with the others (:meth:`sync_along`); a failure is logged, not the
        other file's: it is tried again in the next round that fsyncs."""
        along = self._along
        assert along is not None
        try:
            self._fsync_file(along)
        except FileNotFoundError:  # (deleted: nothing of it to keep)
            pass
        except OSError:
            self.stats.errors += 1
            log.exception("fsync of %s failed", along)
            return
        self._unsynced.discard(along)
        self._along_synced()

    def _along_synced(self) -> None:
        self._along_due = False
        if self._along_file is not None:
            try:
                self._along_file.synced()
            except Exception:
                log.exception("a log writer callback raised")

    def _write_whole(self, path: str, data: bytes, policy: FsyncPolicy) -> None:
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
        try:
            _write_all(fd, data)
            if policy != "never":
                _fdatasync(fd)
                self.stats.fsyncs += 1
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if policy != "never":
            fsync_dir(folder)
        self.stats.writes += 1
        self.stats.bytes += len(data)

    def _fd(self, path: str, policy: FsyncPolicy) -> tuple[int, int]:
        """The descriptor to append to ``path`` through, and the file's size (where this write starts).

        One ``fstat`` per batch and file tells both the size and whether the open file still has a name:
        a file deleted or replaced underneath (a session deleted and started again) has no link left,
        and is reopened by path. (Every system call here gives up the GIL, and getting it back from a
        busy thread can take a switch interval, so the writer makes as few as it can.)
        """
        fd = self._files.get(path)
        if fd is not None:
            try:
                st = os.fstat(fd)
            except OSError:
                st = None
            if st is not None and st.st_nlink > 0:
                self._files.move_to_end(path)
                return fd, st.st_size
            self._release(path)
        while len(self._files) >= self.max_open_files:
            oldest = next(iter(self._files))
            self._release(oldest)
        try:
            fd, folders = _create(path)
            created, size = True, 0
        except FileExistsError:
            fd = os.open(path, _OPEN_FLAGS, _FILE_MODE)
            created, size = False, os.fstat(fd).st_size
        self._files[path] = fd
        if created and policy == "always":
            for folder in (*folders, path):  # the new names must survive a crash too
                fsync_dir(os.path.dirname(folder) or ".")
        elif created and policy == "turn":
            self._new_names.add(path)  # made durable with the file's first sync
            for folder in folders:
                self._new_names.add(folder)
                self._new_folders.setdefault(path, []).append(folder)
        return fd, size

    def _release(self, path: str) -> None:
        fd = self._files.pop(path, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                log.warning("closing %s failed", path, exc_info=True)

    def _shutdown(self) -> None:
        with self._cond:  # operations that raced with close(): fail them rather than drop them
            leftover, self._queue = self._queue, []
        for op in leftover:
            _finish(op, WriterClosedError("the log writer closed before this operation ran"))
        for path in list(self._files):
            if path in self._unsynced and self.fsync != "never":
                try:
                    self._sync(path, self.fsync)
                except OSError:
                    log.warning("fsync of %s at close failed", path, exc_info=True)
            self._release(path)


def default_max_open_files() -> int:
    """A quarter of the process's descriptor limit (``ulimit -n``), from 64 to 4,096.

    Every active session appends to two files (its log and its transcript). When they do not all fit, each
    write reopens and closes its file: three system calls more, and far slower turns with 1,000 sessions.
    The other three quarters are left for sockets and whatever else the process opens.
    """
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no such limit here (Windows): the classic default
        return 256
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_FILES
    return max(64, min(MAX_OPEN_FILES, soft // 4))


def _create(path: str) -> tuple[int, list[str]]:
    """Create ``path`` exclusively, and the folders missing on its way (a session's shard folders): the
    descriptor and the folders made, outermost first, whose names the caller makes durable."""
    try:
        return os.open(path, _OPEN_FLAGS | os.O_EXCL, _FILE_MODE), []
    except FileNotFoundError:
        pass
    folder = os.path.dirname(path) or "."
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    made = []
    for name in reversed(missing):
        try:
            os.mkdir(name)
            made.append(name)
        except FileExistsError:
            pass
    return os.open(path, _OPEN_FLAGS | os.O_EXCL, _FILE_MODE), made


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - a regular file never does this
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[written:]


def fsync_dir(folder: str) -> None:
    """Make the names in ``folder`` durable (a no-op where the filesystem refuses it)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories
    finally:
        os.close(fd)


def _finish(op: _Op, error: Exception | None) -> None:
    if op.event is not None:
        op.event.set()
    if op.on_done is None:
        return
    try:
        op.on_done(error)
    except Exception:
        log.exception("a log writer callback raised")
