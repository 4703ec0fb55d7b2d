"""Whole-model transfer plan: every tensor's boxes, packed into bounded rounds (``docs/transfer.md``).

:func:`transfer_plan` takes, per tensor name, a source and a destination
:class:`ShardingSpec` (same global shape; meshes, rank maps and rank sets free) and the
bytes per element on the wire. For each tensor it reuses the reshard plan
(:func:`~meshlayout.sharding.reshard_plan`: exact boxes, local copies, the holder
choice), then:

- **balances replicas across the model**: a box held by several source ranks
  (``Replicate``, HSDP) is sent by the least-loaded holder counted over *all*
  tensors (a holder on the receiver's host first when ``ranks_per_host`` is given),
  not per tensor, so replicas share the work;
- **packs rounds**: a round is what one collective moves; in every round each rank
  sends at most ``bucket_bytes`` and receives at most ``bucket_bytes``. Boxes are
  placed first-fit, per (sender, receiver) pair and in name order within a pair,
  into the earliest round where both the sender and the receiver have room (:mod:`._rounds`);
  a box that does not fit whole is cut into slabs (a prefix
  along its outermost dim of extent > 1, so each slab stays a box; when one index
  along that dim does not fit, it is cut along the next dim) that fill the room.
  Rounds stay close to the lower bound ``ceil(max bytes per rank / bucket_bytes)``.

Within a round, a rank's send buffer holds its pieces by receiver (ascending rank,
the collective's peer order), then by descending item size (alignment), then in
plan order; the receiver's buffer holds the same pieces in the same order per
sender. :meth:`TransferRound.sends` / :meth:`TransferRound.receives` give each
piece's byte offset in that buffer. Pure: numpy only, no torch.

>>> from meshlayout import Mesh
>>> from meshlayout.sharding import Shard, ShardingSpec
>>> fsdp = Mesh({"dp": 4})                       # trainer: rows over ranks 0-3
>>> tp = Mesh({"tp": 2}, ranks=[4, 5])           # inference: columns over ranks 4-5
>>> src = {n: ShardingSpec((8, 4), fsdp, [Shard(0)]) for n in ("a", "b")}
>>> dst = {n: ShardingSpec((8, 4), tp, [Shard(1)]) for n in ("a", "b")}
>>> plan = transfer_plan(src, dst, {"a": 2, "b": 2}, bucket_bytes=32)
>>> plan.bytes_moved, len(plan.rounds), plan.summary()["rounds_lower_bound"]
(128, 2, 2)
>>> plan.round(0).transfers[:2]
(TensorTransfer(name='a', src_rank=0, dst_rank=4, box=((0, 2), (0, 2))), TensorTransfer(name='b', src_rank=0, dst_rank=4, box=((0, 2), (0, 2))))
>>> [(s.name, s.peer, s.offset, s.nbytes) for s in plan.round(0).sends(0)]  # rank 0's buffer
[('a', 4, 0, 8), ('b', 4, 8, 8), ('a', 5, 16, 8), ('b', 5, 24, 8)]
>>> plan.round(0).send_sizes(0), plan.round(0).recv_sizes(4)  # per rank of plan.ranks
((0, 0, 0, 0, 16, 16), (16, 16, 0, 0, 0, 0))
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ._boxes import Box, piece_table
from ._placements import Partial
from ._reshard import _allgather_cost, _covered, max_per_rank, reshard_plan
from ._rounds import layout_rounds, pack_rounds, slabs
from ._spec import ShardingSpec

__all__ = ["Slot", "TensorTransfer", "TransferPlan", "TransferRound", "slabs", "transfer_plan"]

_I64 = np.int64


class TensorTransfer(NamedTuple):
    """``box`` (global ``(start, stop)`` per dim) of tensor ``name`` goes ``src_rank`` -> ``dst_rank``."""

    name: str
    src_rank: int
    dst_rank: int
    box: Box


class Slot(NamedTuple):
    """One piece in a rank's buffer of one round.

    ``peer``: the receiver (in :meth:`TransferRound.sends`) or the sender (in
    :meth:`TransferRound.receives`); ``offset``: byte offset in the buffer;
    ``nbytes``: box elements x the tensor's item size.
    """

    name: str
    peer: int
    box: Box
    offset: int
    nbytes: int


def _boxes_of(start: Any, stop: Any, ndims: Any) -> list[Box]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return [
            tuple(zip(a[:n], b[:n]))
            for a, b, n in zip(start.tolist(), stop.tolist(), ndims.tolist())
        ]
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True, eq=False)
class TransferRound:
    """What one collective moves: rows ``[lo, hi)`` of the plan's columns (internal order)."""

    plan: TransferPlan = field(repr=False)
    index: int
    lo: int
    hi: int

    def __repr__(self) -> str:
        return f"TransferRound({self.index}, {self.hi - self.lo} transfers, {self.nbytes} bytes)"

    @property
    def nbytes(self) -> int:
        """Bytes the round moves (over every rank)."""
        return int(self.plan._cols["nbytes"][self.lo : self.hi].sum())

    @property
    def transfers(self) -> tuple[TensorTransfer, ...]:
        """The round's transfers, by sender, receiver, then buffer order."""
        c = self.plan._cols
        rows = slice(self.lo, self.hi)
        names = self.plan.names
        boxes = _boxes_of(c["start"][rows], c["stop"][rows], c["ndim"][rows])
        return tuple(
            TensorTransfer(names[t], s, d, b)
            for t, s, d, b in zip(
                c["tid"][rows].tolist(), c["src"][rows].tolist(), c["dst"][rows].tolist(), boxes
            )
        )

    def _slots(self, kind: str, rank: int) -> tuple[Slot, ...]:
        rows = self.plan._rank_rows(kind, self.index, rank)
        c = self.plan._cols
        names = self.plan.names
        peer = c["dst" if kind == "send" else "src"][rows].tolist()
        off = c["send_off" if kind == "send" else "recv_off"][rows].tolist()
        boxes = _boxes_of(c["start"][rows], c["stop"][rows], c["ndim"][rows])
        return tuple(
            Slot(names[t], p, b, o, n)
            for t, p, b, o, n in zip(
                c["tid"][rows].tolist(), peer, boxes, off, c["nbytes"][rows].tolist()
            )
        )

    def sends(self, rank: int) -> tuple[Slot, ...]:
        """``rank``'s pieces to send in this round, in send-buffer order (peer = receiver)."""
        return self._slots("send", _rank(rank))

    def receives(self, rank: int) -> tuple[Slot, ...]:
        """``rank``'s pieces to receive in this round, in receive-buffer order (peer = sender)."""
        return self._slots("recv", _rank(rank))

    def _sizes(self, kind: str, rank: int) -> tuple[int, ...]:
        rows = self.plan._rank_rows(kind, self.index, rank)
        c = self.plan._cols
        ranks = np.asarray(self.plan.ranks, dtype=_I64)
        peer = np.searchsorted(ranks, c["dst" if kind == "send" else "src"][rows])
        out = np.zeros(len(ranks), dtype=_I64)
        np.add.at(out, peer, c["nbytes"][rows])
        return tuple(out.tolist())

    def send_sizes(self, rank: int) -> tuple[int, ...]:
        """Bytes ``rank`` sends to each rank of :attr:`TransferPlan.ranks` in this round."""
        return self._sizes("send", _rank(rank))

    def recv_sizes(self, rank: int) -> tuple[int, ...]:
        """Bytes ``rank`` receives from each rank of :attr:`TransferPlan.ranks` in this round."""
        return self._sizes("recv", _rank(rank))


@dataclass(frozen=True, eq=False)
class TransferPlan:
    """Every tensor's transfers, packed into rounds (build it with :func:`transfer_plan`).

    Columnar like :class:`~meshlayout.sharding.ReshardPlan`: :meth:`arrays` gives the
    sent pieces (one row per box or slab, grouped by round), :meth:`local_arrays`
    the local copies; objects are made on demand.
    """

    names: tuple[str, ...]
    src_specs: Mapping[str, ShardingSpec] = field(repr=False)
    dst_specs: Mapping[str, ShardingSpec] = field(repr=False)
    itemsizes: Mapping[str, int] = field(repr=False)
    bucket_bytes: int
    ranks_per_host: int | None
    ranks: tuple[int, ...] = field(repr=False)
    src_ranks: tuple[int, ...] = field(repr=False)
    dst_ranks: tuple[int, ...] = field(repr=False)
    _cols: dict[str, Any] = field(repr=False)
    _local: dict[str, Any] = field(repr=False)
    _bounds: tuple[int, ...] = field(repr=False)  # rows of round i: [_bounds[i], _bounds[i+1])
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return (
            f"TransferPlan({len(self.names)} tensors, {self.bytes_moved} bytes moved in "
            f"{len(self._bounds) - 1} rounds of <= {self.bucket_bytes} bytes per rank, "
            f"{len(self.ranks)} ranks)"
        )

    # ------------------------------------------------------------------ rounds
    @property
    def rounds(self) -> tuple[TransferRound, ...]:
        """The rounds, in order; one collective each."""
        hit = self._memo.get("rounds")
        if hit is None:
            b = self._bounds
            hit = self._memo["rounds"] = tuple(
                TransferRound(self, i, b[i], b[i + 1]) for i in range(len(b) - 1)
            )
        return hit

    def round(self, i: int) -> TransferRound:
        """Round ``i`` (IndexError naming the number of rounds if out of range)."""
        rounds = self.rounds
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"round index must be an int, got {i!r}")
        if not -len(rounds) <= i < len(rounds):
            raise IndexError(f"round {i} out of range: the plan has {len(rounds)} rounds")
        return rounds[i]

    def _rank_rows(self, kind: str, rnd: int, rank: int) -> Any:
        """Rows (plan order = buffer order) ``rank`` sends / receives in round ``rnd``."""
        index = self._memo.get(kind)
        c = self._cols
        if index is None:
            who = c["src" if kind == "send" else "dst"]
            # plan rows are sorted by (round, src, dst, ...): sending rows of a rank in a
            # round are contiguous; receiving rows must be reordered by (dst, src, ...)
            if kind == "send":
                order = np.arange(len(who), dtype=_I64)
            else:
                order = np.lexsort((c["recv_off"], c["dst"], c["round"]))
            keys = c["round"][order] * (1 << 32) + who[order]
            index = self._memo[kind] = (keys, order)
        keys, order = index
        key = rnd * (1 << 32) + rank
        lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
        return order[lo:hi]

    def arrays(self) -> dict[str, Any]:
        """The sent pieces as read-only int64 columns, one row per box or slab.

        ``tid`` (index into :attr:`names`), ``src``, ``dst``, ``round``, ``nbytes``,
        ``send_off``, ``recv_off`` (byte offsets in the round's buffers), ``ndim``,
        ``start``, ``stop`` (``[rows, max ndim]``; dims past a tensor's ndim are
        ``(0, 1)``). Rows are sorted by round, sender, receiver, then buffer order.
        """
        return dict(self._cols)

    def local_arrays(self) -> dict[str, Any]:
        """Local copies as read-only int64 columns: ``tid``, ``rank``, ``ndim``, ``start``, ``stop``."""
        return dict(self._local)

    def local_copies(self, rank: int | None = None) -> tuple[tuple[str, Box], ...]:
        """``(name, box)`` the destination rank ``rank`` already holds in the source
        (every rank's when None, then as ``(name, box)`` in rank order; use
        :meth:`local_arrays` for the ranks)."""
        c = self._local
        rows = (
            np.arange(len(c["tid"])) if rank is None else np.flatnonzero(c["rank"] == _rank(rank))
        )
        boxes = _boxes_of(c["start"][rows], c["stop"][rows], c["ndim"][rows])
        return tuple((self.names[t], b) for t, b in zip(c["tid"][rows].tolist(), boxes))

    # ------------------------------------------------------------------ totals
    @property
    def bytes_moved(self) -> int:
        """Bytes sent from one rank to another (local copies excluded): the minimum."""
        return int(self._cols["nbytes"].sum())

    @property
    def rounds_lower_bound(self) -> int:
        """``ceil(max over ranks of max(bytes sent, bytes received) / bucket_bytes)``."""
        send, _ = max_per_rank(self._cols["src"], self._cols["nbytes"])
        recv, _ = max_per_rank(self._cols["dst"], self._cols["nbytes"])
        return -(-max(send, recv) // self.bucket_bytes)

    def matrix(self) -> tuple[tuple[int, ...], Any]:
        """``(ranks, m)``: ``m[i, j]`` bytes ``ranks[i]`` sends to ``ranks[j]`` (all rounds).

        ``ranks`` is :attr:`ranks`; ``m`` an int64 ndarray (n, n); local copies are not traffic.
        """
        keys = np.asarray(self.ranks, dtype=_I64)
        c = self._cols
        m = np.zeros((len(keys), len(keys)), dtype=_I64)
        np.add.at(
            m, (np.searchsorted(keys, c["src"]), np.searchsorted(keys, c["dst"])), c["nbytes"]
        )
        return self.ranks, m

    def summary(self, top: int = 5) -> dict[str, Any]:
        """Totals of the plan and of gather-then-broadcast, as plain Python values.

        Keys: ``tensors``; ``ranks``, ``src_ranks``, ``dst_ranks`` (counts);
        ``bytes_moved`` (sent between ranks: the minimum), ``local_copy_bytes``,
        ``bytes_delivered`` (moved + local = the destination pieces' total);
        ``transfers`` (sent boxes and slabs); ``bucket_bytes``, ``rounds``,
        ``rounds_lower_bound`` (``ceil(max(max_send_bytes, max_recv_bytes) /
        bucket_bytes)``); ``max_send_bytes``, ``max_recv_bytes`` (the busiest rank's
        total over all rounds) with ``max_send_rank``, ``max_recv_rank`` (lowest such
        rank; None when nothing moves); ``max_round_send_bytes``,
        ``max_round_recv_bytes`` (the largest of any rank in any round: at most
        ``bucket_bytes``); ``ranks_per_host`` and ``across_host_bytes`` (None
        without ``ranks_per_host``); ``largest_tensors``: the ``top`` tensors moving
        the most bytes as ``(name, bytes, share of bytes_moved)``.

        **Gather-then-broadcast** (what verl / OpenRLHF do by default), per tensor:
        every source rank all-gathers the full tensor, receiving the elements it
        lacks, and every destination rank that is not a source rank receives the
        full tensor (broadcast from a source rank); each then slices its piece.
        ``gather_broadcast_bytes`` is the total received, at the wire item size for
        both steps; ``gather_broadcast_ratio`` = that / ``bytes_moved`` (None when
        nothing moves).
        """
        c = self._cols
        moved = self.bytes_moved
        isz = np.array([self.itemsizes[n] for n in self.names], dtype=_I64)
        lc = self._local
        local_bytes = int((np.prod(lc["stop"] - lc["start"], axis=1) * isz[lc["tid"]]).sum())
        rph = self.ranks_per_host
        across = None
        if rph is not None:
            across = int(c["nbytes"][(c["src"] // rph) != (c["dst"] // rph)].sum())
        max_send, send_rank = max_per_rank(c["src"], c["nbytes"])
        max_recv, recv_rank = max_per_rank(c["dst"], c["nbytes"])
        round_send = max_per_rank(c["round"] * (1 << 32) + c["src"], c["nbytes"])[0]
        round_recv = max_per_rank(c["round"] * (1 << 32) + c["dst"], c["nbytes"])[0]
        per_tensor = np.bincount(c["tid"], weights=c["nbytes"], minlength=len(self.names))
        order = np.argsort(-per_tensor, kind="stable")[:top]
        gtb = 0
        for name in self.names:
            src, dst = self.src_specs[name], self.dst_specs[name]
            total, _ = _allgather_cost(src, _covered(src), _covered(dst))
            gtb += total * self.itemsizes[name]
        return {
            "tensors": len(self.names),
            "ranks": len(self.ranks),
            "src_ranks": len(self.src_ranks),
            "dst_ranks": len(self.dst_ranks),
            "bytes_moved": moved,
            "local_copy_bytes": local_bytes,
            "bytes_delivered": moved + local_bytes,
            "transfers": len(c["tid"]),
            "bucket_bytes": self.bucket_bytes,
            "rounds": len(self._bounds) - 1,
            "rounds_lower_bound": -(-max(max_send, max_recv) // self.bucket_bytes),
            "max_send_bytes": max_send,
            "max_send_rank": send_rank,
            "max_recv_bytes": max_recv,
            "max_recv_rank": recv_rank,
            "max_round_send_bytes": round_send,
            "max_round_recv_bytes": round_recv,
            "ranks_per_host": rph,
            "across_host_bytes": across,
            "gather_broadcast_bytes": gtb,
            "gather_broadcast_ratio": gtb / moved if moved else None,
            "largest_tensors": [
                (self.names[int(t)], int(per_tensor[t]), float(per_tensor[t]) / moved)
                for t in order
                if per_tensor[t] > 0
            ],
        }


def _rank(rank: object) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise TypeError(f"rank must be an int, got {rank!r}")
    return int(rank)


# ---------------------------------------------------------------------- planning
def transfer_plan(
    src_specs: Mapping[str, ShardingSpec],
    dst_specs: Mapping[str, ShardingSpec],
    itemsizes: Mapping[str, int],
    *,
    bucket_bytes: int,
    ranks_per_host: int | None = None,
) -> TransferPlan:
    """The plan moving every tensor from ``src_specs``' layouts to ``dst_specs``'.

    ``src_specs`` / ``dst_specs``: name -> :class:`ShardingSpec`, the same names and,
    per name, the same global shape; ``itemsizes``: name -> bytes per element on the
    wire (the destination dtype's); ``bucket_bytes``: the most any rank sends, and
    the most any rank receives, in one round; ``ranks_per_host``: ranks
    ``[h * k, (h + 1) * k)`` share host ``h`` (senders on the receiver's host are
    preferred among replicas). Tensors are planned in sorted name order, so every
    process builds the same plan whatever its mappings' order.

    Cost: one cached :func:`reshard_plan` per distinct spec pair (a model's layers
    share them) plus numpy work linear in the number of boxes; Python work per box
    only where a box has several holders or where rounds must be packed (some rank
    moves more than ``bucket_bytes``).

    KeyError naming the names on one side only (or without an item size);
    ValueError naming the tensor for different global shapes, a ``Partial``
    placement, an item size < 1, ``bucket_bytes`` smaller than the largest item
    size; TypeError for arguments of the wrong type.
    """
    names = _check(src_specs, dst_specs, itemsizes, bucket_bytes, ranks_per_host)
    bucket = int(bucket_bytes)
    rph = None if ranks_per_host is None else int(ranks_per_host)
    parts: list[dict[str, Any]] = []
    local_parts: list[dict[str, Any]] = []
    maxnd = max([len(src_specs[n].global_shape) for n in names] + [0])
    for t, name in enumerate(names):
        plan = reshard_plan(src_specs[name], dst_specs[name], ranks_per_host=rph)
        c = plan.arrays()
        nd = c["start"].shape[1]
        isz = int(itemsizes[name])
        start = np.zeros((len(c["src"]), maxnd), dtype=_I64)
        stop = np.ones((len(c["src"]), maxnd), dtype=_I64)
        start[:, :nd] = c["start"]
        stop[:, :nd] = c["stop"]
        local = c["src"] == c["dst"]
        keep = ~local & (c["numel"] > 0)
        n = int(keep.sum())
        parts.append(
            {
                "tid": np.full(n, t, dtype=_I64),
                "src": c["src"][keep],
                "dst": c["dst"][keep],
                "nbytes": c["numel"][keep] * isz,
                "ndim": np.full(n, nd, dtype=_I64),
                "start": start[keep],
                "stop": stop[keep],
            }
        )
        lk = local & (c["numel"] > 0)
        local_parts.append(
            {
                "tid": np.full(int(lk.sum()), t, dtype=_I64),
                "rank": c["dst"][lk],
                "ndim": np.full(int(lk.sum()), nd, dtype=_I64),
                "start": start[lk],
                "stop": stop[lk],
            }
        )
    rows = _concat(parts, maxnd)
    _balance(rows, [src_specs[n] for n in names], rph)
    isz_of = np.array([int(itemsizes[n]) for n in names], dtype=_I64)
    rows = pack_rounds(rows, isz_of, bucket)
    cols, bounds = layout_rounds(rows, isz_of)
    local_cols = _concat(local_parts, maxnd, ("tid", "rank", "ndim", "start", "stop"))
    order = np.lexsort((np.arange(len(local_cols["tid"])), local_cols["rank"]))
    local_cols = {k: v[order] for k, v in local_cols.items()}
    for a in (*cols.values(), *local_cols.values()):
        a.setflags(write=False)
    src_ranks = sorted({r for m in {src_specs[n].mesh for n in names} for r in _ranks(m)})
    dst_ranks = sorted({r for m in {dst_specs[n].mesh for n in names} for r in _ranks(m)})
    return TransferPlan(
        names=names,
        src_specs={n: src_specs[n] for n in names},
        dst_specs={n: dst_specs[n] for n in names},
        itemsizes={n: int(itemsizes[n]) for n in names},
        bucket_bytes=bucket,
        ranks_per_host=rph,
        ranks=tuple(sorted(set(src_ranks) | set(dst_ranks))),
        src_ranks=tuple(src_ranks),
        dst_ranks=tuple(dst_ranks),
        _cols=cols,
        _local=local_cols,
        _bounds=bounds,
    )


def _ranks(mesh: Any) -> list[int]:
    return np.asarray(mesh.submeshes(), dtype=_I64).reshape(-1).tolist()  # type: ignore[no-any-return]


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check(
    src_specs: object,
    dst_specs: object,
    itemsizes: object,
    bucket_bytes: object,
    ranks_per_host: object,
) -> tuple[str, ...]:
    for what, m in (("src_specs", src_specs), ("dst_specs", dst_specs), ("itemsizes", itemsizes)):
        if not isinstance(m, Mapping):
            raise TypeError(f"{what} must be a mapping name -> value, got {type(m).__name__}")
    assert isinstance(src_specs, Mapping) and isinstance(dst_specs, Mapping)
    assert isinstance(itemsizes, Mapping)
    for what, m in (("src_specs", src_specs), ("dst_specs", dst_specs)):
        for k, v in m.items():
            if not isinstance(k, str):
                raise TypeError(f"{what}: tensor names must be str, got {k!r}")
            if not isinstance(v, ShardingSpec):
                raise TypeError(f"{what}[{k!r}] must be a ShardingSpec, got {type(v).__name__}")
    only_src = sorted(set(src_specs) - set(dst_specs))
    only_dst = sorted(set(dst_specs) - set(src_specs))
    if only_src or only_dst:
        raise KeyError(
            f"tensor names differ: only in src_specs {only_src}, only in dst_specs {only_dst}"
        )
    names = tuple(sorted(src_specs))
    missing = [n for n in names if n not in itemsizes]
    if missing:
        raise KeyError(f"itemsizes has no entry for {missing}")
    for n in names:
        v = itemsizes[n]
        if not _is_int(v) or v < 1:
            raise ValueError(f"itemsizes[{n!r}] must be a positive int (bytes), got {v!r}")
        s, d = src_specs[n], dst_specs[n]
        if s.global_shape != d.global_shape:
            raise ValueError(
                f"tensor {n!r}: global shapes differ: src {s.global_shape}, dst {d.global_shape}"
            )
        for side, spec in (("src", s), ("dst", d)):
            partial = [(m, p) for m, p in enumerate(spec.placements()) if isinstance(p, Partial)]
            if partial:
                m, p = partial[0]
                raise ValueError(
                    f"tensor {n!r}: the {side} spec has {p!r} on mesh dim {m}: a pending "
                    "reduction cannot be transferred; reduce it to Replicate or Shard first"
                )
    if not _is_int(bucket_bytes):
        raise TypeError(f"bucket_bytes must be an int, got {bucket_bytes!r}")
    assert isinstance(bucket_bytes, (int, np.integer))
    largest = max((int(itemsizes[n]) for n in names), default=1)
    if bucket_bytes < largest:
        worst = [n for n in names if itemsizes[n] == largest][:3]
        raise ValueError(
            f"bucket_bytes={bucket_bytes} is smaller than the largest item size {largest} "
            f"(of {worst}): one element must fit in a bucket"
        )
    if ranks_per_host is not None:
        if not _is_int(ranks_per_host):
            raise TypeError(f"ranks_per_host must be an int or None, got {ranks_per_host!r}")
        assert isinstance(ranks_per_host, (int, np.integer))
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
    return names


def _concat(
    parts: list[dict[str, Any]],
    maxnd: int,
    keys: tuple[str, ...] = ("tid", "src", "dst", "nbytes", "ndim", "start", "stop"),
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in keys:
        arrays = [p[k] for p in parts]
        if k in ("start", "stop"):
            out[k] = np.concatenate(arrays) if arrays else np.zeros((0, maxnd), dtype=_I64)
        else:
            out[k] = np.concatenate(arrays) if arrays else np.zeros(0, dtype=_I64)
    return out


def _balance(rows: dict[str, Any], specs: list[ShardingSpec], rph: int | None) -> None:
    """Re-choose, over the whole model, the sender of every box that several ranks hold.

    The reshard plan spreads replicas within one tensor; summed over a model its
    choices would all start from the lowest holder. Here the candidates of a box are
    its holders on the receiver's host when there are any (``rph``), else all its
    holders; the boxes with the same candidates take them in turn (round robin, in
    name order then plan order), so replicas share the sending over the model.
    Vectorised: no Python work per box.
    """
    tid, src, dst = rows["tid"], rows["src"], rows["dst"]
    sels: list[Any] = []
    cands: list[Any] = []
    width = 0
    for t, spec in enumerate(specs):
        table = piece_table(spec)
        h = table.holders
        if h.shape[1] < 2:
            continue
        lo, hi = np.searchsorted(tid, [t, t + 1])  # rows are grouped by tensor, in order
        sel = np.arange(lo, hi, dtype=_I64)
        if not len(sel):
            continue
        rank_piece = np.full(int(h.max()) + 1, -1, dtype=_I64)
        rank_piece[h.reshape(-1)] = np.repeat(np.arange(len(h), dtype=_I64), h.shape[1])
        sels.append(sel)
        cands.append(h[rank_piece[src[sel]]])
        width = max(width, h.shape[1])
    if not sels:
        return
    sel = np.concatenate(sels)
    holders = np.concatenate(
        [np.pad(c, ((0, 0), (0, width - c.shape[1])), constant_values=-1) for c in cands]
    )
    ok = holders >= 0
    if rph is not None:
        near = ok & (holders // rph == (dst[sel] // rph)[:, None])
        ok = np.where(near.any(axis=1)[:, None], near, ok)
    holders = np.where(ok, holders, -1)
    # one key per candidate set (a collision would only merge two turn counters)
    weights = np.array([(1000003**j) % (1 << 61) for j in range(width)], dtype=_I64)
    _, group = np.unique((holders + 1) @ weights, return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")
    first = np.searchsorted(group[order], group[order], "left")
    turn = np.empty(len(sel), dtype=_I64)
    turn[order] = np.arange(len(sel), dtype=_I64) - first
    k = turn % ok.sum(axis=1)
    col = np.argmax(ok & (np.cumsum(ok, axis=1) - 1 == k[:, None]), axis=1)
    new_src = src.copy()
    new_src[sel] = holders[np.arange(len(sel)), col]
    rows["src"] = new_src
