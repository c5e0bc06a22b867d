"""``agentcell sessions [list|show ID|delete ID]``: the stored sessions, read straight from their logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from runtime.ids import InvalidSessionId, validate_session_id


def run_sessions(
    action: str,
    session_id: str | None,
    *,
    config_path: str | None = None,
    sessions_dir: str | None = None,
    out: TextIO | None = None,
) -> int:
    from runtime.config import load_config
    from runtime.store.sessions import SessionDirectory

    out = out or sys.stdout
    cfg = load_config(config_path)
    root = cfg.sessions_path if sessions_dir is None else sessions_dir
    directory = SessionDirectory(root)
    if action == "list":
        infos = sorted(directory.list(), key=lambda i: i.updated_at, reverse=True)
        if not infos:
            out.write(f"no sessions in {directory.root}\n")
        for info in infos:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.updated_at))
            out.write(f"{info.id:<28} {when}  {info.messages:>6} messages  {info.model}\n")
        return 0
    if session_id is None:
        print(f"agentcell sessions {action}: a session id is required", file=sys.stderr)
        return 2
    try:
        validate_session_id(session_id)
    except InvalidSessionId as exc:
        print(f"agentcell sessions {action}: {exc}", file=sys.stderr)
        return 2
    if not directory.exists(session_id):
        print(f"agentcell sessions {action}: no session {session_id!r} in {directory.root}", file=sys.stderr)
        return 1
    if action == "delete":
        directory.delete(session_id)
        out.write(f"deleted {session_id}\n")
        return 0
    tree = directory.load_tree(session_id)
    for msg in tree.messages():
        label = msg.role if msg.kind is None else f"{msg.role}/{msg.kind}"
        text = msg.text or ", ".join(f"{c.name}({c.arguments[:60]})" for c in msg.tool_calls)
        out.write(f"[{label}] {text[:300]}\n")
    return 0
