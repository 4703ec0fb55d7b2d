"""DistributedMesh: a pure :class:`~meshlayout.Mesh` bound to this process and its groups.

``init_mesh`` checks (optionally) that all ranks of the mesh agree on it, then
creates this rank's group along every dim through the shared group engine
(:mod:`meshlayout.torch._groups`): one creation call per distinct group this rank
does not hold yet, by the members only. Slicing, flatten and unflatten return new
``DistributedMesh`` objects whose groups come from the same cache.

Usage (under ``torchrun --nproc-per-node 8``)::

    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    dm = init_mesh(Mesh({"dp": 2, "tp": 4}), "cuda")
    tp_group = dm.get_group("tp")          # a real ProcessGroup, coordinate order
    dm["tp"].to_torch()                     # a torch DeviceMesh for DTensor / FSDP2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.distributed as dist

from ..mesh import Dim, Mesh
from ..rank_map import RankMap
from . import _c10d
from ._check import check_in_world, check_over_rank_map, rank_map_summary
from ._groups import get_group, options_key
from ._store import as_timedelta

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["BackendSpec", "DistributedMesh", "init_mesh", "mesh_fingerprint"]

BackendSpec = tuple[str | None, Any]
"""(backend name or None for the default group's, backend options or None)."""

_OneBackend = str | tuple[str | None, Any] | None
BackendOverride = Sequence[_OneBackend] | Mapping[str, _OneBackend] | None


def _one_spec(value: Any, where: str) -> BackendSpec:
    if value is None or isinstance(value, str):
        return (value, None)
    if isinstance(value, tuple) and len(value) == 2:
        backend, options = value
        if backend is not None and not isinstance(backend, str):
            raise TypeError(f"{where}: backend must be a str or None, got {backend!r}")
        return (backend, options)
    raise TypeError(f"{where}: expected a backend name, None or (backend, options); got {value!r}")


def _normalise_backends(mesh: Mesh, override: BackendOverride) -> tuple[BackendSpec, ...]:
    if override is None:
        return ((None, None),) * mesh.ndim
    if isinstance(override, Mapping):
        unknown = [k for k in override if k not in mesh.names]
        if unknown:
            raise KeyError(f"backend_override names unknown dims {unknown}; dims are {mesh.names}")
        return tuple(_one_spec(override.get(n), f"backend_override[{n!r}]") for n in mesh.names)
    specs = list(override)
    if len(specs) != mesh.ndim:
        raise ValueError(
            f"backend_override has {len(specs)} entries for a {mesh.ndim}-D mesh {mesh.names}"
        )
    return tuple(_one_spec(s, f"backend_override[{i}]") for i, s in enumerate(specs))


def mesh_fingerprint(
    mesh: Mesh, device_type: str, backends: Sequence[BackendSpec]
) -> dict[str, str]:
    """The fields compared across ranks by ``init_mesh(check=True)``."""
    return {
        "names": repr(mesh.names),
        "shape": repr(mesh.shape),
        "axes": " ".join(str(a) for a in mesh.axes),
        "rank_map": rank_map_summary(mesh.rank_map),
        "backends": repr(tuple((b, options_key(o)) for b, o in backends)),
        "device_type": device_type,
    }


class DistributedMesh:
    """A :class:`~meshlayout.Mesh` bound to this rank and to real process groups.

    Build one with :func:`init_mesh`. ``dm.mesh`` is the pure mesh; ``dm.rank`` and
    ``dm.coordinate`` locate this process (``coordinate`` is None when the rank is
    not covered, and then every group accessor raises ``ValueError``).
    """

    __slots__ = (
        "_backends",
        "_coordinate",
        "_device_type",
        "_groups",
        "_mesh",
        "_rank",
        "_timeout",
        "_torch",
    )

    def __init__(
        self,
        mesh: Mesh,
        device_type: str,
        backends: Sequence[BackendSpec],
        timeout: timedelta | None,
    ) -> None:
        self._mesh = mesh
        self._device_type = device_type
        self._backends = tuple(backends)
        self._timeout = timeout
        self._rank = dist.get_rank()
        self._coordinate = mesh.coordinate(self._rank)
        self._torch: DeviceMesh | None = None
        groups: list[dist.ProcessGroup] = []
        if self._coordinate is not None:
            for i, name in enumerate(mesh.names):
                backend, options = self._backends[i]
                groups.append(
                    get_group(
                        mesh.group(self._rank, i),
                        backend=backend,
                        pg_options=options,
                        timeout=timeout,
                        group_desc=f"mesh_{name}",
                    )
                )
        self._groups = tuple(groups)

    # ------------------------------------------------------------------ identity
    @property
    def mesh(self) -> Mesh:
        """The pure mesh."""
        return self._mesh

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self._rank

    @property
    def coordinate(self) -> tuple[int, ...] | None:
        """This rank's coordinate in its sub-mesh, or None if not covered."""
        return self._coordinate

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def names(self) -> tuple[str, ...]:
        return self._mesh.names

    @property
    def shape(self) -> tuple[int, ...]:
        return self._mesh.shape

    @property
    def ndim(self) -> int:
        return self._mesh.ndim

    @property
    def backends(self) -> tuple[BackendSpec, ...]:
        """Per dim: (backend or None for the default, options or None)."""
        return self._backends

    @property
    def timeout(self) -> timedelta | None:
        return self._timeout

    def size(self, dim: Dim | None = None) -> int:
        return self._mesh.size(dim)

    def _require_member(self, what: str) -> None:
        if self._coordinate is None:
            raise ValueError(
                f"{what}: rank {self._rank} is not in {self._mesh!r} "
                f"(ranks {rank_map_summary(self._mesh.rank_map)})"
            )

    # ------------------------------------------------------------------ groups
    def get_group(self, dim: Dim = 0) -> dist.ProcessGroup:
        """This rank's ProcessGroup along ``dim``; its group ranks are coordinates."""
        self._require_member("get_group")
        return self._groups[self._mesh.dim_index(dim)]

    def get_all_groups(self) -> tuple[dist.ProcessGroup, ...]:
        """This rank's group along every dim, in dim order."""
        self._require_member("get_all_groups")
        return self._groups

    def get_local_rank(self, dim: Dim = 0) -> int:
        """This rank's coordinate along ``dim`` (== its rank in ``get_group(dim)``)."""
        self._require_member("get_local_rank")
        coordinate = cast(tuple[int, ...], self._coordinate)
        return coordinate[self._mesh.dim_index(dim)]

    def group_ranks(self, dim: Dim = 0) -> tuple[int, ...]:
        """Global ranks of this rank's group along ``dim``, in coordinate order."""
        self._require_member("group_ranks")
        return self._mesh.group(self._rank, dim)

    # ------------------------------------------------------------------ derived meshes
    def _derive(self, mesh: Mesh, backends: Sequence[BackendSpec]) -> DistributedMesh:
        return DistributedMesh(mesh, self._device_type, backends, self._timeout)

    def __getitem__(self, key: Dim | Sequence[Dim]) -> DistributedMesh:
        """Select dims (any subset, any order); reuses this mesh's groups (no creation)."""
        keys = (key,) if isinstance(key, (str, int)) else tuple(key)
        sub = self._mesh[key]
        return self._derive(sub, [self._backends[self._mesh.dim_index(k)] for k in keys])

    def flatten(self, name: str | None = None) -> DistributedMesh:
        """Merge all dims; creates the flattened group unless it already exists.

        The merged dim keeps the dims' common backend, else the default backend.
        Collective over the members of the flattened group (like torch's ``_flatten``).
        """
        flat = self._mesh.flatten(name)
        distinct = {(b, options_key(o)) for b, o in self._backends}
        backend: BackendSpec = self._backends[0] if len(distinct) == 1 else (None, None)
        return self._derive(flat, [backend])

    def unflatten(
        self,
        dim: Dim,
        sizes: Sequence[int],
        names: Sequence[str],
        *,
        backend_override: BackendOverride = None,
    ) -> DistributedMesh:
        """Split one dim; new dims inherit its backend unless ``backend_override`` says
        otherwise (per new dim: a sequence, or a mapping by new name). Groups that already
        exist are reused; only missing ones are created (by their members).
        """
        i = self._mesh.dim_index(dim)
        new = self._mesh.unflatten(dim, sizes, names)
        names_t = (names,) if isinstance(names, str) else tuple(names)
        inherited = [self._backends[i]] * len(names_t)
        if backend_override is not None:
            part = Mesh(tuple(sizes), names_t)  # only to name/index the new dims
            given = _normalise_backends(part, backend_override)
            inherited = [g if g != (None, None) else inherited[k] for k, g in enumerate(given)]
        backends = [*self._backends[:i], *inherited, *self._backends[i + 1 :]]
        return self._derive(new, backends)

    # ------------------------------------------------------------------ torch interop
    def to_torch(self) -> DeviceMesh:
        """A ``torch.distributed.device_mesh.DeviceMesh`` over exactly these groups.

        Same dims, names, coordinates and ``get_local_rank`` as ours; no group is created.
        Every torch mesh made from meshes over one rank map shares that rank map (as
        torch's own slices of one root do), so ``dm["dp"].to_torch()`` and
        ``dm["tp"].to_torch()`` combine in FSDP2 over TP (``DeviceMesh._concatenate``).
        Usable by ``distribute_tensor``, ``parallelize_module`` and ``fully_shard``.

        Cost: O(size of the rank map) once per call site (torch stores the rank map as a
        tensor and a tuple per DeviceMesh); the rank-map tensor is shared.
        """
        self._require_member("to_torch")
        if self._torch is None:
            self._torch = _c10d.device_mesh_over_groups(
                self._device_type,
                self._mesh.names,
                self._mesh.axes,
                _rank_map_tensor(self._mesh),
                self._groups,
            )
        return self._torch

    def __repr__(self) -> str:
        where = "not covered" if self._coordinate is None else f"coordinate {self._coordinate}"
        return f"DistributedMesh({self._mesh!r}, rank {self._rank}: {where}, {self._device_type})"


def init_mesh(
    mesh: Mesh,
    device_type: str = "cpu",
    *,
    backend_override: BackendOverride = None,
    timeout: timedelta | float | None = None,
    check: bool = True,
) -> DistributedMesh:
    """Bind ``mesh`` to this process: check it across ranks, then create this rank's groups.

    ``backend_override``: per dim (sequence, or mapping by name) a backend name, None
    (the default group's backend), or ``(backend, options)``. ``timeout`` (seconds or
    ``timedelta``; default c10d's default for the backend) bounds the check and every
    group creation and is inherited by slices, flatten and unflatten. ``check=True``
    compares a fingerprint (names, shape, axes, rank map, backends, device type) across
    all ranks of the mesh through the store first: on disagreement every rank raises
    :class:`MeshMismatchError`; absent ranks are named in a :class:`RankTimeoutError`.

    Every rank of ``mesh.rank_map`` must call it; a rank outside gets a mesh whose
    ``coordinate`` is None (it creates nothing and takes no part in the check).
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"init_mesh takes a meshlayout.Mesh, got {type(mesh).__name__}")
    if not dist.is_initialized():
        raise RuntimeError(
            "init_mesh needs an initialised default process group: launch with torchrun "
            "(or call torch.distributed.init_process_group) first"
        )
    check_in_world(mesh.rank_map, f"init_mesh({mesh!r})")
    backends = _normalise_backends(mesh, backend_override)
    td = None if timeout is None else as_timedelta(timeout, _c10d.default_timeout())
    if check and dist.get_rank() in mesh:
        check_over_rank_map(
            mesh_fingerprint(mesh, device_type, backends),
            mesh.rank_map,
            timeout=td or _c10d.default_timeout(),
            what=f"init_mesh({mesh!r})",
        )
    return DistributedMesh(mesh, device_type, backends, td)


_RANK_MAP_TENSORS: dict[int, tuple[RankMap, torch.Tensor]] = {}


def _rank_map_tensor(mesh: Mesh) -> torch.Tensor:
    """One shared int tensor per RankMap object (torch's ``_rank_map``)."""
    rank_map = mesh.rank_map
    hit = _RANK_MAP_TENSORS.get(id(rank_map))
    if hit is not None and hit[0] is rank_map:
        return hit[1]
    tensor = torch.as_tensor(np.ascontiguousarray(rank_map.to_numpy()), dtype=torch.int)
    _RANK_MAP_TENSORS[id(rank_map)] = (rank_map, tensor)
    return tensor
