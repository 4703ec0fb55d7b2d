"""Pure arithmetic of sharding: chunk bounds, runs, and the shard-order codec.

A *run* is a half-open global interval ``(start, stop)``; a rank's data along one
tensor dim is a tuple of non-empty, non-adjacent runs in local order.

A *shard order* lists, per tensor dim, the mesh dims that split it, outermost
first. :func:`encode` turns it into torch-compatible split factors, :func:`decode`
is torch's planner rule in the other direction (``None`` when nothing fits).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = [
    "Run",
    "Runs",
    "chunk_bounds",
    "decode",
    "encode",
    "literal_runs",
    "merge_runs",
    "nested_run",
    "take",
]

Run = tuple[int, int]
Runs = tuple[Run, ...]
# Per tensor dim, the ordered mesh dims that split it.
Order = tuple[tuple[int, ...], ...]


def chunk_bounds(n: int, k: int, i: int) -> Run:
    """Piece ``i`` of ``n`` items chunked into ``k`` with the ``torch.chunk`` rule.

    >>> [chunk_bounds(7, 3, i) for i in range(3)]
    [(0, 3), (3, 6), (6, 7)]
    >>> [chunk_bounds(4, 3, i) for i in range(3)]  # c = 2: the last piece is empty
    [(0, 2), (2, 4), (4, 4)]
    """
    c = -(-n // k)
    return min(i * c, n), min((i + 1) * c, n)


def nested_run(n: int, steps: Iterable[tuple[int, int]]) -> Run:
    """Chunk ``[0, n)`` by ``(k, i)`` steps, outermost first; the final interval.

    >>> nested_run(7, [(2, 1), (3, 2)])  # TP (2) then DP (3): rank (dp=2, tp=1)
    (6, 7)
    """
    start, length = 0, n
    for k, i in steps:
        lo, hi = chunk_bounds(length, k, i)
        start += lo
        length = hi - lo
    return start, start + length


def merge_runs(runs: Iterable[Run]) -> Runs:
    """Drop empty runs and fuse runs that continue each other.

    >>> merge_runs([(0, 2), (2, 2), (2, 4), (6, 7)])
    ((0, 4), (6, 7))
    """
    out: list[Run] = []
    for a, b in runs:
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def take(runs: Sequence[Run], a: int, b: int) -> list[Run]:
    """Positions ``[a, b)`` of the concatenation of ``runs``, as global runs.

    >>> take([(0, 2), (4, 6)], 1, 3)
    [(1, 2), (4, 5)]
    """
    out: list[Run] = []
    pos = 0
    for s, e in runs:
        lo, hi = max(a, pos), min(b, pos + e - s)
        if lo < hi:
            out.append((s + lo - pos, s + hi - pos))
        pos += e - s
        if pos >= b:
            break
    return out


def literal_runs(n: int, steps: Iterable[tuple[int, int, int]]) -> Runs:
    """``_StridedShard._split_tensor`` applied left to right, by ``(k, i, split_factor)``.

    Each step splits the current extent into ``split_factor`` pieces, chunks each
    into ``k`` and keeps piece ``i`` of each (``split_factor == 1`` is a plain chunk).

    >>> literal_runs(8, [(2, 0, 2)])  # [_StridedShard(0, 2)] on 2 ranks: rank 0
    ((0, 2), (4, 6))
    """
    runs: Runs = ((0, n),) if n > 0 else ()
    for k, i, sf in steps:
        total = sum(e - s for s, e in runs)
        picked: list[Run] = []
        for j in range(sf):
            lo, hi = chunk_bounds(total, sf, j)
            if lo >= total:  # every later piece is empty: at most min(sf, total) rounds
                break
            a, b = chunk_bounds(hi - lo, k, i)
            picked.extend(take(runs, lo + a, lo + b))
        runs = merge_runs(picked)
    return runs


def encode(order: Sequence[int], sizes: Sequence[int]) -> dict[int, int]:
    """Split factor of every mesh dim in one tensor dim's ``order``.

    ``sf(m)`` is the product of the sizes of the mesh dims placed before ``m`` in
    the order whose index is greater than ``m``.

    >>> encode((1, 0), (3, 2))  # FSDP (mesh dim 0) over TP (mesh dim 1)
    {1: 1, 0: 2}
    """
    return {m: math.prod(sizes[x] for x in order[:pos] if x > m) for pos, m in enumerate(order)}


def decode(factors: Sequence[tuple[int, int]], sizes: Sequence[int]) -> tuple[int, ...] | None:
    """torch's planner rule: rebuild one tensor dim's order from ``(mesh dim, sf)`` pairs.

    Walk mesh dims right to left and insert each at the first position where the
    product of the sizes already placed before it equals its split factor.
    ``None`` if some split factor fits nowhere.

    >>> decode([(0, 2), (1, 1)], (3, 2))
    (1, 0)
    >>> decode([(0, 2)], (2,)) is None
    True
    """
    out: list[int] = []
    for m, sf in sorted(factors, reverse=True):
        acc = 1
        for pos in range(len(out) + 1):
            if acc == sf:
                out.insert(pos, m)
                break
            if pos < len(out):
                acc *= sizes[out[pos]]
        else:
            return None
    return tuple(out)
