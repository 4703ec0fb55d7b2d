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
from dataclasses import dataclass
from typing import Any

import torch

from ..mesh import Mesh
from ..sharding import Replicate, ShardingSpec, view_shape, view_spec
from ..torch import SyncGroup
from ..torch.transfer import is_dtensor
from ._compat import Layout, WeightSourceBase, metadata_of, param_meta

__all__ = ["ShardedSource"]

Index = tuple[Any, ...] | int | slice
Target = "str | None | list[tuple[str, Index]]"
Rename = Mapping[str, Any] | Callable[[str], Any] | None


@dataclass(frozen=True)
class View:
    """Checkpoint tensor ``base[index]`` of a trainer tensor (``rename`` returned a list
    of ``(name, index)``): ints drop a dim, slices (step >= 1) keep it. Planned shard to
    shard like any tensor: nothing is gathered and no rank holds more than its piece."""

    base: torch.Tensor
    index: tuple[Any, ...]
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype


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

    ``rename(trainer_name)`` (or a mapping's value) is the checkpoint name, None to
    leave the tensor out, or a list of views ``(checkpoint_name, index)`` of it (a
    stacked expert tensor to per-expert names: ``index`` is basic indexing of its
    global shape, ints dropping a dim and slices with step >= 1)::

        def rename(name):   # torchtitan's w1 [E, F, D] -> transformers' per-expert names
            if name.endswith(".moe.experts.w1"):
                layer = name.split(".")[1]
                return [(f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight", (e,))
                        for e in range(E)]
            ...
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
        self._views: dict[Any, Any] = {}

    def _name(self, name: str) -> Any:
        if self.rename is None:
            return name
        if isinstance(self.rename, Mapping):
            return self.rename.get(name, name)
        return self.rename(name)

    def tensors(self) -> dict[str, Any]:
        """Checkpoint name -> the trainer's tensor (DTensor or plain) or a :class:`View`
        of one, in model order. ValueError naming the trainer tensor for a bad view or
        two tensors renamed alike."""
        items = (
            self.target.named_parameters()
            if isinstance(self.target, torch.nn.Module)
            else self.target.items()
        )
        out: dict[str, Any] = {}
        for name, tensor in items:
            new = self._name(name)
            if new is None:
                continue
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name!r} is a {type(tensor).__name__}, not a tensor")
            if isinstance(new, str):
                targets: list[tuple[str, Any]] = [(new, None)]
            elif isinstance(new, (list, tuple)):
                targets = [_view_target(name, tensor, item) for item in new]
            else:
                raise TypeError(
                    f"rename({name!r}) must return a name, None or a list of (name, index), "
                    f"got {new!r}"
                )
            for target, view in targets:
                if target in out:
                    raise ValueError(f"rename maps two tensors to {target!r} (one is {name!r})")
                out[target] = tensor if view is None else view
        return out

    def pieces(self, names: list[str], group: SyncGroup) -> dict[str, Any]:
        """This rank's current pieces of ``names`` (for :meth:`WeightTransfer.run`):
        DTensors as they are, the local pieces of plain tensors and views."""
        return {
            n: v[0] if isinstance(v, tuple) else v for n, v in self.sources(names, group).items()
        }

    def _view_source(
        self, view: View, group: SyncGroup
    ) -> tuple[torch.Tensor, ShardingSpec] | None:
        """(this rank's piece, the view's spec), or None where it holds none of it."""
        from ..torch.transfer import source_piece

        base = view.base
        if is_dtensor(base):
            local, spec = source_piece("view", base, group.rank, group.rank_map() or None)
        else:
            trainers = sorted(group.rank_map().values()) or [group.rank]
            mesh = Mesh({"trainer": len(trainers)}, ranks=trainers)
            local, spec = base.detach(), ShardingSpec(tuple(base.shape), mesh, [Replicate()])
        key = (spec, repr(view.index))  # slices are unhashable before Python 3.12
        hit = self._views.get(key)
        if hit is None:
            hit = view_spec(spec, view.index)
            self._views[key] = hit
        vspec, local_index = hit
        if group.rank not in local_index:
            return None
        return local.detach()[_torch_index(local_index[group.rank])], vspec

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
        rank holds the same values), views as (this rank's piece, the view's spec)
        where this rank holds part of them."""
        tensors = self.tensors()
        trainers = sorted(group.rank_map().values()) or [group.rank]
        out: dict[str, Any] = {}
        for name in names:
            t = tensors[name]
            if isinstance(t, View):
                got = self._view_source(t, group)
                if got is not None:
                    out[name] = got
            elif is_dtensor(t):
                out[name] = t
            else:
                mesh = Mesh({"trainer": len(trainers)}, ranks=trainers)
                out[name] = (t.detach(), ShardingSpec(tuple(t.shape), mesh, [Replicate()]))
        return out


def _view_target(name: str, tensor: torch.Tensor, item: object) -> tuple[str, View]:
    if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
        raise TypeError(
            f"rename({name!r}): each view must be a (checkpoint name, index) pair, got {item!r}"
        )
    target, index = item
    entries = index if isinstance(index, tuple) else (index,)
    try:
        shape = view_shape(tuple(int(n) for n in tensor.shape), entries)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"rename({name!r}) -> {target!r}: {exc}") from None
    if 0 in shape:
        raise ValueError(
            f"rename({name!r}) -> {target!r}: index {index!r} of shape "
            f"{tuple(tensor.shape)} selects no element"
        )
    return target, View(tensor, tuple(entries), shape)


def _torch_index(index: tuple[Any, ...]) -> tuple[Any, ...]:
    """A local index of :func:`~meshlayout.sharding.view_spec` for a torch tensor."""
    import numpy as np

    if not any(isinstance(e, np.ndarray) for e in index):
        return index
    return tuple(torch.from_numpy(e) if isinstance(e, np.ndarray) else e for e in index)


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _described(
    tensors: Mapping[str, Any],
) -> list[tuple[str, Any, Layout | None]]:
    return [(n, t, _layout(t)) for n, t in tensors.items()]


def _layout(t: Any) -> Layout | None:
    """Owners, mesh shape and plain placements of a DTensor (None for a plain tensor)."""
    if isinstance(t, View) or not is_dtensor(t):
        return None  # a view is declared whole: vLLM 0.33's rule for what it cannot say
    from ..torch.checkpoint._planners import _on_root

    dm, placements = _on_root(t.device_mesh, tuple(t.placements))
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
    described: list[tuple[str, Any, Layout | None]],
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t, layout in described:
        if isinstance(t, View):
            base = t.base.full_tensor() if is_dtensor(t.base) else t.base  # type: ignore[attr-defined]
            yield name, base.detach()[t.index]
        elif layout is None:
            yield name, t.detach()
        elif t.device_mesh.get_coordinate() is None:
            continue  # not an owner
        elif layout.shard_dims is None:
            yield name, t.full_tensor()
        else:
            yield name, t.to_local()


def _first_difference(declared: list[Any], fresh: list[Any]) -> str:
    for old, new in zip(declared, fresh):
        if old != new:
            return f"{old!r} is now {new!r}"
    if len(declared) != len(fresh):
        return f"{len(declared)} parameters declared, {len(fresh)} now"
    return "unknown"
