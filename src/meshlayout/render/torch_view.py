"""What torch 2.13 reports for a placement list, modelled purely (torch is not imported).

``torch.distributed.tensor._utils.compute_local_shape_and_global_offset`` (and
``distribute_tensor``) walk the mesh dims left to right and give every
``_StridedShard(d, sf)`` its *literal* ``_split_tensor`` meaning: split the current
extent of ``d`` into ``sf`` pieces (``torch.chunk`` rule), chunk each piece into the
mesh dim's size, and keep piece ``i`` of each. ``Shard`` is the ``sf == 1`` case.
Its planner and FSDP2 use the nested shard order instead, so the two can disagree.

The literal walk itself is :func:`meshlayout.sharding.torch_split_runs`:

>>> from meshlayout import Mesh, ShardingSpec, Shard, StridedShard
>>> spec = ShardingSpec((7,), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
>>> torch_spec_runs(spec, 4), spec.local_runs(4)  # rank (dp=2, tp=0): torch vs FSDP2
((((6, 7),),), ((),))
"""

from __future__ import annotations

from ..sharding import Shard, ShardingSpec, StridedShard, torch_split_runs

__all__ = ["torch_local_shape_and_offset", "torch_spec_runs"]

Run = tuple[int, int]


def torch_spec_runs(spec: ShardingSpec, rank: int) -> tuple[tuple[Run, ...], ...]:
    """Per tensor dim, the runs torch 2.13 assigns ``rank`` for ``spec.placements()``."""
    coord = spec.mesh.coordinate(rank)
    if coord is None:
        return tuple(() for _ in spec.global_shape)
    return torch_split_runs(spec.global_shape, spec.mesh.shape, spec.placements(), coord)


def torch_local_shape_and_offset(
    spec: ShardingSpec, rank: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """torch's ``(local_shape, global_offset)``: first global index, ``n`` when empty."""
    runs = torch_spec_runs(spec, rank)
    sharded = {p.dim for p in spec.placements() if isinstance(p, (Shard, StridedShard))}
    shape = tuple(sum(b - a for a, b in r) for r in runs)
    offset = tuple(
        (r[0][0] if r else n) if d in sharded else 0
        for d, (r, n) in enumerate(zip(runs, spec.global_shape))
    )
    return shape, offset
