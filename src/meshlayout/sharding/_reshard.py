"""Reshard plan: which boxes move from which rank to which, between two sharding specs.

Source and destination are two :class:`ShardingSpec` of the same global shape whose
meshes may differ in shape, names and rank map; their rank sets may be equal,
overlap or be disjoint. The plan lists :class:`Transfer` boxes in global indices:

- every destination element is delivered exactly once;
- an element the destination rank already holds in the source is a *local copy*
  (a transfer with ``src_rank == dst_rank``): listed, never sent, not counted in
  :attr:`ReshardPlan.elements_moved` (the minimum possible);
- among several holders (replicas) the sender is chosen deterministically: the
  destination rank itself, then the least-loaded holder on the destination's host
  (``ranks_per_host``), then the least-loaded holder (elements sent so far; ties
  go to the lower rank).

Each transfer box lies inside one run box of its sender and one of its receiver
(:func:`local_slices` finds it in either local tensor). Pure: no torch.

>>> from meshlayout import Mesh
>>> from meshlayout.sharding import Shard, ShardingSpec
>>> src = ShardingSpec((4, 4), Mesh({"dp": 4}), [Shard(0)])                # FSDP rows
>>> dst = ShardingSpec((4, 4), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])  # TP columns
>>> plan = reshard_plan(src, dst)
>>> plan.receives(2)
(Transfer(src_rank=0, dst_rank=2, box=((0, 1), (0, 2))), Transfer(src_rank=1, dst_rank=2, box=((1, 2), (0, 2))), Transfer(src_rank=3, dst_rank=2, box=((3, 4), (0, 2))))
>>> plan.local_copies(2)
(Transfer(src_rank=2, dst_rank=2, box=((2, 3), (0, 2))),)
>>> plan.elements_moved
12
"""

from __future__ import annotations

import functools
import gc
import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._boxes import Box, PieceTable, box_numel, piece_table
from ._order import Runs
from ._placements import Partial
from ._runs_spec import RunsSpec
from ._spec import ShardingSpec

__all__ = ["ReshardPlan", "Transfer", "reshard_plan"]

_I64 = np.int64


@dataclass(frozen=True, slots=True)
class Transfer:
    """``box`` (global ``(start, stop)`` per tensor dim) goes from ``src_rank`` to ``dst_rank``.

    ``src_rank == dst_rank`` is a local copy: the destination rank already holds the
    box in its source piece; nothing is sent.
    """

    src_rank: int
    dst_rank: int
    box: Box

    @property
    def numel(self) -> int:
        """Number of elements in the box."""
        return box_numel(self.box)

    @property
    def is_local(self) -> bool:
        """True for a local copy (sender and receiver are the same rank)."""
        return self.src_rank == self.dst_rank


@dataclass(frozen=True, eq=False)
class ReshardPlan:
    """The transfers that turn ``src_spec``'s pieces into ``dst_spec``'s (``docs/reshard.md``).

    Build it with :func:`reshard_plan`. Transfers are ordered by destination rank,
    then by position in the destination's local piece; local copies are included
    (``src_rank == dst_rank``). The plan is stored as columns (see :meth:`arrays`);
    :class:`Transfer` objects are made on demand, so a rank asking only for its own
    :meth:`sends` and :meth:`receives` never pays for the whole world's list.
    Two plans are equal when built from equal specs and ``ranks_per_host``.
    """

    src_spec: ShardingSpec
    dst_spec: ShardingSpec
    ranks_per_host: int | None
    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]
    _cols: dict[str, Any] = field(repr=False)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReshardPlan):
            return NotImplemented
        return (self.src_spec, self.dst_spec, self.ranks_per_host) == (
            other.src_spec,
            other.dst_spec,
            other.ranks_per_host,
        )

    def __hash__(self) -> int:
        return hash((self.src_spec, self.dst_spec, self.ranks_per_host))

    def __repr__(self) -> str:
        return (
            f"ReshardPlan({len(self)} transfers, {self.elements_moved} elements moved, "
            f"src_spec={self.src_spec!r}, dst_spec={self.dst_spec!r}, "
            f"ranks_per_host={self.ranks_per_host})"
        )

    def __len__(self) -> int:
        """Number of transfers, local copies included."""
        return len(self._cols["src"])

    # ------------------------------------------------------------------ columns
    def arrays(self) -> dict[str, Any]:
        """The plan as read-only int64 columns, one row per transfer (plan order).

        ``src``, ``dst`` (ranks), ``start``, ``stop`` (``[transfers, ndim]`` box bounds)
        and ``numel``. For executors that build split sizes without Python objects.
        """
        return dict(self._cols)

    def _transfers(self, rows: Any) -> tuple[Transfer, ...]:
        c = self._cols
        ndim = c["start"].shape[1]
        src = c["src"][rows].tolist()
        dst = c["dst"][rows].tolist()
        lo = c["start"][rows].tolist()
        hi = c["stop"][rows].tolist()
        # many small immutable objects: the cyclic GC would rescan them repeatedly
        enabled = gc.isenabled()
        gc.disable()
        try:
            if ndim == 0:
                return tuple(Transfer(s, d, ()) for s, d in zip(src, dst))
            return tuple(Transfer(s, d, tuple(zip(a, b))) for s, d, a, b in zip(src, dst, lo, hi))
        finally:
            if enabled:
                gc.enable()

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """Every transfer, local copies included, in plan order (built on first use)."""
        hit = self._memo.get("transfers")
        if hit is None:
            hit = self._memo["transfers"] = self._transfers(slice(None))
        return hit

    @property
    def ranks(self) -> tuple[int, ...]:
        """The union of both rank sets, ascending (the ranks that take part)."""
        hit = self._memo.get("ranks")
        if hit is None:
            hit = self._memo["ranks"] = tuple(sorted(set(self.src_ranks) | set(self.dst_ranks)))
        return hit

    def _rows_of(self, kind: str, rank: object) -> tuple[Transfer, ...]:
        r = _rank(rank)
        index = self._memo.get(kind)
        if index is None:
            c = self._cols
            local = c["src"] == c["dst"]
            if kind == "local":
                rows = np.flatnonzero(local)
                keys = c["dst"][rows]
            else:
                rows = np.flatnonzero(~local)
                keys = c["src" if kind == "send" else "dst"][rows]
            order = np.argsort(keys, kind="stable")
            index = self._memo[kind] = (keys[order], rows[order])
        keys, rows = index
        lo, hi = np.searchsorted(keys, r, "left"), np.searchsorted(keys, r, "right")
        return self._transfers(rows[lo:hi])

    def sends(self, rank: int) -> tuple[Transfer, ...]:
        """Transfers ``rank`` sends to other ranks (local copies excluded), in plan order."""
        return self._rows_of("send", rank)

    def receives(self, rank: int) -> tuple[Transfer, ...]:
        """Transfers ``rank`` receives from other ranks (local copies excluded), in plan order."""
        return self._rows_of("recv", rank)

    def local_copies(self, rank: int | None = None) -> tuple[Transfer, ...]:
        """Local copies of ``rank`` (every rank's when None): boxes it already holds."""
        if rank is None:
            c = self._cols
            return self._transfers(np.flatnonzero(c["src"] == c["dst"]))
        return self._rows_of("local", rank)

    # ------------------------------------------------------------------ totals
    @property
    def elements_moved(self) -> int:
        """Elements sent from one rank to another (local copies excluded): the minimum."""
        c = self._cols
        return int(c["numel"][c["src"] != c["dst"]].sum())

    def matrix(self, *, include_local: bool = False) -> tuple[tuple[int, ...], Any]:
        """``(ranks, m)``: ``m[i, j]`` elements ``ranks[i]`` sends to ``ranks[j]``.

        ``ranks`` is :attr:`ranks` (the union of both rank sets); ``m`` is an int64
        ndarray of shape (n, n), so memory is O(n²). The diagonal holds local copies
        only with ``include_local=True`` (they are not traffic).
        """
        ranks = self.ranks
        keys = np.array(ranks, dtype=_I64)
        c = self._cols
        keep = slice(None) if include_local else c["src"] != c["dst"]
        i = np.searchsorted(keys, c["src"][keep])
        j = np.searchsorted(keys, c["dst"][keep])
        m = np.zeros((len(ranks), len(ranks)), dtype=_I64)
        np.add.at(m, (i, j), c["numel"][keep])
        return ranks, m

    def summary(self) -> dict[str, Any]:
        """Totals of the plan and of the "all-gather then slice" alternative.

        Keys: ``numel`` (of the global tensor); ``src_ranks``, ``dst_ranks``, ``ranks``
        (counts); ``transfers`` (boxes sent), ``local_copies`` (boxes kept);
        ``elements_moved``, ``local_copy_elements``, ``elements_delivered`` (moved +
        local: the destination pieces' total); ``max_send_elements``,
        ``max_recv_elements`` (the busiest rank's) and ``max_send_rank``,
        ``max_recv_rank`` (the lowest such rank; None when nothing moves); ``ranks_per_host`` and
        ``across_host_elements`` (None without ``ranks_per_host``). The alternative:
        every source rank all-gathers the full tensor (receiving what it lacks) and
        every destination rank outside the source receives the full tensor, then each
        slices: ``allgather_elements`` (total received), ``allgather_max_recv_elements``
        and ``allgather_ratio`` (allgather / moved; None when nothing moves).
        """
        c = self._cols
        local = c["src"] == c["dst"]
        sent = c["numel"][~local]
        moved = int(sent.sum())
        rph = self.ranks_per_host
        across = None
        if rph is not None:
            cross = (c["src"][~local] // rph) != (c["dst"][~local] // rph)
            across = int(sent[cross].sum())
        ag_total, ag_max = _allgather_cost(self.src_spec, self.src_ranks, self.dst_ranks)
        max_send, send_rank = max_per_rank(c["src"][~local], sent)
        max_recv, recv_rank = max_per_rank(c["dst"][~local], sent)
        return {
            "numel": int(np.prod(self.src_spec.global_shape, dtype=_I64)),
            "src_ranks": len(self.src_ranks),
            "dst_ranks": len(self.dst_ranks),
            "ranks": len(self.ranks),
            "transfers": int((~local).sum()),
            "local_copies": int(local.sum()),
            "elements_moved": moved,
            "local_copy_elements": int(c["numel"][local].sum()),
            "elements_delivered": int(c["numel"].sum()),
            "max_send_elements": max_send,
            "max_send_rank": send_rank,
            "max_recv_elements": max_recv,
            "max_recv_rank": recv_rank,
            "ranks_per_host": rph,
            "across_host_elements": across,
            "allgather_elements": ag_total,
            "allgather_max_recv_elements": ag_max,
            "allgather_ratio": ag_total / moved if moved else None,
        }


def max_per_rank(ranks: Any, numel: Any) -> tuple[int, int | None]:
    """(largest per-rank total, the lowest rank with it); (0, None) when empty."""
    if not len(ranks):
        return 0, None
    keys, inverse = np.unique(ranks, return_inverse=True)
    totals = np.zeros(len(keys), dtype=_I64)
    np.add.at(totals, inverse, numel)
    i = int(np.argmax(totals))
    return int(totals[i]), int(keys[i])


def _rank(rank: object) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be an int, got {rank!r}")
    return int(rank)


def _allgather_cost(
    spec: ShardingSpec, src_ranks: tuple[int, ...], dst_ranks: tuple[int, ...]
) -> tuple[int, int]:
    """(total, max per rank) received when every source rank all-gathers the tensor and
    every destination rank outside the source receives all of it."""
    numel = int(np.prod(spec.global_shape, dtype=_I64))
    table = piece_table(spec)
    box_numel_ = np.prod(table.hi - table.lo, axis=1)
    piece_numel = np.zeros(len(table.holders), dtype=_I64)
    np.add.at(piece_numel, table.box_piece, box_numel_)
    held_total = int((piece_numel * table.holders.shape[1]).sum())
    lacking_src = numel * len(src_ranks) - held_total
    outside = len(set(dst_ranks) - set(src_ranks))
    every_src_holds = len(piece_numel) and table.holders.size == len(src_ranks)
    least = int(piece_numel.min()) if every_src_holds else 0
    need_max = numel if outside else (numel - least if src_ranks else 0)
    return lacking_src + numel * outside, need_max


# ---------------------------------------------------------------------- planning
def reshard_plan(
    src_spec: ShardingSpec, dst_spec: ShardingSpec, *, ranks_per_host: int | None = None
) -> ReshardPlan:
    """The exact plan moving a tensor from ``src_spec``'s layout to ``dst_spec``'s.

    ``ranks_per_host``: ranks ``[h * k, (h + 1) * k)`` share host ``h``; among replicas
    a holder on the destination's host is preferred. Cost: O(world size) numpy work to
    group each spec's ranks by the piece they hold, then O(transfers) numpy work, plus
    O(log holders) Python work per transfer whose source is replicated — never
    O(elements), never O(source ranks × destination ranks). Plans are cached.

    ValueError if the global shapes differ or either spec has a ``Partial`` placement
    (reduce it first); TypeError for arguments of the wrong type.
    """
    for name, spec in (("src_spec", src_spec), ("dst_spec", dst_spec)):
        if not isinstance(spec, ShardingSpec):
            raise TypeError(f"{name} must be a ShardingSpec, got {type(spec).__name__}")
        partial = [(m, p) for m, p in enumerate(spec.placements()) if isinstance(p, Partial)]
        if partial:
            m, p = partial[0]
            raise ValueError(
                f"{name} has {p!r} on mesh dim {m} ({spec.mesh.names[m]!r}): a pending "
                "reduction cannot be resharded; reduce it to Replicate or Shard first"
            )
    if src_spec.global_shape != dst_spec.global_shape:
        raise ValueError(
            f"global shapes differ: src_spec {src_spec.global_shape}, "
            f"dst_spec {dst_spec.global_shape}"
        )
    if ranks_per_host is not None:
        if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, (int, np.integer)):
            raise TypeError(f"ranks_per_host must be an int or None, got {ranks_per_host!r}")
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
        ranks_per_host = int(ranks_per_host)
    return _plan(src_spec, dst_spec, ranks_per_host)


def _ranges(starts: Any, counts: Any) -> Any:
    """Concatenation of ``arange(s, s + n)`` for every (s, n), vectorised."""
    total = int(counts.sum())
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(total, dtype=_I64)


def _src_grid(src: PieceTable) -> tuple[list[Any], list[Any], Any] | None:
    """Per tensor dim the sorted, disjoint source intervals, and the piece of every
    combination of interval ids (-1 where none); None if the source boxes are no grid
    (explicit runs, :class:`~meshlayout.sharding.RunsSpec`, may be any disjoint boxes)."""
    los: list[Any] = []
    his: list[Any] = []
    ids: list[Any] = []
    for d in range(src.lo.shape[1]):
        lo, first = np.unique(src.lo[:, d], return_index=True)
        hi = src.hi[first, d]
        i = np.searchsorted(lo, src.lo[:, d])
        if not (np.array_equal(hi[i], src.hi[:, d]) and (hi[:-1] <= lo[1:]).all()):
            return None
        los.append(lo)
        his.append(hi)
        ids.append(i)
    # every box is one cell of the grid of those intervals (disjoint boxes: distinct cells)
    grid = np.full(tuple(len(lo) for lo in los), -1, dtype=_I64)
    grid[tuple(ids)] = src.box_piece
    return los, his, grid


def _pair_hits(src: PieceTable, dst: PieceTable) -> tuple[Any, Any, Any, Any]:
    """(destination box, source piece, start, stop) of every non-empty intersection of
    a destination box with a source box, by destination box then row-major start.

    For sources whose boxes are no grid; O(destination boxes x source boxes) numpy
    work, in chunks."""
    nb, ns = len(dst.lo), len(src.lo)
    parts: list[tuple[Any, Any, Any, Any]] = []
    step = max(1, (1 << 22) // max(ns, 1))
    for b0 in range(0, nb, step):
        b = np.arange(b0, min(nb, b0 + step), dtype=_I64)
        start = np.maximum(dst.lo[b][:, None, :], src.lo[None, :, :])
        stop = np.minimum(dst.hi[b][:, None, :], src.hi[None, :, :])
        bi, si = np.nonzero((start < stop).all(axis=2))
        parts.append((b[bi], src.box_piece[si], start[bi, si], stop[bi, si]))
    nd = dst.lo.shape[1]
    box = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=_I64)
    piece = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=_I64)
    start = np.concatenate([p[2] for p in parts]) if parts else np.zeros((0, nd), dtype=_I64)
    stop = np.concatenate([p[3] for p in parts]) if parts else np.zeros((0, nd), dtype=_I64)
    order = np.lexsort((*start.T[::-1], box))
    return box[order], piece[order], start[order], stop[order]


def _hits(src: PieceTable, dst: PieceTable) -> dict[str, Any]:
    """Every (destination box ∩ source box), grouped by destination box in order."""
    found = _src_grid(src)
    if found is None:
        box, piece, start, stop = _pair_hits(src, dst)
        return _checked(src, dst, box, piece, start, stop)
    los, his, grid = found
    nd = dst.lo.shape[1]
    nbox = len(dst.lo)
    first = np.zeros((nbox, nd), dtype=_I64)
    count = np.zeros((nbox, nd), dtype=_I64)
    for d in range(nd):
        first[:, d] = np.searchsorted(his[d], dst.lo[:, d], "right")
        count[:, d] = np.searchsorted(los[d], dst.hi[:, d], "left") - first[:, d]
    per_box = np.prod(np.maximum(count, 0), axis=1)
    box = np.repeat(np.arange(nbox, dtype=_I64), per_box)
    k = np.arange(len(box), dtype=_I64) - np.repeat(np.cumsum(per_box) - per_box, per_box)
    ids = np.zeros((len(box), nd), dtype=_I64)
    for d in reversed(range(nd)):  # row-major over the box's grid of source intervals
        n = count[box, d]
        ids[:, d] = first[box, d] + k % n
        k //= n
    piece = grid[tuple(ids.T)]
    start = np.empty((len(box), nd), dtype=_I64)
    stop = np.empty((len(box), nd), dtype=_I64)
    for d in range(nd):
        start[:, d] = np.maximum(los[d][ids[:, d]], dst.lo[box, d])
        stop[:, d] = np.minimum(his[d][ids[:, d]], dst.hi[box, d])
    return _checked(src, dst, box, piece, start, stop)


def _checked(
    src: PieceTable, dst: PieceTable, box: Any, piece: Any, start: Any, stop: Any
) -> dict[str, Any]:
    """The hits, once checked to deliver every destination element exactly once."""
    numel = np.prod(stop - start, axis=1)
    want = np.zeros(len(dst.holders), dtype=_I64)
    np.add.at(want, dst.box_piece, np.prod(dst.hi - dst.lo, axis=1))
    got = np.zeros(len(dst.holders), dtype=_I64)
    np.add.at(got, dst.box_piece[box], np.where(piece >= 0, numel, 0))
    if (piece < 0).any() or not np.array_equal(want, got):
        # only explicit runs (RunsSpec) leave destination elements without a source;
        # hits partition each destination box, so a missing source shows in the totals
        q = int(np.flatnonzero(want != got)[0])
        raise ValueError(
            "the source spec does not hold every element the destination needs: "
            f"{int(want[q] - got[q])} elements of the destination piece {dst.runs()[q]} "
            f"(ranks {dst.holders[q].tolist()}) are held by no source rank"
        )
    return {
        "piece": piece,
        "start": start,
        "stop": stop,
        "numel": numel,
        "dst_piece": dst.box_piece[box],
    }


class _Senders:
    """Deterministic sender choice among a piece's holders: least loaded, host first."""

    def __init__(self, holders: list[list[int]], ranks_per_host: int | None) -> None:
        self.holders = holders
        self.rph = ranks_per_host
        self.load: dict[int, int] = {}
        self.heaps: dict[int, list[tuple[int, int]]] = {}
        self.host_heaps: dict[int, dict[int, list[tuple[int, int]]]] = {}

    def pick(self, piece: int, dst: int, n: int) -> int:
        """The holder of ``piece`` that sends ``n`` elements to ``dst`` (which holds none)."""
        heap = self.heaps.get(piece)
        hosts = self.host_heaps.get(piece)
        if heap is None:
            # every holder keeps exactly one current (load, rank) entry per heap; entries
            # made stale by a later send are dropped when they reach the top
            ranks = self.holders[piece]
            heap = self.heaps[piece] = [(0, r) for r in ranks]  # ascending: a heap
            if self.rph is not None:
                hosts = {}
                for r in ranks:
                    hosts.setdefault(r // self.rph, []).append((0, r))
                self.host_heaps[piece] = hosts
        chosen = heap
        if hosts is not None and self.rph is not None:
            chosen = hosts.get(dst // self.rph) or heap
        load = self.load
        while chosen[0][0] != load.get(chosen[0][1], 0):
            heapq.heappop(chosen)
        _, sender = heapq.heappop(chosen)
        new = load.get(sender, 0) + n
        load[sender] = new
        heapq.heappush(heap, (new, sender))
        if hosts is not None and self.rph is not None:
            heapq.heappush(hosts[sender // self.rph], (new, sender))
        return sender


@functools.lru_cache(maxsize=64)
def _plan(src_spec: ShardingSpec, dst_spec: ShardingSpec, rph: int | None) -> ReshardPlan:
    if rph is None and isinstance(src_spec, RunsSpec):
        found = _relabelled(src_spec, dst_spec)
        if found is not None:
            return found
    return _build(src_spec, dst_spec, rph)


def _labels(count: int, dst_ranks: tuple[int, ...]) -> list[int]:
    """The ``count`` smallest ints >= 0 that are no rank of ``dst_ranks``, ascending."""
    taken = set(dst_ranks)
    out: list[int] = []
    x = 0
    while len(out) < count:
        if x not in taken:
            out.append(x)
        x += 1
    return out


def _relabelled(src_spec: RunsSpec, dst_spec: ShardingSpec) -> ReshardPlan | None:
    """The plan from explicit runs, via the plan of its canonical form; None if the rank
    sets overlap (local copies depend on which ranks are which).

    The views of one stacked tensor (a layer's experts: ``view_spec(stack, e)``) are the
    same runs on different holders. Relabelling the source ranks in order onto the
    smallest ints outside the destination's ranks keeps every choice the planner makes
    (sender ties go to the lower rank; no rank is on both sides), so one canonical plan
    per (shape, runs, destination) serves them all: its source column is mapped back.
    """
    ranks = [r for r, _ in src_spec._runs]  # ascending: the mesh's ranks
    dst_ranks = _covered(dst_spec)
    if not set(dst_ranks).isdisjoint(ranks):
        return None
    canon = _canonical_plan(src_spec.global_shape, tuple(rr for _, rr in src_spec._runs), dst_spec)
    labels = _labels(len(ranks), dst_ranks)
    if labels == ranks:
        return canon
    c = canon._cols
    actual = np.asarray(ranks, dtype=_I64)
    src_col = actual[np.searchsorted(np.asarray(labels, dtype=_I64), c["src"])]
    src_col.setflags(write=False)
    return ReshardPlan(
        src_spec=src_spec,
        dst_spec=dst_spec,
        ranks_per_host=None,
        src_ranks=tuple(ranks),
        dst_ranks=canon.dst_ranks,
        _cols={**c, "src": src_col},
    )


@functools.lru_cache(maxsize=64)
def _canonical_plan(
    shape: tuple[int, ...], runs: tuple[tuple[Runs, ...], ...], dst_spec: ShardingSpec
) -> ReshardPlan:
    labels = _labels(len(runs), _covered(dst_spec))
    return _build(RunsSpec(shape, dict(zip(labels, runs))), dst_spec, None)


def _build(src_spec: ShardingSpec, dst_spec: ShardingSpec, rph: int | None) -> ReshardPlan:
    src = piece_table(src_spec)
    dst = piece_table(dst_spec)
    hits = _hits(src, dst)
    # hits of destination piece q are rows [hit_first[q], hit_first[q] + hit_count[q])
    hit_count = np.bincount(hits["dst_piece"], minlength=len(dst.holders)).astype(_I64)
    hit_first = np.cumsum(hit_count) - hit_count
    # one block of rows per destination rank, ascending
    dst_rank = dst.holders.reshape(-1)
    dst_piece = np.repeat(np.arange(len(dst.holders), dtype=_I64), dst.holders.shape[1])
    order = np.argsort(dst_rank, kind="stable")
    dst_rank, dst_piece = dst_rank[order], dst_piece[order]
    rows = _ranges(hit_first[dst_piece], hit_count[dst_piece])
    dst_col = np.repeat(dst_rank, hit_count[dst_piece])
    piece = hits["piece"][rows]
    # the source piece each destination rank holds itself (-1: none)
    src_rank = src.holders.reshape(-1)
    src_piece = np.repeat(np.arange(len(src.holders), dtype=_I64), src.holders.shape[1])
    by_rank = np.argsort(src_rank)
    pos = np.searchsorted(src_rank[by_rank], dst_col)
    pos = np.minimum(pos, max(len(src_rank) - 1, 0))
    own = np.full(len(dst_col), -1, dtype=_I64)
    if len(src_rank):
        found = src_rank[by_rank][pos] == dst_col
        own[found] = src_piece[by_rank][pos[found]]
    local = piece == own
    numel = hits["numel"][rows]
    src_col = dst_col.copy()
    if src.holders.shape[1] == 1:
        src_col[~local] = src.holders[piece[~local], 0]
    else:
        senders = _Senders(src.holders.tolist(), rph)
        todo = np.flatnonzero(~local)
        picked = [
            senders.pick(p, d, n)
            for p, d, n in zip(piece[todo].tolist(), dst_col[todo].tolist(), numel[todo].tolist())
        ]
        src_col[todo] = np.array(picked, dtype=_I64)
    nd = len(src_spec.global_shape)
    cols = {
        "src": src_col,
        "dst": dst_col,
        "start": hits["start"][rows][:, :nd],
        "stop": hits["stop"][rows][:, :nd],
        "numel": numel,
    }
    for a in cols.values():
        a.setflags(write=False)
    return ReshardPlan(
        src_spec=src_spec,
        dst_spec=dst_spec,
        ranks_per_host=rph,
        src_ranks=_covered(src_spec),
        dst_ranks=_covered(dst_spec),
        _cols=cols,
    )


def _covered(spec: ShardingSpec) -> tuple[int, ...]:
    return tuple(sorted(np.asarray(spec.mesh.submeshes(), dtype=_I64).reshape(-1).tolist()))
