"""Exact checkpoints on worlds larger than we may start: DCP's protocol, emulated ranks.

``dcp_emulation`` runs DCP's save and load planner/storage protocol for every rank of a
12- or 16-rank world inside one spawned process (torch's fake process group), writing
and reading real checkpoint files. Checked here:

* issue 13's three-level case, 9 rows on a (2, 2, 3) mesh with
  ``[_StridedShard(0, 6), Shard(0), Shard(0)]`` (12 ranks): plain DCP's save then load
  returns ``[0,1,2,3,4,6,5,8,7]`` with no error; ours returns ``0..8``;
* random source and destination shardings (uneven, strided, undecodable, replicated,
  mesh families, empty pieces, several dtypes): every destination piece, and the
  full tensor loaded on one process, equal the brute-force ``ShardingSpec.shard``.
"""

from __future__ import annotations

import math
import random
from functools import partial
from typing import Any

import pytest

pytest.importorskip("torch")

from meshlayout import Mesh
from meshlayout.sharding import Placement, Replicate, Shard, ShardingSpec, StridedShard
from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(300)]

WORLD = 16


def _three_level(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    from dcp_emulation import dtensor_of, emulated_load, emulated_save
    from meshlayout.torch import checkpoint as mlcp

    spec = ShardingSpec((9,), Mesh((2, 2, 3)), [StridedShard(0, 6), Shard(0), Shard(0)])
    data = torch.arange(9.0)
    replicated = ShardingSpec((9,), Mesh((2, 2, 3)), [Replicate()] * 3)
    out: dict[str, Any] = {}
    for name, planner in (("plain", DefaultSavePlanner), ("exact", mlcp.ExactSavePlanner)):
        path = f"{root}/{name}"
        emulated_save(12, lambda r: {"x": dtensor_of(spec, r, data)}, path, planner)
        full = {"x": torch.zeros(9)}
        dcp.load(full, checkpoint_id=path, no_dist=True)
        out[name] = full["x"].tolist()
        loaded = emulated_load(
            12,
            lambda r: {"x": dtensor_of(replicated, r, torch.zeros(9))},
            path,
            mlcp.ExactLoadPlanner,
        )
        out[name + "_replicated"] = {tuple(sd["x"].to_local().tolist()) for sd in loaded}
    return out


def test_three_level_strided_case_plain_dcp_permutes_ours_is_exact(tmp_path: Any) -> None:
    (out,) = run_multiproc(
        _three_level, 1, str(tmp_path), timeout=240, start_method="spawn", init=False
    )
    permuted = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 5.0, 8.0, 7.0]
    assert out["plain"] == permuted  # torch 2.13: no error, rows 5-8 swapped in pairs
    assert out["plain_replicated"] == {tuple(permuted)}
    assert out["exact"] == [float(i) for i in range(9)]
    assert out["exact_replicated"] == {tuple(float(i) for i in range(9))}


# ---------------------------------------------------------------------- random cases
def _random_spec(rng: random.Random, shape: tuple[int, ...]) -> ShardingSpec:
    sizes: list[int] = []
    for _ in range(rng.randint(1, 3)):
        room = 12 // math.prod(sizes)
        if room < 2:
            break
        sizes.append(rng.randint(1, min(4, room)))
    mesh = Mesh(tuple(sizes), ranks=rng.sample(range(WORLD), math.prod(sizes)))
    if mesh.ndim >= 2 and rng.random() < 0.25:
        keep = sorted(rng.sample(range(mesh.ndim), rng.randint(1, mesh.ndim - 1)))
        mesh = mesh[tuple(keep)]  # a family: every sub-mesh holds (and saves) a copy
    placements: list[Placement] = []
    for _ in range(mesh.ndim):
        kind = rng.random() if shape else 0.0
        if kind < 0.25:
            placements.append(Replicate())
        elif kind < 0.6:
            placements.append(Shard(rng.randrange(len(shape))))
        else:
            placements.append(StridedShard(rng.randrange(len(shape)), rng.randint(1, 4)))
    return ShardingSpec(shape, mesh, placements)


def _cases(n: int, seed: int) -> list[tuple[ShardingSpec, ShardingSpec, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        shape = tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 3)))
        dtype = rng.choice(["float32", "bfloat16", "int64"])
        out.append((_random_spec(rng, shape), _random_spec(rng, shape), dtype))
    return out


def _state(spec: ShardingSpec, data: Any, extra: dict[str, Any], rank: int) -> dict[str, Any]:
    """A rank's state dict: the DTensor ``t`` if the rank is in the mesh, and ``extra``."""
    from dcp_emulation import dtensor_of

    return {"t": dtensor_of(spec, rank, data), **extra} if rank in spec.mesh else dict(extra)


def _covered(spec: ShardingSpec) -> list[int]:
    return [r for r in range(WORLD) if r in spec.mesh]


def _random_round_trips(
    rank: int, world: int, root: str, cases: list[tuple[ShardingSpec, ShardingSpec, str]]
) -> list[str]:
    import torch

    from dcp_emulation import emulated_load, emulated_save
    from meshlayout.torch import checkpoint as mlcp

    failures = []
    for i, (src, dst, dtype) in enumerate(cases):
        shape = src.global_shape
        data = (torch.arange(math.prod(shape)) % 251).reshape(shape).to(getattr(torch, dtype))
        path = f"{root}/case{i}"
        where = f"case {i}: {src} -> {dst} ({dtype})"
        try:
            emulated_save(
                WORLD, partial(_state, src, data, {"step": i}), path, mlcp.ExactSavePlanner
            )
            zeros = torch.zeros(shape, dtype=data.dtype)
            loaded = emulated_load(
                WORLD, partial(_state, dst, zeros, {}), path, mlcp.ExactLoadPlanner
            )
            for r in _covered(dst):
                got = loaded[r]["t"].to_local()
                if not torch.equal(got, dst.shard(data, r)):
                    failures.append(f"{where}: rank {r} loaded {got.tolist()}")
            full = {"t": torch.zeros(shape, dtype=data.dtype), "step": -1}
            mlcp.load(full, path, no_dist=True)
            if not torch.equal(full["t"], data) or full["step"] != i:
                failures.append(f"{where}: no_dist load gave {full}")
        except Exception as exc:  # report and go on: one run checks every case
            failures.append(f"{where}: {type(exc).__name__}: {exc}")
    return failures


def test_random_shardings_round_trip_exactly(tmp_path: Any) -> None:
    cases = _cases(40, seed=13)
    (failures,) = run_multiproc(
        _random_round_trips, 1, str(tmp_path), cases, timeout=280, start_method="spawn", init=False
    )
    assert failures == []


# ---------------------------------------------------------------------- broken plain DCP
def _broken(rank: int, world: int, root: str) -> dict[str, str]:
    """Load plain DCP's uneven FSDP-over-TP checkpoints with our planner: clear errors."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    from dcp_emulation import fsdp_over_tp_checkpoint
    from meshlayout.torch import checkpoint as mlcp

    out = {}
    # 13 rows: plain DCP's own validation refuses; without it the metadata overlaps
    fsdp_over_tp_checkpoint(f"{root}/plain13", 13, DefaultSavePlanner, validate=False)
    fsdp_over_tp_checkpoint(f"{root}/plain7", 7, DefaultSavePlanner)  # saves "fine"
    for name, rows in (("plain13", 13), ("plain7", 7)):
        try:
            mlcp.load({"w": torch.zeros(rows, 3)}, f"{root}/{name}", no_dist=True)
            out[name] = "loaded"
        except BaseException as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def test_plain_dcp_uneven_checkpoints_fail_loudly_through_our_planner(tmp_path: Any) -> None:
    (out,) = run_multiproc(_broken, 1, str(tmp_path), timeout=240, start_method="spawn", init=False)
    assert out["plain13"].startswith(f"ValueError: load '{tmp_path}/plain13': w: saved chunks 1 ")
    assert "overlap on ((7, 8), (0, 3))" in out["plain13"]
    # 7 rows: the metadata tiles but rank 4's data file holds 0 rows where it says 1
    assert "mismatch sizes torch.Size([1, 3]) vs torch.Size([0, 3])" in out["plain7"]


# ---------------------------------------------------------------------- input errors
def _input_errors(rank: int, world: int, root: str) -> dict[str, str]:
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Partial as TPartial

    from dcp_emulation import as_rank, device_mesh
    from meshlayout.sharding import torch_split_runs
    from meshlayout.torch import checkpoint as mlcp

    out: dict[str, str] = {}

    def attempt(key: str, fn: Any) -> None:
        try:
            fn()
            out[key] = "no error"
        except BaseException as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    with as_rank(0, 1):  # one rank, no_dist: DCP wraps planning errors, save() unwraps
        mesh = Mesh((1,))
        partial = DTensor.from_local(torch.ones(3), device_mesh(mesh, 0), [TPartial()])
        attempt("partial save", lambda: mlcp.save({"p": partial}, f"{root}/p", no_dist=True))
    # FSDP-over-TP placements, but local pieces cut by torch's split reading (what
    # torch's distribute_tensor would produce): rank 4 holds 1 row, the nested order 0
    spec = ShardingSpec((7, 3), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
    with as_rank(4, 6):
        (rows, _) = torch_split_runs((7, 3), (3, 2), spec.placements(), (2, 0))
        local = torch.arange(21.0).view(7, 3)[rows[0][0] : rows[0][1]]
        wrong = DTensor.from_local(
            local,
            device_mesh(spec.mesh, 4),
            spec.to_torch(),
            run_check=False,
            shape=(7, 3),
            stride=(3, 1),
        )
        planner = mlcp.ExactSavePlanner()
        attempt("split layout", lambda: planner.set_up_planner({"w": wrong}, None, False))
    return out


def test_input_errors_name_the_tensor(tmp_path: Any) -> None:
    (out,) = run_multiproc(
        _input_errors, 1, str(tmp_path), timeout=240, start_method="spawn", init=False
    )
    assert out["partial save"].startswith(f"ValueError: save '{tmp_path}/p': p: DTensor placements")
    assert "include Partial" in out["partial save"]
    assert out["split layout"].startswith(
        "ValueError: w: rank 4 holds a local tensor of shape (1, 3), but "
        "[_StridedShard(dim=0, sf=2), Shard(dim=0)] on mesh (3, 2) laid out in the nested "
        "shard order (as FSDP2, TP and redistribute store it) gives (0, 3)"
    )
