"""The event transcript (design §2.3, reference 003): every broadcast event of a session, one JSON line each.

:class:`TranscriptWriter` is an event-bus sink for the whole runtime: it appends each event to
``<root>/<session>.events.jsonl`` through the shared :class:`~runtime.store.writer.LogWriter`, so the
publisher never waits on the disk. :func:`read_transcript` reads one back, e.g. to resume a
Server-Sent-Events stream after a given ``seq``.

A transcript file is created with the first event worth keeping: a million sessions started and never
used write none (their ``session_started`` and ``session_stopped`` are left out). When a session started in
this process first has something to keep, its ``session_started`` (seq 1), rebuilt by ``left_out``, is
written first, so its transcript holds every event from the start. A resumed session then numbers its
events from the clock, as after a crash, so no number is ever given twice.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable

import msgspec

from runtime.events import EVENTS, AnyEvent, Event, encode_event
from runtime.ids import InvalidSessionId
from runtime.store.log import CorruptLogError, read_file, truncate_torn_tail
from runtime.store.sessions import SessionDirectory
from runtime.store.writer import FsyncPolicy, LogWriter, StrPath, WriterClosedError

__all__ = [
    "LeftOut",
    "OnTranscriptError",
    "TranscriptEnd",
    "TranscriptWriter",
    "read_transcript",
    "transcript_end",
]


log = logging.getLogger("agentcell.store")

LeftOut = Callable[[str], Iterable[Event]]
"""Given a session id, the events published before its transcript was opened and left out of it (its
``session_started``), as the bus stamped them; written first when its transcript is opened."""

OnTranscriptError = Callable[[str, str, Exception], None]
"""Called (on the writer thread) with the session id, the transcript's path and the error when a write
to it fails — once per run of failures: again only after a write to that transcript succeeded."""

_decoder = msgspec.json.Decoder(AnyEvent)
_IDLE_TYPES = frozenset(cls.wire_name() for cls in EVENTS if not cls.opens_transcript)
"""Events not worth a transcript of their own (``Event.opens_transcript``): a session that only starts and
stops gets none (its resumption, ``session_started`` with ``resumed``, is kept: it goes on numbering a
transcript's events)."""


class TranscriptWriter:
    """Appends every event it is given to its session's transcript. Use it as a bus sink: ``sink(event)``.

    ``exclude`` names event types to leave out (e.g. ``{"text_delta"}`` for a leaner record; by default
    every event is kept). ``left_out`` rebuilds what a session's transcript lacks when it is opened by an
    event other than a ``session_started`` (see :data:`LeftOut`). The first event of a session in this process first cuts a torn line a crash
    may have left at the end of its transcript, so appends always start on a clean line.
    """

    def __init__(
        self,
        directory: SessionDirectory,
        writer: LogWriter,
        *,
        exclude: Iterable[str] = (),
        on_error: OnTranscriptError | None = None,
        fsync: FsyncPolicy | None = None,
        left_out: LeftOut | None = None,
    ) -> None:
        self.directory = directory
        self.left_out = left_out
        self.writer = writer
        self.exclude = frozenset(exclude)
        self.on_error = on_error
        self.fsync = fsync
        # session id -> its transcript's path: plain strings, so a million sessions that wrote a transcript
        # add nothing the cycle collector walks (the callback of a write is made per write)
        self._sessions: dict[str, str] = {}
        self._failing: set[str] = set()  # sessions whose last transcript write failed (writer thread only)
        # Lines not yet taken by the writer, per session. One queued writer operation takes them all, so a
        # turn's events cost a few writer operations, not one each; and that operation is lazy: it waits
        # (persistence.transcript_delay, 0.1 s by default) for a writer wake-up due anyway, e.g. the log's.
        self._lock = threading.Lock()
        self._pending: dict[str, list[bytes]] = {}

    def __call__(self, event: Event) -> None:
        kind = event.type
        if kind in self.exclude:
            return
        sid = event.session_id
        path = self._sessions.get(sid)
        if path is None:
            if kind in _IDLE_TYPES and not getattr(event, "resumed", False):
                return  # a new session's comings and goings: no transcript until it does something
            path = self._open(sid)
            if path is None:
                return
            lines = [encode_event(event) + b"\n"]
            if kind != "session_started" and self.left_out is not None:
                earlier = [e for e in self.left_out(sid) if e.seq < event.seq and e.type not in self.exclude]
                lines[:0] = [encode_event(e) + b"\n" for e in earlier]
        else:
            lines = [encode_event(event) + b"\n"]
        with self._lock:
            waiting = self._pending.get(sid)
            if waiting is not None:  # an operation is queued and has not taken its lines yet: join them
                waiting.extend(lines)
                return
            self._pending[sid] = lines
        try:
            self.writer.append_from(
                path,
                functools.partial(self._take, sid),
                functools.partial(self._done, sid),
                fsync=self.fsync,
                lazy=True,
            )
        except WriterClosedError as exc:
            with self._lock:
                self._pending.pop(sid, None)
            self._done(sid, exc)

    def wants(self, session_id: str, kind: str) -> bool:
        """Whether an event of type ``kind`` of the session would be written (the bus skips the others
        when it publishes to many sessions at once: see :meth:`EventBus.publish_each`)."""
        if kind in self.exclude:
            return False
        return session_id in self._sessions or kind not in _IDLE_TYPES

    def _take(self, session_id: str, _path: str) -> bytes:
        """The session's waiting lines, in order (on the writer thread)."""
        with self._lock:
            lines = self._pending.pop(session_id, ())
        return b"".join(lines)

    def forget(self, session_id: str) -> None:
        """Drop what is cached about a session (after it is deleted)."""
        self._sessions.pop(session_id, None)
        with self._lock:
            self._pending.pop(session_id, None)

    def _open(self, session_id: str) -> str | None:
        try:
            path = self.directory.transcript_file(session_id)
        except InvalidSessionId:
            return None  # not a session's event (e.g. a runtime-wide one): nothing to write it to
        self.directory.ensure()
        self._sessions[session_id] = path
        self.writer.call(path, truncate_torn_tail, functools.partial(self._done, session_id))
        return path

    def _done(self, session_id: str, error: Exception | None) -> None:
        if error is None:
            self._failing.discard(session_id)
        elif session_id not in self._failing:  # report a full disk once, not once per event
            self._failing.add(session_id)
            self._report(session_id, error)

    def _report(self, session_id: str, error: Exception) -> None:
        if self.on_error is not None:
            path = os.fspath(self.directory.transcript_path(session_id))
            self.on_error(session_id, path, error)
        else:
            log.error("transcript of session %s: %s", session_id, error)


class TranscriptEnd(msgspec.Struct, frozen=True):
    """How a transcript ends: what a resumed session's event numbering must go on from.

    ``clean``: its last line is the ``session_stopped`` of an orderly stop, so every event issued before it
    was written. Otherwise events delivered to subscribers may have been lost in a crash (the transcript is
    written behind the bus), and their numbers are unknown.
    """

    last_seq: int = 0  # the seq of the last complete line (0: none that decodes)
    clean: bool = False
    torn_bytes: int = 0  # bytes after the last newline: a line a crash cut short


_SEQ = re.compile(rb'"seq":(\d+)')
_TAIL_BLOCK = 64 * 1024


def transcript_end(path: StrPath) -> TranscriptEnd | None:
    """How the transcript at ``path`` ends (None: there is none). Reads only its last lines."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; `with` would hide the early return)
    except FileNotFoundError:
        return None
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        pos = f.seek(0, os.SEEK_END)
        tail = b""
        while pos > 0:  # back until the tail holds the last complete line whole
            step = min(_TAIL_BLOCK, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            last = tail.rfind(b"\n")
            if last >= 0 and (pos == 0 or tail.rfind(b"\n", 0, last) >= 0):
                break
    last = tail.rfind(b"\n")
    torn = len(tail) - last - 1
    if last < 0:
        return TranscriptEnd(torn_bytes=torn)
    line = tail[tail.rfind(b"\n", 0, last) + 1 : last]
    try:
        event: Event = _decoder.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError):
        found = _SEQ.search(line)
        return TranscriptEnd(last_seq=int(found.group(1)) if found else 0, torn_bytes=torn)
    return TranscriptEnd(
        last_seq=event.seq, clean=event.type == "session_stopped" and not torn, torn_bytes=torn
    )


def read_transcript(path: StrPath, after_seq: int = 0) -> list[Event]:
    """The events of a transcript with ``seq`` greater than ``after_seq``, in order.

    A torn last line (a crash mid-write) is skipped; any other bad line raises :class:`CorruptLogError`.
    A missing transcript reads as empty.
    """
    try:
        data = read_file(path)
    except FileNotFoundError:
        return []
    body = data[: data.rfind(b"\n") + 1]
    try:
        events: list[Event] = _decoder.decode_lines(body)
    except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec raises the latter for invalid UTF-8
        events = _decode_by_line(path, body)
    if after_seq <= 0:
        return events
    return [e for e in events if e.seq > after_seq]


def _decode_by_line(path: StrPath, body: bytes) -> list[Event]:
    lines = body.split(b"\n")[:-1]
    events: list[Event] = []
    for number, line in enumerate(lines, start=1):
        try:
            events.append(_decoder.decode(line))
        except UnicodeDecodeError as exc:
            if number == len(lines):
                break  # a torn last line
            raise CorruptLogError(path, number, f"not a valid event (invalid UTF-8: {exc})") from None
        except msgspec.DecodeError as exc:
            if number == len(lines) and not isinstance(exc, msgspec.ValidationError):
                break  # a torn last line
            raise CorruptLogError(path, number, f"not a valid event ({exc})") from None
    return events
