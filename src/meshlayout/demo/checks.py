"""The demo's verdicts: a training step's line, the PASS/FAIL lines of the losses and parameters.

Tolerances are read from :mod:`.config` when used (a test may change them there).
"""

from __future__ import annotations

from typing import IO, Any

from . import config

__all__ = ["check_training", "loss_matches", "step_line"]


def _progress(step: int, steps: int, width: int = 20) -> str:
    done = (step * width) // steps
    return "[" + "#" * done + "." * (width - done) + "]"


def loss_matches(value: float, ref: float) -> bool:
    """Within ``LOSS_TOLERANCE`` (relative above 1) of the single-process loss."""
    return abs(value - ref) <= config.LOSS_TOLERANCE * max(1.0, abs(ref))


def step_line(step: int, steps: int, value: float, ref: float) -> str:
    """One training step's line: the distributed loss beside the single-process one."""
    mark = "ok" if loss_matches(value, ref) else "MISMATCH"
    return (
        f"step {step + 1:3d}/{steps} {_progress(step + 1, steps)} "
        f"loss {value:.6f}  single-process {ref:.6f}  {mark}"
    )


def check_training(
    steps: int,
    losses: dict[int, float],
    params: dict[str, Any],
    ref_losses: list[float],
    ref_params: dict[str, Any],
    out: IO[str],
) -> bool:
    """Print a PASS/FAIL line for the losses and for each parameter; True if all pass.

    ``losses`` and ``params`` are what rank 0 reported (``"loss"`` and ``"params"``
    events); the references are :func:`.model.reference`'s.
    """
    import torch

    ok = len(losses) == steps and all(loss_matches(losses[s], ref_losses[s]) for s in range(steps))
    print(
        f"{'PASS' if ok else 'FAIL'} losses match the single-process run "
        f"({len(losses)}/{steps} steps, tolerance {config.LOSS_TOLERANCE:g})",
        file=out,
    )
    for name, ref in ref_params.items():
        info = params.get(name)
        if info is None:
            ok = False
            print(f"FAIL {name}: no parameter reported", file=out)
            continue
        close = torch.allclose(torch.tensor(info["value"]), ref, atol=config.PARAM_TOLERANCE)
        good = close and info["same_as_torch"]
        ok &= good
        ours_n, torch_n = info["collectives"]
        print(
            f"{'PASS' if good else 'FAIL'} full_tensor({name}) {tuple(ref.shape)} "
            f"{info['placements']}: equals single-process: {close}, equals torch's "
            f"DTensor.full_tensor(): {info['same_as_torch']}; collectives ours {ours_n}, "
            f"torch {torch_n}",
            file=out,
        )
    return ok
