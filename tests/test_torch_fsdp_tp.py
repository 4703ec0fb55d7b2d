"""A tiny MLP with TP (Colwise/Rowwise) + FSDP2 on meshes from ``meshlayout.torch.build``.

Loss and gradients must match a single-process run of the same model and batch.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

DIM, HIDDEN, BATCH = 8, 12, 8


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, DIM)
    )


def _batch() -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, DIM, generator=g)


def _reference() -> tuple[float, dict[str, Any]]:
    model = _model()
    loss = model(_batch()).pow(2).sum(-1).mean()
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _train_step(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from meshlayout import ParallelDims
    from meshlayout.torch import build

    pd = ParallelDims(world, dp_shard=2, tp=2)
    meshes = build(pd, "cpu", timeout=120)
    tp = meshes.get_or_create("tp")
    dp = meshes.get_or_create("dp_shard")
    model = _model()
    parallelize_module(model, tp.to_torch(), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=dp.to_torch())
    shard = _batch().chunk(2)[dp.get_local_rank(0)]
    loss = model(shard).pow(2).sum(-1).mean()
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total, group=dp.get_group(0))
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    placements = {n: [str(x) for x in p.placements] for n, p in model.named_parameters()}
    return {"loss": float(total) / 2, "grads": grads, "placements": placements}


def test_tp_fsdp2_mlp_matches_single_process() -> None:
    ref_loss, ref_grads = _reference()
    out = run_multiproc(_train_step, 4, timeout=300)
    for res in out:
        assert abs(res["loss"] - ref_loss) < 1e-5
        assert set(res["grads"]) == set(ref_grads)
        for name, grad in res["grads"].items():
            assert grad.shape == ref_grads[name].shape
            assert (grad - ref_grads[name]).abs().max() < 1e-5, name
        # FSDP over TP: a 2-D spec on (dp_shard, tp)
        assert len(res["placements"]["0.weight"]) == 2
