"""Session id validation (design §2.4): an id names a file, so it must never be able to name a path."""

from __future__ import annotations

import re

from runtime.errors import InvalidSessionId

__all__ = ["RESERVED_SUFFIX", "InvalidSessionId", "validate_session_id"]


_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RESERVED_SUFFIX = ".events"
"""``<id>.events.jsonl`` is session ``<id>``'s event transcript, so no id may end with it."""


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a safe id, else raise :class:`InvalidSessionId` saying why.

    Allowed: 1–128 characters of ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a letter
    or digit, never ``..`` anywhere, and not ending with ``.events`` (the transcript's suffix). That rules
    out separators, absolute paths, NUL bytes, control characters, Windows device tricks, hidden files
    and one session's files standing for another's.
    """
    if not isinstance(session_id, str):
        raise InvalidSessionId(f"session id must be a string, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidSessionId("session id must not be empty")
    if "/" in session_id or "\\" in session_id:
        raise InvalidSessionId(f"session id {session_id!r} must not contain a path separator")
    if ".." in session_id:
        raise InvalidSessionId(f"session id {session_id!r} must not contain '..'")
    if len(session_id) > 128:
        raise InvalidSessionId(f"session id is {len(session_id)} characters long; the limit is 128")
    if not _VALID.fullmatch(session_id):
        raise InvalidSessionId(
            f"session id {session_id!r} may only use letters, digits, '.', '_' and '-', "
            "and must start with a letter or digit"
        )
    if session_id.endswith(RESERVED_SUFFIX):
        raise InvalidSessionId(
            f"session id {session_id!r} must not end with {RESERVED_SUFFIX!r}: its log would be the "
            f"event transcript of session {session_id.removesuffix(RESERVED_SUFFIX)!r}"
        )
    return session_id
