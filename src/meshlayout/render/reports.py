"""JSON-ready reports behind ``meshlayout plan|mesh|shard`` (stable keys: docs/cli.md).

Every value is a plain ``dict``/``list``/``int``/``str``/``bool``/``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..mesh import Mesh
from ..parallel_dims import VIEWS, ParallelDims
from ..sharding import Placement, Replicate, Shard, ShardingSpec, StridedShard
from .torch_view import torch_local_shape_and_offset, torch_spec_runs

__all__ = [
    "MESH_SCHEMA",
    "PLAN_SCHEMA",
    "SHARD_SCHEMA",
    "group_hosts",
    "mesh_report",
    "placement_text",
    "plan_report",
    "same_groups",
    "shard_report",
    "view_groups",
]

PLAN_SCHEMA = "meshlayout.plan/1"
MESH_SCHEMA = "meshlayout.mesh/1"
SHARD_SCHEMA = "meshlayout.shard/1"


def view_groups(mesh: Mesh) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Every sub-mesh of ``mesh`` flattened row-major: shape ``(num_groups, group_size)``."""
    return np.asarray(mesh.submeshes()).reshape(mesh.num_submeshes, mesh.size())


def same_groups(a: Mesh, b: Mesh) -> bool:
    """True if ``a`` and ``b`` have the same groups in the same order; O(ndim), not O(world).

    Both flattened to one dim over the same rank map are then the same mesh.

    >>> m = Mesh({"dp": 2, "cp": 2, "tp": 2})
    >>> same_groups(m["dp", "cp"], m["dp", "cp"].flatten()), same_groups(m["dp"], m["cp"])
    (True, False)
    """
    return a.rank_map == b.rank_map and a.flatten("g") == b.flatten("g")


def group_hosts(groups: np.ndarray[Any, Any], ranks_per_host: int) -> np.ndarray[Any, Any]:
    """Number of distinct hosts (``rank // ranks_per_host``) each group touches."""
    hosts = np.sort(groups // ranks_per_host, axis=1)
    out: np.ndarray[Any, Any] = 1 + np.count_nonzero(np.diff(hosts, axis=1), axis=1)
    return out


def plan_report(
    pd: ParallelDims,
    *,
    views: Sequence[str] | None = None,
    rank: int | None = None,
    ranks_per_host: int | None = None,
) -> dict[str, Any]:
    """Every (or the chosen) view of ``pd``: shape, groups, host crossings, ``rank``'s place."""
    names = list(VIEWS) if views is None else list(views)
    out_views: dict[str, Any] = {}
    for name in names:
        mesh = pd.mesh(name)
        groups = view_groups(mesh)
        entry: dict[str, Any] = {
            "purpose": VIEWS[name],
            "dims": list(mesh.names),
            "shape": list(mesh.shape),
            "group_size": mesh.size(),
            "num_groups": mesh.num_submeshes,
            "groups": groups.tolist(),
            "hosts_spanned": None,
            "crossing_groups": None,
            "rank": None,
        }
        if ranks_per_host is not None:
            spans = group_hosts(groups, ranks_per_host)
            entry["hosts_spanned"] = int(spans.max())
            entry["crossing_groups"] = int(np.count_nonzero(spans > 1))
        if rank is not None:
            coord = mesh.coordinate(rank)
            member = mesh.submesh(rank).reshape(-1).tolist()
            index = int(np.flatnonzero((groups == member[0]).any(axis=1))[0])
            entry["rank"] = {
                "coordinate": list(coord or ()),
                "group_index": index,
                "group": member,
            }
        out_views[name] = entry
    world = pd.world_size
    return {
        "schema": PLAN_SCHEMA,
        "world_size": world,
        "degrees": pd.degrees,
        "order": list(pd.order),
        "ranks_per_host": ranks_per_host,
        "num_hosts": None if ranks_per_host is None else -(-world // ranks_per_host),
        "rank": rank,
        "views": out_views,
    }


def mesh_report(
    mesh: Mesh, *, operations: Sequence[tuple[str, str]] = (), rank: int | None = None
) -> dict[str, Any]:
    """A mesh (a family of sub-meshes): shape, layout, every sub-mesh and group."""
    rng = mesh.rank_map.as_range()
    report: dict[str, Any] = {
        "schema": MESH_SCHEMA,
        "dims": list(mesh.names),
        "shape": list(mesh.shape),
        "size": mesh.size(),
        "num_submeshes": mesh.num_submeshes,
        "layout": str(mesh.layout),
        "axes": [str(a) for a in mesh.axes],
        "rank_map": [int(r) for r in mesh.rank_map],
        "rank_map_range": None if rng is None else [rng.start, rng.stop, rng.step],
        "operations": [{"op": op, "arg": arg} for op, arg in operations],
        "submeshes": np.asarray(mesh.submeshes()).tolist(),
        "groups": {n: np.asarray(mesh.groups(n)).tolist() for n in mesh.names},
        "rank": None,
    }
    if rank is not None:
        coord = mesh.coordinate(rank)
        assert coord is not None
        report["rank"] = {
            "rank": rank,
            "coordinate": list(coord),
            "groups": {n: list(mesh.group(rank, n)) for n in mesh.names},
            "submesh": mesh.submesh(rank).tolist(),
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


def _mesh_ranks(mesh: Mesh) -> list[int]:
    return [int(r) for r in np.asarray(mesh.submeshes()).reshape(-1)]


def shard_report(spec: ShardingSpec, *, given: Sequence[Placement] | None = None) -> dict[str, Any]:
    """Per rank: runs, local shape, offset, box; the shard order; torch 2.13's view."""
    mesh = spec.mesh
    assert isinstance(mesh, Mesh)
    order = (
        {str(d): [mesh.names[m] for m in ms] for d, ms in spec.shard_order().items()}
        if spec.decodable
        else None
    )
    ranks = []
    differ = []
    for r in _mesh_ranks(mesh):
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
