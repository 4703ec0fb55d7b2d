"""torch's literal reading of a placement list: per tensor dim, the split steps.

torch 2.13's ``compute_local_shape_and_global_offset`` (and ``distribute_tensor``)
walk the mesh dims left to right and split each sharded tensor dim by every
``Shard``/``_StridedShard`` on it: a *step* ``(mesh dim, mesh dim size,
split factor)``, ``Shard`` being split factor 1. :func:`placement_steps` lists
those steps; :func:`torch_split_runs` applies them to one mesh coordinate with
:func:`~meshlayout.sharding.literal_runs`. Both are the one home of this walk
(``ShardingSpec`` uses it for undecodable lists, ``render`` to show torch's view).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..inttuple import check_int
from ._order import Runs, literal_runs
from ._placements import Placement, Shard, StridedShard

__all__ = ["Step", "literal_runs_at", "placement_steps", "torch_split_runs"]

#: One split of a tensor dim: (mesh dim, size of that mesh dim, split factor).
Step = tuple[int, int, int]


def placement_steps(
    placements: Sequence[Placement], mesh_shape: Sequence[int], tensor_ndim: int
) -> tuple[tuple[Step, ...], ...]:
    """Per tensor dim, the ``(mesh dim, size, split factor)`` steps splitting it, left to right.

    Negative ``Shard`` dims count from the end of the tensor's ``tensor_ndim`` dims.

    >>> placement_steps([StridedShard(0, 2), Shard(0)], (3, 2), 2)
    (((0, 3, 2), (1, 2, 1)), ())
    """
    nd = check_int(tensor_ndim, "tensor_ndim", minimum=0)
    if len(placements) != len(mesh_shape):
        raise ValueError(
            f"{len(placements)} placements {list(placements)} for a {len(mesh_shape)}-D mesh "
            f"of shape {tuple(mesh_shape)}: one placement per mesh dim is needed"
        )
    steps: list[list[Step]] = [[] for _ in range(nd)]
    for m, (p, k) in enumerate(zip(placements, mesh_shape)):
        if not isinstance(p, (Shard, StridedShard)):
            continue
        if not -nd <= p.dim < nd:
            raise ValueError(f"{p!r} on mesh dim {m}: tensor dim out of range for {nd} dims")
        sf = p.split_factor if isinstance(p, StridedShard) else 1
        steps[p.dim % nd].append((m, int(k), sf))
    return tuple(tuple(s) for s in steps)


def torch_split_runs(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    placements: Sequence[Placement],
    coord: Sequence[int],
) -> tuple[Runs, ...]:
    """Per tensor dim, the runs torch's literal walk gives the rank at mesh ``coord``.

    >>> torch_split_runs((7,), (3, 2), [StridedShard(0, 2), Shard(0)], (2, 0))
    (((6, 7),),)
    """
    steps = placement_steps(placements, mesh_shape, len(global_shape))
    return literal_runs_at(global_shape, steps, coord)


def literal_runs_at(
    global_shape: Sequence[int], steps: Sequence[Sequence[Step]], coord: Sequence[int]
) -> tuple[Runs, ...]:
    """Apply each tensor dim's ``steps`` (from :func:`placement_steps`) at mesh ``coord``."""
    return tuple(
        literal_runs(n, [(k, coord[m], sf) for m, k, sf in s]) for n, s in zip(global_shape, steps)
    )
