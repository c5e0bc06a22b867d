"""Many sessions, one provider key (design §3.11): goodput against the key's limit, with admission control on
and off in the same run.

The local provider runs in a child process (``agentcell provider --rpm R``: a token bucket of R/60 requests a
second holding one second of them, OpenAI's ``x-ratelimit-*`` headers, a 429 with ``retry-after`` past it).
For each size, N sessions on that one key each send one prompt at the same moment, twice: with admission
control (the default) and without (``capacity.enabled = false``: each call meets the limit alone, retries
``retry.max_attempts`` times and gives up). Per side:

- ``ok``/``failed``: turns that ended ok / with an error;
- ``goodput``: turns ended ok per second, and ``of_limit``: that over the key's rate (the batch takes at least
  ``(N - burst) / rate``);
- ``refused``: 429s among all the requests the key received (counted from ``provider_retry`` events and the
  failed turns' last error);
- ``wait_p50``/``wait_p99``: seconds a call waited for capacity (``request_admitted``; 0 for a call that
  went at once).

Targets (issue 39): with admission control >= 95% of the limit used, <= 5% refused, 0 turns failed, at every
size. Sizes and rates: 100 sessions at 10 requests/s, 1,000 at 50/s, 10,000 at 100/s (the runtime's own
CPU, not the key, would limit a faster key on a small machine).

Run: ``python -m benchmarks.bench_limits`` (``--quick``: 100 and 400 sessions).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks._common import write_results

NAME = "limits"
KEY = "sk-bench"


def _provider(rpm: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.provider", "--port", "0", "--rpm", str(rpm)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = line.split(" on ", 1)[1].split(" ", 1)[0]
    return proc, url


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _side(sessions: int, rate: float, limiter: bool) -> dict[str, Any]:
    from runtime import Runtime
    from runtime.config import Config

    proc, url = _provider(rate * 60)
    try:
        config = Config().with_overrides(
            {
                "capacity.enabled": limiter,
                "persistence.fsync": "never",
                "persistence.transcript": False,
                "capacity.queue_timeout": 3_600.0,
            }
        )
        with Runtime(config, sessions_dir=tempfile.mkdtemp(prefix="bench-limits-")) as rt:
            sids = [
                rt.start_session(model="openai/agentcell-local", api_base=url, api_key=KEY, tools=None)
                for _ in range(sessions)
            ]
            waits: list[float] = []
            retries_429 = 0
            lock = threading.Lock()

            def seen(event: Any) -> None:
                nonlocal retries_429
                with lock:
                    if event.type == "request_admitted":
                        waits.append(event.waited)
                    elif event.type == "provider_retry" and event.status_code == 429:
                        retries_429 += 1

            sub = rt.subscribe("*", {"request_admitted", "provider_retry"}, callback=seen)
            started = time.monotonic()
            handles = [rt.prompt(sid, "hello") for sid in sids]
            results = [h.result(timeout=3_600) for h in handles]
            elapsed = time.monotonic() - started
            sub.flush()
            sub.close()
    finally:
        proc.terminate()
        proc.wait(10)
    ok = sum(r.status == "ok" for r in results)
    failed_429 = sum(r.status != "ok" and "429" in (r.error or "") for r in results)
    refused = retries_429 + failed_429
    received = ok + refused + sum(r.status != "ok" and "429" not in (r.error or "") for r in results)
    all_waits = waits + [0.0] * max(0, ok - len(waits))
    goodput = ok / elapsed
    return {
        "sessions": sessions,
        "limit_rps": rate,
        "limiter": "on" if limiter else "off",
        "ok": ok,
        "failed": sessions - ok,
        "seconds": round(elapsed, 2),
        "goodput": round(goodput, 2),
        "of_limit": round(goodput / rate, 3),
        "refused": refused,
        "refused_share": round(refused / max(1, received), 3),
        "wait_p50": round(statistics.median(all_waits), 3) if all_waits else 0.0,
        "wait_p99": round(_percentile(all_waits, 0.99), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 400 sessions")
    args = parser.parse_args()
    sizes = [(100, 20.0), (400, 40.0)] if args.quick else [(100, 10.0), (1_000, 50.0), (10_000, 100.0)]
    rows = []
    for sessions, rate in sizes:
        for limiter in (True, False):
            row = _side(sessions, rate, limiter)
            print(row, flush=True)
            rows.append(row)
    write_results(NAME, rows, {"quick": args.quick, "sizes": sizes, "burst_seconds": 1.0})


if __name__ == "__main__":
    main()
