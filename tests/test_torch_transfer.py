"""meshlayout.torch.WeightTransfer on 6 real gloo processes, checked element by element.

One spawned process group runs every scenario (start-up costs seconds); failures come
back as text per scenario. Each destination piece must equal slicing the full tensor,
cast to the destination dtype (``dst_spec.shard(full.to(dtype), rank)``), bit for bit;
each run makes exactly one ``all_to_all_single`` per round of the plan (plus one
all-reduce with ``verify=True``) and sends exactly the plan's bytes.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("torch")

from meshlayout import Mesh
from meshlayout.sharding import Replicate, Shard, ShardingSpec, StridedShard
from multiproc import run_multiproc
from test_torch_reshard import _bits, _full, _instrument, random_cases

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(400)]

WORLD = 6
# name -> (src spec, dst spec, source dtype, destination dtype or None = the source's)
Tensors = dict[str, tuple[ShardingSpec, ShardingSpec, str, str | None]]
Model = tuple[str, Tensors, int]  # (scenario, tensors, bucket bytes)


def models() -> list[Model]:
    fsdp_tp = Mesh({"dp": 3, "tp": 2})  # uneven FSDP (dp=3) over TP on every rank
    tp45 = Mesh({"tp": 2}, ranks=[4, 5])
    out: list[Model] = []
    llama: Tensors = {}
    for i, rows in enumerate((13, 7)):
        llama[f"l{i}.wq"] = (
            ShardingSpec((rows, 6), fsdp_tp, [StridedShard(0, 2), Shard(0)]),
            ShardingSpec((rows, 6), tp45, [Shard(0)]),
            "float32",
            "bfloat16",
        )
        llama[f"l{i}.wo"] = (
            ShardingSpec((6, rows), fsdp_tp, [Shard(0), Shard(1)]),
            ShardingSpec((6, rows), tp45, [Shard(1)]),
            "float32",
            "bfloat16",
        )
        llama[f"l{i}.norm"] = (
            ShardingSpec((6,), fsdp_tp, [Shard(0), Replicate()]),
            ShardingSpec((6,), tp45, [Replicate()]),
            "float32",
            None,
        )
    llama["step"] = (
        ShardingSpec((3,), fsdp_tp, [Replicate(), Replicate()]),
        ShardingSpec((3,), tp45, [Replicate()]),
        "int64",
        None,
    )
    for bucket in (1 << 20, 64, 37):  # one round; several; odd (unaligned offsets)
        out.append((f"fsdp3-over-tp2 -> tp2@4,5 bucket {bucket}", llama, bucket))
    fsdp6 = Mesh({"dp": 6})
    tp6 = Mesh({"tp": 6})
    same: Tensors = {
        "w1": (
            ShardingSpec((9, 10), fsdp6, [Shard(0)]),
            ShardingSpec((9, 10), tp6, [Shard(1)]),
            "bfloat16",
            None,
        ),
        "w2": (
            ShardingSpec((10, 9), fsdp6, [Shard(0)]),
            ShardingSpec((10, 9), tp6, [Shard(0)]),
            "float32",
            "float64",
        ),
    }
    out.append(("same ranks fsdp6 -> tp6, bucket 100", same, 100))
    disjoint: Tensors = {
        "a": (
            ShardingSpec((11, 5), Mesh({"dp": 2, "tp": 2}), [StridedShard(0, 2), Shard(0)]),
            ShardingSpec((11, 5), tp45, [Shard(0)]),
            "float32",
            "bfloat16",
        ),
        "b": (
            ShardingSpec((5, 11), Mesh({"dp": 2, "tp": 2}), [Shard(0), Shard(1)]),
            ShardingSpec((5, 11), tp45, [Shard(1)]),
            "float32",
            "bfloat16",
        ),
        "c": (
            ShardingSpec((4, 3), Mesh({"r": 2, "dp": 2}), [Replicate(), Shard(0)]),  # HSDP
            ShardingSpec((4, 3), tp45, [Replicate()]),
            "int64",
            None,
        ),
    }
    out.append(("disjoint 0-3 -> 4-5, bucket 48", disjoint, 48))
    # random specs of the reshard tests, grouped into models of 6 tensors; every
    # process takes part in every transfer (they meet by construction count)
    everyone = (
        ShardingSpec((6, 2), Mesh({"a": 6}), [Replicate()]),
        ShardingSpec((6, 2), Mesh({"b": 6}, ranks=[5, 4, 3, 2, 1, 0]), [Shard(0)]),
        "float32",
        None,
    )
    cases = random_cases(24, seed=18)
    for k in range(0, len(cases), 6):
        group: Tensors = {"all": everyone}
        for j, (_, src, dst, dtype) in enumerate(cases[k : k + 6]):
            group[f"r{j}"] = (src, dst, dtype, None)
        out.append((f"random group {k // 6}", group, 1 << 20 if k % 12 else 40))
    return out


def _union(tensors: Tensors) -> set[int]:
    ranks: set[int] = set()
    for src, dst, _, _ in tensors.values():
        for spec in (src, dst):
            ranks |= {int(r) for r in spec.mesh.rank_map}  # type: ignore[attr-defined]
    return ranks


# ---------------------------------------------------------------------- child side
def _inputs(rank: int, tensors: Tensors) -> tuple[Any, Any]:
    import torch

    src = {
        n: (s.shard(_full(s.global_shape, sd), rank).clone(), s)
        for n, (s, _, sd, _) in tensors.items()
        if rank in s.mesh
    }
    dst = {
        n: (d, getattr(torch, dd)) if dd else d
        for n, (_, d, _, dd) in tensors.items()
        if rank in d.mesh
    }
    return src or None, dst or None


def _want(rank: int, name: str, tensors: Tensors, scale: int = 1) -> Any:
    import torch

    s, d, sd, dd = tensors[name]
    full = _full(s.global_shape, sd)
    if scale != 1:
        full = full * scale
    return d.shard(full.to(getattr(torch, dd or sd)), rank)


def _compare(got: dict[str, Any], rank: int, tensors: Tensors, scale: int = 1) -> list[str]:
    import torch

    problems = []
    for name, (_, d, _, _) in tensors.items():
        if rank not in d.mesh:
            if name in got:
                problems.append(f"{name}: rank outside the destination got a piece")
            continue
        want = _want(rank, name, tensors, scale)
        have = got.get(name)
        if have is None or have.dtype != want.dtype or tuple(have.shape) != tuple(want.shape):
            problems.append(f"{name}: got {have!r}, want {want.dtype} {tuple(want.shape)}")
        elif not torch.equal(_bits(have), _bits(want)):
            problems.append(f"{name}: wrong values\n{have}\nwant\n{want}")
    return problems


def _run_model(rank: int, model: Model, log: dict[str, Any]) -> dict[str, Any]:
    import torch

    from meshlayout.torch import WeightTransfer

    _, tensors, bucket = model
    src, dst = _inputs(rank, tensors)
    wt = WeightTransfer(src, dst, bucket_bytes=bucket, timeout=60)
    plan = wt.plan
    ptrs = (wt.send_buffer.data_ptr(), wt.recv_buffer.data_ptr())
    result: dict[str, Any] = {"rounds": len(plan.rounds), "bytes_moved": plan.bytes_moved}
    calls0, sent0 = len(log["calls"]), log["sent"]
    with log["mode"]():
        got = wt.run()
    result["calls"] = log["calls"][calls0:]
    result["sent"] = log["sent"] - sent0
    problems = _compare(got, rank, tensors)
    # second run: sources changed in place; preallocated outputs; verify
    if src is not None:
        for local, _ in src.values():
            local.mul_(3)
    outs = {n: torch.full_like(t, 7) for n, t in got.items()}
    calls0 = len(log["calls"])
    with log["mode"]():
        again = wt.run(out=outs, verify=True)
    result["verify_calls"] = log["calls"][calls0:]
    problems += _compare(again, rank, tensors, scale=3)
    if any(again[n] is not outs[n] for n in again):
        problems.append("run(out=...) did not return the given tensors")
    if wt.plan is not plan or (wt.send_buffer.data_ptr(), wt.recv_buffer.data_ptr()) != ptrs:
        problems.append("a repeated run re-planned or re-allocated its buffers")
    if wt.send_buffer.numel() > bucket or wt.recv_buffer.numel() > bucket:
        problems.append(f"buffers {wt.send_buffer.numel()}, {wt.recv_buffer.numel()} > {bucket}")
    result["problems"] = problems
    return result


def _fsdp_dtensors(rank: int) -> dict[str, Any]:
    """Real FSDP2 (fully_shard) over TP on dp=3 x tp=2 (uneven), and HSDP (2 x 3), to
    TP=2 on ranks 4, 5 in bf16 through DTensors; values against an unsharded model."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from meshlayout.torch import WeightTransfer

    def make() -> Any:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(10, 14), torch.nn.ReLU(), torch.nn.Linear(14, 10)
        )

    reference = {n: p.detach() for n, p in make().named_parameters()}
    tp45 = Mesh({"tp": 2}, ranks=[4, 5])
    layouts = {
        "0.weight": [Shard(0)],
        "0.bias": [Shard(0)],
        "2.weight": [Shard(1)],
        "2.bias": [Replicate()],
    }
    out: dict[str, Any] = {}
    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
    model = make()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    hsdp_mesh = init_device_mesh("cpu", (2, 3), mesh_dim_names=("rep", "shard"))
    hsdp = make()
    fully_shard(hsdp, mesh=hsdp_mesh)
    # docs/runtime.md's pattern: TP and FSDP on two separately built 1-D meshes; a
    # LayerNorm under FSDP only lives on a different 1-D mesh on each TP coordinate
    from meshlayout import ParallelDims
    from meshlayout.torch import build

    built = build(ParallelDims(WORLD, dp_shard=3, tp=2), "cpu")
    apart = make()
    apart.append(torch.nn.LayerNorm(10))
    with torch.no_grad():
        apart[3].weight.uniform_(-1, 1)
        apart[3].bias.uniform_(-1, 1)
    reference.update({n: p.detach().clone() for n, p in apart.named_parameters() if n[0] == "3"})
    layouts.update({"3.weight": [Replicate()], "3.bias": [Shard(0)]})
    parallelize_module(
        apart,
        built.get_or_create("tp").to_torch(),
        {"0": ColwiseParallel(), "2": RowwiseParallel()},
    )
    fully_shard(apart, mesh=built.get_or_create("dp_shard").to_torch())
    for label, module in (("fsdp2-over-tp", model), ("hsdp", hsdp), ("1-D meshes", apart)):
        params = dict(module.named_parameters())
        dst = None
        if rank in (4, 5):
            dst = {
                n: (ShardingSpec(tuple(p.shape), tp45, layouts[n]), torch.bfloat16)
                for n, p in params.items()
            }
        placements = {n: str(list(p.placements)) for n, p in params.items()}
        wt = WeightTransfer(params, dst, bucket_bytes=200, timeout=60)
        got = wt.run(verify=True)
        problems = []
        for n, t in got.items():
            want = dst[n][0].shard(reference[n].to(torch.bfloat16), rank)  # type: ignore[index]
            if not torch.equal(_bits(t), _bits(want)):
                problems.append(f"{n}: wrong values")
        out[label] = {"problems": problems, "placements": placements, "names": sorted(got)}
    return out


def _fused_out(rank: int) -> dict[str, Any]:
    """out= views into a fused qkv weight on the destination (rows q | k | v)."""
    import torch

    from meshlayout.torch import WeightTransfer

    src_mesh = Mesh({"dp": 3, "tp": 2})
    tp45 = Mesh({"tp": 2}, ranks=[4, 5])
    rows = {"q": 8, "k": 4, "v": 4}
    tensors: Tensors = {
        n: (
            ShardingSpec((r, 6), src_mesh, [StridedShard(0, 2), Shard(0)]),
            ShardingSpec((r, 6), tp45, [Shard(0)]),
            "float32",
            "bfloat16",
        )
        for n, r in rows.items()
    }
    src, dst = _inputs(rank, tensors)
    wt = WeightTransfer(src, dst, bucket_bytes=64, timeout=60)
    if rank not in (4, 5):
        wt.run(verify=True)
        wt.run(verify=True)  # the partial out= run below
        return {"problems": []}
    # the engine's fused layout: per TP rank, [q rows; k rows; v rows] x 6 columns,
    # here stored transposed (column-major) so the views are not even contiguous
    fused = torch.zeros(6, 8, dtype=torch.bfloat16).t()
    views = {"q": fused[0:4], "k": fused[4:6], "v": fused[6:8]}
    ptr = fused.data_ptr()
    got = wt.run(out=views, verify=True)
    problems = []
    want = torch.cat([_want(rank, n, tensors) for n in ("q", "k", "v")])
    if not torch.equal(_bits(fused), _bits(want)):
        problems.append(f"fused qkv wrong:\n{fused}\nwant\n{want}")
    if fused.data_ptr() != ptr:
        problems.append("fused storage moved")
    if any(got[n] is not views[n] for n in views):
        problems.append("run(out=...) did not return the given views")
    # a partial out=: only q and k are preallocated, v comes back as a new tensor
    fused.zero_()
    partial = {"q": fused[0:4], "k": fused[4:6]}
    got = wt.run(out=partial, verify=True)
    if sorted(got) != ["k", "q", "v"]:
        problems.append(f"partial out=: returned {sorted(got)}")
    if got["q"] is not partial["q"] or got["k"] is not partial["k"]:
        problems.append("partial out=: the given views were not returned")
    if got["v"].data_ptr() == fused.data_ptr() + 6 * fused.element_size():
        problems.append("partial out=: v was written into the fused storage")
    if not torch.equal(_bits(fused[0:6]), _bits(want[0:6])):
        problems.append("partial out=: q and k rows wrong")
    if fused[6:8].any():
        problems.append("partial out=: the v rows of the fused tensor were touched")
    if not torch.equal(_bits(got["v"]), _bits(want[6:8])):
        problems.append("partial out=: v wrong")
    return {"problems": problems}


def _api_cases(rank: int) -> dict[str, Any]:
    """transfer() in one shot, run(src_tensors=...) with new pieces, bad out= / src_tensors."""
    import torch

    from meshlayout.torch import WeightTransfer, transfer

    tensors: Tensors = {
        "w": (
            ShardingSpec((7, 5), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)]),
            ShardingSpec((7, 5), Mesh({"tp": 3}, ranks=[3, 4, 5]), [Shard(1)]),
            "float32",
            "float64",
        )
    }
    src, dst = _inputs(rank, tensors)
    out: dict[str, Any] = {}
    got = transfer(src, dst, bucket_bytes=24, timeout=60, verify=True)
    out["one shot"] = _compare(got, rank, tensors)
    wt = WeightTransfer(src, dst, bucket_bytes=24, timeout=60)
    fresh = {n: local * 5 for n, (local, _) in src.items()} if src else None
    out["src_tensors"] = _compare(wt.run(src_tensors=fresh), rank, tensors, scale=5)
    errors = []
    for bad in ({"w": torch.zeros(1, 1, dtype=torch.float64)}, {"x": torch.zeros(1)}):
        if rank in (3, 4, 5):
            try:
                wt.run(out=bad)
                errors.append("no error")
            except (ValueError, KeyError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    # out={} names none of this rank's destination tensors: all come back new
    out["empty out"] = _compare(wt.run(out={} if rank in (3, 4, 5) else None), rank, tensors)
    if src is not None:
        try:
            wt.run(src_tensors={})
            errors.append("no error")
        except KeyError as exc:
            errors.append(f"KeyError: {exc}")
    out["errors"] = errors
    wt.run()  # everybody still in step
    return out


def _verify_cases(rank: int) -> dict[str, Any]:
    """A faulty unpack step (permuted rows, a wrong offset, a stale slab) and source
    replicas holding different values must fail verification on every rank."""
    import torch

    from meshlayout.torch import TransferVerificationError, WeightTransfer

    fsdp = Mesh({"dp": 4})
    tp45 = Mesh({"tp": 2}, ranks=[4, 5])
    tensors: Tensors = {
        "w": (
            ShardingSpec((8, 6), fsdp, [Shard(0)]),
            ShardingSpec((8, 6), tp45, [Shard(0)]),
            "float32",
            None,
        ),
        "u": (
            ShardingSpec((6, 4), fsdp, [Shard(1)]),
            ShardingSpec((6, 4), tp45, [Shard(1)]),
            "float32",
            None,
        ),
    }

    class Faulty(WeightTransfer):
        fault = ""
        runs = 0

        def unpack(self, index: int, recv: Any, outs: Any) -> None:
            if self.fault == "stale" and self.runs > 0 and index == 0:
                return  # round 0 keeps the previous run's slab
            super().unpack(index, recv, outs)
            last = index == len(self._rounds) - 1
            if self.fault == "permute" and last and "w" in outs and outs["w"].shape[0] > 1:
                outs["w"][[0, 1]] = outs["w"][[1, 0]].clone()
            if self.fault == "offset":
                for item in self._rounds[index].recvs[:1]:
                    region = outs[item.name][item.slices]
                    shifted = recv[item.offset + 4 : item.offset + 4 + item.nbytes]
                    if shifted.numel() == item.nbytes:
                        region.copy_(shifted.view(region.dtype).view(region.shape))

    out: dict[str, Any] = {}
    for fault in ("none", "permute", "offset", "stale"):
        src, dst = _inputs(rank, tensors)
        wt = Faulty(src, dst, bucket_bytes=40, timeout=60)
        wt.fault = fault
        outs = {
            n: torch.zeros(d.local_shape(rank))
            for n, (_, d, _, _) in tensors.items()
            if rank in d.mesh
        }
        wt.run(out=outs)
        if src is not None:
            for local, _ in src.values():
                local.add_(1)
        wt.runs = 1
        try:
            wt.run(out=outs, verify=True)
            out[fault] = "ok"
        except TransferVerificationError as exc:
            out[fault] = (sorted(exc.tensors), sorted(exc.replicas))
    # replicas that disagree: Replicate over ranks 0-1, rank 1 holds other values
    rep: Tensors = {
        "r": (
            ShardingSpec((8, 3), Mesh({"r": 2}), [Replicate()]),
            ShardingSpec((8, 3), Mesh({"t": 4}, ranks=[2, 3, 4, 5]), [Shard(0)]),
            "float32",
            None,
        )
    }
    src, dst = _inputs(rank, rep)
    if rank == 1:
        src["r"][0].add_(0.5)  # type: ignore[index]
    try:
        WeightTransfer(src, dst, timeout=60).run(verify=True)
        out["replicas"] = "ok"
    except TransferVerificationError as exc:
        out["replicas"] = (sorted(exc.tensors), sorted(exc.replicas))
    return out


def _mismatch_cases(rank: int) -> dict[str, str]:
    """Sides that disagree fail at construction on every rank, naming tensors and ranks."""
    import torch

    from meshlayout.torch import MeshMismatchError, WeightTransfer

    fsdp = Mesh({"dp": 4})
    tp45 = Mesh({"tp": 2}, ranks=[4, 5])
    out: dict[str, str] = {}

    def attempt(key: str, src: Any, dst: Any) -> None:
        try:
            WeightTransfer(src, dst, timeout=60)
            out[key] = "no error"
        except MeshMismatchError as exc:
            out[key] = f"MeshMismatchError {list(exc.ranks)} {list(exc.fields)}: {exc}"
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    spec = ShardingSpec((8, 4), fsdp, [Shard(0)])
    src = {"w": (torch.zeros(2, 4), spec)} if rank < 4 else None
    # rank 5 asks for another layout than rank 4
    d = ShardingSpec((8, 4), tp45, [Shard(0) if rank == 5 else Shard(1)])
    attempt("spec", src, {"w": d} if rank >= 4 else None)
    # a name on the source side only
    d1 = {"w": ShardingSpec((8, 4), tp45, [Shard(1)])}
    attempt("source only", _two(rank, spec), d1 if rank >= 4 else None)
    # a destination rank that does not pass a tensor its mesh holds
    src2 = (
        {"w": (torch.zeros(2, 4), spec), "extra": (torch.zeros(2, 4), spec)} if rank < 4 else None
    )
    d2 = {"w": ShardingSpec((8, 4), tp45, [Shard(1)])}
    if rank == 4:
        d2["extra"] = (ShardingSpec((8, 4), tp45, [Shard(1)]), torch.float32)  # type: ignore[assignment]
    attempt("names", src2, d2 if rank >= 4 else None)
    # rank 2 does not pass a tensor its mesh holds
    v_spec = ShardingSpec((1,), fsdp, [Replicate()])
    src3 = {"w": (torch.zeros(2, 4), spec), "v": (torch.zeros(1), v_spec)} if rank < 4 else None
    if rank == 2:
        src3 = {"v": (torch.zeros(1), v_spec)}
    dst3 = {
        "w": ShardingSpec((8, 4), tp45, [Shard(1)]),
        "v": ShardingSpec((1,), tp45, [Replicate()]),
    }
    attempt("absent name", src3, dst3 if rank >= 4 else None)
    # a local piece of the wrong shape fails on that rank before any exchange
    if rank == 0:
        attempt("shape", {"w": (torch.zeros(3, 4), spec)}, None)
    return out


def _two(rank: int, spec: ShardingSpec) -> Any:
    import torch

    if rank >= 4:
        return None
    return {"w": (torch.zeros(2, 4), spec), "extra": (torch.zeros(2, 4), spec)}


def _timeout_cases(rank: int) -> dict[str, Any]:
    """Rank 5 leaves: first it skips a run (the others time out in the collective),
    then a construction (the others time out in the metadata exchange); both name it."""
    from meshlayout.torch import RankTimeoutError, WeightTransfer

    tensors: Tensors = {
        "w": (
            ShardingSpec((8, 4), Mesh({"dp": 4}), [Shard(0)]),
            ShardingSpec((8, 4), Mesh({"tp": 2}, ranks=[4, 5]), [Shard(1)]),
            "float32",
            None,
        )
    }
    src, dst = _inputs(rank, tensors)
    wt = WeightTransfer(src, dst, timeout=6)
    out: dict[str, Any] = {}
    if rank == 5:
        return out
    for key, call in (("run", wt.run), ("construct", lambda: WeightTransfer(src, dst, timeout=6))):
        try:
            call()
            out[key] = "no error"
        except RankTimeoutError as exc:
            out[key] = (list(exc.missing), "5" in str(exc))
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
    return out


def _body(rank: int, world: int, scenarios: list[Model]) -> dict[str, Any]:
    log = _instrument()
    results: dict[str, Any] = {}
    for model in scenarios:
        if rank in _union(model[1]):
            try:
                results[model[0]] = _run_model(rank, model, log)
            except Exception as exc:  # report, keep going: later scenarios need this rank
                import traceback

                results[model[0]] = {"problems": [traceback.format_exc()], "exc": repr(exc)}
    for key, fn in (
        ("dtensors", _fsdp_dtensors),
        ("fused", _fused_out),
        ("api", _api_cases),
        ("verify", _verify_cases),
        ("mismatch", _mismatch_cases),
        ("timeout", _timeout_cases),  # last: rank 5 leaves
    ):
        try:
            results[key] = fn(rank)
        except Exception:
            import traceback

            results[key] = {"error": traceback.format_exc()}
    return results


# ---------------------------------------------------------------------- parent side
@pytest.fixture(scope="module")
def outcome() -> tuple[list[Model], list[dict[str, Any]]]:
    scenarios = models()
    results = run_multiproc(_body, WORLD, scenarios, timeout=300, start_method="spawn")
    return scenarios, results


def test_every_scenario_is_exact(outcome: tuple[list[Model], list[dict[str, Any]]]) -> None:
    scenarios, results = outcome
    bad = []
    for name, tensors, _ in scenarios:
        for r in sorted(_union(tensors)):
            for p in results[r][name]["problems"]:
                bad.append(f"{name} rank {r}: {p}")
    assert not bad, "\n".join(bad)


def test_one_collective_per_round_and_plan_bytes(
    outcome: tuple[list[Model], list[dict[str, Any]]],
) -> None:
    scenarios, results = outcome
    multi = 0
    for name, tensors, _ in scenarios:
        union = sorted(_union(tensors))
        rounds = results[union[0]][name]["rounds"]
        multi += rounds > 1
        for r in union:
            got = results[r][name]
            assert got["calls"] == ["alltoall_base_"] * rounds, (name, r, got["calls"])
            assert got["verify_calls"] == ["alltoall_base_"] * rounds + ["allreduce_"], name
        sent = sum(results[r][name]["sent"] for r in union)
        assert sent == results[union[0]][name]["bytes_moved"], name
    assert multi >= 4  # several scenarios really use several rounds


def test_real_fsdp2_and_hsdp_dtensors(outcome: tuple[list[Model], list[dict[str, Any]]]) -> None:
    _, results = outcome
    for r in range(WORLD):
        got = results[r]["dtensors"]
        assert "error" not in got, got.get("error")
        for label in ("fsdp2-over-tp", "hsdp", "1-D meshes"):
            assert got[label]["problems"] == [], (r, label, got[label])
        assert got["1-D meshes"]["placements"]["3.weight"] == "[Shard(dim=0)]"
        assert got["fsdp2-over-tp"]["placements"]["0.weight"].startswith("[_StridedShard")
        assert got["hsdp"]["placements"]["0.weight"] == "[Replicate(), Shard(dim=0)]"
        want = ["0.bias", "0.weight", "2.bias", "2.weight"] if r >= 4 else []
        assert got["fsdp2-over-tp"]["names"] == want


def test_out_views_into_a_fused_parameter(
    outcome: tuple[list[Model], list[dict[str, Any]]],
) -> None:
    _, results = outcome
    for r in range(WORLD):
        assert results[r]["fused"] == {"problems": []}, results[r]["fused"]


def test_one_shot_new_sources_and_bad_arguments(
    outcome: tuple[list[Model], list[dict[str, Any]]],
) -> None:
    _, results = outcome
    for r in range(WORLD):
        got = results[r]["api"]
        assert "error" not in got, got.get("error")
        assert got["one shot"] == [] and got["src_tensors"] == [], (r, got)
        assert got["empty out"] == [], (r, got)
        errors = got["errors"]
        if r in (3, 4, 5):
            assert errors[0].startswith("ValueError: out['w'] on rank"), errors
            assert "float64 (1, 1)" in errors[0], errors
            assert errors[1].startswith("KeyError") and "names ['x']" in errors[1], errors
            assert "its destination tensors are ['w']" in errors[1], errors
        assert errors[-1].startswith("KeyError") and "missing ['w']" in errors[-1], errors


def test_verify_catches_corruption_and_disagreeing_replicas(
    outcome: tuple[list[Model], list[dict[str, Any]]],
) -> None:
    _, results = outcome
    for r in range(WORLD):
        got = results[r]["verify"]
        assert "error" not in got, got.get("error")
        assert got["none"] == "ok"
        assert got["permute"] == (["w"], []), (r, got)
        assert got["offset"][1] == [] and got["offset"][0], (r, got)
        assert got["stale"][1] == [] and got["stale"][0], (r, got)
        assert got["replicas"] == (["r"], ["r"]), got  # rank 1 sends some rows


def test_disagreements_fail_on_every_rank(
    outcome: tuple[list[Model], list[dict[str, Any]]],
) -> None:
    _, results = outcome
    for r in range(WORLD):
        got = results[r]["mismatch"]
        assert "error" not in got, got.get("error")
        assert got["spec"].startswith("MeshMismatchError [5] ['w']"), got["spec"]
        assert got["source only"].startswith("MeshMismatchError [] ['extra']"), got
        assert "only on the source side ['extra']" in got["source only"]
        assert got["names"].startswith("MeshMismatchError [5] ['extra']"), got["names"]
        assert "destination ranks [5] of its mesh did not pass it" in got["names"]
        assert got["absent name"].startswith("MeshMismatchError [2] ['w']"), got["absent name"]
        assert "source ranks [2] of its mesh did not pass it" in got["absent name"]
        if r == 0:
            assert got["shape"].startswith("ValueError: 'w': the source piece of rank 0 has shape")


def test_absent_rank_is_named(outcome: tuple[list[Model], list[dict[str, Any]]]) -> None:
    _, results = outcome
    for r in range(5):
        got = results[r]["timeout"]
        assert got.get("run") == ([5], True), (r, got)
        assert got.get("construct") == ([5], True), (r, got)


def test_random_groups_cover_many_kinds() -> None:
    kinds = set()
    for _, tensors, _ in models():
        for src, dst, _, _ in tensors.values():
            for spec in (src, dst):
                kinds |= {type(p).__name__ for p in spec.placements()}
                kinds.add("undecodable" if not spec.decodable else "decodable")
    assert {"Shard", "StridedShard", "Replicate", "undecodable"} <= kinds
    random.Random(0)  # the groups are deterministic (seeded)
