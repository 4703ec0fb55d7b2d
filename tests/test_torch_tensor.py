"""distribute / full_tensor / redistribute against the pure spec, with collectives counted."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

SHAPE = (7, 5)


def _specs(mesh: Any) -> list[Any]:
    from meshlayout.sharding import Partial, Replicate, Shard, ShardingSpec, StridedShard

    return [
        ShardingSpec(SHAPE, mesh, [Shard(0), Shard(1)]),
        ShardingSpec(SHAPE, mesh, [StridedShard(0, 2), Shard(0)]),  # FSDP over TP, uneven
        ShardingSpec(SHAPE, mesh, [Shard(0), Replicate()]),
        ShardingSpec(SHAPE, mesh, [Replicate(), Shard(1)]),
        ShardingSpec(SHAPE, mesh, [Replicate(), Replicate()]),
        ShardingSpec(SHAPE, mesh, [StridedShard(0, 2), Replicate()]),  # undecodable: runs
        ShardingSpec.from_shard_order(SHAPE, mesh, {1: ("tp", "dp")}),
        ShardingSpec(SHAPE, mesh, [Partial(), Shard(0)]),
        ShardingSpec(SHAPE, mesh, [Shard(1), Partial("max")]),
    ]


def _counting() -> dict[str, int]:
    """Count every collective call and every store access of meshlayout from now on."""
    from meshlayout.torch import _c10d

    names = ("all_gather_single", "all_reduce", "all_to_all_single", "broadcast", "default_store")
    counts = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(_c10d, name)

        def wrapper(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            counts[_name] += 1
            return _real(*a, **k)

        setattr(_c10d, name, wrapper)
    return counts


def _body(rank: int, world: int) -> list[str]:
    import torch

    from meshlayout import Mesh
    from meshlayout.sharding import Partial
    from meshlayout.torch import distribute, full_tensor, init_mesh, redistribute

    problems: list[str] = []
    dm = init_mesh(Mesh({"dp": 3, "tp": 2}, ranks=[4, 1, 5, 0, 3, 2]), timeout=120)
    x = torch.arange(float(SHAPE[0] * SHAPE[1])).reshape(SHAPE)
    specs = _specs(dm.mesh)
    for dims in ((0, 1), (1, 0)):  # create the flattened groups the operations use
        dm[dims].flatten()
    counts = _counting()
    for spec in specs:
        local = distribute(x, dm, spec, src=None)
        want = spec.shard(x, rank)
        if not torch.equal(local, want):
            problems.append(f"distribute {spec.placements()}: {local} != {want}")
        before = dict(counts)
        full = full_tensor(local, dm, spec)
        gathers = counts["all_gather_single"] - before["all_gather_single"]
        reduces = counts["all_reduce"] - before["all_reduce"]
        sharded = [p for p in spec.placements() if type(p).__name__ in ("Shard", "StridedShard")]
        partial = [p for p in spec.placements() if isinstance(p, Partial)]
        if not torch.equal(full, x):
            problems.append(f"full_tensor {spec.placements()}: {full} != {x}")
        if gathers != (1 if sharded else 0) or reduces != len(partial):
            problems.append(f"full_tensor {spec.placements()}: {gathers} gathers {reduces} reduces")
    plain = [s for s in specs if not any(isinstance(p, Partial) for p in s.placements())]
    for src in plain:
        for dst in plain:
            local = src.shard(x, rank)
            before = counts["all_to_all_single"]
            got = redistribute(local, src, dst, dm)
            calls = counts["all_to_all_single"] - before
            if not torch.equal(got, dst.shard(x, rank)):
                problems.append(f"redistribute {src.placements()} -> {dst.placements()}")
            if calls != 1:
                problems.append(f"redistribute made {calls} all_to_all calls")
    # distribute with a source rank: others pass garbage
    y = x if dm.get_local_rank("dp") == 0 and dm.get_local_rank("tp") == 0 else torch.zeros(SHAPE)
    got = distribute(y, dm, specs[1], src=0)
    if not torch.equal(got, specs[1].shard(x, rank)):
        problems.append("distribute from src=0 differs")
    if counts["broadcast"] != 1:
        problems.append(f"distribute made {counts['broadcast']} broadcasts")
    # the healthy path never touches the store (it is only read when a collective fails)
    if counts["default_store"]:
        problems.append(f"{counts['default_store']} store accesses on the healthy path")
    return problems


def test_distribute_full_tensor_redistribute_match_the_pure_spec() -> None:
    assert run_multiproc(_body, 6, timeout=300) == [[]] * 6


def _moves(rank: int, world: int) -> int:
    """Elements sent by this rank for Shard(0) on dp -> Shard(0) on tp (2x2)."""
    import torch

    from meshlayout import Mesh
    from meshlayout.sharding import Replicate, Shard, ShardingSpec
    from meshlayout.torch import _c10d, init_mesh, redistribute

    dm = init_mesh(Mesh({"dp": 2, "tp": 2}), timeout=120)
    src = ShardingSpec((8,), dm.mesh, [Shard(0), Replicate()])
    dst = ShardingSpec((8,), dm.mesh, [Replicate(), Shard(0)])
    sent = {"n": 0}
    real = _c10d.all_to_all_single

    def spy(out: Any, inp: Any, out_sizes: Any, in_sizes: Any, group: Any, timeout: Any) -> Any:
        sent["n"] += int(sum(in_sizes))
        return real(out, inp, out_sizes, in_sizes, group, timeout)

    _c10d.all_to_all_single = spy
    x = torch.arange(8.0)
    got = redistribute(src.shard(x, rank), src, dst, dm)
    assert torch.equal(got, dst.shard(x, rank))
    return sent["n"]


def test_redistribute_moves_each_element_at_most_once() -> None:
    sent = run_multiproc(_moves, 4, timeout=120)
    # rank (dp=i, tp=j) holds chunk i and needs chunk j: (0,0), (1,1) keep theirs and each
    # send their chunk once, to (1,0) and (0,1); 8 elements move in all, the minimum
    assert sent == [4, 0, 0, 4]
