"""Memory under sustained load (design §2.2, §8): sessions turning continuously for minutes.

Two parts, each in the same process against the local provider run as a child process (``agentcell
provider``), so what is measured is the runtime's memory, not the provider's caches and request log:

- ``soak``: ``--sessions`` sessions (200) turning without pause for ``--seconds`` (180), every session at a
  small window (``--window`` 8,000 tokens) so each compacts again and again. RSS is sampled every
  ``--every`` seconds with the turns done so far. Target: RSS flat over the second half (at most 5% growth
  from its first sample to its last) at about 700 turns/s.
- ``retained``: ``--retained-sessions`` sessions (10), warmed up, then ``--retained-turns`` more turns
  (5,000) with ``tracemalloc`` on; the traced memory after a full collection is sampled every 250 turns
  and its slope (least squares) is the bytes kept per turn. Target: at most 100 B a turn once the
  context is bounded (issue 46 measured 2.7 KB before the session store kept only its model view).

Run: ``python -m benchmarks.bench_soak`` (``--quick``: 50 sessions for 40 s, 2,000 retained turns).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from benchmarks._common import write_results

NAME = "soak"
MODEL = "openai/agentcell-local"
TARGET_GROWTH = 0.05  # RSS over the second half of the soak
TARGET_TURNS_PER_S = 700
TARGET_BYTES_PER_TURN = 100
SAMPLE_TURNS = 250  # turns between two tracemalloc samples of the retained part


@contextmanager
def provider() -> Iterator[str]:
    """The local provider in a child process; yields its base URL."""
    child = subprocess.Popen(
        [sys.executable, "-m", "runtime.provider", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/v1", line)
        if found is None:
            raise RuntimeError(f"the provider did not start: {line!r}")
        yield found.group(0)
    finally:
        child.terminate()
        child.wait(10)


def _runtime(root: Path, window: int) -> Any:
    from runtime import Runtime
    from runtime.config import Config

    config = Config().with_overrides(
        {"models.context_windows": {MODEL: window}, "persistence.fsync": "never"}
    )
    return Runtime(config, sessions_dir=root)


def _prompt(i: int) -> str:
    return f"Turn {i}: tell me something about the number {i}, with a little detail please."


def soak(url: str, sessions: int, seconds: float, every: float, window: int) -> dict[str, Any]:
    """Every session turns without pause for ``seconds``; RSS and turns sampled every ``every`` s."""
    process = psutil.Process()
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder, _runtime(Path(folder), window) as rt:
        sids = [
            rt.start_session(model=MODEL, api_base=url, api_key="sk-local", tools=()) for _ in range(sessions)
        ]
        done = [0]
        errors = [0]
        stop = threading.Event()

        async def drive(sid: str) -> None:
            i = 0
            while not stop.is_set():
                result = await rt.prompt(sid, _prompt(i))
                i += 1
                done[0] += 1
                if result.status != "ok":
                    errors[0] += 1

        async def main() -> None:
            tasks = [asyncio.create_task(drive(sid)) for sid in sids]
            start = time.monotonic()
            cpu0 = process.cpu_times()
            while (elapsed := time.monotonic() - start) < seconds:
                await asyncio.sleep(min(every, seconds - elapsed))
                cpu = process.cpu_times()
                samples.append(
                    {
                        "t_s": round(time.monotonic() - start, 1),
                        "turns": done[0],
                        "rss_mib": round(process.memory_info().rss / 2**20, 1),
                        "cpu_s": round(cpu.user + cpu.system - cpu0.user - cpu0.system, 1),
                    }
                )
            stop.set()
            await asyncio.gather(*tasks)

        asyncio.run(main())
        total = done[0]
    half = [s for s in samples if s["t_s"] >= seconds / 2]
    growth = (half[-1]["rss_mib"] - half[0]["rss_mib"]) / half[0]["rss_mib"]
    rate = (samples[-1]["turns"] - samples[0]["turns"]) / (samples[-1]["t_s"] - samples[0]["t_s"])
    return {
        "kind": "soak",
        "sessions": sessions,
        "seconds": seconds,
        "window": window,
        "turns": total,
        "errors": errors[0],
        "turns_per_s": round(rate, 1),
        "rss_start_mib": samples[0]["rss_mib"],
        "rss_mid_mib": half[0]["rss_mib"],
        "rss_end_mib": samples[-1]["rss_mib"],
        "rss_growth_second_half": round(growth, 4),
        "samples": samples,
    }


def retained(url: str, sessions: int, turns: int, window: int) -> dict[str, Any]:
    """Bytes kept per turn: the slope of the traced memory (after a full collection) over ``turns``."""
    with tempfile.TemporaryDirectory() as folder, _runtime(Path(folder), window) as rt:
        sids = [
            rt.start_session(model=MODEL, api_base=url, api_key="sk-local", tools=()) for _ in range(sessions)
        ]
        counter = [0]

        def run(count: int) -> None:  # ``count`` turns, spread over the sessions
            for _ in range(count // sessions):
                handles = [rt.prompt(sid, _prompt(counter[0] + k)) for k, sid in enumerate(sids)]
                counter[0] += sessions
                for handle in handles:
                    assert handle.result(timeout=120).status == "ok"

        run(sessions * 150)  # warm: several compactions each, caches full
        gc.collect()
        tracemalloc.start()
        try:
            points: list[tuple[int, int]] = []
            for step in range(turns // SAMPLE_TURNS + 1):
                if step:
                    run(SAMPLE_TURNS)
                gc.collect()
                points.append((step * SAMPLE_TURNS, tracemalloc.get_traced_memory()[0]))
        finally:
            tracemalloc.stop()
        shown = rt.message_count(sids[0])
        in_context = rt.message_count(sids[0], view="model")
        reads = _reads(rt, sids[0], shown)
    slope = statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope
    return {
        "kind": "retained",
        "sessions": sessions,
        "turns": turns,
        "window": window,
        "bytes_per_turn": round(slope, 1),
        "grown_bytes": points[-1][1] - points[0][1],
        "messages_one_session": shown,
        "in_its_context": in_context,
        **reads,
        "samples": [{"turns": x, "traced_bytes": y} for x, y in points],
    }


def _reads(rt: Any, sid: str, shown: int) -> dict[str, Any]:
    """What reading one session's old history costs: its whole user view, then a page deep in it, each
    from the log with nothing cached (the page cache and the history's offsets dropped first: the deep
    page then costs a scan of the log for the offsets, issue 46), the same page again (from the page
    cache), then another deep page from the log with the offsets known (it reads its own lines only)."""
    from runtime.store.history import HistoryPages

    def timed(**page: Any) -> float:
        start = time.perf_counter()
        found = rt.messages(sid, **page)
        assert found, page
        return round((time.perf_counter() - start) * 1000, 2)

    rt.history = HistoryPages()
    whole = timed()
    rt.history = HistoryPages()
    deep = timed(offset=shown // 2, limit=50)
    again = timed(offset=shown // 2, limit=50)
    rt.history.clear_pages()
    read_before = rt.history.bytes_read
    known = timed(offset=shown // 3, limit=50)
    known_bytes = rt.history.bytes_read - read_before
    newest = timed(limit=50)
    log_bytes = rt.services.directory.log_path(sid).stat().st_size
    return {
        "log_kib": round(log_bytes / 1024),
        "read_all_ms": whole,
        "read_deep_page_ms": deep,
        "read_deep_page_cached_ms": again,
        "read_deep_page_offsets_known_ms": known,
        "read_deep_page_offsets_known_bytes": known_bytes,
        "read_newest_page_ms": newest,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50 sessions for 40 s; 2,000 retained turns")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between two RSS samples")
    parser.add_argument("--window", type=int, default=8_000, help="each session's context window (tokens)")
    parser.add_argument("--retained-sessions", type=int, default=10)
    parser.add_argument("--retained-turns", type=int, default=5_000)
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.seconds, args.every, args.retained_turns = 50, 40.0, 5.0, 2_000
    with provider() as url:
        rows = [
            soak(url, args.sessions, args.seconds, args.every, args.window),
            retained(url, args.retained_sessions, args.retained_turns, args.window),
        ]
    table = [{k: v for k, v in row.items() if k != "samples"} for row in rows]
    meta = {
        "targets": {
            "rss_growth_second_half": f"<= {TARGET_GROWTH:.0%} at {TARGET_TURNS_PER_S} turns/s and 200 sessions",
            "bytes_per_turn": f"<= {TARGET_BYTES_PER_TURN}",
        },
        "quick": args.quick,
        "samples": {row["kind"]: row["samples"] for row in rows},
    }
    write_results(NAME, table, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
