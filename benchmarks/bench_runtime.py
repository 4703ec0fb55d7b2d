"""Runtime benchmarks: group creation per rank, and full_tensor of an FSDP+TP parameter.

(a) Group-creation calls and time for ONE rank of a 5-D (pp, dp_replicate, dp_shard,
    cp, tp) job plus its MoE view, with torch's ``fake`` backend (no peers, so this
    measures the calls each real rank would make):
    ours = ``meshlayout.torch.build(ParallelDims(...))`` (every view), torch = ``init_device_mesh`` on the
    world + ``_unflatten`` into the dense and sparse meshes (torchtitan's recipe).
(b) ``full_tensor`` of a strided, uneven FSDP-over-TP parameter on 4 gloo processes
    (dp=2, tp=2, placements [_StridedShard(0, 2), Shard(0)]): ours (one all-gather) vs
    DTensor ``full_tensor()``; median of repeats.

Run: ``.venv/bin/python benchmarks/bench_runtime.py [--quick]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TORCH_MAX_LOG2 = 17  # torch makes O(world) calls per rank; 2^17 takes ~10-20 s with "fake"


def _degrees(world: int) -> dict[str, int]:
    return {"pp": 4, "dp_replicate": 2, "cp": 2, "tp": 8, "ep": 8, "etp": 1}


def _creation_child(world: int, which: str, out: Any) -> None:
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from torch.distributed import distributed_c10d as c10d

    calls = {"n": 0}
    dist.init_process_group("fake", rank=world // 2 + 3, world_size=world, store=dist.HashStore())
    if which == "ours":
        from meshlayout import ParallelDims
        from meshlayout.torch import _c10d, build

        real = _c10d.create_group

        def counted(*a: Any, **k: Any) -> Any:
            calls["n"] += 1
            return real(*a, **k)

        _c10d.create_group = counted
        t0 = time.perf_counter()
        pd = ParallelDims(world, **_degrees(world))
        build(pd, "cpu", check=False)
        elapsed = time.perf_counter() - t0
    else:
        from torch.distributed.device_mesh import init_device_mesh

        real_new = c10d.new_group

        def counted_new(*a: Any, **k: Any) -> Any:
            calls["n"] += 1
            return real_new(*a, **k)

        c10d.new_group = counted_new
        dist.new_group = counted_new
        import torch.distributed.device_mesh as dm_mod

        dm_mod.new_group = counted_new  # device_mesh imported the name
        d = _degrees(world)
        dp_shard = world // (d["pp"] * d["dp_replicate"] * d["cp"] * d["tp"])
        efsdp = dp_shard * d["cp"] * d["tp"] // (d["ep"] * d["etp"])
        t0 = time.perf_counter()
        root = init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
        root._unflatten(
            0,
            (d["pp"], d["dp_replicate"], dp_shard, d["cp"], d["tp"]),
            ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
        )
        root._unflatten(
            0,
            (d["pp"], d["dp_replicate"], efsdp, d["ep"], d["etp"]),
            ("pp", "dp_replicate", "efsdp", "ep", "etp"),
        )
        elapsed = time.perf_counter() - t0
    out.put((calls["n"], elapsed))


def bench_creation(max_log2: int) -> list[tuple[int, str, int, float]]:
    ctx = mp.get_context("spawn")
    rows = []
    for k in range(10, max_log2 + 1):
        world = 2**k
        for which in ("ours", "torch"):
            if which == "torch" and k > TORCH_MAX_LOG2:
                continue
            q = ctx.Queue()
            p = ctx.Process(target=_creation_child, args=(world, which, q))
            p.start()
            try:
                calls, seconds = q.get(timeout=1800)
            finally:
                p.join(timeout=60)
            rows.append((world, which, calls, seconds))
            print(f"  2^{k:<2} {which:5}: {calls:>7} calls  {seconds:8.3f} s", flush=True)
    return rows


def _full_tensor_body(rank: int, world: int, sizes_mb: list[int], repeats: int) -> Any:
    import logging

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from meshlayout import Mesh
    from meshlayout.sharding import Shard, ShardingSpec, StridedShard
    from meshlayout.torch import full_tensor, init_mesh

    # DTensor warns on every call that it runs 2 sequential all-gathers; we report it once.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dm = init_mesh(Mesh({"dp": 2, "tp": 2}), timeout=120)
    tdm = dm.to_torch()
    results = []
    for mb in sizes_mb:
        cols = 1024
        rows = max(mb * 2**20 // (4 * cols), 8) + 3  # uneven
        x = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
        spec = ShardingSpec(x.shape, dm.mesh, [StridedShard(0, 2), Shard(0)])
        local = spec.shard(x, rank).contiguous()
        dt = DTensor.from_local(
            local, tdm, spec.to_torch(), run_check=False, shape=x.shape, stride=x.stride()
        )
        timings: dict[str, list[float]] = {"ours": [], "torch": []}
        ok = {"ours": True, "torch": True}
        for _ in range(repeats):
            for which in ("ours", "torch"):
                dist.barrier()
                t0 = time.perf_counter()
                full = full_tensor(local, dm, spec) if which == "ours" else dt.full_tensor()
                timings[which].append(time.perf_counter() - t0)
                ok[which] = ok[which] and bool(torch.equal(full, x))
        results.append(
            (mb, statistics.median(timings["ours"]), statistics.median(timings["torch"]), ok)
        )
    return results


def bench_full_tensor(sizes_mb: list[int], repeats: int) -> Any:
    from multiproc import run_multiproc

    out = run_multiproc(_full_tensor_body, 4, sizes_mb, repeats, timeout=900)
    return out[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = parser.parse_args()
    max_log2 = 13 if args.quick else 17
    print("(a) group creation for one rank, 5-D dense + MoE views (fake backend)")
    rows = bench_creation(max_log2)
    print("\n| world | ours: calls | ours: s | torch: calls | torch: s |")
    print("|---:|---:|---:|---:|---:|")
    by = {(w, which): (c, s) for w, which, c, s in rows}
    for world in sorted({w for w, *_ in rows}):
        oc, os_ = by[(world, "ours")]
        tc, ts = by.get((world, "torch"), (None, None))
        torch_cells = f"{tc} | {ts:.3f}" if tc is not None else "— | —"
        print(f"| 2^{world.bit_length() - 1} | {oc} | {os_:.3f} | {torch_cells} |")
    sizes = [1, 4, 16] if args.quick else [1, 4, 16, 64]
    repeats = 3 if args.quick else 7
    print("\n(b) full_tensor, [_StridedShard(0, 2), Shard(0)] on (dp=2, tp=2), 4 gloo procs")
    print("| MB | ours ms | DTensor ms | speed-up | ours exact | DTensor exact |")
    print("|---:|---:|---:|---:|:---:|:---:|")
    for mb, ours, theirs, ok in bench_full_tensor(sizes, repeats):
        print(
            f"| {mb} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {theirs / ours:.2f}x | "
            f"{ok['ours']} | {ok['torch']} |"
        )


if __name__ == "__main__":
    main()
