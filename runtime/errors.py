"""agentcell's exceptions: one tree under :class:`AgentcellError`, so ``except AgentcellError`` catches them all.

Each keeps the built-in base it always had, so code that catches ``KeyError``, ``ValueError``,
``RuntimeError`` or ``OSError`` still catches it::

    AgentcellError
     ├─ ConfigError                 ValueError    an invalid configuration value; the message names the key
     ├─ SessionError                              about one session
     │   ├─ InvalidSessionId        ValueError    an id that could escape the sessions directory
     │   ├─ SessionNotFound         KeyError      no session with that id is hosted (or stored)
     │   ├─ SessionLockedError      RuntimeError  the session is open in another runtime
     │   └─ AlreadyRegistered       KeyError      the session id is taken in a registry
     ├─ StoreError                                a session's log on disk
     │   ├─ CorruptLogError         ValueError    a log line that is not a valid entry
     │   ├─ LogWriteError           OSError       a write refused after an earlier one to the file failed
     │   ├─ WriterClosedError       RuntimeError  the log writer is closed
     │   ├─ StoreWriteError         RuntimeError  the store actor could not write (actors.session_store)
     │   └─ NeedsHistory            LookupError   a trimmed session tree was asked for a node it left to
     │                                            the log; its store reads it back (runtime.store.tree)
     ├─ ToolError                                 a tool's failure, shown to the model as it is
     │   ├─ WorkspaceError                        a path outside the session's workspace
     │   └─ McpUnavailable                        an MCP server cannot take the call (runtime.tools.mcp)
     ├─ RuntimeStateError           RuntimeError  the runtime (or a part of it) is not in a state to do it
     │   ├─ RuntimeStopped                        the runtime is not running
     │   ├─ DispatcherClosed                      an actor started on a dispatcher that is shutting down
     │   ├─ RestartIntensityExceeded              a supervisor saw too many restarts and gave up
     │   ├─ CallFailed                            an actor asked is gone or raised (actors._base)
     │   ├─ CompactionInterrupted                 the compactor stopped before answering (actors.compactor)
     │   ├─ IllegalTransition                     the agent's state machine has no such edge (actors.agent)
     │   └─ MetricsUnavailable                    no metrics: prometheus-client missing, or not running
     ├─ ClusterError                RuntimeError  the cluster could not do what was asked
     │   ├─ ClusterUnavailable                    no Ray cluster answers, or it went away
     │   └─ ShardDied                             a call met its shard dead
     ├─ TransportError                            the native transport's own errors, each mapped to a
     │   ├─ HTTPTransportError ...                ProviderError before it leaves the gateway
     │   └─ ProviderHTTPError ...                 (runtime.gateway.transports)
     ├─ QueueTimeout                              a call waited past its turn's budget for a provider key's
 │                                            capacity; the turn ends rate_limited (runtime.gateway)
 ├─ AddressRefused              OSError       a client's URL at an address the server does not connect
     │                                            to for clients (loopback, private, link-local...)
     └─ the applications' errors (runtime.apps): HttpError, ApiError, InputError and SealError (ValueError)

A provider's failure is not an exception here: a turn that fails ends with ``TurnResult.status == "error"``
and its ``error`` text (the gateway's ``ProviderError`` is a value, classified from whatever the provider
raised). The classes whose module is named above are defined there, beside the code that raises them; every
other class is defined here, and the modules that raise it import it (``runtime.host.SessionNotFound`` is
this module's ``SessionNotFound``).
"""

from __future__ import annotations

import os
import socket
from typing import Protocol

__all__ = [
    "AddressRefused",
    "AgentcellError",
    "AlreadyRegistered",
    "ClusterError",
    "ClusterUnavailable",
    "ConfigError",
    "CorruptLogError",
    "DispatcherClosed",
    "InvalidSessionId",
    "LogWriteError",
    "RestartIntensityExceeded",
    "RuntimeStateError",
    "RuntimeStopped",
    "SessionError",
    "SessionLockedError",
    "SessionNotFound",
    "ShardDied",
    "StoreError",
    "ToolError",
    "TransportError",
    "WorkspaceError",
    "WriterClosedError",
]


class AgentcellError(Exception):
    """The root of every exception agentcell raises on purpose."""


# -- configuration ----------------------------------------------------------------------------------------


class ConfigError(AgentcellError, ValueError):
    """An invalid configuration value; the message names the key."""


# -- sessions ---------------------------------------------------------------------------------------------


class SessionError(AgentcellError):
    """Something about one session: its id, whether it exists, who holds it."""


class InvalidSessionId(SessionError, ValueError):
    """A session id that could escape the sessions directory or is otherwise unusable."""


class SessionNotFound(SessionError, KeyError):
    """No session with that id is hosted (or stored, for resume, show and delete).

    A ``KeyError`` (and so a ``LookupError``), whose text is the message itself, unquoted.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "session not found"


class _LockHolder(Protocol):
    """Who holds a session lock (the store's ``LockOwner``, read from the lock file)."""

    @property
    def pid(self) -> int: ...

    @property
    def host(self) -> str: ...


class SessionLockedError(SessionError, RuntimeError):
    """The session is open in another runtime (or another store of this one).

    ``owner_pid`` and ``owner_host`` name the holder when its lock file says who it is.
    """

    def __init__(self, message: str, owner: _LockHolder | None = None) -> None:
        super().__init__(message)
        self.owner_pid = owner.pid if owner else None
        self.owner_host = owner.host if owner else None

    @property
    def held_by_this_process(self) -> bool:
        return self.owner_pid == os.getpid() and self.owner_host == socket.gethostname()


class AlreadyRegistered(SessionError, KeyError):
    """:meth:`runtime.registry.SessionRegistry.register` found the session id taken."""

    def __str__(self) -> str:
        return f"session {self.args[0]!r} is already registered"


# -- the store --------------------------------------------------------------------------------------------


class StoreError(AgentcellError):
    """A session's log on disk could not be read or written."""


class CorruptLogError(StoreError, ValueError):
    """A log line that is not a valid entry (and not a torn last line)."""

    def __init__(self, path: str | os.PathLike[str], line: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}, line {line}: {reason}")


class LogWriteError(StoreError, OSError):
    """A write was refused because an earlier write to the same file failed (see ``LogWriter.reset``)."""


class WriterClosedError(StoreError, RuntimeError):
    """An operation was handed to a log writer that has been closed."""


# -- tools ------------------------------------------------------------------------------------------------


class ToolError(AgentcellError):
    """A failure a tool reports on purpose: its message is shown to the model as it is."""


class WorkspaceError(ToolError):
    """A path that is not allowed: the message says which and why."""


# -- the runtime's state ----------------------------------------------------------------------------------


class RuntimeStateError(AgentcellError, RuntimeError):
    """The runtime, or the part of it asked, is not in a state to do this."""


class RuntimeStopped(RuntimeStateError):
    """The runtime is not running."""


class DispatcherClosed(RuntimeStateError):
    """Raised when starting an actor on a dispatcher that is shutting down or shut down."""


class RestartIntensityExceeded(RuntimeStateError):
    """A supervisor saw more than ``max_restarts`` restarts in ``max_seconds`` and gave up.

    ``__cause__`` is the last child's exception (if it had one).
    """

    def __init__(self, message: str, *, supervisor: str, child_id: str) -> None:
        super().__init__(message)
        self.supervisor = supervisor
        self.child_id = child_id


# -- the cluster ------------------------------------------------------------------------------------------


class AddressRefused(AgentcellError, OSError):
    """A connection for a client (to a URL it gave) that the server does not make: the address is loopback,
    private, link-local... or the name does not resolve (``runtime.outbound``)."""


class ClusterError(AgentcellError, RuntimeError):
    """The cluster could not do what was asked: a shard did not start, no shard is left, one is unreachable."""


class ClusterUnavailable(ClusterError):
    """No Ray cluster answers at the address given, or the cluster went away."""


class ShardDied(ClusterError):
    """A call met its shard dead (the front resumes the shard's sessions elsewhere)."""


# -- the native transport ---------------------------------------------------------------------------------


class TransportError(AgentcellError):
    """A failure inside the native transport; the gateway classifies it into a ``ProviderError``."""
