"""DistributedMesh on real gloo processes: membership, order, counts, checks, torch interop.

Time limits here only prevent hangs (generous, counted after start-up).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc
from test_torch_groups import _count_creations
from torch_versions import ONE_MEMBER_BACKEND

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

PERMUTED = [5, 2, 7, 0, 3, 6, 1, 4]


def _membership(rank: int, world: int) -> list[str]:
    import torch
    import torch.distributed as dist

    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    problems: list[str] = []
    meshes = [
        Mesh({"pp": 2, "dp": 2, "tp": 2}),
        Mesh((2, 4), ("dp", "tp"), ranks=PERMUTED),
        Mesh((2, 2, 2), ("a", "b", "c"), ranks=PERMUTED)["c", "a"],  # a transposed family
    ]
    for mesh in meshes:
        dm = init_mesh(mesh, timeout=120)
        coord = mesh.coordinate(rank)
        if dm.coordinate != coord:
            problems.append(f"{mesh}: coordinate {dm.coordinate} != {coord}")
        tdm = dm.to_torch()
        if tdm.get_coordinate() != list(coord or ()) and tuple(tdm.get_coordinate()) != coord:
            problems.append(f"{mesh}: torch coordinate {tdm.get_coordinate()} != {coord}")
        for d in range(mesh.ndim):
            pg = dm.get_group(d)
            want = list(mesh.group(rank, d))
            got = dist.get_process_group_ranks(pg)
            if got != want:
                problems.append(f"{mesh} dim {d}: group {got} != {want}")
            local = mesh.local_rank(rank, d)
            if not (pg.rank() == dm.get_local_rank(d) == local == tdm.get_local_rank(d)):
                problems.append(
                    f"{mesh} dim {d}: pg.rank {pg.rank()} local {dm.get_local_rank(d)} "
                    f"mesh {local} torch {tdm.get_local_rank(d)}"
                )
            out = [torch.zeros(1, dtype=torch.int64) for _ in want]
            dist.all_gather(out, torch.tensor([rank]), group=pg)
            if [int(t) for t in out] != want:
                problems.append(f"{mesh} dim {d}: all_gather order {out} != {want}")
    return problems


def test_group_membership_and_order_match_mesh_including_permuted_rank_maps() -> None:
    out = run_multiproc(_membership, 8, timeout=240)
    assert out == [[]] * 8


def _counts(rank: int, world: int) -> dict[str, Any]:
    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    counts = _count_creations()
    res: dict[str, Any] = {}
    mesh = Mesh({"pp": 2, "dp": 2, "tp": 2}, ranks=PERMUTED)
    dm = init_mesh(mesh, timeout=120)
    res["init"] = counts["ours"]
    before = counts["ours"]
    dm["tp", "pp"], dm["dp"], dm[("pp", "dp", "tp")]
    init_mesh(mesh, timeout=120)
    res["slice_and_reinit"] = counts["ours"] - before
    before = counts["ours"]
    flat = dm["dp", "tp"].flatten("dptp")
    res["flatten_new"] = counts["ours"] - before
    before = counts["ours"]
    back = flat.unflatten("dptp", (2, 2), ("dp", "tp"))
    dm["dp", "tp"].flatten()
    dm.unflatten("pp", (2,), ("pp2",))
    init_mesh(mesh["dp", "tp"].flatten("x"), timeout=120)
    res["existing"] = counts["ours"] - before
    res["back_equal"] = back.mesh == mesh["dp", "tp"]
    res["torch_calls"] = counts["new_group"] + counts["split_group"]
    res["timeout_inherited"] = back.timeout == dm.timeout and dm.timeout is not None
    return res


def test_creation_counts_init_slice_reinit_flatten_unflatten() -> None:
    out = run_multiproc(_counts, 8, timeout=240)
    for res in out:
        assert res["init"] <= 3  # <= ndim per rank
        assert res["init"] == 3  # all dims have size 2, none equals the world
        assert res["slice_and_reinit"] == 0
        assert res["flatten_new"] == 1
        assert res["existing"] == 0
        assert res["back_equal"] and res["timeout_inherited"]
        assert res["torch_calls"] == 0


def _world_and_single(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    counts = _count_creations()
    dm = init_mesh(Mesh({"one": 1, "dp": 4}), timeout=120)
    return {
        "ours": counts["ours"],
        "dp_is_world": dm.get_group("dp") is dist.group.WORLD,
        "one_size": dm.get_group("one").size(),
        "one_backend": dist.get_backend(dm.get_group("one")),
    }


def test_world_dim_reuses_default_group_and_size_one_dims_create_no_communicator() -> None:
    from meshlayout.torch._groups import stats  # noqa: F401  (import check only)

    out = run_multiproc(_world_and_single, 4, timeout=240)
    for res in out:
        assert res["dp_is_world"] and res["one_size"] == 1
        assert res["one_backend"] == ONE_MEMBER_BACKEND
        assert res["ours"] == 1  # the local one-member group; no rendezvous


def _outside(rank: int, world: int) -> Any:
    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    dm = init_mesh(Mesh({"dp": 2}, ranks=[3, 1]), timeout=120)
    if rank in (1, 3):
        return dm.get_local_rank("dp")
    errors = []
    for call in (lambda: dm.get_group("dp"), dm.to_torch, lambda: dm.get_local_rank(0)):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    return (dm.coordinate, errors)


def test_rank_outside_mesh_gets_value_error() -> None:
    out = run_multiproc(_outside, 4, timeout=240)
    assert out[3] == 0 and out[1] == 1
    for r in (0, 2):
        coordinate, errors = out[r]
        assert coordinate is None and len(errors) == 3
        assert all(f"rank {r} is not in" in e for e in errors)


def _mismatch(rank: int, world: int) -> Any:
    from meshlayout import Mesh
    from meshlayout.torch import MeshMismatchError, init_mesh

    names = ("tp", "dp") if rank == 2 else ("dp", "tp")
    try:
        # a long timeout: the mismatch must be reported at once (the run's own bound
        # is far shorter), and as a mismatch, not as a timeout
        init_mesh(Mesh((2, 2), names), timeout=3600)
    except MeshMismatchError as exc:
        return (exc.ranks, exc.fields)
    return "no error"


def test_init_mesh_mismatch_raises_on_every_rank_without_waiting() -> None:
    out = run_multiproc(_mismatch, 4, timeout=240)
    assert out == [((2,), ("names",))] * 4


def _distribute(rank: int, world: int) -> list[str]:
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    problems = []
    mesh = Mesh((2, 2), ("dp", "tp"), ranks=[3, 0, 2, 1])
    dm = init_mesh(mesh, timeout=120)
    tdm = dm.to_torch()
    x = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)
    dt = distribute_tensor(x, tdm, [Shard(0), Shard(1)])
    i, j = mesh.coordinate(rank)  # type: ignore[misc]
    want = x.chunk(2, 0)[i].chunk(2, 1)[j]
    if not torch.equal(dt.to_local(), want):
        problems.append(f"local {dt.to_local()} != {want}")
    if not torch.equal(dt.full_tensor(), x):
        problems.append("full_tensor differs")
    r = dt.redistribute(tdm, [Replicate(), Shard(0)]).to_local()
    if not torch.equal(r, x.chunk(2, 0)[j]):
        problems.append("redistribute differs")
    sub = dm["tp"].to_torch()
    if sub.mesh.tolist() != list(mesh.group(rank, "tp")):
        problems.append(f"1-D torch mesh {sub.mesh.tolist()}")
    return problems


def test_to_torch_drives_distribute_tensor_on_a_permuted_mesh() -> None:
    assert run_multiproc(_distribute, 4, timeout=240) == [[]] * 4


def _build(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from meshlayout import ParallelDims
    from meshlayout.torch import build

    counts = _count_creations()
    pd = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2, ep=2)
    built = build(pd, "cpu", timeout=120)
    res: dict[str, Any] = {"calls": counts["ours"]}
    for view in ("tp", "dp_shard", "fsdp", "hsdp", "batch", "ep", "efsdp"):
        dm = built.get_or_create(view)
        assert built.get(view) is dm and built[view] is dm
        mesh = pd.mesh(view)
        for d in range(mesh.ndim):
            got = dist.get_process_group_ranks(dm.get_group(d))
            assert got == list(mesh.group(rank, d)), (view, d, got)
    res["after"] = counts["ours"]
    res["dp_shard_x_tp_is_new"] = built.get_or_create(("dp_shard", "tp")).shape == (2, 2)
    res["one_more"] = counts["ours"] - res["after"]  # (dp_shard, tp) holds no new group
    return res


def test_parallel_dims_build_creates_each_distinct_group_once() -> None:
    out = run_multiproc(_build, 8, timeout=240)
    for res in out:
        # distinct non-trivial groups of one rank: dp_replicate, dp_shard (= fsdp, efsdp?),
        # tp, batch (= dp_replicate x dp_shard = loss), ep ... never more than the views.
        assert res["calls"] <= 8
        assert res["after"] == res["calls"]
        assert res["dp_shard_x_tp_is_new"] and res["one_more"] == 0


# ---------------------------------------------------------------------- backend_override


def _override(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from meshlayout import Mesh
    from meshlayout.torch import init_mesh

    mesh = Mesh({"dp": 2, "tp": 2})
    dm = init_mesh(mesh, backend_override={"dp": "fake"}, timeout=120)
    res: dict[str, Any] = {
        "dp": dist.get_backend(dm.get_group("dp")),
        "tp": dist.get_backend(dm.get_group("tp")),
        "slice_dp": dist.get_backend(dm["dp"].get_group(0)),
        "unflatten_dp": dist.get_backend(dm.unflatten("dp", (2, 1), ("a", "b")).get_group("a")),
        "dp_members": dist.get_process_group_ranks(dm.get_group("dp")),
    }
    by_index = init_mesh(mesh, backend_override=[None, "gloo"], timeout=120)
    res["by_index_tp"] = dist.get_backend(by_index.get_group("tp"))
    for bad, kind in (({"xx": "gloo"}, KeyError), (["gloo"], ValueError), ([1, None], TypeError)):
        try:
            init_mesh(mesh, backend_override=bad, timeout=120)
            res[f"bad {bad}"] = "no error"
        except kind as exc:
            res[f"bad {bad}"] = type(exc).__name__
    return res


def test_backend_override_per_dim_is_honoured_and_inherited() -> None:
    out = run_multiproc(_override, 4, timeout=240)
    for rank, res in enumerate(out):
        assert res["dp"] == "fake" and res["tp"] == "gloo", res
        assert res["slice_dp"] == "fake" and res["unflatten_dp"] == "fake", res
        assert res["dp_members"] == [rank % 2, rank % 2 + 2]
        assert res["by_index_tp"] == "gloo"
        assert res["bad {'xx': 'gloo'}"] == "KeyError"
        assert res["bad ['gloo']"] == "ValueError"
        assert res["bad [1, None]"] == "TypeError"
