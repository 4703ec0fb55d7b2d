"""Reshard a tensor between two parallel configurations with one collective.

:func:`reshard` executes :func:`meshlayout.sharding.reshard_plan` (``docs/reshard.md``): the
source and destination are two :class:`~meshlayout.sharding.ShardingSpec` of one
global shape whose meshes may differ in shape, names and rank map, on rank sets that
are equal, overlap or are disjoint (trainer FSDP -> inference TP weight sync, a job
restarted on another number of ranks).

How one call runs on a rank of the *union* of both rank sets:

1. **Schedule** (cached per ``(src_spec, dst_spec, rank)``): this rank's transfers
   from the plan, as slices of the local pieces, grouped per peer of the union group
   (sorted global ranks). Local copies (the rank already holds the element) are
   plain copies, never sent.
2. **First call with a spec pair (or a new dtype for it) only:** the union's ranks
   compare the two specs and the source dtype through the default store
   (``check_consistent``, O(1) store operations per rank); a disagreement raises
   :class:`MeshMismatchError` on every rank, absent ranks are named in a
   :class:`RankTimeoutError`.
3. **Dtype for destination-only ranks:** when some destination rank holds no source
   piece, the lowest source rank posts the dtype in the store and those ranks read
   it (one ``set``; three operations per reader). Otherwise nothing is exchanged.
4. **One** ``all_to_all_single`` over the union group (created by its members only,
   cached), bounded by ``timeout`` and naming the ranks that never reached it;
   skipped on every rank when the plan moves nothing. Send buffers are the boxes
   sliced out of ``local`` and packed; when the boxes already lie contiguous in
   ``local`` (or in the result) in peer order, the buffer is a view and no packing
   (unpacking) copy happens.

Example (4 ranks; FSDP over ranks 0-3 -> TP over ranks 2-3)::

    fsdp = ShardingSpec((1024, 512), Mesh({"dp": 4}), [Shard(0)])
    tp = ShardingSpec((1024, 512), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])
    out = reshard(local, fsdp, tp)  # ranks 2, 3: a (1024, 256) piece; ranks 0, 1: None
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..mesh import Mesh
from ..sharding import Partial, ReshardPlan, ShardingSpec, local_slices, reshard_plan
from . import _c10d
from ._check import check_consistent, check_in_world, rank_map_summary, rank_set_digest
from ._collectives import Bounded, all_to_all
from ._errors import RankTimeoutError, format_ranks
from ._groups import get_group
from ._store import as_timedelta

__all__ = ["reshard"]

Slices = tuple[slice, ...]
# A flat element range [start, stop) of a contiguous tensor.
FlatRange = tuple[int, int]


@dataclass(frozen=True)
class _Schedule:
    """What one rank does in one reshard (a pure function of the specs and the rank).

    Buffers list their boxes in peer order (union members ascending); ``*_counts``
    are elements per peer. ``*_flat`` is set when those boxes tile one contiguous
    element range of the piece, in order: the buffer is then a view of it.
    """

    members: tuple[int, ...]
    in_src: bool
    in_dst: bool
    src_shape: tuple[int, ...]
    dst_shape: tuple[int, ...]
    moves: bool  # the plan sends something (on any rank): the collective runs
    send_counts: tuple[int, ...]
    send_boxes: tuple[Slices, ...]
    send_flat: FlatRange | None
    recv_counts: tuple[int, ...]
    recv_boxes: tuple[Slices, ...]
    recv_flat: FlatRange | None
    copies: tuple[tuple[Slices, Slices], ...]  # (src-local, dst-local) copied directly
    fingerprint: str  # identical on every rank that holds the same two specs
    fields: tuple[tuple[str, str], ...]  # readable spec fields for the first-call check
    dtype_poster: int | None  # source rank posting the dtype (destination-only ranks exist)
    dtype_readers: tuple[int, ...]  # destination ranks outside the source, ascending
    union_digest: str  # rank_set_digest(members), for store keys


def reshard(
    local: torch.Tensor | None,
    src_spec: ShardingSpec,
    dst_spec: ShardingSpec,
    *,
    timeout: timedelta | float | None = None,
) -> torch.Tensor | None:
    """This rank's piece under ``dst_spec`` of the tensor laid out by ``src_spec``.

    Collective over the union of both specs' rank sets: every rank of that union
    calls it (others must not). ``local`` is this rank's piece under ``src_spec``
    (ignored, may be None, on ranks outside the source mesh) and is never modified.
    Returns a new contiguous tensor on destination ranks — dtype and device type of
    the source pieces, also on destination-only ranks — and None elsewhere.

    Each destination element is delivered exactly once, by the sender the plan
    chooses; elements this rank already holds are copied locally. One
    ``all_to_all_single`` over the union group (none if nothing moves), bounded by
    ``timeout`` (seconds or ``timedelta``; default: c10d's default for the backend);
    a rank that never reaches it is named in a
    :class:`~meshlayout.torch.RankTimeoutError` on the others. The first call with a
    spec pair, and a call whose dtype differs from the pair's last check on this
    rank, check that every rank of the union holds the same specs and dtype
    (:class:`~meshlayout.torch.MeshMismatchError` on every rank otherwise; a rank
    that alone changes dtype later is named by a timeout on both sides). Not
    differentiable (the result does not require grad).
    """
    _check_specs(src_spec, dst_spec)
    if not dist.is_initialized():
        raise RuntimeError(
            "reshard needs an initialised default process group: launch with torchrun "
            "(or call torch.distributed.init_process_group) first"
        )
    _fresh_world()
    for side, spec in (("src_spec", src_spec), ("dst_spec", dst_spec)):
        check_in_world(spec.mesh, f"reshard: {side} on {spec.mesh!r}")
    me = dist.get_rank()
    sched = _schedule(src_spec, dst_spec, me)
    source: torch.Tensor | None = None
    if sched.in_src:
        source = _check_local(local, src_spec, me, sched.src_shape)
    td = as_timedelta(timeout, _c10d.default_timeout())
    kind = _exchange_dtype(sched, me, source, td)
    if _CHECKED.get(sched.fingerprint) != kind:
        check_consistent(
            dict(sched.fields) | {"dtype": kind},
            sched.members,
            timeout=td,
            what="reshard",
            set_digest=sched.union_digest,
        )
        _CHECKED[sched.fingerprint] = kind
    dtype, device = (source.dtype, source.device) if source is not None else _parse_dtype(kind)
    out = torch.empty(sched.dst_shape, dtype=dtype, device=device) if sched.in_dst else None
    if out is not None and source is not None:
        for s, d in sched.copies:
            out[d] = source[s]
    if sched.moves:
        group = get_group(sched.members, timeout=td, group_desc="meshlayout_reshard")
        send = _send_buffer(sched, source, dtype, device)
        recv = _recv_buffer(sched, out, dtype, device)
        size = torch.empty((), dtype=dtype).element_size()
        all_to_all(
            Bounded(group, sched.members, td, "reshard"),
            _bytes(recv),
            _bytes(send),
            [n * size for n in sched.recv_counts],
            [n * size for n in sched.send_counts],
        )
        if out is not None and sched.recv_flat is None:
            _unpack(recv, out, sched.recv_boxes)
    return out


# ---------------------------------------------------------------------- validation
def _check_specs(src_spec: ShardingSpec, dst_spec: ShardingSpec) -> None:
    for name, spec in (("src_spec", src_spec), ("dst_spec", dst_spec)):
        if not isinstance(spec, ShardingSpec):
            raise TypeError(f"{name} must be a meshlayout ShardingSpec, got {type(spec).__name__}")
        if not isinstance(spec.mesh, Mesh):
            raise TypeError(
                f"{name} must be over a meshlayout Mesh (global ranks), got "
                f"{type(spec.mesh).__name__}"
            )
        partial = [p for p in spec.placements() if isinstance(p, Partial)]
        if partial:
            raise ValueError(
                f"{name} has {partial[0]!r}: reshard moves data only; reduce first "
                "(e.g. full_tensor or an all_reduce)"
            )
    if src_spec.global_shape != dst_spec.global_shape:
        raise ValueError(
            f"src_spec and dst_spec describe different global shapes: "
            f"{src_spec.global_shape} vs {dst_spec.global_shape}"
        )


def _check_local(
    local: object, spec: ShardingSpec, rank: int, shape: tuple[int, ...]
) -> torch.Tensor:
    if not isinstance(local, torch.Tensor):
        raise TypeError(
            f"rank {rank} is in the source mesh {spec.mesh!r}: local must be its piece "
            f"(a torch.Tensor of shape {shape}), got {type(local).__name__}"
        )
    if tuple(local.shape) != shape:
        raise ValueError(
            f"local piece of rank {rank} has shape {tuple(local.shape)}, src_spec says "
            f"{shape} (placements {list(spec.placements())} of {spec.global_shape})"
        )
    if local.is_sparse or local.layout != torch.strided:
        raise ValueError(f"local must be a dense (strided) tensor, got layout {local.layout}")
    if local.device.type == "meta":
        raise ValueError("local is a meta tensor: it has no data to send")
    return local.detach()


# ---------------------------------------------------------------------- schedule
def _ranks_of(spec: ShardingSpec) -> np.ndarray:
    mesh = spec.mesh
    assert isinstance(mesh, Mesh)
    return mesh.rank_map.to_numpy()


def _pair(
    src_spec: ShardingSpec, dst_spec: ShardingSpec
) -> tuple[ReshardPlan, tuple[int, ...], str, tuple[tuple[str, str], ...]]:
    """(plan, union members ascending, fingerprint, readable fields) of a spec pair."""
    plan = reshard_plan(src_spec, dst_spec)
    members = tuple(int(r) for r in np.union1d(_ranks_of(src_spec), _ranks_of(dst_spec)))
    fields = (("src_spec", _spec_text(src_spec)), ("dst_spec", _spec_text(dst_spec)))
    text = "\n".join(v for _, v in fields)
    digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:20]
    return plan, members, digest, fields


def _spec_text(spec: ShardingSpec) -> str:
    """Everything that defines a spec, as short text identical across processes."""
    mesh = spec.mesh
    assert isinstance(mesh, Mesh)
    return (
        f"{spec.global_shape} over {mesh.names}={mesh.shape} "
        f"axes {' '.join(str(a) for a in mesh.axes)} ranks {rank_map_summary(mesh.rank_map)} "
        f"placements {list(spec.placements())}"
    )


@functools.lru_cache(maxsize=1024)  # weight sync: one entry per parameter, reused every step
def _schedule(src_spec: ShardingSpec, dst_spec: ShardingSpec, me: int) -> _Schedule:
    plan, members, fingerprint, fields = _pair(src_spec, dst_spec)
    if me not in members:
        raise ValueError(
            f"rank {me} is in neither the source mesh {src_spec.mesh!r} nor the "
            f"destination mesh {dst_spec.mesh!r}: only ranks of their union "
            f"{format_ranks(members)} call reshard"
        )
    index = {r: i for i, r in enumerate(members)}
    src_ranks = _ranks_of(src_spec)
    readers = tuple(int(r) for r in np.setdiff1d(_ranks_of(dst_spec), src_ranks))
    in_src, in_dst = me in src_spec.mesh, me in dst_spec.mesh
    src_shape = src_spec.local_shape(me) if in_src else ()
    dst_shape = dst_spec.local_shape(me) if in_dst else ()

    def per_peer(transfers: Any, peer_of: str, spec: ShardingSpec) -> dict[int, list[Slices]]:
        out: dict[int, list[Slices]] = {}
        ordered = sorted(transfers, key=lambda t: (index[getattr(t, peer_of)], t.box))
        for t in ordered:
            if math.prod(b - a for a, b in t.box) == 0:
                continue
            out.setdefault(index[getattr(t, peer_of)], []).append(local_slices(spec, me, t.box))
        return out

    sends = per_peer(plan.sends(me), "dst_rank", src_spec) if in_src else {}
    recvs = per_peer(plan.receives(me), "src_rank", dst_spec) if in_dst else {}
    mine = index[me]
    # Local copies: boxes this rank holds in both specs (same order on both sides).
    own = sorted(plan.local_copies(me), key=lambda t: t.box) if in_src and in_dst else []
    own = [t for t in own if math.prod(b - a for a, b in t.box)]
    self_send = [local_slices(src_spec, me, t.box) for t in own]
    self_recv = [local_slices(dst_spec, me, t.box) for t in own]
    n = len(members)
    # Option "through": the local copies ride in the collective's self slot (gloo and
    # NCCL copy it locally) so that the receive buffer can be the result itself.
    through = _choose_through(src_shape, dst_shape, sends, recvs, mine, self_send, self_recv)
    if through:
        sends[mine], recvs[mine] = self_send, self_recv
        copies: tuple[tuple[Slices, Slices], ...] = ()
    else:
        copies = tuple(zip(self_send, self_recv))
    send_boxes = tuple(b for j in sorted(sends) for b in sends[j])
    recv_boxes = tuple(b for j in sorted(recvs) for b in recvs[j])
    return _Schedule(
        members=members,
        in_src=in_src,
        in_dst=in_dst,
        src_shape=src_shape,
        dst_shape=dst_shape,
        moves=plan.elements_moved > 0,
        send_counts=tuple(sum(_numel(b) for b in sends.get(j, ())) for j in range(n)),
        send_boxes=send_boxes,
        send_flat=_flat_range(src_shape, send_boxes) if in_src else None,
        recv_counts=tuple(sum(_numel(b) for b in recvs.get(j, ())) for j in range(n)),
        recv_boxes=recv_boxes,
        recv_flat=_flat_range(dst_shape, recv_boxes) if in_dst else None,
        copies=copies,
        fingerprint=fingerprint,
        fields=fields,
        dtype_poster=int(src_ranks.min()) if readers else None,
        dtype_readers=readers,
        union_digest=rank_set_digest(members),
    )


def _choose_through(
    src_shape: tuple[int, ...],
    dst_shape: tuple[int, ...],
    sends: dict[int, list[Slices]],
    recvs: dict[int, list[Slices]],
    mine: int,
    self_send: list[Slices],
    self_recv: list[Slices],
) -> bool:
    """True if routing local copies through the self slot copies fewer elements.

    Elements copied by us: packing (unless the send boxes tile ``local``), unpacking
    (unless the receive boxes tile the result) and the direct local copies.
    """
    if not self_recv:
        return False

    def cost(with_self: bool) -> int:
        s = dict(sends)
        r = dict(recvs)
        extra = 0
        if with_self:
            s[mine], r[mine] = self_send, self_recv
        else:
            extra = sum(_numel(b) for b in self_recv)
        sb = [b for j in sorted(s) for b in s[j]]
        rb = [b for j in sorted(r) for b in r[j]]
        pack = 0 if _flat_range(src_shape, sb) else sum(_numel(b) for b in sb)
        unpack = 0 if _flat_range(dst_shape, rb) else sum(_numel(b) for b in rb)
        # Through the self slot, the collective itself copies the local part once more.
        return pack + unpack + extra + (sum(_numel(b) for b in self_recv) if with_self else 0)

    return cost(True) < cost(False)


def _numel(slices: Slices) -> int:
    return math.prod(s.stop - s.start for s in slices)


def _flat_range(shape: tuple[int, ...], boxes: Sequence[Slices]) -> FlatRange | None:
    """The element range ``boxes`` tile, in order, in a contiguous tensor of ``shape``.

    None unless every box is one contiguous block of row-major memory and each block
    starts where the previous one ends.

    >>> _flat_range((4, 3), [(slice(0, 2), slice(0, 3)), (slice(2, 3), slice(0, 3))])
    (0, 9)
    >>> _flat_range((4, 3), [(slice(0, 2), slice(0, 2))]) is None  # rows not whole
    True
    """
    start: int | None = None
    end = 0
    for box in boxes:
        n = _numel(box)
        if n == 0:
            continue
        block = _block_start(shape, box)
        if block is None or (start is not None and block != end):
            return None
        if start is None:
            start = block
        end = block + n
    return (start, end) if start is not None else (0, 0)


def _block_start(shape: tuple[int, ...], box: Slices) -> int | None:
    """Flat offset of ``box`` if it is one contiguous row-major block, else None."""
    k = len(shape) - 1
    while k >= 0 and box[k].start == 0 and box[k].stop == shape[k]:
        k -= 1  # trailing whole dims
    if any(box[d].stop - box[d].start != 1 for d in range(k)):
        return None  # a dim before the first partial one spans several indices
    offset = 0
    for d, s in enumerate(shape):
        offset = offset * s + box[d].start
    return offset


# ---------------------------------------------------------------------- dtype exchange
# Spec pair (fingerprint) -> the dtype its last check was made with. A rank checks on
# the first call with a pair and whenever its dtype for the pair changes. Never
# evicted: whether a rank checks must not depend on its cache history.
_CHECKED: dict[str, str] = {}
# Per union: dtype exchanges this process has taken part in (the store key's index).
_EXCHANGES: dict[str, int] = {}
# The default group both tables belong to: a new one (and its store) starts afresh.
_WORLD: list[object] = [None]


def _fresh_world() -> None:
    world = dist.group.WORLD
    if world is not _WORLD[0]:
        _CHECKED.clear()
        _EXCHANGES.clear()
        _WORLD[0] = world


def _dtype_text(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}|{t.device.type}"


def _exchange_dtype(
    sched: _Schedule, me: int, source: torch.Tensor | None, timeout: timedelta
) -> str:
    """``"<dtype>|<device type>"`` of the source pieces, as this rank knows or learns it.

    Only when destination-only ranks exist: the lowest source rank posts it under a
    per-union counter; each destination-only rank waits for it (at most ``timeout``,
    naming the poster otherwise) and reads it; the last reader deletes the keys, so
    the store does not grow with the number of calls.
    """
    poster = sched.dtype_poster
    if poster is None:  # every destination rank holds a source piece: nothing to tell
        assert source is not None  # a rank without one is a destination-only rank
        return _dtype_text(source)
    # Every member counts the exchanges of its union (a property of the spec pair), so
    # poster and readers agree on the key whichever other pairs they took part in.
    digest = sched.union_digest
    n = _EXCHANGES.get(digest, 0)
    _EXCHANGES[digest] = n + 1
    if source is not None and me != poster:
        return _dtype_text(source)
    key = f"meshlayout/reshard/{digest}/dtype/{n}"
    store = _c10d.default_store()
    if source is not None:
        kind = _dtype_text(source)
        store.set(key, kind)
        return kind
    try:
        store.wait([key], timeout)
    except Exception as exc:  # DistStoreError / RuntimeError on timeout
        if not store.check([key]):
            raise RankTimeoutError(
                f"reshard: destination-only rank {me} waited {timeout.total_seconds():g}s "
                f"for the dtype from source rank {poster}, which did not post it",
                missing=[poster],
            ) from exc
    kind = store.get(key).decode()
    if store.add(f"{key}/read", 1) == len(sched.dtype_readers):
        store.delete_key(key)
        store.delete_key(f"{key}/read")
    return kind


def _parse_dtype(text: str) -> tuple[torch.dtype, torch.device]:
    name, device_type = text.split("|")
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    if device_type == "cpu":
        return dtype, torch.device("cpu")
    module = torch.get_device_module(device_type)
    return dtype, torch.device(device_type, module.current_device())


# ---------------------------------------------------------------------- buffers
def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D contiguous tensor's bytes (the collective moves bits, any dtype)."""
    return t.view(torch.uint8)


def _send_buffer(
    sched: _Schedule, source: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if source is None or not sched.send_boxes:
        return torch.empty(0, dtype=dtype, device=device)
    flat = sched.send_flat
    if flat is not None and source.is_contiguous():
        return source.view(-1)[flat[0] : flat[1]]
    if len(sched.send_boxes) == 1:
        return source[sched.send_boxes[0]].reshape(-1).contiguous()
    return torch.cat([source[b].reshape(-1) for b in sched.send_boxes])


def _recv_buffer(
    sched: _Schedule, out: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if out is not None and sched.recv_flat is not None:
        return out.view(-1)[sched.recv_flat[0] : sched.recv_flat[1]]
    return torch.empty(sum(sched.recv_counts), dtype=dtype, device=device)


def _unpack(recv: torch.Tensor, out: torch.Tensor, boxes: Sequence[Slices]) -> None:
    offset = 0
    for box in boxes:
        region = out[box]
        n = region.numel()
        region.copy_(recv[offset : offset + n].view(region.shape))
        offset += n
