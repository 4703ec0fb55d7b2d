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

Example (4 ranks)::

    dm = init_mesh(Mesh({"dp": 2, "tp": 2}))
    spec = ShardingSpec((7, 4), dm.mesh, [StridedShard(0, 2), Shard(0)])  # FSDP over TP
    local = distribute(weight, dm, spec)
    assert torch.equal(full_tensor(local, dm, spec), weight)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..sharding import Partial, Replicate, Shard, ShardingSpec, StridedShard
from ._mesh import DistributedMesh

__all__ = ["distribute", "full_tensor", "redistribute"]

Runs = tuple[tuple[int, int], ...]

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
    if spec.mesh != dm.mesh:
        raise ValueError(f"the spec is over {spec.mesh!r}, the DistributedMesh over {dm.mesh!r}")
    if tuple(spec.global_shape) != tuple(int(s) for s in shape):
        raise ValueError(
            f"tensor shape {tuple(shape)} does not match the spec's global_shape "
            f"{spec.global_shape}"
        )
    return spec


def _local_index(runs: Runs) -> list[tuple[int, int, int]]:
    """Per run: (global start, global stop, local start)."""
    out, offset = [], 0
    for a, b in runs:
        out.append((a, b, offset))
        offset += b - a
    return out


def _boxes(
    src_runs: Sequence[Runs], dst_runs: Sequence[Runs]
) -> list[tuple[tuple[slice, ...], tuple[slice, ...]]]:
    """Intersections of a src piece with a dst piece: (src-local slices, dst-local slices).

    The order is a pure function of the two run lists, so sender and receiver agree.
    """
    per_dim: list[list[tuple[slice, slice]]] = []
    for s_runs, d_runs in zip(src_runs, dst_runs):
        pairs = []
        for sa, sb, so in _local_index(s_runs):
            for da, db, do in _local_index(d_runs):
                lo, hi = max(sa, da), min(sb, db)
                if lo < hi:
                    pairs.append(
                        (slice(so + lo - sa, so + hi - sa), slice(do + lo - da, do + hi - da))
                    )
        if not pairs:
            return []
        per_dim.append(pairs)
    return [
        (tuple(p[0] for p in combo), tuple(p[1] for p in combo))
        for combo in itertools.product(*per_dim)
    ]


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
    if src is not None and dm.mesh.size() > 1:
        flat = dm.flatten()
        group = flat.get_group(0)
        members = flat.group_ranks(0)
        if not 0 <= src < len(members):
            raise ValueError(f"src={src} is not a flat coordinate of a {dm.shape} mesh")
        tensor = tensor.detach().clone().contiguous()
        dist.broadcast(tensor, members[src], group=group)
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
    if spec.mesh != dm.mesh:
        raise ValueError(f"the spec is over {spec.mesh!r}, the DistributedMesh over {dm.mesh!r}")
    want = spec.local_shape(dm.rank)
    if tuple(local.shape) != want:
        raise ValueError(
            f"local piece of rank {dm.rank} has shape {tuple(local.shape)}, spec says {want}"
        )
    placements = spec.placements()
    value = local
    for m, p in enumerate(placements):
        if isinstance(p, Partial):
            value = value.clone() if value is local else value
            dist.all_reduce(value, op=_REDUCE[p.reduce_op], group=dm.get_group(m))
            if p.reduce_op == "avg":
                value = value / dm.size(m)
    sharding = [m for m, p in enumerate(placements) if not isinstance(p, (Replicate, Partial))]
    if not sharding or all(dm.size(m) == 1 for m in sharding):
        return value.clone() if value is local else value
    in_order = _pieces_in_memory_order(spec)
    if in_order is not None:
        return _gather_in_order(value, dm, spec, in_order)
    flat = dm[tuple(sharding)].flatten()
    members = flat.group_ranks(0)
    runs = [spec.local_runs(r) for r in members]
    shapes = [tuple(sum(b - a for a, b in rr) for rr in per) for per in runs]
    sizes = [_numel(s) for s in shapes]
    width = max(sizes)
    if _numel(value.shape) == width:  # no padding needed: send the piece itself
        send = value.contiguous().reshape(-1)
    else:
        send = torch.zeros(width, dtype=local.dtype, device=local.device)
        send[: _numel(value.shape)] = value.reshape(-1)
    recv = torch.empty(width * len(members), dtype=local.dtype, device=local.device)
    dist.all_gather_single(recv, send, group=flat.get_group(0))
    out = torch.empty(spec.global_shape, dtype=local.dtype, device=local.device)
    whole: tuple[Runs, ...] = tuple(((0, s),) if s else () for s in spec.global_shape)
    for j, (per, shape, n) in enumerate(zip(runs, shapes, sizes)):
        if n == 0:
            continue
        piece = recv[j * width : j * width + n].reshape(shape)
        for src_sl, dst_sl in _boxes(per, whole):
            out[dst_sl] = piece[src_sl]
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
    members = flat.group_ranks(0)
    sizes = [_numel(spec.local_shape(r)) for r in members]
    width = max(sizes)
    mine = _numel(value.shape)
    if mine == width:
        send = value.contiguous().reshape(-1)
    else:
        send = value.new_empty(width)
        send[:mine] = value.reshape(-1)
    recv = value.new_empty(width * len(members))
    dist.all_gather_single(recv, send, group=flat.get_group(0))
    offset = 0
    for j, n in enumerate(sizes):
        start = j * width
        if n and offset != start:
            piece = recv[start : start + n]
            if offset + n > start:  # source and destination overlap
                piece = piece.clone()
            recv[offset : offset + n] = piece
        offset += n
    return recv[:offset].view(spec.global_shape)


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
    for spec in (src_spec, dst_spec):
        if spec.mesh != dm.mesh:
            raise ValueError(f"a spec is over {spec.mesh!r}, the DistributedMesh over {dm.mesh!r}")
    if src_spec.global_shape != dst_spec.global_shape:
        raise ValueError(
            f"global shapes differ: {src_spec.global_shape} vs {dst_spec.global_shape}"
        )
    src_p, dst_p = src_spec.placements(), dst_spec.placements()
    partial_src = {m: p for m, p in enumerate(src_p) if isinstance(p, Partial)}
    partial_dst = {m: p for m, p in enumerate(dst_p) if isinstance(p, Partial)}
    if partial_src != partial_dst:
        raise NotImplementedError(
            f"redistribute moves data only; Partial dims differ ({partial_src} vs {partial_dst}): "
            "reduce with full_tensor or a collective first"
        )
    if tuple(local.shape) != src_spec.local_shape(dm.rank):
        raise ValueError(
            f"local piece of rank {dm.rank} has shape {tuple(local.shape)}, "
            f"src_spec says {src_spec.local_shape(dm.rank)}"
        )
    me = dm.rank
    mesh = dm.mesh
    unsharded = [m for m, p in enumerate(src_p) if isinstance(p, (Replicate, Partial))]
    my_coord = mesh.coordinate(me)
    assert my_coord is not None
    out = torch.empty(dst_spec.local_shape(me), dtype=local.dtype, device=local.device)
    flat = dm.flatten()
    members = flat.group_ranks(0)

    def sender_ok(sender: int, receiver: int) -> bool:
        cs, cr = mesh.coordinate(sender), mesh.coordinate(receiver)
        assert cs is not None and cr is not None
        return all(cs[m] == cr[m] for m in unsharded)

    my_src = src_spec.local_runs(me)
    my_dst = dst_spec.local_runs(me)
    send_parts: list[torch.Tensor] = []
    send_sizes: list[int] = []
    recv_plans: list[list[tuple[slice, ...]]] = []
    recv_sizes: list[int] = []
    for peer in members:
        # What I send to peer.
        if peer != me and sender_ok(me, peer):
            boxes = _boxes(my_src, dst_spec.local_runs(peer))
            parts = [local[s].reshape(-1) for s, _ in boxes]
            send_parts.extend(parts)
            send_sizes.append(sum(p.numel() for p in parts))
        else:
            send_sizes.append(0)
        # What I receive from peer.
        if peer == me:
            for s, d in _boxes(my_src, my_dst):
                out[d] = local[s]
            recv_plans.append([])
            recv_sizes.append(0)
        elif sender_ok(peer, me):
            boxes = _boxes(src_spec.local_runs(peer), my_dst)
            recv_plans.append([d for _, d in boxes])
            recv_sizes.append(sum(_numel(out[d].shape) for _, d in boxes))
        else:
            recv_plans.append([])
            recv_sizes.append(0)
    send = torch.cat(send_parts) if send_parts else local.new_empty(0)
    recv = local.new_empty(sum(recv_sizes))
    if len(members) > 1:
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=flat.get_group(0))
    offset = 0
    for plan in recv_plans:
        for d in plan:
            region = out[d]
            n = region.numel()
            out[d] = recv[offset : offset + n].reshape(region.shape)
            offset += n
    return out
