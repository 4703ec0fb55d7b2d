"""Brute-force sharding simulation: literally chunk ``numpy.arange`` step by step.

Deliberately independent of :mod:`meshlayout.sharding` (no shared code): every
index set is materialised, every order is found by trying all permutations.

* :func:`chunk` — ``torch.chunk`` rule, padded with empty pieces to ``k``.
* :func:`nested_indices` — the shard-order meaning: chunk in order, outermost first.
* :func:`literal_indices` — the ``_StridedShard._split_tensor`` meaning, left to right.
* :func:`brute_decode` — every permutation whose torch encoding equals the placements.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from meshlayout.sharding import Partial, Placement, Replicate, Shard, StridedShard

IntArray = np.ndarray


def chunk(idx: IntArray, k: int) -> list[IntArray]:
    """``torch.chunk(idx, k)`` plus empty pieces up to ``k`` (what DTensor uses)."""
    n = len(idx)
    c = math.ceil(n / k) if n else 0
    pieces = [idx[i * c : (i + 1) * c] for i in range(k)] if c else []
    pieces = [p for p in pieces if len(p)]
    return pieces + [idx[:0]] * (k - len(pieces))


def strided_split(idx: IntArray, sf: int, k: int, i: int) -> IntArray:
    """``_StridedShard(sf)._split_tensor`` piece ``i``: split into sf, chunk each into k."""
    return np.concatenate([chunk(p, k)[i] for p in chunk(idx, sf)])


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def shard_dims(placements: Sequence[Placement], ndim: int) -> dict[int, list[int]]:
    """tensor dim -> mesh dims sharding it (ascending)."""
    out: dict[int, list[int]] = {}
    for m, p in enumerate(placements):
        if isinstance(p, (Shard, StridedShard)):
            out.setdefault(norm_dim(p.dim, ndim), []).append(m)
    return out


def torch_encoding(order: Sequence[int], sizes: Sequence[int]) -> dict[int, int]:
    """split factor per mesh dim of a tensor dim's order, as torch's planner defines it."""
    sf = {}
    for pos, m in enumerate(order):
        earlier_right = [sizes[x] for x in order[:pos] if x > m]
        sf[m] = int(np.prod(earlier_right)) if earlier_right else 1
    return sf


def brute_decode(
    placements: Sequence[Placement], sizes: Sequence[int], ndim: int
) -> dict[int, list[tuple[int, ...]]] | None:
    """Per tensor dim, every order whose encoding equals the placements; None if one has none."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for d, ms in shard_dims(placements, ndim).items():
        want = {
            m: placements[m].split_factor if isinstance(placements[m], StridedShard) else 1
            for m in ms
        }
        found = [o for o in itertools.permutations(ms) if torch_encoding(o, sizes) == want]
        if not found:
            return None
        out[d] = found
    return out


def nested_indices(n: int, order: Sequence[int], sizes: Sequence[int], coord: Sequence[int]):
    idx = np.arange(n)
    for m in order:
        idx = chunk(idx, sizes[m])[coord[m]]
    return idx


def literal_indices(n: int, d: int, placements, sizes, coord, ndim: int) -> IntArray:
    idx = np.arange(n)
    for m, p in enumerate(placements):
        if isinstance(p, Shard) and norm_dim(p.dim, ndim) == d:
            idx = chunk(idx, sizes[m])[coord[m]]
        elif isinstance(p, StridedShard) and norm_dim(p.dim, ndim) == d:
            idx = strided_split(idx, p.split_factor, sizes[m], coord[m])
    return idx


def reference_indices(
    shape: Sequence[int],
    sizes: Sequence[int],
    placements: Sequence[Placement],
    coord: Sequence[int],
) -> list[IntArray]:
    """Global indices held along each tensor dim by the rank at ``coord``.

    Decodable lists (no StridedShard, or some order encodes to them) use the nested
    meaning with the first brute-forced order; others the literal split meaning.
    """
    ndim = len(shape)
    has_strided = any(isinstance(p, StridedShard) for p in placements)
    orders = brute_decode(placements, sizes, ndim) if has_strided else None
    dims = shard_dims(placements, ndim)
    out = []
    for d, n in enumerate(shape):
        if d not in dims:
            out.append(np.arange(n))
        elif not has_strided:
            out.append(nested_indices(n, dims[d], sizes, coord))
        elif orders is not None:
            out.append(nested_indices(n, orders[d][0], sizes, coord))
        else:
            out.append(literal_indices(n, d, placements, sizes, coord, ndim))
    return out


def reference_piece(array: IntArray, idx: list[IntArray]) -> IntArray:
    return array[np.ix_(*idx)] if idx else array.copy()


def all_coords(sizes: Sequence[int]):
    return itertools.product(*(range(s) for s in sizes))


def replicating_dims(placements: Sequence[Placement]) -> list[int]:
    return [m for m, p in enumerate(placements) if isinstance(p, (Replicate, Partial))]
