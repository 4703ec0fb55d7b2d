"""``build``: every view of a :class:`~meshlayout.ParallelDims` on real process groups.

``build`` takes any object with named views: ``ParallelDims`` (torchtitan's dims) or
another description of a job with the same small interface (:class:`JobDims`).

Usage (under ``torchrun --nproc-per-node 8``)::

    from meshlayout import ParallelDims
    from meshlayout.torch import build

    meshes = build(ParallelDims(8, dp_shard=2, tp=4), "cuda")   # this rank's groups only
    meshes.get_or_create("tp").get_group(0)                       # a ProcessGroup
    meshes.get_or_create(("fsdp", "tp")).to_torch()               # a DeviceMesh for FSDP2 + TP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import torch.distributed as dist

from ..mesh import Mesh
from ..rank_map import RankMap
from . import _c10d
from ._check import check_over_rank_map, rank_map_summary
from ._mesh import DistributedMesh, init_mesh
from ._store import as_timedelta

__all__ = ["JobDims", "ParallelMeshes", "build", "build_parallel_dims"]


@runtime_checkable
class JobDims(Protocol):
    """What :func:`build` needs: named views over one rank map (``ParallelDims`` has it)."""

    @property
    def rank_map(self) -> RankMap: ...

    @property
    def degrees(self) -> Mapping[str, int]: ...

    @property
    def order(self) -> Any: ...

    def mesh(self, name_or_names: str | Sequence[str]) -> Mesh: ...

    def views(self) -> Mapping[str, Mesh]: ...


class ParallelMeshes:
    """The views of a :class:`~meshlayout.ParallelDims`, bound to process groups.

    Made by :func:`build`. :meth:`get_or_create` (or ``meshes[view]``) returns the
    :class:`DistributedMesh` of a view, or of a tuple of non-overlapping views side by
    side. Views built by :func:`build` are returned at once; any other view has its
    groups created on first use: **a collective over the members of those groups**,
    so ask for it in the same order on every rank.
    """

    def __init__(
        self,
        parallel_dims: JobDims,
        device_type: str,
        timeout: timedelta | None,
    ) -> None:
        self.parallel_dims = parallel_dims
        self.device_type = device_type
        self.timeout = timeout
        self._meshes: dict[tuple[str, ...], DistributedMesh] = {}

    def get_or_create(self, view: str | Sequence[str]) -> DistributedMesh:
        """The DistributedMesh of one view, or of several views side by side.

        Creating a view that is not built yet is collective over its groups' members
        (each rank creates only the groups it lacks, bounded by the build timeout).
        """
        key = (view,) if isinstance(view, str) else tuple(view)
        dm = self._meshes.get(key)
        if dm is None:
            mesh = self.parallel_dims.mesh(key[0] if len(key) == 1 else key)
            dm = init_mesh(mesh, self.device_type, timeout=self.timeout, check=False)
            self._meshes[key] = dm
        return dm

    def get(self, view: str | Sequence[str]) -> DistributedMesh:
        """Same as :meth:`get_or_create` (kept for existing callers): may be collective."""
        return self.get_or_create(view)

    def __getitem__(self, view: str | Sequence[str]) -> DistributedMesh:
        """Same as :meth:`get_or_create`: may be collective."""
        return self.get_or_create(view)

    def __repr__(self) -> str:
        built = ", ".join("+".join(k) for k in self._meshes)
        return f"ParallelMeshes({self.parallel_dims!r}, {self.device_type}; built: {built})"


def build(
    parallel_dims: JobDims,
    device_type: str = "cpu",
    *,
    views: Sequence[str] | None = None,
    timeout: timedelta | float | None = None,
    check: bool = True,
) -> ParallelMeshes:
    """Bind ``parallel_dims`` to this process: create this rank's groups of its views.

    Every rank of ``parallel_dims`` calls it. ``check`` first compares (degrees,
    order, rank map, device type) across those ranks through the store: on a
    difference every rank raises :class:`MeshMismatchError`. ``views`` (default:
    every view of ``parallel_dims.views()``, for ``ParallelDims`` those of
    :data:`meshlayout.parallel_dims.VIEWS`) are created eagerly in that order; each rank makes one creation call per distinct group it lacks, so
    disabled (size-1) dims and views that repeat another view's groups cost nothing.
    ``timeout`` (seconds or ``timedelta``; default c10d's for the backend) bounds the
    check, every creation and the collectives of the meshes returned; absent ranks
    are named in a :class:`RankTimeoutError`.
    """
    if not isinstance(parallel_dims, JobDims):
        raise TypeError(
            "build takes a meshlayout.ParallelDims (or an object with rank_map, degrees, "
            f"order, mesh() and views()), got {type(parallel_dims).__name__}"
        )
    if not dist.is_initialized():
        raise RuntimeError(
            "build needs an initialised default process group: launch with torchrun "
            "(or call torch.distributed.init_process_group) first"
        )
    if isinstance(views, str):
        raise TypeError(f"views must be a sequence of view names, e.g. [{views!r}]; got {views!r}")
    td = None if timeout is None else as_timedelta(timeout, _c10d.default_timeout())
    rank_map = parallel_dims.rank_map
    if check and dist.get_rank() in rank_map:
        fields = {
            "degrees": repr(sorted(parallel_dims.degrees.items())),
            "order": repr(parallel_dims.order),
            "rank_map": rank_map_summary(rank_map),
            "device_type": device_type,
        }
        check_over_rank_map(
            fields,
            rank_map,
            timeout=td or _c10d.default_timeout(),
            what=f"build({parallel_dims!r})",
        )
    meshes = ParallelMeshes(parallel_dims, device_type, td)
    for view in parallel_dims.views() if views is None else views:
        meshes.get_or_create(view)
    return meshes


build_parallel_dims = build
"""The former name of :func:`build` (same function)."""
