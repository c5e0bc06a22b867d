"""The turn channel: a session's prompts, sends, aborts and compactions and their answers, between the front
and a shard over one stream socket per shard, outside Ray's task machinery.

The shard's events for this front go out on the same connection (:mod:`runtime.cluster._stream`), so a
turn's answer is read after its events. A Ray actor call costs about a millisecond of CPU at each end (task submission and execution, the hop onto
the actor's event loop, the reply), which a mock turn of 26 ms felt as 5-6% on the shard and as much again
on the front. A frame on a socket costs a few tens of microseconds. Everything else (starting and resuming
sessions, queries, watching a shard's death) stays a Ray call: Ray places, starts and watches the
shards, the channel only carries turns and events.

Each shard listens on a Unix socket (fronts on its host use it) and on TCP at its node's address (fronts on
other hosts); a connection opens with the shard's token, which only Ray handed out (:class:`Address`), and is
dropped otherwise; then the front names itself and the last batch of events it received
(``[front id, batch]``). Frames are a 4-byte big-endian length and msgpack:

    front -> shard   [call id, method, session id, *arguments]      (the shard's Ray methods' arguments)
                     [-1, "ack", "", batch]                          (events received up to batch)
    shard -> front   [call id, true, answer]  or  [call id, false, the pickled exception]
                     0xC1 [batch, events, routes]                     (events: runtime.cluster._stream)

Calls start in the order they are sent (one stream per shard), as Ray starts an actor's calls from one caller.
A Ray call for a session with turn calls in flight waits until they have started (:meth:`TurnChannel.sync`),
so a ``set_model`` right after a ``prompt`` reaches the session after it, as on one ``Runtime``.
When a connection breaks, every call waiting on it is answered with :data:`LOST`; the front then asks Ray
whether the shard died (see ``ClusterRuntime``), and if it lives, connects again (its calls go as Ray
calls meanwhile); the events it missed come on the new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import pickle
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from runtime.cluster._stream import PUSH, Router
from runtime.errors import ClusterError

log = logging.getLogger("agentcell.cluster")

__all__ = ["LOST", "Address", "Server", "TurnChannel", "connect"]

LOST = ClusterError("the turn channel broke")
"""The error a call waiting on a broken connection is answered with (the front finds out why)."""

SYNC = "sync"
"""The call a shard answers as soon as it reads it (:meth:`TurnChannel.sync`)."""
ACK = "ack"
"""The front has received the shard's batches of events up to the argument (not answered)."""
SUBSCRIBE = "subscribe"
"""Add a feed of this front on the shard: ``key, sessions, types, include_children`` (answered at once)."""
UNSUBSCRIBE = "unsubscribe"
"""Remove the feed ``key`` (answered at once)."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
_HEAD = 4
_PUSH = bytes((PUSH,))
MAX_FRAME = 1 << 31
"""The largest frame either end accepts (a ``send`` of a long conversation is one frame)."""
READ_SIZE = 4 << 20
"""Bytes the front takes off a shard's connection in one go, and the socket buffers asked for at both ends.

asyncio's defaults (a stream reader that stops reading past 128 KiB buffered, a transport that reads 256 KiB
per wake of the event loop, a Unix socket's ~200 KiB kernel buffer) cap what a front reads per turn of its
loop; each turn also wakes the subscribers' readers, whose threads then take the GIL one after the other
before the loop gets it back. During a burst two shards write more than that in such a turn, and the rest
waits on the connection (which the delivery delay counts)."""

Reply = Callable[[Any, BaseException | None], None]
"""How a call's answer is delivered on the front: ``reply(answer, None)`` or ``reply(None, error)``."""


class Address(msgspec.Struct, frozen=True):
    """Where a shard's channel listens, and the token a connection opens with."""

    host: str
    path: str
    ip: str
    port: int
    token: bytes


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(_HEAD, "big") + data


async def _read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> bytes:
    size = int.from_bytes(await reader.readexactly(_HEAD), "big")
    if size > limit:
        raise ConnectionError(f"a frame of {size} bytes")
    return await reader.readexactly(size)


def _widen(writer: asyncio.StreamWriter, option: int) -> None:
    """Ask for a socket buffer of :data:`READ_SIZE` (the kernel caps it at its maximum)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, READ_SIZE)


def _pickled(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:  # an error that does not pickle reaches the front as its words
        return pickle.dumps(ClusterError(f"{type(exc).__name__}: {exc}"))


# -- the shard's end ------------------------------------------------------------------------------------------
Starter = Callable[[str, str, list[Any]], Any]
"""Starts a call on the shard: ``start(method, session_id, arguments)`` returns a handle (``runtime.handles``)."""
Answerer = Callable[[str, str, Any], Any]
"""What crosses back for a call's value: ``answer(method, session_id, value)``."""


class Server:
    """A shard's end: accepts fronts, starts their calls, writes each answer when its handle resolves.

    Everything but the handles' callbacks runs on the event loop that :meth:`open` ran on (the actor's).
    """

    def __init__(self, start: Starter, answer: Answerer, router: Router) -> None:
        self._start = start
        self._answer = answer
        self._router = router
        self._token = secrets.token_bytes(32)
        self._servers: list[asyncio.AbstractServer] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._folder: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: list[tuple[asyncio.StreamWriter, int, str, str, Any]] = []
        self._done_lock = threading.Lock()

    async def open(self, ip: str) -> Address:
        self._loop = asyncio.get_running_loop()
        sweep_folders()
        self._folder = tempfile.mkdtemp(prefix=FOLDER_PREFIX)  # 0700: this user's only
        with open(os.path.join(self._folder, "pid"), "w") as f:
            f.write(str(os.getpid()))
        path = os.path.join(self._folder, "turns.sock")
        self._servers.append(await asyncio.start_unix_server(self._serve, path))
        try:
            tcp = await asyncio.start_server(self._serve, ip, 0)
        except OSError as exc:  # fronts on other hosts send their turns as Ray calls
            log.warning("turn channel: cannot listen on %s (%s); only on %s", ip, exc, path)
            return Address(socket.gethostname(), path, ip, 0, self._token)
        self._servers.append(tcp)
        port = int(tcp.sockets[0].getsockname()[1])
        return Address(socket.gethostname(), path, ip, port, self._token)

    async def close(self) -> None:
        """Write the answers of the calls that have ended, then close every connection and stop listening."""
        await asyncio.sleep(0)  # (answers handed over from other threads a moment ago)
        self._write_done()
        self._router.seal_all()  # (the events of the sessions the stop ended)
        for server in self._servers:
            server.close()
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
        self._servers.clear()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not hmac.compare_digest(await _read_frame(reader, len(self._token)), self._token):
                log.warning("turn channel: a connection without the shard's token, dropped")
                writer.close()
                return
            front_id, last = _decoder.decode(await _read_frame(reader, 4096))
            stream = self._router.stream(str(front_id))
            _widen(writer, socket.SO_SNDBUF)
            self._writers.add(writer)
            stream.attach(writer, int(last))
            try:
                while True:
                    request = _decoder.decode(await _read_frame(reader))
                    self._call(writer, front_id, request)
            finally:
                stream.detach(writer)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, msgspec.DecodeError):
            pass  # the front went away (or spoke nonsense)
        finally:
            self._writers.discard(writer)
            writer.close()

    def _call(self, writer: asyncio.StreamWriter, front_id: str, request: list[Any]) -> None:
        call_id, method, session_id, *arguments = request
        if method == SYNC:  # every call sent before it has started
            writer.write(_frame(_encoder.encode((call_id, True, None))))
            return
        if method == ACK:
            stream = self._router.streams.get(front_id)
            if stream is not None:
                stream.ack(int(arguments[0]))
            return
        if method in (SUBSCRIBE, UNSUBSCRIBE):
            try:
                if method == SUBSCRIBE:
                    key, sessions, types, children, bulk = arguments
                    self._router.subscribe(front_id, key, sessions, types, children, bulk)
                else:
                    self._router.unsubscribe(front_id, arguments[0])
                frame: tuple[Any, ...] = (call_id, True, None)
            except Exception as exc:
                frame = (call_id, False, _pickled(exc))
            writer.write(_frame(_encoder.encode(frame)))
            return
        try:
            handle = self._start(method, session_id, arguments)
        except Exception as exc:
            writer.write(_frame(_encoder.encode((call_id, False, _pickled(exc)))))
            return
        handle.add_done_callback(lambda h: self._ended(writer, call_id, method, session_id, h))

    def _ended(
        self, writer: asyncio.StreamWriter, call_id: int, method: str, session_id: str, handle: Any
    ) -> None:
        """A handle resolved (on whichever thread resolved it): its answer is written on the loop."""
        with self._done_lock:
            first = not self._done
            self._done.append((writer, call_id, method, session_id, handle))
        if first and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the shard is going away
                self._loop.call_soon_threadsafe(self._write_done)

    def _write_done(self) -> None:
        with self._done_lock:
            done, self._done = self._done, []
        for writer, call_id, method, session_id, handle in done:
            try:
                frame = (call_id, True, self._answer(method, session_id, handle.result(0)))
            except Exception as exc:
                frame = (call_id, False, _pickled(exc))
            if not writer.is_closing():
                writer.write(_frame(_encoder.encode(frame)))


# -- the front's end ------------------------------------------------------------------------------------------
Pushed = Callable[[bytes], None]
"""Takes a frame of events (its first byte :data:`~runtime.cluster._stream.PUSH`), on the front's loop."""


class TurnChannel:
    """The front's connection to one shard. :meth:`call` may be called from any thread; answers and
    events are delivered on the front's event loop, in the order the shard wrote them; ``on_break`` is
    called there once the connection has ended (after everything the shard wrote was read)."""

    def __init__(
        self,
        shard: str,
        loop: asyncio.AbstractEventLoop,
        on_push: Pushed | None = None,
        on_break: Callable[[TurnChannel], None] | None = None,
    ) -> None:
        self.shard = shard
        self._loop = loop
        self._on_push = on_push
        self._on_break = on_break
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Reply] = {}
        self._outbox: list[bytes] = []
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.closed = False

    def call(self, method: str, session_id: str, arguments: tuple[Any, ...], reply: Reply) -> bool:
        """Send a call; ``reply`` gets its answer. False (nothing sent) once the channel is closed."""
        with self._lock:
            if self.closed:
                return False
            call_id = next(self._ids)
            self._pending[call_id] = reply
            first = not self._outbox
            self._outbox.append(_frame(_encoder.encode((call_id, method, session_id, *arguments))))
        if first:
            self._loop.call_soon_threadsafe(self._flush)
        return True

    def notify(self, method: str, arguments: tuple[Any, ...]) -> None:
        """Send a message the shard does not answer (on the front's loop)."""
        with self._lock:
            if self.closed:
                return
            first = not self._outbox
            self._outbox.append(_frame(_encoder.encode((-1, method, "", *arguments))))
        if first:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        with self._lock:
            frames, self._outbox = self._outbox, []
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(b"".join(frames))

    def sync(self, timeout: float) -> bool:
        """Block (not on the front's loop) until every call sent before has started on the shard; False if
        the channel broke or the shard did not answer within ``timeout``. A Ray call made after it reaches
        the session after them, as it would have after Ray calls."""
        answered = threading.Event()
        broken: list[BaseException | None] = [None]

        def reply(_answer: Any, error: BaseException | None) -> None:
            broken[0] = error
            answered.set()

        if not self.call(SYNC, "", (), reply):
            return False
        return answered.wait(timeout) and broken[0] is None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await _read_frame(reader)
                if data[:1] == _PUSH:
                    if self._on_push is not None:
                        self._on_push(data)
                    continue
                call_id, ok, answer = _decoder.decode(data)
                with self._lock:
                    reply = self._pending.pop(call_id, None)
                if reply is None:
                    continue
                if ok:
                    reply(answer, None)
                else:
                    reply(None, pickle.loads(answer))  # from the shard this front started (token checked)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._break()

    def _break(self) -> None:
        with self._lock:
            self.closed = True
            pending, self._pending = self._pending, {}
        if self._writer is not None:
            self._writer.close()
        for reply in pending.values():
            reply(None, LOST)
        if self._on_break is not None:
            self._on_break(self)

    def close(self) -> None:
        """Stop reading (from any thread); calls still waiting are answered with :data:`LOST`. What the
        shard wrote and was not read yet is not read."""
        task = self._reader_task
        if task is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(task.cancel)

    async def ended(self, timeout: float) -> None:
        """Wait until the shard has closed its end (and every answer it wrote has been read)."""
        if self._reader_task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader_task), timeout)


async def connect(
    shard: str,
    address: Address,
    hello: tuple[str, int] = ("", 0),
    on_push: Pushed | None = None,
    on_break: Callable[[TurnChannel], None] | None = None,
    *,
    timeout: float = 10.0,
    tcp: bool = False,
) -> TurnChannel:
    """Open a shard's channel: its Unix socket from the same host (unless ``tcp``), else TCP to its node.
    ``hello``: this front's id and the last batch of events it received from the shard."""
    if not tcp and address.host == socket.gethostname() and os.path.exists(address.path):
        opening = asyncio.open_unix_connection(address.path, limit=READ_SIZE)
    elif not address.port:
        raise ConnectionError(f"{shard} listens on no TCP port")
    else:
        opening = asyncio.open_connection(address.ip, address.port, limit=READ_SIZE)
    reader, writer = await asyncio.wait_for(opening, timeout)
    _widen(writer, socket.SO_RCVBUF)
    if hasattr(writer.transport, "max_size"):  # (asyncio's selector transport: what one recv() takes)
        writer.transport.max_size = READ_SIZE
    writer.write(_frame(address.token) + _frame(_encoder.encode(list(hello))))
    channel = TurnChannel(shard, asyncio.get_running_loop(), on_push, on_break)
    channel._writer = writer
    channel._reader_task = asyncio.ensure_future(channel._read(reader))
    return channel


# -- the shards' socket folders ---------------------------------------------------------------------------
FOLDER_PREFIX = "agentcell-shard-"
"""A shard's folder in the temporary directory (0700): its Unix socket, and a file with its pid."""


def remove_folder(address: Address) -> None:
    """Remove a dead shard's socket folder (on this host; a shard's own stop removes it otherwise)."""
    folder = os.path.dirname(address.path)
    if (
        address.host == socket.gethostname()
        and os.path.basename(folder).startswith(FOLDER_PREFIX)
        and os.path.dirname(folder) == tempfile.gettempdir()
    ):
        shutil.rmtree(folder, ignore_errors=True)


def sweep_folders() -> None:
    """Remove the socket folders of this user's shards on this host whose process is gone (a shard killed
    while no front was there to clean up after it)."""
    root = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(FOLDER_PREFIX)]
    except OSError:
        return
    for name in names:
        folder = os.path.join(root, name)
        try:
            if os.stat(folder).st_uid != os.getuid():
                continue
            with open(os.path.join(folder, "pid")) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue  # not one of ours, or one being made right now (its pid is written next)
        if pid > 0 and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: alive
        return True
    return True
