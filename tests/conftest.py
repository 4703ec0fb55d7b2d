"""Suite-wide settings and shared fixtures.

No per-example time limit in hypothesis tests: tests assert behaviour and counts,
never seconds (timings live in ``benchmarks/``); hypothesis's default 200 ms deadline
per example would make property tests fail on a loaded machine, so every profile here
has ``deadline=None``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("meshlayout", deadline=None)
settings.load_profile("meshlayout")


@pytest.fixture(scope="session")
def torchtitan_reference() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(job, answers per rank) for every job of ``torchtitan_configs.titan_jobs()``.

    torchtitan 0.3.0's own ``ParallelDims`` and the drop-in, on the fake backend, in one
    subprocess (``tests/torchtitan_reference.py``), once per test process: tests using it
    carry ``xdist_group("torchtitan_reference")`` so ``make test`` (``--dist loadgroup``)
    runs them in one worker. Skips where torchtitan (the ``torchtitan`` extra) is absent.
    """
    from torch_versions import TORCHTITAN_MISSING, TORCHTITAN_USABLE

    if not TORCHTITAN_USABLE:
        pytest.skip(TORCHTITAN_MISSING)
    import torchtitan_configs
    from torchtitan_reference import run_reference

    jobs = torchtitan_configs.titan_jobs()
    return list(zip(jobs, run_reference(jobs)))
