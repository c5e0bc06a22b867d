"""Session persistence (design §2.2–2.4): the session tree, its append-only JSONL log, the shared writer
thread, the sessions directory (list, delete, lock) and the event transcript.

The pieces, from the inside out: :mod:`~runtime.store.entries` (what a log line holds),
:mod:`~runtime.store.tree` (the pure session model and its views), :mod:`~runtime.store.writer` (one
background thread that batches, writes and fsyncs for every session), :mod:`~runtime.store.log`
(reading back and crash recovery), :mod:`~runtime.store.sessions` (the sharded folders, listing, locks),
:mod:`~runtime.store.index` (the headers of sessions with no log yet) and :mod:`~runtime.store.transcript`.
The actor that owns a session's tree and log is :class:`actors.session_store.SessionStore`.
"""

from runtime.store.entries import (
    FORMAT_VERSION,
    BranchEntry,
    CompactionEntry,
    Entry,
    Header,
    MessageEntry,
    MetadataEntry,
    NodeEntry,
    OverlayEntry,
    StepEntry,
    VisibilityEntry,
    new_header,
)
from runtime.store.index import IndexAppender, SessionIndex
from runtime.store.log import CorruptLogError, RecoveryInfo, SessionLog, load_tree, read_log
from runtime.store.session_lock import SessionLock
from runtime.store.sessions import (
    SessionDirectory,
    SessionInfo,
    SessionLockedError,
    SessionNotFound,
    SessionNotFoundError,
    shard_of,
)
from runtime.store.transcript import TranscriptWriter, read_transcript
from runtime.store.tree import SessionTree
from runtime.store.writer import FsyncPolicy, LogWriteError, LogWriter, WriterClosedError

__all__ = [
    "FORMAT_VERSION",
    "BranchEntry",
    "CompactionEntry",
    "CorruptLogError",
    "Entry",
    "FsyncPolicy",
    "Header",
    "IndexAppender",
    "LogWriteError",
    "LogWriter",
    "MessageEntry",
    "MetadataEntry",
    "NodeEntry",
    "OverlayEntry",
    "RecoveryInfo",
    "SessionDirectory",
    "SessionIndex",
    "SessionInfo",
    "SessionLock",
    "SessionLockedError",
    "SessionLog",
    "SessionNotFound",
    "SessionNotFoundError",
    "SessionTree",
    "StepEntry",
    "TranscriptWriter",
    "VisibilityEntry",
    "WriterClosedError",
    "load_tree",
    "new_header",
    "read_log",
    "read_transcript",
    "shard_of",
]
