"""torchtitan's ParallelDims accessors on meshlayout's ParallelDims, against torchtitan's code.

The reference is torchtitan's own ``parallel_dims.py`` (the last version with ``etp``,
vendored in ``tests/vendor/`` with its BSD license), run in a subprocess (this file
executed as a script) on torch's ``fake`` backend, one rank per configuration; the
whole family of groups of each DeviceMesh comes from its layout. For every
configuration and name the test compares: whether ``get_optional_mesh`` gives a
mesh, its groups (members in order), ``get_mesh``'s refusals, the multi-dim meshes,
``get_all_one_dimensional_meshes``, ``seq_len_divisor``, ``non_data_parallel_size``
and the ``*_enabled`` flags.

Newer torchtitan changed three things that meshlayout follows; they are tested by
hand below, citing the source: ``get_all_one_dimensional_meshes`` leaves out dims
that do not exist (torchtitan #4068), ``dp_shard`` always exists and ``dp`` names
``dp_replicate x dp_shard`` (its ``spmd_types`` backend, #4085), and
``get_optional_mesh(..., include_singleton_axes=True)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchtitan_configs
from meshlayout import ParallelDims
from meshlayout.torchtitan_names import ONE_DIMENSIONAL, TORCHTITAN_NAMES
from torchtitan_configs import COMBOS, DEGREES, TITAN

FLAGS = (
    "dp_enabled", "dp_replicate_enabled", "dp_shard_enabled", "cp_enabled", "dp_cp_enabled",
    "fsdp_enabled", "tp_enabled", "pp_enabled", "ep_enabled", "etp_enabled",
)  # fmt: skip


def configs() -> list[dict[str, int]]:
    return torchtitan_configs.configs(large=False)


CONFIGS = configs()


# ---------------------------------------------------------------------- torchtitan side


def _groups(mesh: Any) -> list[list[int]]:
    family = mesh._layout.remap_to_tensor(mesh._rank_map)
    return sorted(family.reshape(-1, mesh.size()).tolist())


def _torchtitan_answers(cfg: dict[str, int]) -> dict[str, Any]:
    """What torchtitan's ParallelDims says for one configuration (runs in the subprocess)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from vendor.torchtitan_parallel_dims import ParallelDims as TitanDims

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg["world_size"])
    try:
        pd = TitanDims(**cfg)
        pd.build_mesh()
        single: dict[str, Any] = {}
        get_mesh_refuses: dict[str, bool] = {}
        for name in TITAN:
            mesh = pd.get_optional_mesh(name)
            single[name] = None if mesh is None else _groups(mesh)
            try:
                pd.get_mesh(name)
                get_mesh_refuses[name] = False
            except ValueError:
                get_mesh_refuses[name] = True
        multi: dict[str, Any] = {}
        for combo in COMBOS:
            mesh = pd.get_optional_mesh(list(combo))
            multi["+".join(combo)] = None if mesh is None else _groups(mesh)
        return {
            "single": single,
            "get_mesh_refuses": get_mesh_refuses,
            "multi": multi,
            "one_d": list(pd.get_all_one_dimensional_meshes()),
            "seq_len_divisor": pd.seq_len_divisor,
            "non_data_parallel_size": pd.non_data_parallel_size,
            "flags": {f: getattr(pd, f) for f in FLAGS},
            "degrees": {d: getattr(pd, d) for d in DEGREES},
        }
    finally:
        dist.destroy_process_group()


def _main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    json.dump([_torchtitan_answers(c) for c in json.load(sys.stdin)], sys.stdout)


@pytest.fixture(scope="module")
def torchtitan() -> list[dict[str, Any]]:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(CONFIGS),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(proc.stdout)
    return answers


# ---------------------------------------------------------------------- the comparison


def _ours(cfg: dict[str, int]) -> ParallelDims:
    kwargs = {k: v for k, v in cfg.items() if k != "world_size"}
    return ParallelDims(cfg["world_size"], **kwargs)


def _rows(mesh: Any) -> list[list[int]] | None:
    return None if mesh is None else sorted(mesh.group_table().tolist())


@pytest.mark.torch
@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_same_answers_as_torchtitan(torchtitan: list[dict[str, Any]], index: int) -> None:
    cfg, theirs = CONFIGS[index], torchtitan[index]
    pd = _ours(cfg)
    for name in TITAN:
        assert _rows(pd.get_optional_mesh(name)) == theirs["single"][name], name
        refuses = False
        try:
            pd.get_mesh(name)
        except ValueError:
            refuses = True
        assert refuses == theirs["get_mesh_refuses"][name], name
    for combo in COMBOS:
        assert _rows(pd.get_optional_mesh(list(combo))) == theirs["multi"]["+".join(combo)], combo
    # Newer torchtitan leaves out dims that do not exist (efsdp without EP), and meshlayout
    # also lists dp_shard (its newer always-existing storage dim) when it is > 1.
    want = [n for n in theirs["one_d"] if pd.mesh_exists(n)]
    if pd.dp_shard > 1:
        want.insert(want.index("fsdp") + 1, "dp_shard")
    assert list(pd.get_all_one_dimensional_meshes()) == want
    assert pd.seq_len_divisor == theirs["seq_len_divisor"]
    assert pd.non_data_parallel_size == theirs["non_data_parallel_size"]
    assert {f: getattr(pd, f) for f in FLAGS} == theirs["flags"]
    assert {d: getattr(pd, d) for d in DEGREES} == theirs["degrees"]


# ---------------------------------------------------------------------- newer torchtitan


def test_dp_shard_always_exists_and_dp_is_batch() -> None:
    # torchtitan (spmd_types backend, #4085): `if name == "dp_shard" and self.spmd_backend ==
    # "spmd_types": return True`; its "dp" axis is dp_replicate * dp_shard ("batch").
    pd = ParallelDims(8, dp_replicate=2, dp_shard=1, tp=4)
    dp_shard = pd.get_optional_mesh("dp_shard")
    assert dp_shard is not None and dp_shard.size() == 1
    dp = pd.get_mesh("dp")
    assert dp.names == ("dp",)
    assert dp.group_table().tolist() == pd.mesh("batch").group_table().tolist()
    assert ParallelDims(8, tp=8).get_optional_mesh("dp") is None


def test_one_dimensional_meshes_leave_out_dims_that_do_not_exist() -> None:
    # torchtitan #4068: "Axes that build_mesh created with the Fake backend are excluded";
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


if __name__ == "__main__":
    _main()
