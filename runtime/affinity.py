"""Where the runtime's own threads run: the ``runtime.cpu`` setting.

Only one thread at a time runs Python code (the GIL), and a turn passes the GIL between the runtime's
threads dozens of times: the caller, a dispatcher, the I/O loop, the log writer and back. Handing it to a
thread waiting on another CPU costs several times what it costs on the same CPU (on the 2-core VM the
benchmarks ran on, 42-59 µs a round trip against 11-17 µs; ``benchmarks/_common.py`` measures it), and the
objects a turn touches have to move between the two CPUs' caches as well. Keeping the runtime's threads on
one CPU saves that without giving up any parallelism the GIL allowed.

``runtime.cpu`` is ``"auto"`` (the default: one CPU chosen from those the process may use, on Linux with a
GIL and at least two CPUs; otherwise nothing is placed), ``"off"`` (the OS places every thread), or a CPU
number. The dispatcher threads, the I/O loop (and the worker threads litellm and asyncio start from it), the
log writer and the timers are placed there. The tool workers are not: tools and the processes they start run
on every CPU the process may use. Threads of the embedding program are never touched.

``auto`` claims its CPU for as long as a runtime of the process runs, with a lock file per CPU in the
temporary directory, so that processes hosting runtimes on one machine take different CPUs while there are
free ones (and the OS moves other programs' unplaced threads off them). Runtimes in one process share the
claim: they share one GIL, so they belong on one CPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "LOCK_DIR",
    "CpuSetting",
    "Placement",
    "allowed_cpus",
    "auto_candidates",
    "gil_enabled",
    "place_runtime",
    "place_thread",
]


CpuSetting = Literal["off", "auto"] | int

log = logging.getLogger("agentcell.runtime")

LOCK_DIR = Path(tempfile.gettempdir())
"""Where ``auto`` keeps its lock files, ``agentcell-cpu-<n>.lock`` (shared by every process on the host)."""


def allowed_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on, or None where the platform cannot say (or place threads)."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        return frozenset(getter(0))
    except OSError:
        return None


def gil_enabled() -> bool:
    """False on a free-threaded interpreter running without the GIL, where one CPU would be a limit."""
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


def auto_candidates() -> list[int]:
    """The CPUs ``auto`` may choose, in the order it tries them; empty where it places nothing.

    The order starts at a CPU chosen by the process id, so that processes which cannot claim a CPU (the
    lock files are out of reach, or there are more processes than CPUs) still spread over them.
    """
    allowed = allowed_cpus()
    if allowed is None or len(allowed) < 2 or not gil_enabled():
        return []
    ordered = sorted(allowed)
    start = os.getpid() % len(ordered)
    return ordered[start:] + ordered[:start]


@dataclass
class Placement:
    """Where one runtime's threads run (``cpus``; None: where the OS puts them). ``release`` when stopped."""

    cpus: frozenset[int] | None
    _share: int | None = field(default=None, repr=False)  # the claim's generation, for ``auto``

    def release(self) -> None:
        """Give up this runtime's share of the ``auto`` claim. Idempotent."""
        if self._share is not None:
            _claim.release(self._share)
            self._share = None


def place_runtime(setting: CpuSetting) -> Placement:
    """Where a runtime's threads go for a ``runtime.cpu`` setting; ``auto`` claims its CPU (see the module).

    Raises:
        ValueError: a CPU number this process may not use, or one on a platform that cannot place threads.
    """
    if setting == "off":
        return Placement(None)
    if isinstance(setting, int):
        allowed = allowed_cpus()
        if allowed is None:
            raise ValueError(f"runtime.cpu = {setting}: this platform cannot place threads on CPUs")
        if setting not in allowed:
            raise ValueError(f"runtime.cpu = {setting}: this process may only use CPUs {sorted(allowed)}")
        return Placement(frozenset((setting,)))
    candidates = auto_candidates()
    if not candidates:
        return Placement(None)
    cpu, share = _claim.acquire(candidates)
    return Placement(frozenset((cpu,)), share)


class _Claim:
    """The CPU ``auto`` chose for this process, held by a lock file while any runtime uses it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cpu: int | None = None
        self._fd: int | None = None
        self._users = 0
        self._generation = 0  # a fork starts a new one: shares taken in the parent are not the child's

    def acquire(self, candidates: list[int]) -> tuple[int, int]:
        """The CPU for one more runtime of this process, and the generation its share belongs to."""
        with self._lock:
            if self._users == 0:
                self._cpu, self._fd = _claim_first_free(candidates)
            self._users += 1
            assert self._cpu is not None
            # The process's CPUs were narrowed since the claim: this runtime cannot join the others.
            return (self._cpu if self._cpu in candidates else candidates[0]), self._generation

    def release(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return  # a share of the parent's claim, released in a forked child
            self._users -= 1
            if self._users == 0:
                self._drop()

    def _drop(self) -> None:
        fd, self._cpu, self._fd, self._users = self._fd, None, None, 0
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the lock releases it

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's claim is not the child's, and its lock is shared with the parent.

        Closing the child's copy of the descriptor leaves the parent's lock held.
        """
        self._lock = threading.Lock()
        self._generation += 1
        with contextlib.suppress(OSError):
            self._drop()


_claim = _Claim()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_claim.forget_after_fork)


def _claim_first_free(candidates: list[int]) -> tuple[int, int | None]:
    """The first of ``candidates`` no other process holds, with its locked descriptor; else the first."""
    for cpu in candidates:
        fd = _open_lock(LOCK_DIR / f"agentcell-cpu-{cpu}.lock")
        if fd is None:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by another process (or locks are not supported here)
            os.close(fd)
            continue
        return cpu, fd
    log.debug("runtime.cpu = auto: CPUs %s all held by other runtimes; sharing %d", candidates, candidates[0])
    return candidates[0], None


def _open_lock(path: Path) -> int | None:
    """A read-only descriptor of the lock file, made if missing; None if it cannot be had.

    Opening an existing file without ``O_CREAT`` works where the file belongs to another user in a sticky
    temporary directory (``fs.protected_regular``); ``O_NOFOLLOW`` refuses a planted symbolic link.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(2):
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        except OSError:
            return None
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another process made it in between: open theirs
        except OSError:
            return None
    return None


def place_thread(cpus: frozenset[int] | None) -> None:
    """Run the calling thread on ``cpus`` (threads it starts later inherit that); None leaves it as it is.

    A refusal (a container that forbids it, a CPU taken offline) is logged, and the thread runs wherever
    the OS puts it.
    """
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        log.warning("could not place thread on CPUs %s: %s", sorted(cpus), exc)
