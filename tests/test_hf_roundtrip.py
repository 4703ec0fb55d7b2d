"""Hugging Face round trip through FSDP2 over TP (dp=3, tp=2, 6 gloo processes, torch 2.13).

A tiny Llama built in code, with uneven sizes: vocab 1003 (vocab-parallel embedding and
``lm_head``: 502 / 501 rows over tp=2, then 168/168/166 and 167/167/167 over dp=3),
intermediate 200 (Colwise MLP weights: 100 rows per TP rank, 34/34/32 over dp); every
TP weight is ``_StridedShard`` under FSDP2. It goes through:

1. ``save_pretrained`` (transformers writes ``model-0000i-of-0000n.safetensors`` and
   the index, ``max_shard_size`` 600 KB);
2. ``load_safetensors`` into the zeroed FSDP2-over-TP model on 6 processes: every
   rank's piece equals the brute-force ``ShardingSpec.shard`` of the file's tensor,
   and each rank reads exactly its share of bytes plus small gaps;
3. one SGD step on a fixed batch; the trained parameters are gathered with torch's
   ``full_tensor()`` (the reference for what the processes hold);
4. ``meshlayout.torch.checkpoint.save`` (exact DCP) -> ``export_safetensors`` ->
   ``from_pretrained``: bitwise the gathered weights, and within float tolerance the
   weights and logits of a single-process replica trained the same step;
5. torch's own path beside ours: plain DCP with ``HuggingFaceStorageWriter``
   (``save_distributed=True, enable_consolidation=True``) on the same model refuses it
   ("overlapping chunks": torch 2.13 reads the uneven strided pieces at wrong offsets);
   the Replicate detour (redistribute every DTensor to ``Replicate`` first, as
   transformers does; every rank then holds the whole model) writes the right values.
   At vocab 1001 torch's offsets happen to coincide with the true ones (each dp rank's
   two TP pieces differ by at most one row, the first the larger) and its path works;
   1003 is the nearest vocab where they do not (both checked on a Colwise
   ``Linear(5, 1001)``, written right by torch). On a 7-row Colwise weight torch's
   writer succeeds and consolidates a tensor of shape (8, 5) — a wrong file, no
   error — while ours exports the 7 x 5 weight exactly.

One process launch; no downloads (``HF_HUB_OFFLINE=1``, everything built in code).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# no downloads, ever: set before transformers / huggingface_hub read it at import
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("transformers")

from multiproc import run_multiproc
from torch_versions import DCP_NAMES_OVERLAP, DCP_OVERLAP

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(900)]

DP, TP = 3, 2
LR = 0.5
GAP = 4096  # gaps shorter than a page between a rank's ranges may be read through


# ---------------------------------------------------------------------- shared
def _config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=1003,  # 1003 = 17 x 59: uneven over tp=2 (502/501) and then dp=3
        hidden_size=96,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 24; 2 heads per TP rank
        num_key_value_heads=2,  # 1 kv head per TP rank
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )


def _batch() -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 1003, (2, 9), generator=g)
    probe = torch.randint(0, 1003, (2, 7), generator=g)
    return ids, probe


def _train_step(model: Any) -> None:
    import torch

    ids, _ = _batch()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


# ---------------------------------------------------------------------- children
def _parallel_llama() -> Any:
    """The tiny Llama, zeroed, TP (typical Llama plan) then FSDP2 over dp."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from transformers import LlamaForCausalLM

    torch.manual_seed(123)  # different from the file's values: loading must fill them
    model = LlamaForCausalLM(_config())
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    for layer in model.model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
        parallelize_module(layer, mesh["tp"], plan)
        fully_shard(layer, mesh=mesh["dp"])
    vocab_parallel = {  # uneven over tp: 502 / 501 rows
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, mesh["tp"], vocab_parallel)
    fully_shard(model, mesh=mesh["dp"])  # embeddings, final norm, lm_head
    return model


def _torch_hf_path(sd: dict[str, Any], root: str) -> dict[str, Any]:
    """torch's own HF writer on the FSDP-over-TP state dict, and with the Replicate detour."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.tensor import DTensor, Replicate

    out: dict[str, Any] = {}
    try:
        writer = HuggingFaceStorageWriter(
            os.path.join(root, "torch_hf"), save_distributed=True, enable_consolidation=True
        )
        dcp.save(sd, storage_writer=writer)
        out["direct"] = "saved"
    except BaseException as exc:  # DCP raises CheckpointException (a BaseException)
        failures = getattr(exc, "failures", None)
        if failures:
            inner = next(iter(failures.values()))
            exc = inner[0] if isinstance(inner, tuple) else inner
        out["direct"] = f"{type(exc).__name__}: {exc}"
    detour = {
        k: v.redistribute(v.device_mesh, [Replicate()] * v.device_mesh.ndim)
        if isinstance(v, DTensor)
        else v
        for k, v in sd.items()
    }
    writer = HuggingFaceStorageWriter(
        os.path.join(root, "torch_hf_detour"), save_distributed=True, enable_consolidation=True
    )
    dcp.save(detour, storage_writer=writer)
    return out


def _rows_weight(rows: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(5)
    return nn.Linear(5, rows, bias=False)


def _rows_both_ways(root: str, rows: int) -> None:
    """FSDP2 over a Colwise ``Linear(5, rows)``: torch's HF writer, and ours."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from meshlayout.torch import checkpoint as mlcp

    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    lin = _rows_weight(rows)
    parallelize_module(lin, mesh["tp"], ColwiseParallel())
    fully_shard(lin, mesh=mesh["dp"])
    writer = HuggingFaceStorageWriter(
        os.path.join(root, f"torch_hf_{rows}"), save_distributed=True, enable_consolidation=True
    )
    dcp.save({"w": lin.weight}, storage_writer=writer)
    mlcp.save({"w": lin.weight}, os.path.join(root, f"ours_{rows}"))


def _body(rank: int, world: int, hf_in: str, root: str) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor

    from meshlayout.torch import checkpoint as mlcp

    model = _parallel_llama()
    sd = model.state_dict()
    stats = mlcp.load_safetensors(sd, hf_in)
    full: dict[str, Any] = {}  # the reference values, every file read whole
    for f in sorted(Path(hf_in).glob("*.safetensors")):
        full |= load_file(f)
    bad, need, placements = [], 0, {}
    for name, value in sd.items():
        assert isinstance(value, DTensor), name
        placements[name] = repr(list(value.placements))
        want = mlcp.dtensor_spec(value).shard(full[name], rank)
        got = value.to_local().detach()
        need += got.numel() * got.element_size()
        if not torch.equal(got, want):
            bad.append(f"rank {rank} {name}: local piece differs from the file's slice")
        if not torch.equal(value.full_tensor(), full[name]):  # torch's own assembly
            bad.append(f"rank {rank} {name}: full_tensor() differs from the file")
    _train_step(model)
    trained = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    mlcp.save(model.state_dict(), os.path.join(root, "ours"))
    torch_path = _torch_hf_path(model.state_dict(), root)
    for rows in (7, 1001):
        _rows_both_ways(root, rows)
    return {
        "bad": bad,
        "bytes": (stats.bytes_read, stats.bytes_needed, need),
        "rows": sum(t.to_local().shape[0] for t in sd.values()),
        "placements": placements,
        "trained": trained if rank == 0 else None,
        "torch": torch_path,
    }


# ---------------------------------------------------------------------- parent
def test_hf_round_trip_fsdp_over_tp(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from meshlayout.torch.checkpoint import export_safetensors

    torch.manual_seed(0)
    source = LlamaForCausalLM(_config())
    hf_in = tmp_path / "hf_in"
    source.save_pretrained(hf_in, max_shard_size="600KB")  # several files + index
    assert (hf_in / "model.safetensors.index.json").is_file()
    assert len(list(hf_in.glob("model-*.safetensors"))) >= 2

    replica = LlamaForCausalLM.from_pretrained(hf_in)  # the single-process replica
    _train_step(replica)
    replica.eval()
    _, probe = _batch()

    results = run_multiproc(
        _body, DP * TP, str(hf_in), str(tmp_path), timeout=600, env={"HF_HUB_OFFLINE": "1"}
    )
    for res in results:
        assert res["bad"] == [], res["bad"]
        read, needed, share = res["bytes"]
        assert needed == share and share <= read <= share + GAP * res["rows"], res["bytes"]
    placements = results[0]["placements"]
    for name in ("model.layers.0.mlp.gate_proj.weight", "lm_head.weight"):
        assert "_StridedShard" in placements[name], placements
    trained = results[0]["trained"]

    # ours: exact DCP -> export -> from_pretrained
    out = tmp_path / "hf_out"
    result = export_safetensors(tmp_path / "ours", out)
    assert result.files == ("model.safetensors",)
    _config().save_pretrained(out)
    loaded = LlamaForCausalLM.from_pretrained(out).eval()
    got = loaded.state_dict()
    assert set(got) == set(trained)
    for name, value in trained.items():
        assert torch.equal(got[name], value), name  # bitwise what the processes hold
        # vs the replica: TP/FSDP reduce gradients in another order (float32 rounding)
        torch.testing.assert_close(got[name], replica.state_dict()[name], rtol=1e-4, atol=1e-6)
        assert not torch.equal(value, source.state_dict()[name]), f"{name} was not trained"
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(probe).logits, replica(probe).logits, rtol=1e-4, atol=1e-5
        )

    # torch's path beside ours: plain DCP refuses the strided vocab-parallel weights
    # (its offsets for _StridedShard over an uneven TP split overlap), while the
    # Replicate detour (every rank holds every full tensor) writes the right values
    direct = results[0]["torch"]["direct"]
    assert DCP_OVERLAP in direct, direct
    if DCP_NAMES_OVERLAP:
        assert "key:model.embed_tokens.weight" in direct or "key:lm_head.weight" in direct, direct
    assert not list((tmp_path / "torch_hf").glob("*.safetensors"))  # nothing consolidated
    detour = load_file(tmp_path / "torch_hf_detour" / "model-00001-of-00001.safetensors")
    assert all(torch.equal(detour[k], v) for k, v in trained.items())
    # Colwise Linear(5, rows): torch's writer silently writes a wrong shape for 7 rows
    # and the right tensor for 1001 (its offsets happen to coincide there); ours both
    for rows, torch_shape in ((7, (8, 5)), (1001, (1001, 5))):
        weight = _rows_weight(rows).weight.detach()
        name = "model-00001-of-00001.safetensors"
        by_torch = load_file(tmp_path / f"torch_hf_{rows}" / name)["w"]
        assert tuple(by_torch.shape) == torch_shape
        assert (rows == 1001) == (by_torch.shape == weight.shape and torch.equal(by_torch, weight))
        export_safetensors(tmp_path / f"ours_{rows}", tmp_path / f"ours_{rows}_hf")
        ours = load_file(tmp_path / f"ours_{rows}_hf" / "model.safetensors")["w"]
        assert torch.equal(ours, weight)
