"""What each side of a :class:`~meshlayout.torch.WeightTransfer` brings, checked and exchanged.

Inputs: a source piece is a DTensor (its spec read the way the checkpoint planners
read it) or ``(local, ShardingSpec)``; a destination is a spec or ``(spec, dtype)``;
every piece's shape is checked against its spec. Metadata: each rank posts what it
knows (names, specs, dtypes) to the store and waits, bounded by the timeout, for the
ranks of both sides; disagreements raise on every rank naming tensors and ranks.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from ...sharding import ShardingSpec
from .. import _c10d
from .._errors import MeshMismatchError, RankTimeoutError, format_ranks
from .._store import gather_arrivals

if TYPE_CHECKING:
    from ._sync import SyncGroup

__all__ = [
    "check_piece",
    "dest_entry",
    "dtype_name",
    "dtype_of",
    "exchange",
    "is_dtensor",
    "source_piece",
]


# ---------------------------------------------------------------------- inputs
def _spec_of_dtensor(value: Any, rank_map: Mapping[int, int] | None) -> ShardingSpec:
    from ..checkpoint._planners import dtensor_spec  # DTensor users have DCP loaded

    return dtensor_spec(value, rank_map=rank_map, root=True)


def is_dtensor(value: object) -> bool:
    """Whether ``value`` is a DTensor (without importing DTensor where none exists)."""
    module = sys.modules.get("torch.distributed.tensor")  # never imported: no DTensor exists
    return module is not None and isinstance(value, module.DTensor)


def source_piece(
    name: str, value: object, me: int, rank_map: Mapping[int, int] | None = None
) -> tuple[torch.Tensor, ShardingSpec]:
    """(local piece, spec) of one source entry: a DTensor or ``(tensor, ShardingSpec)``.

    ``rank_map``: default-group rank -> rank of the transfer's group, applied to a
    DTensor's mesh (a ``(tensor, spec)`` pair is already in the transfer's ranks).
    """
    if is_dtensor(value):
        spec = _spec_of_dtensor(value, rank_map)
        local = _c10d.local_tensor(value)
    elif (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], torch.Tensor)
        and isinstance(value[1], ShardingSpec)
    ):
        local, spec = value
    else:
        raise TypeError(
            f"src[{name!r}] must be a DTensor or a (local piece, ShardingSpec) pair, got "
            f"{type(value).__name__}"
        )
    check_piece(name, local, spec, me, "source")
    return local.detach(), spec


def check_piece(name: str, local: torch.Tensor, spec: ShardingSpec, me: int, side: str) -> None:
    want = spec.local_shape(me) if me in spec.mesh else None
    if want is None:
        raise ValueError(
            f"{name!r}: rank {me} is not in the {side} mesh {spec.mesh!r} of this tensor"
        )
    if tuple(local.shape) != want:
        raise ValueError(
            f"{name!r}: the {side} piece of rank {me} has shape {tuple(local.shape)}, its "
            f"spec says {want} (placements {list(spec.placements())} of {spec.global_shape})"
        )
    if local.is_sparse or local.layout != torch.strided or local.device.type == "meta":
        raise ValueError(f"{name!r}: the {side} piece must be a dense tensor with data")


def dest_entry(name: str, value: object) -> tuple[ShardingSpec, torch.dtype | None]:
    if isinstance(value, ShardingSpec):
        return value, None
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], ShardingSpec)
        and isinstance(value[1], torch.dtype)
    ):
        return value[0], value[1]
    raise TypeError(
        f"dst[{name!r}] must be a ShardingSpec or a (ShardingSpec, torch.dtype) pair, got {value!r}"
    )


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling metadata posts carry)."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The inverse of :func:`dtype_name`."""
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


# ---------------------------------------------------------------------- metadata exchange
class _Sequence:
    """Per default group: the WeightTransfers this process has constructed.

    The two sides know only their own rank sets, so they meet under a key made of
    this count: the ranks of a transfer's union construct their transfers in the
    same order (like collectives), and a rank outside a transfer's union must not
    construct other transfers meanwhile (every process takes part in every
    transfer, or transfers run one after another on the same processes).
    """

    def __init__(self) -> None:
        self.world: object = None
        self.generation = 0
        self.count = 0

    def next(self) -> str:
        world = dist.group.WORLD
        if world is not self.world:
            self.world = world
            self.generation += 1
            self.count = 0
        n = self.count
        self.count += 1
        return f"meshlayout/transfer/{self.generation}/{n}"


_SEQUENCE = _Sequence()

# what one rank posts: name -> (spec, dtype name) per side
_Meta = tuple[dict[str, tuple[ShardingSpec, str]], dict[str, tuple[ShardingSpec, str | None]]]


def _mesh_ranks(spec: ShardingSpec) -> list[int]:
    return np.asarray(spec.mesh.submeshes(), dtype=np.int64).reshape(-1).tolist()  # type: ignore[no-any-return]


def _side_ranks(specs: Any) -> list[int]:
    meshes = {spec.mesh: spec for spec, _ in specs.values()}
    return sorted({r for spec in meshes.values() for r in _mesh_ranks(spec)})


def _wait_key(
    store: Any,
    key: str,
    timeout: timedelta,
    message: str,
    missing: list[int],
    describe: Callable[[], str],
) -> bytes:
    start = time.monotonic()
    try:
        store.wait([key], timeout)
    except Exception as exc:  # DistStoreError / RuntimeError on timeout
        secs = time.monotonic() - start
        try:
            arrived = bool(store.check([key]))
        except Exception:  # the store itself is gone
            arrived = False
        if not arrived:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            why = (
                "timed out"
                if secs >= 0.95 * timeout.total_seconds()
                else f"the store failed: {type(exc).__name__}: {first}"
            )
            raise RankTimeoutError(
                f"{message} (gave up after {secs:.1f}s of a {timeout.total_seconds():g}s "
                f"timeout: {why})" + describe(),
                missing=missing,
            ) from exc
    value: bytes = store.get(key)
    return value


def _describe_others(
    store: Any,
    me: int,
    ns: str,
    names: list[str],
    world_size: int,
    ranks: Sequence[int] | None = None,
) -> str:
    """Failure path: what other ranks (default: every rank) last constructed, when it
    is not this WeightTransfer (O(ranks) store reads)."""
    lines = []
    mine = set(names)
    for r in range(world_size) if ranks is None else ranks:
        key = f"meshlayout/transfer/last/{r}"
        if r == me or not store.check([key]):
            if r != me and ranks is not None:
                lines.append(f"\n  rank {r}: has constructed no WeightTransfer")
            continue
        last = json.loads(store.get(key).decode())
        if last["key"] == ns:
            continue
        theirs = set(last["names"])
        lines.append(
            f"\n  rank {r}: last constructed {last['key']} (this one is {ns}); tensors only "
            f"there {sorted(theirs - mine)[:10]}, only here {sorted(mine - theirs)[:10]}"
        )
        if len(lines) >= 8:
            break
    return "".join(lines)


def exchange(
    me: int, meta: _Meta, timeout: timedelta, group: SyncGroup | None = None
) -> tuple[tuple[int, ...], _Meta]:
    """Agree on every tensor's specs and dtypes with the other ranks (see module doc),
    through the default store, or ``group``'s own store (ranks are then its ranks)."""
    if group is None:
        store, world, ns = _c10d.default_store(), dist.get_world_size(), _SEQUENCE.next()
    else:
        store, world, ns = group.store, group.world_size, group.next_key("transfer")
    src_meta, dst_meta = meta
    names = sorted(set(src_meta) | set(dst_meta))
    store.set(f"meshlayout/transfer/last/{me}", json.dumps({"key": ns, "names": names}))
    if src_meta:
        store.compare_set(f"{ns}/S", "", " ".join(map(str, _side_ranks(src_meta))))
    if dst_meta:
        store.compare_set(f"{ns}/D", "", " ".join(map(str, _side_ranks(dst_meta))))
    sides = {}
    for key, side in (("S", "source"), ("D", "destination")):
        text = _wait_key(
            store,
            f"{ns}/{key}",
            timeout,
            f"WeightTransfer: rank {me}: no {side} rank reached this WeightTransfer ({ns})",
            [],
            lambda: _describe_others(store, me, ns, names, world),
        )
        sides[key] = [int(r) for r in text.decode().split()]
    union = tuple(sorted(set(sides["S"]) | set(sides["D"])))
    if group is not None:
        # every member of a sync group takes part; a rank's own meshes need not show
        # them all (a tensor on separately built 1-D meshes: each rank sees its own)
        union = tuple(range(world))
    if me not in union:
        raise ValueError(
            f"WeightTransfer: rank {me} is in neither side's meshes (source "
            f"{format_ranks(sides['S'])}, destination {format_ranks(sides['D'])})"
        )
    blob = base64.b64encode(pickle.dumps(meta)).decode()
    digest = hashlib.sha1(blob.encode(), usedforsecurity=False).hexdigest()
    store.set(f"{ns}/blob/{digest}", blob)
    store.set(f"{ns}/fp/{me}", digest)
    try:
        gather_arrivals(store, ns, union, me, timeout, "WeightTransfer metadata exchange")
    except RankTimeoutError as exc:
        note = _describe_others(store, me, ns, names, world, exc.missing)
        raise RankTimeoutError(f"{exc}{note}", missing=exc.missing) from exc
    leader = union[0]
    if me == leader:
        digests = [d.decode() for d in store.multi_get([f"{ns}/fp/{r}" for r in union])]
        posts = {d: _loads(store.get(f"{ns}/blob/{d}")) for d in set(digests)}
        verdict = _merge(union, {r: posts[d] for r, d in zip(union, digests)})
        store.set(f"{ns}/verdict", base64.b64encode(pickle.dumps(verdict)).decode())
    raw = _wait_key(
        store,
        f"{ns}/verdict",
        timeout,
        f"WeightTransfer: rank {me} waited for the verdict of rank {leader}",
        [leader],
        lambda: "",
    )
    verdict = _loads(raw)
    if verdict[0] == "error":
        _, message, ranks, names = verdict
        raise MeshMismatchError(message, ranks=ranks, fields=names)
    return union, verdict[1]


def _loads(raw: bytes) -> Any:
    """Posts come from the ranks of this job (the default store's members)."""
    return pickle.loads(base64.b64decode(raw))


def _replicas(variants: list[tuple[Any, list[int]]]) -> tuple[ShardingSpec, str] | None:
    """One source spec for copies of a tensor laid out alike on disjoint meshes, or None.

    A DTensor on a separately built 1-D mesh (FSDP2's mesh of a norm, when the TP and
    FSDP meshes were built apart) lives on a different mesh on each TP coordinate; the
    copies are replicas of one another. Each variant must be posted by every rank of
    its mesh (one sub-mesh), all with the same global shape, dtype, placements and mesh
    shape, on disjoint ranks: the result adds a leading ``Replicate`` mesh dim over them.
    """
    from ...mesh import Mesh
    from ...sharding import Replicate

    specs = [entry[0] for entry, _ in variants]
    dtypes = {entry[1] for entry, _ in variants}
    first = specs[0]
    if len(dtypes) != 1 or any(getattr(s.mesh, "num_submeshes", 1) != 1 for s in specs):
        return None
    seen: set[int] = set()
    rows = []
    for spec, (_, ranks) in zip(specs, variants):
        if (
            spec.global_shape != first.global_shape
            or spec.placements() != first.placements()
            or tuple(spec.mesh.shape) != tuple(first.mesh.shape)
        ):
            return None
        members = _mesh_ranks(spec)
        if sorted(members) != sorted(ranks) or seen & set(members):
            return None
        seen.update(members)
        rows.append((min(members), members))
    names = tuple(first.mesh.names)
    extra = next(f"replica{i}" for i in range(len(names) + 1) if f"replica{i}" not in names)
    dims = {extra: len(rows), **dict(zip(names, first.mesh.shape))}
    mesh = Mesh(dims, ranks=[r for _, members in sorted(rows) for r in members])
    spec = ShardingSpec(first.global_shape, mesh, [Replicate(), *first.placements()])
    return spec, dtypes.pop()


def _merge(union: tuple[int, ...], posts: dict[int, _Meta]) -> tuple[Any, ...]:
    """("ok", merged metadata) or ("error", message, ranks, tensor names)."""
    problems: list[str] = []
    bad_ranks: set[int] = set()
    bad_names: set[str] = set()
    merged: list[dict[str, Any]] = []
    for side_index, side in enumerate(("source", "destination")):
        by_name: dict[str, dict[Any, list[int]]] = {}
        for r in union:
            for name, entry in posts[r][side_index].items():
                by_name.setdefault(name, {}).setdefault(entry, []).append(r)
        chosen: dict[str, Any] = {}
        for name in sorted(by_name):
            variants = sorted(by_name[name].items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
            entry, ranks = variants[0]
            chosen[name] = entry
            replicas = _replicas(variants) if side_index == 0 and len(variants) > 1 else None
            if replicas is not None:
                chosen[name] = replicas
                continue
            if len(variants) > 1:
                bad_names.add(name)
                lines = [f"tensor {name!r}: {side} ranks disagree:"]
                for (spec, dtype), rs in variants:
                    lines.append(f"    ranks {format_ranks(rs)}: {spec!r}, dtype {dtype}")
                    if rs is not ranks:
                        bad_ranks.update(rs)
                problems.append("\n".join(lines))
                continue
            absent = sorted(set(_mesh_ranks(entry[0])) - set(ranks))
            if absent:
                bad_names.add(name)
                bad_ranks.update(absent)
                problems.append(
                    f"tensor {name!r}: {side} ranks {format_ranks(absent)} of its mesh did not "
                    f"pass it (ranks {format_ranks(ranks)} did)"
                )
        merged.append(chosen)
    only_src = sorted(set(merged[0]) - set(merged[1]))
    only_dst = sorted(set(merged[1]) - set(merged[0]))
    if only_src or only_dst:
        bad_names.update(only_src + only_dst)
        problems.append(
            f"tensor names differ: only on the source side {only_src[:20]}, only on the "
            f"destination side {only_dst[:20]}"
        )
    if problems:
        shown = problems[:12] + (
            [f"... and {len(problems) - 12} more"] if len(problems) > 12 else []
        )
        message = "WeightTransfer: the sides disagree:\n  " + "\n  ".join(shown)
        return ("error", message, sorted(bad_ranks), sorted(bad_names))
    return ("ok", (merged[0], merged[1]))
