"""The Responses API's request body, response object, usage and error shapes: pure, no I/O.

The shapes follow the ``openai`` package's types (``openai.types.responses``), field by field. A request
parameter this server does not honour is refused with a 400 naming it (:func:`unsupported`), never ignored.
"""

from __future__ import annotations

import time
from typing import Any, Final, Literal

import msgspec

from actors.agent import CLIENT_TOOL_CLASH
from runtime.context import working_set as ws
from runtime.errors import AgentcellError
from runtime.messages import Usage

# agentcell's error codes for a context that does not fit even after what compaction could do (or with
# compaction off): the API calls that ``context_length_exceeded``.
CONTEXT_CODES: Final = frozenset(
    {
        ws.PROMPT_TOO_LARGE,
        ws.WORKING_SET_TOO_LARGE,
        ws.CONTEXT_OVERFLOW,
        "context_overflow_after_compaction",
        "session_dead",
    }
)


class ApiError(AgentcellError):
    """An error answered in the API's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def not_found(what: str, id: str, param: str | None = None) -> ApiError:
    code = "previous_response_not_found" if param == "previous_response_id" else None
    return ApiError(404, f"{what} with id '{id}' not found.", param=param, code=code)


class CreateResponse(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/responses``: every parameter of ``ResponseCreateParams``; see :func:`unsupported`."""

    model: str | None = None
    input: Any = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    background: bool | None = None
    prompt: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    background_options: Any = None
    client_metadata: dict[str, str] | None = None  # (Codex sends it; kept as metadata)

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, dict):
            value = self.conversation.get("id")
            return value if isinstance(value, str) else None
        return self.conversation


_NOT_HONOURED: Final = (
    "temperature",
    "top_p",
    "max_tool_calls",
    "top_logprobs",
    "prompt",
    "prompt_cache_retention",
    "prompt_cache_options",
    "context_management",
    "moderation",
    "image",
    "access_programs",
    "background_options",
)


REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh")
MIN_OUTPUT_TOKENS: Final = 16  # the least ``max_output_tokens`` OpenAI's API takes


def check_max_output_tokens(value: int | None) -> None:
    """Refuse a ``max_output_tokens`` below the API's minimum as OpenAI's API does."""
    if value is not None and value < MIN_OUTPUT_TOKENS:
        raise ApiError(
            400,
            f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= "
            f"{MIN_OUTPUT_TOKENS}, but got {value} instead.",
            param="max_output_tokens",
            code="integer_below_min_value",
        )


def unsupported(body: CreateResponse) -> list[str]:
    """The parameters of ``body`` this server would not honour (given, and not at a value it honours)."""
    names = [name for name in _NOT_HONOURED if getattr(body, name) is not None]
    if body.background:
        names.append("background")
    if body.tool_choice not in (None, "auto"):
        names.append("tool_choice")
    if any(name not in INCLUDABLE for name in body.include or ()):
        names.append("include")
    if body.text is not None and (body.text.get("format") or {"type": "text"}).get("type") != "text":
        names.append("text.format")
    if body.text is not None and body.text.get("verbosity") not in (None, "low", "medium", "high"):
        names.append("text.verbosity")
    if body.reasoning is not None:
        if body.reasoning.get("summary") not in (None, "auto", "concise", "detailed"):
            names.append("reasoning.summary")
        if body.reasoning.get("effort") not in (None, *REASONING_EFFORTS):
            names.append("reasoning.effort")
        if any(v is not None for k, v in body.reasoning.items() if k not in ("summary", "effort")):
            names.append("reasoning")
    if body.service_tier not in (None, "auto", "default"):
        names.append("service_tier")
    return names


ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"
AGENTCELL_EVENTS: Final = "agentcell.events"
INCLUDABLE: Final = frozenset({ENCRYPTED_REASONING, AGENTCELL_EVENTS})
"""``include`` values honoured: reasoning items carry ``encrypted_content`` (an opaque token this server
turns back into the reasoning when a client sends the item back: :mod:`.sealing`); a stream carries
agentcell's own events as ``agentcell.<type>`` (without it, only the API's events)."""

MAX_METADATA_KEYS: Final = 64
MAX_METADATA_VALUE: Final = 16_384


def metadata_of(body: CreateResponse) -> dict[str, str]:
    """The response's metadata: ``client_metadata`` (Codex's) joined by ``metadata`` (which wins on a clash),
    bounded (a 400 past :data:`MAX_METADATA_KEYS` keys or a value over :data:`MAX_METADATA_VALUE` characters)."""
    merged = {**(body.client_metadata or {}), **(body.metadata or {})}
    if len(merged) > MAX_METADATA_KEYS:
        raise ApiError(400, f"metadata: at most {MAX_METADATA_KEYS} keys", param="metadata")
    for key, value in merged.items():
        if len(key) > 256 or len(value) > MAX_METADATA_VALUE:
            raise ApiError(
                400,
                f"metadata: keys of at most 256 and values of at most {MAX_METADATA_VALUE:,} characters",
                param="metadata",
            )
    return merged


def decode_error(exc: Exception) -> ApiError:
    """A 400 for a body that is not JSON, or not the request's shape (naming the field)."""
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        param = None
        if "unknown field" in text:
            param = text.split("`")[1] if "`" in text else None
            return ApiError(400, f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
        if "at `$." in text:
            param = text.rsplit("at `$.", 1)[1].rstrip("`")
        return ApiError(400, f"Invalid request body: {text}", param=param, code="invalid_value")
    return ApiError(400, f"The request body is not valid JSON: {text}", code="invalid_json")


HOSTED_TOOLS: Final = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer",
        "local_shell",
        "tool_search",
    }
)
"""Tools the API's servers run themselves: declared by a client, they are not offered to the model (this
server does not run them) and are named in the response's ``x-agentcell-tools-not-offered`` header. (A
remote ``mcp`` tool is a 400: a client's MCP servers come through the server's policy, not a request.)"""


class ClientTools:
    """A request's ``tools`` as the gateway sends them: ``schemas`` (the chat format), the namespace of
    each function declared inside a ``namespace`` tool (``namespaces``), the hosted tools left out
    (``not_offered``)."""

    def __init__(self) -> None:
        self.schemas: list[dict[str, Any]] = []
        self.namespaces: dict[str, str] = {}
        self.not_offered: list[str] = []

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.schemas)


def function_tools(tools: list[dict[str, Any]] | None) -> ClientTools:
    """The request's tools: ``function`` tools (and those of ``namespace`` tools, under their own names)
    offered to the model; hosted tools (:data:`HOSTED_TOOLS`) set aside; 400 for any other kind."""
    out = ClientTools()

    def add(tool: dict[str, Any], param: str, namespace: str | None) -> None:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(400, f"{param}.name is required", param=f"{param}.name")
        if any(t["function"]["name"] == name for t in out.schemas):
            raise ApiError(400, f"{param}: two tools are named {name!r}", param=f"{param}.name")
        function: dict[str, Any] = {"name": name, "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.schemas.append({"type": "function", "function": function})
        if namespace is not None:
            out.namespaces[name] = namespace

    for index, tool in enumerate(tools or ()):
        param = f"tools[{index}]"
        kind = tool.get("type")
        if kind == "function":
            add(tool, param, None)
        elif kind == "namespace" and isinstance(tool.get("tools"), list):
            namespace = str(tool.get("name") or "")
            for inner, member in enumerate(tool["tools"]):
                where = f"{param}.tools[{inner}]"
                if not isinstance(member, dict) or member.get("type") != "function":
                    raise ApiError(400, f"{where}: only function tools in a namespace", param=f"{where}.type")
                add(member, where, namespace)
        elif kind in HOSTED_TOOLS:
            out.not_offered.append(str(kind))
        else:
            raise ApiError(
                400,
                f"{param}: tools of type {kind!r} are not supported by this server (function "
                "tools run on the client; the server's own tools come with the model's agent profile)",
                param=f"{param}.type",
            )
    return out


def usage_object(usage: Usage) -> dict[str, Any]:
    """``ResponseUsage`` of a run's usage."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "incomplete"]


class ResponseRecord(msgspec.Struct, kw_only=True):
    """A response as the server keeps it: the API object's fields, and where it is in its session."""

    id: str
    session_id: str
    model: str
    created_at: float = msgspec.field(default_factory=time.time)
    status: ResponseStatus = "in_progress"
    start_leaf: str | None = None  # the session's leaf the response continued from
    leaf_id: str | None = None  # ... and the one it ended at (a later response continues from here)
    awaiting: list[str] = msgspec.field(default_factory=list)  # client calls waiting for their outputs
    input_items: list[dict[str, Any]] = msgspec.field(default_factory=list)
    output: list[dict[str, Any]] = msgspec.field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    completed_at: float | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation_id: str | None = None
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    truncation: str = "auto"
    store: bool = True
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    interrupted: bool = False  # the server stopped while it was in progress (see FrontDoor.response)

    def to_api(self) -> dict[str, Any]:
        """The ``Response`` object."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": int(self.created_at),
            "status": self.status,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": self.output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "conversation": {"id": self.conversation_id} if self.conversation_id else None,
            "reasoning": self.reasoning or {"effort": None, "summary": None},
            "safety_identifier": self.safety_identifier,
            "prompt_cache_key": self.prompt_cache_key,
            "service_tier": self.service_tier or "default",
            "store": self.store,
            "temperature": None,
            "text": self.text or {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": self.tools,
            "top_p": None,
            "truncation": self.truncation,
            "usage": self.usage,
            "user": self.user,
            "metadata": self.metadata,
            "background": False,
        }


def request_tools(body: CreateResponse) -> list[dict[str, Any]]:
    """The request's tools as the response echoes them (``FunctionTool``, ``NamespaceTool``): those offered
    to the model (hosted tools this server does not run are left out)."""

    def function(t: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "function",
            "name": t.get("name"),
            "description": t.get("description"),
            "parameters": t.get("parameters"),
            "strict": t.get("strict", True),
        }

    out: list[dict[str, Any]] = []
    for t in body.tools or ():
        if t.get("type") == "function":
            out.append(function(t))
        elif t.get("type") == "namespace":
            out.append({**t, "tools": [function(m) for m in t.get("tools") or ()]})
    return out


def failure(code: str, message: str) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the ``error`` of a run that ended with agentcell's error ``code``."""
    if code in CONTEXT_CODES:
        return 400, {"code": "context_length_exceeded", "message": message, "param": "input"}
    if code == CLIENT_TOOL_CLASH:
        return 400, {"code": "invalid_value", "message": message, "param": "tools"}
    if code == "provider_rate_limit":
        return 429, {"code": "rate_limit_exceeded", "message": message}
    if code == "provider_invalid_request":  # the provider refused the request (an unknown model...)
        return 400, {"code": "invalid_prompt", "message": message}
    return 500, {"code": "server_error", "message": message}


def error_type(status: int) -> str:
    return {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}.get(
        status, "server_error"
    )


def list_page(items: list[dict[str, Any]], *, after: str | None, limit: int, order: str) -> dict[str, Any]:
    """A cursor page (``{"object": "list", "data", "first_id", "last_id", "has_more"}``) of ``items``
    (oldest first), in ``order``, after the item ``after``."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after not in ids:
            raise ApiError(400, f"after: no item with id '{after}'", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].get("id") if data else None,
        "last_id": data[-1].get("id") if data else None,
        "has_more": len(ordered) > limit,
    }
