"""torchtitan's ``ParallelDims`` with meshes built by meshlayout (the drop-in).

torchtitan 0.3.0's ``ParallelDims.build_mesh`` unflattens a 1-D world ``DeviceMesh``
four or five times. torch's ``_unflatten`` creates every group of every new dim on
every rank (``new_group`` is collective over the whole world, one call per group),
so a rank makes O(world) creation calls, most of them for groups it is not in and
many of them duplicates (``dp_shard`` of the dense mesh and ``efsdp`` of the sparse
mesh are often the same ranks). torchtitan's docstring says so and works around part
of it with the ``fake`` backend.

:class:`ParallelDims` here is a subclass: same constructor (a dataclass of the same
fields, the same ``_validate``), same accessors (inherited, unchanged:
``get_mesh``, ``get_optional_mesh``, ``get_activated_mesh``, ``resolve_mesh``,
``spmd_meshes``, ``spmd_dense_mesh``, ``spmd_sparse_mesh``, ``get_dense_tp_mesh``,
``get_all_one_dimensional_meshes``, ``world_mesh``, the ``*_enabled`` flags...). Only
:meth:`ParallelDims.build_mesh` differs: the global meshes torchtitan keeps
(``dataloading``, ``loss``, ``dense``, ``sparse`` and, under ``spmd_types``, the SPMD
forward/backward meshes) are meshlayout :class:`~meshlayout.torch.DistributedMesh`
objects turned into ``DeviceMesh`` objects (``.to_torch()``), over groups created by
their members only (one call per distinct group this rank is in), cached, with
deterministic names. The one-dimensional meshes are sliced from them with torch's
own slicing, as torchtitan does, so every accessor sees the same names and the same
groups (members and order) as with torchtitan's own ``build_mesh``.

What changes for a job: the number of group-creation calls (and the time), the
cross-rank check of the degrees before any group is created (a rank started with
other degrees makes every rank raise ``MeshMismatchError`` instead of hanging), and
size-1 groups, which are local one-member groups without a communicator.

Usage (in a torchtitan trainer, in place of ``torchtitan.distributed.ParallelDims``)::

    from meshlayout.torch.torchtitan import ParallelDims

    parallel_dims = ParallelDims.from_config(config.parallelism, world_size)
    parallel_dims.build_mesh()
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torchtitan.distributed import parallel_dims as _titan

from ...mesh import Mesh
from ...parallel_dims import ParallelDims as PureParallelDims
from ...torchtitan_names import SPMD_BACKENDS, SPMD_DENSE_AXES, SPMD_SPARSE_AXES
from .._mesh import DistributedMesh, init_mesh
from .._parallel import build

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["SPMD_BACKENDS", "ParallelDims"]

#: The fake backend: groups of dims that do not exist get no communicator.
_FAKE = "fake"


class ParallelDims(_titan.ParallelDims):  # type: ignore[misc]  # torchtitan ships no types
    """torchtitan 0.3.0's ``ParallelDims`` whose ``build_mesh`` uses meshlayout's groups.

    Construct it exactly like torchtitan's (``ParallelDims(dp_replicate=..., dp_shard=...,
    cp=..., tp=..., pp=..., ep=..., world_size=..., spmd_backend=...)`` or
    ``ParallelDims.from_config(config.parallelism, world_size)``); the same degrees are
    refused (torchtitan's ``_validate``, then meshlayout's check that ``ep`` divides
    ``dp_shard*cp*tp``, which torchtitan only finds in ``build_mesh``).

    Attributes beyond torchtitan's: :attr:`meshlayout_dims` (the pure
    :class:`meshlayout.ParallelDims` of the same degrees) and :meth:`distributed_mesh`
    (a global mesh as a :class:`~meshlayout.torch.DistributedMesh`). Class attributes
    :attr:`check` (cross-rank check before creating groups, default True; skipped on
    the ``fake`` backend, which has no peers) and :attr:`timeout` (seconds, default
    c10d's) can be set on a subclass or the instance.
    """

    check: bool = True
    timeout: float | timedelta | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # torchtitan refuses ep not dividing dp_shard*cp*tp only inside build_mesh (a
        # torch unflatten error); the pure ParallelDims says which product failed.
        self._meshlayout = PureParallelDims(
            self.world_size,
            pp=self.pp,
            dp_replicate=self.dp_replicate,
            dp_shard=self.dp_shard,
            cp=self.cp,
            tp=self.tp,
            ep=self.ep,
        )
        self._distributed: dict[str, DistributedMesh] = {}

    @property
    def meshlayout_dims(self) -> PureParallelDims:
        """The pure :class:`meshlayout.ParallelDims` of these degrees (every view, no groups)."""
        pd: PureParallelDims = self._meshlayout
        return pd

    def distributed_mesh(self, name: str) -> DistributedMesh:
        """One of torchtitan's global meshes (``"dense"``, ``"sparse"``, ...) as meshlayout's
        :class:`~meshlayout.torch.DistributedMesh` (built by :meth:`build_mesh`)."""
        if not self._distributed:
            self.build_mesh()
        try:
            return self._distributed[name]
        except KeyError:
            raise KeyError(
                f"no global mesh {name!r}; this ParallelDims has {list(self._distributed)}"
            ) from None

    def build_mesh(self) -> DeviceMesh:
        """torchtitan's ``build_mesh`` with meshlayout's groups: same meshes, names, groups.

        Collective over the world (every rank calls it, as torchtitan's). Each rank
        creates only the groups it is a member of, once each, plus none for dims that
        do not exist (``_mesh_exist``: the ``fake`` backend) or have one rank.
        """
        pure = self.meshlayout_dims
        device = str(_titan.device_type)  # the name torchtitan's build_mesh uses
        if self.check and str(dist.get_backend()) != _FAKE:
            build(pure, device, views=(), timeout=self.timeout, check=True)
        meshes = {
            key: self._bind(mesh, device)
            for key, mesh in pure.torchtitan(self.spmd_backend).global_meshes().items()
        }
        self._distributed = meshes
        torch_meshes = {key: dm.to_torch() for key, dm in meshes.items()}
        self._world_mesh = torch_meshes.pop("world")
        self._global_meshes = torch_meshes
        self._multi_axis_meshes: dict[tuple[str, ...], DeviceMesh] = {}
        dataloading, dense, sparse = (torch_meshes[k] for k in ("dataloading", "dense", "sparse"))
        single: dict[str, Any] = {
            "pp": dataloading["pp"],
            "batch": dataloading["batch"],
            "loss": torch_meshes["loss"],
            "dp_replicate": dense["dp_replicate"],
            "cp": dataloading["cp"],
            "tp": dataloading["tp"],
            "ep": sparse["ep"],
            "efsdp": sparse["efsdp"],
        }
        if self.spmd_backend == "spmd_types":
            single["dp"] = torch_meshes["spmd_dense_for_fwdbwd"]["dp"]
            single["dp_shard"] = dense["dp_shard"]
        elif self.spmd_backend == "full_dtensor":
            single["dp_shard"] = dense["dp_shard"]
        else:
            single["fsdp"] = dense["fsdp"]
        self._single_axis_meshes = single
        self._validate_meshes()
        self._spmd_meshes = [
            m
            for m in (
                self.get_activated_mesh(list(SPMD_DENSE_AXES[self.spmd_backend])),
                self.get_activated_mesh(list(SPMD_SPARSE_AXES)),
            )
            if m is not None
        ]
        world: DeviceMesh = self._world_mesh
        return world

    def _bind(self, mesh: Mesh, device: str) -> DistributedMesh:
        """The mesh on this rank's groups; dims that do not exist get the fake backend."""
        absent = {
            name: _FAKE
            for name, size in zip(mesh.names, mesh.shape)
            if name != "world" and not self._mesh_exist(_exist_name(name), size)
        }
        return init_mesh(
            mesh, device, backend_override=absent or None, timeout=self.timeout, check=False
        )


def _exist_name(name: str) -> str:
    """The name torchtitan's ``_mesh_exist`` is asked about for one of our dims."""
    return "loss" if name == "loss_mesh" else name
