"""``ExactSavePlanner`` / ``ExactLoadPlanner``: DCP's default planners with exact DTensor chunks.

torch 2.13's default planners describe a DTensor's local piece by one
``(offsets, sizes)`` pair from ``compute_local_shape_and_global_offset``, which reads
``_StridedShard`` placements differently from how FSDP2, TP and ``redistribute``
lay the data out, and cannot describe a piece made of several runs. These planners
read the layout with :class:`~meshlayout.sharding.ShardingSpec` (the nested shard
order) instead: one chunk per run box a rank holds, with its true global offsets.

Both subclass the default planners and only change how DTensors (and, on load,
plain tensors) become chunks and reads; keys, flattening, non-tensor values, plan
caching and the file format are DCP's own. Mechanism: after the default set-up,
each such tensor in the planner's (flattened) state dict is replaced by a small
stand-in implementing DCP's ``_Checkpointable`` dunders, which DCP's default plan
functions consult; the user's state dict is never modified (except by loading into
its tensors in place, as DCP does).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    ReadItem,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.tensor import DTensor

from ...mesh import Mesh
from ...sharding import Box, Partial, RunBox, ShardingSpec, run_boxes
from .._c10d import local_tensor
from ._keys import CheckpointKeyError, missing_keys_message
from ._plan import ChunkIndex, written_boxes

__all__ = ["ExactLoadPlanner", "ExactSavePlanner", "dtensor_spec"]


# ---------------------------------------------------------------------- layouts
@functools.lru_cache(maxsize=256)
def _mesh(shape: tuple[int, ...], names: tuple[str, ...] | None, ranks: tuple[int, ...]) -> Mesh:
    try:
        return Mesh(shape, names, ranks=list(ranks))
    except ValueError:  # torch allows names we do not (e.g. not identifiers)
        return Mesh(shape, ranks=list(ranks))


@functools.lru_cache(maxsize=4096)
def _spec(shape: tuple[int, ...], mesh: Mesh, placements: tuple[Any, ...]) -> ShardingSpec:
    return ShardingSpec.from_torch(shape, mesh, placements)


def _on_root(dm: Any, placements: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    """A sub-mesh's DTensor seen on its root mesh: ``Replicate`` along the root dims the
    sub-mesh lacks (its values are replicated there, e.g. a norm under FSDP2 over the
    dp dims of a dp x tp mesh). Unchanged when the names do not map (flattened dims)."""
    from torch.distributed.tensor import Replicate

    from .._c10d import root_mesh

    root = root_mesh(dm)
    if root is dm or root is None or not dm.mesh_dim_names or not root.mesh_dim_names:
        return dm, placements
    names = list(root.mesh_dim_names)
    if not set(dm.mesh_dim_names) <= set(names):
        return dm, placements
    by_name = dict(zip(dm.mesh_dim_names, placements))
    return root, tuple(by_name.get(n, Replicate()) for n in names)


def dtensor_spec(
    tensor: DTensor, *, rank_map: Mapping[int, int] | None = None, root: bool = False
) -> ShardingSpec:
    """The :class:`ShardingSpec` of a DTensor over its concrete device mesh (global ranks).

    ``_StridedShard`` lists are read in the nested shard order (FSDP2 / TP /
    redistribute), see ``docs/checkpoint.md``. Cached per (shape, mesh, placements).
    ``rank_map``: global rank -> rank of another group (a sync group), applied to the
    mesh; a rank it lacks raises ``KeyError``. ``root``: describe a DTensor of a
    sliced mesh over the mesh it was sliced from (``Replicate`` along the other dims),
    so replicas on several sub-meshes share one spec.
    """
    if not isinstance(tensor, DTensor):
        raise TypeError(f"expected a DTensor, got {type(tensor).__name__}")
    dm = tensor.device_mesh
    placements = tuple(tensor.placements)
    if root:
        dm, placements = _on_root(dm, placements)
    ranks = tuple(int(r) for r in dm.mesh.reshape(-1).tolist())
    if rank_map is not None:
        absent = [r for r in ranks if r not in rank_map]
        if absent:
            raise KeyError(
                f"the DTensor's mesh holds ranks {absent[:16]} of this process's default "
                f"group that did not join the group (joined: {sorted(rank_map)[:16]})"
            )
        ranks = tuple(rank_map[r] for r in ranks)
    names = tuple(dm.mesh_dim_names) if dm.mesh_dim_names else None
    mesh = _mesh(tuple(int(s) for s in dm.mesh.shape), names, ranks)
    shape = tuple(int(s) for s in tensor.shape)
    try:
        return _spec(shape, mesh, placements)
    except TypeError:  # an unhashable placement: no caching
        return ShardingSpec.from_torch(shape, mesh, placements)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _handled(value: Any) -> bool:
    """A DTensor whose local tensor is a plain tensor (subclasses keep their own protocol)."""
    return isinstance(value, DTensor) and not hasattr(local_tensor(value), "__create_write_items__")


def _local_piece(fqn: str, tensor: DTensor, spec: ShardingSpec, rank: int) -> torch.Tensor:
    placements = list(spec.placements())
    if any(isinstance(p, Partial) for p in placements):
        raise ValueError(
            f"{fqn}: DTensor placements {list(tensor.placements)} include Partial; a pending "
            "reduction cannot be checkpointed (redistribute to Replicate first)"
        )
    local = tensor.to_local()
    want = spec.local_shape(rank)
    if rank in spec.mesh and tuple(local.shape) != want:
        raise ValueError(
            f"{fqn}: rank {rank} holds a local tensor of shape {tuple(local.shape)}, but "
            f"{list(tensor.placements)} on mesh {spec.mesh.shape} laid out in the nested shard "
            f"order (as FSDP2, TP and redistribute store it) gives {want}; this DTensor was "
            "not laid out that way (e.g. torch's distribute_tensor with uneven _StridedShard), "
            "see docs/checkpoint.md"
        )
    return local


def _offsets(box: Box) -> torch.Size:
    return torch.Size(a for a, _ in box)


def _sizes(box: Box) -> torch.Size:
    return torch.Size(b - a for a, b in box)


class _Piece:
    """A tensor's local data with its run boxes, looked up by global chunk offset."""

    def __init__(
        self, fqn: str, local: torch.Tensor, shape: Sequence[int], boxes: Sequence[RunBox]
    ):
        self.fqn = fqn
        self.local = local
        self.shape = torch.Size(shape)
        self.boxes = tuple(boxes)
        self._by_offset = {_offsets(rb.box): rb for rb in self.boxes}

    def size(self) -> torch.Size:
        """The global size (DCP compares it with the checkpoint's)."""
        return self.shape

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        rb = self._by_offset.get(torch.Size(index.offset or ()))
        if rb is None:
            raise ValueError(
                f"{self.fqn}: no run box of this rank starts at global offset {index.offset}; "
                f"it holds {[rb.box for rb in self.boxes]}"
            )
        if any(b == a for a, b in rb.box):  # the one empty chunk of an empty tensor
            return self.local.new_empty(_sizes(rb.box))
        return self.local[rb.local_slices()]


class _SavedPiece(_Piece):
    """DCP ``_Checkpointable`` stand-in on save: one write item per run box written."""

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        properties = TensorProperties.create_from_tensor(self.local)
        return [
            WriteItem(
                index=MetadataIndex(fqn, _offsets(rb.box)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=_offsets(rb.box), sizes=_sizes(rb.box)),
                    properties=properties,
                    size=self.shape,
                ),
            )
            for rb in self.boxes
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(_offsets(rb.box), _sizes(rb.box)) for rb in self.boxes]


class _LoadTarget(_Piece):
    """DCP ``_Checkpointable`` stand-in on load.

    Its chunk list is empty so that DCP's default plan function makes no reads for it
    (it still checks the key and the global size); :class:`ExactLoadPlanner` adds the
    exact reads.
    """

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return []


def _save_stand_ins(state_dict: dict[str, Any]) -> dict[str, Any]:
    out = dict(state_dict)
    rank = _rank()
    for fqn, value in state_dict.items():
        if _handled(value):
            spec = dtensor_spec(value)
            local = _local_piece(fqn, value, spec, rank)
            boxes = written_boxes(spec, rank, salt=zlib.crc32(fqn.encode()))
            out[fqn] = _SavedPiece(fqn, local, spec.global_shape, boxes)
    return out


def _load_stand_ins(state_dict: dict[str, Any]) -> dict[str, Any]:
    out = dict(state_dict)
    rank = _rank()
    for fqn, value in state_dict.items():
        if _handled(value):
            spec = dtensor_spec(value)
            local = _local_piece(fqn, value, spec, rank)
            out[fqn] = _LoadTarget(fqn, local, spec.global_shape, run_boxes(spec, rank))
        elif type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
            whole = tuple((0, int(n)) for n in value.shape)
            boxes = [RunBox(whole, (0,) * value.dim())] if value.numel() else []
            out[fqn] = _LoadTarget(fqn, value, value.shape, boxes)
    return out


# ---------------------------------------------------------------------- planners
class ExactSavePlanner(DefaultSavePlanner):
    """``DefaultSavePlanner`` that saves every DTensor with its true chunks.

    For each DTensor (its layout read by :func:`dtensor_spec`), each run box the rank
    holds becomes one chunk at its true global offset; empty pieces write nothing;
    along ``Replicate`` mesh dims one holder per box writes, chosen deterministically
    (:func:`~meshlayout.torch.checkpoint.written_boxes`). Plain tensors, non-tensor
    values and all constructor options behave as in ``DefaultSavePlanner``.

    Usage: ``dcp.save(state_dict, checkpoint_id=path, planner=ExactSavePlanner())``
    (``dcp.async_save`` likewise).
    """

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        storage_meta: StorageMeta | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self.state_dict = _save_stand_ins(self.state_dict)

    def lookup_object(self, index: MetadataIndex) -> Any:
        value = self.state_dict.get(index.fqn)
        if isinstance(value, _SavedPiece):
            return value.__get_tensor_shard__(index)
        return super().lookup_object(index)


class ExactLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that fills each destination run box from exactly the saved
    chunks overlapping it.

    Destinations: DTensors of any sharding on any mesh (their layout read by
    :func:`dtensor_spec`) and plain tensors. Each destination element must be covered
    by exactly one saved chunk, else ``ValueError`` names the tensor, the box and what
    is missing or ambiguous (the default planner would keep stale values silently).
    Keys, ``allow_partial_load``, non-tensor values and flattening are DCP's; a key the
    checkpoint lacks raises ``KeyError`` naming it, what the checkpoint holds and, when
    the nesting differs (a flat state dict against ``{"model": ...}``), the nesting.

    Usage: ``dcp.load(state_dict, checkpoint_id=path, planner=ExactLoadPlanner())``.
    """

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        self._plain = self.state_dict
        self._stand_ins = _load_stand_ins(self.state_dict)
        self.state_dict = self._stand_ins

    def create_local_plan(self) -> LoadPlan:
        try:
            plan = super().create_local_plan()
        except RuntimeError:  # DCP's "Missing key in checkpoint state_dict": say which and why
            stored = self._require_metadata().state_dict_metadata
            missing = [k for k in self.state_dict if k not in stored]
            if not missing:
                raise
            raise CheckpointKeyError(missing_keys_message(missing, list(stored))) from None
        if self.state_dict is not self._stand_ins:
            # The parent fell back to pre-2.4 key flattening and swapped the state dict.
            self._plain = self.state_dict
            self._stand_ins = _load_stand_ins(self.state_dict)
            self.state_dict = self._stand_ins
            plan = create_default_local_load_plan(
                self.state_dict, self._require_metadata(), not self.allow_partial_load
            )
        return dataclasses.replace(plan, items=[*plan.items, *self._exact_reads()])

    def _require_metadata(self) -> Metadata:
        if self.metadata is None:
            raise ValueError("ExactLoadPlanner needs the checkpoint metadata (set_up_planner)")
        return self.metadata

    def _exact_reads(self) -> list[ReadItem]:
        saved = self._require_metadata().state_dict_metadata
        items: list[ReadItem] = []
        indices: dict[Any, ChunkIndex] = {}
        for fqn, target in self.state_dict.items():
            md = saved.get(fqn)
            if not isinstance(target, _LoadTarget) or not isinstance(md, TensorStorageMetadata):
                continue
            layout = (md.size, tuple((c.offsets, c.sizes) for c in md.chunks))
            index = indices.get(layout)
            if index is None:  # tensors of one shape and sharding share one index
                index = indices[layout] = ChunkIndex(*layout)
            for r in index.reads(target.boxes, what=fqn):
                chunk = md.chunks[r.chunk]
                items.append(
                    ReadItem(
                        type=LoadItemType.TENSOR,
                        dest_index=MetadataIndex(fqn, _offsets(target.boxes[r.box].box), r.box),
                        dest_offsets=torch.Size(r.dest_offsets),
                        storage_index=MetadataIndex(fqn, chunk.offsets, r.chunk),
                        storage_offsets=torch.Size(r.storage_offsets),
                        lengths=torch.Size(r.lengths),
                    )
                )
        return items

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        value = self.state_dict.get(index.fqn)
        if isinstance(value, _LoadTarget):
            return value.__get_tensor_shard__(index)
        return super().lookup_tensor(index)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        if self.flatten_state_dict:
            super().load_bytes(read_item, value)
        else:  # the default stores into its own state dict, which holds our stand-ins
            fqn = read_item.dest_index.fqn
            self._plain[fqn] = torch.load(value, weights_only=False)
            if fqn in self.original_state_dict:
                self.original_state_dict[fqn] = self._plain[fqn]
