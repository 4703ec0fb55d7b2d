"""meshlayout on ``torch.distributed``: real process groups for pure meshes.

Needs torch and an initialised default process group (``torchrun`` or
``torch.distributed.init_process_group``), except over a :func:`sync_group` (two
separately launched worlds). See ``docs/runtime.md``.

>>> from meshlayout.torch import build, init_mesh, DistributedMesh, MeshMismatchError
"""

from __future__ import annotations

from . import _requirements  # noqa: F401  (first: explains a missing or old torch)
from ._errors import MeshMismatchError, RankTimeoutError, TransferVerificationError
from ._exit import drain_at_exit  # noqa: F401  (import registers the clean-exit drain)
from ._mesh import DistributedMesh, init_mesh, mesh_fingerprint
from ._parallel import HostLayoutWarning, ParallelMeshes, build, build_parallel_dims
from ._reshard import reshard
from ._tensor import distribute, full_tensor, redistribute
from .transfer import SyncGroup, WeightTransfer, sync_group, transfer

__all__ = [
    "DistributedMesh",
    "HostLayoutWarning",
    "MeshMismatchError",
    "ParallelMeshes",
    "RankTimeoutError",
    "SyncGroup",
    "TransferVerificationError",
    "WeightTransfer",
    "build",
    "build_parallel_dims",
    "distribute",
    "full_tensor",
    "init_mesh",
    "mesh_fingerprint",
    "redistribute",
    "reshard",
    "sync_group",
    "transfer",
]
