"""Where the runtime's own threads run: the ``runtime.cpu`` setting.

Only one thread at a time runs Python code (the GIL), and a turn passes the GIL between the runtime's
threads dozens of times: the caller, a dispatcher, the I/O loop, the log writer and back. Handing it to a
thread waiting on another CPU costs several times what it costs on the same CPU (on the 2-core VM the
benchmarks ran on, 42-59 µs a round trip against 11-17 µs; ``benchmarks/_common.py`` measures it), and the
objects a turn touches have to move between the two CPUs' caches as well. Keeping the runtime's threads on
one CPU saves that without giving up any parallelism the GIL allowed.

``runtime.cpu`` is ``"off"`` (the default: the OS places every thread), ``"auto"`` (one CPU chosen from
those the process may use, on Linux with a GIL and at least two CPUs; otherwise off), or a CPU number.
The dispatcher threads, the I/O loop (and the worker threads litellm and asyncio start from it), the log
writer and the timers are placed there. The tool workers are not: tools and the processes they start run
on every CPU the process may use. Threads of the embedding program are never touched.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

CpuSetting = Literal["off", "auto"] | int

log = logging.getLogger("agentcell.runtime")


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


def runtime_cpus(setting: CpuSetting) -> frozenset[int] | None:
    """The CPUs the runtime's threads go on for a ``runtime.cpu`` setting; None: they are not placed.

    Raises:
        ValueError: a CPU number this process may not use, or one on a platform that cannot place threads.
    """
    if setting == "off":
        return None
    allowed = allowed_cpus()
    if isinstance(setting, int):
        if allowed is None:
            raise ValueError(f"runtime.cpu = {setting}: this platform cannot place threads on CPUs")
        if setting not in allowed:
            raise ValueError(f"runtime.cpu = {setting}: this process may only use CPUs {sorted(allowed)}")
        return frozenset((setting,))
    if allowed is None or len(allowed) < 2 or not gil_enabled():
        return None
    ordered = sorted(allowed)
    # Processes that each host a runtime spread over the CPUs instead of all choosing the first.
    return frozenset((ordered[os.getpid() % len(ordered)],))


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
