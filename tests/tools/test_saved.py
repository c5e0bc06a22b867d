"""``read_saved`` (runtime.tools.saved): the session's saved outputs, read-only, by id, in parts."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from runtime.context.tool_output import limit_output
from runtime.tools.builtin import builtin_registry
from runtime.tools.registry import ToolContext, ToolError
from runtime.tools.workspace import Workspace


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    (tmp_path / "ws").mkdir()
    spill, artifacts = tmp_path / "s.spill", tmp_path / "s.artifacts"
    spill.mkdir()
    artifacts.mkdir()
    return ToolContext(
        workspace=Workspace(tmp_path / "ws"), call_id="c1", logs_dir=spill, saved_dirs=(spill, artifacts)
    )


def read(ctx: ToolContext, **args: object) -> str:
    result = builtin_registry()["read_saved"].invoke(args, ctx)
    assert isinstance(result, str)
    return result


def test_a_saved_output_is_read_in_parts_by_the_id_the_notice_names(ctx: ToolContext) -> None:
    text = "".join(f"row {i}\n" for i in range(1, 50_001))
    limited = limit_output(text, spill_dir=ctx.saved_dirs[0], label="grep", reader="read_saved")
    assert limited.spill is not None
    name = limited.spill.file_name
    assert f'read it in parts with read_saved(id="{name}", offset=21, limit=200)' in limited.text
    limited.spill.path.write_text(text)
    part = read(ctx, id=name, offset=21, limit=3)
    assert part.splitlines() == [
        "    21\trow 21",
        "    22\trow 22",
        "    23\trow 23",
        "[lines 21-23 of 50,000; continue with offset=24]",
    ]
    assert read(ctx, id=name, offset=49_999, limit=10).splitlines() == [
        " 49999\trow 49999",
        " 50000\trow 50000",
    ]


def test_artifacts_are_read_too_and_an_unknown_id_lists_what_there_is(ctx: ToolContext) -> None:
    (ctx.saved_dirs[1] / "compaction-1-summary.md").write_text("## Goal\nship it\n")
    assert read(ctx, id="compaction-1-summary.md") == "     1\t## Goal\n     2\tship it"
    with pytest.raises(ToolError, match=r"no saved output 'nope.txt'; saved: compaction-1-summary.md"):
        read(ctx, id="nope.txt")


@pytest.mark.parametrize("bad", ["../s.spill/x", "/etc/passwd", "..", ".hidden", "a/b", ""])
def test_an_id_that_is_no_plain_name_is_refused(ctx: ToolContext, bad: str) -> None:
    with pytest.raises(ToolError, match="not the id of a saved output"):
        read(ctx, id=bad)


def test_nothing_outside_the_saved_folders_is_reachable(ctx: ToolContext, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret\n")
    os.symlink(secret, ctx.saved_dirs[0] / "link.txt")
    with pytest.raises(ToolError, match="symbolic link"):
        read(ctx, id="link.txt")
    os.link(secret, ctx.saved_dirs[0] / "hard.txt")
    with pytest.raises(ToolError, match="not a saved file"):
        read(ctx, id="hard.txt")
    with pytest.raises(ToolError, match="keeps no saved outputs"):
        read(replace(ctx, saved_dirs=()), id="x.txt")
    # and the file tools still cannot reach the sessions folder
    (ctx.saved_dirs[0] / "x.txt").write_text("saved\n")
    with pytest.raises(ToolError, match="outside the workspace"):
        builtin_registry()["read_file"].invoke({"path": str(ctx.saved_dirs[0] / "x.txt")}, ctx)
