"""torchtitan's accessors on the meshes ``meshlayout.torch.build`` returns.

Two halves:

* **Fake backend, large worlds, against torchtitan.** This file executed as a script
  (a subprocess, so no process-group state leaks into the test process) simulates
  ranks of worlds up to 512 on torch's ``fake`` backend, one rank at a time. For each
  configuration and rank it builds our meshes *and* torchtitan's own (the installed
  ``torchtitan==0.3.0``'s ``ParallelDims.build_mesh``, under its ``partial_dtensor``
  backend for ``fsdp`` and its default ``spmd_types`` for ``dp`` and ``dp_shard``;
  configurations with meshlayout's ``etp > 1``, which 0.3.0 lacks, only against the
  pure side) and reports, per torchtitan name and combination: None or not, and this
  rank's group along every dim — ours from the real process groups
  (``get_process_group_ranks``), torchtitan's from its ``DeviceMesh`` and coordinate.
  The test compares them, compares the names torchtitan has no mesh for (``hsdp``,
  ``ehsdp``, ``etp``, reversed dims, ``include_singleton_axes``) and every refusal
  with the pure ``ParallelDims``, and checks that ``build`` creates a communicator for
  exactly the groups of the views that exist (none for ``efsdp`` when ``ep == 1``).
* **gloo, 4 processes.** Size-1 dims that exist (``fsdp``, ``dp_shard``, ``efsdp``
  when ``ep > 1``) under FSDP2's ``fully_shard`` (with a mixed-precision policy, and
  HSDP over a (1, 1) mesh) train like a single process; dims that do not exist get
  the ``fake`` backend, the others gloo; caching, refusals and pass-throughs.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchtitan_configs
from meshlayout import ParallelDims
from meshlayout.torchtitan_names import ONE_DIMENSIONAL, TORCHTITAN_NAMES
from torch_versions import ONE_MEMBER_BACKEND, TORCHTITAN_USABLE
from torchtitan_configs import COMBOS, DEGREES, ETP_COMBOS, TITAN, TITAN_SPMD_TYPES

#: Names and combinations torchtitan 0.3.0 has no mesh for (meshlayout's own views).
OURS_ONLY = (("hsdp",), ("ehsdp",), ("tp", "ep"), ("fsdp", "dp_shard"), *ETP_COMBOS)


def configs() -> list[dict[str, int]]:
    return torchtitan_configs.configs(large=True)


def cases() -> list[tuple[dict[str, int], int]]:
    """(configuration, rank): the first and last rank and one more chosen at random."""
    rng = random.Random(14)
    out = []
    for cfg in configs():
        world = cfg["world_size"]
        for rank in sorted({0, world - 1, rng.randrange(world)}):
            out.append((cfg, rank))
    return out


CASES = cases()


def _ours(cfg: dict[str, int]) -> ParallelDims:
    pp, dpr, dps, cp, tp, ep, etp = (cfg[k] for k in ("pp", *DEGREES[:2], "cp", "tp", "ep", "etp"))
    return ParallelDims(
        cfg["world_size"], pp=pp, dp_replicate=dpr, dp_shard=dps, cp=cp, tp=tp, ep=ep, etp=etp
    )


# ---------------------------------------------------------------------- the subprocess


def _torch_groups(tdm: Any) -> list[list[int]]:
    """This rank's group along every dim of a torch DeviceMesh, from its mesh and coordinate."""
    coord = tdm.get_coordinate()
    out = []
    for d in range(tdm.ndim):
        index = tuple(slice(None) if i == d else c for i, c in enumerate(coord))
        out.append(tdm.mesh[index].tolist())
    return out


def _our_groups(dm: Any) -> list[list[int]]:
    import torch.distributed as dist

    return [dist.get_process_group_ranks(g) for g in dm.get_all_groups()]


def _error(call: Any) -> str | None:
    try:
        call()
    except (ValueError, TypeError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _answers(cfg: dict[str, int], rank: int) -> dict[str, Any]:
    """Ours and torchtitan's answers on one simulated rank (runs in the subprocess)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from meshlayout.torch import build
    from meshlayout.torch._groups import clear_cache, stats

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cfg["world_size"])
    try:
        clear_cache()
        meshes = build(_ours(cfg), "cpu", check=False)
        eager = sorted(list(key[0]) for key in stats().created_keys)
        res: dict[str, Any] = {"eager": eager, "titan": {}, "ours": {}, "refusals": {}}
        if cfg["etp"] == 1 and _HAVE_TORCHTITAN:
            from torchtitan.distributed import ParallelDims as TitanDims

            kw = {k: v for k, v in cfg.items() if k != "etp"}
            for backend, names_ in (
                ("partial_dtensor", [(n,) for n in TITAN] + list(COMBOS)),
                ("spmd_types", [(n,) for n in TITAN_SPMD_TYPES]),
            ):
                titan = TitanDims(**kw, spmd_backend=backend)
                titan.build_mesh()
                for names in names_:
                    t = titan.get_optional_mesh(list(names))
                    res["titan"]["+".join(names)] = None if t is None else _torch_groups(t)
        requests = [(n,) for n in TORCHTITAN_NAMES] + list(COMBOS) + list(OURS_ONLY)
        for names in requests:
            for include in (False, True):
                key = f"{'+'.join(names)}|{include}"
                try:
                    dm = meshes.get_optional_mesh(list(names), include_singleton_axes=include)
                except ValueError as exc:
                    res["ours"][key] = f"ValueError: {exc}"
                    continue
                if dm is None:
                    res["ours"][key] = None
                    continue
                again = meshes.get_optional_mesh(
                    names[0] if len(names) == 1 else tuple(names), include_singleton_axes=include
                )
                res["ours"][key] = {
                    "names": list(dm.names),
                    "groups": _our_groups(dm),
                    "cached": again is dm,
                }
            res["refusals"]["+".join(names)] = _error(
                lambda names=names: meshes.get_mesh(list(names))
            )
        res["one_d"] = {
            k: _our_groups(v) for k, v in meshes.get_all_one_dimensional_meshes().items()
        }
        res["sizes"] = [meshes.seq_len_divisor, meshes.non_data_parallel_size]
        return res
    finally:
        dist.destroy_process_group()


_HAVE_TORCHTITAN = TORCHTITAN_USABLE


def _main() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # torchtitan logs every build_mesh
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    json.dump([_answers(cfg, rank) for cfg, rank in json.load(sys.stdin)], sys.stdout)


@pytest.fixture(scope="module")
def fake_world() -> list[dict[str, Any]]:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(CASES),
        capture_output=True,
        text=True,
        timeout=1200,  # hang guard
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(proc.stdout)
    return answers


# ---------------------------------------------------------------------- fake-world comparisons


def _pure_groups(mesh: Any, rank: int) -> list[list[int]]:
    return [list(mesh.group(rank, d)) for d in range(mesh.ndim)]


@pytest.mark.torch
@pytest.mark.parametrize("index", range(len(CASES)))
def test_built_accessors_match_torchtitan_and_the_pure_side(
    fake_world: list[dict[str, Any]], index: int
) -> None:
    cfg, rank = CASES[index]
    res = fake_world[index]
    pd = _ours(cfg)
    if cfg["etp"] == 1 and _HAVE_TORCHTITAN:  # 0.3.0 has no etp
        assert len(res["titan"]) == len(TITAN) + len(COMBOS) + len(TITAN_SPMD_TYPES)
    # torchtitan's own meshes: None-ness and this rank's members along every dim
    for key, theirs in res["titan"].items():
        ours = res["ours"][f"{key}|False"]
        assert (ours is None) == (theirs is None), (key, ours, theirs)
        if ours is not None:
            assert ours["groups"] == theirs, key
    # every name (also those torchtitan 0.3.0 has no mesh for) against the pure side
    for key, ours in res["ours"].items():
        names, include = key.split("|")
        request = names.split("+")
        try:
            pure = pd.get_optional_mesh(request, include_singleton_axes=include == "True")
        except ValueError as exc:
            assert ours == f"ValueError: {exc}", key
            continue
        if pure is None:
            assert ours is None, key
            continue
        assert ours["names"] == list(pure.names), key
        assert ours["groups"] == _pure_groups(pure, rank), key
        assert ours["cached"], key
    for names, refusal in res["refusals"].items():
        try:
            pd.get_mesh(names.split("+"))
            want = None
        except ValueError as exc:
            want = f"ValueError: {exc}"
        assert refusal == want, names
    want_one_d = pd.get_all_one_dimensional_meshes()
    assert list(res["one_d"]) == list(want_one_d)
    for name, groups in res["one_d"].items():
        assert groups == _pure_groups(want_one_d[name], rank), name
    assert res["sizes"] == [pd.seq_len_divisor, pd.non_data_parallel_size]


@pytest.mark.torch
@pytest.mark.parametrize("index", range(len(CASES)))
def test_build_creates_communicators_only_for_views_that_exist(
    fake_world: list[dict[str, Any]], index: int
) -> None:
    cfg, rank = CASES[index]
    pd = _ours(cfg)
    world = tuple(range(pd.world_size))
    want: set[tuple[int, ...]] = set()
    skipped: set[tuple[int, ...]] = set()
    for name, mesh in pd.views().items():
        for d in range(mesh.ndim):
            group = mesh.group(rank, d)
            if len(group) > 1 and group != world:
                (want if pd.mesh_exists(name) else skipped).add(group)
    created = [tuple(g) for g in fake_world[index]["eager"]]
    assert len(created) == len(set(created)), "a group was created twice"
    assert set(created) == want
    if pd.ep == 1 and pd.mesh("efsdp").size() > 1:
        efsdp = pd.mesh("efsdp").group(rank, 0)
        assert efsdp in skipped or efsdp in want or efsdp == world
        assert efsdp not in set(created) - want


def test_cases_cover_large_worlds_and_efsdp_without_ep() -> None:
    worlds = {cfg["world_size"] for cfg, _ in CASES}
    assert max(worlds) == 512 and len(CASES) > 200
    lonely = [
        cfg
        for cfg, rank in CASES
        if cfg["ep"] == 1
        and (pd := _ours(cfg)).mesh("efsdp").size() > 1
        and all(
            pd.mesh("efsdp").group(rank, 0) != v.group(rank, d)
            for n, v in pd.views().items()
            if pd.mesh_exists(n)
            for d in range(v.ndim)
        )
    ]
    assert lonely, "no case where efsdp's group differs from every existing view's"


def test_accessors_need_torchtitan_names() -> None:
    assert set(ONE_DIMENSIONAL) <= set(TORCHTITAN_NAMES)


# ---------------------------------------------------------------------- gloo: FSDP2 on size-1 dims

DIM, HIDDEN, BATCH = 8, 12, 8


def _model(seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, DIM)
    )


def _batch(seed: int = 1) -> Any:
    import torch

    return torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(seed))


def _reference(
    dtype: Any = None, seed: int = 0, data_seed: int = 1
) -> tuple[float, dict[str, Any]]:
    model = _model(seed)
    x = _batch(data_seed)
    if dtype is not None:
        model, x = model.to(dtype), x.to(dtype)
    loss = model(x).pow(2).sum(-1).mean()
    loss.backward()
    return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def _grads(model: Any) -> dict[str, Any]:
    return {n: p.grad.full_tensor().float() for n, p in model.named_parameters()}


def _backend(dm: Any, dim: int = 0) -> str:
    import torch.distributed as dist

    return str(dist.get_backend(dm.get_group(dim)))


def _tp_over_size_one_fsdp(rank: int) -> dict[str, Any]:
    """tp=4, fsdp=dp_shard=1: TP + FSDP2 with a float64 mixed-precision policy."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from meshlayout.torch import build

    pd = ParallelDims(4, tp=4)
    meshes = build(pd, "cpu", timeout=120)
    fsdp, dp_shard = meshes.get_mesh("fsdp"), meshes.get_mesh("dp_shard")
    model = _model()
    parallelize_module(
        model, meshes.get_mesh("tp").to_torch(), {"0": ColwiseParallel(), "2": RowwiseParallel()}
    )
    policy = MixedPrecisionPolicy(param_dtype=torch.float64, reduce_dtype=torch.float64)
    fully_shard(model, mesh=fsdp.to_torch(), mp_policy=policy)
    out = model(_batch())
    loss = out.pow(2).sum(-1).mean()
    loss.backward()
    return {
        "sizes": (fsdp.size(), dp_shard.size()),
        "backends": (_backend(fsdp), _backend(dp_shard), _backend(meshes.get_mesh("tp"))),
        "out_dtype": str(out.dtype),
        "loss": loss.item(),
        "grads": _grads(model),
    }


def _experts_on_size_one_efsdp(rank: int) -> dict[str, Any]:
    """ep=4 over dp_shard x tp: efsdp has size 1 and exists; FSDP2 and HSDP over it."""
    from torch.distributed.fsdp import fully_shard

    from meshlayout.torch import build

    pd = ParallelDims(4, dp_shard=2, tp=2, ep=4)
    meshes = build(pd, "cpu", timeout=120)
    efsdp = meshes.get_optional_mesh("efsdp")
    assert efsdp is not None
    ehsdp = meshes.get_optional_mesh(["dp_replicate", "efsdp"], include_singleton_axes=True)
    assert ehsdp is not None and meshes.get_optional_mesh(["dp_replicate", "efsdp"]) is None
    ep_rank = meshes.get_mesh("ep").get_local_rank(0)
    res: dict[str, Any] = {"sizes": (efsdp.size(), ehsdp.shape), "ep_rank": ep_rank}
    for label, dm in (("fsdp", efsdp), ("hsdp", ehsdp)):
        expert = _model(seed=100 + ep_rank)  # each ep rank owns a different expert
        fully_shard(expert, mesh=dm.to_torch())
        loss = expert(_batch(seed=200 + rank)).pow(2).sum(-1).mean()
        loss.backward()
        res[label] = {"loss": loss.item(), "grads": _grads(expert)}
    return res


def _hsdp_and_rules(rank: int) -> dict[str, Any]:
    """dp_replicate=2 x dp_shard=2, ep=1: HSDP training, fake efsdp, refusals, caching."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from meshlayout.torch import build

    pd = ParallelDims(4, dp_replicate=2, dp_shard=2)
    meshes = build(pd, "cpu", timeout=120)
    res: dict[str, Any] = {"repr": repr(meshes)}
    hsdp = meshes.get_mesh(["dp_replicate", "fsdp"])
    model = _model()
    fully_shard(model, mesh=hsdp.to_torch())
    batch = meshes.get_mesh("batch")
    x = _batch().chunk(4)[batch.get_local_rank(0)]
    loss = model(x).pow(2).sum(-1).mean()
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total, group=meshes.get_mesh("loss").get_group(0))
    res["loss"] = total.item() / 4
    res["grads"] = _grads(model)
    # efsdp (size 2 = dp_shard's groups) does not exist without EP: None, or fake when asked
    res["efsdp_none"] = meshes.get_optional_mesh("efsdp") is None
    efsdp = meshes.get_optional_mesh("efsdp", include_singleton_axes=True)
    assert efsdp is not None
    dp_shard = meshes.get_mesh("dp_shard")
    res["efsdp"] = (_backend(efsdp), dist.get_process_group_ranks(efsdp.get_group(0)))
    res["dp_shard"] = (_backend(dp_shard), dist.get_process_group_ranks(dp_shard.get_group(0)))
    res["hsdp_backends"] = (_backend(hsdp, 0), _backend(hsdp, 1))
    try:
        meshes.get_mesh("efsdp")
    except ValueError as exc:
        res["efsdp_error"] = str(exc)
    try:
        meshes.get_optional_mesh("world")
    except ValueError as exc:
        res["name_error"] = str(exc)
    res["cached"] = (
        meshes.get_mesh("fsdp") is meshes.get_mesh(["fsdp"]) is meshes.get_or_create("fsdp")
    )
    res["one_d"] = {
        k: dist.get_process_group_ranks(v.get_group(0))
        for k, v in meshes.get_all_one_dimensional_meshes().items()
    }
    res["sizes"] = (meshes.seq_len_divisor, meshes.non_data_parallel_size)
    res["dtype_ok"] = torch.get_default_dtype() == torch.float32
    return res


def _gloo_body(rank: int, world: int) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    return {
        "tp": _tp_over_size_one_fsdp(rank),
        "experts": _experts_on_size_one_efsdp(rank),
        "hsdp": _hsdp_and_rules(rank),
    }


def _close(got: dict[str, Any], want: dict[str, Any]) -> None:
    import torch

    assert set(got) == set(want)
    for name, grad in got.items():
        assert torch.allclose(grad, want[name], atol=1e-5), name


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_fsdp2_on_size_one_dims_and_fake_dims_on_gloo() -> None:
    import torch

    from multiproc import run_multiproc

    out = run_multiproc(_gloo_body, 4, timeout=600)
    ref_loss64, ref_grads64 = _reference(torch.float64)
    ref_loss, ref_grads = _reference()
    pd = ParallelDims(4, dp_replicate=2, dp_shard=2)
    for rank, res in enumerate(out):
        tp = res["tp"]
        assert tp["sizes"] == (1, 1)
        # one-rank groups: no communicator (torch's local fake backend; gloo on 2.10)
        assert tp["backends"] == (ONE_MEMBER_BACKEND, ONE_MEMBER_BACKEND, "gloo")
        assert tp["out_dtype"] == "torch.float64"  # the mixed-precision policy applied
        assert tp["loss"] == pytest.approx(ref_loss64, rel=1e-9)
        _close(tp["grads"], ref_grads64)

        experts = res["experts"]
        assert experts["sizes"] == (1, (1, 1)) and experts["ep_rank"] == rank
        for label in ("fsdp", "hsdp"):
            loss, grads = _reference(seed=100 + rank, data_seed=200 + rank)
            assert experts[label]["loss"] == pytest.approx(loss, rel=1e-6)
            _close(experts[label]["grads"], grads)

        hsdp = res["hsdp"]
        assert hsdp["loss"] == pytest.approx(ref_loss, rel=1e-5)
        _close(hsdp["grads"], ref_grads)
        assert "efsdp" not in hsdp["repr"].split("built:")[1]  # not created eagerly
        assert hsdp["efsdp_none"]
        members = [rank - rank % 2, rank - rank % 2 + 1]
        assert hsdp["efsdp"] == ("fake", members)  # same members as dp_shard, no communicator
        assert hsdp["dp_shard"] == ("gloo", members)
        assert hsdp["hsdp_backends"] == ("gloo", "gloo")
        with pytest.raises(ValueError) as info:
            pd.get_mesh("efsdp")
        assert hsdp["efsdp_error"] == str(info.value)
        assert hsdp["name_error"].startswith("invalid mesh dim 'world'; valid dims are")
        assert hsdp["cached"]
        one_d = pd.get_all_one_dimensional_meshes()
        assert list(hsdp["one_d"]) == list(one_d)
        for name, members_ in hsdp["one_d"].items():
            assert members_ == list(one_d[name].group(rank, 0)), name
        assert hsdp["sizes"] == (pd.seq_len_divisor, pd.non_data_parallel_size)


def test_accessors_refuse_meshes_built_from_other_dims() -> None:
    pytest.importorskip("torch")
    from meshlayout.torch import ParallelMeshes

    class NotTorchtitan:  # only what build needs
        pass

    meshes = ParallelMeshes(NotTorchtitan(), "cpu", None)  # type: ignore[arg-type]
    for call in (
        lambda: meshes.get_mesh("tp"),
        lambda: meshes.get_optional_mesh("tp"),
        lambda: meshes.get_all_one_dimensional_meshes(),
        lambda: meshes.seq_len_divisor,
    ):
        with pytest.raises(TypeError, match=r"needs a meshlayout\.ParallelDims"):
            call()


if __name__ == "__main__":
    _main()
