"""Pure planning of exact checkpoints: what a rank writes, what a box reads, what tiles.

No torch here (only :mod:`meshlayout.sharding`), so every rule is unit-testable:

* :func:`written_boxes` — the run boxes a rank writes for one tensor: every box it
  holds, except that among replicas (``Replicate`` mesh dims) exactly one holder
  writes each box, chosen by a deterministic rotation so replicas share the work.
* :class:`ChunkIndex` — the saved chunks of one tensor, indexed for box queries;
  :meth:`ChunkIndex.reads` gives, for destination run boxes, exactly the saved
  pieces to read and checks they cover every destination element once.
* :func:`tiling` — whether chunks tile a tensor exactly, naming holes and overlaps
  (the ``meshlayout checkpoint`` report).

A *chunk* is ``(offsets, sizes)`` in global indices, as DCP's ``ChunkStorageMetadata``.

>>> from meshlayout import Mesh
>>> from meshlayout.sharding import Shard, ShardingSpec, StridedShard
>>> spec = ShardingSpec((7, 3), Mesh((3, 2)), [StridedShard(0, 2), Shard(0)])  # FSDP over TP
>>> [[rb.box for rb in written_boxes(spec, r)] for r in (4, 5)]  # rank (2, 0) holds nothing
[[], [((6, 7), (0, 3))]]
>>> index = ChunkIndex((7, 3), [((0, 0), (4, 3)), ((4, 0), (3, 3))])
>>> [(r.chunk, r.dest_offsets, r.storage_offsets, r.lengths)
...  for r in index.reads(written_boxes(spec, 5))]
[(1, (0, 0), (2, 0), (1, 3))]
>>> tiling((4,), [((0,), (2,)), ((1,), (2,))]).describe()
'overlap: chunks 0 and 1 share ((1, 2),); hole: ((3, 4),)'
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...sharding import Box, Partial, Replicate, RunBox, ShardingSpec, intersect, run_boxes

__all__ = [
    "Chunk",
    "ChunkIndex",
    "Read",
    "Tiling",
    "chunk_box",
    "replica_dims",
    "tiling",
    "written_boxes",
]

Chunk = tuple[tuple[int, ...], tuple[int, ...]]
"""``(offsets, sizes)`` of a saved piece, in global indices."""

#: Largest coordinate-compressed grid :func:`tiling` builds to locate holes.
_GRID_LIMIT = 1 << 22
#: Holes and overlaps named in one report (the counts are always complete).
_NAMED = 16


def chunk_box(chunk: Chunk) -> Box:
    """The box ``((start, stop), ...)`` of a chunk.

    >>> chunk_box(((2, 0), (3, 4)))
    ((2, 5), (0, 4))
    """
    offsets, sizes = chunk
    return tuple((int(o), int(o) + int(s)) for o, s in zip(offsets, sizes))


def _volume(box: Box) -> int:
    return math.prod(b - a for a, b in box)


def replica_dims(spec: ShardingSpec) -> tuple[int, ...]:
    """Mesh dims of size > 1 along which every rank holds the same piece (``Replicate``).

    ValueError for ``Partial``: a pending reduction has no value to checkpoint.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Replicate, Shard, ShardingSpec
    >>> replica_dims(ShardingSpec((8,), Mesh((2, 2, 1)), [Replicate(), Shard(0), Replicate()]))
    (0,)
    """
    placements = spec.placements()
    partial = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    if partial:
        raise ValueError(
            f"placements {list(placements)} have Partial on mesh dims {partial}: a pending "
            "reduction cannot be checkpointed; reduce it first (e.g. redistribute to Replicate)"
        )
    sizes = spec.mesh.shape
    return tuple(m for m, p in enumerate(placements) if isinstance(p, Replicate) and sizes[m] > 1)


def written_boxes(spec: ShardingSpec, rank: int, salt: int = 0) -> tuple[RunBox, ...]:
    """The run boxes ``rank`` writes for a tensor laid out by ``spec``, in local order.

    Every non-empty box the rank holds, once per tensor: along ``Replicate`` mesh dims
    the ``R`` holders of a box are numbered by their coordinates there (row-major), and
    box ``j`` of the piece at sharded coordinate index ``p`` is written by holder
    ``(salt + p + j) % R`` — every holder computes the same answer with no
    communication, and replicas share the writes. A tensor with no elements is
    written once, as one empty chunk of its global shape, by the rank at coordinate 0,
    so the checkpoint still records its shape and dtype. O(boxes of the rank).

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Replicate, Shard, ShardingSpec
    >>> spec = ShardingSpec((4,), Mesh((2, 2)), [Replicate(), Shard(0)])  # HSDP-like
    >>> [[rb.box for rb in written_boxes(spec, r)] for r in range(4)]
    [[((0, 2),)], [], [], [((2, 4),)]]
    """
    if not isinstance(spec, ShardingSpec):
        raise TypeError(f"spec must be a ShardingSpec, got {type(spec).__name__}")
    rep = replica_dims(spec)
    coord = spec.mesh.coordinate(rank)
    if coord is None:
        return ()
    shape = spec.global_shape
    if math.prod(shape) == 0:
        if any(coord):
            return ()
        return (RunBox(tuple((0, n) for n in shape), (0,) * len(shape)),)
    boxes = run_boxes(spec, rank)
    if not rep or not boxes:
        return boxes
    sizes = spec.mesh.shape
    holders, mine, piece = 1, 0, 0
    for m, (c, k) in enumerate(zip(coord, sizes)):
        if m in rep:
            holders, mine = holders * k, mine * k + c
        else:
            piece = piece * k + c
    return tuple(rb for j, rb in enumerate(boxes) if (salt + piece + j) % holders == mine)


@dataclass(frozen=True)
class Read:
    """One read: part of saved chunk ``chunk`` into destination run box ``box``.

    ``dest_offsets`` are relative to the destination box, ``storage_offsets`` to the
    saved chunk; both cover ``lengths`` elements per dim (DCP's ``ReadItem`` fields).
    """

    box: int
    chunk: int
    dest_offsets: tuple[int, ...]
    storage_offsets: tuple[int, ...]
    lengths: tuple[int, ...]


def _check_chunk(shape: tuple[int, ...], i: int, chunk: Any) -> Chunk:
    try:
        offsets, sizes = chunk
        offs = tuple(int(o) for o in offsets)
        szs = tuple(int(s) for s in sizes)
    except (TypeError, ValueError):
        raise TypeError(f"chunk {i} must be (offsets, sizes), got {chunk!r}") from None
    if len(offs) != len(shape) or len(szs) != len(shape):
        raise ValueError(
            f"chunk {i} {(offs, szs)} does not have {len(shape)} dims like the tensor {shape}"
        )
    return offs, szs


def _overlapping_pairs(
    items: Sequence[tuple[int, Box]], dim: int, *, first: bool = False
) -> list[tuple[int, int, Box]]:
    """Pairs of ``(id, box)`` items sharing elements: ``(i, j, common box)``, i < j, sorted.

    A sweep along ``dim`` over the items sorted by start: each box is compared only
    with the earlier boxes still open at its start (for a tiling, its few neighbours).
    ``first=True`` stops at the first pair found.
    """
    if items and not items[0][1]:  # 0-d: every chunk holds the one element
        pairs: list[tuple[int, int, Box]] = [
            (min(i, j), max(i, j), ()) for (i, _), (j, _) in itertools.combinations(items, 2)
        ]
        return sorted(pairs)[:1] if first else sorted(pairs)
    found: list[tuple[int, int, Box]] = []
    active: list[tuple[int, int, int]] = []  # (stop along dim, position, id), sorted
    ordered = sorted(items, key=lambda item: item[1][dim][0])
    for pos, (i, box) in enumerate(ordered):
        start = box[dim][0]
        del active[: bisect.bisect_right(active, (start, len(ordered), 0))]
        for _, p, j in active:
            common = intersect(box, ordered[p][1])
            if common is not None:
                found.append((min(i, j), max(i, j), common))
                if first:
                    return found
        bisect.insort(active, (box[dim][1], pos, i))
    return sorted(found)


@dataclass(frozen=True)
class ChunkIndex:
    """The saved chunks of one tensor of ``shape``, indexed for box queries.

    Queries sweep the dim with the most distinct chunk offsets: the candidates of a
    box are found by bisection, so a load plan costs O(log chunks + overlapping
    chunks) per destination box (building the index: O(chunks log chunks)). Empty
    chunks are kept (indices stay those of the metadata) but never read.

    >>> index = ChunkIndex((6,), [((0,), (3,)), ((3,), (3,))])
    >>> [(r.chunk, r.storage_offsets, r.lengths) for r in index.reads([RunBox(((2, 5),), (0,))])]
    [(0, (2,), (1,)), (1, (0,), (2,))]
    """

    shape: tuple[int, ...]
    _offsets: Any = field(repr=False, compare=False)
    _sizes: Any = field(repr=False, compare=False)
    _dim: int = field(repr=False, compare=False)
    _order: Any = field(repr=False, compare=False)
    _starts: Any = field(repr=False, compare=False)
    _reach: int = field(repr=False, compare=False)

    def __init__(self, shape: Sequence[int], chunks: Sequence[Any]) -> None:
        shp = tuple(int(n) for n in shape)
        if any(n < 0 for n in shp):
            raise ValueError(f"tensor shape {shp} has negative sizes")
        nd, n = len(shp), len(chunks)
        try:  # vectorised: metadata may list thousands of chunks per tensor
            offs = np.array([c[0] for c in chunks], dtype=np.int64).reshape(n, nd)
            sizes = np.array([c[1] for c in chunks], dtype=np.int64).reshape(n, nd)
            if any(len(c) != 2 for c in chunks):
                raise ValueError("not (offsets, sizes)")
        except (TypeError, ValueError, IndexError, KeyError, OverflowError):
            for i, c in enumerate(chunks):  # find and name the bad chunk
                _check_chunk(shp, i, c)
            raise
        bad = np.flatnonzero(
            ((sizes < 0) | (offs < 0) | (offs + sizes > np.array(shp, dtype=np.int64))).any(axis=1)
        )
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"chunk {i} (offsets {tuple(offs[i].tolist())}, sizes "
                f"{tuple(sizes[i].tolist())}) lies outside the tensor of shape {shp}"
            )
        live = np.flatnonzero((sizes > 0).all(axis=1))
        dim = 0
        if nd > 1 and live.size:
            dim = int(np.argmax([np.unique(offs[live, d]).size for d in range(nd)]))
        if nd:
            order = live[np.argsort(offs[live, dim], kind="stable")]
            starts = offs[order, dim]
            reach = int(sizes[live, dim].max()) if live.size else 0
        else:
            order, starts, reach = live, live, 1
        object.__setattr__(self, "shape", shp)
        object.__setattr__(self, "_offsets", offs)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_dim", dim)
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_reach", reach)

    @functools.cached_property
    def chunks(self) -> tuple[Chunk, ...]:
        """Every saved chunk as ``(offsets, sizes)``, in metadata order."""
        return tuple(
            (tuple(o), tuple(z)) for o, z in zip(self._offsets.tolist(), self._sizes.tolist())
        )

    def box(self, i: int) -> Box:
        """The global box of saved chunk ``i``."""
        offs = self._offsets[i].tolist()
        return tuple((a, a + z) for a, z in zip(offs, self._sizes[i].tolist()))

    def _live(self) -> list[int]:
        """Non-empty chunks, sorted by start along the sweep dim."""
        return [int(i) for i in self._order.tolist()]

    def _candidates(self, box: Box) -> list[int]:
        """Live chunks that may share elements with ``box`` (a superset, in sweep order)."""
        if not self.shape:
            return self._live()
        lo, hi = box[self._dim]
        first = int(np.searchsorted(self._starts, lo - self._reach, side="right"))
        last = int(np.searchsorted(self._starts, hi, side="left"))
        return [int(i) for i in self._order[first:last].tolist()]

    def overlapping(self, box: Box) -> list[tuple[int, Box]]:
        """``(chunk index, common box)`` for every saved chunk sharing elements with ``box``."""
        out = []
        for i in self._candidates(box):
            common = intersect(self.box(i), box)
            if common is not None:
                out.append((i, common))
        return out

    @functools.cached_property
    def overlaps(self) -> list[tuple[int, int, Box]]:
        """Every pair of saved chunks sharing elements: ``(i, j, common box)``, i < j."""
        return _overlapping_pairs([(i, self.box(i)) for i in self._live()], self._dim)

    def reads(self, boxes: Sequence[RunBox], what: str = "tensor") -> list[Read]:
        """The reads that fill destination ``boxes`` exactly from the saved chunks.

        ValueError, naming ``what``, if saved chunks overlap inside a destination box
        (the value to load is ambiguous) or leave some of its elements uncovered (the
        checkpoint does not hold them): loading never keeps stale values silently.
        Exactness is checked per box: the pieces' volumes sum to the box's, and (when
        there are several) no two pieces share an element.
        """
        out: list[Read] = []
        for b, rb in enumerate(boxes):
            box = rb.box
            if len(box) != len(self.shape):
                raise ValueError(
                    f"{what}: destination box {box} does not have {len(self.shape)} dims"
                )
            volume = _volume(box)
            if volume == 0:
                continue
            found = self.overlapping(box)
            covered = 0
            for i, common in found:
                covered += _volume(common)
                saved = self._offsets[i].tolist()
                out.append(
                    Read(
                        b,
                        i,
                        tuple(a - d for (a, _), (d, _) in zip(common, box)),
                        tuple(a - s for (a, _), s in zip(common, saved)),
                        tuple(e - a for a, e in common),
                    )
                )
            if len(found) > 1 or covered != volume:
                clash = _overlapping_pairs(found, self._dim, first=True)
                if clash:
                    i, j, c = clash[0]
                    raise ValueError(
                        f"{what}: saved chunks {i} {self.chunks[i]} and {j} {self.chunks[j]} "
                        f"overlap on {c} inside the destination box {box}; the checkpoint "
                        "is ambiguous there"
                    )
            if covered != volume:
                raise ValueError(
                    f"{what}: the checkpoint's chunks cover {covered} of the "
                    f"{volume} elements of the destination box {box}; "
                    f"{volume - covered} elements were never saved"
                )
        return out


@dataclass(frozen=True)
class Tiling:
    """How saved chunks cover a tensor: :attr:`exact` when every element is in one chunk.

    ``holes``: boxes no chunk covers (at most 16 named; ``missing`` counts every
    uncovered element, or is None when the holes could not be located because
    overlaps hide them in a too-large grid). ``overlaps``: ``(i, j, common box)``
    for chunk pairs sharing elements (at most 16 named; ``overlap_pairs`` counts all).
    """

    shape: tuple[int, ...]
    chunks: int
    holes: tuple[Box, ...]
    missing: int | None
    overlaps: tuple[tuple[int, int, Box], ...]
    overlap_pairs: int

    @property
    def exact(self) -> bool:
        return self.missing == 0 and self.overlap_pairs == 0

    def describe(self) -> str:
        """One line: ``exact``, or the overlaps and holes.

        >>> tiling((4,), [((0,), (4,))]).describe()
        'exact'
        """
        if self.exact:
            return "exact"
        parts = [f"overlap: chunks {i} and {j} share {c}" for i, j, c in self.overlaps]
        if self.overlap_pairs > len(self.overlaps):
            parts.append(f"... {self.overlap_pairs} overlapping pairs in all")
        if self.missing is None:
            parts.append("holes: not located (too many chunks)")
        elif self.missing:
            parts.extend(f"hole: {h}" for h in self.holes)
            if self.missing > sum(_volume(h) for h in self.holes):
                parts.append(f"... {self.missing} uncovered elements in all")
        return "; ".join(parts)


def tiling(shape: Sequence[int], chunks: Sequence[Any]) -> Tiling:
    """Do ``chunks`` tile a tensor of ``shape`` exactly? Names holes and overlaps.

    Overlaps come from a sweep over the chunks; holes from a coordinate-compressed
    grid of the chunk boundaries (up to 2^22 cells), or from the element count when
    nothing overlaps.

    >>> tiling((2, 4), [((0, 0), (2, 2)), ((0, 2), (1, 2))]).describe()
    'hole: ((1, 2), (2, 4))'
    """
    index = ChunkIndex(shape, chunks)
    shp = index.shape
    boxes = [index.box(i) for i in index._live()]
    pairs = index.overlaps
    total = math.prod(shp)
    holes: list[Box] = []
    missing: int | None
    if not shp:
        missing = 0 if boxes else 1
        holes = [] if boxes else [()]
    else:
        cuts = [
            sorted({0, n, *(b[d][0] for b in boxes), *(b[d][1] for b in boxes)})
            for d, n in enumerate(shp)
        ]
        cells = math.prod(len(c) - 1 for c in cuts)
        if cells <= _GRID_LIMIT:
            count = np.zeros([len(c) - 1 for c in cuts], dtype=np.int32)
            for b in boxes:
                sl = tuple(
                    slice(bisect.bisect_left(c, a), bisect.bisect_left(c, e))
                    for c, (a, e) in zip(cuts, b)
                )
                count[sl] += 1
            volume = np.ones((), dtype=np.int64)
            for c in cuts:
                volume = np.multiply.outer(volume, np.diff(np.array(c, dtype=np.int64)))
            missing = int(volume[count == 0].sum())
            holes = _merge_cells(np.argwhere(count == 0), cuts)[:_NAMED]
        elif not pairs:
            missing = total - sum(_volume(b) for b in boxes)
        else:
            missing = None
    return Tiling(
        shp, len(index._offsets), tuple(holes), missing, tuple(pairs[:_NAMED]), len(pairs)
    )


def _merge_cells(cells: Any, cuts: list[list[int]]) -> list[Box]:
    """Empty grid cells as boxes, runs of neighbours along the last dim merged."""
    out: list[Box] = []
    prev: tuple[int, ...] | None = None
    for cell in (tuple(int(k) for k in c) for c in cells):
        box = tuple((cuts[d][k], cuts[d][k + 1]) for d, k in enumerate(cell))
        if out and prev is not None and prev[:-1] == cell[:-1] and prev[-1] + 1 == cell[-1]:
            last = out[-1]
            out[-1] = (*last[:-1], (last[-1][0], box[-1][1]))
        else:
            out.append(box)
        prev = cell
    return out
