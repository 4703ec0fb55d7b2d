"""meshlayout inside torchtitan (the ``torchtitan`` extra; see ``docs/torchtitan.md``).

:class:`ParallelDims` is torchtitan 0.3.0's ``ParallelDims`` with meshes built by
meshlayout: the same constructor, accessors, mesh names and groups, with groups
created by their members only and a cross-rank check first. Importing this module
imports torchtitan; ``import meshlayout.torch`` does not.

:class:`ExactCheckpointManager` is torchtitan's ``CheckpointManager`` saving and
loading through the exact DCP planners (``exact_checkpoint_config`` switches a job's
``config.checkpoint`` to it).
"""

from __future__ import annotations

from .._requirements import require_torchtitan

require_torchtitan()

from ._checkpoint import ExactCheckpointManager, exact_checkpoint_config  # noqa: E402
from ._parallel_dims import SPMD_BACKENDS, ParallelDims  # noqa: E402

__all__ = ["SPMD_BACKENDS", "ExactCheckpointManager", "ParallelDims", "exact_checkpoint_config"]
