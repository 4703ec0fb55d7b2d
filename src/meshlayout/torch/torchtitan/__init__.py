"""meshlayout inside torchtitan (the ``torchtitan`` extra; see ``docs/torchtitan.md``).

:class:`ParallelDims` is torchtitan 0.3.0's ``ParallelDims`` with meshes built by
meshlayout: the same constructor, accessors, mesh names and groups, with groups
created by their members only and a cross-rank check first. Importing this module
imports torchtitan; ``import meshlayout.torch`` does not.
"""

from __future__ import annotations

from ._parallel_dims import SPMD_BACKENDS, ParallelDims

__all__ = ["SPMD_BACKENDS", "ParallelDims"]
