"""Boxes: the rectangular pieces of a tensor a rank holds, and their intersections.

A *box* is one half-open global interval ``(start, stop)`` per tensor dim. A rank's
local tensor is, per tensor dim, the concatenation of its runs in local order
(:meth:`ShardingSpec.local_runs`), so it is made of the cartesian product of those
runs: one :class:`RunBox` per combination, each sitting at ``local_start`` in the
local tensor. Decodable specs give at most one box per rank; undecodable
``StridedShard`` lists may give several.

This module is the one home for box arithmetic used by reshard plans and
checkpoint planners. :func:`pieces` groups the ranks holding identical data
(replicas) without asking every rank for its runs.

>>> from meshlayout import Mesh
>>> from meshlayout.sharding import ShardingSpec, StridedShard
>>> spec = ShardingSpec((8, 3), Mesh((2,)), [StridedShard(0, 2)])  # undecodable
>>> [(rb.box, rb.local_start) for rb in run_boxes(spec, 0)]
[(((0, 2), (0, 3)), (0, 0)), (((4, 6), (0, 3)), (2, 0))]
>>> intersect(((0, 4), (1, 3)), ((2, 8), (0, 2)))
((2, 4), (1, 2))
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._order import Runs
from ._placements import Shard, StridedShard
from ._runs_spec import RunsSpec
from ._spec import ShardingSpec

__all__ = [
    "Box",
    "Piece",
    "PieceTable",
    "RunBox",
    "box_numel",
    "box_slices",
    "intersect",
    "local_slices",
    "piece_table",
    "pieces",
    "run_boxes",
]

Box = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RunBox:
    """One box a rank holds: its global ``box`` and where it starts in the local tensor.

    ``local_start[d]`` is the position of ``box[d][0]`` along dim ``d`` of the rank's
    local piece (the summed lengths of the runs before it in local order).

    >>> rb = RunBox(((4, 6), (0, 3)), (2, 0))
    >>> rb.local_slices(((5, 6), (1, 3)))  # a sub-box, as slices of the local tensor
    (slice(3, 4, None), slice(1, 3, None))
    """

    box: Box
    local_start: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.box) != len(self.local_start):
            raise ValueError(
                f"box {self.box} has {len(self.box)} dims but local_start "
                f"{self.local_start} has {len(self.local_start)}"
            )

    @property
    def numel(self) -> int:
        """Number of elements in the box."""
        return box_numel(self.box)

    def contains(self, sub: Box) -> bool:
        """True if ``sub`` lies inside this box (an empty sub-box is inside any box)."""
        if len(sub) != len(self.box):
            return False
        if box_numel(sub) == 0:
            return True
        return all(a <= s and t <= b for (a, b), (s, t) in zip(self.box, sub))

    def local_slices(self, sub: Box | None = None) -> tuple[slice, ...]:
        """Slices of the rank's local tensor holding ``sub`` (default: the whole box).

        ValueError if ``sub`` is not inside this box.
        """
        if sub is None:
            sub = self.box
        if not self.contains(sub):
            raise ValueError(f"box {sub} is not inside the run box {self.box}")
        return tuple(
            slice(ls + s - a, ls + t - a)
            for (a, _), (s, t), ls in zip(self.box, sub, self.local_start)
        )


def _check_box(box: Box, what: str) -> None:
    if not isinstance(box, tuple) or not all(isinstance(iv, tuple) and len(iv) == 2 for iv in box):
        raise TypeError(f"{what} must be a tuple of (start, stop) pairs, got {box!r}")


def box_numel(box: Box) -> int:
    """Number of elements of ``box`` (1 for the 0-d box ``()``; 0 if any dim is empty).

    >>> box_numel(((0, 2), (3, 7))), box_numel(((2, 2), (0, 5))), box_numel(())
    (8, 0, 1)
    """
    _check_box(box, "box")
    return math.prod(max(0, b - a) for a, b in box)


def intersect(a: Box, b: Box) -> Box | None:
    """The common part of two boxes of the same ndim, or None if they share no element.

    >>> intersect(((0, 4),), ((4, 8),)) is None
    True
    >>> intersect((), ())  # 0-d tensors: the single element is shared
    ()
    """
    _check_box(a, "a")
    _check_box(b, "b")
    if len(a) != len(b):
        raise ValueError(f"boxes {a} and {b} have different ndim ({len(a)} vs {len(b)})")
    out: list[tuple[int, int]] = []
    for (s0, e0), (s1, e1) in zip(a, b):
        lo = s0 if s0 > s1 else s1
        hi = e0 if e0 < e1 else e1
        if hi <= lo:
            return None
        out.append((lo, hi))
    return tuple(out)


def box_slices(box: Box, origin: Sequence[int] | None = None) -> tuple[slice, ...]:
    """``box`` as slices, relative to ``origin`` (default: global indices).

    >>> box_slices(((2, 4), (0, 3)))
    (slice(2, 4, None), slice(0, 3, None))
    >>> box_slices(((2, 4), (1, 3)), origin=(2, 1))
    (slice(0, 2, None), slice(0, 2, None))
    """
    _check_box(box, "box")
    if origin is None:
        origin = (0,) * len(box)
    if len(origin) != len(box):
        raise ValueError(f"origin {tuple(origin)} has {len(origin)} dims, box {box} has {len(box)}")
    return tuple(slice(a - o, b - o) for (a, b), o in zip(box, origin))


def run_boxes(spec: ShardingSpec, rank: int) -> tuple[RunBox, ...]:
    """Every box ``rank`` holds under ``spec``, in local (row-major) order.

    The cartesian product of the rank's runs per tensor dim; empty when the rank
    holds nothing or is outside the mesh. O(number of boxes) after ``local_runs``.
    Boxes of one rank are disjoint; together they are exactly the rank's elements.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard, ShardingSpec
    >>> spec = ShardingSpec((4, 6), Mesh((2,)), [Shard(1)])
    >>> run_boxes(spec, 1)
    (RunBox(box=((0, 4), (3, 6)), local_start=(0, 0)),)
    >>> run_boxes(spec, 7)  # not in the mesh
    ()
    """
    if not isinstance(spec, ShardingSpec):
        raise TypeError(f"spec must be a ShardingSpec, got {type(spec).__name__}")
    if rank not in spec.mesh:
        return ()
    return _product_boxes(spec.local_runs(rank))


def local_slices(spec: ShardingSpec, rank: int, box: Box) -> tuple[slice, ...]:
    """Slices of ``rank``'s local tensor holding the global ``box``.

    ``box`` must lie inside one of the rank's run boxes (every box of a reshard plan
    does); ValueError otherwise. O(runs of the rank).

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import ShardingSpec, StridedShard
    >>> spec = ShardingSpec((8,), Mesh((2,)), [StridedShard(0, 2)])  # rank 0: rows 0-1, 4-5
    >>> local_slices(spec, 0, ((4, 6),))
    (slice(2, 4, None),)
    """
    _check_box(box, "box")
    if len(box) != len(spec.global_shape):
        raise ValueError(
            f"box {box} has {len(box)} dims, global_shape {spec.global_shape} has "
            f"{len(spec.global_shape)}"
        )
    if rank not in spec.mesh:
        raise ValueError(f"rank {rank} is not in the mesh {spec.mesh!r}: it holds nothing")
    out: list[slice] = []
    for d, ((s, t), runs) in enumerate(zip(box, spec.local_runs(rank))):
        pos = 0
        for a, b in runs:
            if a <= s and t <= b and s < t:
                out.append(slice(pos + s - a, pos + t - a))
                break
            pos += b - a
        else:
            raise ValueError(
                f"rank {rank} does not hold box {box} as one piece: along dim {d}, "
                f"{(s, t)} lies in none of its runs {runs}"
            )
    return tuple(out)


@dataclass(frozen=True)
class Piece:
    """One distinct piece of the tensor under a spec, and every rank holding it.

    ``runs`` are per tensor dim, in local order (as :meth:`ShardingSpec.local_runs`);
    ``ranks`` are the global ranks holding exactly these elements, ascending
    (replicas along ``Replicate`` mesh dims and across the sub-meshes of a family;
    along ``Partial`` mesh dims they hold partial values of the same elements).
    """

    runs: tuple[Runs, ...]
    ranks: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements of the piece."""
        return math.prod(sum(b - a for a, b in r) for r in self.runs)

    def run_boxes(self) -> tuple[RunBox, ...]:
        """The piece's boxes in local order, as :func:`run_boxes` gives them for each holder."""
        return _product_boxes(self.runs)


def pieces(spec: ShardingSpec) -> tuple[Piece, ...]:
    """Every non-empty piece of the tensor under ``spec`` with its holders, sorted by runs.

    Distinct pieces are disjoint and together cover the tensor; ranks holding nothing
    appear in none. Cost: O(world size) numpy work plus O(pieces × ndim) Python work
    (decodable specs are chunked vectorised; undecodable ones ask one representative
    rank per piece); cached per spec.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Replicate, Shard, ShardingSpec
    >>> spec = ShardingSpec((5, 2), Mesh({"dp": 2, "tp": 3}), [Replicate(), Shard(0)])
    >>> for p in pieces(spec):
    ...     print(p.runs, p.ranks)
    (((0, 2),), ((0, 2),)) (0, 3)
    (((2, 4),), ((0, 2),)) (1, 4)
    (((4, 5),), ((0, 2),)) (2, 5)
    """
    if not isinstance(spec, ShardingSpec):
        raise TypeError(f"spec must be a ShardingSpec, got {type(spec).__name__}")
    table = piece_table(spec)
    return tuple(Piece(runs, tuple(h)) for runs, h in zip(table.runs(), table.holders.tolist()))


class PieceTable:
    """Columnar form of :func:`pieces`, for planners (internal; arrays are read-only).

    ``holders``: int64 ``[pieces, holders per piece]``, rows ascending, pieces sorted
    by runs (every piece of a spec has the same number of holders).
    ``lo``, ``hi``: int64 ``[boxes, max(ndim, 1)]``: every run box of every piece,
    grouped by piece in piece order, local order within a piece; a 0-d tensor is
    treated as shape ``(1,)``. ``box_piece``: int64 ``[boxes]``, the piece of each box.
    """

    def __init__(
        self,
        ndim: int,
        holders: Any,
        lo: Any,
        hi: Any,
        box_piece: Any,
        runs: tuple[tuple[Runs, ...], ...] | None,
    ) -> None:
        for a in (holders, lo, hi, box_piece):
            a.setflags(write=False)
        self.ndim = ndim
        self.holders = holders
        self.lo = lo
        self.hi = hi
        self.box_piece = box_piece
        self._runs = runs

    def runs(self) -> tuple[tuple[Runs, ...], ...]:
        """Per piece, its runs per tensor dim (built on first use for decodable specs)."""
        if self._runs is None:
            if self.ndim == 0:
                self._runs = ((),) * len(self.holders)
            else:
                self._runs = tuple(
                    tuple(((a, b),) for a, b in zip(lo, hi))
                    for lo, hi in zip(self.lo.tolist(), self.hi.tolist())
                )
        return self._runs


@functools.lru_cache(maxsize=256)
def piece_table(spec: ShardingSpec) -> PieceTable:
    """The :class:`PieceTable` of ``spec``: O(world size) numpy work, cached per spec."""
    if isinstance(spec, RunsSpec):
        return _runs_table(spec)
    sizes = tuple(int(s) for s in spec.mesh.shape)
    split = [m for m, p in enumerate(spec.placements()) if isinstance(p, (Shard, StridedShard))]
    grid = tuple(sizes[m] for m in split)
    subs = np.asarray(spec.mesh.submeshes(), dtype=np.int64).reshape((-1, *sizes))
    # rows: one combination of the splitting mesh dims' coordinates; columns: its holders
    holders: Any = np.moveaxis(subs, [1 + m for m in split], list(range(len(split))))
    holders = np.sort(holders.reshape(math.prod(grid), -1), axis=1)
    ndim = len(spec.global_shape)
    if spec.decodable:
        flat, lo, hi = _nested_boxes(spec, sizes, split, grid)
        order = np.lexsort(lo.T[::-1]) if len(lo) else np.zeros(0, dtype=np.int64)
        return PieceTable(
            ndim,
            holders[flat[order]],
            lo[order],
            hi[order],
            np.arange(len(order), dtype=np.int64),
            None,
        )
    found = []
    for i in range(math.prod(grid)):
        runs = spec.local_runs(int(holders[i, 0]))
        if all(runs):
            found.append((runs, i))
    found.sort()
    return _table_of(
        ndim,
        holders[[i for _, i in found]].reshape(len(found), holders.shape[1]),
        tuple(runs for runs, _ in found),
    )


def _table_of(ndim: int, holders: Any, runs: tuple[tuple[Runs, ...], ...]) -> PieceTable:
    """The table of pieces given by their runs (sorted) and holders (one row each)."""
    los: list[tuple[int, ...]] = []
    his: list[tuple[int, ...]] = []
    box_piece: list[int] = []
    for p, piece_runs in enumerate(runs):
        for rb in _product_boxes(piece_runs):
            los.append(tuple(a for a, _ in rb.box) or (0,))
            his.append(tuple(b for _, b in rb.box) or (1,))
            box_piece.append(p)
    width = max(ndim, 1)
    return PieceTable(
        ndim,
        holders,
        np.array(los, dtype=np.int64).reshape(-1, width),
        np.array(his, dtype=np.int64).reshape(-1, width),
        np.array(box_piece, dtype=np.int64),
        runs,
    )


def _runs_table(spec: RunsSpec) -> PieceTable:
    """The table of explicit runs: its distinct non-empty pieces, sorted by runs."""
    found: dict[tuple[Runs, ...], list[int]] = {}
    for rank, runs in spec.runs.items():  # ascending ranks
        if all(runs):
            found.setdefault(runs, []).append(rank)
    keys = tuple(sorted(found))
    per = len(found[keys[0]]) if keys else 1
    holders = np.array([found[k] for k in keys], dtype=np.int64).reshape(len(keys), per)
    return _table_of(len(spec.global_shape), holders, keys)


def _nested_boxes(
    spec: ShardingSpec, sizes: tuple[int, ...], split: list[int], grid: tuple[int, ...]
) -> tuple[Any, Any, Any]:
    """Nested ``torch.chunk``-rule chunking of every dim over the whole coordinate grid.

    Returns the flat grid index of every non-empty piece and its box bounds
    ``[pieces, max(ndim, 1)]`` (a 0-d tensor as ``[(0, 1)]``).
    """
    order = spec.shard_order()
    count = math.prod(grid)
    starts: list[Any] = []
    stops: list[Any] = []
    mask = np.ones(count, dtype=bool)
    for d, n in enumerate(spec.global_shape):
        start = np.zeros(grid, dtype=np.int64)
        length = np.full(grid, n, dtype=np.int64)
        for m in order.get(d, ()):
            k = sizes[m]
            shape = [1] * len(grid)
            shape[split.index(m)] = k
            i = np.arange(k, dtype=np.int64).reshape(shape)
            c = -(-length // k)
            lo = np.minimum(i * c, length)
            hi = np.minimum(i * c + c, length)
            start = start + lo
            length = hi - lo
        start = np.broadcast_to(start, grid).reshape(-1)
        length = np.broadcast_to(length, grid).reshape(-1)
        mask &= length > 0
        starts.append(start)
        stops.append(start + length)
    if not starts:
        starts, stops = [np.zeros(count, dtype=np.int64)], [np.ones(count, dtype=np.int64)]
    flat = np.flatnonzero(mask)
    lo = np.stack([s[flat] for s in starts], axis=1)
    hi = np.stack([s[flat] for s in stops], axis=1)
    return flat, lo, hi


def _product_boxes(runs: tuple[Runs, ...]) -> tuple[RunBox, ...]:
    per_dim: list[list[tuple[tuple[int, int], int]]] = []
    for rs in runs:
        pos = 0
        placed: list[tuple[tuple[int, int], int]] = []
        for a, b in rs:
            placed.append(((a, b), pos))
            pos += b - a
        if not placed:
            return ()
        per_dim.append(placed)
    return tuple(
        RunBox(tuple(r for r, _ in combo), tuple(p for _, p in combo))
        for combo in itertools.product(*per_dim)
    )
