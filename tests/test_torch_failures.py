"""A rank that fails before a collective: its peers fail naming it, bounded by the mesh.

One rank "raises" (returns early) before ``full_tensor`` / ``distribute`` /
``redistribute``; the others must raise :class:`RankTimeoutError` naming exactly that
rank after about the mesh's timeout, not hang for the default group's timeout (set
here to an hour: only the mesh's timeout can end their wait before the run's own,
generous bound kills them). No assertion on seconds: the error type and the named
ranks are the behaviour.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc
from torch_versions import TORCHTITAN_USABLE

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

DEFAULT_GROUP_TIMEOUT = 3600.0  # what the peers would wait without the mesh's timeout
MESH_TIMEOUT = 10.0  # generous: the ranks that take part must meet within it under load

#: scenario -> (mesh shape, rank map, the rank that fails before the call)
SCENARIOS = {
    "full_tensor on the world group": ({"dp": 4}, None, 1),
    "distribute from a failed source": ({"dp": 4}, None, 0),
    "redistribute on the world group": ({"dp": 4}, None, 3),
    "full_tensor on a tp group": ({"dp": 2, "tp": 2}, None, 1),
    "full_tensor creating its group": ({"dp": 2, "tp": 2}, [3, 1, 0, 2], 2),
}


def _peer_fails_before(rank: int, world: int, scenario: str) -> Any:
    import torch
    import torch.distributed as dist

    from meshlayout import Mesh
    from meshlayout.sharding import Replicate, Shard, ShardingSpec
    from meshlayout.torch import RankTimeoutError, distribute, full_tensor, init_mesh, redistribute

    shape, ranks, failing = SCENARIOS[scenario]
    dm = init_mesh(Mesh(shape, ranks=ranks), timeout=MESH_TIMEOUT)
    x = torch.arange(16.0).reshape(8, 2)
    n = dm.ndim
    if "tp group" in scenario:
        spec = ShardingSpec((8, 2), dm.mesh, [Replicate(), Shard(0)])
    else:
        spec = ShardingSpec((8, 2), dm.mesh, [Shard(0)] * n)
    replicated = ShardingSpec((8, 2), dm.mesh, [Replicate()] * n)
    world_group = dm.flatten().get_group(0) is dist.group.WORLD if ranks is None else None
    if rank == failing:
        return "failed before the call"  # as if it had raised: it never calls
    try:
        if scenario.startswith("full_tensor"):
            full_tensor(spec.shard(x, rank), dm, spec)
        elif scenario.startswith("distribute"):
            distribute(x, dm, spec, src=failing)  # flat coordinate == rank on this mesh
        else:
            redistribute(spec.shard(x, rank), spec, replicated, dm)
    except RankTimeoutError as exc:
        return {"missing": exc.missing, "message": str(exc), "world_group": world_group}
    return {"missing": "no error", "world_group": world_group}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_peers_of_a_failed_rank_fail_naming_it(scenario: str) -> None:
    _, ranks, failing = SCENARIOS[scenario]
    out = run_multiproc(
        _peer_fails_before, 4, scenario, timeout=240, pg_timeout=DEFAULT_GROUP_TIMEOUT
    )
    assert out[failing] == "failed before the call"
    waiting = [r for r in range(4) if r != failing]
    if "tp group" in scenario:  # only its tp partner needs the failed rank
        partner = failing ^ 1
        assert out[partner]["missing"] == (failing,), out[partner]
        waiting = [partner]
        others = [r for r in range(4) if r not in (failing, partner)]
        assert all(out[r]["missing"] == "no error" for r in others), out
    for r in waiting:
        res = out[r]
        assert res["missing"] == (failing,), (r, res)
        assert f"ranks [{failing}]" in res["message"], res["message"]
        if ranks is None and "tp group" not in scenario:  # the case: the world
            assert res["world_group"] is True
        if "creating" in scenario:
            assert "creating process group" in res["message"]
        else:
            assert "never reached it" in res["message"]


def _wrong_world(rank: int, world: int) -> dict[str, str]:
    """Every entry point given a layout of 8 ranks on a job of 4: each call's error."""
    import torch

    from meshlayout import Mesh, ParallelDims
    from meshlayout.sharding import Shard, ShardingSpec
    from meshlayout.torch import WeightTransfer, build, init_mesh, reshard

    src = ShardingSpec((8, 2), Mesh({"dp": 4}), [Shard(0)])
    dst = ShardingSpec((8, 2), Mesh({"tp": 2}, ranks=[4, 5]), [Shard(1)])
    wide = ShardingSpec((8, 2), Mesh({"tp": 8}), [Shard(0)])  # ranks 0-7, this one among them
    local = torch.zeros(src.local_shape(rank))
    calls = {
        "build": lambda: build(ParallelDims(8, dp_shard=2, tp=4), "cpu"),
        "init_mesh": lambda: init_mesh(Mesh({"dp": 2, "tp": 4})),
        "reshard": lambda: reshard(local, src, dst),
        "WeightTransfer": lambda: WeightTransfer({"w": (local, src)}, {"w": wide}),
    }
    if TORCHTITAN_USABLE:
        from meshlayout.torch.torchtitan import ParallelDims as TitanParallelDims

        calls["torchtitan"] = lambda: TitanParallelDims(
            dp_replicate=1, dp_shard=2, cp=1, tp=4, pp=1, ep=1, world_size=8
        ).build_mesh()
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except ValueError as exc:
            out[name] = str(exc)
    return out


def test_a_layout_bigger_than_the_job_fails_at_once_on_every_rank() -> None:
    """8-rank layouts on 4 processes: every rank raises ValueError naming both numbers,
    without waiting for ranks 4-7 (the default group's timeout is an hour; a wait would
    outlive the run's budget and fail the test)."""
    out = run_multiproc(_wrong_world, 4, timeout=240, pg_timeout=DEFAULT_GROUP_TIMEOUT)
    for rank in range(4):
        assert ("torchtitan" in out[rank]) == TORCHTITAN_USABLE  # the drop-in where it runs
        for name, message in out[rank].items():
            assert "needs global ranks up to" in message, (rank, name, message)
            assert "process group has world size 4" in message, (rank, name, message)
        assert "(8 processes)" in out[rank]["build"], out[rank]["build"]
        assert "choose degrees whose product is 4" in out[rank]["build"]
        assert out[rank]["build"].startswith("build(ParallelDims(8, "), out[rank]["build"]
        assert "ranks up to 5 (6 processes)" in out[rank]["reshard"], out[rank]["reshard"]
        assert out[rank]["WeightTransfer"].startswith("WeightTransfer dst['w']"), out[rank]
    assert all(out[r] == out[0] for r in range(4)), out
