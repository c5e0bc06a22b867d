"""Compacting the sessions index (issue 47): dead lines go, every standing session stays findable by every
reader, in this process and in others holding byte offsets into the segment, and a kill -9 at any point of
a compaction loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import runtime.store.index as index_module
from runtime.store.entries import encode_entry, new_header
from runtime.store.index import INDEX_DIR, SessionIndex, encode_removed


def header_line(sid: str, parent: str | None = None) -> bytes:
    return encode_entry(new_header(sid, model="m", parent=(parent, "call", 1) if parent else None))


def add(index: SessionIndex, *sids: str, parent: str | None = None) -> None:
    index.append_now(b"".join(header_line(s, parent) for s in sids))


def remove(index: SessionIndex, *sids: str) -> None:
    lines = []
    for sid in sids:
        found = index.lookup(sid)
        assert found is not None, sid
        lines.append(encode_removed(sid, found[0].created_at))
    index.append_now(b"".join(lines))
    for sid in sids:
        index.forget(sid)


def segment_lines(root: Path, number: int) -> list[bytes]:
    return (root / INDEX_DIR / f"{number}.jsonl").read_bytes().splitlines()


def test_compaction_drops_dead_lines_and_readers_holding_offsets_still_find_everything(
    tmp_path: Path,
) -> None:
    owner = SessionIndex(tmp_path)
    owner.claim()
    add(owner, "parent", *(f"s{i}" for i in range(40)))
    add(owner, "child", parent="parent")
    remove(owner, *(f"s{i}" for i in range(0, 40, 2)))
    reader = SessionIndex(tmp_path)  # another process's view: byte offsets into the old segment
    assert len(reader.ids()) == 22
    before = len(segment_lines(tmp_path, 0))

    done = owner.compact()

    assert done is not None and (done.lines_before, done.lines_after) == (before, 22) == (62, 22)
    assert len(segment_lines(tmp_path, 0)) == 22
    expected = {"parent", "child", *(f"s{i}" for i in range(1, 40, 2))}
    for index in (reader, owner, SessionIndex(tmp_path)):
        assert set(index.ids()) == expected
        for sid in expected:
            found = index.lookup(sid)
            assert found is not None and found[0].session_id == sid
        assert index.lookup("s0") is None
        assert index.children("parent") == ["child"]
        assert {h.session_id for h in index.headers()} == expected
    assert owner.compact() is None  # nothing dead left
    add(owner, "after")  # the owner appends to the new segment
    assert reader.lookup("after") is not None


def test_a_removal_stays_while_another_segment_holds_its_header(tmp_path: Path) -> None:
    first, second = SessionIndex(tmp_path), SessionIndex(tmp_path)
    first.claim()
    add(first, "x", "y")
    assert second.claim().endswith("1.jsonl")
    add(second, "z")
    remove(second, "x", "z")  # the removal of x goes to segment 1, x's header is in segment 0

    done = second.compact()
    assert done is not None and done.removals_kept == 1  # z and its removal went; x's removal stays
    assert SessionIndex(tmp_path).ids() == ["y"]
    done = first.compact()
    assert done is not None and done.lines_after == 1  # x's header goes: a removal of it stands elsewhere
    done = second.compact()
    assert done is not None and done.lines_after == 0  # and now its removal cancels nothing
    assert SessionIndex(tmp_path).ids() == ["y"]


def test_a_compacted_segment_stays_its_owners(tmp_path: Path) -> None:
    """The owner's lock moves to the new file: another process claims a segment of its own, not this one
    (its descriptor on the old file held a lock on nothing)."""
    owner = SessionIndex(tmp_path)
    owner.claim()
    add(owner, "a", "b")
    remove(owner, "a")
    stale = os.open(tmp_path / INDEX_DIR / "0.jsonl", os.O_RDONLY)  # opened before the rename
    try:
        assert owner.compact() is not None
        assert SessionIndex(tmp_path).claim().endswith("1.jsonl")
    finally:
        os.close(stale)


def test_a_segment_nobody_holds_is_compacted_by_whoever_asks(tmp_path: Path) -> None:
    busy = SessionIndex(tmp_path)
    busy.claim()  # segment 0, held by a running process
    add(busy, "x")
    remove(busy, "x")
    gone = SessionIndex(tmp_path)
    add(gone, "a", "b", "c")  # segment 1 (append_now claims it and lets it go)
    remove(gone, "a", "b")
    asker = SessionIndex(tmp_path)
    assert asker.compact(0) is None  # held
    done = asker.compact(1)
    assert done is not None and (done.lines_before, done.lines_after) == (5, 1)
    assert asker.ids() == ["c"] and SessionIndex(tmp_path).ids() == ["c"]
    assert SessionIndex(tmp_path).claim().endswith("1.jsonl")  # and it is free again


@pytest.mark.slow
def test_a_runtime_compacts_its_segment_as_sessions_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions started and deleted for ever (the Responses door's stateless ones): the index stays small."""
    from runtime import Runtime

    monkeypatch.setattr(index_module, "COMPACT_MIN_DEAD", 20)  # (1,024 by default: fewer turns here)
    with Runtime(sessions_dir=tmp_path) as rt:
        keep = rt.start_session("kept", model="m")
        for i in range(80):
            rt.delete_session(rt.start_session(f"gone-{i}", model="m"))
        assert [i.id for i in rt.list_sessions()] == [keep]
    lines = segment_lines(tmp_path, 0)
    assert len(lines) <= 2 * 20 + 1, len(lines)  # 161 without compaction
    assert SessionIndex(tmp_path).ids() == ["kept"]


def test_segments_of_processes_gone_are_compacted_by_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module, "COMPACT_MIN_DEAD", 1 << 30)  # (nothing compacts on its own here)
    gone = SessionIndex(tmp_path)
    gone.claim()  # a runtime's segment 0, then the runtime goes
    add(gone, "a", *(f"dead-{i}" for i in range(30)))
    remove(gone, *(f"dead-{i}" for i in range(30)))
    gone.release()
    runtime = SessionIndex(tmp_path)
    runtime.claim()  # takes segment 0 (the first free one): its own now, not idle
    other = SessionIndex(tmp_path)
    other.claim()  # segment 1
    add(other, "b", *(f"dead-b{i}" for i in range(30)))
    remove(other, *(f"dead-b{i}" for i in range(30)))
    other.release()
    monkeypatch.setattr(index_module, "COMPACT_MIN_DEAD", 10)
    done = runtime.compact_idle()
    assert [(d.segment, d.lines_after) for d in done] == [(1, 1)]  # segment 0 is the runtime's own
    assert len(segment_lines(tmp_path, 0)) == 61 and len(segment_lines(tmp_path, 1)) == 1
    assert sorted(SessionIndex(tmp_path).ids()) == ["a", "b"]


def test_a_process_without_a_runtime_compacts_the_segment_it_deletes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentcell sessions delete`` (no log writer): each deletion appends a removal to a segment it
    claims for the moment; the segment is compacted there once its dead lines outnumber its live ones."""
    monkeypatch.setattr(index_module, "COMPACT_MIN_DEAD", 10)
    add(SessionIndex(tmp_path), "kept", *(f"gone-{i}" for i in range(40)))
    for i in range(40):
        remove(SessionIndex(tmp_path), f"gone-{i}")  # a process of its own each time
    assert len(segment_lines(tmp_path, 0)) <= 2 * 10 + 1  # 81 lines without compaction
    assert SessionIndex(tmp_path).ids() == ["kept"]


READER = textwrap.dedent(
    """
    import json, os, sys, time
    from runtime.store.index import SessionIndex

    root, live, stop, progress = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    index = SessionIndex(__import__("pathlib").Path(root))
    rounds = errors = inodes = 0
    seen = None
    first_error = None
    while not os.path.exists(stop) or rounds < 3:
        try:
            ids = set(index.ids())
            for sid in live:
                found = index.lookup(sid)
                if found is None or found[0].session_id != sid or sid not in ids:
                    errors += 1
                    first_error = first_error or f"{sid} missing"
            if {h.session_id for h in index.headers()} < set(live):
                errors += 1
                first_error = first_error or "headers() lost one"
        except Exception as exc:
            errors += 1
            first_error = first_error or repr(exc)
        inode = os.stat(os.path.join(root, "index", "0.jsonl")).st_ino
        inodes += inode != seen
        seen = inode
        rounds += 1
        with open(progress, "w") as f:
            f.write(str(rounds))
    print(json.dumps({"rounds": rounds, "errors": errors, "first_error": first_error, "inodes": inodes}))
    """
)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.mark.slow
def test_a_reader_in_another_process_never_misses_a_session_while_the_index_is_compacted(
    tmp_path: Path,
) -> None:
    owner = SessionIndex(tmp_path)
    owner.claim()
    live = [f"live-{i}" for i in range(30)]
    add(owner, *live[:15])
    add(owner, *(f"dead-{i}" for i in range(100)))
    add(owner, *live[15:])  # live headers after dead ones: their offsets move in a compaction
    remove(owner, *(f"dead-{i}" for i in range(100)))
    stop, progress = tmp_path / "stop", tmp_path / "progress"

    def rounds_read() -> int:
        try:
            return int(progress.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def wait_for_a_round(after: int) -> None:  # (the reader reads between two compactions, however slow)
        deadline = time.monotonic() + 60
        while rounds_read() <= after:
            assert reader.poll() is None and time.monotonic() < deadline, "the reader stopped reading"
            time.sleep(0.002)

    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(tmp_path), ",".join(live), str(stop), str(progress)],
        stdout=subprocess.PIPE,
        env=child_env(),
    )
    try:
        wait_for_a_round(0)
        for round_ in range(30):
            churn = [f"churn-{round_}-{i}" for i in range(100)]
            add(owner, *churn)
            remove(owner, *churn)
            seen = rounds_read()
            assert owner.compact() is not None
            wait_for_a_round(seen)
        stop.touch()
        out, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
    result = json.loads(out)
    assert result["errors"] == 0, result
    assert result["rounds"] > 30 and result["inodes"] > 10, result  # it read across the compactions
    assert len(segment_lines(tmp_path, 0)) == 30


KILLED = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import runtime.store.index as index_module

    root, point = Path(sys.argv[1]), sys.argv[2]
    real_replace, real_fsync_dir = index_module._replace, index_module.fsync_dir

    def stop(where):
        (root / "reached").write_text(where)
        time.sleep(60)

    def replace(source, target):
        if point == "before-rename":
            stop(point)
        real_replace(source, target)
        if point == "after-rename":
            stop(point)

    index_module._replace = replace
    index = index_module.SessionIndex(root)
    while True:
        if point == "anywhere":
            (root / "reached").write_text(point)
        index.compact(0)
        if point != "anywhere":
            break
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before-rename", "after-rename", "anywhere"])
def test_kill_9_mid_compaction_loses_nothing(
    tmp_path: Path, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module, "COMPACT_MIN_DEAD", 1 << 30)  # (the deletions below compact nothing)
    index = SessionIndex(tmp_path)
    live = [f"live-{i}" for i in range(500)]
    add(index, *live[:250])
    dead = [f"dead-{i}" for i in range(3000)]
    add(index, *dead)
    add(index, *live[250:])
    remove(index, *dead)
    original = segment_lines(tmp_path, 0)
    for attempt in range(3 if point == "anywhere" else 1):
        (tmp_path / "reached").unlink(missing_ok=True)
        child = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), point], env=child_env())
        deadline = time.monotonic() + 60
        while not (tmp_path / "reached").exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.002 * attempt)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        after = SessionIndex(tmp_path)
        assert sorted(after.ids()) == sorted(live)
        assert all(after.lookup(sid) is not None for sid in live)
        lines = segment_lines(tmp_path, 0)
        assert lines == original or len(lines) == len(live)
    survivor = SessionIndex(tmp_path)
    survivor.claim()  # the killed process's lock went with it
    survivor.compact()
    assert len(segment_lines(tmp_path, 0)) == len(live)
    assert sorted(SessionIndex(tmp_path).ids()) == sorted(live)
