"""``build``: every view of a :class:`~meshlayout.ParallelDims` on real process groups.

``build`` takes any object with named views: ``ParallelDims`` (torchtitan's dims) or
another description of a job with the same small interface (:class:`JobDims`).

Usage (under ``torchrun --nproc-per-node 8``)::

    from meshlayout import ParallelDims
    from meshlayout.torch import build

    meshes = build(ParallelDims(8, dp_shard=2, tp=4), "cuda")   # this rank's groups only
    meshes.get_or_create("tp").get_group(0)                       # a ProcessGroup
    meshes.get_or_create(("fsdp", "tp")).to_torch()               # a DeviceMesh for FSDP2 + TP
    meshes.get_optional_mesh("cp")                                # None: cp is disabled
    print(meshes.host_report(["tp", "fsdp"]))                     # "tp: every group in one host"

torchtitan's accessors (``get_mesh``, ``get_optional_mesh``,
``get_all_one_dimensional_meshes``, ``seq_len_divisor``, ``non_data_parallel_size``)
return :class:`DistributedMesh` objects here; every decision (which dims exist, which
names are valid, which combinations) is the pure ``ParallelDims``'s, and dims that do
not exist get the ``fake`` backend (no communicator), as in torchtitan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import torch.distributed as dist

from ..mesh import Mesh, check_whole_hosts
from ..rank_map import RankMap
from ..torchtitan_names import TORCHTITAN_NAMES
from . import _c10d
from ._check import check_in_world, check_over_rank_map, rank_map_summary
from ._hosts import (
    IN_HOST_VIEWS,
    HostLayoutWarning,
    Hosts,
    check_hosts,
    crossing_summary,
    hosts_from_environment,
    warn_if_crossing,
)
from ._mesh import DistributedMesh, init_mesh
from ._store import as_timedelta

__all__ = ["HostLayoutWarning", "JobDims", "ParallelMeshes", "build", "build_parallel_dims"]


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

    torchtitan's accessors (:meth:`get_mesh`, :meth:`get_optional_mesh`,
    :meth:`get_all_one_dimensional_meshes`) take torchtitan's names and follow the
    pure ``ParallelDims`` in everything (None, errors, which dims exist); they are
    cached by names. :attr:`hosts` and :meth:`host_report` say which groups cross
    hosts.
    """

    def __init__(
        self,
        parallel_dims: JobDims,
        device_type: str,
        timeout: timedelta | None,
        hosts: Hosts | None = None,
    ) -> None:
        self.parallel_dims = parallel_dims
        self.device_type = device_type
        self.timeout = timeout
        self.hosts = hosts
        self._meshes: dict[tuple[str, ...], DistributedMesh] = {}
        self._titan: dict[tuple[str, ...], DistributedMesh] = {}

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

    # ------------------------------------------------------------------ torchtitan's names
    def _torchtitan(self, what: str) -> Any:
        pd = self.parallel_dims
        if not hasattr(pd, "get_optional_mesh") or not hasattr(pd, "mesh_exists"):
            raise TypeError(
                f"{what} takes torchtitan's names and needs a meshlayout.ParallelDims; "
                f"these meshes were built from a {type(pd).__name__}: use get_or_create(view)"
            )
        return pd

    def get_optional_mesh(
        self, dims: str | Sequence[str], *, include_singleton_axes: bool = False
    ) -> DistributedMesh | None:
        """torchtitan's ``get_optional_mesh`` on process groups: None when a dim is disabled.

        None exactly when ``ParallelDims.get_optional_mesh`` says so (and the same
        ``ValueError`` for an unknown name or dims that overlap). A dim that does not
        exist (``ParallelDims.mesh_exists``: e.g. ``cp`` of size 1, ``efsdp`` when
        ``ep == 1``), asked for with ``include_singleton_axes=True``, gets torch's
        ``fake`` backend: no communicator. The first call for some names may be
        collective over the members of groups not created yet; later calls return
        the cached mesh.
        """
        pd = self._torchtitan("get_optional_mesh")
        mesh = pd.get_optional_mesh(dims, include_singleton_axes=include_singleton_axes)
        if mesh is None:
            return None
        key = (dims,) if isinstance(dims, str) else tuple(dims)
        dm = self._titan.get(key)
        if dm is not None:
            return dm
        absent = {
            name: "fake"
            for name in mesh.names
            if name in TORCHTITAN_NAMES and not pd.mesh_exists(name)
        }
        built = self._meshes.get(key)
        if not absent and built is not None and built.mesh == mesh:
            dm = built  # the view build() made eagerly: same mesh, same groups
        else:
            dm = init_mesh(
                mesh,
                self.device_type,
                backend_override=absent or None,
                timeout=self.timeout,
                check=False,
            )
        self._titan[key] = dm
        return dm

    def get_mesh(self, dims: str | Sequence[str]) -> DistributedMesh:
        """torchtitan's ``get_mesh``: the mesh of ``dims``, or ``ValueError`` if one is disabled.

        The error is ``ParallelDims.get_mesh``'s (it names the disabled dims).
        """
        dm = self.get_optional_mesh(dims)
        if dm is None:
            self._torchtitan("get_mesh").get_mesh(dims)  # raises, saying which dim is disabled
            raise AssertionError(f"ParallelDims.get_mesh({dims!r}) did not refuse")  # unreachable
        return dm

    def get_all_one_dimensional_meshes(self) -> dict[str, DistributedMesh]:
        """torchtitan's ``get_all_one_dimensional_meshes``: every enabled 1-D mesh by name.

        The names and their order are ``ParallelDims.get_all_one_dimensional_meshes``'s.
        """
        pd = self._torchtitan("get_all_one_dimensional_meshes")
        out: dict[str, DistributedMesh] = {}
        for name in pd.get_all_one_dimensional_meshes():
            dm = self.get_optional_mesh(name)
            assert dm is not None, name
            out[name] = dm
        return out

    @property
    def seq_len_divisor(self) -> int:
        """``ParallelDims.seq_len_divisor``: ``tp * cp * 2``."""
        return int(self._torchtitan("seq_len_divisor").seq_len_divisor)

    @property
    def non_data_parallel_size(self) -> int:
        """``ParallelDims.non_data_parallel_size``: ``cp * tp * pp``."""
        return int(self._torchtitan("non_data_parallel_size").non_data_parallel_size)

    # ------------------------------------------------------------------ hosts
    def hosts_spanned(self, view: str | Sequence[str]) -> int | None:
        """The most hosts any group of ``view`` touches (1: inside a host); None if unknown.

        Pure arithmetic on the view's mesh (O(world)); creates nothing.
        """
        if self.hosts is None:
            return None
        key = view if isinstance(view, str) else tuple(view)
        return crossing_summary(self.parallel_dims.mesh(key), self.hosts.ranks_per_host)[0]

    def host_report(self, views: Sequence[str] | None = None) -> str:
        """Lines saying where the hosts come from and, per view, how its groups sit on them.

        ``views`` default: the views built so far with more than one rank per group.
        The wording is ``meshlayout plan``'s hosts column. Example (4 ranks, 2 per
        host, ``ParallelDims(4, tp=2)``)::

            hosts: 2 x 2 ranks (torchrun: LOCAL_WORLD_SIZE=2); checked: every rank ...
            tp: every group in one host
            fsdp: 2/2 groups span 2 hosts
        """
        world = len(self.parallel_dims.rank_map)
        if self.hosts is None:
            return (
                "hosts: unknown (not launched by torchrun: LOCAL_WORLD_SIZE and GROUP_RANK "
                "are unset; pass build(..., ranks_per_host=N))"
            )
        if views is None:
            views = [k[0] for k, dm in self._meshes.items() if len(k) == 1 and dm.size() > 1]
        from ..render._fmt import hosts_text

        lines = [self.hosts.describe(world)]
        for view in views:
            spans = self.parallel_dims.mesh(view).hosts_spanned(self.hosts.ranks_per_host)
            crossing = spans[spans > 1]
            fewest, most = (int(crossing.min()), int(crossing.max())) if crossing.size else (1, 1)
            in_host = view in IN_HOST_VIEWS and crossing.size
            warn = "  (warning: should stay inside a host)" if in_host else ""
            lines.append(f"{view}: {hosts_text(crossing.size, spans.size, fewest, most)}{warn}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        built = ", ".join("+".join(k) for k in self._meshes)
        return f"ParallelMeshes({self.parallel_dims!r}, {self.device_type}; built: {built})"


def _eager_views(parallel_dims: JobDims) -> list[str]:
    """The views :func:`build` creates by default: those that exist (torchtitan's rule).

    A view that does not exist (``efsdp`` and ``ehsdp`` when ``ep == 1``, size-1
    dims) gets no communicator; asking for it later still works.
    """
    exists = getattr(parallel_dims, "mesh_exists", None)
    names = list(parallel_dims.views())
    if exists is None:
        return names
    return [v for v in names if v not in TORCHTITAN_NAMES or exists(v)]


def _in_host_views(parallel_dims: JobDims) -> dict[str, Mesh]:
    views = parallel_dims.views()
    return {n: views[n] for n in IN_HOST_VIEWS if n in views and views[n].size() > 1}


def build(
    parallel_dims: JobDims,
    device_type: str = "cpu",
    *,
    views: Sequence[str] | None = None,
    timeout: timedelta | float | None = None,
    check: bool = True,
    ranks_per_host: int | None = None,
) -> ParallelMeshes:
    """Bind ``parallel_dims`` to this process: create this rank's groups of its views.

    Every rank of ``parallel_dims`` calls it. ``check`` first compares (degrees,
    order, rank map, device type, ranks per host) across those ranks through the
    store: on a difference every rank raises :class:`MeshMismatchError`. ``views``
    (default: every view of ``parallel_dims.views()`` that exists by torchtitan's
    rule, see ``ParallelDims.mesh_exists``; ``efsdp`` and ``ehsdp`` are left out when
    ``ep == 1``) are created eagerly in that order; each rank makes one creation
    call per distinct group it lacks, so size-1 dims and views that repeat another
    view's groups cost nothing. ``timeout`` (seconds or ``timedelta``; default c10d's
    for the backend) bounds the checks, every creation and the collectives of the
    meshes returned; absent ranks are named in a :class:`RankTimeoutError`.

    Hosts: ``ranks_per_host`` consecutive ranks per host, default torchrun's
    ``LOCAL_WORLD_SIZE`` (None outside torchrun: hosts unknown); it must divide the
    world size (``ValueError`` naming both, at once on every rank). With ``check``,
    every rank reports its node (torchrun's ``GROUP_RANK``, or the host name) through
    the store and a host whose ranks are on different nodes, or two hosts on one
    node, makes every rank raise ``ValueError``. If ``tp`` (or ``etp``) groups cross
    hosts, a :class:`HostLayoutWarning` says so; :meth:`ParallelMeshes.host_report`
    lists every view.
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
    rank_map = parallel_dims.rank_map
    what = f"build({parallel_dims!r})"
    world = dist.get_world_size()
    check_in_world(
        rank_map,
        what,
        world,
        hint=f"choose degrees whose product is {world} (dp_shard=-1 infers it from the "
        "world size), or launch that many processes",
    )
    td = None if timeout is None else as_timedelta(timeout, _c10d.default_timeout())
    hosts = hosts_from_environment(ranks_per_host, os.environ)
    if hosts is not None:  # every rank refuses at once, before any wait
        check_whole_hosts(hosts.ranks_per_host, world, hosts.source, f"the world of {world} ranks")
    member = dist.get_rank() in rank_map
    if check and member:
        fields = {
            "degrees": repr(sorted(parallel_dims.degrees.items())),
            "order": repr(parallel_dims.order),
            "rank_map": rank_map_summary(rank_map),
            "device_type": device_type,
            "ranks_per_host": "unknown" if hosts is None else hosts.source,
        }
        check_over_rank_map(fields, rank_map, timeout=td or _c10d.default_timeout(), what=what)
        if hosts is not None:
            hosts = check_hosts(hosts, rank_map, timeout=td or _c10d.default_timeout(), what=what)
    if hosts is not None and member:
        warn_if_crossing(_in_host_views(parallel_dims), hosts, what)
    meshes = ParallelMeshes(parallel_dims, device_type, td, hosts)
    for view in _eager_views(parallel_dims) if views is None else views:
        meshes.get_or_create(view)
    return meshes


build_parallel_dims = build
"""The former name of :func:`build` (same function)."""
