"""A session's append-only JSONL log: reading it back, recovering from a crash, appending to it.

A crash (even ``kill -9`` or a power cut) can only damage the end of a log: the line being written when
it happened. Reading treats a last line that has no newline, or does not decode, as *torn*: it is left
out, cut off the file (so the next append starts on a clean line) and reported in :class:`RecoveryInfo`.
Any other line that does not decode is real corruption, and reading stops with a
:class:`CorruptLogError` naming the file and the line: nothing is ever dropped silently.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec

from runtime.errors import CorruptLogError
from runtime.store.entries import (
    FORMAT_VERSION,
    Entry,
    Header,
    decode_entries,
    decode_entry,
    encode_entry,
)
from runtime.store.tree import SessionTree
from runtime.store.writer import FsyncPolicy, LogWriter, OnDone, StrPath

__all__ = [
    "CorruptLogError",
    "RecoveryInfo",
    "SessionLog",
    "cut_log",
    "load_tree",
    "read_file",
    "read_header",
    "read_header_line",
    "read_log",
    "replay",
    "signature",
    "truncate",
    "truncate_torn_tail",
]


class RecoveryInfo(msgspec.Struct, frozen=True):
    """What reading a log found: its entries and whether a torn last line was cut off."""

    path: str
    entries: int
    valid_bytes: int
    torn_bytes: int = 0
    torn_line: int | None = None  # the torn line's number (1-based), if there was one

    @property
    def torn(self) -> bool:
        return self.torn_bytes > 0


def read_log(path: StrPath, *, repair: bool = True) -> tuple[list[Entry], RecoveryInfo]:
    """Read every entry of the log at ``path``.

    A torn last line is skipped and, with ``repair``, truncated away. Raises ``FileNotFoundError`` if
    there is no log and :class:`CorruptLogError` for a bad line elsewhere or an unknown format version.
    """
    name = os.fspath(path)
    data = read_file(name)
    entries, valid, torn_line = _decode(name, data)
    info = RecoveryInfo(
        path=name,
        entries=len(entries),
        valid_bytes=valid,
        torn_bytes=len(data) - valid,
        torn_line=torn_line,
    )
    if info.torn and repair:
        truncate(name, valid)
    return entries, info


def load_tree(path: StrPath, *, repair: bool = True) -> tuple[SessionTree, RecoveryInfo]:
    """Read a log and replay it into a :class:`SessionTree`.

    An entry that does not fit the tree (say, a parent that is not in it) is a :class:`CorruptLogError`
    at its line, like a line that does not decode.
    """
    entries, info = read_log(path, repair=repair)
    return replay(path, entries), info


def replay(path: StrPath, entries: list[Entry]) -> SessionTree:
    """Apply ``entries`` (read from ``path``, one per line) to a new tree."""
    if not entries:
        raise CorruptLogError(path, 1, "the log is empty: it has no header")
    if not isinstance(entries[0], Header):
        raise CorruptLogError(path, 1, f"the first entry must be a header, not {type(entries[0]).__name__}")
    tree = SessionTree()
    for number, entry in enumerate(entries, start=1):
        try:
            tree.apply(entry)
        except ValueError as exc:
            raise CorruptLogError(path, number, str(exc)) from None
    return tree


def read_header(path: StrPath) -> Header | None:
    """The header of the log at ``path`` (its first line), or ``None`` if there is none yet."""
    found = read_header_line(path)
    return found[0] if found is not None else None


def read_header_line(path: StrPath) -> tuple[Header, bytes] | None:
    """The header of the log at ``path`` and its line, or ``None`` if there is no complete first line."""
    with open(path, "rb") as f:
        _require_regular(path, f.fileno())
        first = f.readline()
    if not first.endswith(b"\n"):
        return None  # empty, or a torn first line
    try:
        entry = decode_entry(first)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptLogError(path, 1, f"not a valid entry ({exc})") from None
    if not isinstance(entry, Header):
        raise CorruptLogError(path, 1, f"the first entry must be a header, not {type(entry).__name__}")
    return entry, first


def signature(path: StrPath) -> tuple[int, int, int]:
    """What changes whenever a log is written: its inode, size and modification time (nanoseconds)."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_file(path: StrPath) -> bytes:
    """The bytes of a log or transcript; refuses anything but a regular file (a device never ends)."""
    with open(path, "rb") as f:
        _require_regular(path, f.fileno())
        return f.read()


def _require_regular(path: StrPath, fd: int) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))


def truncate(path: StrPath, size: int) -> None:
    """Cut ``path`` to ``size`` bytes and make that durable."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def cut_log(path: StrPath, line: int, keep: StrPath) -> int:
    """Cut the log at ``path`` just before its ``line``-th line (1-based), after copying everything from
    there on to ``keep`` (a new file, 0600): nothing is lost. Returns the bytes cut."""
    if line < 2:
        raise ValueError("the first line of a log is its header: cutting there would leave nothing")
    data = read_file(path)
    offset = 0
    for _ in range(line - 1):
        offset = data.index(b"\n", offset) + 1  # ValueError when the log has fewer lines
    fd = os.open(keep, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(memoryview(data)[offset:])
        out.flush()
        os.fsync(out.fileno())
    truncate(path, offset)
    return len(data) - offset


def truncate_torn_tail(path: StrPath) -> int:
    """Cut anything after the last newline of ``path`` (a torn write); returns the bytes removed.

    Reads only the end of the file, so it is cheap for large files. A missing file is left alone.
    """
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return 0
    try:
        _require_regular(path, fd)
        size = os.lseek(fd, 0, os.SEEK_END)
        end = size
        chunk = 64 * 1024
        while end > 0:
            start = max(0, end - chunk)
            block = os.pread(fd, end - start, start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        else:
            keep = 0
        if keep < size:
            os.ftruncate(fd, keep)
            os.fsync(fd)
        return size - keep
    finally:
        os.close(fd)


def _decode(path: str, data: bytes) -> tuple[list[Entry], int, int | None]:
    """Entries of ``data``, the length of its valid part, and the torn line's number if any."""
    body_end = data.rfind(b"\n") + 1  # everything after the last newline is a torn line
    body = data[:body_end]
    try:
        entries = decode_entries(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        entries = None
    if entries is None:
        entries, body_end = _decode_by_line(path, data, body_end)
    else:
        _check_versions(path, entries)
    if body_end == len(data):
        return entries, body_end, None
    return entries, body_end, len(entries) + 1


def _decode_by_line(path: str, data: bytes, body_end: int) -> tuple[list[Entry], int]:
    """The slow path: find the line that does not decode. Only the last complete line may be torn."""
    entries: list[Entry] = []
    lines = list(_lines(data[:body_end]))
    for number, (start, line) in enumerate(lines, start=1):
        try:
            entry = decode_entry(line)
        except msgspec.DecodeError as exc:  # ValidationError too: valid JSON, not an entry
            malformed = not isinstance(exc, msgspec.ValidationError)
            if malformed and number == len(lines) and body_end == len(data):
                return entries, start  # a last line that is not even JSON: torn (zeros after a power cut)
            raise CorruptLogError(path, number, _reason(line, exc)) from None
        _check_versions(path, [entry], first_line=number)
        entries.append(entry)
    return entries, body_end


def _lines(body: bytes) -> Iterator[tuple[int, bytes]]:
    start = 0
    while start < len(body):
        end = body.index(b"\n", start)
        yield start, body[start:end]
        start = end + 1


def _check_versions(path: str, entries: list[Entry], first_line: int = 1) -> None:
    for number, entry in enumerate(entries, start=first_line):
        if entry.v != FORMAT_VERSION:
            raise CorruptLogError(
                path,
                number,
                f"format version {entry.v} is not supported (this agentcell reads version {FORMAT_VERSION})",
            )


def _reason(line: bytes, exc: Exception) -> str:
    if not line.strip():
        return "empty line"
    return f"not a valid entry ({exc})"


class SessionLog:
    """One session's log file, written through the shared :class:`LogWriter`.

    ``fsync`` overrides the writer's policy for this session. Appends are queued in order; ``on_done``
    runs on the writer thread when the line is written (and fsynced under ``always``).
    """

    def __init__(self, path: StrPath, writer: LogWriter, *, fsync: FsyncPolicy | None = None) -> None:
        self.path = Path(path)
        self.writer = writer
        self.fsync: FsyncPolicy = fsync or writer.fsync
        self.name = os.fspath(path)
        """The path as the writer knows it (a str: cheaper to hand over per append than a Path)."""

    def read(self, *, repair: bool = True) -> tuple[list[Entry], RecoveryInfo]:
        """Read the log (see :func:`read_log`); call :meth:`reset` first if this process wrote to it."""
        return read_log(self.path, repair=repair)

    def reset(self, timeout: float | None = None) -> None:
        """Wait for writes queued to this log and clear a failed write (see :meth:`LogWriter.reset`)."""
        self.writer.reset(self.name, timeout)

    def append(self, entry: Entry, on_done: OnDone | None = None) -> None:
        """Queue one entry."""
        self.writer.append(self.name, encode_entry(entry), on_done, fsync=self.fsync)

    def append_many(self, entries: list[Entry], on_done: OnDone | None = None) -> None:
        """Queue several entries as one write: ``on_done`` once, when all of them are written."""
        data = b"".join(encode_entry(e) for e in entries)
        self.writer.append(self.name, data, on_done, fsync=self.fsync)

    def sync(self, on_done: OnDone | None = None) -> None:
        """The end of a turn: make what was appended durable (unless the policy is ``never``)."""
        self.writer.sync(self.name, on_done, fsync=self.fsync, ends_turn=True)

    def close(self, on_done: OnDone | None = None) -> None:
        """After the queued writes, make the log durable (unless ``never``) and release its descriptor."""
        self.writer.close_file(self.name, on_done, fsync=self.fsync)
