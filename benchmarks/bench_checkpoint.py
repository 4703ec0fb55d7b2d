"""Checkpoint benchmark: exact planners vs plain DCP, save + load of an FSDP2 + TP model.

(a) 4 gloo processes, (dp=2, tp=2), a 64 MB float32 model of even shapes (4 x
    Linear(2048, 2048), Colwise / Rowwise alternating, FSDP2 over dp), so plain DCP
    is correct too: ``dcp.save`` + ``dcp.load`` (in place) with the default planners
    vs ``meshlayout.torch.checkpoint.save`` / ``load``, same run, alternating order,
    median of repeats. Files go to ``/dev/shm`` when it exists (disk noise out).
(b) Planning alone, one process, torch's fake backend: the local save plan and the
    local load plan of a rank of a 1024-rank (dp=128, tp=8) job holding N DTensors
    ``[_StridedShard(0, 8), Shard(0)]`` (FSDP over TP; 4096 + i rows, so no two tensors
    share a chunk layout), against a checkpoint whose metadata lists 1024 chunks per
    tensor: ours vs the default planners.

Run: ``.venv/bin/python benchmarks/bench_checkpoint.py [--quick]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

LAYERS = 4
WIDTH = 2048  # 4 x 2048 x 2048 x 4 bytes = 64 MiB


def _model(zero: bool) -> Any:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)))
    if zero:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(LAYERS)}
    parallelize_module(model, mesh["tp"], plan)
    for layer in model:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def _save_load_body(rank: int, world: int, root: str, repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from meshlayout.torch import checkpoint as mlcp

    source = _model(zero=False).state_dict()
    target = _model(zero=True).state_dict()
    times: dict[str, list[float]] = {
        f"{w} {op}": [] for w in ("ours", "plain") for op in ("save", "load")
    }
    exact = {"ours": True, "plain": True}
    for k in range(repeats):
        order = ("ours", "plain") if k % 2 == 0 else ("plain", "ours")
        for which in order:
            path = f"{root}/{which}{k}"
            dist.barrier()
            t0 = time.perf_counter()
            if which == "ours":
                mlcp.save(source, path)
            else:
                dcp.save(source, checkpoint_id=path)
            dist.barrier()
            t1 = time.perf_counter()
            for v in target.values():
                v.to_local().zero_()
            dist.barrier()
            t2 = time.perf_counter()
            if which == "ours":
                mlcp.load(target, path)
            else:
                dcp.load(target, checkpoint_id=path)
            dist.barrier()
            t3 = time.perf_counter()
            times[f"{which} save"].append(t1 - t0)
            times[f"{which} load"].append(t3 - t2)
            exact[which] &= all(
                torch.equal(target[n].to_local(), source[n].to_local()) for n in source
            )
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    return {"median": {k: statistics.median(v) for k, v in times.items()}, "exact": exact}


def bench_save_load(repeats: int) -> dict[str, Any]:
    from multiproc import run_multiproc

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = tempfile.mkdtemp(prefix="bench_ckpt_", dir=base)
    try:
        out = run_multiproc(_save_load_body, 4, root, repeats, timeout=1800, start_method="spawn")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "rank0": out[0],
        "where": base or tempfile.gettempdir(),
        "exact": all(o["exact"]["ours"] and o["exact"]["plain"] for o in out),
    }


# ---------------------------------------------------------------------- (b) planning
def _planning_child(n_tensors: int, out: Any) -> None:
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    from dcp_emulation import as_rank, dtensor_of
    from meshlayout import Mesh
    from meshlayout.sharding import Shard, ShardingSpec, StridedShard
    from meshlayout.torch import checkpoint as mlcp

    world, rank = 1024, 517
    mesh = Mesh({"dp": 128, "tp": 8})
    # every tensor a different row count: no two share a chunk layout (no caching helps)
    specs = [
        ShardingSpec((4096 + i, 8), mesh, [StridedShard(0, 8), Shard(0)]) for i in range(n_tensors)
    ]

    def chunks(spec: ShardingSpec) -> list[Any]:
        return [
            ChunkStorageMetadata(torch.Size((a, 0)), torch.Size((b - a, 8)))
            for r in range(world)
            for (a, b) in spec.local_runs(r)[0]
        ]

    md = Metadata(
        {
            f"p{i}": TensorStorageMetadata(
                TensorProperties(torch.float32), torch.Size(spec.global_shape), chunks(spec)
            )
            for i, spec in enumerate(specs)
        }
    )
    results = {}
    with as_rank(rank, world):
        sd = {
            f"p{i}": dtensor_of(spec, rank, torch.zeros(spec.global_shape))
            for i, spec in enumerate(specs)
        }
        for name, save_cls, load_cls in (
            ("ours", mlcp.ExactSavePlanner, mlcp.ExactLoadPlanner),
            ("default", DefaultSavePlanner, DefaultLoadPlanner),
        ):
            t0 = time.perf_counter()
            sp = save_cls()
            sp.set_up_planner(sd, None, False)
            save_plan = sp.create_local_plan()
            t1 = time.perf_counter()
            lp = load_cls()
            lp.set_up_planner(sd, md, False)
            load_plan = lp.create_local_plan()
            t2 = time.perf_counter()
            results[name] = (t1 - t0, t2 - t1, len(save_plan.items), len(load_plan.items))
    out.put(results)


def bench_planning(counts: list[int]) -> list[tuple[int, dict[str, Any]]]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows = []
    for n in counts:
        q = ctx.Queue()
        p = ctx.Process(target=_planning_child, args=(n, q))
        p.start()
        try:
            rows.append((n, q.get(timeout=1800)))
        finally:
            p.join(timeout=60)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller planning")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    print(f"(a) save + load, 64 MB FSDP2 + TP model, 4 gloo processes, median of {repeats}")
    res = bench_save_load(repeats)
    med = res["rank0"]["median"]
    print(f"files in {res['where']}; every load exact: {res['exact']}")
    print("| step | ours s | plain DCP s | ours / plain |")
    print("|---|---:|---:|---:|")
    for op in ("save", "load"):
        ours, plain = med[f"ours {op}"], med[f"plain {op}"]
        print(f"| {op} | {ours:.3f} | {plain:.3f} | {ours / plain:.2f}x |")
    ours = med["ours save"] + med["ours load"]
    plain = med["plain save"] + med["plain load"]
    print(f"| save + load | {ours:.3f} | {plain:.3f} | {ours / plain:.2f}x |")

    counts = [16, 64] if args.quick else [16, 64, 256]
    print("\n(b) local planning of one rank of 1024 (dp=128, tp=8), 1024 saved chunks per tensor")
    print(
        "| tensors | ours save ms | default save ms | ours load ms | default load ms | ours reads | default reads |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in bench_planning(counts):
        o, d = r["ours"], r["default"]
        print(
            f"| {n} | {o[0] * 1e3:.1f} | {d[0] * 1e3:.1f} | {o[1] * 1e3:.1f} | {d[1] * 1e3:.1f} "
            f"| {o[3]} | {d[3]} |"
        )


if __name__ == "__main__":
    main()
