"""The demo's training as a torchrun script: one host or several (layer 4).

``meshlayout demo`` starts its own worker interpreters on this machine; this
module runs the same training body (:func:`meshlayout.demo.worker.worker`) in the
processes torchrun starts, on one host or on several::

    torchrun --standalone --nproc-per-node 4 -m meshlayout.demo.train --steps 3

    # on every host (two here); $HEAD is a host every agent can reach
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
             --rdzv-endpoint $HEAD:29500 --rdzv-id demo -m meshlayout.demo.train --steps 3

Every worker joins the default process group from torchrun's environment
(``env://``: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and
``meshlayout.torch.build`` takes the hosts from ``LOCAL_WORLD_SIZE`` and
``GROUP_RANK``, checking them through the store. Rank 0 prints the host report
(``tp: every group in one host``, ``fsdp: 2/2 groups span 2 hosts`` ...), every
step's loss beside a single-process run of the same model on the same data, and the
demo's PASS/FAIL checks, then hands its verdict to every rank: each exits 0 when
every check passed, 1 otherwise (so every torchrun agent fails), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import IO, Any

from .checks import check_training, step_line
from .config import DemoConfig, demo_parallel_dims
from .model import reference
from .worker import quiet_torch, worker

__all__ = ["main"]


class _Rank0Printer:
    """The events of :func:`meshlayout.demo.worker.worker`, printed as they come (rank 0) or kept."""

    def __init__(self, rank: int, steps: int, ref_losses: list[float], out: IO[str]) -> None:
        self.rank = rank
        self.steps = steps
        self.ref_losses = ref_losses
        self.out = out
        self.losses: dict[int, float] = {}
        self.params: dict[str, Any] = {}
        self.errors: list[str] = []
        self.hosts = ""

    def _print(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=self.out, flush=True)

    def put(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "hosts":
            self.hosts = event[1]
            self._print(f"== hosts ==\n{self.hosts}\n\n== training ==")
        elif kind == "loss":
            _, step, value = event
            self.losses[step] = value
            self._print(step_line(step, self.steps, value, self.ref_losses[step]))
        elif kind == "params":
            self.params = event[1]
        elif kind == "error":
            self.errors.append(f"rank {event[1]} failed: {event[2]}")
            print(self.errors[-1], file=sys.stderr, flush=True)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m meshlayout.demo.train",
        description="The meshlayout demo's TP + FSDP2 training, launched by torchrun.",
    )
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds any blocking call may wait for the other ranks (default 120)",
    )
    return parser.parse_args(argv)


def _world_from_environment() -> tuple[int, int]:
    missing = [
        n for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if n not in os.environ
    ]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} unset: launch with torchrun, e.g. "
            "torchrun --standalone --nproc-per-node 4 -m meshlayout.demo.train"
        )
    values = []
    for name in ("RANK", "WORLD_SIZE"):
        try:
            values.append(int(os.environ[name]))
        except ValueError:
            raise ValueError(f"{name}={os.environ[name]!r} is not an integer") from None
    return values[0], values[1]


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run one torchrun worker of the demo; return its exit status (0, 1 or 2)."""
    out = out or sys.stdout
    args = _parse(argv)
    try:
        rank, world = _world_from_environment()
        cfg = DemoConfig(nproc=world, steps=args.steps, timeout=args.timeout)
    except (TypeError, ValueError) as exc:
        print(f"demo.train: {exc}", file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist

    quiet_torch()
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.timeout))  # env://
    pd = demo_parallel_dims(world)
    ref_losses, ref_params = reference(cfg.steps) if rank == 0 else ([], {})
    events = _Rank0Printer(rank, cfg.steps, ref_losses, out)
    if rank == 0:
        print(
            f"== demo.train: TP={pd.degrees['tp']} x FSDP={pd.mesh('fsdp').size()} "
            f"on {world} torchrun processes ==",
            file=out,
            flush=True,
        )
    worker(rank, cfg, None, events)
    if events.errors:  # peers may be stuck in a collective: leave, torchrun stops them
        return 1
    ok = True
    if rank == 0:
        print("\n== checks ==", file=out)
        ok = check_training(cfg.steps, events.losses, events.params, ref_losses, ref_params, out)
    verdict = torch.tensor([0 if ok else 1])
    dist.broadcast(verdict, src=0)  # every rank (every agent) exits with rank 0's verdict
    dist.destroy_process_group()
    ok = int(verdict.item()) == 0
    if rank == 0:
        print(f"demo.train {'passed' if ok else 'FAILED'} on {world} processes", file=out)
    out.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())  # a plain exit: meshlayout.torch drains gloo at exit (torch/_exit.py)
