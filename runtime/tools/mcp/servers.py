"""MCP server definitions (design §3.9): parsing them, and what of them a session log may keep.

Pure logic, no I/O and no ``mcp`` import. A definition is a :class:`~runtime.config.McpServerConfig`;
sessions name theirs (``start_session(mcp_servers={"fs": {...}})``, ``agentcell chat --mcp "fs=CMD ARGS"``).
A session's own servers are written to its log header so that a resumed session gets them again, with
every value that looks like a credential withheld (design §9): the header keeps :data:`WITHHELD` in its place,
and a server with a withheld value does not start until the value is given again (or written as
``${VAR}``, a reference to the runtime's environment, which is stored as written).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec

from runtime.config import ConfigError, McpServerConfig, check_mcp_server_name

WITHHELD: Final = "<withheld: looks like a secret>"
"""What a session log keeps in place of an ``env`` or ``headers`` value that looks like a credential."""

_SECRET_NAME = re.compile(
    r"(?:^|[_-])(?:api[_-]?key|key|secret|token|access[_-]?token|password|passwd|pass|pwd|auth|"
    r"authorization|credentials?|cookie|session|pat|bearer|signature)$",
    re.I,
)
_SECRET_VALUE = re.compile(
    r"^(?:bearer|basic|token)\s+\S+|^(?:sk|pk|rk|ghp|gho|ghs|github_pat|xox[abpr]|glpat)[-_]", re.I
)
_OPAQUE = re.compile(r"^[A-Za-z0-9_\-+=.]{24,}$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def looks_secret(name: str, value: str) -> bool:
    """Whether an ``env``/``headers`` entry looks like a credential: by its name (``GITHUB_TOKEN``,
    ``Authorization``, ``X-Api-Key``), or its value (``Bearer ...``, ``sk-...``, a long opaque string of
    letters and digits). A value made only of ``${VAR}`` references is never one: it names, not holds."""
    if not value or _REFERENCE.sub("", value).strip() == "":
        return False
    if _SECRET_NAME.search(name) or _SECRET_VALUE.search(value.strip()):
        return True
    text = value.strip()
    return (
        bool(_OPAQUE.match(text))
        and any(c.isdigit() for c in text)
        and any(c.isupper() for c in text)
        and any(c.islower() for c in text)
    )


def redact_url(url: str) -> str:
    """``url`` without its user information and with secret-looking query values withheld."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "WITHHELD" if looks_secret(k, v) else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def parse_servers(value: Any) -> dict[str, McpServerConfig]:
    """Server definitions from what a user passes: a mapping of name → :class:`McpServerConfig` (or a
    mapping of its fields), or command lines / URLs as ``agentcell chat --mcp`` takes them. Raises
    :class:`ConfigError` naming the server and what is wrong."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping):
        out: dict[str, McpServerConfig] = {}
        for name, spec in value.items():
            try:
                check_mcp_server_name(name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            out[name] = _server(name, spec)
        return out
    servers: dict[str, McpServerConfig] = {}
    for line in value:
        if not isinstance(line, str):
            raise ConfigError(f"an MCP server is a command line or a URL, not {type(line).__name__}")
        name, server = parse_command_line(line, taken=servers)
        servers[name] = server
    return servers


def _server(name: str, spec: Any) -> McpServerConfig:
    if isinstance(spec, McpServerConfig):
        return spec
    if not isinstance(spec, Mapping):
        raise ConfigError(f"MCP server {name!r}: expected a table of settings, not {type(spec).__name__}")
    try:
        return msgspec.convert(dict(spec), McpServerConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"MCP server {name!r}: {exc}") from None


def parse_command_line(text: str, *, taken: Iterable[str] = ()) -> tuple[str, McpServerConfig]:
    """``"[NAME=]COMMAND ARGS..."`` (stdio) or ``"[NAME=]URL"`` (streamable HTTP) → name and definition.

    Without ``NAME=`` the name comes from the URL's host or the command's script (``python srv.py`` →
    ``srv``), made unique among ``taken`` with a ``-2``, ``-3``... suffix.
    """
    text = text.strip()
    name: str | None = None
    head, sep, rest = text.partition("=")
    if sep and head and " " not in head and "/" not in head and ":" not in head:
        try:
            name = check_mcp_server_name(head)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        text = rest.strip()
    if not text:
        raise ConfigError("an MCP server needs a command line or a URL")
    if text.startswith(("http://", "https://")):
        server = McpServerConfig(url=text)
        guess = urlsplit(text).hostname or "http"
    else:
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(f"cannot parse the MCP server command {text[:80]!r}: {exc}") from None
        server = McpServerConfig(command=argv[0], args=argv[1:])
        guess = _name_from_argv(argv)
    if name is None:
        name = unique_name(_sanitize(guess), taken)
    elif name in set(taken):
        raise ConfigError(f"two MCP servers are named {name!r}")
    return name, server


def _name_from_argv(argv: list[str]) -> str:
    runners = {"python", "python3", "node", "deno", "bun", "uv", "uvx", "npx", "pipx", "sh", "bash"}
    for arg in argv[1:] if os.path.basename(argv[0]).split(".")[0] in runners or "python" in argv[0] else []:
        if arg.startswith("-") or arg in ("run", "exec", "-m"):
            continue
        return os.path.splitext(os.path.basename(arg.rstrip("/")))[0].split("@")[0]
    return os.path.splitext(os.path.basename(argv[0]))[0]


def _sanitize(guess: str) -> str:
    name = re.sub(r"[^A-Za-z0-9-]+", "_", guess).strip("_-")[:32].strip("_") or "mcp"
    return re.sub(r"_+", "_", name) if name[0].isalnum() else f"s{name}"[:32]


def unique_name(base: str, taken: Iterable[str]) -> str:
    names = set(taken)
    if base not in names:
        return base
    for i in range(2, 1000):
        candidate = f"{base[:28]}-{i}"
        if candidate not in names:
            return candidate
    raise ConfigError("too many MCP servers with the same name")


def stored(servers: Mapping[str, McpServerConfig]) -> dict[str, Any]:
    """What a session log keeps of its own servers: every setting, secrets withheld (see module doc)."""
    out: dict[str, Any] = {}
    for name, server in servers.items():
        data: dict[str, Any] = msgspec.to_builtins(server)
        data["args"] = redact_args(server.args)
        data["env"] = {k: WITHHELD if looks_secret(k, v) else v for k, v in server.env.items()}
        data["headers"] = {k: WITHHELD if looks_secret(k, v) else v for k, v in server.headers.items()}
        if server.url is not None:
            data["url"] = redact_url(server.url)
        out[name] = {k: v for k, v in data.items() if v not in (None, [], {})}
    return out


def restored(data: Mapping[str, Any]) -> dict[str, McpServerConfig]:
    """The servers of a session log's header (see :func:`stored`); entries that no longer parse are skipped."""
    out: dict[str, McpServerConfig] = {}
    for name, spec in data.items():
        try:
            out[check_mcp_server_name(name)] = _server(name, spec)
        except (ValueError, ConfigError):
            continue
    return out


def redact_args(args: Iterable[str]) -> list[str]:
    """Command-line arguments with credentials withheld: a value that looks like one, the value after a
    flag named like one (``--token X``), or the value of ``--api-key=X``."""
    out: list[str] = []
    after_flag = False
    for arg in args:
        flag, eq, value = arg.partition("=")
        if after_flag and not arg.startswith("-"):
            out.append(WITHHELD)
        elif eq and flag.startswith("-") and looks_secret(flag.lstrip("-"), value or "x"):
            out.append(f"{flag}={WITHHELD}")
        elif looks_secret("", arg):
            out.append(WITHHELD)
        else:
            out.append(arg)
        after_flag = arg.startswith("-") and not eq and bool(_SECRET_NAME.search(arg.lstrip("-")))
    return out


def withheld(server: McpServerConfig) -> list[str]:
    """The settings of ``server`` whose values a session log withheld (they must be given again)."""
    names = [f"argument {i + 1}" for i, a in enumerate(server.args) if WITHHELD in a]
    names += [f"env {k}" for k, v in server.env.items() if v == WITHHELD]
    names += [f"header {k}" for k, v in server.headers.items() if v == WITHHELD]
    return names


def secret_values(server: McpServerConfig, environ: Mapping[str, str]) -> list[str]:
    """The values of ``server``'s settings that look like credentials (as written and as expanded), to be
    cut out of anything said about the server: its stderr, error messages (see :func:`scrub`)."""
    values: list[str] = []
    for mapping in (server.env, server.headers):
        for key, value in mapping.items():
            if value != WITHHELD and (looks_secret(key, value) or _SECRET_NAME.search(key)):
                values.append(value)
                try:
                    values.append(expand(value, environ))
                except KeyError:
                    pass
    for original, redacted in zip(server.args, redact_args(server.args)):
        if redacted != original:
            values.append(original.partition("=")[2] if "=" in redacted else original)
    if server.url is not None:
        parts = urlsplit(server.url)
        values.extend(v for v in (parts.password, parts.username) if v)
        values.extend(v for k, v in parse_qsl(parts.query) if looks_secret(k, v))
    words = [v.split()[-1] for v in values if v.split()]  # the token of "Bearer <token>" on its own too
    return sorted({v for v in (*values, *words) if len(v) >= 6}, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``<withheld>``."""
    for value in secrets:
        if value in text:
            text = text.replace(value, "<withheld>")
    return text


def has_reference(value: str) -> bool:
    """Whether ``value`` names a variable of the runtime's environment (``${NAME}``)."""
    return _REFERENCE.search(value) is not None


def expand(value: str, environ: Mapping[str, str]) -> str:
    """``value`` with each ``${NAME}`` replaced by the runtime's environment variable; a ``KeyError``
    names a variable that is not set."""

    def sub(match: re.Match[str]) -> str:
        return environ[match.group(1)]

    return _REFERENCE.sub(sub, value)


def describe(server: McpServerConfig) -> str:
    """A one-line description without secrets, for logs and errors."""
    if server.url is not None:
        return redact_url(server.url)
    return shlex.join([server.command or "", *redact_args(server.args)])[:200]
