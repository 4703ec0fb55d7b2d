"""torchtitan's names on meshlayout's pure ParallelDims, against installed torchtitan 0.3.0.

The reference is the released package (``torchtitan==0.3.0``, the ``torchtitan``
extra): its own ``ParallelDims.build_mesh`` on torch's ``fake`` backend, for every
configuration and SPMD backend of ``torchtitan_configs.titan_jobs()`` (run once per test
process by the ``torchtitan_reference`` fixture, ``tests/torchtitan_reference.py``).

* ``pd.torchtitan(backend)`` (:class:`~meshlayout.torchtitan_names.TorchtitanMeshes`)
  answers **exactly** as torchtitan: every request's mesh (dim names, shape, the whole
  family of groups), None-ness and exception type, ``get_all_one_dimensional_meshes``,
  ``get_activated_mesh``, ``resolve_mesh``, ``spmd_meshes``, ``spmd_dense_mesh``,
  ``spmd_sparse_mesh``, ``get_dense_tp_mesh``; the sizes and flags of the pure
  ``ParallelDims`` equal torchtitan's; the configurations torchtitan refuses are refused.
* The lenient accessors on ``ParallelDims`` itself (every backend's names plus
  meshlayout's own, any order of dims) give the same groups as torchtitan wherever
  torchtitan gives a mesh, and the same None-ness for every torchtitan name.

The rest of the file tests the lenient names by hand (meshlayout's extras: ``hsdp``,
``ehsdp``, ``etp``, reversed dims).
"""

from __future__ import annotations

from typing import Any

import pytest

from meshlayout import ParallelDims
from meshlayout.torchtitan_names import ONE_DIMENSIONAL, TORCHTITAN_NAMES, single_axis_names
from torch_versions import TORCHTITAN_MISSING, TORCHTITAN_USABLE
from torchtitan_configs import TITAN_DEGREES
from torchtitan_reference import describe, pure_family

needs_torchtitan = pytest.mark.skipif(not TORCHTITAN_USABLE, reason=TORCHTITAN_MISSING)
Reference = list[tuple[dict[str, Any], list[dict[str, Any]]]]


def _pure(cfg: dict[str, int]) -> ParallelDims:
    return ParallelDims(cfg["world_size"], **{d: cfg[d] for d in TITAN_DEGREES})


def _described(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    (theirs,) = [r["titan"] for r in per_rank if "one_d" in r["titan"]]
    return theirs


@pytest.mark.torch
@pytest.mark.xdist_group("torchtitan_reference")
@needs_torchtitan
def test_strict_accessors_answer_like_torchtitan(torchtitan_reference: Reference) -> None:
    compared = 0
    for job, per_rank in torchtitan_reference:
        cfg, backend = job["cfg"], job["backend"]
        if "refused" in per_rank[0]["titan"]:
            with pytest.raises(ValueError):
                _pure(cfg)
            continue
        theirs = _described(per_rank)
        pd = _pure(cfg)
        ours = describe(pd.torchtitan(backend), pure_family)
        for key, value in ours.items():
            assert value == theirs[key], (backend, cfg, key, value, theirs[key])
        assert {d: getattr(pd, d) for d in TITAN_DEGREES} == theirs["degrees"]
        assert {f: getattr(pd, f) for f in theirs["flags"]} == theirs["flags"]
        assert pd.seq_len_divisor == theirs["seq_len_divisor"]
        assert pd.non_data_parallel_size == theirs["non_data_parallel_size"]
        names = {k: list(m.names) for k, m in pd.torchtitan(backend).global_meshes().items()}
        assert names == {"world": ["world"], **theirs["global_names"]}
        compared += 1
    assert compared == 3 * 80  # every valid configuration, every backend


@pytest.mark.torch
@pytest.mark.xdist_group("torchtitan_reference")
@needs_torchtitan
def test_lenient_accessors_give_torchtitans_groups(torchtitan_reference: Reference) -> None:
    for job, per_rank in torchtitan_reference:
        cfg, backend = job["cfg"], job["backend"]
        if "refused" in per_rank[0]["titan"]:
            continue
        theirs = _described(per_rank)
        pd = _pure(cfg)
        for key, value in theirs.items():
            kind, _, request = key.partition("|")
            if kind not in ("optional", "singleton", "get") or not isinstance(value, dict):
                continue
            names = request.split("+")
            include = kind == "singleton"
            mesh = (
                pd.get_mesh(names)
                if kind == "get"
                else pd.get_optional_mesh(names, include_singleton_axes=include)
            )
            assert mesh is not None, (backend, cfg, key)
            assert sorted(mesh.group_table().tolist()) == value["groups"], (backend, cfg, key)
        for name in single_axis_names(backend):
            assert (theirs[f"optional|{name}"] is None) == (pd.get_optional_mesh(name) is None)


# ---------------------------------------------------------------------- 0.3.0's rules by hand


def test_dp_shard_always_exists_and_dp_is_batch() -> None:
    # torchtitan 0.3.0's _mesh_exist: `if name == "dp_shard" and self.spmd_backend in
    # ("full_dtensor", "spmd_types"): return True`; its "dp" axis is dp_replicate * dp_shard.
    pd = ParallelDims(8, dp_replicate=2, dp_shard=1, tp=4)
    dp_shard = pd.get_optional_mesh("dp_shard")
    assert dp_shard is not None and dp_shard.size() == 1
    dp = pd.get_mesh("dp")
    assert dp.names == ("dp",)
    assert dp.group_table().tolist() == pd.mesh("batch").group_table().tolist()
    assert ParallelDims(8, tp=8).get_optional_mesh("dp") is None


def test_one_dimensional_meshes_leave_out_dims_that_do_not_exist() -> None:
    # torchtitan 0.3.0: "Axes that build_mesh created with the Fake backend are excluded";
    # efsdp has size dp_shard*cp*tp but does not exist without EP.
    pd = ParallelDims(8, dp_shard=2, tp=4)
    assert pd.mesh("efsdp").size() == 8 and not pd.mesh_exists("efsdp")
    assert "efsdp" not in pd.get_all_one_dimensional_meshes()
    assert "efsdp" in ParallelDims(8, dp_shard=2, tp=4, ep=2).get_all_one_dimensional_meshes()
    assert list(ParallelDims(1).get_all_one_dimensional_meshes()) == []


def test_include_singleton_axes() -> None:
    pd = ParallelDims(8, dp_shard=2, tp=4)
    assert pd.get_optional_mesh(["pp", "tp"]) is None
    mesh = pd.get_optional_mesh(["pp", "tp"], include_singleton_axes=True)
    assert mesh is not None and mesh.names == ("pp", "tp") and mesh.shape == (1, 4)


# ---------------------------------------------------------------------- names and errors


def test_every_name_and_rule() -> None:
    pd = ParallelDims(16, dp_replicate=2, dp_shard=2, tp=4, ep=2)
    exists = {n: pd.mesh_exists(n) for n in TORCHTITAN_NAMES}
    assert exists == {
        "pp": False, "batch": True, "loss": True, "dp_replicate": True, "fsdp": True,
        "dp_shard": True, "dp": True, "cp": False, "tp": True, "ep": True, "efsdp": True,
        "etp": False, "hsdp": True, "ehsdp": True,
    }  # fmt: skip
    assert pd.get_mesh("hsdp") == pd.get_mesh(["dp_replicate", "fsdp"]) == pd.mesh("hsdp")
    assert pd.get_mesh("ehsdp") == pd.mesh("ehsdp")
    assert set(ONE_DIMENSIONAL) <= set(TORCHTITAN_NAMES)


def test_get_mesh_says_why() -> None:
    pd = ParallelDims(8, dp_shard=2, tp=4)
    with pytest.raises(ValueError, match=r"mesh 'cp' is not available: cp has size 1 \(disabled\)"):
        pd.get_mesh("cp")
    with pytest.raises(ValueError, match=r"efsdp exists only when ep > 1 \(ep=1\)"):
        pd.get_mesh("efsdp")
    with pytest.raises(ValueError, match=r"hsdp exists only when dp_replicate > 1"):
        pd.get_mesh("hsdp")
    with pytest.raises(ValueError, match=r"\['pp', 'tp'\] is not available: pp has size 1"):
        pd.get_mesh(["pp", "tp"])


def test_invalid_names_and_combinations() -> None:
    pd = ParallelDims(8, dp_shard=2, tp=4, ep=2)
    with pytest.raises(ValueError, match=r"invalid mesh dim 'world'; valid dims are \['pp', "):
        pd.get_optional_mesh("world")
    with pytest.raises(ValueError, match="invalid mesh dim 3"):
        pd.get_mesh(["tp", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="non-empty list of names"):
        pd.get_mesh([])
    with pytest.raises(ValueError, match=r"invalid mesh name combination \['tp', 'ep'\]"):
        pd.get_mesh(["tp", "ep"])
    with pytest.raises(ValueError, match="invalid mesh dim 'sparse'"):
        pd.mesh_exists("sparse")


def test_degrees_and_sizes() -> None:
    pd = ParallelDims(64, pp=2, dp_replicate=2, cp=2, tp=4, ep=4, etp=2)
    assert (pd.pp, pd.dp_replicate, pd.dp_shard, pd.cp, pd.tp, pd.ep, pd.etp) == (
        2,
        2,
        2,
        2,
        4,
        4,
        2,
    )
    assert pd.seq_len_divisor == 4 * 2 * 2
    assert pd.non_data_parallel_size == 2 * 4 * 2
    assert pd.world_size == 64
    # torchtitan's keyword call works unchanged.
    titan = ParallelDims(dp_replicate=2, dp_shard=-1, cp=2, tp=4, pp=2, ep=4, etp=2, world_size=64)
    assert titan == pd


# ---------------------------------------------------------------------- the strict view by hand


def test_strict_view_follows_torchs_slicing_rules() -> None:
    titan = ParallelDims(16, dp_shard=2, cp=2, tp=4).torchtitan("spmd_types")
    assert titan.get_mesh(["dp", "tp"]).names == ("dp", "tp")
    with pytest.raises(KeyError, match="ascending order"):
        titan.get_mesh(["tp", "cp"])  # out of rank order
    # a size-1 dim does not count: (tp, pp) with pp=1 slices like (tp,)
    mesh = titan.get_optional_mesh(["tp", "pp"], include_singleton_axes=True)
    assert mesh is not None and mesh.shape == (4, 1)
    with pytest.raises(RuntimeError, match="overlapping"):
        titan.get_activated_mesh(["tp", "tp"])
    with pytest.raises(ValueError, match=r"Invalid mesh name combinations \['pp', 'dp'\]"):
        titan.get_optional_mesh(["pp", "dp"], include_singleton_axes=True)  # no global mesh
    with pytest.raises(KeyError):
        ParallelDims(8, tp=8).torchtitan("partial_dtensor").spmd_dense_mesh()


def test_strict_view_refuses_what_torchtitan_lacks() -> None:
    with pytest.raises(ValueError, match="no expert tensor parallelism"):
        ParallelDims(8, tp=4, ep=2, etp=2).torchtitan()
    with pytest.raises(ValueError, match=r"spmd_backend 'dtensor' is not one of"):
        ParallelDims(8).torchtitan("dtensor")
    titan = ParallelDims(8, dp_shard=2, tp=4).torchtitan("partial_dtensor")
    with pytest.raises(ValueError, match="Invalid mesh dim: 'dp_shard'"):
        titan.get_mesh("dp_shard")
    with pytest.raises(ValueError, match="Invalid mesh dim: 'hsdp'"):
        titan.get_mesh("hsdp")
    pd = ParallelDims(8)
    assert pd.torchtitan() is pd.torchtitan()  # cached per backend
