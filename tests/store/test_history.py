"""Old history read back from the log through per-message offsets (issue 46): every page equals the same
slice of the whole user view (after compactions, overlays, visibility changes, branches and a resume),
and a deep page reads its own lines, not the log."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from runtime.messages import assistant, user
from runtime.store.entries import encode_entry, new_header
from runtime.store.history import HistoryPages, page_bounds
from runtime.store.log import load_tree
from runtime.store.tree import SessionTree


class Logged:
    """A session tree whose every entry is appended to a log file as the store would write it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = SessionTree(new_header("s", model="m"))
        path.write_bytes(encode_entry(self.tree.entries()[0]))

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        method = getattr(self.tree, name)

        def logged(*args, **kwargs):  # type: ignore[no-untyped-def]
            entry = method(*args, **kwargs)
            with open(self.path, "ab") as f:
                f.write(encode_entry(entry))
            return entry

        return logged


def grow(session: Logged, rng: random.Random, turns: int) -> None:
    for turn in range(turns):
        session.append(user(f"prompt {turn} " + "x" * rng.randrange(200)))
        answer = session.append(assistant(f"answer {turn}"))
        r = rng.random()
        if r < 0.1:
            path = [n for n in session.tree.path() if n.__class__.__name__ == "MessageEntry"]
            kept = path[len(path) // 2].id
            session.record_compaction(
                summary=assistant(f"summary at {turn}"), first_kept_id=kept, tokens_before=9, tokens_after=3
            )
        elif r < 0.2:
            archived = assistant(f"archived {turn}", id=answer.id, kind="tool_result_archived")
            session.overlay([msgspec.structs.replace(archived, agent_visible=False)])
        elif r < 0.3:
            session.set_visibility([answer.id], user_visible=False)


def pages_equal_the_whole_view(
    session_path: Path, pages: HistoryPages, history: str, rng: random.Random
) -> None:
    tree, _ = load_tree(session_path, repair=False)
    whole = tree.messages()
    total = len(whole)
    assert (
        pages.read("s", session_path, history=history, leaf_id=tree.leaf_id, before=total, lo=0, hi=total)
        == whole
    )
    for _ in range(40):
        offset, limit = rng.randrange(total), rng.randrange(1, 600)
        lo, hi = page_bounds(total, offset, limit)
        got = pages.read("s", session_path, history=history, leaf_id=tree.leaf_id, before=total, lo=lo, hi=hi)
        assert got == whole[lo:hi], (offset, limit)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pages_equal_the_whole_view_after_compactions_overlays_branches_and_a_resume(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    session = Logged(tmp_path / "s.jsonl")
    grow(session, rng, 400)
    pages = HistoryPages(page_size=64, max_messages=256)
    pages_equal_the_whole_view(session.path, pages, "h1", rng)
    # the session goes on: the same history's offsets are brought up to date, not built again
    grow(session, rng, 100)
    pages_equal_the_whole_view(session.path, pages, "h1", rng)
    assert (pages.scans, pages.extensions) == (1, 1)
    # a branch to an early message, and a new path from there: another history
    early = session.tree.path()[10].id
    session.branch(early)
    grow(session, rng, 150)
    pages_equal_the_whole_view(session.path, pages, "h2", rng)
    # a resume: a new reader of the same log (the store's history id is new after a replay)
    pages_equal_the_whole_view(session.path, HistoryPages(page_size=64), "h3", rng)


def test_a_deep_page_reads_its_own_lines_not_the_log(tmp_path: Path) -> None:
    session = Logged(tmp_path / "s.jsonl")
    grow(session, random.Random(5), 3000)
    tree, _ = load_tree(session.path, repair=False)
    whole, size = tree.messages(), session.path.stat().st_size
    pages = HistoryPages(page_size=64)
    read = lambda lo, hi: pages.read(  # noqa: E731
        "s", session.path, history="h", leaf_id=tree.leaf_id, before=len(whole), lo=lo, hi=hi
    )
    assert read(3000, 3050) == whole[3000:3050]  # the first read scans the log for the offsets
    pages.bytes_read = 0
    assert read(100, 150) == whole[100:150]  # a page deep in it: from its offsets
    assert pages.scans == 1
    assert 0 < pages.bytes_read < size / 20, (pages.bytes_read, size)


def test_offsets_are_bounded_and_go_with_their_session(tmp_path: Path) -> None:
    session = Logged(tmp_path / "s.jsonl")
    grow(session, random.Random(7), 200)
    tree, _ = load_tree(session.path, repair=False)
    total = len(tree.messages())
    pages = HistoryPages(page_size=64, max_offsets=total + 100)
    for history in ("a", "b", "c"):
        pages.read("s", session.path, history=history, leaf_id=tree.leaf_id, before=total, lo=0, hi=10)
    assert len(pages._offsets) == 1  # (each history's offsets near the bound: only the newest is kept)
    pages.forget("s")
    assert not pages._offsets and len(pages) == 0
