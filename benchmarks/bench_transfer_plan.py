"""Planning cost of ``meshlayout.sharding.transfer_plan`` (pure; no torch, no processes).

    .venv/bin/python benchmarks/bench_transfer_plan.py

A Llama-shaped model of 300 tensors (33 layers of 9 + embeddings, norm, head; hidden
4096, uneven vocab 32001 and intermediate 11008) laid out FSDP over TP on 1,024 source
ranks (dp=128 x tp=8: column-parallel ``[_StridedShard(0, 8), Shard(0)]``, row-parallel
``[Shard(0), Shard(1)]``, norms ``[Shard(0), Replicate()]``), or HSDP (2 replicas x 64 x
8), to bf16 TP=8 on 8 other ranks. "cold ms" is the best of several calls with the
reshard-plan and piece-table caches cleared (the specs built beforehand, as a user
holds them); "warm ms" a repeated call with the per-tensor plans cached. Also the
rounds against their lower bound for several bucket sizes.
"""

from __future__ import annotations

import time

from llama_shapes import llama_shapes
from meshlayout import Mesh
from meshlayout.sharding import (
    Placement,
    Replicate,
    Shard,
    ShardingSpec,
    StridedShard,
    _boxes,
    _reshard,
    transfer_plan,
)

HIDDEN, INTER, VOCAB, LAYERS = 4096, 11008, 32001, 33


def model(hsdp: bool) -> tuple[dict[str, ShardingSpec], dict[str, ShardingSpec]]:
    tp = 8
    col: list[Placement]
    row: list[Placement]
    rep: list[Placement]
    if hsdp:
        mesh = Mesh({"rep": 2, "dp": 64, "tp": tp})
        col = [Replicate(), StridedShard(0, tp), Shard(0)]
        row = [Replicate(), Shard(0), Shard(1)]
        rep = [Replicate(), Shard(0), Replicate()]
    else:
        mesh = Mesh({"dp": 128, "tp": tp})
        col = [StridedShard(0, tp), Shard(0)]
        row = [Shard(0), Shard(1)]
        rep = [Shard(0), Replicate()]
    out = Mesh({"tp": tp}, ranks=range(1024, 1024 + tp))
    shapes = llama_shapes(VOCAB, HIDDEN, INTER, LAYERS, kv_dim=HIDDEN // 4)
    kinds: dict[str, tuple[list[Placement], list[Placement]]] = {
        "col": (col, [Shard(0)]),
        "row": (row, [Shard(1)]),
        "rep": (rep, [Replicate()]),
    }
    src = {n: ShardingSpec(s, mesh, kinds[k][0]) for n, (s, k) in shapes.items()}
    dst = {n: ShardingSpec(s, out, kinds[k][1]) for n, (s, k) in shapes.items()}
    return src, dst


def main() -> None:
    print(
        f"{'case':<34} {'bucket':>8} {'tensors':>7} {'cold ms':>8} {'warm ms':>8} "
        f"{'rounds':>6} {'lower':>5} {'GB moved':>8} {'vs gather+bcast':>15}"
    )
    for hsdp in (False, True):
        src, dst = model(hsdp)
        isz = dict.fromkeys(src, 2)
        label = "HSDP 2x64x8 -> TP 8" if hsdp else "FSDP/TP 128x8 -> TP 8"
        for bucket_mib in (256, 64, 16):
            bucket = bucket_mib * 2**20
            cold = []
            for _ in range(3):
                _reshard._plan.cache_clear()
                _boxes.piece_table.cache_clear()
                t0 = time.perf_counter()
                plan = transfer_plan(src, dst, isz, bucket_bytes=bucket)
                cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            plan = transfer_plan(src, dst, isz, bucket_bytes=bucket)
            warm = time.perf_counter() - t0
            s = plan.summary()
            print(
                f"{label:<34} {bucket_mib:>6}Mi {s['tensors']:>7} {min(cold) * 1e3:>8.0f} "
                f"{warm * 1e3:>8.0f} {s['rounds']:>6} {s['rounds_lower_bound']:>5} "
                f"{s['bytes_moved'] / 1e9:>8.2f} {s['gather_broadcast_ratio']:>14.0f}x"
            )


if __name__ == "__main__":
    main()
