"""JSON-ready reports behind ``meshlayout plan|mesh|shard`` (stable keys: docs/cli.md).

Every value of a *complete* report (the default, what ``--format json`` prints)
is a plain ``dict``/``list``/``int``/``str``/``bool``/``None``. Complete reports
list every group, so they are refused (:class:`TooLargeError`) beyond
:data:`LIST_LIMIT` ranks. A *sampled* report (``complete=False``, what the text
output is made from) lists only the groups the text shows, each as a
:class:`~meshlayout.render._fmt.RankSample`, computed per group in O(ndim) per
rank shown: it works for any world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..mesh import Mesh, check_whole_hosts
from ..sharding import (
    Placement,
    Replicate,
    Shard,
    ShardingSpec,
    StridedShard,
    placement_steps,
)
from ._groups import (
    SHOW_GROUPS,
    group_index,
    group_sample,
    rank_map_sample,
    shown_group_indices,
)
from .torch_view import torch_local_shape_and_offset, torch_spec_runs

__all__ = [
    "LIST_LIMIT",
    "MESH_SCHEMA",
    "PLAN_SCHEMA",
    "SHARD_SCHEMA",
    "PlanDims",
    "TooLargeError",
    "check_size",
    "mesh_report",
    "placement_text",
    "plan_report",
    "runs_bound",
    "same_groups",
    "shard_report",
]

PLAN_SCHEMA = "meshlayout.plan/1"
MESH_SCHEMA = "meshlayout.mesh/1"
SHARD_SCHEMA = "meshlayout.shard/1"

#: Most numbers (ranks, runs) an answer may enumerate: complete reports, host
#: counts and pictures beyond it are refused; sampled text reports are not.
LIST_LIMIT = 1 << 22
#: Sub-meshes up to this many ranks are drawn as a grid in the text output.
GRID_CELLS = 512


class TooLargeError(ValueError):
    """An answer that would enumerate more than :data:`LIST_LIMIT` numbers (ranks, runs).

    Raised for the size of the request, never for a bug: the command line turns it
    into a one-line error naming the flag that asked for the answer.
    """


def check_size(count: int, what: str, unit: str = "ranks", *, limit: int | None = None) -> None:
    """:class:`TooLargeError` naming ``what`` if ``count`` exceeds ``limit`` (default LIST_LIMIT).

    >>> check_size(2**40, "the plan's groups")
    Traceback (most recent call last):
    ...
    meshlayout.render.reports.TooLargeError: the plan's groups: 1099511627776 ranks, more than \
the limit of 4194304 (meshlayout.render.LIST_LIMIT); the text output abridges any size
    """
    limit = LIST_LIMIT if limit is None else limit
    if count > limit:
        raise TooLargeError(
            f"{what}: {count} {unit}, more than the limit of {limit} "
            "(meshlayout.render.LIST_LIMIT); the text output abridges any size"
        )


def same_groups(a: Mesh, b: Mesh) -> bool:
    """True if ``a`` and ``b`` have the same groups in the same order; O(ndim), not O(world).

    Both flattened to one dim over the same rank map are then the same mesh.

    >>> m = Mesh({"dp": 2, "cp": 2, "tp": 2})
    >>> same_groups(m["dp", "cp"], m["dp", "cp"].flatten()), same_groups(m["dp"], m["cp"])
    (True, False)
    """
    return a.rank_map == b.rank_map and a.flatten("g") == b.flatten("g")


class PlanDims(Protocol):
    """What a plan report needs of a job's dims: :class:`~meshlayout.ParallelDims` and
    :class:`~meshlayout.MegatronDims` both have it.

    ``view_purposes`` names every view (in report order) and what its groups are
    for; ``rank_order`` lists the dims in rank space, outermost first; ``dense``
    is the root mesh the pictures draw every view on.
    """

    @property
    def world_size(self) -> int: ...

    @property
    def degrees(self) -> dict[str, int]: ...

    @property
    def rank_order(self) -> tuple[str, ...]: ...

    @property
    def view_purposes(self) -> dict[str, str]: ...

    @property
    def dense(self) -> Mesh: ...

    def mesh(self, name_or_names: str | Sequence[str]) -> Mesh: ...


def plan_report(
    dims: PlanDims,
    *,
    views: Sequence[str] | None = None,
    rank: int | None = None,
    ranks_per_host: int | None = None,
    complete: bool = True,
) -> dict[str, Any]:
    """Every (or the chosen) view of ``dims``: shape, groups, host crossings, ``rank``'s place.

    ``dims`` is a :class:`~meshlayout.ParallelDims` or a
    :class:`~meshlayout.MegatronDims` (anything :class:`PlanDims`).
    ``complete=False`` gives the sampled report :func:`plan_text` shows (any world
    size). Host counts need every group: :class:`TooLargeError` past LIST_LIMIT.
    ``ranks_per_host`` must divide the world size when ``dims`` holds ranks
    ``0..world_size-1`` (ValueError naming both otherwise); dims on other global ranks
    are part of a larger job whose size is not known here.

    >>> from meshlayout import MegatronDims, ParallelDims
    >>> rep = plan_report(ParallelDims(16, tp=4), rank=5, ranks_per_host=8)
    >>> tp = rep["views"]["tp"]
    >>> tp["groups"][1], tp["rank"]["group_index"], tp["hosts_spanned"], tp["same_groups_as"]
    ([4, 5, 6, 7], 1, 1, None)
    >>> rep = plan_report(MegatronDims(8, tp=2, ep=2), views=["ep"])
    >>> rep["kind"], rep["order"], rep["views"]["ep"]["groups"]
    ('MegatronDims', ['pp', 'dp', 'ep', 'cp', 'tp'], [[0, 2], [1, 3], [4, 6], [5, 7]])
    """
    world = dims.world_size
    purposes = dims.view_purposes
    names = list(purposes) if views is None else list(views)
    unknown = [n for n in names if n not in purposes]
    if unknown:
        raise KeyError(f"unknown views {unknown}; valid views are {list(purposes)}")
    if complete or ranks_per_host is not None:
        what = f"every group of {len(names)} views of {world} ranks"
        check_size(world * len(names), what, "numbers")
    if ranks_per_host is not None and _whole_job(dims):
        check_whole_hosts(ranks_per_host, world)
    out_views: dict[str, Any] = {}
    for name in names:
        mesh = dims.mesh(name)
        entry = _view_entry(mesh, rank, ranks_per_host, complete)
        entry["purpose"] = purposes[name]
        entry["same_groups_as"] = next(
            (n for n in out_views if same_groups(dims.mesh(n), mesh)), None
        )
        out_views[name] = entry
    return {
        "schema": PLAN_SCHEMA,
        "kind": type(dims).__name__,
        "dims": repr(dims),
        "world_size": world,
        "degrees": dims.degrees,
        "order": list(dims.rank_order),
        "ranks_per_host": ranks_per_host,
        "num_hosts": None if ranks_per_host is None else -(-world // ranks_per_host),
        "rank": rank,
        "views": out_views,
    }


def _whole_job(dims: PlanDims) -> bool:
    """Whether ``dims`` holds exactly the global ranks ``0..world_size-1`` (in any order)."""
    ranks = dims.dense.rank_map.to_numpy()
    return bool(ranks.min() == 0 and ranks.max() == len(ranks) - 1)


def _fewest_crossing(spans: Any) -> int:
    """The fewest hosts a group touches among those touching several (1 when none does)."""
    crossing = spans[spans > 1]
    return int(crossing.min()) if crossing.size else 1


def _view_entry(
    mesh: Mesh, rank: int | None, ranks_per_host: int | None, complete: bool
) -> dict[str, Any]:
    """One view of a plan report (see :func:`plan_report`)."""
    spans = None if ranks_per_host is None else mesh.hosts_spanned(ranks_per_host)
    entry: dict[str, Any] = {
        "purpose": "",
        "dims": list(mesh.names),
        "shape": list(mesh.shape),
        "group_size": mesh.size(),
        "num_groups": mesh.num_submeshes,
        "same_groups_as": None,
        "groups": mesh.group_table().tolist() if complete else None,
        "group_hosts": None if spans is None or not complete else spans.tolist(),
        "hosts_spanned": None if spans is None else int(spans.max()),
        "crossing_groups": None if spans is None else int(np.count_nonzero(spans > 1)),
        "crossing_hosts_min": None if spans is None else _fewest_crossing(spans),
        "rank": None,
    }
    if not complete:
        entry["sample_groups"] = [
            {
                "index": i,
                "ranks": group_sample(mesh, i),
                "hosts": None if spans is None else int(spans[i]),
            }
            for i in shown_group_indices(mesh.num_submeshes)
        ]
    if rank is not None:
        index = group_index(mesh, rank)
        entry["rank"] = {
            "coordinate": list(mesh.coordinate(rank) or ()),
            "group_index": index,
            "group": mesh.submesh(rank).reshape(-1).tolist()
            if complete
            else group_sample(mesh, index),
            "hosts": None if spans is None else int(spans[index]),
        }
    return entry


def mesh_report(
    mesh: Mesh,
    *,
    operations: Sequence[tuple[str, str]] = (),
    rank: int | None = None,
    complete: bool = True,
) -> dict[str, Any]:
    """A mesh (a family of sub-meshes): shape, layout, every sub-mesh and group.

    ``complete=False`` gives the sampled report :func:`mesh_text` shows: the rank
    map, the first groups along each dim and ``rank``'s groups as
    :class:`~meshlayout.render._fmt.RankSample`, sub-meshes only up to GRID_CELLS
    ranks (``first_submesh``); any world size.
    """
    world = len(mesh.rank_map)
    if complete:
        what = (
            f"a complete report of {world} ranks (rank map, sub-meshes, groups of {mesh.ndim} dims)"
        )
        check_size(world * (2 + mesh.ndim), what, "numbers")
    rng = mesh.rank_map.as_range()
    views = {n: mesh[n] for n in mesh.names}
    report: dict[str, Any] = {
        "schema": MESH_SCHEMA,
        "dims": list(mesh.names),
        "shape": list(mesh.shape),
        "size": mesh.size(),
        "num_submeshes": mesh.num_submeshes,
        "layout": str(mesh.layout),
        "axes": [str(a) for a in mesh.axes],
        "rank_map": [int(r) for r in mesh.rank_map] if complete else rank_map_sample(mesh.rank_map),
        "rank_map_range": None if rng is None else [rng.start, rng.stop, rng.step],
        "operations": [{"op": op, "arg": arg} for op, arg in operations],
        "num_groups": {n: v.num_submeshes for n, v in views.items()},
        "rank": None,
    }
    if complete:
        report["submeshes"] = mesh.submeshes().tolist()
        report["groups"] = {n: v.group_table().tolist() for n, v in views.items()}
    else:
        report["submeshes"] = None
        report["groups"] = {
            n: [group_sample(v, i) for i in range(min(v.num_submeshes, SHOW_GROUPS))]
            for n, v in views.items()
        }
        small = mesh.size() <= GRID_CELLS
        report["first_submesh"] = mesh.submesh(mesh.rank_map[0]).tolist() if small else None
    if rank is not None:
        coord = mesh.coordinate(rank)
        if coord is None:
            raise ValueError(f"rank {rank} is not in {mesh!r}")
        groups: dict[str, Any] = {
            n: list(mesh.group(rank, n)) if complete else group_sample(v, group_index(v, rank))
            for n, v in views.items()
        }
        small = complete or mesh.size() <= GRID_CELLS
        report["rank"] = {
            "rank": rank,
            "coordinate": list(coord),
            "groups": groups,
            "submesh": mesh.submesh(rank).tolist() if small else None,
        }
    return report


def placement_text(p: Placement) -> str:
    """The command-line spelling of a placement (re-parsable by ``--placements``).

    >>> from meshlayout.sharding import Partial
    >>> placement_text(StridedShard(0, 2)), placement_text(Partial("max"))
    ('SS(0,2)', 'P(max)')
    """
    if isinstance(p, StridedShard):
        return f"SS({p.dim},{p.split_factor})"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    return f"P({p.reduce_op})"


def runs_bound(spec: ShardingSpec) -> int:
    """An upper bound on the runs a :func:`shard_report` of ``spec`` lists (ours and torch's).

    Per rank and tensor dim: at most the extent, and at most the product of the
    split factors of the steps on that dim (each literal split adds fewer than
    ``split_factor`` runs). Times the number of ranks.

    >>> from meshlayout.sharding import Shard, StridedShard
    >>> mesh = Mesh({"dp": 3, "tp": 2})
    >>> runs_bound(ShardingSpec((7, 4), mesh, [StridedShard(0, 2), Shard(0)]))  # 6 * (2 + 1)
    18
    """
    mesh = spec.mesh
    assert isinstance(mesh, Mesh)
    steps = placement_steps(spec.placements(), mesh.shape, len(spec.global_shape))
    per_rank = 0
    for n, dim_steps in zip(spec.global_shape, steps):
        pieces = math.prod(sf for _, _, sf in dim_steps)
        per_rank += min(max(n, 1), pieces)
    return len(mesh.rank_map) * per_rank


def shard_report(spec: ShardingSpec, *, given: Sequence[Placement] | None = None) -> dict[str, Any]:
    """Per rank: runs, local shape, offset, box; the shard order; torch 2.13's view.

    :class:`TooLargeError` if :func:`runs_bound` exceeds LIST_LIMIT.
    """
    mesh = spec.mesh
    assert isinstance(mesh, Mesh)
    check_size(runs_bound(spec), "the sharding report lists every run of every rank", "runs")
    order = (
        {str(d): [mesh.names[m] for m in ms] for d, ms in spec.shard_order().items()}
        if spec.decodable
        else None
    )
    ranks = []
    differ = []
    for r in mesh.group_table().reshape(-1).tolist():
        runs = spec.local_runs(r)
        box = spec.is_box(r)
        t_runs = torch_spec_runs(spec, r)
        t_shape, t_offset = torch_local_shape_and_offset(spec, r)
        agrees = t_runs == runs
        if not agrees:
            differ.append(r)
        ranks.append(
            {
                "rank": r,
                "coordinate": list(mesh.coordinate(r) or ()),
                "runs": [[list(run) for run in dim_runs] for dim_runs in runs],
                "local_shape": list(spec.local_shape(r)),
                "global_offset": list(spec.local_offset(r)) if box else None,
                "is_box": box,
                "torch": {
                    "runs": [[list(run) for run in dim_runs] for dim_runs in t_runs],
                    "local_shape": list(t_shape),
                    "global_offset": list(t_offset),
                },
                "torch_agrees": agrees,
            }
        )
    notes = _shard_notes(spec, differ)
    return {
        "schema": SHARD_SCHEMA,
        "global_shape": list(spec.global_shape),
        "mesh": {"dims": list(mesh.names), "shape": list(mesh.shape)},
        "given_placements": [placement_text(p) for p in (given or spec.placements())],
        "placements": [placement_text(p) for p in spec.placements()],
        "decodable": spec.decodable,
        "shard_order": order,
        "ranks": ranks,
        "torch_disagrees": differ,
        "notes": notes,
    }


def _shard_notes(spec: ShardingSpec, differ: list[int]) -> list[str]:
    notes = []
    if not spec.decodable:
        notes.append(
            "these placements do not decode to a shard order: every rank keeps the literal "
            "_StridedShard split meaning (pieces may be several runs, not boxes)"
        )
    if differ:
        notes.append(
            f"torch 2.13 compute_local_shape_and_global_offset / distribute_tensor apply the "
            f"literal split meaning and disagree with the shard order (what FSDP2 and the "
            f"redistribute planner use) on ranks {differ}: checkpoint shapes/offsets from "
            f"torch would be wrong there"
        )
    return notes
