"""The built-in policy: what the local provider answers when no script names the requested model.

It is deterministic and stateless: the reply depends only on the request. Good enough for the demo:

- a **summarization request** (the system prompt or the last user message asks to summarize a
  ``<conversation>``, or the last user message is a ``<summary-request>`` about the conversation before it)
  gets a structured summary in the requested format (by default design §5.4's headings: Goal / Constraints &
  Preferences / Progress / Key Decisions / Next Steps / Critical Context), derived from the transcript (or
  from the messages themselves, rendered as one);
- an **agent turn** whose user message mentions files gets tool calls, one step per request: list a
  directory when asked, read the files mentioned (in parallel), edit or write the first one when asked
  (``replace "old" with "new"`` becomes an exact ``edit_file``), then a short answer summarizing what
  the tool results said;
- anything else gets a short acknowledgement of the request.

Tool arguments are named after the tool's JSON schema when the request offers one, so the policy works
with any ``read_file``/``write_file``/``edit_file``/``list_dir`` whose parameters look like a path, a
content, and old/new strings.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from runtime.provider.script import ToolCallSpec, Turn

Chat = Sequence[dict[str, Any]]

DEFAULT_HEADINGS: Final = (
    "Goal",
    "Constraints & Preferences",
    "Progress",
    "Key Decisions",
    "Next Steps",
    "Critical Context",
)
NOTE_PREFIX: Final = "Note added by agentcell"

_PATH = re.compile(
    r"(?<![\w/.@:-])((?:\.{0,2}/)?(?:[\w.-]+/)*[\w-][\w.-]*\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])"
)
_DIR = re.compile(r"(?<![\w/.-])((?:\.{0,2}/)?(?:[\w.-]+/)+)(?![\w.-])")
_REPLACE = re.compile(
    r"""replace\s+(["'`])(.+?)\1\s+(?:with|by)\s+(["'`])(.*?)\3""", re.IGNORECASE | re.DOTALL
)
_FENCE = re.compile(r"```[\w-]*\n(.*?)```", re.DOTALL)
_CONTAINING = re.compile(
    r"""(?:containing|with (?:the )?(?:content|text))\s+(["'`])(.*?)\1""", re.IGNORECASE | re.DOTALL
)
_WANTS_LIST = re.compile(r"\b(list|ls|directory|folder|what files)\b", re.IGNORECASE)
_WANTS_EDIT = re.compile(
    r"\b(edit|change|modify|update|fix|replace|append|add|insert|annotate)\b", re.IGNORECASE
)
_WANTS_WRITE = re.compile(r"\b(create|write|save)\b", re.IGNORECASE)
_WANTS_DELEGATE = re.compile(r"\b(delegate|ask a sub-?agent)\b[^:]*:?", re.IGNORECASE)
_SUMMARIZE = re.compile(r"\bsummar(y|ies|ize|ise|izing|ising)\b", re.IGNORECASE)
_LINE_NUMBER = re.compile(r"^\s*\d+(?:\t|: |\| |→ ?)")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CONSTRAINT = re.compile(
    r"\b(must|never|always|do not|don't|should|prefer|avoid|only|without|keep)\b", re.IGNORECASE
)
_DECISION = re.compile(r"\b(I'll|I will|decided|decision|chose|going to|plan|instead)\b", re.IGNORECASE)
_ERROR = re.compile(
    r"^\s*(error|failed|refused)\b|\b(not found|no such file|permission denied)\b", re.IGNORECASE
)
_BLOCK = re.compile(
    r"^\[(User|Assistant|System|Tool result)([^\]\n]*)\]:[ \t]*(.*?)(?=^\[(?:User|Assistant|System|Tool result)[^\]\n]*\]:|\Z)",
    re.MULTILINE | re.DOTALL,
)
_HEADING = re.compile(r"^##\s+(.+?)\s*$", re.MULTILINE)
_CURRENT_REQUEST = re.compile(r"<current-request>\n?(.*?)\n?</current-request>", re.DOTALL)


def respond(messages: Chat, tools: Sequence[dict[str, Any]] | None = None) -> Turn:
    """The policy's reply to a chat request."""
    system_text = "\n".join(text_of(m.get("content")) for m in messages if m.get("role") == "system")
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    user_text = text_of(last_user.get("content")) if last_user else ""
    if _is_summary_request(system_text, user_text):
        return Turn(text=summarize_request(user_text))
    if is_cached_summary_request(messages):
        return Turn(text=summarize_request(transcript_request(messages)))
    return _agent_turn(messages, tools or [])


_SUMMARY_REQUEST: Final = "<summary-request>"
_SUMMARY_PREFIX: Final = "[Previous conversation summary]"


def is_cached_summary_request(messages: Chat) -> bool:
    """Whether the request asks for a summary of its own conversation: its last message is a user message
    holding a ``<summary-request>`` (design §5.4: a summary that rides the conversation's cache)."""
    return (
        bool(messages)
        and messages[-1].get("role") == "user"
        and (text_of(messages[-1].get("content")).lstrip().startswith(_SUMMARY_REQUEST))
    )


def transcript_request(messages: Chat) -> str:
    """A request for a summary of its own conversation, as the transcript prompt it amounts to: the
    messages before the instruction as ``<conversation>`` blocks (a previous summary at their start as
    ``<previous-summary>``; for the beginning of a turn, only the turn since its newest user request) and
    the instruction's format after them."""
    instruction = text_of(messages[-1].get("content"))
    body = [m for m in messages[:-1] if m.get("role") != "system"]
    previous = ""
    if body and body[0].get("role") == "user" and text_of(body[0].get("content")).startswith(_SUMMARY_PREFIX):
        previous, body = text_of(body[0].get("content"))[len(_SUMMARY_PREFIX) :].strip(), body[1:]
    if "## Original Request" in instruction:  # the beginning of a turn: from its newest request on
        start = max((i for i, m in enumerate(body) if m.get("role") == "user"), default=0)
        body = body[start:]
    names = {
        str(call.get("id")): str((call.get("function") or {}).get("name") or "?")
        for m in body
        for call in m.get("tool_calls") or ()
        if isinstance(call, dict)
    }
    blocks: list[str] = []
    for m in body:
        role, text = m.get("role"), text_of(m.get("content"))
        if role == "tool":
            blocks.append(f"[Tool result {names.get(str(m.get('tool_call_id')), '?')}]:\n{text}")
            continue
        label = "User" if role == "user" else "Assistant"
        if text:
            blocks.append(f"[{label}]:\n{text}")
        for call in m.get("tool_calls") or ():
            fn = call.get("function") or {} if isinstance(call, dict) else {}
            blocks.append(f"[{label} tool call]: {fn.get('name')}({fn.get('arguments')})")
    conversation = "\n\n".join(blocks)
    prior = f"<previous-summary>\n{previous}\n</previous-summary>\n\n" if previous else ""
    return f"{prior}<conversation>\n{conversation}\n</conversation>\n\n{instruction}"


def text_of(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _is_summary_request(system_text: str, user_text: str) -> bool:
    if "<conversation>" in user_text:
        return bool(_SUMMARIZE.search(system_text) or _SUMMARIZE.search(user_text))
    # A plain "summarize this" request (e.g. of archived tool results): only from a summarizer-style system
    # prompt, so that an ordinary user asking for a summary of a file still gets tool calls.
    return bool(_SUMMARIZE.search(system_text)) and bool(user_text) and not _PATH.search(user_text[:200])


# ---------------------------------------------------------------------------------------------------
# Agent turns


@dataclass
class _Done:
    """What the current turn has done so far: tool calls with their results."""

    reads: dict[str, str] = field(default_factory=dict)
    read_errors: dict[str, str] = field(default_factory=dict)
    listed: dict[str, str] = field(default_factory=dict)
    modified: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    steps: int = 0
    delegated: str | None = None  # the sub-agent's answer, once the agent tool answered


def _agent_turn(messages: Chat, tools: Sequence[dict[str, Any]]) -> Turn:
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    user_text = text_of(messages[start].get("content")) if start >= 0 else ""
    request = _CURRENT_REQUEST.search(user_text)
    if request:  # a compaction summary that cut into the turn carries the turn's request verbatim
        user_text = request.group(1)
    schemas = _tool_schemas(tools)
    done = _turn_progress(messages[start + 1 :])
    files = _mentioned_files(user_text)
    calls: list[ToolCallSpec] = []
    reasoning = ""
    seed = f"{len(messages)}:{done.steps}"

    delegation = _delegation(user_text, schemas, tools, done, seed)
    if delegation is not None:
        return delegation
    if "list_dir" in schemas and _WANTS_LIST.search(user_text):
        directory = _mentioned_dir(user_text)
        if directory not in done.listed:
            calls.append(_call(schemas, "list_dir", seed, path=directory))
            reasoning = f"The user wants to see what is in {directory}; I'll list it first."
    if not calls and "read_file" in schemas:
        unread = [f for f in files if f not in done.reads and f not in done.read_errors]
        if unread:
            calls = [_call(schemas, "read_file", seed, path=f) for f in unread]
            reasoning = (
                f"The user mentions {_join(unread)}; I'll read {'it' if len(unread) == 1 else 'them'} first."
            )
    if not calls and files:
        edit = _edit_step(user_text, files[0], done, schemas, seed)
        if edit is not None:
            calls.append(edit)
            reasoning = f"I have what I need from {files[0]}; now I'll make the change the user asked for."
    if calls:
        return Turn(reasoning=reasoning, tool_calls=tuple(calls))
    return Turn(reasoning=_final_reasoning(done, user_text), text=_answer(user_text, files, done))


def _delegation(
    user_text: str,
    schemas: dict[str, dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    done: _Done,
    seed: str,
) -> Turn | None:
    """A prompt that asks to delegate ("Delegate to a sub-agent: <task>") calls the ``agent`` tool with
    the first profile it offers, once; with the sub-agent's answer in view, the turn reports it."""
    match = _WANTS_DELEGATE.search(user_text)
    if match is None or "agent" not in schemas:
        return None
    if done.delegated is not None:
        return Turn(text=f"The sub-agent reported:\n{done.delegated.strip()}")
    profiles = _profiles(tools)
    if not profiles:
        return None
    task = user_text[match.end() :].strip(" :.-") or user_text
    args = json.dumps({"profile": profiles[0], "task": task}, ensure_ascii=False)
    digest = hashlib.sha256(f"{seed}:agent:{args}".encode()).hexdigest()[:24]
    call = ToolCallSpec(name="agent", arguments=args, id=f"call_{digest}")
    return Turn(
        reasoning=f"This is a task for the {profiles[0]} sub-agent; I'll delegate it.", tool_calls=(call,)
    )


def _profiles(tools: Sequence[dict[str, Any]]) -> list[str]:
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name") == "agent":
            enum = (((fn.get("parameters") or {}).get("properties") or {}).get("profile") or {}).get("enum")
            return [str(p) for p in enum] if isinstance(enum, list) else []
    return []


def _edit_step(
    user_text: str, path: str, done: _Done, schemas: dict[str, dict[str, Any]], seed: str
) -> ToolCallSpec | None:
    if path in done.modified:
        return None
    wants_write = bool(_WANTS_WRITE.search(user_text))
    wants_edit = bool(_WANTS_EDIT.search(user_text))
    if not (wants_write or wants_edit):
        return None
    replace = _REPLACE.search(user_text)
    original = done.reads.get(path)
    if replace and original is not None and "edit_file" in schemas:
        return _call(schemas, "edit_file", seed, path=path, old=replace.group(2), new=replace.group(4))
    if "write_file" in schemas and (wants_write or original is None):
        return _call(schemas, "write_file", seed, path=path, content=_new_content(user_text, path))
    if original is None:
        return None
    note = _note_line(path, user_text)
    lines = [line for line in original.splitlines() if line.strip()]
    anchor = lines[-1] if lines else ""
    if "edit_file" in schemas and anchor and original.count(anchor) == 1:
        return _call(schemas, "edit_file", seed, path=path, old=anchor, new=f"{anchor}\n{note}")
    if "write_file" in schemas:
        return _call(schemas, "write_file", seed, path=path, content=f"{original.rstrip()}\n{note}\n")
    return None


def _new_content(user_text: str, path: str) -> str:
    for pattern in (_FENCE, _CONTAINING):
        match = pattern.search(user_text)
        if match:
            return match.group(match.lastindex or 1)
    return _note_line(path, user_text) + "\n"


_COMMENT_SYNTAX: Final = {
    **dict.fromkeys(("py", "sh", "toml", "yaml", "yml", "rb", "pl", "r", "cfg", "ini", "conf"), ("# ", "")),
    **dict.fromkeys(
        ("js", "ts", "jsx", "tsx", "c", "h", "cc", "cpp", "go", "rs", "java", "kt", "swift"), ("// ", "")
    ),
    **dict.fromkeys(("html", "xml", "svg"), ("<!-- ", " -->")),
    **dict.fromkeys(("css", "scss"), ("/* ", " */")),
    **dict.fromkeys(("sql", "lua", "hs"), ("-- ", "")),
}


def _note_line(path: str, user_text: str) -> str:
    """A line recording the request, as a comment in the file's language (plain text for prose files)."""
    start, end = _COMMENT_SYNTAX.get(path.rsplit(".", 1)[-1].lower(), ("", ""))
    return f"{start}{NOTE_PREFIX}: {_first_sentence(user_text, 80)}{end}"


def _turn_progress(turn: Chat) -> _Done:
    done = _Done()
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    for message in turn:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                fn = call.get("function") or {}
                calls[str(call.get("id"))] = (str(fn.get("name") or ""), _loads(fn.get("arguments")))
                done.steps += 1
        elif message.get("role") == "tool":
            name, args = calls.get(str(message.get("tool_call_id")), ("", {}))
            result = text_of(message.get("content"))
            path = _path_arg(args)
            failed = bool(_ERROR.search(result[:200]))
            if failed:
                done.errors.append(f"{name}({path}): {_first_line(result)}")
            if name == "read_file" and path:
                (done.read_errors if failed else done.reads)[path] = (
                    result if failed else _strip_line_numbers(result)
                )
            elif name == "list_dir":
                done.listed[path or "."] = result
            elif name in ("write_file", "edit_file") and path:
                done.modified[path] = result
            elif name == "agent":
                done.delegated = result
    return done


def _answer(user_text: str, files: list[str], done: _Done) -> str:
    lines: list[str] = []
    for directory, listing in done.listed.items():
        entries = _entries(listing)
        lines.append(f"- `{directory}` holds {len(entries)} entries: {_join(entries[:8])}.")
    for path, content in done.reads.items():
        body = [line for line in content.splitlines() if line.strip()]
        first = f" It starts with: `{_clip(body[0].strip(), 80)}`." if body else " It is empty."
        lines.append(
            f"- I read `{path}` ({len(content.splitlines())} lines, {len(content)} characters).{first}"
        )
    for path, result in done.modified.items():
        lines.append(f"- I changed `{path}`: {_first_line(result)}")
    for error in done.errors:
        lines.append(f"- Problem: {error}")
    if not lines:
        request = _first_sentence(user_text, 160) or "(an empty message)"
        return (
            f'You asked: "{request}". I am the local agentcell provider: mention a file and I will read it.'
        )
    return "Here is what I did:\n" + "\n".join(lines) + "\nDone."


_LISTING_HEADER: Final = re.compile(r"(\(\d[\d,]* entries\)|is empty|:)\s*$")


def _entries(listing: str) -> list[str]:
    """Entry names of a directory listing: a header line and per-entry details (sizes) left out."""
    rows = [row.strip() for row in listing.splitlines() if row.strip()]
    if rows and _LISTING_HEADER.search(rows[0]):
        rows = rows[1:]
    return [re.split(r"\s{2,}|\t| -> ", row, maxsplit=1)[0] for row in rows if not row.startswith("[")]


def _final_reasoning(done: _Done, user_text: str) -> str:
    if done.steps == 1:
        return "The tool call of this turn has its result; time to report back."
    if done.steps:
        return f"All {done.steps} tool calls of this turn have results; time to report back."
    return f"No file to work on in: {_first_sentence(user_text, 60)!r}. A short answer will do."


def _tool_schemas(tools: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters") or {}
            out[fn["name"]] = params.get("properties") or {} if isinstance(params, dict) else {}
    return out


_ROLE_NAMES: Final = {
    "path": ("path", "file_path", "filepath", "file", "filename", "directory", "dir"),
    "content": ("content", "contents", "text", "data", "body"),
    "old": ("old", "old_string", "old_text", "old_str", "search", "find"),
    "new": ("new", "new_string", "new_text", "new_str", "replace", "replacement"),
}


def _call(schemas: dict[str, dict[str, Any]], name: str, seed: str, **values: str) -> ToolCallSpec:
    """A tool call whose argument names follow the tool's schema (``path``/``content``/``old``/``new`` roles)."""
    properties = schemas.get(name) or {}
    args: dict[str, str] = {}
    for role, value in values.items():
        key = next((p for p in _ROLE_NAMES[role] if p in properties), None)
        if key is None:
            key = next((p for p in properties if role in p.lower()), role)
        args[key] = value
    arguments = json.dumps(args, ensure_ascii=False)
    digest = hashlib.sha256(f"{seed}:{name}:{arguments}".encode()).hexdigest()[:24]
    return ToolCallSpec(name=name, arguments=arguments, id=f"call_{digest}")


def _path_arg(args: dict[str, Any]) -> str:
    for key in _ROLE_NAMES["path"]:
        value = args.get(key)
        if isinstance(value, str):
            return value
    return ""


def _mentioned_files(text: str) -> list[str]:
    seen: list[str] = []
    for match in _PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if (
            len(path) >= 4
            and "://" not in text[max(0, match.start() - 8) : match.start() + 3]
            and path not in seen
        ):
            seen.append(path)
    return seen[:3]


def _mentioned_dir(text: str) -> str:
    match = _DIR.search(text)
    return match.group(1).rstrip("/") or "." if match else "."


def _strip_line_numbers(text: str) -> str:
    lines = text.splitlines()
    numbered = [line for line in lines if _LINE_NUMBER.match(line)]
    if lines and len(numbered) >= max(1, int(len(lines) * 0.8)):
        return "\n".join(_LINE_NUMBER.sub("", line, count=1) for line in lines)
    return text


def _loads(arguments: Any) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------------------------------------
# Summaries


@dataclass
class _Transcript:
    user: list[str] = field(default_factory=list)
    assistant: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    blocks: int = 0


def summarize_request(prompt: str) -> str:
    """A structured summary of the ``<conversation>`` in ``prompt``, in the headings the prompt asks for."""
    conversation = _between(prompt, "<conversation>", "</conversation>")
    if conversation is None:
        return _plain_summary(prompt)
    previous = _between(prompt, "<previous-summary>", "</previous-summary>") or ""
    after = prompt[prompt.rfind("</conversation>") :]
    headings = [h for h in _HEADING.findall(after)] or list(DEFAULT_HEADINGS)
    transcript = _parse_transcript(conversation)
    sections = [f"## {heading}\n{_section(heading, transcript, previous)}" for heading in headings]
    return "\n\n".join(sections)


def _plain_summary(text: str) -> str:
    sentences = [s for s in _SENTENCE.split(" ".join(text.split())) if s]
    return "Summary: " + _clip(" ".join(sentences[:3]), 600)


def _parse_transcript(conversation: str) -> _Transcript:
    out = _Transcript()
    for match in _BLOCK.finditer(conversation):
        role, label, body = match.group(1), match.group(2).strip(), match.group(3).strip()
        out.blocks += 1
        for path in _mentioned_files(body):
            if path not in out.files:
                out.files.append(path)
        if role == "User" and "summary" not in label:
            out.user.append(body)
        elif role == "Assistant" and "tool call" in label:
            out.calls.append(_clip(body, 100))
        elif role == "Assistant" and "thinking" not in label:
            out.assistant.append(body)
        elif role == "Tool result" and ("error" in label or _ERROR.search(body[:200])):
            out.errors.append(f"{label or 'tool'}: {_first_line(body)}")
    if not out.blocks:
        out.user.append(conversation.strip())
    return out


def _section(heading: str, t: _Transcript, previous: str) -> str:
    key = heading.lower()
    if "goal" in key or "request" in key:
        carried = _previous_section(previous, "Goal")
        first = _first_sentence(t.user[0], 200) if t.user else ""
        return _bullets(
            [carried, first] if carried and first and first not in carried else [carried or first]
        )
    if "constraint" in key or "preference" in key:
        found = [s for text in t.user for s in _sentences(text) if _CONSTRAINT.search(s)]
        return _bullets(_unique(found)[:4])
    if "progress" in key:
        done = _unique(t.calls)[-6:] + (
            [f"Answered: {_first_sentence(t.assistant[-1], 120)}"] if t.assistant else []
        )
        current = [_first_sentence(t.user[-1], 160)] if t.user else []
        return (
            f"### Done\n{_bullets(done)}\n### In Progress\n{_bullets(current)}\n"
            f"### Blocked\n{_bullets(_unique(t.errors)[-3:])}"
        )
    if "decision" in key:
        found = [s for text in t.assistant for s in _sentences(text) if _DECISION.search(s)]
        return _bullets(_unique(found)[-3:])
    if "next" in key:
        return f"1. Continue with: {_first_sentence(t.user[-1], 160)}" if t.user else "(none)"
    # Critical Context and anything else the format asks for.
    counts = f"{t.blocks} transcript entries ({len(t.user)} from the user, {len(t.calls)} tool calls)"
    files = f"Files: {_join(t.files[:12])}." if t.files else "Files: (none)."
    return f"- {files}\n- {counts}."


def _previous_section(previous: str, heading: str) -> str:
    match = re.search(
        rf"^##\s+{re.escape(heading)}\s*\n(.*?)(?=^##\s|\Z)", previous, re.MULTILINE | re.DOTALL
    )
    return match.group(1).strip().lstrip("- ").strip() if match else ""


def _bullets(items: Sequence[str]) -> str:
    items = [i for i in items if i]
    return "\n".join(f"- {_clip(i, 200)}" for i in items) if items else "(none)"


def _between(text: str, start: str, end: str) -> str | None:
    i = text.find(start)
    j = text.rfind(end)
    if i < 0 or j < i:
        return None
    return text[i + len(start) : j]


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(" ".join(text.split())) if s.strip()]


def _first_sentence(text: str, limit: int) -> str:
    sentences = _sentences(text)
    return _clip(sentences[0], limit) if sentences else ""


def _first_line(text: str) -> str:
    return _clip(next((line.strip() for line in text.splitlines() if line.strip()), ""), 160)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _join(items: Sequence[str]) -> str:
    return ", ".join(f"`{i}`" if "`" not in i else i for i in items)
