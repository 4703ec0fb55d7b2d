"""Hypothesis strategies for box and reshard tests: random specs on random meshes.

Specs use ``Shard``, ``StridedShard`` (decodable and undecodable), ``Replicate``; uneven
sizes; meshes of up to 16 ranks with random rank maps drawn from a small pool, so two
specs' rank sets are equal, overlapping or disjoint; sometimes a mesh *family*
(one dim of a larger mesh), whose sub-meshes each hold a full copy.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from meshlayout import Mesh
from meshlayout.sharding import Placement, Replicate, Shard, ShardingSpec, StridedShard

RANK_POOL = 20


@st.composite
def meshes(draw: st.DrawFn, pool: tuple[int, ...] = tuple(range(RANK_POOL))) -> Mesh:
    """A 1-3 D mesh of at most 16 ranks drawn (permuted) from ``pool``."""
    sizes: list[int] = []
    for _ in range(draw(st.integers(1, 3))):
        room = min(16, len(pool)) // math.prod(sizes)
        if room < 1:
            break
        sizes.append(draw(st.integers(1, min(4, room))))
    n = math.prod(sizes)
    ranks = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n, unique=True))
    mesh = Mesh(tuple(sizes), ranks=ranks)
    if mesh.ndim >= 2 and draw(st.booleans()):
        keep = draw(st.lists(st.integers(0, mesh.ndim - 1), min_size=1, unique=True))
        mesh = mesh[tuple(keep)]  # a family: one spec per sub-mesh
    return mesh


def _one_placement(tensor_ndim: int) -> st.SearchStrategy[Placement]:
    if not tensor_ndim:
        return st.just(Replicate())
    dims = st.integers(-tensor_ndim, tensor_ndim - 1)
    return st.one_of(
        st.just(Replicate()),
        st.builds(Shard, dims),
        st.builds(StridedShard, dims, st.integers(1, 4)),
    )


_ONE = {n: _one_placement(n) for n in range(4)}


def placements_for(mesh_ndim: int, tensor_ndim: int) -> st.SearchStrategy[list[Placement]]:
    """One placement per mesh dim: Replicate, Shard or StridedShard of a tensor dim."""
    return st.lists(_ONE[tensor_ndim], min_size=mesh_ndim, max_size=mesh_ndim)


@st.composite
def shapes(draw: st.DrawFn, max_ndim: int = 3) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(0, 11), min_size=0, max_size=max_ndim)))


@st.composite
def specs(
    draw: st.DrawFn,
    shape: tuple[int, ...] | None = None,
    pool: tuple[int, ...] = tuple(range(RANK_POOL)),
) -> ShardingSpec:
    if shape is None:
        shape = draw(shapes())
    mesh = draw(meshes(pool))
    return ShardingSpec(shape, mesh, draw(placements_for(mesh.ndim, len(shape))))


@st.composite
def spec_pairs(draw: st.DrawFn) -> tuple[ShardingSpec, ShardingSpec]:
    """Two specs of one global shape; rank sets equal, overlapping or disjoint."""
    shape = draw(shapes())
    mode = draw(st.sampled_from(["pool", "same", "disjoint"]))
    src = draw(specs(shape))
    used = covered(src)
    if mode == "same":
        sizes = _factor(draw, len(used))
        mesh = Mesh(tuple(sizes), ranks=list(draw(st.permutations(sorted(used)))))
        dst = ShardingSpec(shape, mesh, draw(placements_for(mesh.ndim, len(shape))))
    elif mode == "disjoint":
        free = tuple(r for r in range(2 * RANK_POOL) if r not in used)
        dst = draw(specs(shape, pool=free))
    else:
        dst = draw(specs(shape))
    return src, dst


def covered(spec: ShardingSpec) -> set[int]:
    """Every global rank of the spec's mesh (a family covers its whole rank map)."""
    return {int(r) for r in np.asarray(spec.mesh.submeshes()).reshape(-1)}


def _factor(draw: st.DrawFn, n: int) -> list[int]:
    sizes: list[int] = []
    rest = n
    while rest > 1 and len(sizes) < 2:
        d = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        if d == 1:
            break
        sizes.append(d)
        rest //= d
    sizes.append(rest)
    return sizes
