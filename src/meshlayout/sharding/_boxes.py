"""Boxes: the rectangular pieces of a tensor a rank holds, and their intersections.

A *box* is one half-open global interval ``(start, stop)`` per tensor dim. A rank's
local tensor is, per tensor dim, the concatenation of its runs in local order
(:meth:`ShardingSpec.local_runs`), so it is made of the cartesian product of those
runs: one :class:`RunBox` per combination, each sitting at ``local_start`` in the
local tensor. Decodable specs give at most one box per rank; undecodable
``StridedShard`` lists may give several.

This module is the one home for box arithmetic used by reshard plans and
checkpoint planners.

>>> from meshlayout import Mesh
>>> from meshlayout.sharding import ShardingSpec, StridedShard
>>> spec = ShardingSpec((8, 3), Mesh((2,)), [StridedShard(0, 2)])  # undecodable
>>> [(rb.box, rb.local_start) for rb in run_boxes(spec, 0)]
[(((0, 2), (0, 3)), (0, 0)), (((4, 6), (0, 3)), (2, 0))]
>>> intersect(((0, 4), (1, 3)), ((2, 8), (0, 2)))
((2, 4), (1, 2))
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._spec import ShardingSpec

__all__ = [
    "Box",
    "RunBox",
    "box_numel",
    "box_slices",
    "intersect",
    "local_slices",
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
    per_dim: list[list[tuple[tuple[int, int], int]]] = []
    for runs in spec.local_runs(rank):
        pos = 0
        placed: list[tuple[tuple[int, int], int]] = []
        for a, b in runs:
            placed.append(((a, b), pos))
            pos += b - a
        if not placed:
            return ()
        per_dim.append(placed)
    return tuple(
        RunBox(tuple(r for r, _ in combo), tuple(p for _, p in combo))
        for combo in itertools.product(*per_dim)
    )


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
