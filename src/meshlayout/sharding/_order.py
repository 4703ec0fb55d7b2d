"""Pure arithmetic of sharding: chunk bounds, runs, and the shard-order codec.

A *run* is a half-open global interval ``(start, stop)``; a rank's data along one
tensor dim is a tuple of non-empty, non-adjacent runs in local order.

A *shard order* lists, per tensor dim, the mesh dims that split it, outermost
first. :func:`encode` turns it into torch-compatible split factors, :func:`decode`
is torch's planner rule in the other direction (``None`` when nothing fits).

:func:`literal_runs` (torch's literal ``_StridedShard`` split) is computed in closed
form: its cost depends on the number of runs a rank holds, never on the split
factor or the tensor size, and a walk that would give a rank more than
:data:`MAX_RUNS` runs of one tensor dim raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = [
    "MAX_RUNS",
    "Run",
    "Runs",
    "chunk_bounds",
    "decode",
    "encode",
    "literal_runs",
    "merge_runs",
    "take_positions",
]

Run = tuple[int, int]
Runs = tuple[Run, ...]

#: Most runs one rank may hold along one tensor dim under a literal ``_StridedShard``
#: walk (at any step of it); beyond, :func:`literal_runs` raises ``ValueError``.
MAX_RUNS = 1 << 16


def chunk_bounds(n: int, k: int, i: int) -> Run:
    """Piece ``i`` of ``n`` items chunked into ``k`` with the ``torch.chunk`` rule.

    >>> [chunk_bounds(7, 3, i) for i in range(3)]
    [(0, 3), (3, 6), (6, 7)]
    >>> [chunk_bounds(4, 3, i) for i in range(3)]  # c = 2: the last piece is empty
    [(0, 2), (2, 4), (4, 4)]
    """
    c = -(-n // k)
    return min(i * c, n), min((i + 1) * c, n)


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


def take_positions(runs: Sequence[Run], positions: Sequence[Run]) -> list[Run]:
    """The global runs holding ``positions`` (sorted, disjoint) of the concatenation of ``runs``.

    One pass over both lists: O(len(runs) + len(positions)).

    >>> take_positions([(0, 2), (4, 6)], [(1, 3)])
    [(1, 2), (4, 5)]
    """
    out: list[Run] = []
    k, base = 0, 0  # runs[k] holds positions [base, base + its length)
    for a, b in positions:
        while k < len(runs) and a < b:
            s, e = runs[k]
            end = base + e - s
            if a >= end:
                k, base = k + 1, end
                continue
            hi = min(b, end)
            out.append((s + a - base, s + hi - base))
            a = hi
    return out


def literal_runs(n: int, steps: Iterable[tuple[int, int, int]]) -> Runs:
    """``_StridedShard._split_tensor`` applied left to right, by ``(k, i, split_factor)``.

    Each step splits the current extent into ``split_factor`` pieces, chunks each
    into ``k`` and keeps piece ``i`` of each (``split_factor == 1`` is a plain chunk).
    Closed form: the kept parts of the equal pieces are an arithmetic progression.

    >>> literal_runs(8, [(2, 0, 2)])  # [_StridedShard(0, 2)] on 2 ranks: rank 0
    ((0, 2), (4, 6))
    >>> literal_runs(10**12, [(2, 0, 10**12)])  # one-row pieces: rank 0 keeps every row
    ((0, 1000000000000),)
    """
    runs: Runs = ((0, n),) if n > 0 else ()
    for k, i, sf in steps:
        total = sum(e - s for s, e in runs)
        runs = merge_runs(take_positions(runs, _kept_positions(total, k, i, sf)))
    return runs


def _kept_positions(total: int, k: int, i: int, sf: int) -> Runs:
    """Positions one literal step keeps of ``total`` elements, merged (closed form)."""
    if total == 0:
        return ()
    c = -(-total // sf)  # piece length (torch.chunk rule)
    pieces = -(-total // c)  # non-empty pieces
    last = total - (pieces - 1) * c
    full = pieces if last == c else pieces - 1  # pieces of length c
    a, b = chunk_bounds(c, k, i)  # kept part of each full piece
    kept: list[Run] = []
    if full and b > a:
        if b - a == c:  # whole pieces: one run
            kept.append((0, full * c))
        elif full > MAX_RUNS:
            raise ValueError(
                f"a literal _StridedShard split of {total} elements into split_factor={sf} "
                f"pieces, each chunked {k} ways, gives piece {i} {full} runs, more than "
                f"MAX_RUNS = {MAX_RUNS} (meshlayout.sharding._order.MAX_RUNS); use a "
                "decodable placement list (a shard order) instead"
            )
        else:
            kept.extend((j * c + a, j * c + b) for j in range(full))
    if full < pieces:
        la, lb = chunk_bounds(last, k, i)
        kept.append((full * c + la, full * c + lb))
    return merge_runs(kept)


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
