"""A session's log on a disk that fills up (issue 47 item 13): the turn whose write fails ends with a clear
``persistence_failed`` error; new prompts get a :class:`SessionError` naming the cause while the log cannot
be written; once there is space again the session takes prompts, with no restart; no pykka exception ever
reaches a caller; nothing acknowledged is lost.

On a real small filesystem (a tmpfs mount) where the machine allows mounting; elsewhere the log writer and
the probe beside the log fail on purpose while the "disk" is full.

Before: after the first failures every ``rt.prompt`` raised pykka's ``ActorDeadError`` (and one prompt's
handle never resolved), or the session took each new prompt only to fail it on the disk.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime, SessionError
from runtime.config import Config
from runtime.provider.script import Turn
from runtime.store.sessions import SessionDirectory, SessionLock
from tests.reliability.support import check_log

_names = itertools.count(1)
PROMPT = "a long prompt " * 1_500  # ~20 KB, as in the run


class SmallDisk:
    """A folder on a small filesystem that can be filled and freed again."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self) -> None:
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError

    def top_up(self) -> None:
        """Take whatever space was freed since :meth:`fill` (as other writers to a busy disk do)."""


class Tmpfs(SmallDisk):
    """A 2 MB tmpfs: ``fill`` writes a file until the disk is full, ``free`` removes it."""

    def fill(self) -> None:
        block = b"\0" * 4096
        with (self.path / "filler").open("wb", buffering=0) as fh, contextlib.suppress(OSError):
            while True:
                fh.write(block)
        with contextlib.suppress(OSError), (self.path / "filler-tail").open("wb", buffering=0) as fh:
            while True:
                fh.write(b"\0")

    def top_up(self) -> None:
        with contextlib.suppress(OSError), (self.path / "filler-tail").open("ab", buffering=0) as fh:
            while True:
                fh.write(b"\0")

    def free(self) -> None:
        for name in ("filler", "filler-tail"):
            (self.path / name).unlink(missing_ok=True)


class FailingWrites(SmallDisk):
    """No mount allowed: the log writer's writes (and the probe beside the log) fail with ENOSPC while full,
    after writing part of the data, as a real full disk can."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from runtime import _delivery
        from runtime.store import session_lock, writer

        super().__init__(path)
        self.full = False
        real_write, real_probe, real_owner = writer._write_all, _delivery._writable, session_lock._write_owner

        def write_all(fd: int, data: bytes) -> None:
            if not self.full:
                real_write(fd, data)
                return
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def write_owner(fd: int, data: bytes) -> None:
            if not self.full:
                real_owner(fd, data)
                return
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(writer, "_write_all", write_all)
        monkeypatch.setattr(session_lock, "_write_owner", write_owner)
        monkeypatch.setattr(
            _delivery, "_writable", lambda folder, size: not self.full and real_probe(folder, size)
        )

    def fill(self) -> None:
        self.full = True

    def free(self) -> None:
        self.full = False


def _mount(path: Path) -> bool:
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SmallDisk]:
    path = tmp_path / "small"
    path.mkdir()
    if not _mount(path):
        yield FailingWrites(path, monkeypatch)
        return
    try:
        yield Tmpfs(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _config() -> Config:
    return Config().with_overrides({"retry.base_delay": 0.01, "persistence.hibernate_after": None})


def test_a_full_disk_fails_the_turn_then_refuses_prompts_by_name_and_recovers_without_a_restart(
    disk: SmallDisk, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"disk-full-{next(_names)}"
    provider.add_script(name, [Turn(text="noted")], loop=True)
    sessions = disk.path / "sessions"
    with Runtime(_config(), sessions_dir=sessions) as rt:
        sid = rt.start_session(model=f"openai/{name}", api_base=provider.url, api_key="sk-local")
        for i in range(3):
            assert rt.prompt(sid, f"before {i}").result(timeout=30).status == "ok"
        acknowledged = [m.text for m in rt.messages(sid)]
        errors: list[Any] = []
        rt.subscribe(sid, ["error"], callback=errors.append)

        disk.fill()
        real_release = SessionLock.release

        def release(lock: SessionLock) -> None:  # the space a deleted lock file frees goes to other writers
            real_release(lock)
            disk.top_up()

        monkeypatch.setattr(SessionLock, "release", release)
        failed = rt.prompt(sid, PROMPT).result(timeout=30)  # the handle resolves: no 60 s wait
        assert failed.status == "error" and failed.error is not None
        assert failed.error.startswith("persistence_failed") and "No space left" in failed.error
        for _ in range(3):  # while the log cannot be written: a clear SessionError, never ActorDeadError
            with pytest.raises(SessionError, match=r"cannot write its log .*No space left on device"):
                rt.prompt(sid, PROMPT)
        assert [m.text for m in rt.messages(sid)] == acknowledged  # reads still work
        time.sleep(0.5)
        # The store stays up while the disk is full: a failed write restarts it once, and the restarted
        # store keeps the session's lock (before, re-creating the lock file failed on the full disk, and the
        # store was restarted over and over until its supervisor gave up, again and again).
        assert [e.message for e in errors if e.code == "store_open"] == []
        assert SessionDirectory(sessions).lock_path(sid).stat().st_size > 0  # never an empty lock file

        monkeypatch.setattr(SessionLock, "release", real_release)
        disk.free()
        after = rt.prompt(sid, "after").result(timeout=30)  # the same runtime, no restart
        assert after.status == "ok", after.error
        texts = [m.text for m in rt.messages(sid)]
    assert texts == [*acknowledged, "after", "noted"]
    check = check_log(SessionDirectory(sessions), sid)
    assert not check.problems  # a half-written line was cut back
    assert [m.text for m in check.tree.messages()] == texts  # nothing acknowledged lost


def test_a_session_lock_that_cannot_be_written_on_a_full_disk_leaves_no_lock_file(disk: SmallDisk) -> None:
    """Taking a session's lock creates its lock file and writes its owner there: on a full disk the write
    fails (ENOSPC, said as such) and the file it created is removed, not left empty; once there is space the
    lock is taken as usual (before, an empty lock file stayed behind)."""
    directory = SessionDirectory(disk.path / "sessions")
    path = directory.lock_path("full-disk-lock")
    path.parent.mkdir(parents=True)
    disk.fill()
    try:
        with pytest.raises(OSError) as refused:
            directory.lock("full-disk-lock")
        assert refused.value.errno == errno.ENOSPC
        assert not path.exists()
    finally:
        disk.free()
    with directory.lock("full-disk-lock"):
        assert path.stat().st_size > 0
    assert not path.exists()
    directory.close()


def test_no_pykka_exception_reaches_a_caller_while_actors_restart(
    rt: Any, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor being restarted by its supervisor raises pykka's ActorDeadError to whoever tells it: the
    public API waits a moment for the restart, then raises its own SessionError (a timeout: TimeoutError)."""
    import pykka

    from actors.session import Session

    name = f"restarting-{next(_names)}"
    provider.add_script(name, [Turn(text="noted")], loop=True)
    sid = rt.start_session(model=f"openai/{name}", api_base=provider.url, api_key="sk-local")
    real_tell = Session.tell
    refused: list[object] = []

    def restarting(self: Session, message: Any) -> None:
        if len(refused) < 3:  # the first few tries find the agent gone; then it is back
            refused.append(message)
            raise pykka.ActorDeadError("Agent (urn:uuid:...) not found")
        real_tell(self, message)

    monkeypatch.setattr(Session, "tell", restarting)
    assert rt.prompt(sid, "hello").result(timeout=30).status == "ok"
    assert len(refused) == 3

    def gone(self: Session, message: Any, *args: Any) -> Any:
        raise pykka.ActorDeadError("Agent (urn:uuid:...) not found")

    monkeypatch.setattr(Session, "tell", gone)
    monkeypatch.setattr(Session, "ask", gone)
    for call in (lambda: rt.prompt(sid, "again"), lambda: rt.abort(sid), lambda: rt.messages(sid)):
        with pytest.raises(SessionError, match="being restarted"):
            call()

    def slow(self: Session, message: Any, timeout: float) -> Any:
        raise pykka.Timeout("no answer")

    monkeypatch.setattr(Session, "ask", slow)
    with pytest.raises(TimeoutError, match="did not answer"):
        rt.usage(sid)


def test_a_prompt_left_in_a_stopped_agents_inbox_resolves_its_handle() -> None:
    """What the mailbox tells a prompt it dropped (runtime/actor/_mailbox.py): its handle resolves, with why
    (before, such a handle never resolved: the issue's 60 s timeout)."""
    from actors.protocol import Abort, Compact, Prompt
    from runtime.handles import CompactionResult, Handle, PromptHandle
    from runtime.messages import user

    handle = PromptHandle("p1")
    Prompt(user("hello"), handle).undelivered("Agent stopped before handling the message")
    result = handle.result(timeout=0)
    assert result.status == "error" and result.error is not None and "send it again" in result.error
    aborted: Handle[bool] = Handle("a1")
    Abort(aborted).undelivered("stopped")
    assert aborted.result(timeout=0) is False
    compacted: Handle[CompactionResult] = Handle("c1")
    Compact(handle=compacted).undelivered("stopped")
    assert not compacted.result(timeout=0).compacted
