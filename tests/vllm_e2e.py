"""Helpers of the vLLM end-to-end tests (``tests/test_vllm_e2e.py``): run in the vLLM venv.

* :func:`make_model`: a tiny transformers Llama (vocabulary 1023: uneven, padded by
  vLLM to 1024; intermediate 150: uneven under FSDP over TP; 4 heads of 32, ONE KV
  head, so TP=2 replicates it), saved as safetensors, float32.
* :func:`trainer`: one rank of a 4-process trainer world (its own gloo group): the HF
  model under FSDP2 (dp=2) over TP (tp=2), every parameter a DTensor (uneven,
  strided); ``steps`` "training steps" (an in-place, value-dependent update of every
  parameter, identical on a full copy) each followed by ``send_weights()``.
* :func:`reference`: transformers' greedy tokens and logprobs on full weights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

CONFIG = {
    "vocab_size": 1023,
    "hidden_size": 128,
    "intermediate_size": 150,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
PROMPTS = [[1, 5, 9, 200, 17], [1000, 3, 3, 64]]
MAX_TOKENS = 5
ENGINE_ARGS: dict[str, Any] = {
    "tensor_parallel_size": 2,
    "dtype": "float32",
    "skip_tokenizer_init": True,
    "kv_cache_memory_bytes": 32 * 2**20,
    "max_model_len": 128,
    "enforce_eager": True,
}
ENGINE_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# A Qwen2-style model of a shape the other tests do not use: q/k/v biases, a vocabulary
# of 777 (vLLM pads it to 832 at TP=2: its split is not torch's chunking), intermediate
# 250 (uneven under FSDP over TP), tied embeddings (like Qwen2-0.5B).
QWEN2_CONFIG = {
    "vocab_size": 777,
    "hidden_size": 128,
    "intermediate_size": 250,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
QWEN2_PROMPTS = [[1, 5, 9, 200, 17], [700, 3, 3, 64]]


def make_qwen2(path: str, **overrides: Any) -> None:
    """A tiny transformers Qwen2 (see ``QWEN2_CONFIG``), random weights, float32."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(**{**QWEN2_CONFIG, **overrides}))
    with torch.no_grad():  # random biases (transformers initialises them to zero)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
    model.to(torch.float32).save_pretrained(path)


def make_model(path: str, tie: bool = False) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**CONFIG, "tie_word_embeddings": tie}))
    model.to(torch.float32).save_pretrained(path)


def step(tensor: Any, k: int) -> None:
    """Training step ``k`` on one tensor, in place (elementwise: same on shards and full)."""
    tensor.add_(tensor.sin() * (0.05 * (k + 1)) + 0.001 * (k + 1))


def _tp_fsdp(model: Any) -> Any:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan: dict[str, Any] = {"model.embed_tokens": RowwiseParallel(), "lm_head": ColwiseParallel()}
    parallelize_module(model, mesh["tp"], {**plan, **layers_tp_plan(model)})
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    torch.set_grad_enabled(False)
    return model


def layers_tp_plan(model: Any) -> dict[str, Any]:
    """Megatron-style TP of a Llama/Qwen decoder: q/k/v and gate/up by columns, o and
    down by rows."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for i in range(len(model.model.layers)):
        for name in ("q_proj", "k_proj", "v_proj"):
            plan[f"model.layers.{i}.self_attn.{name}"] = ColwiseParallel()
        plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"model.layers.{i}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.up_proj"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    return plan


def full_weights(model: Any) -> dict[str, Any]:
    return {n: p.full_tensor().clone() for n, p in model.named_parameters()}


def trainer(
    rank: int,
    world: int,
    model_dir: str,
    port: int,
    client: dict[str, Any],
    steps: int = 2,
    verify: bool = False,
    mismatch: bool = False,
) -> dict[str, Any]:
    """One trainer rank; rank 0 drives the engine through the client named in ``client``
    (``{"kind": "http", "url": ...}`` or ``{"kind": "llm"}``: rank 0 builds an offline LLM)."""
    import torch
    from transformers import LlamaForCausalLM
    from vllm.distributed.weight_transfer import (
        HTTPVLLMWeightSyncClient,
        WeightTransferTrainerFactory,
    )

    from meshlayout.vllm import MeshlayoutTrainerInitInfo, ShardedSource

    model = _tp_fsdp(LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    out: dict[str, Any] = {
        "placements": {n: str(p.placements) for n, p in model.named_parameters()}
    }
    llm = None
    sync_client: Any = None
    if rank == 0:
        if client["kind"] == "llm":
            os.environ.update(ENGINE_ENV)
            from vllm import LLM

            llm = LLM(model_dir, weight_transfer_config={"backend": "meshlayout"}, **ENGINE_ARGS)
            sync_client = llm
            out["before"] = generate_llm(llm)
        else:
            sync_client = HTTPVLLMWeightSyncClient(client["url"], timeout=600)
            out["before"] = generate_http(client["url"], client["model"])
    try:
        info = MeshlayoutTrainerInitInfo(
            master_address="127.0.0.1",
            master_port=port,
            rank=rank,
            world_size=world,
            bucket_bytes=1 << 16,
            verify=verify,
            timeout_s=240.0,
        )
        engine = WeightTransferTrainerFactory.trainer_init(
            info, client=sync_client, source=ShardedSource(model)
        )
        out["full"] = []
        out["stats"] = []
        out["generated"] = []
        for k in range(steps):
            for p in model.parameters():
                step(p, k)
            engine.send_weights()
            out["stats"].append(engine.last_stats)
            full = full_weights(model)
            if rank == 0:
                out["full"].append({n: t.clone() for n, t in full.items()})
                if llm is not None:
                    out["generated"].append(generate_llm(llm))
                else:
                    out["generated"].append(generate_http(client["url"], client["model"]))
        if mismatch:
            out["mismatch"] = _mismatch(engine, model)
            if llm is not None:
                out["after_mismatch"] = generate_llm(llm)
            elif rank == 0:
                out["after_mismatch"] = generate_http(client["url"], client["model"])
        engine.shutdown()
    finally:
        if llm is not None:
            shutdown_llm(llm)
    return out


def shutdown_llm(llm: Any) -> None:
    """Stop an offline LLM's engine processes now: the harness may kill this process
    before vLLM's own exit hooks run, which would leave them orphaned."""
    llm.llm_engine.engine_core.shutdown(timeout=60)


def _mismatch(engine: Any, model: Any) -> Any:
    """A trainer whose q_proj of layer 1 has a wrong shape: send_weights must raise,
    naming it, before any byte moves."""
    import torch

    bad = dict(model.named_parameters())
    bad["model.layers.1.self_attn.q_proj.weight"] = torch.zeros(64, 128)
    return expect_refusal(engine, bad, model)


def expect_refusal(engine: Any, tensors: dict[str, Any], model: Any) -> str:
    """Push ``tensors`` instead of ``model``'s: the error text of the refusal, or
    "no error"; the engine's source is ``model`` again afterwards."""
    from meshlayout.vllm import ShardedSource

    engine.source = ShardedSource(tensors)
    try:
        engine.send_weights()
        return "no error"
    except ValueError as exc:
        return str(exc)
    finally:
        engine.source = ShardedSource(model)


def connect(rank: int, world: int, port: int, url: str, source: Any, **info: Any) -> Any:
    """``trainer_init`` of the meshlayout backend against the ``vllm serve`` at ``url``
    (rank 0 drives it through vLLM's HTTP client), 64 KiB buckets, 240 s timeout."""
    from vllm.distributed.weight_transfer import (
        HTTPVLLMWeightSyncClient,
        WeightTransferTrainerFactory,
    )

    from meshlayout.vllm import MeshlayoutTrainerInitInfo

    client = HTTPVLLMWeightSyncClient(url, timeout=600) if rank == 0 else None
    options = {"bucket_bytes": 1 << 16, "timeout_s": 240.0, **info}
    init = MeshlayoutTrainerInitInfo(
        master_address="127.0.0.1", master_port=port, rank=rank, world_size=world, **options
    )
    return WeightTransferTrainerFactory.trainer_init(init, client=client, source=source)


def generate_llm(llm: Any) -> list[tuple[list[int], list[float]]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [_tokens_logprobs(o.outputs[0]) for o in outs]


def generate_http(
    url: str, model: str, prompts: list[list[int]] | None = None
) -> list[tuple[list[int], list[float]]]:
    """Greedy completions of ``prompts`` (default ``PROMPTS``) through the server's OpenAI
    route, token ids in and out."""
    import requests

    out = []
    for prompt in PROMPTS if prompts is None else prompts:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        response = requests.post(f"{url}/v1/completions", json=body, timeout=600)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        out.append(
            (list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]])
        )
    return out


def start_server(model_dir: str, port: int, log_path: str) -> Any:
    """``vllm serve`` (through meshlayout's launcher, for vllm-cpu) with the backend, on
    loopback only."""
    import subprocess
    import sys

    env = {**os.environ, **ENGINE_ENV, "VLLM_SERVER_DEV_MODE": "1"}
    args = [
        sys.executable, "-m", "meshlayout.vllm.serve", "serve", model_dir,
        "--host", "127.0.0.1", "--port", str(port),
        "--tensor-parallel-size", "2", "--dtype", "float32", "--skip-tokenizer-init",
        "--kv-cache-memory-bytes", str(ENGINE_ARGS["kv_cache_memory_bytes"]),
        "--max-model-len", str(ENGINE_ARGS["max_model_len"]), "--enforce-eager",
        "--weight-transfer-config", '{"backend": "meshlayout"}',
    ]  # fmt: skip
    log = open(log_path, "w")
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def served(model_dir: str, log_path: str) -> Iterator[str]:
    """A ``vllm serve`` of ``model_dir`` with the backend (see :func:`start_server`),
    healthy; yields its URL and stops it on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(model_dir, port, log_path)
    try:
        wait_healthy(url, proc, 900, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except Exception:
            proc.kill()


def wait_healthy(url: str, proc: Any, budget: float, log_path: str) -> None:
    import time

    import requests

    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                tail = f.read()[-4000:]
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{tail}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"vllm serve did not become healthy within {budget:g}s")


def _tokens_logprobs(completion: Any) -> tuple[list[int], list[float]]:
    tokens = list(completion.token_ids)
    logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs, tokens)]
    return tokens, logprobs


def reference(
    model_dir: str, weights: dict[str, Any], prompts: list[list[int]] | None = None
) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy completion and the chosen tokens' logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(missing) <= tied and not unexpected, (missing, unexpected)
    model.eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS if prompts is None else prompts:
            ids = torch.tensor([prompt])
            tokens, logprobs = [], []
            for _ in range(MAX_TOKENS):
                logits = model(ids).logits[0, -1].float()
                lp = torch.log_softmax(logits, dim=-1)
                tok = int(torch.argmax(lp))
                tokens.append(tok)
                logprobs.append(float(lp[tok]))
                ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
            out.append((tokens, logprobs))
    return out


def assert_generates_like_transformers(model_dir: str, r0: dict[str, Any]) -> None:
    """After each step, the engine's greedy tokens equal transformers' on the trainer's
    full weights, logprobs within 1e-4 (``r0``: trainer rank 0's results)."""
    for k, full in enumerate(r0["full"]):
        want = reference(model_dir, full)
        got = r0["generated"][k]
        for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want):
            assert tokens == ref_tokens, (k, got, want)
            assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4, (k, got, want)
