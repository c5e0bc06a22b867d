"""Mutation testing of the pure context core, for .ci/run's slow step.

mutmut (the dev extra; [tool.mutmut] in pyproject.toml names the modules and the tests) mutates
runtime/context/working_set.py, recovery.py and estimate.py and runs their pure tests against each mutant.
Mutants shown to change nothing a caller can observe are marked ``# pragma: no mutate`` where they arise,
with the reason. This fails when fewer than MIN_KILLED of the rest are killed, or when the run takes longer
than its time limit (it fits CI's budget: see the README's figure).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

MIN_KILLED = 0.90
LIMIT_SECONDS = 1_200
ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # a fresh run: no results from other code
    mutmut = [sys.executable, "-m", "mutmut"]
    try:
        subprocess.run([*mutmut, "run", "--max-children", "2"], cwd=ROOT, check=True, timeout=LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        print(f"mutation run: not done within {LIMIT_SECONDS} s", file=sys.stderr)
        return 1
    subprocess.run([*mutmut, "export-cicd-stats"], cwd=ROOT, check=True)
    stats = json.loads((ROOT / "mutants" / "mutmut-cicd-stats.json").read_text())
    judged = stats["total"] - stats["skipped"]
    killed = stats["killed"] + stats["timeout"]  # a mutant that hangs the tests is caught too
    share = killed / judged if judged else 0.0
    print(
        f"mutation run: {killed} of {judged} mutants killed ({share:.1%}); {stats['survived']} survived, "
        f"{stats['no_tests']} reached by no test"
    )
    if share < MIN_KILLED:
        subprocess.run([*mutmut, "results"], cwd=ROOT)
        print(f"mutation run: below {MIN_KILLED:.0%}: the survivors above need tests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
