"""File-operation tracking across compactions (design §5.7)."""

from __future__ import annotations

from runtime import messages as m
from runtime.context.file_ops import FileOps, extract_file_ops


def call(call_id: str, name: str, arguments: str) -> m.Message:
    return m.assistant(tool_calls=[m.ToolCallPart(call_id, name, arguments)])


def test_reads_and_writes_are_told_apart() -> None:
    history = [
        m.user("look at the parser"),
        call("1", "read_file", '{"path": "src/parser.py"}'),
        m.tool_result("1", "read_file", "def parse(): ..."),
        call("2", "write_file", '{"path": "src/new.py", "content": "x = 1"}'),
        m.tool_result("2", "write_file", "ok"),
        call("3", "edit_file", '{"path": "README.md", "old": "a", "new": "b"}'),
        m.tool_result("3", "edit_file", "ok"),
        call("4", "list_dir", '{"path": "src"}'),
        m.tool_result("4", "list_dir", "parser.py"),
    ]
    ops = extract_file_ops(history)
    assert ops.read == {"src/parser.py"}
    assert ops.modified == {"src/new.py", "README.md"}


def test_a_file_read_then_modified_is_modified_only() -> None:
    history = [
        call("1", "read_file", '{"path": "a.py"}'),
        m.tool_result("1", "read_file", "..."),
        call("2", "edit_file", '{"path": "a.py"}'),
        m.tool_result("2", "edit_file", "ok"),
    ]
    assert extract_file_ops(history) == FileOps(read=frozenset(), modified=frozenset({"a.py"}))


def test_failed_calls_and_malformed_arguments_do_not_count() -> None:
    history = [
        call("1", "write_file", '{"path": "denied.py"}'),
        m.tool_result("1", "write_file", "permission denied", is_error=True),
        call("2", "read_file", '{"path": '),  # truncated JSON from the model
        m.tool_result("2", "read_file", "bad arguments", is_error=True),
        call("3", "read_file", '["not", "an", "object"]'),
        call("4", "read_file", '{"recursive": true}'),
    ]
    assert not extract_file_ops(history)


def test_paths_are_normalized_so_one_file_is_one_entry() -> None:
    history = [
        call("1", "read_file", '{"path": "./src//a.py"}'),
        call("2", "read_file", '{"file_path": "src/lib/../a.py"}'),
    ]
    assert extract_file_ops(history).read == {"src/a.py"}


def test_merge_across_compactions_promotes_earlier_reads_to_modified() -> None:
    earlier = FileOps(read=frozenset({"a.py", "b.py"}), modified=frozenset({"c.py"}))
    later = FileOps(read=frozenset({"d.py"}), modified=frozenset({"a.py"}))
    merged = earlier.merge(later)
    assert merged.read == {"b.py", "d.py"}
    assert merged.modified == {"a.py", "c.py"}
    assert later.merge(earlier) == merged


def test_metadata_round_trip_and_tolerance_of_bad_metadata() -> None:
    ops = FileOps(read=frozenset({"z.py", "a.py"}), modified=frozenset({"m.py"}))
    meta = ops.to_metadata()
    assert meta == {"read_files": ["a.py", "z.py"], "modified_files": ["m.py"]}
    assert FileOps.from_metadata(meta) == ops
    assert FileOps.from_metadata(
        {"read_files": "not-a-list", "modified_files": [1, None, "x.py"]}
    ) == FileOps(modified=frozenset({"x.py"}))
    # A file listed in both (hand-edited metadata) is modified only.
    assert FileOps.from_metadata({"read_files": ["x.py"], "modified_files": ["x.py"]}).read == frozenset()


def test_render_blocks() -> None:
    ops = FileOps(read=frozenset({"b.py", "a.py"}), modified=frozenset({"c.py"}))
    assert (
        ops.render() == "<read-files>\na.py\nb.py\n</read-files>\n\n<modified-files>\nc.py\n</modified-files>"
    )
    assert FileOps(modified=frozenset({"c.py"})).render() == "<modified-files>\nc.py\n</modified-files>"
    assert FileOps().render() == ""


def test_render_caps_a_huge_list_but_metadata_keeps_all() -> None:
    ops = FileOps(read=frozenset(f"f{i:04}.py" for i in range(500)))
    rendered = ops.render(limit=10)
    assert rendered.count(".py") == 10
    assert "... and 490 more" in rendered
    assert len(ops.to_metadata()["read_files"]) == 500
