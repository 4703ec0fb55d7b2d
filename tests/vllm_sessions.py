"""Trainer sessions against one served vLLM engine (``tests/test_vllm_sessions.py``).

Each call of :func:`session` is one rank of a 4-process trainer world: one
**session** of the "meshlayout" backend (its own sync group, store and port) against a
``vllm serve`` engine that outlives it. The model is the tiny Qwen2 of
``vllm_e2e.make_qwen2`` (q/k/v biases, vocabulary 777, tied embeddings) under FSDP2
(dp=2) over TP (tp=2), on meshes built the way docs/runtime.md shows (two separately
built 1-D meshes from ``meshlayout.torch.build``) or on one 2-D torch mesh.

``actions`` is what the session does, in order:

* ``("push", k)``: training step ``k`` on every parameter, ``send_weights()``; rank 0
  records the full weights and what the engine then generates;
* ``("wrong", name, shape)``: a source whose tensor ``name`` has ``shape``; ``("missing",
  name)``: without it; ``("extra", name, shape)``: with one more tensor: each must raise
  ``ValueError`` before any byte moves; the message is recorded;
* ``("stall", rank, group)``: training step, then trainer ``rank`` stops answering in the
  middle of the update (before its ``group``-th layer group's transfer) for longer than
  the timeout; every rank records its error and rank 0 what the engine generates after;
* ``("vanish",)``: end without ``shutdown()`` (the trainer died).
"""

from __future__ import annotations

import time
from typing import Any

import vllm_e2e as e2e


def _model(model_dir: str, meshes: str) -> Any:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if meshes == "1d":
        from meshlayout import ParallelDims
        from meshlayout.torch import build

        built = build(ParallelDims(4, dp_shard=2, tp=2), "cpu")
        tp = built.get_or_create("tp").to_torch()
        dp = built.get_or_create("dp_shard").to_torch()
    else:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh["tp"], mesh["dp"]
    parallelize_module(model, tp, e2e.layers_tp_plan(model))
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp)
    fully_shard(model, mesh=dp)
    torch.set_grad_enabled(False)
    return model


def _stall_before(group: int, seconds: float) -> None:
    """This rank stops answering for ``seconds`` before its ``group``-th transfer."""
    from meshlayout.torch import WeightTransfer

    original = WeightTransfer.run
    calls = {"n": 0}

    def stalled(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == group + 1:
            time.sleep(seconds)
        return original(self, *args, **kwargs)

    WeightTransfer.run = stalled  # type: ignore[method-assign]


def session(
    rank: int,
    world: int,
    model_dir: str,
    port: int,
    url: str,
    actions: list[tuple[Any, ...]],
    meshes: str = "2d",
    timeout_s: float = 240.0,
    verify: bool = False,
) -> dict[str, Any]:
    import torch

    from meshlayout.vllm import ShardedSource

    model = _model(model_dir, meshes)
    out: dict[str, Any] = {"full": [], "generated": [], "stats": [], "refusals": [], "errors": []}
    engine = e2e.connect(
        rank, world, port, url, ShardedSource(model), verify=verify, timeout_s=timeout_s
    )
    if rank == 0:
        out["before"] = e2e.generate_http(url, model_dir, e2e.QWEN2_PROMPTS)
    vanish = False
    for action in actions:
        kind = action[0]
        if kind == "push":
            for p in model.parameters():
                e2e.step(p, action[1])
            engine.send_weights()
            out["stats"].append(engine.last_stats)
            full = e2e.full_weights(model)
            if rank == 0:
                out["full"].append(full)
                out["generated"].append(e2e.generate_http(url, model_dir, e2e.QWEN2_PROMPTS))
        elif kind in ("wrong", "missing", "extra"):
            tensors = dict(model.named_parameters())
            if kind == "missing":
                del tensors[action[1]]
            else:
                tensors[action[1]] = torch.zeros(action[2])
            out["refusals"].append(e2e.expect_refusal(engine, tensors, model))
        elif kind == "stall":
            _, who, group = action
            for p in model.parameters():
                e2e.step(p, 99)
            if rank == who:
                _stall_before(group, timeout_s * 3)
            start = time.monotonic()
            try:
                engine.send_weights()
                out["errors"].append(("no error", 0.0))
            except Exception as exc:
                out["errors"].append((f"{type(exc).__name__}: {exc}", time.monotonic() - start))
            if rank == 0:
                out["after_stall"] = e2e.generate_http(url, model_dir, e2e.QWEN2_PROMPTS)
        elif kind == "vanish":
            vanish = True
        else:
            raise ValueError(f"unknown action {action!r}")
    if not vanish:
        engine.shutdown()
    return out
