"""``ShardedSource``: the trainer's parameters as they are, for the "meshlayout" backend.

A vLLM ``WeightSource`` whose ``metadata()`` reports global shapes and whose tensors
are the trainer's own DTensors (FSDP2, TP, FSDP2 over TP: uneven, strided) or plain
tensors, never gathered. Names are the checkpoint (Hugging Face) names vLLM's
``load_weights`` takes; ``rename`` maps the trainer's names to them (a mapping, or a
callable returning a name, or None to leave a tensor out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from ..mesh import Mesh
from ..sharding import Replicate, ShardingSpec
from ..torch import SyncGroup
from ..torch._transfer_meta import is_dtensor

__all__ = ["ShardedSource"]

Rename = Mapping[str, str] | Callable[[str], "str | None"] | None


class ShardedSource(WeightSource):
    """The trainer's tensors as they are (see the module docstring).

    ``module_or_named_tensors``: a ``torch.nn.Module`` (its ``named_parameters()``,
    read at every send, so FSDP2's parameter swaps are seen) or a mapping name ->
    tensor. Iterating yields ``(name, tensor)`` with the tensors as they are (local
    shards inside DTensors): this source is for the meshlayout backend, which moves
    shards; vLLM's gathering backends want ``ModuleSource``.
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

    def metadata(self) -> list[ParamMeta]:
        return [
            ParamMeta(n, t.dtype, tuple(int(s) for s in t.shape)) for n, t in self.tensors().items()
        ]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.tensors().items()

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
