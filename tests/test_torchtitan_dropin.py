"""``meshlayout.torch.torchtitan.ParallelDims`` against torchtitan 0.3.0's own, installed.

* **Fake backend** (``tests/torchtitan_reference.py``, one subprocess for the batch):
  for every configuration of ``torchtitan_configs.titan_jobs()`` (worlds 1 to 512;
  pp, dp_replicate, dp_shard incl. -1, cp, tp, ep) and each of 0.3.0's SPMD backends,
  torchtitan's ``ParallelDims.build_mesh`` and the drop-in run on the same simulated
  ranks. Every accessor's answer (the whole family of groups of every mesh, names,
  None-ness, exception types), the sizes and flags, the global meshes' names and the
  single-axis layouts are equal; on the first, last and a random rank the members of
  every real process group are equal; the drop-in makes one creation call per distinct
  group of its rank; the same configurations are refused.
* **gloo, 4 processes**: dp_shard=2 x tp=2 with FSDP2 over TP on a tiny model, trained
  a few steps with torchtitan's meshes and with the drop-in's: equal losses; and a rank
  started with other degrees makes every rank raise MeshMismatchError (no hang).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from meshlayout import ParallelDims as PureDims
from torch_versions import TORCHTITAN_MISSING, TORCHTITAN_USABLE
from torchtitan_configs import BACKENDS, TITAN_DEGREES

#: Tests of the shared reference run (conftest's fixture) go to one xdist worker.
reference_group = pytest.mark.xdist_group("torchtitan_reference")

needs_torchtitan = pytest.mark.skipif(not TORCHTITAN_USABLE, reason=TORCHTITAN_MISSING)


def _pure(cfg: dict[str, int]) -> PureDims:
    return PureDims(cfg["world_size"], **{d: cfg[d] for d in TITAN_DEGREES})


def _expected_creations(cfg: dict[str, int], backend: str, rank: int) -> int:
    """Distinct groups (not the world) of ``rank`` over torchtitan's global meshes: on the
    fake backend every group has the same backend, so one creation call each."""
    world = tuple(range(cfg["world_size"]))
    meshes = _pure(cfg).torchtitan(backend).global_meshes()
    groups = {m.group(rank, d) for m in meshes.values() for d in range(m.ndim)}
    return len(groups - {world})


@pytest.mark.torch
@reference_group
@needs_torchtitan
def test_dropin_answers_like_torchtitan_on_the_fake_backend(
    torchtitan_reference: list[tuple[dict[str, Any], list[dict[str, Any]]]],
) -> None:
    compared = refused = 0
    for job, per_rank in torchtitan_reference:
        cfg, backend = job["cfg"], job["backend"]
        for res in per_rank:
            theirs, ours = res["titan"], res["ours"]
            where = (backend, cfg, res["rank"])
            if "refused" in theirs:
                # The same configurations are refused, with the same exception type;
                # meshlayout refuses an `ep` that does not divide dp_shard*cp*tp already
                # at construction (torchtitan: in build_mesh, from torch's unflatten).
                assert "refused" in ours, where
                assert ours["error"] == theirs["error"], where
                if theirs["refused"] == "construction":
                    assert ours["refused"] == "construction", where
                refused += 1
                continue
            assert "refused" not in ours, (where, ours)
            assert set(ours) == set(theirs), where
            for key, value in theirs.items():
                if key != "creation_calls":
                    assert ours[key] == value, (where, key, ours[key], value)
            want = _expected_creations(cfg, backend, res["rank"])
            assert ours["creation_calls"] == want, where
            assert ours["creation_calls"] <= theirs["creation_calls"], where
            compared += 1
    assert refused == 3 * 11 and compared > 3 * 80 * 2


@pytest.mark.torch
@reference_group
@needs_torchtitan
def test_the_sweep_covers_every_backend_and_large_worlds(
    torchtitan_reference: list[tuple[dict[str, Any], list[dict[str, Any]]]],
) -> None:
    backends = {job["backend"] for job, _ in torchtitan_reference}
    assert backends == set(BACKENDS)
    worlds = {job["cfg"]["world_size"] for job, _ in torchtitan_reference}
    assert max(worlds) == 512
    inferred = [job for job, _ in torchtitan_reference if job["cfg"]["dp_shard"] == -1]
    assert len(inferred) > 60
    described = [
        r["titan"]
        for _, per_rank in torchtitan_reference
        for r in per_rank
        if "one_d" in r["titan"]
    ]
    assert len(described) == len(torchtitan_reference) - 3 * 11
    # torchtitan creates every group of every dim on every rank: hundreds at world 512
    big = [
        r["titan"]["creation_calls"]
        for job, per_rank in torchtitan_reference
        for r in per_rank
        if job["cfg"]["world_size"] == 512 and "creation_calls" in r["titan"]
    ]
    assert min(big) > 500


# ---------------------------------------------------------------------- construction


@needs_torchtitan
def test_same_constructor_and_surface() -> None:
    import dataclasses

    from torchtitan.distributed import ParallelDims as Titan

    from meshlayout.torch.torchtitan import ParallelDims

    assert issubclass(ParallelDims, Titan)
    fields = [f.name for f in dataclasses.fields(Titan)]
    assert [f.name for f in dataclasses.fields(ParallelDims)] == fields
    pd = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, world_size=8)
    assert pd.dp_shard == 4 and pd.spmd_backend == "spmd_types"
    assert pd.meshlayout_dims == PureDims(8, tp=2)
    public = {n for n in dir(Titan) if not n.startswith("_")}
    assert public <= set(dir(ParallelDims))
    with pytest.raises(AssertionError):  # torchtitan's own _validate runs first
        ParallelDims(dp_replicate=1, dp_shard=3, cp=1, tp=2, pp=1, ep=1, world_size=8)
    with pytest.raises(ValueError, match=r"ep=3 does not divide dp_shard\*cp\*tp/etp = 8"):
        ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=4, pp=1, ep=3, world_size=8)


def test_importing_meshlayout_torch_does_not_import_torchtitan() -> None:
    import subprocess

    code = "import sys, meshlayout.torch; print('torchtitan' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- gloo: FSDP2 x TP

DIM, HIDDEN, BATCH, STEPS = 8, 16, 8, 3


def _train(parallel_dims: Any, fsdp_axis: str) -> list[float]:
    """A tiny MLP, TP over ``tp`` and FSDP2 over ``fsdp_axis``; the loss of each step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    parallel_dims.build_mesh()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, DIM)
    )
    parallelize_module(
        model, parallel_dims.get_mesh("tp"), {"0": ColwiseParallel(), "2": RowwiseParallel()}
    )
    fully_shard(model, mesh=parallel_dims.get_mesh(fsdp_axis))
    optim = torch.optim.AdamW(model.parameters(), lr=0.05)
    batch_mesh = parallel_dims.get_mesh("batch")
    losses = []
    for step in range(STEPS):
        data = torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(step))
        local = data.chunk(batch_mesh.size())[batch_mesh.get_local_rank()]
        loss = model(local).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=parallel_dims.get_mesh("loss").get_group())
        losses.append(total.item() / batch_mesh.size())
    return losses


def _gloo_body(rank: int, world: int) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore")
    import torchtitan.distributed.parallel_dims as titan_module
    from torchtitan.distributed import ParallelDims as Titan

    # torchtitan has no CPU switch: it takes "cuda" when no accelerator is found. A test
    # shim (never in the library): its build_mesh and the drop-in read this module name.
    titan_module.device_type = "cpu"

    from meshlayout.torch.torchtitan import ParallelDims as Ours

    kw = dict(dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=1, ep=1, world_size=world)
    out: dict[str, Any] = {}
    for backend, axis in (("partial_dtensor", "fsdp"), ("spmd_types", "dp_shard")):
        out[backend] = {
            "titan": _train(Titan(**kw, spmd_backend=backend), axis),
            "ours": _train(Ours(**kw, spmd_backend=backend), axis),
        }
    return out


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@needs_torchtitan
def test_fsdp2_over_tp_trains_like_torchtitan_on_gloo() -> None:
    from multiproc import run_multiproc

    out = run_multiproc(_gloo_body, 4, timeout=600)
    for rank, res in enumerate(out):
        for backend, losses in res.items():
            assert len(losses["ours"]) == STEPS
            assert losses["ours"] == losses["titan"], (rank, backend, losses)
            assert losses["ours"] == out[0][backend]["ours"]  # every rank agrees


def _mismatch_body(rank: int, world: int) -> dict[str, Any]:
    import torchtitan.distributed.parallel_dims as titan_module

    from meshlayout.torch import MeshMismatchError
    from meshlayout.torch.torchtitan import ParallelDims as Ours

    titan_module.device_type = "cpu"  # test shim, see _gloo_body
    tp = 2 if rank < 3 else 4  # rank 3 was started with other degrees
    pd = Ours(dp_replicate=1, dp_shard=-1, cp=1, tp=tp, pp=1, ep=1, world_size=world)
    pd.timeout = 60
    try:
        pd.build_mesh()
    except MeshMismatchError as exc:
        return {"ranks": list(exc.ranks), "fields": list(exc.fields)}
    return {"built": True}


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@needs_torchtitan
def test_ranks_with_other_degrees_raise_instead_of_hanging() -> None:
    from multiproc import run_multiproc

    out = run_multiproc(_mismatch_body, 4, timeout=300)
    assert out == [{"ranks": [3], "fields": ["degrees"]}] * 4
