"""What torch 2.13 reports for a placement list, modelled purely (torch is not imported).

``torch.distributed.tensor._utils.compute_local_shape_and_global_offset`` (and
``distribute_tensor``) walk the mesh dims left to right and give every
``_StridedShard(d, sf)`` its *literal* ``_split_tensor`` meaning: split the current
extent of ``d`` into ``sf`` pieces (``torch.chunk`` rule), chunk each piece into the
mesh dim's size, and keep piece ``i`` of each. ``Shard`` is the ``sf == 1`` case.
Its planner and FSDP2 use the nested shard order instead, so the two can disagree.

>>> torch_runs(7, [(3, 2, 2), (2, 0, 1)])  # SS(0,2) on dp=3 (coord 2), S(0) on tp=2 (coord 0)
((6, 7),)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..sharding import Shard, ShardingSpec, StridedShard

__all__ = ["torch_local_shape_and_offset", "torch_runs", "torch_spec_runs"]

Run = tuple[int, int]


def _chunk(n: int, k: int, i: int) -> Run:
    c = -(-n // k) if k else 0
    return min(i * c, n), min((i + 1) * c, n)


def _positions(runs: Sequence[Run], a: int, b: int) -> list[Run]:
    """Local positions ``[a, b)`` of the concatenated ``runs``, as global runs."""
    out: list[Run] = []
    pos = 0
    for s, e in runs:
        lo, hi = max(a, pos), min(b, pos + e - s)
        if lo < hi:
            out.append((s + lo - pos, s + hi - pos))
        pos += e - s
    return out


def _merge(runs: Sequence[Run]) -> tuple[Run, ...]:
    out: list[Run] = []
    for a, b in runs:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return tuple(out)


def torch_runs(n: int, steps: Sequence[tuple[int, int, int]]) -> tuple[Run, ...]:
    """Runs of one tensor dim after ``(mesh dim size, coordinate, split factor)`` steps."""
    runs: tuple[Run, ...] = ((0, n),) if n > 0 else ()
    for k, i, sf in steps:
        total = sum(e - s for s, e in runs)
        picked: list[Run] = []
        for j in range(sf):
            lo, hi = _chunk(total, sf, j)
            a, b = _chunk(hi - lo, k, i)
            picked.extend(_positions(runs, lo + a, lo + b))
        runs = _merge(picked)
    return runs


def torch_spec_runs(spec: ShardingSpec, rank: int) -> tuple[tuple[Run, ...], ...]:
    """Per tensor dim, the runs torch 2.13 assigns ``rank`` for ``spec.placements()``."""
    mesh = spec.mesh
    coord = mesh.coordinate(rank)
    if coord is None:
        return tuple(() for _ in spec.global_shape)
    sizes = tuple(int(s) for s in mesh.shape)
    out = []
    for d, n in enumerate(spec.global_shape):
        steps = []
        for m, p in enumerate(spec.placements()):
            if isinstance(p, StridedShard) and p.dim == d:
                steps.append((sizes[m], coord[m], p.split_factor))
            elif isinstance(p, Shard) and p.dim == d:
                steps.append((sizes[m], coord[m], 1))
        out.append(torch_runs(n, steps))
    return tuple(out)


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
