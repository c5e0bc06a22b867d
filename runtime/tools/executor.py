"""Running tool calls (design §3.4-3.6): a worker pool shared by the runtime, parallel within a turn.

:meth:`ToolExecutor.run` takes the tool calls of one assistant message and returns at once with a
:class:`ToolBatchHandle`; callbacks report progress from worker threads. Every call ends with exactly one
:class:`ToolRunResult` whose message is a ``tool`` result, and nothing a tool does can crash the caller:

- malformed JSON arguments, an unknown tool name, invalid arguments → an error result the model can read;
- the approval hook (when given) may allow or deny each call, blocking only its worker; a denial →
  an error result with the reason; a tool marked ``requires_approval`` with no hook → denied;
- a tool that raises → an error result with the exception's type and message (a :class:`ToolError`'s
  message is shown as it is);
- a tool that runs past its timeout → a timeout error result at the deadline. Python cannot kill a
  thread: the stuck worker is abandoned (its eventual result discarded, ``ctx.cancelled`` set so a
  cooperative tool stops, and shell subprocesses are killed) and a fresh worker takes its place;
- :meth:`ToolBatchHandle.cancel` (abort) completes every unfinished call with an "aborted" error result.

All output, errors included, goes through :func:`~runtime.context.tool_output.limit_output`; output over
the spill threshold is written to a spill file in ``spill_dir``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import pykka

from runtime.affinity import place_thread
from runtime.config import Config, ToolOutputConfig
from runtime.context.integrity import malformed_arguments_text, unknown_tool_text
from runtime.context.tool_output import decode_output, limit_output, write_spill
from runtime.messages import Message, ToolCallPart, tool_result
from runtime.tools.registry import Tool, ToolContext, ToolError, ToolRegistry
from runtime.tools.saved import READ_SAVED
from runtime.tools.workspace import Workspace

__all__ = [
    "NO_OUTPUT",
    "Approve",
    "ContextFactory",
    "ToolBatchHandle",
    "ToolExecutor",
    "ToolRunResult",
    "context_factory",
]


log = logging.getLogger("agentcell.tools")

Approve = Callable[[ToolCallPart], "bool | str | None"]
ContextFactory = Callable[[ToolCallPart], ToolContext]

NO_OUTPUT: Final = "(no output)"
_MAX_WAIT: Final = 3600.0  # the watchdog's longest single wait, in seconds

# Per-call states. A call moves forward only; whoever moves it to _DONE delivers its one result.
_PENDING, _PREPARING, _RUNNING, _FINISHING, _DONE = range(5)


@dataclass(frozen=True)
class ToolRunResult:
    """The outcome of one tool call. ``message`` is the ``tool`` result to append to the conversation."""

    call: ToolCallPart
    message: Message
    duration: float
    truncated: bool = False
    spilled: Path | None = None

    @property
    def is_error(self) -> bool:
        return self.message.is_error


def context_factory(
    *,
    session_id: str,
    workspace: str | os.PathLike[str] | Workspace | None,
    config: Config,
    logs_dir: str | os.PathLike[str],
    turn_id: str = "",
    saved_dirs: tuple[Path, ...] = (),
) -> ContextFactory:
    """A ``ctx_factory`` for :meth:`ToolExecutor.run` from a session's settings. ``saved_dirs``: the
    session's folders of saved outputs and artifacts, which ``read_saved`` reads (and nothing else does)."""
    ws = workspace if isinstance(workspace, Workspace) or workspace is None else Workspace(workspace)
    logs = Path(logs_dir)

    def make(call: ToolCallPart) -> ToolContext:
        return ToolContext(
            workspace=ws,
            session_id=session_id,
            call_id=call.id,
            turn_id=turn_id,
            shell_enabled=config.agent.shell_enabled,
            shell_timeout=config.agent.shell_timeout,
            shell_env=tuple(config.agent.shell_env),
            logs_dir=logs,
            saved_dirs=saved_dirs,
        )

    return make


class ToolExecutor:
    """A pool of worker threads running tool calls, shared by every session of a runtime."""

    def __init__(
        self, workers: int = 16, *, name: str = "agentcell-tool", cpus: frozenset[int] | None = None
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._workers = workers
        # Where the workers run. The runtime gives the process's own CPUs when it keeps its threads on one:
        # workers are started from its threads, and tools (and the processes they start) should not inherit.
        self._cpus = cpus
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[_Batch, int] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._serial = itertools.count(1)
        self._watchdog = _Watchdog(f"{name}-watchdog")

    def run(
        self,
        calls: Sequence[ToolCallPart],
        registry: ToolRegistry,
        ctx_factory: ContextFactory,
        *,
        timeout: float | None = 60.0,
        limits: ToolOutputConfig | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        approve: Approve | None = None,
        on_start: Callable[[ToolCallPart], None] | None = None,
        on_output: Callable[[ToolCallPart, str], None] | None = None,
        on_done: Callable[[ToolRunResult], None] | None = None,
        on_all_done: Callable[[list[ToolRunResult]], None] | None = None,
        max_parallel: int | None = None,
        before_run: Callable[[ToolCallPart, Tool], None] | None = None,
    ) -> ToolBatchHandle:
        """Start running ``calls``; returns immediately. Results keep the calls' order.

        ``timeout`` applies to each call (a tool's own ``timeout`` wins); ``None``: no limit.
        ``approve(call)`` returns True (or None) to allow, False or a reason string to deny.
        ``on_start`` fires when a worker takes a call up (not for calls aborted before that), ``on_done``
        once per call, ``on_all_done`` once with every result. Callbacks run on worker threads (the
        watchdog's for timeouts, the caller's for :meth:`ToolBatchHandle.cancel`) and must not block.
        ``before_run(call, tool)`` is the exception: it runs on the call's worker once the call is
        approved, right before the tool, and may block (it records the call's start, design §3.12); if
        it raises, the tool is not run and the call's result is an error saying so.
        """
        if self._closed:
            raise RuntimeError("the tool executor is shut down")
        if timeout is not None and not timeout > 0:  # (NaN too)
            raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
        self._start()
        batch = _Batch(
            self,
            list(calls),
            registry,
            ctx_factory,
            timeout=timeout,
            limits=limits or ToolOutputConfig(),
            spill_dir=Path(spill_dir) if spill_dir is not None else None,
            approve=approve,
            on_start=on_start,
            on_output=on_output,
            on_done=on_done,
            on_all_done=on_all_done,
            before_run=before_run,
        )
        batch.start(max_parallel)
        return ToolBatchHandle(batch)

    def shutdown(self) -> None:
        """Stop the workers once the queued calls are taken; running tools are not interrupted."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if started:
            for _ in range(self._workers):
                self._jobs.put(None)
        self._watchdog.stop()

    # -- internals -------------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        for _ in range(self._workers):
            self._spawn()
        self._watchdog.start()

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._work, name=f"{self._name}-{next(self._serial)}", daemon=True)
        thread.start()

    def _submit(self, batch: _Batch, index: int) -> None:
        self._jobs.put((batch, index))

    def _replace_worker(self) -> None:
        """A worker is stuck in an abandoned tool: keep the pool at full strength without it."""
        if not self._closed:
            self._spawn()

    def _work(self) -> None:
        place_thread(self._cpus)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            batch, index = job
            try:
                keep_going = batch.execute(index)
            except BaseException:  # a bug in here must not shrink the pool
                log.exception("tool worker failed")
                keep_going = True
            if not keep_going:
                return  # abandoned: a replacement worker was started when the call was taken away


class ToolBatchHandle:
    """The running calls of one :meth:`ToolExecutor.run`."""

    def __init__(self, batch: _Batch) -> None:
        self._batch = batch

    @property
    def done(self) -> bool:
        return self._batch.finished.is_set()

    @property
    def results(self) -> list[ToolRunResult | None]:
        """The results so far, in the calls' order (None: not finished yet)."""
        return list(self._batch.results)

    def wait(self, timeout: float | None = None) -> list[ToolRunResult]:
        """Block until every call has a result; ``TimeoutError`` if ``timeout`` passes first."""
        if not self._batch.finished.wait(timeout):
            raise TimeoutError(f"tool calls still running after {timeout} s")
        return [r for r in self._batch.results if r is not None]

    def cancel(self, reason: str = "aborted") -> int:
        """Abort: every unfinished call gets an error result now; returns how many were cut short."""
        return self._batch.cancel(reason)


# ---------------------------------------------------------------------------------------------------


class _Call:
    """The mutable state of one call within a batch (guarded by the batch's lock)."""

    __slots__ = ("abandoned", "cancelled", "ctx", "deadline", "started", "state", "worker_busy")

    def __init__(self) -> None:
        self.ctx: ToolContext | None = None  # the running call's context (its result metadata)
        self.state = _PENDING
        self.started = 0.0
        self.cancelled = threading.Event()
        self.worker_busy = False  # a worker is inside execute() for this call
        self.abandoned = False  # ... and the call was completed without it: that worker retires
        self.deadline: _Deadline | None = None


class _Rejected(msgspec.Struct, frozen=True):
    """A call that ends before its tool runs (bad arguments, unknown tool, denied)."""

    kind: str
    text: str


class _Batch:
    def __init__(
        self,
        executor: ToolExecutor,
        calls: list[ToolCallPart],
        registry: ToolRegistry,
        ctx_factory: ContextFactory,
        *,
        timeout: float | None,
        limits: ToolOutputConfig,
        spill_dir: Path | None,
        approve: Approve | None,
        on_start: Callable[[ToolCallPart], None] | None,
        on_output: Callable[[ToolCallPart, str], None] | None,
        on_done: Callable[[ToolRunResult], None] | None,
        on_all_done: Callable[[list[ToolRunResult]], None] | None,
        before_run: Callable[[ToolCallPart, Tool], None] | None = None,
    ) -> None:
        self.executor = executor
        self.before_run = before_run
        self.calls = calls
        self.registry = registry
        self.ctx_factory = ctx_factory
        self.timeout = timeout
        self.limits = limits
        self.spill_dir = spill_dir
        self.approve = approve
        self.on_start = on_start
        self.on_output = on_output
        self.on_done = on_done
        self.on_all_done = on_all_done
        self.lock = threading.Lock()
        self.states = [_Call() for _ in calls]
        self.results: list[ToolRunResult | None] = [None] * len(calls)
        self.remaining = len(calls)
        self.finished = threading.Event()
        self.next_index = len(calls)

    def start(self, max_parallel: int | None) -> None:
        if not self.calls:
            self.finished.set()
            _safely(self.on_all_done, [])
            return
        first = len(self.calls) if max_parallel is None else max(1, min(max_parallel, len(self.calls)))
        self.next_index = first
        for index in range(first):
            self.executor._submit(self, index)

    # -- one call, on a worker ---------------------------------------------------------------------------
    def execute(self, index: int) -> bool:
        """Run call ``index`` on the current worker. False: the worker was abandoned and must retire."""
        call, st = self.calls[index], self.states[index]
        with self.lock:
            if st.state != _PENDING:
                return True  # aborted before it started
            st.state, st.started, st.worker_busy = _PREPARING, time.monotonic(), True
        try:
            self._execute(index, call, st)
        except Exception as exc:  # a bug outside the tool itself: the call still gets its one result
            log.exception("tool call %s (%s) failed outside its tool", call.id, call.name)
            if self._take(index, (_PREPARING, _RUNNING)):
                text = f"Error: the call could not be run ({type(exc).__name__}: {exc})"
                self._deliver(index, text, is_error=True, error="internal")
        finally:
            with self.lock:
                st.worker_busy = False
                abandoned = st.abandoned
        return not abandoned

    def _execute(self, index: int, call: ToolCallPart, st: _Call) -> None:
        _safely(self.on_start, call)
        prepared = self._prepare(call, st)
        if isinstance(prepared, _Rejected):
            if self._take(index, (_PREPARING,)):
                self._deliver(index, prepared.text, is_error=True, error=prepared.kind)
            return
        tool, arguments, ctx = prepared
        st.ctx = ctx
        if self.before_run is not None:
            try:
                self.before_run(call, tool)  # (may block this worker: the start is recorded first)
            except Exception as exc:
                if self._take(index, (_PREPARING,)):
                    text = f"Error: the call was not run: {exc}"
                    self._deliver(index, text, is_error=True, error="not_started")
                return
        timeout = tool.timeout if tool.timeout is not None else self.timeout
        with self.lock:
            if st.state != _PREPARING:
                return  # aborted while it waited for approval
            st.state = _RUNNING
        if timeout is not None:
            st.deadline = self.executor._watchdog.add(time.monotonic() + timeout, self, index, timeout)
        error: str | None = None
        try:
            text = _output_text(tool.invoke(arguments, ctx))
        except ToolError as exc:
            text, error = f"Error: {exc}", "tool_error"
        except BaseException as exc:  # SystemExit or KeyboardInterrupt from a tool is a result too
            text, error = f"Error: {type(exc).__name__}: {exc}", "exception"
        if self._take(index, (_RUNNING,)):
            self._deliver(index, text, is_error=error is not None, error=error)

    def _prepare(self, call: ToolCallPart, st: _Call) -> _Rejected | tuple[Tool, dict[str, Any], ToolContext]:
        try:
            arguments = call.parsed_arguments()
        except ValueError as exc:
            return _Rejected("invalid_arguments", malformed_arguments_text(call, str(exc)))
        tool = self.registry.get(call.name)
        if tool is None:
            return _Rejected("unknown_tool", unknown_tool_text(call.name, self.registry.names))
        denial = self._approval(call, tool)
        if denial is not None:
            return _Rejected("denied", f"Error: tool call denied: {denial}")
        try:
            ctx = self.ctx_factory(call)
        except Exception as exc:
            return _Rejected(
                "prepare_failed", f"Error: could not prepare the call: {type(exc).__name__}: {exc}"
            )
        on_output = self.on_output
        emit = (
            ctx.emit_output
            if on_output is None
            else (lambda chunk: _safely(on_output, call, _chunk_text(chunk)))
        )
        return (
            tool,
            arguments,
            dataclasses.replace(ctx, call_id=call.id, cancelled=st.cancelled, emit_output=emit),
        )

    def _approval(self, call: ToolCallPart, tool: Tool) -> str | None:
        """None when the call may run, else the reason it may not."""
        if self.approve is None:
            if tool.requires_approval:
                return f"{tool.name!r} requires approval, and no approval hook is configured for this session"
            return None
        try:
            verdict = self.approve(call)
        except Exception as exc:  # a broken hook denies: failing closed is the safe side
            return f"the approval hook failed ({type(exc).__name__}: {exc})"
        if verdict is None or verdict is True:
            return None
        return verdict if isinstance(verdict, str) and verdict else "denied by the approval hook"

    # -- completion --------------------------------------------------------------------------------------
    def _take(self, index: int, states: tuple[int, ...], *, abandon: bool = False) -> bool:
        """Claim the right to deliver call ``index``'s result if it is in one of ``states``."""
        st = self.states[index]
        with self.lock:
            if st.state not in states:
                return False
            st.state = _FINISHING
            replace = abandon and st.worker_busy
            if replace:
                st.abandoned = True
        if abandon:
            st.cancelled.set()
        if replace:
            self.executor._replace_worker()
        return True

    def _deliver(self, index: int, text: str, *, is_error: bool, error: str | None) -> None:
        """Build and hand out the one result of a call claimed with :meth:`_take`."""
        result = self._result(self.calls[index], self.states[index], text, is_error=is_error, error=error)
        st = self.states[index]
        if st.deadline is not None:
            st.deadline.batch = None  # let the watchdog forget this batch now, not at the deadline
        with self.lock:
            st.state = _DONE
            self.results[index] = result
            self.remaining -= 1
            last = self.remaining == 0
            follow: int | None = None
            if self.next_index < len(self.calls):
                follow, self.next_index = self.next_index, self.next_index + 1
        _safely(self.on_done, result)
        if follow is not None:
            self.executor._submit(self, follow)
        if last:
            self.finished.set()
            _safely(self.on_all_done, [r for r in self.results if r is not None])

    def _result(
        self, call: ToolCallPart, st: _Call, text: str, *, is_error: bool, error: str | None
    ) -> ToolRunResult:
        duration = time.monotonic() - st.started if st.started else 0.0
        reader = READ_SAVED if READ_SAVED in self.registry else None
        limited = limit_output(text, self.limits, spill_dir=self.spill_dir, label=call.name, reader=reader)
        spilled: Path | None = None
        if limited.spill is not None:
            try:
                spilled = write_spill(limited.spill)
            except OSError as exc:
                limited = limit_output(text, self.limits, allow_spill=False)
                note = f"\n[The full output could not be saved: {exc.strerror or exc}]"
                limited = msgspec.structs.replace(limited, text=limited.text + note)
        metadata: dict[str, Any] = {"duration": round(duration, 6)}
        if error:
            metadata["error"] = error
        if limited.truncated:
            metadata.update(
                truncated=True, original_chars=limited.original_chars, original_bytes=limited.original_bytes
            )
        if spilled is not None and limited.spill is not None:
            metadata.update(spill_path=str(spilled), spill_sha256=limited.spill.sha256)
        if st.ctx is not None and st.ctx.metadata:  # what the tool recorded about its call
            metadata.update(st.ctx.metadata)
        message = tool_result(call.id, call.name, limited.text, is_error=is_error, metadata=metadata)
        return ToolRunResult(call, message, duration, limited.truncated, spilled)

    # -- timeouts and abort ------------------------------------------------------------------------------
    def expire(self, index: int, timeout: float) -> None:
        """The watchdog's deadline for call ``index`` passed: time it out if it is still running."""
        if self._take(index, (_RUNNING,), abandon=True):
            name = self.calls[index].name
            self._deliver(
                index,
                f"Error: tool {name!r} timed out after {timeout:g} s and was abandoned; "
                "anything it does from now on is discarded",
                is_error=True,
                error="timeout",
            )

    def cancel(self, reason: str) -> int:
        with self.lock:
            self.next_index = len(self.calls)  # nothing more gets submitted
        cut = [
            index
            for index in range(len(self.calls))
            if self._take(index, (_PENDING, _PREPARING, _RUNNING), abandon=True)
        ]
        for index in cut:
            self._deliver(
                index,
                f"Error: tool call was aborted ({reason}) before it finished",
                is_error=True,
                error="aborted",
            )
        return len(cut)


def _output_text(output: Any) -> str:
    if output is None:
        return NO_OUTPUT
    if isinstance(output, str):
        return output or NO_OUTPUT
    if isinstance(output, (bytes, bytearray, memoryview)):
        return decode_output(output) or NO_OUTPUT
    try:
        return msgspec.json.encode(output).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(output)


def _chunk_text(chunk: Any) -> str:
    """A streamed output chunk as text that encodes: bytes decoded, lone surrogates replaced (events carry
    it, and an event that cannot be encoded would be lost from the transcript and break SSE streams)."""
    if isinstance(chunk, bytes | bytearray | memoryview):
        return bytes(chunk).decode("utf-8", errors="replace")
    text = str(chunk)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def _safely(callback: Callable[..., Any] | None, *args: Any) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except pykka.ActorDeadError:  # e.g. the results of calls aborted as their session was deleted
        log.debug("tool callback %r: its actor has stopped; the value is dropped", callback)
    except Exception:
        log.exception("tool callback %r failed", callback)


class _Deadline:
    """A watchdog entry; ``batch`` is cleared when the call ends first, so nothing is kept alive."""

    __slots__ = ("batch", "index", "timeout", "when")

    def __init__(self, when: float, batch: _Batch, index: int, timeout: float) -> None:
        self.when = when
        self.batch: _Batch | None = batch
        self.index = index
        self.timeout = timeout


class _Watchdog:
    """One thread that fires call deadlines."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def add(self, when: float, batch: _Batch, index: int, timeout: float) -> _Deadline:
        deadline = _Deadline(when, batch, index, timeout)
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), deadline))
            self._cond.notify()
        return deadline

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        """Fire deadlines until stopped. Nothing a call or its batch does may end this thread: every
        session's timeouts depend on it."""
        while True:
            try:
                if self._fire_next():
                    return
            except BaseException:  # (an OverflowError from a wait, a bug in a batch): log, keep watching
                log.exception("tool watchdog failed; it keeps running")
                time.sleep(0.01)  # a failure that repeats at once must not spin a CPU

    def _fire_next(self) -> bool:
        """Wait for the earliest deadline and fire it; True once the watchdog is stopped."""
        with self._cond:
            while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                wait = self._heap[0][0] - time.monotonic() if self._heap else None
                # Sleep at most an hour at a time: a deadline years away (a huge timeout) must not overflow
                # the wait, and a new earlier deadline notifies anyway.
                self._cond.wait(None if wait is None else min(wait, _MAX_WAIT))
            if self._stopped:
                return True
            _, _, deadline = heapq.heappop(self._heap)
        batch = deadline.batch
        if batch is not None:
            batch.expire(deadline.index, deadline.timeout)
        return False
