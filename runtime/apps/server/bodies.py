"""What clients of ``agentcell serve`` send: the request bodies, how they are read, and :class:`HttpError`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from runtime.config import AgentProfile
from runtime.errors import AgentcellError

__all__ = [
    "BranchBody",
    "CompactBody",
    "CreateSession",
    "HttpError",
    "ModelBody",
    "PromptBody",
    "ResumeBody",
    "decode",
    "int_param",
]


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CreateSession(_Body, frozen=True):
    session_id: str | None = None
    model: str | None = None
    system_prompt: str = ""
    tools: Literal["builtin"] | list[str] | None = None
    workspace: str | None = None
    config: dict[str, Any] | None = None
    api_base: str | None = None
    api_key: str | None = None
    agents: dict[str, AgentProfile] | None = None  # sub-agent profiles: the session gets the agent tool
    mcp_servers: dict[str, Any] | list[str] | None = None  # MCP servers (design §3.9): name -> settings


class PromptBody(_Body, frozen=True):
    text: str
    images: list[str] = msgspec.field(default_factory=list)
    wait: bool = False
    steer: bool = False  # join the running turn at its next step boundary instead of queueing


class CompactBody(_Body, frozen=True):
    keep_recent_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    instructions: str | None = None


class ResumeBody(_Body, frozen=True):
    api_key: str | None = None
    api_base: str | None = None
    tools: Literal["builtin"] | list[str] | None = None
    workspace: str | None = None
    repair: Literal["truncate"] | None = None  # open a corrupt log up to its last good entry
    mcp_servers: dict[str, Any] | list[str] | None = None  # add to (or replace) its stored MCP servers


class BranchBody(_Body, frozen=True):
    leaf_id: str | None


class ModelBody(_Body, frozen=True):
    model: str  # checked by Runtime.set_model (runtime.models.validate_model_name)


class HttpError(AgentcellError):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def int_param(request: Any, name: str, default: int | None) -> int | None:
    """A query parameter that must be a whole number >= 0 (``default`` when absent); 400 otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise HttpError(400, f"{name} must be a whole number >= 0")
    return int(raw)


def decode(raw: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise HttpError(400, f"invalid request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HttpError(400, "the request body is nested too deeply") from None
