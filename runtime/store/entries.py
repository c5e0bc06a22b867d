"""The records of a session log (design §2.3): one msgspec tagged union, one JSON line each.

A log starts with a :class:`Header` and then holds, in the order they happened, the entries that build
the session tree: messages, compactions, overlays and visibility changes (the tree's nodes), branch moves
and metadata changes. Nothing is ever rewritten: a compaction or an overlay is a new entry, and the views a model or
a user sees are computed from the entries (:mod:`runtime.store.tree`).

Every entry carries ``v``, the format version. A reader refuses a version it does not know rather than
guessing what a newer writer meant.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from runtime.events import CompactionMode, CompactionTrigger, OverflowCause
from runtime.messages import Message, new_id

__all__ = [
    "FORMAT_VERSION",
    "BranchEntry",
    "CompactionEntry",
    "Entry",
    "Header",
    "MessageEntry",
    "MetadataEntry",
    "NodeEntry",
    "OverlayEntry",
    "StepEntry",
    "StepKind",
    "VisibilityEntry",
    "decode_entries",
    "decode_entry",
    "encode_entry",
    "new_header",
    "scrub_secrets",
]


FORMAT_VERSION: Final = 1


class _Entry(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    v: int = FORMAT_VERSION


class Header(_Entry, frozen=True, tag="header"):
    """The first line of every log: what the session was started with."""

    session_id: str
    created_at: float = msgspec.field(default_factory=time.time)
    model: str = ""
    system_prompt: str = ""
    workspace: str | None = None
    api_base: str | None = None  # the provider endpoint; the API key is never stored
    tools: list[str] = msgspec.field(default_factory=list)
    config: dict[str, Any] = msgspec.field(default_factory=dict)  # per-session overrides, secrets removed
    agents: dict[str, Any] = msgspec.field(default_factory=dict)  # its sub-agent profiles (design §3.10)
    parent_session_id: str | None = None  # a sub-agent: the session that delegated to it ...
    parent_call_id: str | None = None  # ... by this tool call
    depth: int = 0  # how many delegations deep it is (0: a top-level session)
    mcp_servers: dict[str, Any] = msgspec.field(default_factory=dict)  # its own MCP servers, secrets withheld


class MessageEntry(_Entry, frozen=True, tag="message"):
    """A message added to the tree as a child of ``parent_id`` (``None``: a root). ``id`` is the message's."""

    id: str
    parent_id: str | None
    message: Message


class CompactionEntry(_Entry, frozen=True, tag="compaction"):
    """A compaction: a node on the path whose summary stands for the path's history before it.

    The model-facing view after it is the summary, then the path's messages from ``first_kept_id`` up to
    this node, then everything after it. ``first_kept_id=None`` means the summary replaces the whole
    history (hard reset). ``id`` is the summary message's id.
    """

    id: str
    parent_id: str | None
    summary: Message
    first_kept_id: str | None
    tokens_before: int = 0
    tokens_after: int = 0
    mode: CompactionMode = "summarize"
    trigger: CompactionTrigger = "threshold"
    artifacts: list[str] = msgspec.field(default_factory=list)
    # Why an ``overflow`` compaction ran: the provider ``refused`` the request, or it was ``counted`` over the
    # limit before it was sent (design §6.3); None for the other triggers, and in logs written before it.
    # Written only when set (:func:`encode_entry`); a line with ``"cause": null`` loads as None too.
    cause: OverflowCause | None = None


class OverlayEntry(_Entry, frozen=True, tag="overlay"):
    """A node that replaces, in the views of every path through it, earlier messages of the same id.

    Used to archive old tool results (a copy with ``agent_visible=False``) or to clear an old tool output
    to a placeholder. The originals stay in the log and in :meth:`SessionTree.get`.
    """

    id: str = msgspec.field(default_factory=new_id)
    parent_id: str | None = None
    replacements: list[Message] = msgspec.field(default_factory=list)


class VisibilityEntry(_Entry, frozen=True, tag="visibility"):
    """A node that changes who sees earlier messages, by id, in the views of every path through it.

    An overlay that only flips ``agent_visible`` or ``user_visible``, without a copy of the message: hiding
    a 50 MB prompt from the model costs a line of ids, not another 50 MB. ``None`` leaves a flag as it is.
    """

    id: str = msgspec.field(default_factory=new_id)
    parent_id: str | None = None
    message_ids: list[str] = msgspec.field(default_factory=list)
    agent_visible: bool | None = None
    user_visible: bool | None = None


class BranchEntry(_Entry, frozen=True, tag="branch"):
    """The current leaf moved to ``leaf_id`` (``None``: before the first message)."""

    leaf_id: str | None


class MetadataEntry(_Entry, frozen=True, tag="metadata"):
    """A session-level setting changed (e.g. ``model``); the latest value of a key wins."""

    key: str
    value: Any


StepKind = Literal["turn", "request", "tool_started", "compaction", "resumed"]


class StepEntry(_Entry, frozen=True, tag="step"):
    """A step of a turn, recorded before its effect (design §2.3, 3.12): what a turn cut off by a crash
    is taken up from.

    ``turn``: the turn began (its ``prompt_id``, the handle's id a caller waits on); ``request``: step
    ``step``'s model request went out (its answer, once complete, is a message entry); ``tool_started``:
    the call ``call_id`` of tool ``name`` is about to run (its result, once complete, is a message entry);
    ``compaction``: a compaction started (it is complete with its compaction entry); ``resumed``: a
    process took the turn up after a crash, from step ``step``. ``process`` names the process that wrote
    it (``host:pid``). Not a node of the tree: it moves no leaf.
    """

    turn_id: str
    kind: StepKind
    step: int = 0
    prompt_id: str = ""
    call_id: str = ""
    name: str = ""
    process: str = ""
    ts: float = msgspec.field(default_factory=time.time)


Entry = (
    Header
    | MessageEntry
    | CompactionEntry
    | OverlayEntry
    | VisibilityEntry
    | BranchEntry
    | MetadataEntry
    | StepEntry
)
NodeEntry = MessageEntry | CompactionEntry | OverlayEntry | VisibilityEntry
"""Entries that are nodes of the tree: they have an ``id`` and a ``parent_id``."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Entry)


def encode_entry(entry: Entry) -> bytes:
    """One log line: the entry as JSON followed by a newline. A compaction without a ``cause`` (every
    trigger but an overflow) is written without the field, as before it had one."""
    if isinstance(entry, CompactionEntry) and entry.cause is None:
        fields = msgspec.to_builtins(entry)  # (a compaction is rare: the dict's cost does not matter)
        del fields["cause"]
        return _encoder.encode(fields) + b"\n"
    return _encoder.encode(entry) + b"\n"


def decode_entry(line: bytes | str) -> Entry:
    """Decode one log line (without or with its newline); raises ``msgspec.DecodeError``/``ValidationError``."""
    try:
        entry: Entry = _decoder.decode(line)
    except UnicodeDecodeError as exc:  # msgspec raises this for invalid UTF-8 inside a string
        raise msgspec.DecodeError(f"invalid UTF-8: {exc}") from None
    return entry


def decode_entries(data: bytes) -> list[Entry]:
    """Decode newline-delimited entries in one call (raises on the first bad line, without saying which)."""
    try:
        entries: list[Entry] = _decoder.decode_lines(data)
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"invalid UTF-8: {exc}") from None
    return entries


# Whole key names, or their last ``_``/``-`` separated words: ``api_key``, ``openai_api_key``, ``token``,
# ``client_secret`` — but not ``max_tokens``.
_SECRET_KEY = re.compile(
    r"(?:^|[_-])(?:api[_-]?key|secret|token|access[_-]?token|password|passwd|authorization|credentials?)$",
    re.I,
)


def scrub_secrets(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` without keys that look like credentials, at any depth (design §9)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if _SECRET_KEY.search(str(key)):
            continue
        out[key] = scrub_secrets(value) if isinstance(value, Mapping) else value
    return out


def new_header(
    session_id: str,
    *,
    model: str,
    system_prompt: str = "",
    workspace: str | None = None,
    api_base: str | None = None,
    tools: list[str] | None = None,
    config: Mapping[str, Any] | None = None,
    agents: Mapping[str, Any] | None = None,
    parent: tuple[str, str, int] | None = None,
    mcp_servers: Mapping[str, Any] | None = None,
) -> Header:
    """A header for a new session, with credentials removed from the per-session config."""
    return Header(
        session_id=session_id,
        model=model,
        system_prompt=system_prompt,
        workspace=workspace,
        api_base=api_base,
        tools=list(tools or ()),
        config=scrub_secrets(config or {}),
        agents=dict(agents or {}),
        parent_session_id=parent[0] if parent else None,
        parent_call_id=parent[1] if parent else None,
        depth=parent[2] if parent else 0,
        mcp_servers=dict(mcp_servers or {}),
    )
