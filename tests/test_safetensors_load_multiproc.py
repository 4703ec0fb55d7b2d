"""``load_safetensors`` into DTensors on 6 gloo processes (dp=3, tp=2), torch 2.13.

One 6-process run: files written by the ``safetensors`` library (a directory of two
files with an index), loaded into DTensors of many shardings — Shard(0) and Shard(1)
uneven, FSDP over TP (``StridedShard``, uneven at dp=3), FSDP Shard(0) over TP
Shard(1), an undecodable ``[StridedShard(0, 2)]`` (several runs per rank), Replicate
dims, a 0-d plain tensor — and into a real FSDP2-over-TP model (``fully_shard`` over
``parallelize_module`` Colwise/Rowwise), whose forward then matches the reference.

A second, single spawned process emulates 16 ranks with torch's fake process group
(``dcp_emulation``) and loads 40 random shardings (those of
tests/test_checkpoint_emulated.py: uneven, strided, undecodable, replicated, mesh
families, empty pieces; float32, bfloat16, int64) on every rank of each.

Expected values never come from the code under test: every local piece is compared
with the brute-force ``ShardingSpec.shard`` of the saved tensor (whose layout
tests/test_sharding_multiproc.py checks against FSDP2's physical storage) and, where
torch can assemble it, with ``DTensor.full_tensor()``; bytes read per rank with the
elements the rank holds (``local_shape``), exactly for row runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

GAP = 4096  # gaps shorter than a page between a rank's ranges may be read through


# ---------------------------------------------------------------------- shared (parent + children)
def _tensors() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(7)
    return {
        "rows": torch.randn(13, 5, generator=g),
        "cols": torch.randn(4, 11, generator=g).to(torch.bfloat16),
        "fsdp_tp": torch.randn(13, 7, generator=g),
        "rowwise": torch.randn(10, 9, generator=g).to(torch.float16),
        "runs": torch.arange(16 * 3, dtype=torch.int64).reshape(16, 3),
        "repl": torch.arange(5, dtype=torch.int32) - 2,
        "wide": torch.randn(6, 4096, generator=g),
        "scalar": torch.tensor(1.25),
    }


def _placements() -> dict[str, tuple[str, list[Any]]]:
    """name -> (mesh "1d" of 6 or "2d" (dp=3, tp=2), meshlayout placements)."""
    from meshlayout.sharding import Replicate, Shard, StridedShard

    return {
        "rows": ("1d", [Shard(0)]),  # 13 rows over 6: 3,3,3,3,1,0
        "cols": ("1d", [Shard(1)]),  # 11 columns over 6
        "fsdp_tp": ("2d", [StridedShard(0, 2), Shard(0)]),  # FSDP over Colwise TP, uneven
        "rowwise": ("2d", [Shard(0), Shard(1)]),  # FSDP over Rowwise TP
        "runs": ("1d", [StridedShard(0, 2)]),  # undecodable: two runs per rank
        "repl": ("2d", [Replicate(), Shard(0)]),
        "wide": ("2d", [Shard(0), Shard(1)]),  # column runs of 8 KiB: read exactly
    }


def _reference_model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(3)
    return nn.Sequential(
        nn.Linear(5, 14), nn.ReLU(), nn.Linear(14, 13), nn.ReLU(), nn.Linear(13, 9)
    )


# ---------------------------------------------------------------------- children
def _dtensor_cases(rank: int, root: str) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from meshlayout import Mesh
    from meshlayout.sharding import ShardingSpec
    from meshlayout.torch.checkpoint import load_safetensors

    meshes = {
        "1d": (init_device_mesh("cpu", (6,)), Mesh((6,))),
        "2d": (
            init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp")),
            Mesh((3, 2), ("dp", "tp")),
        ),
    }
    full = _tensors()
    specs: dict[str, ShardingSpec] = {}
    sd: dict[str, Any] = {"scalar": torch.zeros(()), "note": "untouched"}
    for name, (which, placements) in _placements().items():
        device_mesh, mesh = meshes[which]
        value = full[name]
        spec = specs[name] = ShardingSpec(tuple(value.shape), mesh, placements)
        local = torch.zeros(spec.local_shape(rank), dtype=value.dtype)
        sd[name] = DTensor.from_local(
            local,
            device_mesh,
            spec.to_torch(),
            run_check=False,
            shape=value.shape,
            stride=value.stride(),
        )
    out: dict[str, Any] = {"bad": []}
    row_names = ["rows", "fsdp_tp", "runs", "repl", "scalar"]
    stats_rows = load_safetensors({k: sd[k] for k in row_names}, root)
    stats_rest = load_safetensors({k: v for k, v in sd.items() if k not in row_names}, root)
    for name, spec in specs.items():
        want = spec.shard(full[name], rank)
        got = sd[name].to_local()
        if got.dtype != want.dtype or not torch.equal(got, want):
            out["bad"].append(f"rank {rank} {name}: {got.tolist()} != {want.tolist()}")
    if not torch.equal(sd["scalar"], full["scalar"]) or sd["note"] != "untouched":
        out["bad"].append(f"rank {rank}: scalar {sd['scalar']} note {sd['note']}")
    # torch's own assembly (a collective, same order on every rank) where it is defined
    for name in ("rows", "cols", "fsdp_tp", "rowwise", "repl", "wide"):
        if not torch.equal(sd[name].full_tensor(), full[name]):
            out["bad"].append(f"rank {rank} {name}: full_tensor() differs from the file")

    def share(names: list[str]) -> int:
        total = 0
        for n in names:
            item = full[n].element_size()
            shape = specs[n].local_shape(rank) if n in specs else tuple(full[n].shape)
            total += math.prod(shape) * item
        return total

    rest = [k for k in specs if k not in row_names]
    out["rows"] = (stats_rows.bytes_read, stats_rows.bytes_needed, share(row_names))
    out["rest"] = (stats_rest.bytes_read, stats_rest.bytes_needed, share(rest))
    # column ranges: one per held row (the rows of a rank's box)
    out["rest_ranges"] = sum(specs[n].local_shape(rank)[0] for n in rest)
    wide = specs["wide"].local_shape(rank)
    out["wide_share"] = math.prod(wide) * 4
    wide_stats = load_safetensors({"wide": sd["wide"]}, root)
    out["wide"] = (wide_stats.bytes_read, wide_stats.reads, wide[0])

    # a local piece that is not what the placements say
    device_mesh, _ = meshes["1d"]
    wrong = DTensor.from_local(
        torch.zeros(5, 5),
        device_mesh,
        specs["rows"].to_torch(),
        run_check=False,
        shape=torch.Size((13, 5)),
        stride=(5, 1),
    )
    try:
        load_safetensors({"rows": wrong}, root)
        out["wrong_local"] = "no error"
    except ValueError as exc:
        out["wrong_local"] = str(exc)
    try:
        load_safetensors({"fsdp_tp": sd["rows"]}, root)
        out["wrong_shape"] = "no error"
    except ValueError as exc:
        out["wrong_shape"] = str(exc)
    return out


def _model_case(rank: int, model_file: str) -> dict[str, Any]:
    """Load into a real FSDP2-over-TP model; compare pieces and the forward pass."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from meshlayout.torch.checkpoint import dtensor_spec, load_safetensors

    ref = _reference_model()
    model = _reference_model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
    plan = {
        "0": ColwiseParallel(output_layouts=Replicate()),
        "2": RowwiseParallel(input_layouts=Replicate()),
        "4": ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, mesh["tp"], plan)
    for i in (0, 2, 4):
        fully_shard(model[i], mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    sd = model.state_dict()
    stats = load_safetensors(sd, model_file)
    bad = []
    placements = {}
    need = 0
    for name, value in sd.items():
        assert isinstance(value, DTensor)
        placements[name] = repr(list(value.placements))
        want = dtensor_spec(value).shard(ref.state_dict()[name].detach(), rank)
        got = value.to_local().detach()
        need += got.numel() * got.element_size()
        if not torch.equal(got, want):
            bad.append(f"rank {rank} {name}: {got.tolist()} != {want.tolist()}")
        if not torch.equal(value.full_tensor().detach(), ref.state_dict()[name].detach()):
            bad.append(f"rank {rank} {name}: full_tensor() differs")
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, expect = model(x), ref(x)
    if not torch.allclose(out, expect, rtol=1e-5, atol=1e-6):
        bad.append(f"rank {rank}: forward {out.tolist()} != {expect.tolist()}")
    return {
        "bad": bad,
        "bytes": (stats.bytes_read, stats.bytes_needed, need),
        "placements": placements,
    }


def _body(rank: int, world: int, root: str, model_file: str) -> dict[str, Any]:
    return {"dtensors": _dtensor_cases(rank, root), "model": _model_case(rank, model_file)}


# ---------------------------------------------------------------------- parent
def test_load_into_dtensors_and_fsdp_tp_model(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    full = _tensors()
    names = sorted(full)
    files = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    root = tmp_path / "tensors"
    root.mkdir()
    for f, keys in files.items():
        save_file({k: full[k] for k in keys}, root / f)
    weight_map = {k: f for f, keys in files.items() for k in keys}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model_file = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in _reference_model().state_dict().items()}, model_file)

    results = run_multiproc(_body, 6, str(root), str(model_file), timeout=240)
    for rank, res in enumerate(results):
        d = res["dtensors"]
        assert d["bad"] == []
        read, needed, share = d["rows"]
        assert read == needed == share, (rank, d["rows"])  # row runs: exactly the share
        read, needed, share = d["rest"]
        assert needed == share and share <= read <= share + GAP * d["rest_ranges"], d["rest"]
        read, reads, rows = d["wide"]
        assert read == d["wide_share"] and reads == rows  # one exact read per row
        assert "(5, 5)" in d["wrong_local"] and "rows" in d["wrong_local"]
        assert d["wrong_shape"].startswith("fsdp_tp: stored shape [13, 7]")
        m = res["model"]
        assert m["bad"] == []
        read, needed, share = m["bytes"]
        # weights of Rowwise layers are column runs (one range per row, gaps < a page
        # may be read through); biases and Colwise weights are row runs
        assert needed == share and share <= read <= share + GAP * 14, m["bytes"]
    placements = results[0]["model"]["placements"]
    assert "_StridedShard" in placements["0.weight"], placements  # FSDP over TP really strided


# ---------------------------------------------------------------------- random shardings
def _random_loads(rank: int, world: int, root: str, cases: list[Any]) -> tuple[list[str], int]:
    """Every rank of each random sharding, emulated one after another (fake group)."""
    import torch
    from safetensors.torch import save_file

    from dcp_emulation import as_rank, dtensor_of
    from meshlayout.torch.checkpoint import load_safetensors
    from test_checkpoint_emulated import WORLD

    failures, checked = [], 0
    for i, (_, spec, dtype) in enumerate(cases):
        shape = spec.global_shape
        data = (torch.arange(math.prod(shape)) % 251).reshape(shape).to(getattr(torch, dtype))
        path = f"{root}/case{i}.safetensors"
        save_file({"t": data}, path)
        for r in range(WORLD):
            if r not in spec.mesh:
                continue
            where = f"case {i}: {spec} ({dtype}) rank {r}"
            checked += 1
            try:
                with as_rank(r, WORLD):
                    dest = dtensor_of(spec, r, torch.zeros(shape, dtype=data.dtype))
                    stats = load_safetensors({"t": dest}, path)
                got, want = dest.to_local(), spec.shard(data, r)
                need = want.numel() * want.element_size()
                ranges = math.prod(want.shape[:-1]) if want.dim() > 1 else 1
                if not torch.equal(got, want):
                    failures.append(f"{where}: loaded {got.tolist()} != {want.tolist()}")
                if stats.bytes_needed != need or not (
                    need <= stats.bytes_read <= need + GAP * ranges
                ):
                    failures.append(f"{where}: read {stats.bytes_read}, share {need}")
            except Exception as exc:  # report and go on: one run checks every case
                failures.append(f"{where}: {type(exc).__name__}: {exc}")
    return failures, checked


def test_random_shardings_load_exactly(tmp_path: Path) -> None:
    """40 random shardings (uneven, strided, undecodable, replicated, mesh families,
    empty pieces; 12 emulated ranks): every piece equals ``ShardingSpec.shard``."""
    from test_checkpoint_emulated import _cases

    cases = _cases(40, seed=29)
    ((failures, checked),) = run_multiproc(
        _random_loads, 1, str(tmp_path), cases, timeout=280, start_method="spawn", init=False
    )
    assert failures == []
    assert checked > 100  # (case, rank) pairs
