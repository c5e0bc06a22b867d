"""The sessions index and the sharded layout (issue 32), below the runtime.

A new session's header is a line in the index; the index survives a torn last line (skipped by readers,
cut and reported by the next process to claim the segment), a corrupt line elsewhere is an error naming it,
a deletion is a removal line, and two processes never write one segment.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from runtime.errors import SessionNotFound
from runtime.messages import user
from runtime.store.entries import encode_entry, new_header
from runtime.store.index import SessionIndex, encode_removed
from runtime.store.log import CorruptLogError, SessionLog
from runtime.store.sessions import SessionDirectory, shard_of
from runtime.store.tree import SessionTree
from runtime.store.writer import LogWriter


def header_line(sid: str, model: str = "m") -> bytes:
    return encode_entry(new_header(sid, model=model))


def test_headers_in_the_index_are_sessions(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    directory.index.append_now(header_line("a") + header_line("b", "other"))
    assert directory.exists("a") and directory.exists("b") and not directory.exists("c")
    assert directory.ids() == ["a", "b"]
    header = directory.read_header("b")
    assert header is not None and header.model == "other"
    assert [(i.id, i.messages, i.model, i.size) for i in directory.list()] == [
        ("a", 0, "m", 0),
        ("b", 0, "other", 0),
    ]
    assert not any(p.name.endswith(".jsonl") and p.parent != tmp_path / "index" for p in tmp_path.rglob("*"))
    with pytest.raises(SessionNotFound):
        directory.info("c")


def test_a_log_whose_first_line_is_still_on_its_way_is_listed_from_the_index(tmp_path: Path) -> None:
    """A session's log is created by its first write: read in between (empty, or a torn first line), the
    session is listed as the index has it, not as a log without a header."""
    directory = SessionDirectory(tmp_path)
    directory.index.append_now(header_line("a", "the-model"))
    log = directory.log_path("a")
    log.parent.mkdir(parents=True, exist_ok=True)
    for partial in (b"", header_line("a", "the-model")[:20]):
        log.write_bytes(partial)
        (info,) = directory.list()
        assert (info.id, info.model, info.error) == ("a", "the-model", None)
        assert directory.info("a") == info


def test_a_torn_last_line_is_skipped_by_readers_and_cut_by_the_next_owner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    SessionDirectory(tmp_path).index.append_now(header_line("kept"))
    segment = tmp_path / "index" / "0.jsonl"
    whole = segment.read_bytes()
    segment.write_bytes(whole + header_line("torn")[:40])  # a crash in the middle of an append
    reader = SessionDirectory(tmp_path)
    assert reader.ids() == ["kept"] and not reader.exists("torn")
    assert segment.read_bytes() != whole  # a reader leaves it alone: its owner may be writing it
    owner = SessionIndex(tmp_path)
    with caplog.at_level(logging.WARNING, logger="agentcell.store"):
        assert owner.claim() == os.fspath(segment)
    assert segment.read_bytes() == whole
    assert "torn last line of 40 bytes" in caplog.text
    owner.append_now(header_line("after"))
    assert SessionDirectory(tmp_path).ids() == ["after", "kept"]
    assert reader.ids() == ["after", "kept"]  # a reader that saw the torn line reads on from before it
    owner.release()


def test_a_corrupt_line_is_an_error_naming_it(tmp_path: Path) -> None:
    SessionDirectory(tmp_path).index.append_now(header_line("a") + b"garbage\n" + header_line("b"))
    with pytest.raises(CorruptLogError, match=r"0\.jsonl, line 2"):
        SessionDirectory(tmp_path).exists("b")


def test_a_removal_removes_that_header_and_not_a_later_one(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    directory.index.append_now(header_line("a") + header_line("b"))
    directory.delete("a")
    assert directory.ids() == ["b"] and not directory.exists("a")
    assert SessionDirectory(tmp_path).ids() == ["b"]  # as another process reads it
    with pytest.raises(SessionNotFound):
        directory.delete("a")
    directory.index.append_now(header_line("a", "again"))  # the same id started again
    fresh = SessionDirectory(tmp_path)
    assert fresh.ids() == ["a", "b"] and fresh.read_header("a").model == "again"  # type: ignore[union-attr]
    # A removal met before the header it removes (another segment, read first) still removes it.
    late = new_header("late", model="m")
    (tmp_path / "index" / "7.jsonl").write_bytes(encode_removed("late", late.created_at))
    directory.index.append_now(encode_entry(late))
    assert "late" not in SessionDirectory(tmp_path).ids()


def test_each_process_appends_to_its_own_segment(tmp_path: Path) -> None:
    first, second = SessionIndex(tmp_path), SessionIndex(tmp_path)  # two owners (flock is per open file)
    assert first.claim().endswith("0.jsonl") and second.claim().endswith("1.jsonl")
    first.append_now(header_line("x"))
    second.append_now(header_line("y"))
    assert sorted(SessionIndex(tmp_path).ids()) == ["x", "y"]
    first.release()
    assert SessionIndex(tmp_path).claim().endswith("0.jsonl")  # free again


def test_session_files_are_spread_over_two_levels_of_shard_folders(tmp_path: Path) -> None:
    directory = SessionDirectory(tmp_path)
    writer = LogWriter("never")  # (no fsync at close: the layout is what is tested here)
    try:
        sids = [f"s{i}" for i in range(1_000)]
        for sid in sids:
            SessionLog(directory.log_path(sid), writer).append(new_header(sid, model="m"))
        writer.flush()
    finally:
        writer.close()
    assert directory.log_path("s1") == tmp_path / shard_of("s1") / "s1.jsonl"
    assert directory.ids() == sorted(sids)
    widest = max(len(os.listdir(root)) for root, _dirs, _files in os.walk(tmp_path))
    assert widest <= 256  # 1,000 logs: at most a handful per folder, 256 shard folders at most per level
    assert max(len(files) for _root, _dirs, files in os.walk(tmp_path)) < 20


def test_flat_sessions_are_read_where_they_are_or_moved_into_shards(tmp_path: Path) -> None:
    tree = SessionTree(new_header("old", model="m"))
    entries = [tree.header, tree.append(user("hi"))]
    (tmp_path / "old.jsonl").write_bytes(b"".join(encode_entry(e) for e in entries))  # type: ignore[arg-type]
    (tmp_path / "old.events.jsonl").write_text("")
    (tmp_path / "old.artifacts").mkdir()
    (tmp_path / "old.artifacts" / "compaction-1-input.md").write_text("x")
    reader = SessionDirectory(tmp_path)  # (agentcell sessions: reads, moves nothing)
    assert reader.ids() == ["old"] and reader.log_path("old") == tmp_path / "old.jsonl"
    assert reader.info("old").messages == 1 and reader.last_compaction_number("old") == 1
    assert (tmp_path / "old.jsonl").exists()
    mover = SessionDirectory(tmp_path, migrate=True)  # (a runtime: moves them on first use)
    assert mover.log_path("old") == tmp_path / shard_of("old") / "old.jsonl"
    assert not (tmp_path / "old.jsonl").exists() and not (tmp_path / "old.artifacts").exists()
    assert mover.info("old").messages == 1 and mover.last_compaction_number("old") == 1
    assert mover.transcript_path("old").exists()
    assert SessionDirectory(tmp_path).ids() == ["old"]


def test_a_flat_session_open_in_a_live_process_stays_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "busy.jsonl").write_bytes(encode_entry(new_header("busy", model="m")))
    (tmp_path / "busy.lock").write_text(f"{os.getpid()}\nsome-other-host\n")  # held elsewhere
    mover = SessionDirectory(tmp_path, migrate=True)
    assert mover.log_path("busy") == tmp_path / "busy.jsonl"
    assert mover.ids() == ["busy"] and mover.exists("busy")


def test_the_index_knows_each_sessions_children(tmp_path: Path) -> None:
    """Issue 47: finding a session's sub-agents read every stored log; the index answers it."""
    directory = SessionDirectory(tmp_path)
    kid = lambda sid, parent: encode_entry(new_header(sid, model="m", parent=(parent, "call", 1)))  # noqa: E731
    directory.index.append_now(header_line("p") + kid("k1", "p") + kid("k2", "p") + kid("other", "q"))
    assert directory.children("p") == ["k1", "k2"] and directory.children("q") == ["other"]
    directory.delete("k1")
    assert directory.children("p") == ["k2"]
    assert SessionDirectory(tmp_path).children("p") == [
        "k2"
    ]  # a new reader: from the lines, removal included
    assert directory.children("k2") == []
