"""Time ``import meshlayout`` in fresh interpreters (the goal: under 0.3 s).

    python benchmarks/bench_import.py [--runs 10]

Prints the best and median of ``--runs`` fresh interpreters; exits 1 when the best is over
the 0.3 s budget. The suite checks what the import loads (tests/test_smoke.py), not its time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = "import time; t = time.perf_counter(); import meshlayout; print(time.perf_counter() - t)"
BUDGET = 0.3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    times = [
        float(
            subprocess.run(
                [sys.executable, "-c", CODE], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(args.runs)
    ]
    best, median = min(times), statistics.median(times)
    print(
        f"import meshlayout: best {best * 1e3:.1f} ms, median {median * 1e3:.1f} ms "
        f"of {args.runs} fresh interpreters (budget {BUDGET * 1e3:.0f} ms)"
    )
    return 0 if best < BUDGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
