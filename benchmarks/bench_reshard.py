"""Reshard benchmark: FSDP(dp=4, Shard(0)) on ranks 0-3 -> TP(tp=2, Shard(1)) on ranks 2-3.

The weight-sync step of RL post-training, on 4 gloo processes (spawned), for float32
tensors of 1, 16 and 64 MB (1024 columns), in one run:

* **ours**: ``meshlayout.torch.reshard(local, fsdp, tp)`` — one ``all_to_all_single``
  over ranks 0-3 carrying exactly the plan's ``elements_moved``;
* **torch**: what a user writes today — ``DTensor.full_tensor()`` on the FSDP mesh
  (every source rank gathers the whole tensor), then ranks 2-3 take their column
  half (``full.tensor_split(2, dim=1)[i].contiguous()``, which is also what
  ``distribute_tensor(full, tp_mesh, [Shard(1)], src_data_rank=None)`` computes);
* **torch + distribute_tensor**: the same, but the TP pieces come from
  ``distribute_tensor(full, tp_mesh, [Shard(1)])`` with its default
  ``src_data_rank=0`` (the first TP rank scatters the pieces).

Bytes: the sum over ranks of the bytes each receives from *other* ranks, measured
in one extra (untimed) call per variant by a dispatch mode that sees every c10d
operation with its arguments (all-to-all splits, all-gather and scatter sizes).
Ours equals the plan's ``elements_moved × 4``. Wall time: per repeat, every rank
starts after a barrier; the repeat's time is the slowest rank's; the median over
repeats is reported. Each result is checked against slicing the full tensor.

Run: ``.venv/bin/python benchmarks/bench_reshard.py [--quick] [--repeats N]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

COLS = 1024
WORLD = 4


def _body(rank: int, world: int, sizes_mb: list[int], repeats: int) -> list[dict[str, Any]]:
    import logging

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor import Shard as TShard
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshlayout import Mesh
    from meshlayout.sharding import Shard, ShardingSpec, reshard_plan
    from meshlayout.torch import reshard

    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
    received = {"bytes": 0}

    class CommBytes(TorchDispatchMode):
        """Adds the bytes this rank receives from other ranks, per c10d operation."""

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            name = func.overloadpacket.__name__
            if func.namespace == "_c10d_functional" and name == "all_gather_into_tensor":
                piece, size = args[0], args[1]
                received["bytes"] += piece.numel() * piece.element_size() * (size - 1)
            elif func.namespace == "c10d" and name == "alltoall_base_":
                out, me, splits = args[0], dist.ProcessGroup.unbox(args[2]).rank(), args[3]
                got = sum(n for i, n in enumerate(splits) if i != me)
                received["bytes"] += got * out.element_size()
            elif func.namespace == "c10d" and name == "scatter_":
                if dist.ProcessGroup.unbox(args[2]).rank() != args[3]:
                    out = args[0][0]
                    received["bytes"] += out.numel() * out.element_size()
            elif func.namespace == "c10d" or (
                func.namespace == "_c10d_functional" and "wait" not in name and "wrap" not in name
            ):
                raise NotImplementedError(f"bytes of {func} are not counted")
            return func(*args, **(kwargs or {}))

    fsdp_mesh = Mesh({"dp": WORLD})
    tp_mesh = Mesh({"tp": 2}, ranks=[2, 3])
    t_fsdp = DeviceMesh("cpu", list(range(WORLD)))
    t_tp = DeviceMesh("cpu", [2, 3])  # every rank constructs it (torch creates groups on all)
    slowest = torch.zeros(1, dtype=torch.float64)
    rows_out = []
    for mb in sizes_mb:
        rows = mb * 2**20 // (4 * COLS)
        full = torch.arange(rows * COLS, dtype=torch.float32).reshape(rows, COLS)
        src = ShardingSpec(full.shape, fsdp_mesh, [Shard(0)])
        dst = ShardingSpec(full.shape, tp_mesh, [Shard(1)])
        local = src.shard(full, rank).contiguous()
        want = dst.shard(full, rank) if rank in tp_mesh else None
        dt = DTensor.from_local(local, t_fsdp, [TShard(0)], run_check=False)
        del full

        def ours(local: Any = local, src: Any = src, dst: Any = dst) -> Any:
            return reshard(local, src, dst, timeout=600)

        def torch_slice(dt: Any = dt) -> Any:
            whole = dt.full_tensor()
            if rank not in (2, 3):
                return None
            return whole.tensor_split(2, dim=1)[rank - 2].contiguous()

        def torch_distribute(dt: Any = dt) -> Any:
            whole = dt.full_tensor()
            if rank not in (2, 3):
                return None
            return distribute_tensor(whole, t_tp, [TShard(1)]).to_local()

        variants = {"ours": ours, "torch": torch_slice, "torch+dt": torch_distribute}
        times: dict[str, list[float]] = {k: [] for k in variants}
        exact = dict.fromkeys(variants, True)
        moved: dict[str, int] = {}
        for name, fn in variants.items():  # untimed: warm-up (groups) and bytes
            dist.barrier()
            received["bytes"] = 0
            with CommBytes():
                fn()
            total = torch.tensor([received["bytes"]], dtype=torch.int64)
            dist.all_reduce(total)
            moved[name] = int(total)
        for _ in range(repeats):
            for name, fn in variants.items():
                dist.barrier()
                t0 = time.perf_counter()
                got = fn()
                slowest[0] = time.perf_counter() - t0
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                times[name].append(float(slowest[0]))
                if want is not None:
                    exact[name] = exact[name] and bool(torch.equal(got, want))
                elif got is not None:
                    exact[name] = False
                del got
        rows_out.append(
            {
                "mb": mb,
                "bytes": moved,
                "plan_bytes": reshard_plan(src, dst).elements_moved * 4,
                "ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
                "exact": exact,
            }
        )
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 16 MB, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7)")
    args = parser.parse_args()
    sizes = [1, 16] if args.quick else [1, 16, 64]
    repeats = args.repeats or (3 if args.quick else 7)

    from multiproc import run_multiproc

    rows = run_multiproc(_body, WORLD, sizes, repeats, timeout=1800, start_method="spawn")[0]
    print(
        f"FSDP(dp={WORLD}, Shard(0)) on ranks 0-3 -> TP(tp=2, Shard(1)) on ranks 2-3, "
        f"float32, {COLS} columns, {WORLD} gloo processes, median of {repeats}"
    )
    print()
    print(
        "| MB | bytes: ours | torch | torch+dt | fewer bytes (vs torch) | ms: ours | torch "
        "| torch+dt | speed-up (vs torch) | speed-up (vs torch+dt) | exact |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        b, ms, ex = r["bytes"], r["ms"], r["exact"]
        assert b["ours"] == r["plan_bytes"], r
        mib = {k: f"{v / 2**20:.1f} MiB" for k, v in b.items()}
        print(
            f"| {r['mb']} | {mib['ours']} | {mib['torch']} | {mib['torch+dt']} | "
            f"{b['torch'] / b['ours']:.1f}x | {ms['ours']:.1f} | {ms['torch']:.1f} | "
            f"{ms['torch+dt']:.1f} | {ms['torch'] / ms['ours']:.2f}x | "
            f"{ms['torch+dt'] / ms['ours']:.2f}x | {all(ex.values())} |"
        )


if __name__ == "__main__":
    main()
