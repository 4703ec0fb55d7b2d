"""``meshlayout demo``: train a small TP + FSDP2 model on local gloo processes and check it.

The demo itself lives in :mod:`meshlayout.demo`; torch is imported only when it runs.
"""

from __future__ import annotations

import argparse

from .args import ArgError, user_input

__all__ = ["EPILOG", "HELP", "add_arguments", "run"]

HELP = "train a small TP + FSDP2 model on local gloo processes and check it"

EPILOG = """\
examples:
  meshlayout demo                      # 4 gloo processes, 20 steps
  meshlayout demo --nproc 4 --steps 3  # the quick version CI runs
  meshlayout demo --nproc 8            # dp_shard=4 x tp=2

Plans the meshes with ParallelDims, starts local CPU processes (gloo on
127.0.0.1), binds the meshes to process groups with meshlayout.torch.build(pd, "cpu"),
trains a 10->6->10 MLP with tensor parallelism + FSDP2 on them, and checks the
losses against a single-process run and every parameter's full_tensor against
torch and the single-process weights. Exit status 1 if any check fails.
Needs the torch extra: pip install 'meshlayout[torch]'.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=4, help="processes to start, 1..8 (default 4)")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds before the demo gives up (default 120)",
    )


def run(args: argparse.Namespace) -> int:
    from ..demo import DemoConfig, run_demo

    with user_input(f"--nproc {args.nproc} --steps {args.steps} --timeout {args.timeout}"):
        cfg = DemoConfig(nproc=args.nproc, steps=args.steps, timeout=args.timeout)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ArgError("the demo needs torch: pip install 'meshlayout[torch]'") from None
    return run_demo(cfg)
