"""The tool registry: schemas from hints and docstrings, argument validation, the registry's rules."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest

from runtime.tools.registry import Tool, ToolContext, ToolError, ToolRegistry, parse_docstring, tool


def test_schema_from_type_hints_and_docstring() -> None:
    registry = ToolRegistry()

    @registry.tool
    def search(
        query: str,
        limit: int = 10,
        threshold: float | None = None,
        tags: list[str] | None = None,
        order: Literal["asc", "desc"] = "asc",
        exact: bool = False,
        note: Annotated[str, "free text for the log"] = "",
        *,
        ctx: ToolContext,
    ) -> str:
        """Search the index.

        Longer explanation that stays in the description.

        Args:
            query: What to look for.
            limit: How many results
                to return at most.
        """
        return query

    assert search("x", ctx=None) == "x"  # the decorator returns the function itself
    [schema] = registry.schemas()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the index.\n\nLonger explanation that stays in the description."
    params = fn["parameters"]
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert "ctx" not in props
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["limit"] == {
        "type": "integer",
        "description": "How many results to return at most.",
        "default": 10,
    }
    assert props["threshold"] == {"type": "number", "default": None}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "default": None}
    assert props["order"] == {"enum": ["asc", "desc"], "type": "string", "default": "asc"}
    assert props["exact"] == {"type": "boolean", "default": False}
    assert props["note"] == {"type": "string", "description": "free text for the log", "default": ""}


def test_sphinx_docstrings_are_understood() -> None:
    summary, params = parse_docstring("Do it.\n\n:param x: the x\n:param int y: the y\n:returns: nothing")
    assert summary == "Do it." and params == {"x": "the x", "y": "the y"}


def test_arguments_are_validated_against_the_hints() -> None:
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add."""
        return a + b

    ctx = ToolContext(workspace=None)
    assert add.invoke({"a": 2}, ctx) == 3
    assert add.invoke({"a": "2", "b": "5"}, ctx) == 7  # lenient with numbers sent as strings
    with pytest.raises(ToolError, match=r"invalid arguments for 'add'.*`\$\.a`"):
        add.invoke({"a": "two"}, ctx)
    with pytest.raises(ToolError, match="missing required field `a`"):
        add.invoke({}, ctx)
    with pytest.raises(ToolError, match="unknown field `c`"):
        add.invoke({"a": 1, "c": 3}, ctx)


def test_async_tools_and_explicit_tools() -> None:
    @tool(name="wait_a_bit", timeout=5.0, requires_approval=True)
    async def slow(x: int) -> int:
        """Async tool."""
        return x * 2

    assert slow.name == "wait_a_bit" and slow.timeout == 5.0 and slow.requires_approval
    assert slow.invoke({"x": 4}, ToolContext(workspace=None)) == 8
    raw = Tool("echo", "Echo.", {"type": "object", "properties": {"s": {"type": "string"}}}, lambda s: s)
    assert raw.invoke({"s": "hi"}, ToolContext(workspace=None)) == "hi"


def test_registry_rules() -> None:
    registry = ToolRegistry()

    def ping() -> str:
        """Ping."""
        return "pong"

    registry.register(ping)
    assert "ping" in registry and len(registry) == 1 and registry.names == ["ping"]
    with pytest.raises(ValueError, match="already registered"):
        registry.register(ping)
    registry.register(ping, replace=True)
    with pytest.raises(ValueError, match="invalid tool name"):
        Tool("bad name!", "", {}, ping)
    with pytest.raises(TypeError, match="unsupported parameter type"):

        @tool
        def odd(x: complex) -> None:
            """Odd."""


def test_a_tool_pickled_to_another_process_keeps_its_arguments_and_declarations() -> None:
    """A cluster pickles a session's tools to its shard (cloudpickle): the argument type :func:`tool`
    made at run time comes back with its fields, and the tool with what it declares."""
    import pickle

    cloudpickle = pytest.importorskip("ray.cloudpickle")
    from runtime.tools.builtin import read_file

    copy = pickle.loads(cloudpickle.dumps(read_file))
    assert copy.idempotent and copy.context_param == "ctx" and copy.parameters == read_file.parameters
    assert copy.arguments_type is not None
    assert copy.arguments_type.__struct_fields__ == ("path", "offset", "limit")
