"""Soak test of clean exits: run a short torchrun job many times, count unclean ends.

    .venv/bin/python benchmarks/soak_exit.py [--runs 100] [--parallel 2] [--nproc 4]

Each run is ``torchrun --standalone --nproc-per-node NPROC
benchmarks/exit_soak_job.py`` (meshlayout's groups, an exact checkpoint saved and
resumed on another layout, a verified weight transfer, ``destroy_process_group()``
and a plain return). A run is clean when torchrun exits 0, rank 0 printed ``JOB OK``
and no worker printed ``terminate called`` (the abort at interpreter exit, SIGABRT,
that issue 24 is about). ``--parallel`` launches run side by side to load the machine
(load makes teardown races likelier). Prints one line per unclean run with the log's
path, then the totals; exits 1 if any run was unclean.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "benchmarks" / "exit_soak_job.py"
ABORT = "terminate called"


def _torchrun() -> list[str]:
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_once(index: int, nproc: int, work: Path, hang_guard: float) -> tuple[str, Path]:
    """One launch; returns (verdict, log path): 'clean', 'abort', 'failed' or 'hung'."""
    log = work / f"run{index:04d}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "PET_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    argv = [*_torchrun(), "--standalone", f"--nproc-per-node={nproc}", str(JOB)]
    argv.append(str(work / f"ckpt{index:04d}"))
    with open(log, "w") as fh:
        try:
            proc = subprocess.run(
                argv, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=hang_guard, check=False
            )
        except subprocess.TimeoutExpired:
            return "hung", log
    text = log.read_text(errors="replace")
    if ABORT in text:
        return "abort", log
    if proc.returncode != 0 or "JOB OK" not in text:
        return "failed", log
    return "clean", log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--hang-guard", type=float, default=600.0, help="seconds per launch")
    ap.add_argument("--keep", action="store_true", help="keep the logs of clean runs too")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="meshlayout-soak-"))
    counts = {"clean": 0, "abort": 0, "failed": 0, "hung": 0}
    start = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [
            pool.submit(run_once, i, args.nproc, work, args.hang_guard) for i in range(args.runs)
        ]
        for i, fut in enumerate(futures):
            verdict, log = fut.result()
            counts[verdict] += 1
            if verdict != "clean":
                print(f"run {i}: {verdict} (log {log})", flush=True)
            elif not args.keep:
                log.unlink()
            if (i + 1) % 10 == 0:
                load = os.getloadavg()[0]
                print(
                    f"{i + 1}/{args.runs} runs, {counts['clean']} clean, load {load:.1f}",
                    flush=True,
                )
    minutes = (time.monotonic() - start) / 60
    print(
        f"{args.runs} runs of {args.nproc} processes ({args.parallel} at a time, "
        f"{minutes:.1f} min): {counts['clean']} clean, {counts['abort']} aborted at exit, "
        f"{counts['failed']} failed, {counts['hung']} hung; logs in {work}"
    )
    return 0 if counts["clean"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
