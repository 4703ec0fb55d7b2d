"""Run DCP's save and load protocol for N ranks inside ONE process (torch's fake backend).

``dcp.save`` / ``dcp.load`` are, per rank: set up the planner and storage, make a
local plan; on the coordinator: make the global plan (and metadata); per rank: finish
the plan and write or read the data; on the coordinator: finish. These helpers call
exactly those planner and storage methods (the ``SavePlanner`` / ``LoadPlanner``
protocol), rank after rank, with a fake process group initialised as that rank while
its state dict and plans are built, so meshes far larger than the processes we may
start (e.g. 12 or 16 ranks) write and read real checkpoint files.

Only for a process that never starts gloo (run it in a spawned child): the default
process group is initialised and destroyed once per emulated rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlanner, SavePlanner
from torch.testing._internal.distributed.fake_pg import FakeStore

__all__ = [
    "as_rank",
    "device_mesh",
    "dtensor_of",
    "emulated_load",
    "emulated_save",
    "fsdp_over_tp_checkpoint",
]


class as_rank:
    """Context: the default process group is a fake one in which we are ``rank``."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def __enter__(self) -> as_rank:
        dist.init_process_group("fake", store=FakeStore(), rank=self.rank, world_size=self.world)
        return self

    def __exit__(self, *exc: object) -> None:
        dist.destroy_process_group()


def device_mesh(mesh: Any, rank: int) -> Any:
    """The torch DeviceMesh of meshlayout ``mesh`` that contains ``rank`` (its sub-mesh)."""
    from torch.distributed.device_mesh import DeviceMesh

    sub = mesh.submesh(rank) if rank in mesh else mesh.submeshes()[0]
    return DeviceMesh("cpu", torch.as_tensor(sub), mesh_dim_names=mesh.names)


def dtensor_of(spec: Any, rank: int, data: Any) -> Any:
    """The DTensor ``rank`` holds of global ``data`` under a meshlayout ``spec``.

    Its local tensor is ``spec.shard(data, rank)``: the nested shard order for
    decodable placements — what FSDP2, TP and ``redistribute`` physically store.
    """
    from torch.distributed.tensor import DTensor

    local = spec.shard(data, rank).contiguous()
    shape = torch.Size(spec.global_shape)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        local,
        device_mesh(spec.mesh, rank),
        spec.to_torch(),
        run_check=False,
        shape=shape,
        stride=stride,
    )


def emulated_save(
    world: int,
    make_state_dict: Callable[[int], dict[str, Any]],
    path: str,
    planner: Callable[[], SavePlanner],
    *,
    validate: bool = True,
) -> Metadata:
    """``dcp.save`` by ``world`` emulated ranks; ``make_state_dict(rank)`` runs as that rank.

    ``validate=False`` skips the global plan's validation (what torch before the
    overlap check would have written): DCP's own ``dedup_save_plans`` and
    ``create_default_global_save_plan`` make the plan.
    """
    planners, writers, plans = [], [], []
    for rank in range(world):
        with as_rank(rank, world):
            sd = make_state_dict(rank)
            p, w = planner(), FileSystemWriter(path)
            p.set_up_planner(sd, w.storage_meta(), rank == 0)
            w.set_up_storage_writer(rank == 0)
            plans.append(w.prepare_local_plan(p.create_local_plan()))
            planners.append(p)
            writers.append(w)
    if validate:
        global_plans, metadata = planners[0].create_global_plan(plans)
    else:
        from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
        from torch.distributed.checkpoint.default_planner import create_default_global_save_plan

        global_plans, metadata = create_default_global_save_plan(dedup_save_plans(plans))
    global_plans = writers[0].prepare_global_plan(global_plans)
    results = []
    for rank in range(world):
        final = planners[rank].finish_plan(global_plans[rank])
        fut = writers[rank].write_data(final, planners[rank])
        fut.wait()
        results.append(fut.value())
    writers[0].finish(metadata, results)
    return metadata


def emulated_load(
    world: int,
    make_state_dict: Callable[[int], dict[str, Any]],
    path: str,
    planner: Callable[[], LoadPlanner],
) -> list[dict[str, Any]]:
    """``dcp.load`` by ``world`` emulated ranks; returns every rank's filled state dict."""
    planners, readers, plans, dicts = [], [], [], []
    for rank in range(world):
        with as_rank(rank, world):
            sd = make_state_dict(rank)
            reader = FileSystemReader(path)
            metadata = reader.read_metadata()
            reader.set_up_storage_reader(metadata, rank == 0)
            p = planner()
            p.set_up_planner(sd, metadata, rank == 0)
            plans.append(reader.prepare_local_plan(p.create_local_plan()))
            planners.append(p)
            readers.append(reader)
            dicts.append(sd)
    global_plans = readers[0].prepare_global_plan(planners[0].create_global_plan(plans))
    for rank in range(world):
        final = planners[rank].finish_plan(global_plans[rank])
        readers[rank].read_data(final, planners[rank]).wait()
    return dicts


def fsdp_over_tp_checkpoint(
    path: str, rows: int, planner: Callable[[], SavePlanner], *, validate: bool = True
) -> None:
    """A ``(rows, 3)`` weight laid out as FSDP2 over ColwiseParallel stores it on (dp=3, tp=2)
    (``[_StridedShard(0, 2), Shard(0)]``, values ``arange``), saved by 6 emulated ranks
    with ``planner``, plus a non-tensor value ``step``."""
    from meshlayout import Mesh
    from meshlayout.sharding import Shard, ShardingSpec, StridedShard

    spec = ShardingSpec((rows, 3), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
    data = torch.arange(rows * 3.0).view(rows, 3)
    emulated_save(
        6, lambda r: {"w": dtensor_of(spec, r, data), "step": 7}, path, planner, validate=validate
    )
