"""Sharded tensors on a :class:`DistributedMesh`, exact per :class:`~meshlayout.sharding.ShardingSpec`.

* :func:`distribute` — the local piece of a global tensor (one broadcast from ``src``,
  or none when every rank already holds the tensor: ``src=None``).
* :func:`full_tensor` — the global tensor from local pieces: **one** all-gather over
  the group of all sharding mesh dims (pieces padded to the largest, reassembled from
  the spec's runs, so uneven and strided specs are exact) plus one all-reduce per
  ``Partial`` mesh dim.
* :func:`redistribute` — the local piece under another spec: a plan from run
  intersections, every element sent at most once, executed as **one**
  ``all_to_all_single`` over the sub-mesh.

Every collective is bounded by the mesh's timeout and, when a member never arrives,
fails on the others with :class:`~meshlayout.torch.RankTimeoutError` naming it (see
:mod:`meshlayout.torch._collectives`).

Example (4 ranks)::

    dm = init_mesh(Mesh({"dp": 2, "tp": 2}))
    spec = ShardingSpec((7, 4), dm.mesh, [StridedShard(0, 2), Shard(0)])  # FSDP over TP
    local = distribute(weight, dm, spec)
    assert torch.equal(full_tensor(local, dm, spec), weight)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..mesh import Mesh
from ..sharding import (
    Partial,
    Replicate,
    Shard,
    ShardingSpec,
    StridedShard,
    box_slices,
    intersect,
    run_boxes,
)
from ._collectives import Bounded, all_gather, all_reduce, all_to_all, broadcast
from ._mesh import DistributedMesh

__all__ = ["distribute", "full_tensor", "redistribute"]

_REDUCE = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,  # gloo has no AVG: sum, then divide
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def _spec_for(shape: Sequence[int], dm: DistributedMesh, placements: Any) -> ShardingSpec:
    if isinstance(placements, ShardingSpec):
        spec = placements
    else:
        items = list(placements)
        if all(isinstance(p, (Shard, StridedShard, Replicate, Partial)) for p in items):
            spec = ShardingSpec(tuple(shape), dm.mesh, items)
        else:
            spec = ShardingSpec.from_torch(tuple(shape), dm.mesh, items)
    _same_mesh(spec, dm)
    if tuple(spec.global_shape) != tuple(int(s) for s in shape):
        raise ValueError(
            f"tensor shape {tuple(shape)} does not match the spec's global_shape "
            f"{spec.global_shape}"
        )
    return spec


def _same_mesh(spec: ShardingSpec, dm: DistributedMesh) -> None:
    if not isinstance(spec, ShardingSpec):
        raise TypeError(f"expected a ShardingSpec, got {type(spec).__name__}: {spec!r}")
    if spec.mesh != dm.mesh:
        raise ValueError(f"the spec is over {spec.mesh!r}, the DistributedMesh over {dm.mesh!r}")


def _check_local(local: torch.Tensor, spec: ShardingSpec, rank: int, name: str) -> None:
    want = spec.local_shape(rank)
    if tuple(local.shape) != want:
        raise ValueError(
            f"local piece of rank {rank} has shape {tuple(local.shape)}, {name} says {want}"
        )


def _bounded(dm: DistributedMesh, dim: int, what: str) -> Bounded:
    """This rank's group of ``dm`` along ``dim``, bounded by the mesh's timeout."""
    return Bounded(dm.get_group(dim), dm.group_ranks(dim), dm.timeout, what)


def _pairs(
    src: ShardingSpec, sender: int, dst: ShardingSpec, receiver: int
) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """What ``sender`` holds under ``src`` that ``receiver`` holds under ``dst``.

    Per common box: (slices of the sender's local piece, slices of the receiver's).
    The order is a pure function of the arguments, so sender and receiver agree on it.
    """
    out = []
    for s in run_boxes(src, sender):
        for d in run_boxes(dst, receiver):
            common = intersect(s.box, d.box)
            if common is not None:
                out.append((s.local_slices(common), d.local_slices(common)))
    return out


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def distribute(
    tensor: torch.Tensor,
    dm: DistributedMesh,
    placements: ShardingSpec | Sequence[Any],
    src: int | None = 0,
) -> torch.Tensor:
    """This rank's local piece of ``tensor`` (a new contiguous tensor).

    ``placements``: a :class:`ShardingSpec`, meshlayout placements or torch placements.
    ``src``: flat index (row-major coordinate) of the rank of each sub-mesh whose
    ``tensor`` is authoritative — it is broadcast over the sub-mesh once; ``None``
    trusts every rank's own copy (no communication). ``Partial`` dims put the value on
    coordinate 0 and the reduction's identity elsewhere (as ``ShardingSpec.shard``).
    """
    spec = _spec_for(tensor.shape, dm, placements)
    dm._require_member("distribute")
    if src is not None and (not isinstance(src, int) or isinstance(src, bool)):
        raise TypeError(f"src must be a flat coordinate (int) or None, got {src!r}")
    if src is not None and dm.mesh.size() > 1:
        if not 0 <= src < dm.mesh.size():
            raise ValueError(f"src={src} is not a flat coordinate of a {dm.shape} mesh")
        tensor = tensor.detach().clone().contiguous()
        broadcast(_bounded(dm.flatten(), 0, "distribute"), tensor, src)
    piece = spec.shard(tensor.detach(), dm.rank)
    return piece.contiguous() if isinstance(piece, torch.Tensor) else torch.as_tensor(piece)


def full_tensor(local: torch.Tensor, dm: DistributedMesh, spec: ShardingSpec) -> torch.Tensor:
    """The global tensor from every rank's ``local`` piece under ``spec``.

    One ``all_gather_single`` over the group of all mesh dims that shard ``spec`` (the
    flattened sub-mesh of those dims; pieces padded to the largest) plus one
    ``all_reduce`` per ``Partial`` mesh dim. Every rank of the mesh must call it.
    When one tensor dim is sharded (FSDP, FSDP over TP), the group is flattened in
    shard order so that pieces arrive in memory order and the receive buffer becomes
    the result without a reassembly copy.
    """
    dm._require_member("full_tensor")
    _same_mesh(spec, dm)
    _check_local(local, spec, dm.rank, "spec")
    placements = spec.placements()
    value = local
    for m, p in enumerate(placements):
        if isinstance(p, Partial) and dm.size(m) > 1:
            value = value.clone().contiguous() if value is local else value
            all_reduce(_bounded(dm, m, "full_tensor"), value, _REDUCE[p.reduce_op])
            if p.reduce_op == "avg":
                value = value / dm.size(m)
    sharding = [m for m, p in enumerate(placements) if not isinstance(p, (Replicate, Partial))]
    if not sharding or all(dm.size(m) == 1 for m in sharding):
        return value.clone() if value is local else value
    in_order = _pieces_in_memory_order(spec)
    if in_order is not None:
        return _gather_in_order(value, dm, spec, in_order)
    return _gather_by_runs(value, dm, spec, sharding)


def _gather_padded(
    value: torch.Tensor, flat: DistributedMesh, sizes: Sequence[int]
) -> tuple[torch.Tensor, int]:
    """All-gather every member's piece over the 1-D ``flat``, each padded to the largest.

    ``sizes[j]`` is member ``j``'s element count. Returns the receive buffer (member
    ``j``'s piece at ``[j * width, j * width + sizes[j])``) and ``width``. The padding
    is never read; a piece of full width is sent as is (no copy when contiguous).
    """
    width = max(sizes)
    mine = value.numel()
    if mine == width:
        send = value.contiguous().reshape(-1)
    else:
        send = value.new_empty(width)
        send[:mine] = value.reshape(-1)
    recv = value.new_empty(width * len(sizes))
    all_gather(_bounded(flat, 0, "full_tensor"), recv, send)
    return recv, width


def _gather_by_runs(
    value: torch.Tensor, dm: DistributedMesh, spec: ShardingSpec, sharding: Sequence[int]
) -> torch.Tensor:
    """Gather over the flattened sharding dims, then copy each piece by its runs."""
    flat = dm[tuple(sharding)].flatten()
    members = flat.group_ranks(0)
    recv, width = _gather_padded(value, flat, [_numel(spec.local_shape(r)) for r in members])
    return _assemble_by_runs(recv, width, spec, members)


def _assemble_by_runs(
    recv: torch.Tensor, width: int, spec: ShardingSpec, members: Sequence[int]
) -> torch.Tensor:
    """The global tensor from ``members``' pieces, member ``j``'s at ``recv[j * width:]``.

    The members together hold every element (one sub-mesh of the sharding dims).
    """
    out = recv.new_empty(spec.global_shape)
    for j, rank in enumerate(members):
        shape = spec.local_shape(rank)
        n = _numel(shape)
        if n:
            piece = recv[j * width : j * width + n].reshape(shape)
            for rb in run_boxes(spec, rank):
                out[box_slices(rb.box)] = piece[rb.local_slices()]
    return out


def _pieces_in_memory_order(spec: ShardingSpec) -> tuple[int, ...] | None:
    """Mesh dims whose flattened group (in this order) lists the pieces in memory order.

    True when exactly one tensor dim ``d`` is sharded and every dim before it has size
    1: nested chunking in shard order then makes each piece one contiguous block of the
    row-major global tensor, and the blocks follow the row-major order of the
    coordinates of the shard order's mesh dims (outermost first). None otherwise.
    """
    if not spec.decodable:
        return None
    order = spec.shard_order()
    if len(order) != 1:
        return None
    ((d, dims),) = order.items()
    if any(n != 1 for n in spec.global_shape[:d]):
        return None
    return dims


def _gather_in_order(
    value: torch.Tensor, dm: DistributedMesh, spec: ShardingSpec, dims: tuple[int, ...]
) -> torch.Tensor:
    """One all-gather whose receive buffer becomes the global tensor.

    Pieces arrive in memory order, each padded to the largest; unless a short piece is
    followed by a non-empty one, no byte moves after the collective (the result is a
    view of the receive buffer). Otherwise the later pieces slide left, once each.
    """
    flat = dm[tuple(m for m in dims if dm.size(m) > 1)].flatten()
    sizes = [_numel(spec.local_shape(r)) for r in flat.group_ranks(0)]
    recv, width = _gather_padded(value, flat, sizes)
    return _assemble_in_order(recv, width, sizes, spec.global_shape)


def _assemble_in_order(
    recv: torch.Tensor, width: int, sizes: Sequence[int], shape: Sequence[int]
) -> torch.Tensor:
    """Close the padding gaps of ``recv`` in place; a view of it shaped ``shape``."""
    offset = 0
    for j, n in enumerate(sizes):
        start = j * width
        if n and offset != start:
            piece = recv[start : start + n]
            if offset + n > start:  # source and destination overlap
                piece = piece.clone()
            recv[offset : offset + n] = piece
        offset += n
    return recv[:offset].view(tuple(shape))


def redistribute(
    local: torch.Tensor,
    src_spec: ShardingSpec,
    dst_spec: ShardingSpec,
    dm: DistributedMesh,
) -> torch.Tensor:
    """``local`` (this rank's piece under ``src_spec``) re-laid out under ``dst_spec``.

    Each destination element has exactly one sender: among the ranks holding it, the one
    whose coordinates on ``src_spec``'s unsharded mesh dims equal the receiver's (so data
    already in place never moves). One ``all_to_all_single`` over the flattened sub-mesh.
    ``Partial`` dims must be the same in both specs (no reduction happens here).
    """
    dm._require_member("redistribute")
    _check_redistribute(local, src_spec, dst_spec, dm)
    flat = dm.flatten()
    plan = _Exchange(local, src_spec, dst_spec, dm.rank, flat.group_ranks(0))
    recv = local.new_empty(sum(plan.recv_sizes))
    all_to_all(_bounded(flat, 0, "redistribute"), recv, plan.send, plan.recv_sizes, plan.send_sizes)
    return plan.unpack(recv)


def _check_redistribute(
    local: torch.Tensor, src_spec: ShardingSpec, dst_spec: ShardingSpec, dm: DistributedMesh
) -> None:
    for spec in (src_spec, dst_spec):
        _same_mesh(spec, dm)
    if src_spec.global_shape != dst_spec.global_shape:
        raise ValueError(
            f"global shapes differ: {src_spec.global_shape} vs {dst_spec.global_shape}"
        )
    partial_src = {m: p for m, p in enumerate(src_spec.placements()) if isinstance(p, Partial)}
    partial_dst = {m: p for m, p in enumerate(dst_spec.placements()) if isinstance(p, Partial)}
    if partial_src != partial_dst:
        raise NotImplementedError(
            f"redistribute moves data only; Partial dims differ ({partial_src} vs {partial_dst}): "
            "reduce with full_tensor or a collective first"
        )
    _check_local(local, src_spec, dm.rank, "src_spec")


class _Exchange:
    """What this rank sends to and receives from each member, in member order.

    A destination element is sent by the holder whose coordinates on the source's
    unsharded (Replicate / Partial) mesh dims equal the receiver's, so each element
    moves at most once and data already in place is copied locally into ``out``.
    The boxes of a (sender, receiver) pair are a pure function of the specs and ranks, so
    sender and receiver agree on their order without communicating.
    """

    def __init__(
        self,
        local: torch.Tensor,
        src_spec: ShardingSpec,
        dst_spec: ShardingSpec,
        me: int,
        members: Sequence[int],
    ) -> None:
        mesh = dst_spec.mesh
        assert isinstance(mesh, Mesh)
        unsharded = [
            m for m, p in enumerate(src_spec.placements()) if isinstance(p, (Replicate, Partial))
        ]
        self.out = local.new_empty(dst_spec.local_shape(me))
        parts: list[torch.Tensor] = []
        self.send_sizes: list[int] = []
        self.recv_sizes: list[int] = []
        self.recv_regions: list[list[tuple[slice, ...]]] = []
        for peer in members:
            if peer == me:  # data already in place: a local copy
                for s, d in _pairs(src_spec, me, dst_spec, me):
                    self.out[d] = local[s]
            sends = peer != me and _same_coords(mesh, me, peer, unsharded)
            boxes = _pairs(src_spec, me, dst_spec, peer) if sends else []
            parts.extend(local[s].reshape(-1) for s, _ in boxes)
            self.send_sizes.append(sum(_numel(local[s].shape) for s, _ in boxes))
            receives = peer != me and _same_coords(mesh, peer, me, unsharded)
            regions = [d for _, d in _pairs(src_spec, peer, dst_spec, me)] if receives else []
            self.recv_regions.append(regions)
            self.recv_sizes.append(sum(_numel(self.out[d].shape) for d in regions))
        self.send = torch.cat(parts) if parts else local.new_empty(0)

    def unpack(self, recv: torch.Tensor) -> torch.Tensor:
        """``out`` with the received elements (concatenated in member order) in place."""
        offset = 0
        for regions in self.recv_regions:
            for d in regions:
                region = self.out[d]
                n = region.numel()
                self.out[d] = recv[offset : offset + n].reshape(region.shape)
                offset += n
        return self.out


def _same_coords(mesh: Mesh, a: int, b: int, dims: Sequence[int]) -> bool:
    ca, cb = mesh.coordinate(a), mesh.coordinate(b)
    assert ca is not None and cb is not None
    return all(ca[m] == cb[m] for m in dims)
