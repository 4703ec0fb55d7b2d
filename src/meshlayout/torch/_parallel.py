"""``ParallelDims.build``: every view of a :class:`~meshlayout.ParallelDims` on real groups."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from ._check import check_consistent, rank_set_digest
from ._mesh import DistributedMesh, _default_timeout, _rank_map_summary, init_mesh
from ._store import as_timedelta

if TYPE_CHECKING:
    from ..parallel_dims import ParallelDims

__all__ = ["ParallelMeshes", "build_parallel_dims"]


class ParallelMeshes:
    """The views of a :class:`~meshlayout.ParallelDims`, bound to process groups.

    ``get(view)`` (or a tuple of non-overlapping views) returns a
    :class:`DistributedMesh`. Views named at build time have their groups created
    then; any other view is created on first ``get`` — a collective over its members,
    so call it in the same order on every rank.
    """

    def __init__(
        self,
        parallel_dims: ParallelDims,
        device_type: str,
        timeout: timedelta | None,
    ) -> None:
        self.parallel_dims = parallel_dims
        self.device_type = device_type
        self.timeout = timeout
        self._meshes: dict[tuple[str, ...], DistributedMesh] = {}

    def get(self, view: str | Sequence[str]) -> DistributedMesh:
        """The DistributedMesh of one view, or of several views side by side."""
        key = (view,) if isinstance(view, str) else tuple(view)
        dm = self._meshes.get(key)
        if dm is None:
            mesh = self.parallel_dims.mesh(key[0] if len(key) == 1 else key)
            dm = init_mesh(mesh, self.device_type, timeout=self.timeout, check=False)
            self._meshes[key] = dm
        return dm

    def __getitem__(self, view: str | Sequence[str]) -> DistributedMesh:
        return self.get(view)

    def __repr__(self) -> str:
        built = ", ".join("+".join(k) for k in self._meshes)
        return f"ParallelMeshes({self.parallel_dims!r}, {self.device_type}; built: {built})"


def build_parallel_dims(
    parallel_dims: ParallelDims,
    device_type: str = "cpu",
    *,
    views: Sequence[str] | None = None,
    timeout: timedelta | float | None = None,
    check: bool = True,
) -> ParallelMeshes:
    """Bind ``parallel_dims`` to this process (``ParallelDims.build`` calls this).

    ``check`` compares (degrees, order, rank map, device type) across the world of
    ``parallel_dims`` first. ``views`` (default: every view) are created eagerly in
    a fixed order; each rank makes one creation call per distinct group it lacks,
    so disabled (size-1) dims and views that repeat another view's groups cost nothing.
    """
    from ..parallel_dims import VIEWS

    td = None if timeout is None else as_timedelta(timeout, _default_timeout())
    rank_map = parallel_dims.rank_map
    if check and dist.get_rank() in rank_map:
        rng = rank_map.as_range()
        check_consistent(
            {
                "degrees": repr(sorted(parallel_dims.degrees.items())),
                "order": repr(parallel_dims.order),
                "rank_map": _rank_map_summary(rank_map),
                "device_type": device_type,
            },
            rank_map,
            timeout=td or _default_timeout(),
            what=f"build({parallel_dims!r})",
            set_digest=rank_set_digest(rng if rng is not None else rank_map.to_numpy()),
        )
    built = ParallelMeshes(parallel_dims, device_type, td)
    for view in VIEWS if views is None else views:
        built.get(view)
    return built
