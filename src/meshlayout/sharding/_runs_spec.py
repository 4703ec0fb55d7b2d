"""``RunsSpec``: a sharding spec given by explicit per-rank runs, and views of specs.

Some layouts are no torch placement list: vLLM pads a vocabulary-parallel
embedding of 777 rows on 2 workers to 832 (worker 0 holds rows ``[0, 416)``,
worker 1 rows ``[416, 777)``); a mixture-of-experts worker holds, of a stacked
``gate_up_proj`` ``[E, 2I, H]``, gate rows ``[w*I/2, (w+1)*I/2)`` *and* up rows
``[I + w*I/2, I + (w+1)*I/2)`` (two runs along dim 1, in that local order); one
expert's slice of a trainer tensor has per-rank runs that are not a chunking.

A :class:`RunsSpec` states the truth directly: per rank, per tensor dim, the
global ``(start, stop)`` runs the rank holds, in local order; the rank's local
tensor is the product of its runs, exactly as :meth:`ShardingSpec.local_runs`
describes. It is a :class:`ShardingSpec` (its mesh is the 1-D
``Mesh({"holders": n}, ranks=<listed ranks>)``), so ``pieces``, ``run_boxes``,
``local_slices``, ``reshard_plan``, ``transfer_plan`` and ``WeightTransfer`` take
it. Rules:

- runs lie in ``[0, global_shape[d])``, ``start < stop``, and the runs of one rank
  along one dim are disjoint;
- the pieces of two ranks are identical (replicas: the same runs, in the same
  local order) or share no element; the pieces need not cover the tensor (a
  destination may hold only part; a source must cover what its destinations hold);
- every distinct non-empty piece has the same number of holders;
- ranks holding nothing are not listed, or listed with ``()`` along some dim (a
  listed rank is in the mesh: it takes part, with an empty local tensor).

:func:`view_spec` gives the spec of a view ``tensor[index]`` of any spec's tensor
(a trainer's expert ``e`` of ``[E, F, D]``: ``view_spec(spec, e)``), and per rank
the local index that cuts its view piece out of its local piece.

>>> spec = RunsSpec((777, 64), {0: (((0, 416),), ((0, 64),)), 1: (((416, 777),), ((0, 64),))})
>>> spec.local_shape(1), spec.local_offset(1), spec.mesh
((361, 64), (416, 0), Mesh(holders=2))
>>> moe = RunsSpec.from_runs((2, 8, 3), {w: ((0, 2), (w * 2, w * 2 + 2, 4 + w * 2, 6 + w * 2), (0, 3)) for w in (0, 1)})
>>> moe.local_runs(1)[1], moe.is_box(1)
(((2, 4), (6, 8)), False)
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..inttuple import check_int
from ..mesh import Mesh
from ._order import Runs
from ._placements import Partial, Placement
from ._spec import MeshLike, ShardingSpec, _check_shape, _Local

__all__ = ["RunsSpec", "view_shape", "view_spec"]

# canonical runs: ((rank, runs per dim), ...) by ascending rank
_RankRuns = tuple[tuple[int, tuple[Runs, ...]], ...]
# the most box pairs compared at once by the overlap check (memory bound)
_PAIR_CHUNK = 1 << 20


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclass(frozen=True, init=False, repr=False)
class RunsSpec(ShardingSpec):
    """A tensor of ``global_shape`` held as explicit runs: ``{rank: runs per dim}``.

    ``runs[rank][d]`` is a sequence of global ``(start, stop)`` runs along tensor dim
    ``d``, in local order. Equality and hashing include the runs. See the module
    docstring (and ``docs/sharding.md``) for the rules; ValueError names the rank,
    dim and run that break one, TypeError a value of the wrong type.

    >>> spec = RunsSpec((6,), {3: (((4, 6), (0, 2)),), 5: (((2, 4),),)})
    >>> spec.local_runs(3), spec.local_shape(3), spec.local_runs(4)
    ((((4, 6), (0, 2)),), (4,), ((),))
    >>> spec.shard(np.arange(6) * 10, 3)
    array([40, 50,  0, 10])
    >>> spec
    RunsSpec((6,), {3: (((4, 6), (0, 2)),), 5: (((2, 4),),)})
    """

    _runs: _RankRuns
    _by_rank: dict[int, _Local] = field(compare=False)

    def __init__(
        self, global_shape: Sequence[int], runs: Mapping[int, Sequence[Sequence[Sequence[int]]]]
    ) -> None:
        shape = _check_shape(global_shape)
        canon = _check_runs(shape, runs)
        _check_pieces(shape, canon)
        by_rank = {r: _local_of(shape, rr) for r, rr in canon}
        mesh = Mesh({"holders": len(canon)}, ranks=[r for r, _ in canon])
        object.__setattr__(self, "global_shape", shape)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "_placements", ())
        object.__setattr__(self, "_decodable", False)
        object.__setattr__(self, "_order", ())
        object.__setattr__(self, "_plan", ())
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_runs", canon)
        object.__setattr__(self, "_by_rank", by_rank)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_boxes(
        cls, global_shape: Sequence[int], boxes: Mapping[int, Sequence[Sequence[int]]]
    ) -> RunsSpec:
        """The spec where each rank holds one box: ``{rank: ((start, stop) per dim)}``.

        An empty interval (``start == stop``) along a dim means the rank holds nothing.

        >>> RunsSpec.from_boxes((4, 4), {0: ((0, 2), (0, 4)), 1: ((2, 4), (0, 4))}).local_offset(1)
        (2, 0)
        """
        if not isinstance(boxes, Mapping):
            raise TypeError(f"boxes must be a mapping rank -> box, got {type(boxes).__name__}")
        runs: dict[int, tuple[tuple[tuple[int, int], ...], ...]] = {}
        for rank, given in boxes.items():
            box: object = given
            if isinstance(box, (str, bytes)) or not isinstance(box, Sequence):
                raise TypeError(
                    f"boxes[{rank!r}] must be a sequence of (start, stop) per dim, got {box!r}"
                )
            dims: list[tuple[tuple[int, int], ...]] = []
            for d, iv in enumerate(box):
                pair = _pair(iv, f"boxes[{rank!r}] dim {d}")
                dims.append(() if pair[0] == pair[1] else (pair,))
            runs[rank] = tuple(dims)
        return cls(global_shape, runs)

    @classmethod
    def from_runs(
        cls, global_shape: Sequence[int], flat: Mapping[int, Sequence[Sequence[int]]]
    ) -> RunsSpec:
        """Like the constructor, with each dim's runs flattened: ``(a0, b0, a1, b1, ...)``.

        >>> RunsSpec.from_runs((8,), {0: ((0, 2, 4, 6),), 1: ((2, 4, 6, 8),)}).local_runs(0)
        (((0, 2), (4, 6)),)
        """
        if not isinstance(flat, Mapping):
            raise TypeError(f"flat must be a mapping rank -> runs, got {type(flat).__name__}")
        runs: dict[int, tuple[tuple[tuple[Any, Any], ...], ...]] = {}
        for rank, given in flat.items():
            dims: object = given
            if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
                raise TypeError(f"flat[{rank!r}] must be a sequence per dim, got {dims!r}")
            out = []
            for d, entry in enumerate(dims):
                xs: object = entry
                if isinstance(xs, (str, bytes)) or not isinstance(xs, Sequence) or len(xs) % 2:
                    raise TypeError(
                        f"flat[{rank!r}] dim {d} must be a flat sequence of start, stop "
                        f"pairs (even length), got {xs!r}"
                    )
                out.append(tuple((xs[i], xs[i + 1]) for i in range(0, len(xs), 2)))
            runs[rank] = tuple(out)
        return cls(global_shape, runs)

    @classmethod
    def from_shard_order(
        cls,
        global_shape: Sequence[int],
        mesh: MeshLike,
        order: Mapping[int, Sequence[int | str]],
        partial: Any = None,
    ) -> ShardingSpec:
        """Not for runs: use :meth:`ShardingSpec.from_shard_order` (TypeError)."""
        raise TypeError("RunsSpec is given by runs; use ShardingSpec.from_shard_order")

    @classmethod
    def from_torch(
        cls, global_shape: Sequence[int], mesh: MeshLike, torch_placements: Sequence[Any]
    ) -> ShardingSpec:
        """Not for runs: use :meth:`ShardingSpec.from_torch` (TypeError)."""
        raise TypeError("RunsSpec is given by runs; use ShardingSpec.from_torch")

    # ------------------------------------------------------------------ encodings
    @property
    def runs(self) -> dict[int, tuple[Runs, ...]]:
        """``{rank: runs per dim}`` as given (canonical ints), ascending ranks."""
        return dict(self._runs)

    def shard_order(self) -> dict[int, tuple[int, ...]]:
        """ValueError: a RunsSpec is given by runs, not by a shard order."""
        raise ValueError(
            f"{self!r} is given by explicit runs: it has no shard order (not a chunking)"
        )

    def placements(self) -> tuple[Placement, ...]:
        """``()``: no placement list describes explicit runs (and nothing is Partial)."""
        return ()

    def to_torch(self) -> tuple[Any, ...]:
        """ValueError: no ``torch.distributed.tensor`` placement list expresses explicit runs."""
        raise ValueError(
            f"{self!r} is given by explicit runs: no torch placement list expresses it"
        )

    # ------------------------------------------------------------------ local pieces
    def _local(self, rank: int) -> _Local:
        hit = self._by_rank.get(rank)
        if hit is not None:
            return hit
        n = len(self.global_shape)
        return (((),) * n, (0,) * n, self.global_shape)

    def local_offset(self, rank: int) -> tuple[int, ...]:
        """First global index of ``rank``'s box (``global_shape[d]`` along a dim where it
        holds nothing; every dim for an unlisted rank). ValueError if not a box."""
        runs, _, offset = self._local(rank)
        if offset is None:
            raise ValueError(
                f"rank {rank} holds runs {runs} of global_shape {self.global_shape}: "
                "not a box, no (shape, offset) describes it"
            )
        return offset

    def __repr__(self) -> str:
        body = ", ".join(f"{r}: {rr!r}" for r, rr in self._runs)
        return f"RunsSpec({self.global_shape!r}, {{{body}}})"


# ---------------------------------------------------------------------- validation
def _pair(iv: object, what: str) -> tuple[int, int]:
    if isinstance(iv, (str, bytes)) or not isinstance(iv, Sequence) or len(iv) != 2:
        raise TypeError(f"{what}: a run must be a (start, stop) pair of ints, got {iv!r}")
    a, b = iv
    if not (_is_int(a) and _is_int(b)):
        raise TypeError(f"{what}: a run must be a (start, stop) pair of ints, got {iv!r}")
    return int(a), int(b)


def _check_runs(shape: tuple[int, ...], runs: object) -> _RankRuns:
    if not isinstance(runs, Mapping):
        raise TypeError(f"runs must be a mapping rank -> runs per dim, got {type(runs).__name__}")
    if not runs:
        raise ValueError("runs is empty: a RunsSpec needs at least one rank")
    out: list[tuple[int, tuple[Runs, ...]]] = []
    for rank, dims in runs.items():
        if not _is_int(rank):
            raise TypeError(f"ranks must be ints, got {rank!r}")
        r = int(rank)
        if r < 0:
            raise ValueError(f"rank {r} is negative: ranks are ints >= 0")
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
            raise TypeError(
                f"runs[{r}] must be one tuple of (start, stop) runs per tensor dim, got {dims!r}"
            )
        if len(dims) != len(shape):
            raise ValueError(
                f"runs[{r}] has {len(dims)} dims but global_shape {shape} has {len(shape)}: "
                "give one tuple of runs per tensor dim"
            )
        per_dim: list[Runs] = []
        for d, (rs, n) in enumerate(zip(dims, shape)):
            if isinstance(rs, (str, bytes)) or not isinstance(rs, Sequence):
                raise TypeError(f"runs[{r}] dim {d} must be a tuple of (start, stop), got {rs!r}")
            pairs = tuple(_pair(iv, f"rank {r}, dim {d}") for iv in rs)
            for a, b in pairs:
                if not 0 <= a < b <= n:
                    raise ValueError(
                        f"rank {r}, dim {d}: run {(a, b)} is not valid; runs need "
                        f"0 <= start < stop <= {n} (global_shape[{d}])"
                    )
            ordered = sorted(pairs)
            for (a0, b0), (a1, b1) in itertools.pairwise(ordered):
                if a1 < b0:
                    raise ValueError(
                        f"rank {r}, dim {d}: runs {(a0, b0)} and {(a1, b1)} overlap; "
                        "the runs of one rank along one dim must be disjoint"
                    )
            per_dim.append(pairs)
        out.append((r, tuple(per_dim)))
    out.sort(key=operator.itemgetter(0))
    for (r0, _), (r1, _) in itertools.pairwise(out):
        if r0 == r1:
            raise ValueError(f"rank {r0} is given twice (as equal ints)")
    return tuple(out)


def _check_pieces(shape: tuple[int, ...], canon: _RankRuns) -> None:
    """Distinct non-empty pieces share no element; each has the same number of holders."""
    holders: dict[tuple[Runs, ...], list[int]] = {}
    for r, rr in canon:
        if all(rr):
            holders.setdefault(rr, []).append(r)
    if not holders:
        return
    counts = {len(h) for h in holders.values()}
    if len(counts) > 1:
        few = min(holders.values(), key=len)
        many = max(holders.values(), key=len)
        raise ValueError(
            f"every distinct piece must have the same number of holders: ranks {few} hold "
            f"{_of(holders, few)} ({len(few)} holders) but ranks {many} hold "
            f"{_of(holders, many)} ({len(many)} holders)"
        )
    nd = max(len(shape), 1)
    keys = list(holders)
    lo: list[tuple[int, ...]] = []
    hi: list[tuple[int, ...]] = []
    owner: list[int] = []
    for p, rr in enumerate(keys):
        for combo in itertools.product(*rr):
            lo.append(tuple(a for a, _ in combo) or (0,))
            hi.append(tuple(b for _, b in combo) or (1,))
            owner.append(p)
    los = np.array(lo, dtype=np.int64).reshape(-1, nd)
    his = np.array(hi, dtype=np.int64).reshape(-1, nd)
    # sweep along the dim with the most distinct starts: candidates overlap there
    d = int(np.argmax([len(np.unique(los[:, k])) for k in range(nd)]))
    order = np.argsort(los[:, d], kind="stable")
    los, his, own = los[order], his[order], np.array(owner, dtype=np.int64)[order]
    ends = np.searchsorted(
        los[:, d], his[:, d], "left"
    )  # boxes j in (i, ends[i]) start before i ends
    counts_ = np.maximum(ends - np.arange(len(los)) - 1, 0)
    start = 0
    while start < len(los):
        stop = start + 1
        total = int(counts_[start])
        while stop < len(los) and total + int(counts_[stop]) <= _PAIR_CHUNK:
            total += int(counts_[stop])
            stop += 1
        c = counts_[start:stop]
        i = np.repeat(np.arange(start, stop, dtype=np.int64), c)
        j = i + 1 + (np.arange(len(i), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c))
        hit = (np.maximum(los[i], los[j]) < np.minimum(his[i], his[j])).all(axis=1)
        hit &= own[i] != own[j]
        if hit.any():
            k = int(np.flatnonzero(hit)[0])
            a, b = keys[int(own[i[k]])], keys[int(own[j[k]])]
            box = tuple(
                zip(
                    np.maximum(los[i[k]], los[j[k]]).tolist(),
                    np.minimum(his[i[k]], his[j[k]]).tolist(),
                )
            )[: len(shape)]
            raise ValueError(
                f"ranks {holders[a]} hold runs {a} and ranks {holders[b]} hold runs {b}: "
                f"they share the elements of box {box}; pieces of distinct ranks must be "
                "identical (replicas, the same runs in the same order) or disjoint"
            )
        start = stop


def _of(holders: dict[tuple[Runs, ...], list[int]], ranks: list[int]) -> tuple[Runs, ...]:
    return next(k for k, v in holders.items() if v is ranks)


def _local_of(shape: tuple[int, ...], runs: tuple[Runs, ...]) -> _Local:
    local = tuple(sum(b - a for a, b in rs) for rs in runs)
    offset = None
    if all(len(rs) <= 1 for rs in runs):
        offset = tuple(rs[0][0] if rs else n for rs, n in zip(runs, shape))
    return runs, local, offset


# ---------------------------------------------------------------------- views
def view_spec(spec: ShardingSpec, index: object) -> tuple[RunsSpec, dict[int, tuple[Any, ...]]]:
    """The spec of the view ``tensor[index]`` and, per holder, its local index.

    ``spec``: any :class:`ShardingSpec` without ``Partial`` (a :class:`RunsSpec`
    too); ``index``: a basic index of ``spec.global_shape``: an int (drops that
    dim), a slice with step >= 1, or a tuple of those (fewer entries than dims
    leave the rest whole). Returns ``(view, local_index)``: ``view`` is the
    :class:`RunsSpec` of ``tensor[index]`` (view coordinates; each rank's runs in
    its local order), listing the ranks of ``spec``'s mesh that hold at least one
    element of the view; ``local_index[rank]`` cuts that rank's view piece out of
    its local piece: ``local[local_index[rank]]`` has shape
    ``view.local_shape(rank)`` (numpy and torch alike).

    A local index has one entry per dim of ``spec``: ints (dropped dims) and
    slices when every kept dim's local positions are one arithmetic progression
    (a basic index: a view, no copy); otherwise every kept dim becomes an int64
    numpy array shaped for an outer product (``np.ix_`` style; advanced
    indexing: a copy), the dropped dims staying ints.

    ValueError naming the index for an int outside ``[-n, n)``, a slice step < 1,
    too many entries, or a view holding no element; TypeError for other entries.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard
    >>> spec = ShardingSpec((4, 6, 2), Mesh({"ep": 2, "dp": 2}), [Shard(0), Shard(1)])
    >>> view, ix = view_spec(spec, 1)  # expert 1: held by ranks 0 and 1
    >>> view
    RunsSpec((6, 2), {0: (((0, 3),), ((0, 2),)), 1: (((3, 6),), ((0, 2),))})
    >>> ix[1]
    (1, slice(0, 3, 1), slice(0, 2, 1))
    """
    if not isinstance(spec, ShardingSpec):
        raise TypeError(f"spec must be a ShardingSpec, got {type(spec).__name__}")
    partial = [p for p in spec.placements() if isinstance(p, Partial)]
    if partial:
        raise ValueError(
            f"spec has {partial[0]!r}: a pending reduction has no view; reduce it first"
        )
    shape = spec.global_shape
    entries = _check_index(index, shape)
    key = tuple(e if isinstance(e, int) else (e.start, e.stop, e.step) for e in entries)
    view, local = _view_cached(spec, key)
    if view is None:
        view_shape = tuple(
            len(range(*e.indices(n))) for e, n in zip(entries, shape) if isinstance(e, slice)
        )
        raise ValueError(
            f"index {index!r} of global_shape {shape} selects no element any rank holds "
            f"(view shape {view_shape}); a view spec needs at least one"
        )
    # the cached local indices are shared: hand out fresh arrays (ints, slices are immutable)
    return view, {
        r: tuple(x.copy() if isinstance(x, np.ndarray) else x for x in ix) for r, ix in local
    }


# a stacked model repeats equal specs per layer: (spec, index) -> view; the RunsSpec is
# immutable and shared, so layer L's expert e costs one lookup after layer 0's
@functools.lru_cache(maxsize=4096)
def _view_cached(
    spec: ShardingSpec, key: tuple[int | tuple[int, int, int], ...]
) -> tuple[RunsSpec | None, tuple[tuple[int, tuple[Any, ...]], ...]]:
    """The view of normalised entries (ints, ``(start, stop, step)``); None if empty."""
    entries = tuple(e if isinstance(e, int) else slice(*e) for e in key)
    view_shape = tuple(len(range(e.start, e.stop, e.step)) for e in entries if isinstance(e, slice))
    ranks = sorted(int(r) for r in np.asarray(spec.mesh.submeshes()).reshape(-1).tolist())
    runs: dict[int, tuple[Runs, ...]] = {}
    local: list[tuple[int, tuple[Any, ...]]] = []
    for rank in ranks:
        got = _view_of(spec.local_runs(rank), entries)
        if got is not None:
            runs[rank] = got[0]
            local.append((rank, got[1]))
    if not runs:
        return None, ()
    return RunsSpec(view_shape, runs), tuple(local)


def view_shape(global_shape: Sequence[int], index: object) -> tuple[int, ...]:
    """The shape of ``tensor[index]`` for a basic index of ``global_shape`` (the
    index rules of :func:`view_spec`; ValueError / TypeError likewise).

    >>> view_shape((8, 6, 4), (3, slice(0, 6, 2)))
    (3, 4)
    """
    shape = tuple(int(n) for n in global_shape)
    entries = _check_index(index, shape)
    return tuple(len(range(*e.indices(n))) for e, n in zip(entries, shape) if isinstance(e, slice))


def _check_index(index: object, shape: tuple[int, ...]) -> tuple[int | slice, ...]:
    items = index if isinstance(index, tuple) else (index,)
    if len(items) > len(shape):
        raise ValueError(
            f"index {index!r} has {len(items)} entries for global_shape {shape} ({len(shape)} dims)"
        )
    out: list[int | slice] = []
    for d, (e, n) in enumerate(zip(items, shape)):
        if isinstance(e, slice):
            for part in (e.start, e.stop, e.step):
                if part is not None and not _is_int(part):
                    raise TypeError(f"index {index!r}: slice {e!r} on dim {d} needs int bounds")
            if e.step is not None and e.step < 1:
                raise ValueError(
                    f"index {index!r}: slice {e!r} on dim {d} has step {e.step}; steps >= 1"
                )
            s, t, k = e.indices(n)
            out.append(slice(s, max(s, t), k))
        elif _is_int(e):
            i = check_int(e, "index entry")
            if not -n <= i < n:
                raise ValueError(
                    f"index {index!r}: {i} is out of range for dim {d} of size {n}; "
                    f"valid ints are in [{-n}, {n})"
                )
            out.append(i % n)
        else:
            raise TypeError(
                f"index {index!r}: entry {e!r} on dim {d} must be an int or a slice "
                "(basic indexing; no Ellipsis, None or arrays)"
            )
    out.extend(slice(0, n, 1) for n in shape[len(out) :])
    return tuple(out)


def _view_of(
    runs: tuple[Runs, ...], entries: tuple[int | slice, ...]
) -> tuple[tuple[Runs, ...], tuple[Any, ...]] | None:
    """(view runs, local index) of one rank, or None if it holds nothing of the view.

    A kept dim's local positions are arithmetic segments ``(first, count)`` of the
    slice's step, one per run it meets; O(runs), never O(elements)."""
    view_runs: list[Runs] = []
    positions: list[list[tuple[int, int]] | int] = []
    steps: list[int] = []
    for rs, e in zip(runs, entries):
        pos = 0
        if isinstance(e, int):
            at = None
            for a, b in rs:
                if a <= e < b:
                    at = pos + e - a
                pos += b - a
            if at is None:
                return None
            positions.append(at)
            continue
        s, t, k = e.start, e.stop, e.step
        vr: list[tuple[int, int]] = []
        segs: list[tuple[int, int]] = []
        for a, b in rs:
            lo, hi = max(a, s), min(b, t)
            if lo < hi:
                g0 = s + -(-(lo - s) // k) * k  # first selected index >= lo
                if g0 < hi:
                    c = -(-(hi - g0) // k)
                    v0 = (g0 - s) // k
                    vr.append((v0, v0 + c))
                    segs.append((pos + g0 - a, c))
            pos += b - a
        if not vr:
            return None
        view_runs.append(tuple(vr))
        positions.append(segs)
        steps.append(k)
    slices: list[Any] = []
    arithmetic = True
    kept = iter(steps)
    for p in positions:
        if isinstance(p, int):
            slices.append(p)
            continue
        found = _progression(p, next(kept))
        if found is None:
            arithmetic = False
            slices.append(None)
        else:
            slices.append(found)
    if arithmetic:
        return tuple(view_runs), tuple(slices)
    kept = iter(steps)
    arrays = iter(np.ix_(*[_positions(p, next(kept)) for p in positions if not isinstance(p, int)]))
    return tuple(view_runs), tuple(p if isinstance(p, int) else next(arrays) for p in positions)


def _progression(segs: list[tuple[int, int]], k: int) -> slice | None:
    """The slice of the increasing positions ``first + i * k`` (``i < count``) of every
    segment, concatenated, when they are one arithmetic progression; else None."""
    diffs = {k} if any(c > 1 for _, c in segs) else set()
    for (p0, c0), (p1, _) in itertools.pairwise(segs):
        diffs.add(p1 - (p0 + (c0 - 1) * k))
    if len(diffs) > 1:
        return None
    step = diffs.pop() if diffs else 1
    last_first, last_count = segs[-1]
    return slice(segs[0][0], last_first + (last_count - 1) * k + 1, step)


def _positions(segs: list[tuple[int, int]], k: int) -> Any:
    """Every position of the segments, as an int64 array."""
    return np.concatenate([np.arange(p, p + c * k, k, dtype=np.int64) for p, c in segs])
