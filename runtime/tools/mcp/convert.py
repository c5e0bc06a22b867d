"""From what an MCP server says to what the model sees (design §3.9): tool names, schemas and results.

Pure logic: objects of the ``mcp`` SDK are read by their attributes, so nothing here imports it.

- A server's tool ``search`` becomes ``NAME__search`` for the model. Characters a provider refuses in a
  tool name become ``_``; a name too long (past 64) or clashing after that gets a short hash suffix.
- A tool's input schema must be a valid JSON schema of an object: a provider refuses the whole request
  otherwise, which would break every turn of the session. A tool whose schema is not is left out (and
  reported), never sent.
- A tool result becomes text: text blocks as they are; an image, audio or binary resource is saved to a
  file beside the session and named in the text with its type, size, path and SHA-256 (the model's tool
  messages carry text); an embedded text resource with its URI; a resource link as a line; structured
  content as JSON when there is no other content. ``isError`` makes it an error result.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

MAX_TOOL_NAME: Final = 64
MAX_SCHEMA_BYTES: Final = 64 * 1024
SEPARATOR: Final = "__"
_INVALID = re.compile(r"[^A-Za-z0-9_-]")

SaveFile = Callable[[bytes, str, str], tuple[str, str]]
"""``save(data, kind, mime_type)`` → (path, SHA-256): where a binary part of a result was written."""


def tool_names(server: str, names: Iterable[str]) -> dict[str, str]:
    """The model-facing name of each of a server's tools: ``{exposed: original}``, in the server's order."""
    out: dict[str, str] = {}
    for original in names:
        clean = _INVALID.sub("_", original)
        if not clean:
            continue
        exposed = f"{server}{SEPARATOR}{clean}"
        if len(exposed) > MAX_TOOL_NAME or exposed in out:
            digest = hashlib.sha1(original.encode("utf-8", "replace")).hexdigest()[:8]
            exposed = f"{exposed[: MAX_TOOL_NAME - 9]}_{digest}"
        if exposed not in out:  # (a clash even with the hash would be vanishingly rare: the first wins)
            out[exposed] = original
    return out


def check_schema(schema: Any) -> dict[str, Any] | str:
    """The input schema to send for a tool, or the reason it cannot be sent."""
    if not isinstance(schema, Mapping):
        return f"its input schema is not a JSON object ({type(schema).__name__})"
    data = dict(schema)
    kind = data.get("type", "object")
    if kind != "object":
        return f"its input schema describes {kind!r}, not an object of arguments"
    data["type"] = "object"
    if not isinstance(data.get("properties", {}), Mapping):
        return "its input schema's 'properties' is not an object"
    data.setdefault("properties", {})
    try:
        size = len(json.dumps(data))
    except (TypeError, ValueError) as exc:
        return f"its input schema is not JSON: {exc}"
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is too large ({size:,} bytes; at most {MAX_SCHEMA_BYTES:,})"
    try:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for
    except ImportError:  # (the mcp SDK brings jsonschema; without it the structural checks above stand)
        return data
    try:
        validator_for(data).check_schema(data)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(top level)"
        return f"its input schema is not a valid JSON schema: {exc.message} at {where}"
    except Exception as exc:  # a $ref that cannot resolve, a schema that makes the validator fail
        return f"its input schema could not be checked: {type(exc).__name__}: {exc}"
    return data


def clip_description(text: str | None, limit: int) -> str:
    text = clean_text(text or "")
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 24)].rstrip() + " … [description cut]"


def clean_text(text: str) -> str:
    """Text that encodes as UTF-8 (a JSON ``\\ud800`` escape decodes to a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


@dataclass
class Converted:
    """A tool result as the model gets it."""

    text: str
    is_error: bool
    files: list[dict[str, Any]] = field(default_factory=list)


def convert_result(result: Any, save: SaveFile) -> Converted:
    """An MCP ``CallToolResult`` as text (see the module docstring)."""
    pieces: list[str] = []
    files: list[dict[str, Any]] = []
    for block in getattr(result, "content", None) or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            pieces.append(clean_text(str(getattr(block, "text", ""))))
        elif kind in ("image", "audio"):
            mime = str(getattr(block, "mime_type", None) or "application/octet-stream")
            pieces.append(_binary(kind, mime, getattr(block, "data", ""), save, files))
        elif kind == "resource":
            pieces.append(_resource(getattr(block, "resource", None), save, files))
        elif kind == "resource_link":
            pieces.append(_link(block))
        else:
            pieces.append(f"[a content block of unknown type {str(kind)[:40]!r}]")
    structured = getattr(result, "structured_content", None)
    if not pieces and structured is not None:
        try:
            pieces.append(json.dumps(structured, ensure_ascii=False))
        except (TypeError, ValueError):
            pieces.append(clean_text(repr(structured)))
    return Converted("\n".join(pieces), bool(getattr(result, "is_error", False)), files)


def _binary(kind: str, mime: str, data: Any, save: SaveFile, files: list[dict[str, Any]]) -> str:
    try:
        raw = base64.b64decode(str(data), validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind} ({mime}) whose data is not valid base64: left out]"
    try:
        path, sha = save(raw, kind, mime)
    except OSError as exc:
        return f"[{kind} ({mime}), {len(raw):,} bytes: could not be saved ({exc.strerror or exc})]"
    files.append({"kind": kind, "mime_type": mime, "bytes": len(raw), "path": path, "sha256": sha})
    return f"[{kind} ({mime}), {len(raw):,} bytes, saved to {path} (sha256 {sha})]"


def _resource(resource: Any, save: SaveFile, files: list[dict[str, Any]]) -> str:
    uri = str(getattr(resource, "uri", "") or "")
    mime = getattr(resource, "mime_type", None)
    label = f"{uri} ({mime})" if mime else uri
    text = getattr(resource, "text", None)
    if text is not None:
        return f"[resource {label}]\n{clean_text(str(text))}"
    blob = getattr(resource, "blob", None)
    if blob is not None:
        return f"[resource {label}] " + _binary(
            "resource", str(mime or "application/octet-stream"), blob, save, files
        )
    return f"[resource {label}: no contents]"


def _link(block: Any) -> str:
    parts = [str(getattr(block, "name", "") or ""), str(getattr(block, "uri", "") or "")]
    mime = getattr(block, "mime_type", None)
    if mime:
        parts.append(f"({mime})")
    description = getattr(block, "description", None)
    text = " ".join(p for p in parts if p)
    return f"[resource link: {text}]" + (f" {clean_text(str(description))}" if description else "")
