"""Move a whole model between parallel layouts: bounded rounds of one collective each.

:class:`WeightTransfer` executes :func:`meshlayout.sharding.transfer_plan`
(``docs/transfer.md``): an RL trainer (FSDP2 + TP) pushing every parameter to inference
workers (TP, often on other ranks) after each step, or a job restarted on another layout.

Construction (collective over the union of both rank sets; other ranks do not call it):

1. **Metadata** through the default store (or a sync group's, ``group=``), bounded by ``timeout``: each side posts its
   rank set, then every rank posts (a digest of) what it holds: per name, the spec and
   dtype of its source piece and of its destination piece (:mod:`._meta`). The lowest rank of the
   union reads each distinct post once, checks that ranks agree, that every rank of a
   tensor's mesh passed it and that both sides name the same tensors, and posts the
   verdict; on a disagreement every rank raises
   :class:`~meshlayout.torch.MeshMismatchError` naming the tensors and ranks, before
   any data moves; absent ranks are named in a
   :class:`~meshlayout.torch.RankTimeoutError`. O(1) store operations per rank (the
   lowest: O(ranks)).
2. **Plan** (pure, identical on every rank) and this rank's schedule: per round, the
   boxes it packs and unpacks as slices of its local pieces with their byte offsets.
3. **Buffers**: one send and one receive byte buffer, each the largest round's size
   for this rank (at most ``bucket_bytes``), allocated once.

:meth:`WeightTransfer.run` then copies local boxes directly, and per round packs
(casting to the destination dtype), runs **one** ``all_to_all_single`` over the union
group (created by its members only) and unpacks into the destination pieces, which
may be caller-owned views (``out=``, e.g. the q rows of a fused qkv weight). Repeated
runs reuse the plan, schedule and buffers: nothing is planned or allocated again
(except the results when ``out`` is not given).

``verify=True`` adds one small all-reduce (12 int64 per tensor): per tensor, an
order-independent, position-aware fingerprint (:mod:`meshlayout.torch.transfer._fingerprint`:
the sum mod 2^64 of every 8-byte limb of each row, in the destination dtype, times
odd pseudo-random weights of its global row and limb; one ``torch.mv`` per box,
about the cost of copying the data) of (a) the source elements, each counted once
(the lowest holder of each piece), (b) every source holder's piece and (c) every
destination piece; (b) must equal the holders per piece times (a) (else source
replicas disagree) and (c) the destination holders per piece times (a) (else a
destination element is wrong). See ``docs/transfer.md``.

Example (ranks 0-3 train with FSDP over TP, ranks 4-5 serve with TP)::

    wt = WeightTransfer(
        {n: p for n, p in model.named_parameters()} if training else None,
        {n: (spec, torch.bfloat16) for n, spec in serving_specs.items()} if serving else None,
    )
    weights = wt.run()              # every step: ranks 4-5 get their bf16 TP pieces
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ...sharding import ShardingSpec, TransferPlan, intersect, local_slices, pieces, run_boxes
from ...sharding import transfer_plan as _transfer_plan
from .. import _c10d
from .._check import check_in_world
from .._collectives import Bounded, all_reduce, all_to_all
from .._errors import TransferVerificationError
from .._groups import get_group
from .._store import as_timedelta
from ._fingerprint import MASK64, Fingerprinter
from ._meta import (
    check_piece,
    dest_entry,
    dtype_name,
    dtype_of,
    exchange,
    is_dtensor,
    source_piece,
)
from ._sync import SyncGroup, check_members

__all__ = ["WeightTransfer", "transfer"]

Slices = tuple[slice, ...]
_CAST_CHUNK = 1 << 22  # bytes cast at a time when a packed piece is not aligned


@dataclass(frozen=True)
class _Item:
    """One box in this rank's buffer: slices of its local piece, byte offset, size."""

    name: str
    slices: Slices
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Round:
    sends: tuple[_Item, ...]
    recvs: tuple[_Item, ...]
    send_sizes: tuple[int, ...]  # bytes per member of the union (ascending ranks)
    recv_sizes: tuple[int, ...]


# ---------------------------------------------------------------------- fingerprints
def _limbs(value: int) -> list[int]:
    return [(value >> (16 * k)) & 0xFFFF for k in range(4)]


def _unlimb(limbs: list[int]) -> int:
    return sum(v << (16 * k) for k, v in enumerate(limbs)) & MASK64


# ---------------------------------------------------------------------- the executor
class WeightTransfer:
    """A repeatable, exact transfer of a model between two parallel layouts (``docs/transfer.md``).

    ``src``: on source ranks, name -> DTensor (FSDP2, TP, HSDP, ...) or ``(local
    piece, ShardingSpec)``; None elsewhere. ``dst``: on destination ranks, name ->
    ``ShardingSpec`` or ``(ShardingSpec, dtype)`` (default dtype: the source's);
    None elsewhere. A rank on both sides passes both. Collective over the union of
    both rank sets (other ranks do not call it); the processes construct their
    WeightTransfers in the same order (the sides know only their own rank sets and
    meet by that count: a process outside one transfer's union must not construct
    another one meanwhile). ``bucket_bytes``: the most any rank sends, and
    receives, per round (its send and receive buffers are at most that big);
    ``ranks_per_host``: prefer same-host senders among replicas; ``timeout`` (seconds
    or ``timedelta``; default c10d's) bounds every wait and collective.
    ``buffers``: a ``(send, receive)`` pair of 1-d uint8 tensors to use instead of
    allocating (transfers that run one after another may share one pair of
    ``bucket_bytes`` each); ValueError if one is smaller than this transfer needs.

    ``group``: a :class:`~meshlayout.torch.SyncGroup` (:func:`~meshlayout.torch.sync_group`)
    for two separately launched worlds (a trainer's and an inference engine's): ranks
    in specs are then the sync group's ranks (a DTensor's mesh is translated from its
    default group's ranks), every member takes part, and the metadata exchange,
    collectives, timeouts and error reports use that group and its store only; no
    default process group is needed.

    Attributes: :attr:`plan` (the :class:`~meshlayout.sharding.TransferPlan`),
    :attr:`members` (the union, ascending), :attr:`send_buffer`,
    :attr:`recv_buffer` (the byte buffers, reused by every run).
    """

    def __init__(
        self,
        src: Mapping[str, Any] | None,
        dst: Mapping[str, Any] | None,
        *,
        bucket_bytes: int = 256 * 2**20,
        ranks_per_host: int | None = None,
        timeout: timedelta | float | None = None,
        group: SyncGroup | None = None,
        buffers: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        if group is not None and not isinstance(group, SyncGroup):
            raise TypeError(
                f"group must be a SyncGroup from meshlayout.torch.sync_group, got {group!r}"
            )
        if group is None and not dist.is_initialized():
            raise RuntimeError(
                "WeightTransfer needs an initialised default process group (launch with "
                "torchrun, or call torch.distributed.init_process_group) or group= a "
                "meshlayout.torch.sync_group"
            )
        for what, m in (("src", src), ("dst", dst)):
            if m is not None and not isinstance(m, Mapping):
                raise TypeError(f"{what} must be a mapping name -> value or None, got {m!r}")
        if not src and not dst:
            raise ValueError(
                "WeightTransfer: this rank passes neither source tensors nor destination "
                "specs; only ranks of the union of both sides call it"
            )
        me = dist.get_rank() if group is None else group.rank
        self.rank = me
        self.group = group
        default = _c10d.default_timeout() if group is None else group.timeout
        self.timeout = as_timedelta(timeout, default)
        self._sources: dict[str, torch.Tensor] = {}
        src_meta: dict[str, tuple[ShardingSpec, str]] = {}
        for name, value in (src or {}).items():
            rank_map = None if group is None or not is_dtensor(value) else group.rank_map()
            local, spec = source_piece(name, value, me, rank_map)
            self._sources[name] = local
            src_meta[name] = (spec, dtype_name(local.dtype))
        dst_meta: dict[str, tuple[ShardingSpec, str | None]] = {}
        for name, value in (dst or {}).items():
            spec, dtype = dest_entry(name, value)
            if me not in spec.mesh:
                raise ValueError(f"dst[{name!r}]: rank {me} is not in its mesh {spec.mesh!r}")
            dst_meta[name] = (spec, None if dtype is None else dtype_name(dtype))
        world = None if group is None else group.world_size
        seen: set[int] = set()
        for side, meta in (("src", src_meta), ("dst", dst_meta)):
            for name, (spec, _) in meta.items():
                if id(spec.mesh) not in seen:
                    seen.add(id(spec.mesh))
                    check_in_world(spec.mesh, f"WeightTransfer {side}[{name!r}]", world)
        self.members, (src_all, dst_all) = exchange(me, (src_meta, dst_meta), self.timeout, group)
        if group is not None:
            check_members(group, self.members, "WeightTransfer")
        self.src_specs: dict[str, ShardingSpec] = {n: s for n, (s, _) in src_all.items()}
        self.dst_specs: dict[str, ShardingSpec] = {n: s for n, (s, _) in dst_all.items()}
        self.dst_dtypes: dict[str, torch.dtype] = {
            n: dtype_of(d if d is not None else src_all[n][1]) for n, (_, d) in dst_all.items()
        }
        self._itemsize = {
            n: torch.empty((), dtype=d).element_size() for n, d in self.dst_dtypes.items()
        }
        self.plan: TransferPlan = _transfer_plan(
            self.src_specs,
            self.dst_specs,
            self._itemsize,
            bucket_bytes=bucket_bytes,
            ranks_per_host=ranks_per_host,
        )
        self._src_names = tuple(n for n in self.plan.names if me in self.src_specs[n].mesh)
        self._dst_names = tuple(n for n in self.plan.names if me in self.dst_specs[n].mesh)
        self._rounds = schedule(self.plan, self.src_specs, self.dst_specs, me)
        self._copies = tuple(
            (
                name,
                local_slices(self.src_specs[name], me, box),
                local_slices(self.dst_specs[name], me, box),
            )
            for name, box in self.plan.local_copies(me)
        )
        first = next(iter(self._sources.values()), None)
        if first is not None:
            self.device = first.device
        elif group is not None:
            self.device = group.device
        elif str(dist.get_backend()) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        send_max = max((sum(r.send_sizes) for r in self._rounds), default=0)
        recv_max = max((sum(r.recv_sizes) for r in self._rounds), default=0)
        if buffers is None:
            self.send_buffer = torch.empty(send_max, dtype=torch.uint8, device=self.device)
            self.recv_buffer = torch.empty(recv_max, dtype=torch.uint8, device=self.device)
        else:
            self.send_buffer, self.recv_buffer = _shared_buffers(buffers, send_max, recv_max)
        if group is None:
            pg = get_group(self.members, timeout=self.timeout, group_desc="meshlayout_transfer")
            self._bounded = Bounded(pg, self.members, self.timeout, "WeightTransfer")
        else:
            self._bounded = Bounded(group.pg, self.members, self.timeout, "WeightTransfer", group)
        self._verify_info: dict[str, _VerifyInfo] | None = None
        self._fingerprinter = Fingerprinter()

    # ------------------------------------------------------------------ run
    def run(
        self,
        src_tensors: Mapping[str, Any] | None = None,
        out: Mapping[str, torch.Tensor] | None = None,
        *,
        verify: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Move the current source pieces; returns name -> destination piece (``{}`` on
        source-only ranks). Collective over :attr:`members`; repeatable.

        ``src_tensors``: name -> current local piece (or DTensor) on source ranks
        (default: the pieces given at construction; they may have changed in place).
        ``out``: name -> preallocated destination piece (shape of the spec's local
        piece, the destination dtype; any strides, e.g. a view into a fused
        parameter), filled in place and returned. Any subset of this rank's
        destination tensors (e.g. only the fused parameters): the others are returned
        as new tensors.
        ``verify``: compare fingerprints with one extra all-reduce and raise
        :class:`~meshlayout.torch.TransferVerificationError` on every rank on a
        mismatch.
        """
        srcs = self._current_sources(src_tensors)
        outs = self._outputs(out)
        with torch.no_grad():
            for name, s_sl, d_sl in self._copies:
                outs[name][d_sl].copy_(srcs[name][s_sl])
            for i, rnd in enumerate(self._rounds):
                send = self.send_buffer[: sum(rnd.send_sizes)]
                recv = self.recv_buffer[: sum(rnd.recv_sizes)]
                pack_round(rnd, srcs, send, self.dst_dtypes)
                all_to_all(self._bounded, recv, send, rnd.recv_sizes, rnd.send_sizes)
                self.unpack(i, recv, outs)
            if verify:
                self._verify(srcs, outs)
        return outs

    def _current_sources(self, given: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
        if given is None:
            return self._sources
        if not isinstance(given, Mapping):
            raise TypeError(f"src_tensors must be a mapping name -> tensor, got {given!r}")
        missing = [n for n in self._src_names if n not in given]
        extra = [n for n in given if n not in self.src_specs or n not in self._sources]
        if missing or extra:
            raise KeyError(
                f"src_tensors on rank {self.rank}: missing {missing[:10]}, not source tensors "
                f"of this rank {extra[:10]}"
            )
        out = {}
        for name in self._src_names:
            value = given[name]
            local = _c10d.local_tensor(value) if is_dtensor(value) else value
            if not isinstance(local, torch.Tensor):
                raise TypeError(f"src_tensors[{name!r}] must be a tensor, got {type(value)}")
            check_piece(name, local, self.src_specs[name], self.rank, "source")
            out[name] = local.detach()
        return out

    def _outputs(self, out: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        me = self.rank
        if out is None:
            out = {}
        elif not isinstance(out, Mapping):
            raise TypeError(f"out must be a mapping name -> tensor, got {out!r}")
        extra = [n for n in out if n not in self._dst_names]
        if extra:
            raise KeyError(
                f"out on rank {me} names {extra[:10]}, which are not destination tensors of "
                f"this rank; its destination tensors are {list(self._dst_names[:10])}"
                + (" ..." if len(self._dst_names) > 10 else "")
            )
        result: dict[str, torch.Tensor] = {}
        for name in self._dst_names:
            if name not in out:  # not preallocated: a new tensor
                result[name] = torch.empty(
                    self.dst_specs[name].local_shape(me),
                    dtype=self.dst_dtypes[name],
                    device=self.device,
                )
                continue
            t = out[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"out[{name!r}] must be a tensor, got {type(t).__name__}")
            want = self.dst_specs[name].local_shape(me)
            if tuple(t.shape) != want or t.dtype != self.dst_dtypes[name]:
                raise ValueError(
                    f"out[{name!r}] on rank {me} is {t.dtype} {tuple(t.shape)}; the destination "
                    f"piece is {self.dst_dtypes[name]} {want}"
                )
            result[name] = t
        return result

    def unpack(self, index: int, recv: torch.Tensor, outs: Mapping[str, torch.Tensor]) -> None:
        """The unpack step of round ``index``: copy ``recv`` (bytes) into ``outs``.

        A method of its own so that tests can substitute a faulty one (verification
        must catch it).
        """
        unpack_round(self._rounds[index], recv, outs)

    # ------------------------------------------------------------------ verify
    def _verify_layout(self) -> dict[str, _VerifyInfo]:
        """Per tensor: (this rank is the designated source holder, source holders per
        piece, destination holders per piece, the destination's boxes when it covers only
        part of the tensor, else None)."""
        if self._verify_info is None:
            info = {}
            for name in self.plan.names:
                src_pieces = pieces(self.src_specs[name])
                dst_pieces = pieces(self.dst_specs[name])
                mine = next((p for p in src_pieces if self.rank in p.ranks), None)
                numel = math.prod(self.src_specs[name].global_shape)
                covered = sum(p.numel for p in dst_pieces)
                part = (
                    None
                    if covered == numel
                    else tuple(rb.box for p in dst_pieces for rb in p.run_boxes())
                )
                info[name] = (
                    mine is not None and mine.ranks[0] == self.rank,
                    len(src_pieces[0].ranks) if src_pieces else 1,
                    len(dst_pieces[0].ranks) if dst_pieces else 1,
                    part,
                )
            self._verify_info = info
        return self._verify_info

    def _verify(self, srcs: Mapping[str, torch.Tensor], outs: Mapping[str, torch.Tensor]) -> None:
        info = self._verify_layout()
        names = self.plan.names
        # per tensor: the designated source holder's fingerprint, every source holder's
        # (replicas must agree), the destinations', and the designated holder's over
        # the elements a destination that covers only part of the tensor holds
        sums = torch.zeros((len(names), 4, 4), dtype=torch.int64)
        me = self.rank
        fp = self._fingerprinter
        for t, name in enumerate(names):
            shape = self.src_specs[name].global_shape
            dtype = self.dst_dtypes[name]
            part = info[name][3]
            if name in srcs and me in self.src_specs[name].mesh:
                h = h_part = 0
                for rb in run_boxes(self.src_specs[name], me):
                    h += fp.box(srcs[name][rb.local_slices()], rb.box, shape, dtype)
                    for box in () if part is None or not info[name][0] else part:
                        sub = intersect(rb.box, box)  # a destination holding only part
                        if sub is not None:
                            h_part += fp.box(srcs[name][rb.local_slices(sub)], sub, shape, dtype)
                sums[t, 1] = torch.tensor(_limbs(h & MASK64))
                if info[name][0]:
                    sums[t, 0] = torch.tensor(_limbs(h & MASK64))
                    sums[t, 3] = torch.tensor(_limbs(h_part & MASK64))
            if name in outs:
                h = 0
                for rb in run_boxes(self.dst_specs[name], me):
                    h += fp.box(outs[name][rb.local_slices()], rb.box, shape, dtype)
                sums[t, 2] = torch.tensor(_limbs(h & MASK64))
        reduced = sums.to(self.device)
        all_reduce(self._bounded, reduced, dist.ReduceOp.SUM)
        totals = reduced.cpu().tolist()
        wrong, replicas = [], []
        for t, name in enumerate(names):
            a, b, c, a_part = (_unlimb(totals[t][k]) for k in range(4))
            _, h_src, h_dst, part = info[name]
            if b != (h_src * a) & MASK64:
                replicas.append(name)
            if c != (h_dst * (a if part is None else a_part)) & MASK64:
                wrong.append(name)
        if wrong or replicas:
            parts = []
            if wrong:
                parts.append(f"destination pieces differ from the source for {wrong[:20]}")
            if replicas:
                parts.append(f"source replicas hold different values for {replicas[:20]}")
            raise TransferVerificationError(
                f"WeightTransfer verification failed (seen from rank {me}): " + "; ".join(parts),
                tensors=wrong,
                replicas=replicas,
            )


_VerifyInfo = tuple[bool, int, int, "tuple[tuple[tuple[int, int], ...], ...] | None"]


def schedule(
    plan: TransferPlan,
    src_specs: Mapping[str, ShardingSpec],
    dst_specs: Mapping[str, ShardingSpec],
    rank: int,
) -> tuple[_Round, ...]:
    """Rank ``rank``'s rounds of ``plan``: per round, the boxes it packs and unpacks as
    slices of its local pieces, with their byte offsets in its buffers (pure)."""
    out = []
    for rnd in plan.rounds:
        sends = tuple(
            _Item(s.name, local_slices(src_specs[s.name], rank, s.box), s.offset, s.nbytes)
            for s in rnd.sends(rank)
        )
        recvs = tuple(
            _Item(s.name, local_slices(dst_specs[s.name], rank, s.box), s.offset, s.nbytes)
            for s in rnd.receives(rank)
        )
        out.append(_Round(sends, recvs, rnd.send_sizes(rank), rnd.recv_sizes(rank)))
    return tuple(out)


def pack_round(
    rnd: _Round,
    srcs: Mapping[str, torch.Tensor],
    send: torch.Tensor,
    dtypes: Mapping[str, torch.dtype],
) -> None:
    """Copy the boxes ``rnd`` sends from the source pieces ``srcs`` into the byte buffer
    ``send``, each cast to its destination dtype (``dtypes``)."""
    for item in rnd.sends:
        region = srcs[item.name][item.slices]
        dtype = dtypes[item.name]
        size = dtype.itemsize
        dest = send[item.offset : item.offset + item.nbytes]
        if item.offset % size == 0:
            dest.view(dtype).view(region.shape).copy_(region)
        elif region.dtype == dtype and region.dim() and region.stride(-1) == 1:
            dest.view(_byte_shape(region)).copy_(region.view(torch.uint8))
        else:  # unaligned and cast: through small temporaries
            flat = region.reshape(-1)
            step = max(1, _CAST_CHUNK // size)
            for a in range(0, flat.numel(), step):
                part = flat[a : a + step].to(dtype).view(torch.uint8)
                dest[a * size : a * size + part.numel()].copy_(part)


def unpack_round(rnd: _Round, recv: torch.Tensor, outs: Mapping[str, torch.Tensor]) -> None:
    """Copy the boxes ``rnd`` receives from the byte buffer ``recv`` into the destination
    pieces ``outs``."""
    for item in rnd.recvs:
        region = outs[item.name][item.slices]
        dtype = region.dtype
        size = region.element_size()
        data = recv[item.offset : item.offset + item.nbytes]
        if item.offset % size == 0:
            region.copy_(data.view(dtype).view(region.shape))
        elif region.dim() and region.stride(-1) == 1:
            region.view(torch.uint8).copy_(data.view(_byte_shape(region)))
        else:
            region.copy_(data.clone().view(dtype).view(region.shape))


def _shared_buffers(
    buffers: object, send_max: int, recv_max: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not (
        isinstance(buffers, tuple)
        and len(buffers) == 2
        and all(isinstance(b, torch.Tensor) for b in buffers)
    ):
        raise TypeError(f"buffers must be a (send, receive) pair of tensors, got {buffers!r}")
    send, recv = buffers
    for what, buf, need in (("send", send, send_max), ("receive", recv, recv_max)):
        if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
            raise ValueError(f"the {what} buffer must be a contiguous 1-d uint8 tensor")
        if buf.numel() < need:
            raise ValueError(
                f"the {what} buffer holds {buf.numel()} bytes; this transfer's largest "
                f"round needs {need} (at most bucket_bytes)"
            )
    return send, recv


def _byte_shape(region: torch.Tensor) -> tuple[int, ...]:
    shape = list(region.shape)
    shape[-1] *= region.element_size()
    return tuple(shape)


def transfer(
    src: Mapping[str, Any] | None, dst: Mapping[str, Any] | None, **kw: Any
) -> dict[str, torch.Tensor]:
    """One shot: ``WeightTransfer(src, dst, ...).run(out=..., verify=...)``.

    Keyword arguments ``out`` and ``verify`` go to :meth:`WeightTransfer.run`, the
    others (``bucket_bytes``, ``ranks_per_host``, ``timeout``, ``group``, ``buffers``) to the
    constructor.
    """
    run_kw = {k: kw.pop(k) for k in ("out", "verify", "src_tensors") if k in kw}
    return WeightTransfer(src, dst, **kw).run(**run_kw)
