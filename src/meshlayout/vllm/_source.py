"""``ShardedSource``: the trainer's parameters as they are, for the "meshlayout" backend.

A vLLM ``WeightSource`` whose metadata reports global shapes and whose tensors are
the trainer's own DTensors (FSDP2, TP, FSDP2 over TP: uneven, strided) or plain
tensors, never gathered. Names are the checkpoint (Hugging Face) names vLLM's
``load_weights`` takes; ``rename`` maps the trainer's names to them (a mapping, or a
callable returning a name, or None to leave a tensor out).

It speaks vLLM 0.32's source protocol and 0.33's (:mod:`._compat` holds every
difference). Under 0.33 ``metadata`` also declares each parameter's owners: a DTensor
is owned by the ranks of its device mesh (a sliced mesh is described on the mesh it
was sliced from, replicated along the dims it lacks, so every rank declares the
same), with vLLM ``Shard`` / ``Replicate`` placements where the DTensor's are exactly
those (``_StridedShard``, ``Partial`` or a non-default shard order: no placements,
which 0.33 reads as replicated over the owners); a plain tensor is owned by every
rank. ``iter_local()`` yields each owned piece (``to_local()``; a gather only for the
DTensors without placements, as 0.33 requires); ``iter_full()`` is not implemented.
The meshlayout backend reads neither: it reads :meth:`ShardedSource.tensors` afresh
at every send.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..mesh import Mesh
from ..sharding import Replicate, ShardingSpec
from ..torch import SyncGroup
from ..torch._transfer_meta import is_dtensor
from ._compat import Layout, WeightSourceBase, metadata_of, param_meta

__all__ = ["ShardedSource"]

Rename = Mapping[str, str] | Callable[[str], "str | None"] | None


class ShardedSource(WeightSourceBase):
    """The trainer's tensors as they are (see the module docstring).

    ``module_or_named_tensors``: a ``torch.nn.Module`` (its ``named_parameters()``,
    read at every send, so FSDP2's parameter swaps are seen) or a mapping name ->
    tensor. Under vLLM 0.32 iterating yields ``(name, tensor)`` with the tensors as
    they are (local shards inside DTensors); under 0.33 ``iter_local()`` does (see the
    module docstring). This source is for the meshlayout backend, which moves shards;
    vLLM's gathering backends want ``ModuleSource``.

    Under 0.33 ``metadata`` is cached on first read (0.33's rule: engines read it
    repeatedly and it must not change), so build the source after sharding the model;
    ``iter_local()`` raises ValueError if the live parameters no longer match it.
    """

    def __init__(self, module_or_named_tensors: Any, rename: Rename = None) -> None:
        if not isinstance(module_or_named_tensors, (torch.nn.Module, Mapping)):
            raise TypeError(
                "ShardedSource takes a torch.nn.Module or a mapping name -> tensor, got "
                f"{type(module_or_named_tensors).__name__}"
            )
        if rename is not None and not (isinstance(rename, Mapping) or callable(rename)):
            raise TypeError(f"rename must be a mapping, a callable or None, got {rename!r}")
        self.target = module_or_named_tensors
        self.rename = rename

    def _name(self, name: str) -> str | None:
        if self.rename is None:
            return name
        if isinstance(self.rename, Mapping):
            return self.rename.get(name, name)
        return self.rename(name)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Checkpoint name -> the trainer's tensor (DTensor or plain), in model order."""
        items = (
            self.target.named_parameters()
            if isinstance(self.target, torch.nn.Module)
            else self.target.items()
        )
        out: dict[str, torch.Tensor] = {}
        for name, tensor in items:
            new = self._name(name)
            if new is None:
                continue
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name!r} is a {type(tensor).__name__}, not a tensor")
            if new in out:
                raise ValueError(f"rename maps two tensors to {new!r}")
            out[new] = tensor
        return out

    def read_metadata(self) -> list[Any]:
        """vLLM ``ParamMeta`` of every tensor, read afresh (what 0.33's ``metadata``
        caches and 0.32's ``metadata()`` returns)."""
        return [param_meta(n, t.dtype, _shape(t), lay) for n, t, lay in _described(self.tensors())]

    def iter_local(self) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's piece of each tensor it owns, in metadata order (vLLM 0.33's
        ``iter_local``): plain tensors and DTensors with placements as they are,
        DTensors without placements gathered (a collective among their owners).

        ValueError if the live parameters differ from the metadata (names, dtypes,
        shapes or layouts changed since it was read)."""
        described = _described(self.tensors())
        fresh = [param_meta(n, t.dtype, _shape(t), lay) for n, t, lay in described]
        declared = metadata_of(self)
        if fresh != declared:
            raise ValueError(
                "ShardedSource: the model's parameters no longer match its metadata "
                f"({_first_difference(declared, fresh)}); metadata is read once, so "
                "build a new ShardedSource after changing the model"
            )
        return _local_pieces(described)

    def sources(self, names: list[str], group: SyncGroup) -> dict[str, Any]:
        """This rank's transfer sources for ``names``: DTensors as they are, plain
        tensors as replicas over the trainer's sync ranks ``0 .. T-1`` (every trainer
        rank holds the same values)."""
        tensors = self.tensors()
        trainers = sorted(group.rank_map().values()) or [group.rank]
        out: dict[str, Any] = {}
        for name in names:
            t = tensors[name]
            if is_dtensor(t):
                out[name] = t
            else:
                mesh = Mesh({"trainer": len(trainers)}, ranks=trainers)
                out[name] = (t.detach(), ShardingSpec(tuple(t.shape), mesh, [Replicate()]))
        return out


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _described(
    tensors: Mapping[str, torch.Tensor],
) -> list[tuple[str, torch.Tensor, Layout | None]]:
    return [(n, t, _layout(t)) for n, t in tensors.items()]


def _layout(t: torch.Tensor) -> Layout | None:
    """Owners, mesh shape and plain placements of a DTensor (None for a plain tensor)."""
    if not is_dtensor(t):
        return None
    from ..torch.checkpoint._planners import _on_root

    dm, placements = _on_root(t.device_mesh, tuple(t.placements))  # type: ignore[attr-defined]
    owners = tuple(int(r) for r in dm.mesh.reshape(-1).tolist())
    mesh_shape = tuple(int(s) for s in dm.mesh.shape)
    return Layout(owners, mesh_shape, _shard_dims(t, placements))


def _shard_dims(t: torch.Tensor, placements: tuple[Any, ...]) -> tuple[int | None, ...] | None:
    """Per mesh dim the tensor dim a plain ``Shard`` splits (None: ``Replicate``), or
    None when some placement is neither (``_StridedShard``, ``Partial``) or the shard
    order is not torch's default (mesh dims left to right), which vLLM's ``Shard``
    assumes."""
    from torch.distributed.tensor import Replicate as TorchReplicate
    from torch.distributed.tensor import Shard as TorchShard

    dims: list[int | None] = []
    for p in placements:
        if type(p) is TorchShard:
            dims.append(p.dim % t.ndim)
        elif type(p) is TorchReplicate:
            dims.append(None)
        else:
            return None
    spec: Any = getattr(t, "_spec", None)  # torch >= 2.10 records a shard order
    order = getattr(spec, "shard_order", None)
    default = getattr(type(spec), "compute_default_shard_order", None)
    if (
        order is not None
        and default is not None
        and tuple(order) != tuple(default(spec.placements))
    ):
        return None
    return tuple(dims)


def _local_pieces(
    described: list[tuple[str, torch.Tensor, Layout | None]],
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t, layout in described:
        if layout is None:
            yield name, t.detach()
        elif t.device_mesh.get_coordinate() is None:  # type: ignore[attr-defined]
            continue  # not an owner
        elif layout.shard_dims is None:
            yield name, t.full_tensor()  # type: ignore[attr-defined]
        else:
            yield name, t.to_local()  # type: ignore[attr-defined]


def _first_difference(declared: list[Any], fresh: list[Any]) -> str:
    for old, new in zip(declared, fresh):
        if old != new:
            return f"{old!r} is now {new!r}"
    if len(declared) != len(fresh):
        return f"{len(declared)} parameters declared, {len(fresh)} now"
    return "unknown"
