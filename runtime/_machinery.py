"""The shared machinery of a running :class:`~runtime.host.Runtime`: built by ``start``, torn down by ``stop``.

One :class:`Machinery` per start: the dispatcher every pooled actor runs on, the event bus (the transcript
writer its sink), the I/O loop and gateway, the tool executor, the log writer, the sessions directory,
this runtime's segment of the sessions index and its journal of open turns, the MCP hub (together the
actors' :class:`~actors.wiring.Services`), the spans' subscriber when the runtime traces, the root supervisor, and the reaper thread that hibernates idle sessions
(``persistence.hibernate_after``, design §8). A failed write of a transcript or of the index is told to
subscribers as ``persistence_failed`` (design §9), not just logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from actors.wiring import Services
from runtime import events as ev
from runtime.actor import Dispatcher
from runtime.affinity import allowed_cpus
from runtime.approval import ApprovalBroker
from runtime.bus import EventBus
from runtime.config import Config
from runtime.gateway import AdmissionControl, Gateway, IoLoop
from runtime.observability import tracing_for
from runtime.store.index import IndexAppender
from runtime.store.sessions import SessionDirectory
from runtime.store.transcript import LeftOut, TranscriptWriter
from runtime.store.turns import TurnJournal
from runtime.store.writer import LogWriter, WriterClosedError
from runtime.supervisor import Supervisor
from runtime.tools.executor import ToolExecutor
from runtime.tools.mcp import McpHub

__all__ = ["Machinery"]

log = logging.getLogger("agentcell.runtime")


class Machinery:
    """What a running runtime's sessions share; made on the runtime's CPUs (``cpus``; None: not placed).

    ``left_out`` rebuilds the events a session's transcript left out (see
    :class:`~runtime.store.transcript.TranscriptWriter`)."""

    def __init__(
        self, cfg: Config, cpus: frozenset[int] | None, *, tracer_provider: Any, left_out: LeftOut
    ) -> None:
        self.sessions_path = cfg.sessions_path
        self.sessions_path.mkdir(parents=True, exist_ok=True)
        # Where tools and the processes they start run when the runtime keeps its own threads on one CPU.
        self.process_cpus = allowed_cpus() if cpus is not None else None
        self.dispatcher = Dispatcher(
            threads=cfg.runtime.dispatcher_threads, batch_size=cfg.runtime.batch_size, cpus=cpus
        )
        self.bus = EventBus(queue_size=cfg.bus.subscriber_queue)
        self.io = IoLoop(cpus=cpus)
        writer = LogWriter(
            lazy_delay=cfg.persistence.transcript_delay,
            max_open_files=cfg.persistence.max_open_files,
            cpus=cpus,
        )
        directory = SessionDirectory(self.sessions_path, migrate=True)
        self.transcripts: TranscriptWriter | None = None
        if cfg.persistence.transcript:
            self.transcripts = TranscriptWriter(
                directory, writer, on_error=self._transcript_failed, left_out=left_out
            )
            self.bus.add_sink(self.transcripts)
        # the spans, made from the events (design §7.5): subscribed before any session publishes
        self.tracing = tracing_for(cfg.telemetry, tracer_provider)
        if self.tracing is not None:
            self.tracing.attach(self.bus.subscribe)
        self.services = Services(
            dispatcher=self.dispatcher,
            bus=self.bus,
            gateway=Gateway(
                self.io,
                cfg.retry,
                max_connections=cfg.gateway.max_connections,
                capacity=AdmissionControl(cfg.capacity, cfg.limits),
            ),
            executor=ToolExecutor(workers=cfg.runtime.tool_workers, cpus=self.process_cpus),
            writer=writer,
            directory=directory,
            approvals=ApprovalBroker(self.bus.publish),
            content=self.tracing.content if self.tracing is not None else None,
            mcp=(hub := McpHub()),
            turns=(turns := TurnJournal(self.sessions_path, writer, fsync=cfg.persistence.fsync)),
        )
        self.io.add_closer(hub.aclose)  # (a safety net: stop() stops every MCP server first)
        self.root = Supervisor.start_tree([], strategy="one_for_one", name="root", dispatcher=self.dispatcher)
        self.services.gateway.preload()  # import litellm on the I/O loop now, not on the first turn
        self.services.directory.ensure()  # (sessions of the flat layout move into their shard folders)
        self.turns = turns
        self.index = IndexAppender(
            directory.index,
            writer,
            fsync="never" if cfg.persistence.fsync == "never" else "always",
            on_error=self._index_failed,
        )
        self._hibernate_after = cfg.persistence.hibernate_after
        self._reaper: threading.Thread | None = None
        self._stopping = threading.Event()
        if self._hibernate_after is not None:
            self._reaper = threading.Thread(target=self._reap, name="agentcell-hibernate", daemon=True)
            self._reaper.start()

    def _transcript_failed(self, session_id: str, path: str, error: Exception) -> None:
        """A transcript write failed (e.g. a full disk): say so to subscribers (design §9), not just the log."""

        if isinstance(error, WriterClosedError):  # an event after stop(): nobody is left to tell
            return
        log.error("event transcript of session %s: %s", session_id, error)
        self.bus.publish(
            ev.PersistenceFailed(session_id=session_id, ts=time.time(), path=path, error=str(error))
        )

    def _index_failed(self, session_ids: list[str], error: Exception) -> None:
        """Headers of new sessions could not be written to the index (e.g. a full disk): say so for each.
        They are hosted still, and their first message writes the header to their own log."""
        path = self.services.directory.index.claim()
        log.error("sessions index %s: %d new sessions not written: %s", path, len(session_ids), error)
        for sid in session_ids:
            self.bus.publish(
                ev.PersistenceFailed(session_id=sid, ts=time.time(), path=path, error=str(error))
            )

    def append_index(self, data: bytes) -> None:
        """Append lines to this runtime's index segment through the log writer and wait for them."""
        done = threading.Event()
        failed: list[Exception | None] = [None]

        def told(error: Exception | None) -> None:
            failed[0] = error
            done.set()

        writer = self.services.writer
        index = self.services.directory.index
        path = index.claim()
        writer.append(path, data, told, fsync=self.index.fsync)
        done.wait()
        if failed[0] is not None:
            raise failed[0]
        if index.worth_compacting():  # (its dead lines outnumber its standing ones: issue 47)
            writer.call(path, self._compact_index)

    def _compact_index(self, _path: str) -> None:
        """Compact this runtime's index segment (on the log writer's thread, in order with its appends), and
        the segments no process holds that are as worth it (those of runtimes that are gone)."""
        try:
            self.services.directory.index.compact()
            self.services.directory.index.compact_idle()
        except Exception:  # the old segment stands whole: nothing is lost, the next removal tries again
            log.exception("sessions index: compaction failed")

    def _reap(self) -> None:
        """Hibernate sessions idle for ``persistence.hibernate_after`` seconds."""
        idle_after = self._hibernate_after
        assert idle_after is not None
        while not self._stopping.wait(min(1.0, max(0.05, idle_after / 4))):
            now = time.monotonic()
            for session in list(self.services.awake):  # (not the million parked ones)
                if session.running and now - session.last_used >= idle_after:
                    try:
                        session.hibernate_if_idle()
                    except Exception:  # a session that cannot park now is tried again later
                        log.exception("hibernating %s failed", session.session_id)

    def stop(self, hosted: Iterable[str], timeout: float) -> None:
        """Stop the reaper, every running session (agents first, stores last), then the machinery; the logs
        are flushed. ``hosted``: the ids of the sessions hosted, each told ``session_stopped``."""
        self._stopping.set()
        if self._reaper is not None:
            self._reaper.join()
        for session in list(self.services.awake):  # the running ones; a parked one has nothing to stop
            session.stop(timeout=timeout)
        # to whoever gets it: a session nobody follows (no subscriber, no transcript) makes no event, nor
        # one that only the spans would get (they end what is still open at close, at this time)
        stopped = time.time()
        self.bus.publish_each(hosted, "session_stopped", _stopped)
        self.root.stop(timeout=timeout)
        if self.services.mcp is not None:  # no MCP server process outlives the runtime
            self.services.mcp.stop_all(timeout=timeout + 5.0)
        self.services.executor.shutdown()
        self.io.stop()
        self.services.writer.close()
        self.turns.close()  # (deleted when no turn is left open: the writer wrote every end)
        self.services.directory.close()
        if self.tracing is not None:  # (the spans of every event published, ended before stop returns)
            self.tracing.close(timeout, at=stopped)
        self.bus.close()
        self.dispatcher.shutdown()


def _stopped(session_id: str) -> ev.SessionStopped:
    return ev.SessionStopped(session_id=session_id)
