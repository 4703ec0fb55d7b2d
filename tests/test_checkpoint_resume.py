"""Resuming training with optimizer state on another layout, as docs/checkpoint.md shows it.

Six gloo processes train a small model with FSDP2 over TP at (dp=3, tp=2) on meshes
built by ``meshlayout.torch.build`` (uneven: 7 and 13 rows, so FSDP shards TP's pieces
unevenly, ``_StridedShard``), two Adam steps; torch's ``get_state_dict`` gives the
model and optimizer state dicts, ``mlcp.save`` writes them with the step. The same
processes then build the model at (dp=2, tp=3), ``get_state_dict`` (which creates
Adam's state), ``mlcp.load``, ``set_state_dict``: every parameter and every Adam
state (``exp_avg``, ``exp_avg_sq``, ``step``), gathered with torch's own
``full_tensor()``, must equal the trained one bitwise. A third step on the new
layout is compared with a single-process model and Adam resumed from those full
tensors (within float tolerance: the reductions run in another order).

The dtype rule on load: the checkpoint's float32 weights load into bfloat16 DTensors
as ``Tensor.to(torch.bfloat16)`` gives them, bitwise; without a process group, float32
values load into float64, float16 and int32 tensors and int64 values into float32
tensors as ``to`` converts them (float to integer truncates toward zero).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

WORLD = 6
STEPS = 2


def _model(seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 13), nn.ReLU(), nn.Linear(13, 3))


def _batch(step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)


def _train_step(model: Any, opt: Any, step: int) -> None:
    """Every rank sees the whole batch: FSDP's averaged gradient is the full-batch one."""
    import torch

    x, y = _batch(step)
    out = model(x)
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    loss = torch.nn.functional.mse_loss(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _parallel(dp: int, tp: int, seed: int) -> tuple[Any, Any]:
    """FSDP2 over TP on meshes built by meshlayout; Colwise, Rowwise, Colwise."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from meshlayout import ParallelDims
    from meshlayout.torch import build

    meshes = build(ParallelDims(WORLD, dp_shard=dp, tp=tp), "cpu", timeout=300)
    model = _model(seed)
    plan = {  # replicated activations between layers (uneven Colwise -> Rowwise)
        "0": ColwiseParallel(output_layouts=Replicate()),
        "2": RowwiseParallel(input_layouts=Replicate()),
        "4": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, meshes.get_or_create("tp").to_torch(), plan)
    fsdp = meshes.get_or_create("fsdp").to_torch()
    for i in (0, 2, 4):
        fully_shard(model[i], mesh=fsdp)
    fully_shard(model, mesh=fsdp)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def _full(value: Any) -> Any:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _gathered(model: Any, opt: Any) -> dict[str, Any]:
    """Every parameter and Adam state as full tensors (torch's ``full_tensor``)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    out = {f"model.{k}": _full(v).detach().clone() for k, v in msd.items()}
    for param, states in osd["state"].items():
        for key, v in states.items():
            out[f"optim.{param}.{key}"] = _full(v).detach().clone()
    return out


def _bits(t: Any) -> Any:
    return t.contiguous().view(-1).view(__import__("torch").uint8)


def _differ(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    import torch

    if sorted(got) != sorted(want):
        return [f"keys {sorted(got)} != {sorted(want)}"]
    return [
        k
        for k in want
        if got[k].dtype != want[k].dtype
        or got[k].shape != want[k].shape
        or not torch.equal(_bits(got[k]), _bits(want[k]))
    ]


def _resume(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import DTensor

    from meshlayout.torch import checkpoint as mlcp

    torch.set_num_threads(1)
    path = f"{root}/step-{STEPS}"
    # ---- train at (dp=3, tp=2), save model + optimizer + step
    model, opt = _parallel(dp=3, tp=2, seed=0)
    for step in range(STEPS):
        _train_step(model, opt, step)
    trained = _gathered(model, opt)
    strided = str(model[0].weight.placements)
    msd, osd = get_state_dict(model, opt)
    mlcp.save({"model": msd, "optim": osd, "step": STEPS}, path)
    del model, opt, msd, osd
    dist.barrier()

    # ---- resume at (dp=2, tp=3): another seed, so nothing is right by accident
    model, opt = _parallel(dp=2, tp=3, seed=1)
    msd, osd = get_state_dict(model, opt)  # creates Adam's state: destinations to fill
    state = {"model": msd, "optim": osd, "step": -1}
    mlcp.load(state, path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    resumed = _gathered(model, opt)
    _train_step(model, opt, STEPS)
    after = {k: _full(v).detach().clone() for k, v in model.state_dict().items()}

    # ---- the dtype rule on DTensors: float32 stored, bfloat16 destinations
    bf16 = {
        k: DTensor.from_local(
            v.to_local().to(torch.bfloat16),
            v.device_mesh,
            v.placements,
            shape=v.shape,
            stride=v.stride(),
        )
        for k, v in model.state_dict().items()
    }
    mlcp.load({"model": bf16}, path)
    cast = {f"model.{k}": _full(v) for k, v in bf16.items()}
    cast_want = {k: v.to(torch.bfloat16) for k, v in trained.items() if k.startswith("model.")}

    result: dict[str, Any] = {
        "strided": strided,
        "step": state["step"],
        "differ": _differ(resumed, trained),
        "states": sorted(k.rsplit(".", 1)[1] for k in trained if k.startswith("optim.")),
        "cast_differ": _differ(cast, cast_want),
    }
    if rank == 0:
        result["trained"], result["after"] = trained, after
    return result


def _single_process_step(trained: dict[str, Any]) -> dict[str, Any]:
    """A single-process model and Adam resumed from the full tensors, one more step."""
    import torch

    model = _model(seed=2)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    model.load_state_dict({k[6:]: v for k, v in trained.items() if k.startswith("model.")})
    names = [n for n, _ in model.named_parameters()]
    opt.load_state_dict(
        {
            "state": {
                i: {
                    key: trained[f"optim.{name}.{key}"] for key in ("step", "exp_avg", "exp_avg_sq")
                }
                for i, name in enumerate(names)
            },
            "param_groups": [{**opt.param_groups[0], "params": list(range(len(names)))}],
        }
    )
    _train_step(model, opt, STEPS)
    return model.state_dict()


def test_resume_with_optimizer_state_on_another_layout(tmp_path: Path) -> None:
    import torch

    results = run_multiproc(_resume, WORLD, str(tmp_path), timeout=540)
    for r in results:
        assert r["strided"].startswith("(_StridedShard(dim=0, sf=2)"), r["strided"]
        assert r["step"] == STEPS
        assert r["differ"] == [], r["differ"]  # parameters and Adam state: bitwise
        assert r["states"] == sorted(["exp_avg", "exp_avg_sq", "step"] * 6)
        assert r["cast_differ"] == [], r["cast_differ"]
    want = _single_process_step(results[0]["trained"])
    for name, value in results[0]["after"].items():
        torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-6)


def _dtypes(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch

    from meshlayout.torch import checkpoint as mlcp

    stored = {
        "f32": torch.tensor([1.0009765625, -1.7, 2.5, 3.999, -0.5]),  # 1 + 2**-10: not in bf16
        "i64": torch.tensor([2**40 + 1, -3, 7]),
    }
    mlcp.save(stored, f"{root}/ckpt", no_dist=True)
    cases: dict[str, bool] = {}
    loaded: dict[str, list[Any]] = {}
    for name, dtype in (
        ("f32", torch.float64),
        ("f32", torch.float16),
        ("f32", torch.bfloat16),
        ("f32", torch.int32),
        ("i64", torch.float32),
    ):
        dest = {name: torch.zeros(stored[name].shape, dtype=dtype)}
        mlcp.load(dest, f"{root}/ckpt", no_dist=True)
        want = stored[name].to(dtype)  # torch's conversion, computed apart from the load
        key = f"{name} -> {str(dtype).removeprefix('torch.')}"
        cases[key] = dest[name].dtype == dtype and torch.equal(dest[name], want)
        loaded[key] = dest[name].tolist()
    return {"cases": cases, "loaded": loaded}


def test_the_dtype_rule_on_load_without_a_process_group(tmp_path: Path) -> None:
    (out,) = run_multiproc(_dtypes, 1, str(tmp_path), timeout=240, init=False)
    assert out["cases"] == {
        "f32 -> float64": True,
        "f32 -> float16": True,
        "f32 -> bfloat16": True,
        "f32 -> int32": True,
        "i64 -> float32": True,
    }
    assert out["loaded"]["f32 -> int32"] == [1, -1, 2, 3, 0]  # truncated toward zero
    assert out["loaded"]["f32 -> bfloat16"][0] == 1.0  # rounded to the nearest bfloat16
    assert out["loaded"]["i64 -> float32"][0] == 2.0**40  # 2**40 + 1 rounds in float32
