"""One short job that uses meshlayout's groups, an exact checkpoint and a weight transfer.

    torchrun --standalone --nproc-per-node 4 benchmarks/exit_soak_job.py CHECKPOINT_DIR

What a user's script does: ``build`` the meshes of ``ParallelDims(4, dp_shard=2,
tp=2)``, put a small uneven model under TP + FSDP2 on them, one training step, save
it with ``meshlayout.torch.checkpoint.save``, load it back on an FSDP-only layout
(dp_shard=4) with ``load``, push the trained weights to TP pieces on ranks 2-3 with
``WeightTransfer(verify=True)``, ``destroy_process_group()`` and return. Nothing
special at exit: no ``os._exit``, no cache clearing. Prints ``JOB OK`` on rank 0 when
every check passed. ``benchmarks/soak_exit.py`` runs it many times and counts the
runs whose exit is not clean.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from meshlayout import Mesh, ParallelDims
from meshlayout.sharding import Shard, ShardingSpec
from meshlayout.torch import WeightTransfer, build
from meshlayout.torch import checkpoint as mlcp

VOCAB, HIDDEN = 101, 12  # uneven on tp=2 and on fsdp=2 / fsdp=4


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB))


def _train_layout(world: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    meshes = build(ParallelDims(world, dp_shard=2, tp=2), "cpu", timeout=120)
    model = _model(0)
    plan = {
        "0": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "1": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, meshes.get_or_create("tp").to_torch(), plan)
    fully_shard(model, mesh=meshes.get_or_create("fsdp").to_torch())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank() // 2)
    x = torch.randint(0, VOCAB, (4, 6), generator=g)
    out = model(x)
    out = out.full_tensor() if isinstance(out, DTensor) else out
    out.float().pow(2).mean().backward()
    opt.step()
    return model, opt


def main() -> int:
    ckpt = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, _ = _train_layout(world)
    trained = {n: p.full_tensor() for n, p in model.named_parameters()}
    mlcp.save({"model": model.state_dict()}, ckpt)

    # resume on another layout: FSDP alone over the 4 ranks
    meshes = build(ParallelDims(world, dp_shard=world), "cpu", timeout=120)
    resumed = _model(1)
    fully_shard(resumed, mesh=meshes.get_or_create("fsdp").to_torch())
    state = {"model": resumed.state_dict()}
    mlcp.load(state, ckpt)
    bad = [n for n, p in resumed.named_parameters() if not torch.equal(p.full_tensor(), trained[n])]

    # weight sync: FSDP pieces on ranks 0-3 -> TP=2 pieces on ranks 2-3
    serve = Mesh({"tp": 2}, ranks=[2, 3])
    dst = None
    if rank in serve:
        dst = {n: ShardingSpec(tuple(t.shape), serve, [Shard(0)]) for n, t in trained.items()}
    wt = WeightTransfer(dict(resumed.named_parameters()), dst, bucket_bytes=4096, timeout=120)
    got = wt.run(verify=True)
    for n, piece in got.items():
        assert dst is not None
        if not torch.equal(piece, dst[n].shard(trained[n], rank)):
            bad.append(f"transfer {n}")
    flags = torch.tensor([len(bad)])
    dist.all_reduce(flags)
    if rank == 0:
        print("JOB OK" if int(flags) == 0 else f"JOB FAILED: {bad}", flush=True)
    dist.destroy_process_group()
    return 0 if int(flags) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
