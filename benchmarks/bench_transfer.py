"""Weight-sync benchmark: a Llama-shaped ~220M-parameter model, trainer -> inference.

    .venv/bin/python benchmarks/bench_transfer.py [--repeats N] [--bucket-mib B] [--layers L]

6 gloo processes (spawned). The model (vocab 32001, hidden 1024, intermediate 2816,
12 layers, untied embeddings; fp32 on the trainer, bf16 on inference) in two cases:

* **disjoint**: FSDP2 over TP (dp=2 x tp=2, ranks 0-3; column-parallel
  ``[_StridedShard(0, 2), Shard(0)]``, row-parallel ``[Shard(0), Shard(1)]``, norms
  ``[Shard(0), Replicate()]``) -> TP=2 on ranks 4-5 (``Shard(0)`` / ``Shard(1)`` /
  ``Replicate()``, embeddings vocab-parallel), bf16;
* **same ranks**: FSDP dp=4 (``Shard(0)``) on ranks 0-3 -> TP=4 on ranks 0-3, bf16.

Compared in the same run, every method writing into preallocated bf16 inference
weights (the engine's):

* **gather+bcast** (verl / OpenRLHF default): per parameter ``DTensor.full_tensor()`` on
  the trainer, cast to bf16, ``broadcast`` from rank 0 to the inference ranks (none when
  they are trainer ranks), each slices its piece;
* **reshard/tensor**: ``meshlayout.torch.reshard`` once per parameter (fp32 on the
  wire), cast on the destination;
* **transfer**: ``WeightTransfer.run(out=weights)`` (construction + first run timed
  separately as "first"); **transfer+verify**: ``run(verify=True)``;
* **floor**: one bare ``all_to_all_single`` over the union moving, per rank pair, the
  plan's bytes (preallocated buffers, no packing); **floor+local**: the same plus the
  local copies (with the fp32 -> bf16 cast) that every method makes on ranks holding
  part of their destination piece already; **floor+copies**: floor+local plus the
  memory passes of any design that packs one buffer per collective: each sender
  casts its bytes to send from fp32 into the send buffer (one contiguous cast), each
  receiver copies its receive buffer out once (one contiguous copy).

Times: median over repeats of the slowest rank (every rank starts after a barrier).
Memory: per rank, peak RSS during the call above the RSS just before it (VmHWM reset
through ``/proc/self/clear_refs``), the largest over ranks; the transfer's persistent
send + receive buffers are reported separately. Every result is checked exactly
against the expected bf16 pieces. The machine is shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from llama_shapes import llama_shapes

VOCAB, HIDDEN, INTER = 32001, 1024, 2816
WORLD = 6


def _shapes(layers: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return llama_shapes(VOCAB, HIDDEN, INTER, layers)


def _specs(case: str, layers: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from meshlayout import Mesh
    from meshlayout.sharding import Placement, Replicate, Shard, ShardingSpec, StridedShard

    shapes = _shapes(layers)
    src_pl: dict[str, list[Placement]]
    if case == "disjoint":
        src_mesh = Mesh({"dp": 2, "tp": 2})
        dst_mesh = Mesh({"tp": 2}, ranks=[4, 5])
        src_pl = {
            "col": [StridedShard(0, 2), Shard(0)],
            "row": [Shard(0), Shard(1)],
            "rep": [Shard(0), Replicate()],
        }
    else:
        src_mesh = Mesh({"dp": 4})
        dst_mesh = Mesh({"tp": 4})
        src_pl = {"col": [Shard(0)], "row": [Shard(0)], "rep": [Shard(0)]}
    dst_pl: dict[str, list[Placement]] = {
        "col": [Shard(0)],
        "row": [Shard(1)],
        "rep": [Replicate()],
    }
    src = {n: ShardingSpec(s, src_mesh, src_pl[k]) for n, (s, k) in shapes.items()}
    dst = {n: ShardingSpec(s, dst_mesh, dst_pl[k]) for n, (s, k) in shapes.items()}
    return src, dst


def _piece(spec: Any, rank: int, dtype: Any) -> Any:
    """This rank's piece of a tensor whose element at flat index i is a fixed function of
    i, built from the piece's own box (no full tensor)."""
    import torch

    from meshlayout.sharding import run_boxes

    (rb,) = run_boxes(spec, rank)
    shape = spec.global_shape
    idx = torch.zeros((), dtype=torch.int64)
    for d, (a, b) in enumerate(rb.box):
        stride = 1
        for s in shape[d + 1 :]:
            stride *= s
        view = [1] * len(shape)
        view[d] = b - a
        idx = idx + (torch.arange(a, b, dtype=torch.int64) * stride).view(view)
    values = ((idx * 2654435761) % 1000003).to(torch.float32) / 1000003.0
    return values.to(dtype)


def _rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                got[key] = int(value.split()[0]) * 1024
    return got["VmRSS"], got["VmHWM"]


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _body(rank: int, world: int, layers: int, repeats: int, bucket: int) -> list[dict[str, Any]]:
    import logging

    import torch

    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    return [_case(rank, case, layers, repeats, bucket) for case in ("disjoint", "same ranks")]


def _case(rank: int, case: str, layers: int, repeats: int, bucket: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from meshlayout import Mesh
    from meshlayout.sharding import local_slices
    from meshlayout.torch import WeightTransfer, init_mesh, reshard
    from meshlayout.torch._groups import get_group

    slowest = torch.zeros(1, dtype=torch.float64)
    src_specs, dst_specs = _specs(case, layers)
    union = sorted({0, 1, 2, 3} | ({4, 5} if case == "disjoint" else set()))
    train_mesh = next(iter(src_specs.values())).mesh
    in_src, in_dst = rank in train_mesh, rank in next(iter(dst_specs.values())).mesh
    locals_: dict[str, Any] = {}
    dtensors: dict[str, Any] = {}
    tdm = None
    if in_src:
        dm = init_mesh(Mesh(train_mesh.shape, train_mesh.names, ranks=range(4)), timeout=600)
        tdm = dm.to_torch()
        for n, spec in src_specs.items():
            locals_[n] = _piece(spec, rank, torch.float32)
            dtensors[n] = DTensor.from_local(
                locals_[n],
                tdm,
                spec.to_torch(),
                shape=torch.Size(spec.global_shape),
                stride=torch.empty(spec.global_shape, device="meta").stride(),
                run_check=False,
            )
    weights: dict[str, Any] = {}
    want: dict[str, Any] = {}
    if in_dst:
        for n, spec in dst_specs.items():
            weights[n] = torch.empty(spec.local_shape(rank), dtype=torch.bfloat16)
            want[n] = _piece(spec, rank, torch.bfloat16)
    bcast = None
    if case == "disjoint" and rank in (0, 4, 5):
        bcast = get_group([0, 4, 5], timeout=600)
    union_group = get_group(union, timeout=600) if rank in union else None

    def check() -> bool:
        return all(torch.equal(weights[n], want[n]) for n in weights)

    def gather_bcast() -> None:
        for n in src_specs:
            full = None
            if in_src:
                full = dtensors[n].full_tensor().to(torch.bfloat16)
            if case == "disjoint":
                if rank in (0, 4, 5):
                    if full is None:
                        full = torch.empty(dst_specs[n].global_shape, dtype=torch.bfloat16)
                    dist.broadcast(full, 0, group=bcast)
            if in_dst:
                weights[n].copy_(dst_specs[n].shard(full, rank))
            del full

    def per_tensor() -> None:
        if rank not in union:
            return
        for n in src_specs:
            got = reshard(locals_.get(n), src_specs[n], dst_specs[n], timeout=600)
            if got is not None:
                weights[n].copy_(got)

    src_arg = {n: (t, src_specs[n]) for n, t in locals_.items()} or None
    dst_arg = {n: (s, torch.bfloat16) for n, s in dst_specs.items()} if in_dst else None
    holder: dict[str, Any] = {}

    def first() -> None:
        if rank in union:
            holder["wt"] = WeightTransfer(src_arg, dst_arg, bucket_bytes=bucket, timeout=600)
            holder["wt"].run(out=weights or None)

    def run() -> None:
        if rank in union:
            holder["wt"].run(out=weights or None)

    def run_verify() -> None:
        if rank in union:
            holder["wt"].run(out=weights or None, verify=True)

    floor_buf: dict[str, Any] = {}

    def floor() -> None:
        if rank in union:
            dist.all_to_all_single(
                floor_buf["recv"],
                floor_buf["send"],
                floor_buf["recv_sizes"],
                floor_buf["send_sizes"],
                group=union_group,
            )

    local_pairs: list[tuple[str, Any, Any]] = []

    def floor_local() -> None:
        floor()
        for n, s_sl, d_sl in local_pairs:
            weights[n][d_sl].copy_(locals_[n][s_sl])

    def floor_copies() -> None:
        if rank in union:
            send, src32 = floor_buf["send"], floor_buf["src32"]
            send[: 2 * src32.numel()].view(torch.bfloat16).copy_(src32)  # the sender's cast
        floor_local()
        if rank in union:
            floor_buf["out"].copy_(floor_buf["recv"])  # the receiver's copy out

    def timed(fn: Any, reps: int) -> tuple[float, int, bool]:
        times = []
        extra = 0
        ok = True
        for _ in range(reps):
            weights_clear = [w.zero_() for w in weights.values()]
            del weights_clear
            dist.barrier()
            _reset_peak()
            rss0, _ = _rss()
            t0 = time.perf_counter()
            fn()
            slowest[0] = time.perf_counter() - t0
            _, hwm = _rss()
            extra = max(extra, hwm - rss0)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times.append(float(slowest[0]))
            ok = ok and (fn in (floor, floor_local, floor_copies) or check())
        mem = torch.tensor([extra], dtype=torch.int64)
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        flag = torch.tensor([int(ok)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return statistics.median(times), int(mem), bool(flag)

    row: dict[str, Any] = {"case": case}
    row["first"] = timed(first, 1)
    wt = holder.get("wt")
    plan = wt.plan if wt is not None else None
    if rank in union:
        assert wt is not None and plan is not None
        ranks, m = plan.matrix()
        me = ranks.index(rank)
        floor_buf["send_sizes"] = m[me].tolist()
        floor_buf["recv_sizes"] = m[:, me].tolist()
        floor_buf["send"] = torch.zeros(int(m[me].sum()), dtype=torch.uint8)
        floor_buf["recv"] = torch.zeros(int(m[:, me].sum()), dtype=torch.uint8)
        floor_buf["src32"] = torch.ones(int(m[me].sum()) // 2, dtype=torch.float32)
        floor_buf["out"] = torch.zeros(int(m[:, me].sum()), dtype=torch.uint8)
        bufs = wt.send_buffer.numel() + wt.recv_buffer.numel()
        local_pairs.extend(
            (n, local_slices(src_specs[n], rank, box), local_slices(dst_specs[n], rank, box))
            for n, box in plan.local_copies(rank)
        )
    else:
        bufs = 0
    floor()  # warm-up; its buffers were written (zeros) at allocation, as the transfer's are
    info = torch.tensor([bufs], dtype=torch.int64)
    dist.all_reduce(info, op=dist.ReduceOp.MAX)
    row["buffers"] = int(info)
    for name, fn in (
        ("transfer", run),
        ("transfer+verify", run_verify),
        ("floor", floor),
        ("floor+local", floor_local),
        ("floor+copies", floor_copies),
        ("reshard/tensor", per_tensor),
        ("gather+bcast", gather_bcast),
    ):
        row[name] = timed(fn, repeats)
    if rank == 0:
        assert plan is not None
        s = plan.summary()
        row["summary"] = {
            k: s[k]
            for k in (
                "tensors",
                "bytes_moved",
                "rounds",
                "rounds_lower_bound",
                "max_round_send_bytes",
                "max_round_recv_bytes",
                "gather_broadcast_bytes",
                "gather_broadcast_ratio",
            )
        }
        row["params"] = sum(int(torch.Size(sp.global_shape).numel()) for sp in src_specs.values())
        row["reshard_bytes"] = plan.bytes_moved * 2  # fp32 on the wire: 2x bf16
    dist.barrier()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--layers", type=int, default=12, help="fewer for a quick run")
    args = parser.parse_args()
    from multiproc import run_multiproc

    load = os.getloadavg()
    rows = run_multiproc(
        _body,
        WORLD,
        args.layers,
        args.repeats,
        args.bucket_mib * 2**20,
        timeout=3600,
        start_method="spawn",
    )[0]
    print(
        f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; after: "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
        + f" ({os.cpu_count()} cores)"
    )
    mib = 2**20
    for row in rows:
        s = row["summary"]
        print()
        print(
            f"## {row['case']}: {row['params'] / 1e6:.0f}M params, {s['tensors']} tensors, "
            f"bucket {args.bucket_mib} MiB, median of {args.repeats}"
        )
        print(
            f"bytes: transfer {s['bytes_moved'] / mib:.0f} MiB (the plan minimum, bf16); "
            f"reshard/tensor {row['reshard_bytes'] / mib:.0f} MiB (fp32); gather+bcast "
            f"{s['gather_broadcast_bytes'] / mib:.0f} MiB at bf16 "
            f"({s['gather_broadcast_ratio']:.1f}x the minimum; its all-gather runs in fp32)"
        )
        print(
            f"rounds {s['rounds']} (lower bound {s['rounds_lower_bound']}), largest round per "
            f"rank: send {s['max_round_send_bytes'] / mib:.1f} MiB, receive "
            f"{s['max_round_recv_bytes'] / mib:.1f} MiB; transfer buffers (send + receive, "
            f"persistent) {row['buffers'] / mib:.1f} MiB"
        )
        print()
        print("| method | s | vs transfer | peak extra RSS (MiB, max rank) | exact |")
        print("|---|---:|---:|---:|:---:|")
        base = row["transfer"][0]
        for name in (
            "gather+bcast",
            "reshard/tensor",
            "first",
            "transfer",
            "transfer+verify",
            "floor",
            "floor+local",
            "floor+copies",
        ):
            t, mem, ok = row[name]
            print(f"| {name} | {t:.3f} | {t / base:.2f}x | {mem / mib:.0f} | {ok} |")
        print()
        print(
            f"transfer is {row['gather+bcast'][0] / base:.1f}x faster than gather+bcast, "
            f"{row['reshard/tensor'][0] / base:.1f}x faster than reshard per tensor, "
            f"{base / row['floor'][0]:.2f}x the transport floor, "
            f"{base / row['floor+local'][0]:.2f}x floor + local copies, "
            f"{base / row['floor+copies'][0]:.2f}x floor + all copies; verify adds "
            f"{(row['transfer+verify'][0] / base - 1) * 100:.0f}%"
        )


if __name__ == "__main__":
    main()
