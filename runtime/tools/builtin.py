"""The built-in tools (design §3.4): read_file, write_file, edit_file, list_dir, grep, and shell.

File tools work inside the session's workspace only (see :mod:`runtime.tools.workspace`); paths in their
results are relative to it. Their docstrings are what the model reads as the tools' descriptions.

``shell`` is off unless the session enables it (``agent.shell_enabled``): it runs ``/bin/sh -c`` in the
workspace in its own process group, streams output as it comes, keeps the tail of the output in the
result and the whole of it in a log file under the session's logs directory, and kills the whole
process group on timeout or abort. The command gets an allow-list of the runtime's environment variables
(:data:`SHELL_ENV`: the path, home, user, locale, terminal and temporary directory) plus the names or
patterns of the session's ``agent.shell_env``: never the credentials a host keeps in its environment.
Its log files are readable by their owner only.

File tools refuse a regular file with more than one hard link: a hard link made inside the workspace to a
file outside it looks like any other file there, and no path check can tell (see
:mod:`runtime.tools.workspace`).
"""

from __future__ import annotations

import codecs
import fnmatch
import os
import re
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final

import re2  # google-re2: linear-time matching that releases the GIL

from runtime.context.tool_output import decode_output
from runtime.tools._lines import MAX_LINE_CHARS, numbered_lines
from runtime.tools.registry import ToolContext, ToolError, ToolRegistry, tool
from runtime.tools.saved import read_saved

__all__ = [
    "GREP_CHUNK_BYTES",
    "GREP_LINE_CHARS",
    "GREP_LONG_LINE_BYTES",
    "GREP_MAX_FILE_BYTES",
    "GREP_MAX_PROGRAM",
    "LIST_MAX_ENTRIES",
    "MAX_LINE_CHARS",
    "SHELL_ENV",
    "SHELL_EXECUTOR_TIMEOUT",
    "SHELL_TAIL_BYTES",
    "SKIPPED_DIRS",
    "LineMatcher",
    "builtin_registry",
    "edit_file",
    "grep",
    "list_dir",
    "read_file",
    "read_saved",
    "shell_environment",
    "shell_tool",
    "write_file",
]


GREP_LINE_CHARS: Final = 300
GREP_MAX_FILE_BYTES: Final = 10 * 1024 * 1024
GREP_CHUNK_BYTES: Final = 64 * 1024  # grep checks for cancellation (timeout, abort) after each chunk
GREP_LONG_LINE_BYTES: Final = 256 * 1024
"""grep searches a longer line in its first this many bytes only (and says so): one RE2 call, which nothing can
interrupt, never runs over more (a 10 MB line took 5-20 s under load with a pattern RE2 cannot run as a DFA)."""
GREP_MAX_PROGRAM: Final = 2_000  # RE2 instructions; bigger programs can match very slowly (still linearly)
LIST_MAX_ENTRIES: Final = 1_000
SHELL_TAIL_BYTES: Final = 64 * 1024
# shell enforces ctx.shell_timeout itself (and kills its process group); the executor's per-tool timeout
# must not cut it short, so the shell tool carries a long one of its own.
SHELL_EXECUTOR_TIMEOUT: Final = 24 * 3600.0
SKIPPED_DIRS: Final = frozenset({".git", ".hg", ".svn", "__pycache__"})
_SNIFF: Final = 8 * 1024
SHELL_ENV: Final = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ", "TMPDIR", "TMP", "TEMP",
)  # fmt: skip
"""Environment variables the shell tool passes on (names, or shell-style patterns); a session adds its own
with ``agent.shell_env``. ``PWD`` is set to the workspace."""
# Patterns that must see a line as the whole text: \A, \z, or a flag group that turns multi-line mode off.
_LINE_ONLY = re.compile(r"\\[Az]|\(\?[A-Za-z]*-[A-Za-z]*m")


@tool(idempotent=True)
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
    with real.open(encoding="utf-8", errors="replace") as fh:
        return numbered_lines(fh, rel, offset, limit)


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


@tool(idempotent=True)
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


@tool(idempotent=True)
def grep(
    pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100, *, ctx: ToolContext
) -> str:
    """Search file contents with a regular expression (RE2 syntax: Python's re without backreferences or
    lookaround). Each line is matched on its own. Prints matches as path:line: text.
    Binary files and .git directories are skipped.

    Args:
        pattern: Regular expression (RE2 syntax, e.g. 'def \\w+\\(' or '(?i)error|warning').
        path: File or directory to search, relative to the workspace root.
        glob: Only search files whose name (or relative path, if the glob contains '/') matches, e.g. '*.py'.
        max_results: Stop after this many matching lines.
    """
    ws = ctx.require_workspace()
    real = ws.resolve(path)
    if not real.exists():
        raise ToolError(f"{ws.relative(real)}: no such file or directory")
    if real.is_file():
        _require_regular(real, ws.relative(real))
    matcher = LineMatcher(pattern)
    if max_results < 1:
        raise ToolError("max_results must be at least 1")
    matches: list[str] = []
    cut: list[str] = []  # path:line of each line searched only in part
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
        try:
            data = file.read_bytes()
        except OSError:
            continue
        cut_before = len(matcher.cut_lines)
        for number, line in matcher.lines(data, ctx.cancelled):
            text = line.decode("utf-8", errors="replace")
            if len(text) > GREP_LINE_CHARS:
                text = text[:GREP_LINE_CHARS] + "…"
            matches.append(f"{rel}:{number}: {text}")
            if len(matches) >= max_results:
                break
        cut.extend(f"{rel}:{number}" for number in matcher.cut_lines[cut_before:])
    notes = []
    if cut:
        where = ", ".join(cut[:5]) + (f" and {len(cut) - 5:,} more" if len(cut) > 5 else "")
        notes.append(
            f"[{len(cut):,} line(s) longer than {GREP_LONG_LINE_BYTES // 1024} KB searched in their first "
            f"{GREP_LONG_LINE_BYTES // 1024} KB only: {where}; read_file shows them in parts]"
        )
    if not matches:
        return "\n".join([f"No matches for {pattern!r} ({files:,} files searched)", *notes])
    if len(matches) >= max_results:
        matches.append(f"[stopped at max_results={max_results}; narrow the pattern, path or glob for more]")
    return "\n".join([*matches, *notes])


class LineMatcher:
    """A grep pattern, matched against each line of a file on its own, in time linear in the file's size.

    The pattern runs on RE2 (``google-re2``): no backtracking, so no pattern makes matching take more than
    linear time, and the GIL is released while it runs, so a search never stops the rest of the process.
    A file is searched in chunks of whole lines (:data:`GREP_CHUNK_BYTES`), with the pattern in multi-line
    mode, and ``cancelled`` is checked between chunks: a timed-out or aborted grep stops within one chunk.
    Each hit of the multi-line search is confirmed on its own line, so the result is exactly what matching
    every line separately gives. Patterns whose meaning depends on the line being the whole text (``\\A``,
    ``\\z``, a flag group turning ``m`` off) are matched line by line instead. A line longer than
    :data:`GREP_LONG_LINE_BYTES` is searched in its first that many bytes only (its number is added to
    :attr:`cut_lines`), so that no single RE2 call, which nothing can interrupt, runs over more.
    """

    cut_lines: list[int]
    """The numbers of the lines searched only in part so far, in order."""

    def __init__(self, pattern: str) -> None:
        self.cut_lines = []
        options = re2.Options()
        options.log_errors = False  # a bad pattern is reported to the model, not written to stderr
        try:
            self._line = re2.compile(pattern, options)
            self._scan = None if _LINE_ONLY.search(pattern) else re2.compile(f"(?m){pattern}", options)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", errors="replace")
            raise ToolError(
                f"invalid regular expression {pattern!r}: {reason}. grep uses RE2 syntax: Python's re "
                "without backreferences (\\1), lookahead or lookbehind ((?=...), (?!...), (?<=...), (?<!...)), "
                "possessive quantifiers or atomic groups"
            ) from None
        size = _program_size(self._line)
        if size > GREP_MAX_PROGRAM:
            raise ToolError(
                f"regular expression {pattern[:200]!r} is too complex ({size:,} RE2 instructions, at most "
                f"{GREP_MAX_PROGRAM:,}): use a simpler pattern, e.g. fewer or smaller counted repetitions"
            )

    def lines(self, data: bytes, cancelled: threading.Event) -> Iterator[tuple[int, bytes]]:
        """The (1-based number, text without its line ending) of each line of ``data`` that matches.

        ``\\r\\n`` counts as a line ending, and invalid UTF-8 is matched as U+FFFD, as text mode read it.
        """
        data = _as_utf8(data).replace(b"\r\n", b"\n")
        size, pos, number = len(data), 0, 1  # ``number``: the number of the line that starts at ``pos``
        while pos < size and not cancelled.is_set():
            end = data.find(b"\n", min(size, pos + GREP_CHUNK_BYTES))  # a chunk ends at the end of a line
            end = size if end < 0 else end + 1
            last = data.rfind(b"\n", pos, min(size, pos + GREP_CHUNK_BYTES)) + 1 or pos  # its last line
            if end - last > GREP_LONG_LINE_BYTES:  # too long to search whole: the lines before it, then it
                if last > pos:
                    yield from self._chunk(data, pos, last, size, number, cancelled)
                    number += data.count(b"\n", pos, last)
                if cancelled.is_set():
                    return
                cut = last + GREP_LONG_LINE_BYTES
                while data[cut] & 0xC0 == 0x80:  # not in the middle of a character
                    cut -= 1
                line = data[last:cut]
                self.cut_lines.append(number)
                if self._line.search(line) is not None:
                    yield number, line
                number += 1
                pos = end
                continue
            yield from self._chunk(data, pos, end, size, number, cancelled)
            number += data.count(b"\n", pos, end)
            pos = end

    def _chunk(
        self, data: bytes, pos: int, end: int, size: int, number: int, cancelled: threading.Event
    ) -> Iterator[tuple[int, bytes]]:
        """The matching lines of ``data[pos:end]`` (whole lines), the first of them numbered ``number``."""
        if self._scan is None:
            lines = data[pos:end].split(b"\n")
            if data.endswith(b"\n", pos, end):
                lines.pop()  # the nothing after the chunk's last newline
            for line in lines:
                if self._line.search(line) is not None:
                    yield number, line
                number += 1
            return
        while pos < end and not cancelled.is_set():
            hit = self._scan.search(data, pos, end)
            if hit is None or hit.start() >= size:  # (an empty match after the last newline: no line)
                return
            start = max(pos, data.rfind(b"\n", pos, hit.start()) + 1)
            stop = data.find(b"\n", hit.start(), end)
            stop = end if stop < 0 else stop
            number += data.count(b"\n", pos, start)
            line = data[start:stop]
            if self._line.search(line) is not None:
                yield number, line
            number += 1
            pos = stop + 1


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
    ctx.logs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = ctx.logs_dir / f"shell-{_safe(ctx.call_id) or os.urandom(6).hex()}.log"
    run = _ShellRun(command, ws.root, log_path, ctx)
    status = run.wait(limit)
    tail = decode_output(bytes(run.tail)).rstrip("\n")
    where = f'read_saved(id="{log_path.name}")' if ctx.logs_dir in ctx.saved_dirs else str(log_path)
    shown = (
        f"[output: {run.total:,} bytes, last {len(run.tail):,} shown; full output: {where}]"
        if run.total > len(run.tail)
        else f"[full output: {where}]"
    )
    if status == "timeout":
        raise ToolError(f"command timed out after {limit:g} s; its process group was killed\n{tail}\n{shown}")
    if status == "cancelled":
        raise ToolError(f"command aborted; its process group was killed\n{tail}\n{shown}")
    body = tail if tail else "(no output)"
    return f"{body}\n[exit code {run.returncode}] {shown}"


def shell_environment(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``environ`` that :data:`SHELL_ENV` or ``extra`` name (exactly, or by pattern)."""
    allowed = (*SHELL_ENV, *extra)
    names = {p for p in allowed if not any(c in p for c in "*?[")}
    patterns = [p for p in allowed if p not in names]
    return {
        k: v for k, v in environ.items() if k in names or any(fnmatch.fnmatchcase(k, p) for p in patterns)
    }


def builtin_registry(shell: bool = False) -> ToolRegistry:
    """A registry with the built-in file tools, and ``shell`` when ``shell`` is true."""
    registry = ToolRegistry([read_file, write_file, edit_file, list_dir, grep, read_saved])
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
        env = shell_environment(os.environ, ctx.shell_env)
        env["PWD"] = str(cwd)
        self._log = os.fdopen(
            os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600),
            "wb",
        )
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
    """Refuse a FIFO, socket or device (opening one can block forever, and strand the tool's worker), and
    a file with more than one hard link (it may be a file from outside the workspace)."""
    if not real.is_file():
        raise ToolError(
            f"{rel} is not a regular file (a pipe, socket or device); file tools read and write regular files only"
        )
    links = real.stat().st_nlink
    if links > 1:
        raise ToolError(
            f"{rel} has {links} hard links; file tools refuse such files, since a hard link can make a file "
            "from outside the workspace appear inside it"
        )


def _is_binary(path: Path) -> bool:
    with path.open("rb") as fh:
        return b"\x00" in fh.read(_SNIFF)


def _searchable(path: Path) -> bool:
    """A regular text file of one hard link (see :func:`_require_regular`), small enough to search."""
    try:
        info = path.stat()
        return (
            stat.S_ISREG(info.st_mode)
            and info.st_nlink == 1
            and info.st_size <= GREP_MAX_FILE_BYTES
            and not _is_binary(path)
        )
    except OSError:
        return False


def _program_size(regex: object) -> int:
    """How many instructions RE2 compiled ``regex`` to (0 if this binding does not say)."""
    size = getattr(getattr(regex, "_regexp", None), "ProgramSize", None)
    return int(size()) if callable(size) else 0


def _as_utf8(data: bytes) -> bytes:
    """``data`` if it is valid UTF-8, else with each invalid sequence replaced by U+FFFD."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace").encode("utf-8")
    return data


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
