"""``agentcell sessions [list | show ID | delete ID]``: the stored sessions, read straight from their logs.

Nothing here starts a runtime: ``list`` and ``show`` only read (a torn last line is skipped, never cut
off, since another process may be writing the session), and ``delete`` refuses a session that a running
runtime holds open.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from runtime.ids import InvalidSessionId, validate_session_id
from runtime.wording import plural


def run_sessions(
    action: str,
    session_id: str | None,
    *,
    config_path: str | None = None,
    sessions_dir: str | None = None,
    out: TextIO | None = None,
) -> int:
    """Run one ``sessions`` action; returns the exit status (2 for a usage error, 1 when the session is
    missing, unreadable or in use)."""
    from runtime.config import ConfigError, load_config
    from runtime.errors import SessionLockedError, SessionNotFound
    from runtime.store.log import CorruptLogError
    from runtime.store.sessions import SessionDirectory

    out = out if out is not None else sys.stdout

    def fail(message: str, status: int = 1) -> int:
        print(f"agentcell sessions {action}: {message}", file=sys.stderr)
        return status

    if action not in ("list", "show", "delete"):
        return fail("the action is list, show or delete", 2)
    try:
        root = sessions_dir if sessions_dir is not None else load_config(config_path).sessions_path
    except ConfigError as exc:
        return fail(str(exc), 2)
    directory = SessionDirectory(root)
    if action == "list":
        _list(directory, out)
        return 0
    if session_id is None:
        return fail("a session id is required", 2)
    try:
        validate_session_id(session_id)
    except InvalidSessionId as exc:
        return fail(str(exc), 2)
    if not directory.exists(session_id):
        return fail(f"no session {session_id!r} in {directory.root}")
    try:
        if action == "delete":
            directory.delete(session_id)
            out.write(f"deleted {session_id}\n")
        else:
            _show(directory, session_id, out)
    except (SessionLockedError, SessionNotFound, CorruptLogError, OSError) as exc:
        return fail(str(exc))
    return 0


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def _list(directory: Any, out: TextIO) -> None:
    infos = sorted(directory.list(), key=lambda i: i.updated_at, reverse=True)
    if not infos:
        out.write(f"no sessions in {directory.root}\n")
        return
    width = max(len("session"), *(len(i.id) for i in infos))
    out.write(f"{'session':<{width}}  {'updated':<16}  {'messages':>8}  model\n")
    for info in infos:
        if info.error is not None:
            out.write(f"{info.id:<{width}}  unreadable: {info.error}\n")
            continue
        out.write(f"{info.id:<{width}}  {_when(info.updated_at)}  {info.messages:>8,}  {info.model or '?'}\n")
    out.write(f"{len(infos)} session{'s' if len(infos) != 1 else ''} in {directory.root}\n")


def _show(directory: Any, session_id: str, out: TextIO) -> None:
    from runtime.store.log import load_tree

    tree, recovery = load_tree(directory.log_path(session_id), repair=False)
    header = tree.header
    assert header is not None  # replaying a log requires one
    messages = tree.messages()
    out.write(
        f"session {session_id} · model {tree.model or header.model or '?'} · "
        f"created {_when(header.created_at)} · {plural(len(messages), 'message')} on the current branch · "
        f"{tree.compaction_count} compaction{'s' if tree.compaction_count != 1 else ''}\n"
    )
    if header.workspace:
        out.write(f"workspace: {header.workspace}\n")
    if header.system_prompt:
        out.write(f"system: {_one_line(header.system_prompt, 300)}\n")
    if recovery.torn:
        out.write(f"(the log ends with a torn line of {recovery.torn_bytes} bytes, left as it is)\n")
    out.write("\n")
    for message in messages:
        out.write(_render(message) + "\n")


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _render(message: Any) -> str:
    """``[role/kind] text``: one line per message, tool calls and results named."""
    from runtime.messages import KIND_TOOL_RESULT

    kind = None if message.kind == KIND_TOOL_RESULT else message.kind
    label = message.role if kind is None else f"{message.role}/{kind}"
    if message.role == "tool":
        label = f"{label} {message.name or ''}{' error' if message.is_error else ''}".rstrip()
        return f"[{label}] {_one_line(message.text, 160)} ({len(message.text):,} chars)"
    parts = []
    if message.text:
        parts.append(_one_line(message.text, 300))
    parts.extend(f"-> {call.name}({_one_line(call.arguments, 80)})" for call in message.tool_calls)
    if not message.user_visible:
        label += ", hidden"
    return f"[{label}] {' '.join(parts) if parts else '(empty)'}"
