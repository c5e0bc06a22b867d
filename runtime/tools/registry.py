"""The tool registry (design §3.4): tools as name + description + JSON-schema parameters + a callable.

A plain function becomes a tool with :func:`tool` (or ``registry.tool``): its name, its docstring (first
paragraph → description; a Google-style ``Args:`` section or ``:param x:`` lines → parameter
descriptions) and its type hints (``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict[str, ...]``,
``Literal[...]``, ``X | None``, ``Annotated[X, "description"]``) give the schema; parameters without a
default are required. A parameter named ``ctx`` (or annotated :class:`ToolContext`) receives the call's
context and is not part of the schema.

Arguments from the model are validated against the hints before the call (msgspec; ``"5"`` is accepted
for an ``int``), and a mismatch is an error result the model can read, naming the argument.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import tempfile
import threading
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin, overload

import msgspec

from runtime.errors import ToolError

if TYPE_CHECKING:
    from runtime.tools.workspace import Workspace

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "json_schema", "parse_docstring", "tool"]


_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, eq=False)
class ToolContext:
    """What a running tool may use besides its arguments."""

    workspace: Workspace | None
    session_id: str = ""
    call_id: str = ""
    turn_id: str = ""  # the turn that made the call
    emit_output: Callable[[str], None] = field(default=lambda _chunk: None, repr=False)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    shell_enabled: bool = False
    shell_timeout: float = 120.0
    shell_env: tuple[str, ...] = ()  # names (or shell-style patterns) passed to shell beyond its allow-list
    logs_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "agentcell_logs")
    metadata: dict[str, Any] = field(default_factory=dict)  # the tool's notes, kept on its result message
    # The session's saved outputs and artifacts (its spill and artifacts folders), for read_saved only:
    # the file tools never reach them.
    saved_dirs: tuple[Path, ...] = ()

    @property
    def idempotency_key(self) -> str:
        """A key naming this call, the same if it is run again after a crash (design §3.12): a tool with
        effects elsewhere passes it on (an ``Idempotency-Key`` header, say) so that a retry does no harm."""
        return self.call_id

    def require_workspace(self) -> Workspace:
        """The session's workspace; a clear :class:`ToolError` when the session has none."""
        if self.workspace is None:
            raise ToolError("this session has no workspace, so file tools are unavailable")
        return self.workspace


@dataclass(frozen=True, eq=False)
class Tool:
    """One tool. ``fn`` takes the arguments as keyword arguments (plus ``ctx`` if it asks for it).

    ``timeout`` overrides the executor's per-call timeout. ``requires_approval``: the call runs only when
    the session's approval hook allows it; with no hook configured, such a call is denied.
    ``idempotent``: running it twice does what running it once does (a read), so a call cut off by a
    crash is run again when its turn is taken up; any other call is not, and its result says its outcome
    is unknown (design §3.12).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout: float | None = None
    requires_approval: bool = False
    idempotent: bool = False
    context_param: str | None = None  # the name under which fn receives the ToolContext
    arguments_type: type | None = field(default=None, repr=False)  # msgspec Struct validating arguments

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"invalid tool name {self.name!r}: use 1-64 letters, digits, '_' or '-'")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (to a cluster's shard) with its argument type as fields: the type :func:`tool` made at
        # run time would unpickle without them.
        fields = None
        if self.arguments_type is not None:
            fields = [
                (f.name, f.type) if f.required else (f.name, f.type, f.default)
                for f in msgspec.structs.fields(self.arguments_type)
            ]
        return (
            _unpickled,
            (
                self.name,
                self.description,
                self.parameters,
                self.fn,
                self.timeout,
                self.requires_approval,
                self.idempotent,
                self.context_param,
                fields,
            ),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (tools stay usable as plain functions)."""
        return self.fn(*args, **kwargs)

    def schema(self) -> dict[str, Any]:
        """The tool in OpenAI's ``function`` format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Validate ``arguments`` and call the tool; async functions run on a private event loop.

        Invalid arguments raise :class:`ToolError` with msgspec's reason (it names the argument).
        """
        if self.arguments_type is not None:
            try:
                parsed: Any = msgspec.convert(dict(arguments), self.arguments_type, strict=False)
            except msgspec.ValidationError as exc:
                raise ToolError(f"invalid arguments for {self.name!r}: {exc}") from None
            kwargs = {f: getattr(parsed, f) for f in parsed.__struct_fields__}
        else:
            kwargs = dict(arguments)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            return asyncio.run(_await(result))
        return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.register(item)

    def register(self, item: Tool | Callable[..., Any], *, replace: bool = False) -> Tool:
        """Add a :class:`Tool` or a plain function (made into a tool with :func:`tool`)."""
        t = item if isinstance(item, Tool) else tool(item)
        if t.name in self._tools and not replace:
            raise ValueError(f"a tool named {t.name!r} is already registered")
        self._tools[t.name] = t
        return t

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        requires_approval: bool = False,
        idempotent: bool = False,
    ) -> Any:
        """Decorator registering a function as a tool; the function is returned unchanged."""

        def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
            self.register(
                tool(
                    f,
                    name=name,
                    description=description,
                    timeout=timeout,
                    requires_approval=requires_approval,
                    idempotent=idempotent,
                )
            )
            return f

        return decorate(fn) if fn is not None else decorate

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool in OpenAI's ``function`` format, for the provider request, in the order of their names:
        the same tools make the same bytes whatever order they were registered in (MCP servers connect in
        any order), so a request's cached prefix survives a restart (design §4.7)."""
        return [self._tools[name].schema() for name in sorted(self._tools)]


# ---------------------------------------------------------------------------------------------------
# From a function to a Tool


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = ...,
    description: str | None = ...,
    timeout: float | None = ...,
    requires_approval: bool = ...,
    idempotent: bool = ...,
) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = ...,
    description: str | None = ...,
    timeout: float | None = ...,
    requires_approval: bool = ...,
    idempotent: bool = ...,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    requires_approval: bool = False,
    idempotent: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a function, deriving its schema from its hints and docstring.

    Usable as ``tool(fn)``, ``@tool`` or ``@tool(name=..., timeout=..., requires_approval=...,
    idempotent=...)``.
    """

    def build(f: Callable[..., Any]) -> Tool:
        summary, param_docs = parse_docstring(inspect.getdoc(f) or "")
        parameters, context_param, arguments_type = _signature_schema(f, param_docs)
        return Tool(
            name=name or f.__name__,
            description=description if description is not None else summary,
            parameters=parameters,
            fn=f,
            timeout=timeout,
            requires_approval=requires_approval,
            idempotent=idempotent,
            context_param=context_param,
            arguments_type=arguments_type,
        )

    return build(fn) if fn is not None else build


def _unpickled(
    name: str,
    description: str,
    parameters: dict[str, Any],
    fn: Callable[..., Any],
    timeout: float | None,
    requires_approval: bool,
    idempotent: bool,
    context_param: str | None,
    fields: list[Any] | None,
) -> Tool:
    arguments_type = None
    if fields is not None:
        arguments_type = msgspec.defstruct(
            f"{name}_arguments", [tuple(f) for f in fields], forbid_unknown_fields=True
        )
    return Tool(
        name,
        description,
        parameters,
        fn,
        timeout,
        requires_approval,
        idempotent,
        context_param,
        arguments_type,
    )


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before any parameter section) and per-parameter descriptions."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        sphinx = re.match(r":param\s+(?:[^:]*\s)?(\w+):\s*(.*)", stripped)
        if sphinx:
            current, section = sphinx.group(1), "params"
            params[current] = sphinx.group(2)
            continue
        if re.fullmatch(r"(Args|Arguments|Parameters|Params)\s*:", stripped):
            section, current = "params", None
            continue
        if re.fullmatch(r"(Returns?|Raises|Yields|Examples?|Notes?)\s*:", stripped) or stripped.startswith(
            ":"
        ):
            section, current = "other", None
            continue
        if section is None:
            summary.append(line)
        elif section == "params":
            entry = re.match(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", stripped)
            if entry and not line.startswith(" " * 8):
                current = entry.group(1)
                params[current] = entry.group(2)
            elif current is not None and stripped:
                params[current] = f"{params[current]} {stripped}".strip()
    paragraphs = "\n".join(summary).strip().split("\n\n")
    description = "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)
    return description, params


def _signature_schema(
    fn: Callable[..., Any], docs: Mapping[str, str]
) -> tuple[dict[str, Any], str | None, type | None]:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"cannot read the type hints of {fn.__name__}: {exc}") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(param.name, Any)
        if param.name == "ctx" or _is_context(hint):
            context_param = param.name
            continue
        if param.kind == param.POSITIONAL_ONLY:
            raise TypeError(f"{fn.__name__}: tool parameters must be passable by keyword ({param.name})")
        schema = json_schema(hint, where=f"{fn.__name__}({param.name})")
        if param.name in docs and "description" not in schema:
            schema["description"] = docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
            fields.append((param.name, _strip_annotated(hint)))
        else:
            if _json_default(param.default):
                schema["default"] = param.default
            fields.append((param.name, _strip_annotated(hint), param.default))
        properties[param.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    parameters["additionalProperties"] = False
    arguments_type = msgspec.defstruct(f"{fn.__name__}_arguments", fields, forbid_unknown_fields=True)
    return parameters, context_param, arguments_type


def json_schema(hint: Any, *, where: str = "parameter") -> dict[str, Any]:
    """The JSON schema of a type hint (the subset tools need); ``TypeError`` names what is unsupported."""
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Annotated:
        schema = json_schema(args[0], where=where)
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        return schema
    if hint is Any or hint is object:
        return {}
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is type(None):
        return {"type": "null"}
    if origin is Literal:
        schema = {"enum": list(args)}
        kinds = {type(a) for a in args}
        if len(kinds) == 1:
            kind = json_schema(kinds.pop(), where=where).get("type")
            if kind:
                schema["type"] = kind
        return schema
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return json_schema(options[0], where=where)  # Optional[X]: the model sends X or omits it
        return {"anyOf": [json_schema(a, where=where) for a in args]}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple, set, frozenset):
        items = [a for a in args if a is not Ellipsis]
        schema = {"type": "array"}
        if items:
            schema["items"] = json_schema(items[0], where=where)
        return schema
    if origin is dict or hint is dict:
        schema = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = json_schema(args[1], where=where)
        return schema
    raise TypeError(f"{where}: unsupported parameter type {hint!r} for a tool schema")


def _strip_annotated(hint: Any) -> Any:
    while get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    return hint


def _is_context(hint: Any) -> bool:
    return _strip_annotated(hint) is ToolContext


def _json_default(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))
