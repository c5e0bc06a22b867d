"""The built-in tools (SPEC 3.4): read_file, write_file, edit_file, list_dir, grep, and shell.

File tools work inside the session's workspace only (see :mod:`runtime.tools.workspace`); paths in their
results are relative to it. Their docstrings are what the model reads as the tools' descriptions.

``shell`` is off unless the session enables it (``agent.shell_enabled``): it runs ``/bin/sh -c`` in the
workspace in its own process group, streams output as it comes, keeps the tail of the output in the
result and the whole of it in a log file under the session's logs directory, and kills the whole
process group on timeout or abort. Environment variables that look like credentials (``*_API_KEY``,
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*CREDENTIAL*``) are not passed to the command.
"""

from __future__ import annotations

import codecs
import fnmatch
import itertools
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from runtime.context.tool_output import decode_output
from runtime.tools.registry import ToolContext, ToolError, ToolRegistry, tool

MAX_LINE_CHARS: Final = 2_000  # read_file: longer lines are cut
GREP_LINE_CHARS: Final = 300
GREP_MAX_FILE_BYTES: Final = 10 * 1024 * 1024
LIST_MAX_ENTRIES: Final = 1_000
SHELL_TAIL_BYTES: Final = 64 * 1024
# shell enforces ctx.shell_timeout itself (and kills its process group); the executor's per-tool timeout
# must not cut it short, so the shell tool carries a long one of its own.
SHELL_EXECUTOR_TIMEOUT: Final = 24 * 3600.0
SKIPPED_DIRS: Final = frozenset({".git", ".hg", ".svn", "__pycache__"})
_SNIFF: Final = 8 * 1024
_SECRET_ENV = re.compile(r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


@tool
def read_file(path: str, offset: int = 1, limit: int = 2000, *, ctx: ToolContext) -> str:
    """Read a text file of the workspace. Each line is prefixed with its number and a tab.

    Args:
        path: File path, relative to the workspace root.
        offset: Line number to start from (1 = first line).
        limit: Maximum number of lines to return.
    """
    ws = ctx.require_workspace()
    real = ws.resolve(path)
    rel = ws.relative(real)
    if offset < 1 or limit < 1:
        raise ToolError("offset and limit must be at least 1")
    _require_file(real, rel)
    if _is_binary(real):
        raise ToolError(
            f"{rel} is a binary file ({real.stat().st_size:,} bytes); read_file shows text files only"
        )
    out: list[str] = []
    with real.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(itertools.islice(fh, offset - 1, offset - 1 + limit), start=offset):
            line = line.rstrip("\r\n")
            if len(line) > MAX_LINE_CHARS:
                line = f"{line[:MAX_LINE_CHARS]}… [line cut at {MAX_LINE_CHARS:,} of {len(line):,} chars]"
            out.append(f"{number:>6}\t{line}")
        remaining = sum(1 for _ in fh)
    total = offset - 1 + len(out) + remaining
    if not out:
        if total == 0:
            return f"[{rel} is empty]"
        raise ToolError(f"offset {offset} is past the end of {rel} ({total:,} lines)")
    last = offset + len(out) - 1
    if remaining:
        out.append(f"[lines {offset:,}-{last:,} of {total:,}; continue with offset={last + 1}]")
    return "\n".join(out)


@tool
def write_file(path: str, content: str, *, ctx: ToolContext) -> str:
    """Create or overwrite a file in the workspace with the given content (parent directories are created).

    Args:
        path: File path, relative to the workspace root.
        content: The complete new content of the file.
    """
    ws = ctx.require_workspace()
    real = ws.resolve(path)
    rel = ws.relative(real)
    if real.is_dir():
        raise ToolError(f"{rel} is a directory")
    existed = real.exists()
    if existed:
        _require_regular(real, rel)
    real.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8", errors="replace")
    real.write_bytes(data)
    lines = content.count("\n") + (0 if not content or content.endswith("\n") else 1)
    return f"{'Overwrote' if existed else 'Created'} {rel}: {len(data):,} bytes, {lines:,} lines"


@tool
def edit_file(path: str, old: str, new: str, replace_all: bool = False, *, ctx: ToolContext) -> str:
    """Replace exact text in a file. `old` must match the file exactly (whitespace and indentation too) and,
    unless replace_all is true, exactly once: include enough surrounding lines to make it unique.

    Args:
        path: File path, relative to the workspace root.
        old: The exact text to replace.
        new: The replacement text.
        replace_all: Replace every occurrence instead of requiring exactly one.
    """
    ws = ctx.require_workspace()
    real = ws.resolve(path)
    rel = ws.relative(real)
    _require_file(real, rel)
    if not old:
        raise ToolError("old must not be empty (use write_file to create or overwrite a file)")
    if old == new:
        raise ToolError("old and new are identical; nothing to change")
    try:
        text = real.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{rel} is not UTF-8 text; edit_file edits text files only") from None
    count = text.count(old)
    if count == 0:
        hint = ""
        if old.strip() and old.strip() in text:
            hint = (
                " (it does match when leading/trailing whitespace is ignored: check indentation and newlines)"
            )
        raise ToolError(f"old text not found in {rel}{hint}; read the file and copy the exact text")
    if count > 1 and not replace_all:
        raise ToolError(
            f"old text matches {count} times in {rel}; include more surrounding context to make it unique, "
            "or set replace_all=true to replace every occurrence"
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    real.write_bytes(updated.encode("utf-8"))
    replaced = count if replace_all else 1
    return f"Edited {rel}: replaced {replaced} occurrence{'s' if replaced != 1 else ''}"


@tool
def list_dir(path: str = ".", *, ctx: ToolContext) -> str:
    """List a directory of the workspace: subdirectories end with '/', files show their size.

    Args:
        path: Directory path, relative to the workspace root.
    """
    ws = ctx.require_workspace()
    real = ws.resolve(path)
    rel = ws.relative(real)
    if not real.exists():
        raise ToolError(f"{rel}: no such directory")
    if not real.is_dir():
        raise ToolError(f"{rel} is a file, not a directory")
    entries = sorted(os.scandir(real), key=lambda e: (not e.is_dir(follow_symlinks=False), e.name))
    lines: list[str] = []
    for entry in entries[:LIST_MAX_ENTRIES]:
        if entry.is_symlink():
            target = os.readlink(entry.path)
            inside = ws.contains(Path(entry.path))
            lines.append(f"{entry.name} -> {target}{'' if inside else '  (outside the workspace)'}")
        elif entry.is_dir():
            lines.append(f"{entry.name}/")
        else:
            lines.append(f"{entry.name}  ({entry.stat().st_size:,} bytes)")
    if len(entries) > LIST_MAX_ENTRIES:
        lines.append(f"[{len(entries) - LIST_MAX_ENTRIES:,} more entries not shown]")
    header = f"{rel}/ ({len(entries):,} entries)" if entries else f"{rel}/ is empty"
    return "\n".join([header, *lines])


@tool
def grep(
    pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100, *, ctx: ToolContext
) -> str:
    """Search file contents with a Python regular expression. Prints matches as path:line: text.
    Binary files and .git directories are skipped.

    Args:
        pattern: Python regular expression (re module syntax).
        path: File or directory to search, relative to the workspace root.
        glob: Only search files whose name (or relative path, if the glob contains '/') matches, e.g. '*.py'.
        max_results: Stop after this many matching lines.
    """
    ws = ctx.require_workspace()
    real = ws.resolve(path)
    if not real.exists():
        raise ToolError(f"{ws.relative(real)}: no such file or directory")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    if max_results < 1:
        raise ToolError("max_results must be at least 1")
    matches: list[str] = []
    files = 0
    for file in _walk(real):
        if ctx.cancelled.is_set() or len(matches) >= max_results:
            break
        rel = ws.relative(file) if file.is_relative_to(ws.root) else file.as_posix()
        if glob and not fnmatch.fnmatch(rel if "/" in glob else file.name, glob):
            continue
        if not ws.contains(file) or not _searchable(file):
            continue
        files += 1
        with file.open(encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, start=1):
                if regex.search(line):
                    text = line.rstrip("\r\n")
                    if len(text) > GREP_LINE_CHARS:
                        text = text[:GREP_LINE_CHARS] + "…"
                    matches.append(f"{rel}:{number}: {text}")
                    if len(matches) >= max_results:
                        break
    if not matches:
        return f"No matches for {pattern!r} ({files:,} files searched)"
    if len(matches) >= max_results:
        matches.append(f"[stopped at max_results={max_results}; narrow the pattern, path or glob for more]")
    return "\n".join(matches)


@tool(name="shell", timeout=SHELL_EXECUTOR_TIMEOUT)
def shell_tool(command: str, timeout: float | None = None, *, ctx: ToolContext) -> str:
    """Run a shell command (/bin/sh -c) in the workspace directory. Returns the exit code and the end of
    the output (stdout and stderr together); the full output is saved to a log file named in the result.

    Args:
        command: The command line to run.
        timeout: Seconds before the command is killed (capped by the session's shell timeout).
    """
    if not ctx.shell_enabled:
        raise ToolError("the shell tool is disabled for this session (set agent.shell_enabled to enable it)")
    ws = ctx.require_workspace()
    limit = ctx.shell_timeout if timeout is None else max(0.1, min(float(timeout), ctx.shell_timeout))
    ctx.logs_dir.mkdir(parents=True, exist_ok=True)
    log_path = ctx.logs_dir / f"shell-{_safe(ctx.call_id) or os.urandom(6).hex()}.log"
    run = _ShellRun(command, ws.root, log_path, ctx)
    status = run.wait(limit)
    tail = decode_output(bytes(run.tail)).rstrip("\n")
    shown = (
        f"[output: {run.total:,} bytes, last {len(run.tail):,} shown; full output in {log_path}]"
        if run.total > len(run.tail)
        else f"[full output in {log_path}]"
    )
    if status == "timeout":
        raise ToolError(f"command timed out after {limit:g} s; its process group was killed\n{tail}\n{shown}")
    if status == "cancelled":
        raise ToolError(f"command aborted; its process group was killed\n{tail}\n{shown}")
    body = tail if tail else "(no output)"
    return f"{body}\n[exit code {run.returncode}] {shown}"


def builtin_registry(shell: bool = False) -> ToolRegistry:
    """A registry with the built-in file tools, and ``shell`` when ``shell`` is true."""
    registry = ToolRegistry([read_file, write_file, edit_file, list_dir, grep])
    if shell:
        registry.register(shell_tool)
    return registry


# ---------------------------------------------------------------------------------------------------


class _ShellRun:
    """One shell command: its process group, its log file, and the tail of its output."""

    def __init__(self, command: str, cwd: Path, log_path: Path, ctx: ToolContext) -> None:
        self.ctx = ctx
        self.tail = bytearray()
        self.total = 0
        self.returncode: int | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        env = {k: v for k, v in os.environ.items() if not _SECRET_ENV.search(k)}
        self._log = log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        except BaseException:
            self._log.close()
            raise

    def wait(self, limit: float) -> str:
        """Read output until the command ends: "done", "timeout" or "cancelled".

        The process group is killed in every case, so background children do not outlive the call.
        """
        stdout = self.proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + limit
        exited_at: float | None = None
        eof = False
        status = "done"
        with selectors.DefaultSelector() as sel, self._log:
            sel.register(stdout, selectors.EVENT_READ)
            while True:
                if self.ctx.cancelled.is_set():
                    status = "cancelled"
                    break
                now = time.monotonic()
                if now >= deadline:
                    status = "timeout"
                    break
                if self.proc.poll() is not None:
                    if eof:
                        break
                    exited_at = now if exited_at is None else exited_at
                    if now - exited_at > 0.5:
                        break  # a background child holds the pipe open: stop here
                if eof:
                    time.sleep(0.05)  # stdout closed, the process still running
                elif sel.select(timeout=min(0.1, deadline - now)):
                    chunk = os.read(stdout.fileno(), 65536)
                    if chunk:
                        self._take(chunk)
                    else:
                        eof = True
                        sel.unregister(stdout)
            self._kill_group()
            stdout.close()
        self.returncode = self.proc.returncode
        return status

    def _take(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._log.write(chunk)
        self.tail += chunk
        if len(self.tail) > SHELL_TAIL_BYTES:
            del self.tail[: len(self.tail) - SHELL_TAIL_BYTES]
        text = self._decoder.decode(chunk)
        if text:
            try:
                self.ctx.emit_output(text)
            except Exception:  # a broken subscriber never breaks the command
                pass

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


def _require_file(real: Path, rel: str) -> None:
    if not real.exists():
        raise ToolError(f"{rel}: no such file")
    if real.is_dir():
        raise ToolError(f"{rel} is a directory (use list_dir)")
    _require_regular(real, rel)


def _require_regular(real: Path, rel: str) -> None:
    """Refuse a FIFO, socket or device: opening one can block forever (and strand the tool's worker)."""
    if not real.is_file():
        raise ToolError(
            f"{rel} is not a regular file (a pipe, socket or device); file tools read and write regular files only"
        )


def _is_binary(path: Path) -> bool:
    with path.open("rb") as fh:
        return b"\x00" in fh.read(_SNIFF)


def _searchable(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size <= GREP_MAX_FILE_BYTES and not _is_binary(path)
    except OSError:
        return False


def _walk(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            yield Path(dirpath) / name


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:64]
