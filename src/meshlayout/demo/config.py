"""What the demo runs: its sizes and tolerances, :class:`DemoConfig`, and the plan."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..parallel_dims import ParallelDims

__all__ = [
    "GLOBAL_BATCH",
    "LEARNING_RATE",
    "LOSS_TOLERANCE",
    "MAX_TIMEOUT",
    "PARAM_TOLERANCE",
    "DemoConfig",
    "demo_parallel_dims",
]

IN_FEATURES, HIDDEN, OUT_FEATURES = 10, 6, 10
GLOBAL_BATCH = 24
LEARNING_RATE = 0.1
LOSS_TOLERANCE = 1e-5
PARAM_TOLERANCE = 1e-5
MAX_TIMEOUT = 86_400.0  # one day: a longer wait is a mistake, and timedelta overflows past ~1e14 s


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs: ``nproc`` processes for ``steps`` steps, bounded by ``timeout`` s.

    Everything is checked here, before a process starts; ``nproc`` must split the
    global batch of 24 (1, 2, 3, 4, 6 or 8), ``timeout`` is finite and positive.

    >>> DemoConfig(nproc=3, steps=2).timeout
    120.0
    >>> DemoConfig(timeout=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: timeout must be a finite number of seconds in (0, 86400], got nan
    """

    nproc: int = 4
    steps: int = 20
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int):
            raise TypeError(f"nproc must be an int in [1, 8], got {self.nproc!r}")
        if not 1 <= self.nproc <= 8:
            raise ValueError(f"nproc must be an int in [1, 8], got {self.nproc!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int):
            raise TypeError(f"steps must be a positive int, got {self.steps!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be a positive int, got {self.steps!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, got {self.timeout!r}")
        if not (math.isfinite(self.timeout) and 0 < self.timeout <= MAX_TIMEOUT):
            raise ValueError(
                f"timeout must be a finite number of seconds in (0, {MAX_TIMEOUT:.0f}], "
                f"got {self.timeout!r}"
            )
        if GLOBAL_BATCH % demo_parallel_dims(self.nproc).mesh("batch").size() != 0:
            raise ValueError(f"nproc={self.nproc} does not split the batch of {GLOBAL_BATCH}")


def demo_parallel_dims(nproc: int) -> ParallelDims:
    """The demo's plan: TP over 2 ranks when possible, FSDP over the rest.

    >>> demo_parallel_dims(4).degrees["dp_shard"], demo_parallel_dims(4).degrees["tp"]
    (2, 2)
    """
    tp = 2 if nproc % 2 == 0 else 1
    return ParallelDims(nproc, tp=tp)
