"""Sharding: placements, the shard order, and every rank's exact local piece.

The truth is the **shard order**: per tensor dim, the mesh dims that split it,
outermost first; a rank's piece is nested ``torch.chunk``-rule chunking in that
order. Placement lists are torch-compatible encodings of it (``StridedShard``
where a mesh dim splits inside a later one, as FSDP2 over TP does). Lists torch's
planner cannot decode keep the literal ``_StridedShard`` split meaning and may give
a rank several runs per dim. :class:`RunsSpec` gives a layout by explicit per-rank
runs instead (vLLM's padded and fused pieces, views such as one expert of a
stacked tensor: :func:`view_spec`). See ``docs/sharding.md``.

``import meshlayout.sharding`` never imports torch; only ``to_torch``/``from_torch``
and torch arrays passed to ``shard``/``unshard`` do.
"""

from ._boxes import (
    Box,
    Piece,
    RunBox,
    box_numel,
    box_slices,
    intersect,
    local_slices,
    pieces,
    run_boxes,
)
from ._literal import Step, placement_steps, torch_split_runs
from ._order import Run, Runs, chunk_bounds, literal_runs
from ._placements import REDUCE_OPS, Partial, Placement, Replicate, Shard, StridedShard
from ._reshard import ReshardPlan, Transfer, reshard_plan
from ._runs_spec import RunsSpec, view_shape, view_spec
from ._spec import MeshLike, ShardingSpec
from ._transfer import Slot, TensorTransfer, TransferPlan, TransferRound, slabs, transfer_plan

__all__ = [
    "REDUCE_OPS",
    "Box",
    "MeshLike",
    "Partial",
    "Piece",
    "Placement",
    "Replicate",
    "ReshardPlan",
    "Run",
    "RunBox",
    "Runs",
    "RunsSpec",
    "Shard",
    "ShardingSpec",
    "Slot",
    "Step",
    "StridedShard",
    "TensorTransfer",
    "Transfer",
    "TransferPlan",
    "TransferRound",
    "box_numel",
    "box_slices",
    "chunk_bounds",
    "intersect",
    "literal_runs",
    "local_slices",
    "pieces",
    "placement_steps",
    "reshard_plan",
    "run_boxes",
    "slabs",
    "torch_split_runs",
    "transfer_plan",
    "view_shape",
    "view_spec",
]
