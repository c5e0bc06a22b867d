"""The JSONL log, the writer thread, the sessions directory and the transcript (design §2.3, 2.4, 9)."""

from __future__ import annotations

import errno
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime import events as ev
from runtime.errors import SessionLockedError, SessionNotFound
from runtime.ids import InvalidSessionId
from runtime.messages import user
from runtime.store.entries import MessageEntry, new_header, scrub_secrets
from runtime.store.log import CorruptLogError, SessionLog, load_tree, read_log
from runtime.store.sessions import SessionDirectory, shard_of
from runtime.store.transcript import TranscriptWriter, read_transcript
from runtime.store.tree import SessionTree
from runtime.store.writer import LogWriteError, LogWriter, WriterClosedError, default_max_open_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def writer() -> object:
    w = LogWriter("turn")
    yield w
    w.close()


def made(path: Path) -> Path:
    """``path``, its folder (a session's shard folder) created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_session(path: Path, writer: LogWriter, messages: int = 3) -> SessionTree:
    tree = SessionTree(new_header(path.stem, model="m"))
    for i in range(messages):
        tree.append(user(f"m{i}"))
    SessionLog(path, writer).append_many(tree.entries())
    writer.flush()
    return tree


# -- reading and recovery ---------------------------------------------------------------------------------


def test_torn_last_line_is_skipped_cut_off_and_reported(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.jsonl"
    tree = write_session(path, writer)
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b'{"type":"message","id":"half","par')
    entries, info = read_log(path)
    assert entries == tree.entries()
    assert info.torn and info.torn_bytes == 34 and info.torn_line == 5
    assert path.stat().st_size == good  # truncated, so the next append starts on a clean line
    SessionLog(path, writer).append(
        MessageEntry(id="n", parent_id=tree.leaf_id, message=user("next", id="n"))
    )
    writer.flush()
    replayed, again = load_tree(path)
    assert not again.torn
    assert replayed.context()[-1].text == "next"


def test_garbage_last_line_with_a_newline_counts_as_torn(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.jsonl"
    tree = write_session(path, writer)
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\n")  # what a power cut can leave behind
    entries, info = read_log(path, repair=False)
    assert entries == tree.entries()
    assert info.torn_bytes == 5 and info.torn_line == 5
    assert path.stat().st_size == info.valid_bytes + 5  # repair=False leaves the file alone


def test_corrupt_line_elsewhere_is_an_error_naming_file_and_line(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.jsonl"
    write_session(path, writer)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:20] + b"#" + lines[2][21:]
    path.write_bytes(b"\n".join(lines))
    size = path.stat().st_size
    with pytest.raises(CorruptLogError) as info:
        read_log(path)
    assert info.value.line == 3
    assert str(path) in str(info.value) and "line 3" in str(info.value)
    assert path.stat().st_size == size  # nothing is dropped


def test_a_well_formed_last_line_that_is_not_an_entry_is_not_treated_as_torn(
    tmp_path: Path, writer: LogWriter
) -> None:
    path = tmp_path / "s.jsonl"
    write_session(path, writer)
    with open(path, "ab") as f:
        f.write(b'{"type":"from_the_future","v":1}\n')
    with pytest.raises(CorruptLogError, match="line 5"):
        read_log(path)


def test_unknown_format_version_is_refused(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.jsonl"
    write_session(path, writer, messages=1)
    data = path.read_bytes().replace(b'"v":1}\n', b'"v":2}\n')
    path.write_bytes(data)
    with pytest.raises(CorruptLogError, match="format version 2"):
        read_log(path)


def test_an_entry_that_does_not_fit_the_tree_names_its_line(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.jsonl"
    tree = write_session(path, writer, messages=2)
    orphan = MessageEntry(id="o", parent_id="missing", message=user("o", id="o"))
    SessionLog(path, writer).append(orphan)
    writer.flush()
    assert len(read_log(path)[0]) == len(tree.entries()) + 1  # it decodes...
    with pytest.raises(CorruptLogError, match=r"line 4: parent 'missing'"):
        load_tree(path)  # ...but cannot be replayed


# -- the writer -------------------------------------------------------------------------------------------


def test_appends_from_many_threads_are_acknowledged_and_kept_in_order(
    tmp_path: Path, writer: LogWriter
) -> None:
    acks: list[Exception | None] = []
    lock = threading.Lock()

    def ack(error: Exception | None) -> None:
        with lock:
            acks.append(error)

    def produce(name: str) -> None:
        for i in range(500):
            writer.append(tmp_path / f"{name[0]}.log", f"{name} {i}\n".encode(), ack)

    threads = [threading.Thread(target=produce, args=(n,)) for n in ("a1", "a2", "b1", "b2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.flush()
    assert len(acks) == 2000 and not any(acks)
    for name in ("a1", "a2", "b1", "b2"):
        lines = (tmp_path / f"{name[0]}.log").read_text().splitlines()
        mine = [int(line.split()[1]) for line in lines if line.startswith(name + " ")]
        assert mine == list(range(500))
    assert writer.stats.batches < 2000  # lines that queue up are written together


@pytest.mark.parametrize(
    ("policy", "after_appends", "after_sync"),
    [("always", 5, 5), ("turn", 0, 1), ("never", 0, 0)],
)
def test_fsync_policy(tmp_path: Path, policy: str, after_appends: int, after_sync: int) -> None:
    w = LogWriter(policy)  # type: ignore[arg-type]
    try:
        path = tmp_path / "s.jsonl"
        for i in range(5):
            done = threading.Event()
            w.append(path, b"line %d\n" % i, lambda _error: done.set())  # noqa: B023 - waited on below
            assert done.wait(5)
        assert w.stats.fsyncs == after_appends
        w.sync(path)
        w.flush()
        assert w.stats.fsyncs == after_sync
    finally:
        w.close()


def test_a_failed_write_reaches_the_caller_and_blocks_the_file_until_reset(
    tmp_path: Path, writer: LogWriter
) -> None:
    path = tmp_path / "full.jsonl"
    path.symlink_to("/dev/full")  # every write fails with ENOSPC
    results: list[Exception | None] = []
    writer.append(path, b"first\n", results.append)
    writer.flush()
    writer.append(path, b"second\n", results.append)
    writer.flush()
    assert isinstance(results[0], OSError) and results[0].errno == errno.ENOSPC
    # /dev/full cannot be truncated back, so the file is refused rather than risk a gap in the log.
    assert isinstance(results[1], LogWriteError)
    writer.reset(path)
    writer.append(path, b"third\n", results.append)
    writer.flush()
    assert isinstance(results[2], OSError) and results[2].errno == errno.ENOSPC


def test_a_partial_write_is_undone_so_the_log_stays_readable(tmp_path: Path) -> None:
    # A child process with a 4 KB file-size limit: the write that crosses it is partial, then fails.
    path = tmp_path / "s.jsonl"
    script = f"""
import resource, signal, sys, threading
sys.path.insert(0, {str(ROOT)!r})
from runtime.messages import user
from runtime.store.entries import new_header, MessageEntry
from runtime.store.log import SessionLog
from runtime.store.writer import LogWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
w = LogWriter("never")
log = SessionLog({str(path)!r}, w)
results = []
def append(entry):
    done = threading.Event()
    log.append(entry, lambda e: (results.append(e), done.set()))
    done.wait()
append(new_header("s", model="m"))
parent = None
for i in range(60):  # one line at a time: the line that crosses the limit is written in part
    m = user("x" * 100, id=f"m{{i}}")
    append(MessageEntry(id=m.id, parent_id=parent, message=m))
    if results[-1] is None:
        parent = m.id
w.close()
failed = [e for e in results if e is not None]
print(len(results) - len(failed), failed[0].errno)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    written, error = out.stdout.split()
    assert int(error) == errno.EFBIG
    tree, info = load_tree(path)
    assert not info.torn
    assert len(tree) == int(written) - 1  # every acknowledged message, and nothing half-written


def test_open_files_are_bounded(tmp_path: Path) -> None:
    w = LogWriter("never", max_open_files=4)
    try:
        for round_ in range(3):
            for i in range(20):
                w.append(tmp_path / f"{i}.log", f"{round_}\n".encode())
            w.flush()
            assert w.open_files() <= 4
    finally:
        w.close()
    assert all((tmp_path / f"{i}.log").read_text() == "0\n1\n2\n" for i in range(20))


@pytest.mark.parametrize(
    ("soft_limit", "expected"), [(1024, 256), (20_000, 4_096), (100, 64), (resource.RLIM_INFINITY, 4_096)]
)
def test_the_open_file_bound_follows_the_descriptor_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, soft_limit: int, expected: int
) -> None:
    # 1,000 active sessions keep 2,000 files busy: where the process may open that many, keep them open.
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (soft_limit, resource.RLIM_INFINITY))
    assert default_max_open_files() == expected
    w = LogWriter("never")
    try:
        assert w.max_open_files == expected
    finally:
        w.close()


def test_close_drains_everything_queued_and_refuses_more(tmp_path: Path) -> None:
    w = LogWriter("turn")
    acks: list[Exception | None] = []
    for i in range(2000):
        w.append(tmp_path / "s.log", b"%d\n" % i, acks.append)
    w.close()
    assert len(acks) == 2000 and not any(acks)
    assert (tmp_path / "s.log").read_text().split() == [str(i) for i in range(2000)]
    with pytest.raises(WriterClosedError):
        w.append(tmp_path / "s.log", b"late\n")


def test_a_raising_callback_does_not_stop_the_writer(tmp_path: Path, writer: LogWriter) -> None:
    def boom(_: Exception | None) -> None:
        raise RuntimeError("callback bug")

    writer.append(tmp_path / "a.log", b"1\n", boom)
    done: list[Exception | None] = []
    writer.append(tmp_path / "a.log", b"2\n", done.append)
    writer.flush()
    assert done == [None]
    assert (tmp_path / "a.log").read_text() == "1\n2\n"


def test_append_from_takes_its_lines_when_its_turn_comes(tmp_path: Path) -> None:
    path = tmp_path / "s.events.jsonl"
    lines: list[bytes] = []
    gate = threading.Event()
    w = LogWriter()
    try:
        w.call(tmp_path / "other.log", lambda _: gate.wait(10))  # hold the writer thread
        lines.append(b"1\n")
        w.append_from(path, lambda _: b"".join(lines))
        lines.append(b"2\n")  # added after the operation was queued: still written by it
        w.append_from(tmp_path / "empty.jsonl", lambda _: b"")  # nothing to write: no file either
        gate.set()
        w.flush()
        assert path.read_bytes() == b"1\n2\n"
        assert not (tmp_path / "empty.jsonl").exists()
    finally:
        w.close()


def test_a_file_deleted_underneath_is_reopened_by_path(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.events.jsonl"
    writer.append(path, b"old session\n")
    writer.flush()
    path.unlink()  # the session is deleted, and a new one of the same id starts writing
    writer.append(path, b"new session\n")
    writer.flush()
    assert path.read_text() == "new session\n"


def test_a_file_replaced_underneath_is_reopened_by_path(tmp_path: Path, writer: LogWriter) -> None:
    path = tmp_path / "s.jsonl"
    writer.append(path, b"old\n")
    writer.flush()
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"restored\n")
    os.replace(replacement, path)  # e.g. restored from a backup while the writer holds the old file open
    writer.append(path, b"new\n")
    writer.flush()
    assert path.read_bytes() == b"restored\nnew\n"


def test_lazy_lines_wait_for_a_wake_up_that_is_due_anyway(tmp_path: Path) -> None:
    w = LogWriter("turn", lazy_delay=30.0)
    try:
        lazy, other = tmp_path / "lazy.jsonl", tmp_path / "other.jsonl"
        w.append_from(lazy, lambda _: b"lazy line\n", lazy=True)
        time.sleep(0.3)
        assert not lazy.exists(), "a lazy operation alone does not wake the writer"
        written = threading.Event()
        w.append(other, b"urgent\n", lambda _error: written.set())
        assert written.wait(10)
        assert lazy.read_bytes() == b"lazy line\n", "it went with the next operation that woke the writer"
    finally:
        w.close()


def test_lazy_lines_are_written_after_the_lazy_delay_on_their_own(tmp_path: Path) -> None:
    w = LogWriter("turn", lazy_delay=0.05)
    try:
        lazy = tmp_path / "lazy.jsonl"
        done = threading.Event()
        w.append_from(lazy, lambda _: b"lazy line\n", lambda _error: done.set(), lazy=True)
        assert done.wait(10), "no other operation came: the writer took it after its delay"
        assert lazy.read_bytes() == b"lazy line\n"
    finally:
        w.close()
    with pytest.raises(ValueError, match="lazy_delay"):
        LogWriter("turn", lazy_delay=0)


def test_write_file_creates_the_folder_and_replaces_whole_files(tmp_path: Path, writer: LogWriter) -> None:
    target = tmp_path / "s.artifacts" / "compaction-1-input.md"
    writer.write_file(target, b"first version, long")
    writer.write_file(target, b"second")
    writer.flush()
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == [target.name]


# -- the sessions directory -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../escape", "a/b", "..", "", "/abs", "a\\b", "x\x00"])
def test_every_path_rejects_a_bad_session_id(tmp_path: Path, bad: str) -> None:
    directory = SessionDirectory(tmp_path)
    for method in (directory.log_path, directory.transcript_path, directory.lock_path, directory.spill_dir):
        with pytest.raises(InvalidSessionId):
            method(bad)
    with pytest.raises(InvalidSessionId):
        directory.delete(bad)


def test_artifact_names_must_be_plain(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    shard = tmp_path / shard_of("s")
    assert directory.compaction_artifacts("s", 2)[1] == shard / "s.artifacts" / "compaction-2-summary.md"
    for bad in ("../x.md", "a/b.md", "..", ""):
        with pytest.raises(ValueError):
            directory.artifact_path("s", bad)


def test_list_summarizes_each_session(tmp_path: Path, writer: LogWriter) -> None:
    directory = SessionDirectory(tmp_path)
    tree = write_session(directory.log_path("alpha"), writer, messages=4)
    log = SessionLog(directory.log_path("alpha"), writer)
    log.append(tree.set_metadata("model", "bigger"))
    write_session(directory.log_path("beta"), writer, messages=1)
    directory.transcript_path("beta").write_text("")  # a transcript is not a session
    made(directory.log_path("broken")).write_text('{"type":"message"}\n')
    writer.flush()
    infos = {i.id: i for i in directory.list()}
    assert set(infos) == {"alpha", "beta", "broken"}
    assert (infos["alpha"].messages, infos["alpha"].model) == (4, "bigger")
    assert (infos["beta"].messages, infos["beta"].model) == (1, "m")
    assert infos["alpha"].size == directory.log_path("alpha").stat().st_size
    assert infos["alpha"].created_at == tree.header.created_at  # type: ignore[union-attr]
    assert infos["broken"].error is not None and infos["alpha"].error is None
    assert directory.read_header("beta") is not None and directory.read_header("nobody") is None


def test_delete_removes_every_file_of_the_session(tmp_path: Path, writer: LogWriter) -> None:
    directory = SessionDirectory(tmp_path)
    write_session(directory.log_path("s"), writer)
    write_session(directory.log_path("other"), writer)
    directory.transcript_path("s").write_text("{}\n")
    directory.artifacts_dir("s").mkdir()
    directory.artifact_path("s", "compaction-1-input.md").write_text("x")
    directory.spill_dir("s").mkdir()
    (directory.spill_dir("s") / "out.txt").write_text("x")
    directory.delete("s")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [".agentcell.lock", "other.jsonl"]
    assert not directory.exists("s") and directory.exists("other")
    with pytest.raises(SessionNotFound):
        directory.delete("s")


def test_a_session_cannot_be_locked_twice_or_deleted_while_open(tmp_path: Path, writer: LogWriter) -> None:
    directory = SessionDirectory(tmp_path)
    write_session(directory.log_path("s"), writer)
    lock = directory.lock("s")
    assert directory.lock_path("s").read_text().split()[:2] == [str(os.getpid()), socket.gethostname()]
    with pytest.raises(SessionLockedError, match="this process") as info:
        directory.lock("s")
    assert info.value.held_by_this_process
    with pytest.raises(SessionLockedError):
        directory.delete("s")
    lock.release()
    assert not directory.lock_path("s").exists()
    with directory.lock("s"):
        pass


def test_a_live_lock_in_another_process_is_refused_and_a_dead_one_taken_over(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    script = (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
        "from runtime.store.sessions import SessionDirectory\n"
        f"lock = SessionDirectory({str(tmp_path)!r}).lock('s')\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with pytest.raises(SessionLockedError, match=f"pid {child.pid}") as info:
            directory.lock("s")
        assert info.value.owner_pid == child.pid
        child.send_signal(signal.SIGKILL)
        wait_for_zombie(child.pid)  # not reaped yet: its pid still exists
        assert directory.lock_path("s").exists()  # left behind by the killed process...
        with directory.lock("s") as lock:  # ...and recognised as stale
            assert lock.held
            assert directory.lock_path("s").read_text().split()[0] == str(os.getpid())
    finally:
        child.kill()
        child.wait()


def wait_for_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_lock_whose_pid_now_belongs_to_another_process_is_stale(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    directory.ensure()
    # Our own pid, but a start time that is not ours: the process that wrote it is gone, the pid reused.
    made(directory.lock_path("s")).write_text(f"{os.getpid()}\n{socket.gethostname()}\n1\nold-token\n")
    with directory.lock("s") as lock:
        assert lock.owner.token != "old-token"


def test_a_lock_from_another_host_is_not_taken_over(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    made(directory.lock_path("s")).write_text("4242\nsome-other-machine\n")
    with pytest.raises(SessionLockedError, match="pid 4242 on some-other-machine"):
        directory.lock("s")


def test_headers_never_hold_credentials() -> None:
    overrides = {
        "api_key": "sk-1",
        "compaction": {"max_tokens": 5, "reserve_tokens": 1},
        "server": {"token": "t"},
    }
    header = new_header("s", model="m", config={**overrides, "OPENAI_API_KEY": "sk-2", "client_secret": "x"})
    assert header.config == {"compaction": {"max_tokens": 5, "reserve_tokens": 1}, "server": {}}
    assert scrub_secrets({"nested": {"password": "p", "keep": 1}}) == {"nested": {"keep": 1}}


# -- the transcript ---------------------------------------------------------------------------------------


def test_transcript_sink_writes_each_sessions_events_and_reads_them_back(
    tmp_path: Path, writer: LogWriter
) -> None:
    directory = SessionDirectory(tmp_path)
    sink = TranscriptWriter(directory, writer, exclude={"text_delta"})
    for seq in range(1, 6):
        sink(ev.MessageAppended(session_id="a", seq=seq, message_id=f"m{seq}", role="user"))
        sink(ev.TextDelta(session_id="a", seq=100 + seq, turn_id="t", delta="x"))
    sink(ev.AgentStart(session_id="b", seq=1, turn_id="t"))
    sink(ev.ErrorOccurred(session_id="../escape", message="not a session"))  # ignored: no file to name
    writer.flush()
    events = read_transcript(directory.transcript_path("a"))
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.seq for e in read_transcript(directory.transcript_path("a"), after_seq=3)] == [4, 5]
    assert [e.type for e in read_transcript(directory.transcript_path("b"))] == ["agent_start"]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.events.jsonl", "b.events.jsonl"]


def test_a_burst_of_events_costs_the_writer_a_few_operations(tmp_path: Path, writer: LogWriter) -> None:
    directory = SessionDirectory(tmp_path)
    sink = TranscriptWriter(directory, writer)
    gate = threading.Event()
    writer.call(tmp_path / "other.log", lambda _: gate.wait(10))  # the writer is busy meanwhile
    before = writer.stats.operations
    for seq in range(1, 2_001):
        sink(ev.TextDelta(session_id="a" if seq % 2 else "b", seq=seq, turn_id="t", delta="x"))
    gate.set()
    writer.flush()
    assert [e.seq for e in read_transcript(directory.transcript_path("a"))] == list(range(1, 2_001, 2))
    assert [e.seq for e in read_transcript(directory.transcript_path("b"))] == list(range(2, 2_001, 2))
    # Lines waiting for the writer join the operation already queued for their session.
    assert writer.stats.operations - before <= 6  # per session: its torn-tail check and one append


def test_transcript_recovers_from_a_torn_line(tmp_path: Path, writer: LogWriter) -> None:
    directory = SessionDirectory(tmp_path)
    path = made(directory.transcript_path("a"))
    path.write_bytes(ev.encode_event(ev.AgentStart(session_id="a", seq=1, turn_id="t")) + b'\n{"type":"age')
    assert [e.seq for e in read_transcript(path)] == [1]  # a torn last line is skipped when reading
    sink = TranscriptWriter(directory, writer)
    sink(ev.AgentStart(session_id="a", seq=2, turn_id="t"))  # and cut off before the next append
    writer.flush()
    assert [e.seq for e in read_transcript(path)] == [1, 2]
    path.write_bytes(b"garbage\n" + path.read_bytes())
    with pytest.raises(CorruptLogError, match="line 1"):
        read_transcript(path)
