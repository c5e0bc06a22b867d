"""Where the front door keeps its responses and conversations: one JSON file each, beside the sessions.

``<sessions_dir>/responses/<resp_id>.json`` and ``<sessions_dir>/conversations/<conv_id>.json``, written
whole to a temporary file and renamed into place. Ids are checked against their pattern before any path
is made of them. Every method does file I/O: call them off the event loop.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from runtime.apps.responses.api import ResponseRecord

RESPONSE_ID: Final = re.compile(r"^resp_[0-9a-f]{32}$")
CONVERSATION_ID: Final = re.compile(r"^conv_[0-9a-f]{32}$")
SESSION_ID: Final = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class ConversationRecord(msgspec.Struct, kw_only=True):
    """A conversation: its session (from its first response on), where it is in that session's tree, the
    client calls its last response waits for, and items added but not yet sent to the model."""

    id: str
    created_at: float = msgspec.field(default_factory=time.time)
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    session_id: str | None = None
    leaf_id: str | None = None
    awaiting: list[str] = msgspec.field(default_factory=list)
    pending: list[dict[str, Any]] = msgspec.field(default_factory=list)

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": int(self.created_at),
            "metadata": self.metadata,
        }


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(16)}"


def new_conversation_id() -> str:
    return f"conv_{secrets.token_hex(16)}"


_T = TypeVar("_T")


class Records:
    """Response and conversation records under ``root`` (the sessions directory)."""

    def __init__(self, root: Path) -> None:
        self.responses = root / "responses"
        self.conversations = root / "conversations"
        self.ephemeral = root / "responses" / "ephemeral"  # sessions of store: false responses, until let go

    def sealing_key(self) -> bytes:
        """The 32-byte key reasoning is sealed with (:mod:`.sealing`): ``responses/.sealing-key``, made on
        first use (readable by the server's user only) and kept, so tokens open after a restart."""
        path = self.responses / ".sealing-key"
        with contextlib.suppress(FileNotFoundError):
            key = path.read_bytes()
            if len(key) == 32:
                return key
        self.responses.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(secrets.token_bytes(32))
        try:
            os.link(temporary, path)  # the first writer wins; a concurrent one reads the winner's key
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
        return path.read_bytes()

    def mark_ephemeral(self, session_id: str) -> None:
        """``session_id`` holds only ``store: false`` text: deleted when let go, or on the next start."""
        self.ephemeral.mkdir(parents=True, exist_ok=True)
        (self.ephemeral / session_id).touch()

    def unmark_ephemeral(self, session_id: str) -> None:
        _unlink(self.ephemeral / session_id)

    def ephemeral_sessions(self) -> list[str]:
        try:
            return [p.name for p in self.ephemeral.iterdir() if SESSION_ID.match(p.name)]
        except FileNotFoundError:
            return []

    def save_response(self, record: ResponseRecord) -> None:
        self._write(self.responses, record.id, record)

    def load_response(self, response_id: str) -> ResponseRecord | None:
        if not RESPONSE_ID.match(response_id):
            return None
        return self._read(self.responses / f"{response_id}.json", ResponseRecord)

    def delete_response(self, response_id: str) -> bool:
        return RESPONSE_ID.match(response_id) is not None and _unlink(self.responses / f"{response_id}.json")

    def save_conversation(self, record: ConversationRecord) -> None:
        self._write(self.conversations, record.id, record)

    def load_conversation(self, conversation_id: str) -> ConversationRecord | None:
        if not CONVERSATION_ID.match(conversation_id):
            return None
        return self._read(self.conversations / f"{conversation_id}.json", ConversationRecord)

    def delete_conversation(self, conversation_id: str) -> bool:
        return CONVERSATION_ID.match(conversation_id) is not None and _unlink(
            self.conversations / f"{conversation_id}.json"
        )

    @staticmethod
    def _write(directory: Path, name: str, record: Any) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.json"
        temporary = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        temporary.write_bytes(msgspec.json.encode(record))
        os.replace(temporary, path)

    @staticmethod
    def _read(path: Path, kind: type[_T]) -> _T | None:
        try:
            return msgspec.json.decode(path.read_bytes(), type=kind)
        except FileNotFoundError:
            return None


def _unlink(path: Path) -> bool:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False
