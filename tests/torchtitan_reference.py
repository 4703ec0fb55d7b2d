"""What torchtitan 0.3.0's ``ParallelDims`` answers, for the comparison tests (one home).

The reference is the installed package (``torchtitan==0.3.0``, the ``torchtitan`` extra),
run on torch's ``fake`` backend: ``run_reference(jobs)`` executes this file as a script
(a fresh interpreter, so no process-group state leaks into the test process), one
process for the whole batch. A job is ``{"cfg": degrees and world_size, "backend":
spmd_backend, "ranks": [simulated ranks], "dropin": bool}``; for each rank it builds
torchtitan's own ``ParallelDims`` (and, with ``dropin``, meshlayout's
``meshlayout.torch.torchtitan.ParallelDims`` on the same rank) and describes every
accessor with :func:`describe`: every request of :func:`requests` (single names, all
ordered pairs, sub-sequences of the global meshes, with and without
``include_singleton_axes``), ``get_mesh``, ``get_all_one_dimensional_meshes``,
``get_activated_mesh``, ``resolve_mesh``, ``spmd_meshes``, ``spmd_dense_mesh``,
``spmd_sparse_mesh``, ``get_dense_tp_mesh``, the flags and sizes.

A mesh is described by its dim names, shape and **the whole family of its groups**
(every sub-mesh, as rows of global ranks in coordinate order, sorted), so one
simulated rank shows every rank's groups; torch's side reads the family from the
``DeviceMesh`` layout and rank map. For the simulated rank, :func:`own_groups` adds
the members of the real process group along every dim (``get_process_group_ranks``).
An exception is described by its type name.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Every name asked about: 0.3.0's of every backend, meshlayout's own, and unknown ones.
NAMES = (
    "pp", "batch", "loss", "dp_replicate", "fsdp", "dp_shard", "dp", "cp", "tp", "ep",
    "efsdp", "etp", "hsdp", "world",
)  # fmt: skip
#: Global meshes' dims (all backends), whose ordered sub-sequences are asked for.
GLOBAL_DIMS = (
    ("pp", "batch", "cp", "tp"),
    ("pp", "dp_replicate", "fsdp", "tp"),
    ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
    ("pp", "dp_replicate", "efsdp", "ep"),
    ("dp", "cp", "tp"),
)
#: ``get_activated_mesh`` / ``resolve_mesh`` arguments (``MeshAxisName`` values and more).
AXIS_LISTS = (
    ("dp", "cp", "tp"),
    ("dp", "tp"),
    ("dp", "cp", "tp", "ep"),
    ("dp_replicate", "dp_shard", "cp", "tp"),
    ("dp_replicate", "fsdp", "tp"),
    ("dp_replicate", "efsdp", "ep"),
    ("tp",),
    ("ep",),
    ("dp",),
    ("fsdp",),
    ("cp", "tp"),
    ("pp", "tp"),
    ("tp", "ep"),
    ("dp", "dp_replicate", "dp_shard", "fsdp", "tp", "cp", "pp", "ep", "efsdp"),
)
FLAGS = (
    "dp_enabled", "dp_replicate_enabled", "dp_shard_enabled", "cp_enabled", "dp_cp_enabled",
    "fsdp_enabled", "tp_enabled", "pp_enabled", "ep_enabled",
)  # fmt: skip
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")


def requests() -> list[tuple[str, ...]]:
    """Single names, every ordered pair of distinct names, and the global meshes'
    ordered sub-sequences of length >= 3 (each also reversed)."""
    out: list[tuple[str, ...]] = [(n,) for n in NAMES]
    out += list(itertools.permutations(NAMES[:-2], 2))
    seen = set(out)
    for dims in GLOBAL_DIMS:
        for k in range(3, len(dims) + 1):
            for sub in itertools.combinations(dims, k):
                for req in (sub, sub[::-1]):
                    if req not in seen:
                        seen.add(req)
                        out.append(req)
    return out


# ---------------------------------------------------------------------- describing answers


def _error(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}"


def describe(obj: Any, family: Callable[[Any], Any]) -> dict[str, Any]:
    """Every accessor's answer; ``family(mesh)`` describes one mesh (torch or pure)."""

    def mesh_or_error(call: Callable[[], Any]) -> Any:
        try:
            mesh = call()
        except (ValueError, KeyError, IndexError, TypeError, AssertionError, RuntimeError) as exc:
            return _error(exc)
        return None if mesh is None else family(mesh)

    out: dict[str, Any] = {}
    for req in requests():
        key = "+".join(req)
        arg: Any = req[0] if len(req) == 1 else list(req)
        out[f"optional|{key}"] = mesh_or_error(lambda arg=arg: obj.get_optional_mesh(arg))
        out[f"singleton|{key}"] = mesh_or_error(
            lambda arg=arg: obj.get_optional_mesh(arg, include_singleton_axes=True)
        )
        out[f"get|{key}"] = mesh_or_error(lambda arg=arg: obj.get_mesh(arg))
    one_d = obj.get_all_one_dimensional_meshes()
    out["one_d"] = {k: family(v) for k, v in one_d.items()}
    out["one_d_names"] = list(one_d)
    for axes in AXIS_LISTS:
        key = "+".join(axes)
        out[f"activated|{key}"] = mesh_or_error(lambda a=axes: obj.get_activated_mesh(list(a)))
        out[f"resolve|{key}"] = mesh_or_error(lambda a=axes: obj.resolve_mesh(list(a)))
    out["spmd_meshes"] = [family(m) for m in obj.spmd_meshes()]
    out["spmd_dense"] = mesh_or_error(obj.spmd_dense_mesh)
    out["spmd_sparse"] = mesh_or_error(obj.spmd_sparse_mesh)
    out["dense_tp"] = mesh_or_error(obj.get_dense_tp_mesh)
    return out


def sizes_and_flags(obj: Any) -> dict[str, Any]:
    """Degrees (dp_shard inferred), flags, seq_len_divisor, non_data_parallel_size."""
    return {
        "degrees": {d: getattr(obj, d) for d in DEGREES},
        "flags": {f: getattr(obj, f) for f in FLAGS},
        "seq_len_divisor": obj.seq_len_divisor,
        "non_data_parallel_size": obj.non_data_parallel_size,
    }


def torch_family(mesh: Any) -> dict[str, Any]:
    """A torch DeviceMesh: names, shape, every sub-mesh (from its layout and rank map)."""
    table = mesh._layout.remap_to_tensor(mesh._rank_map).reshape(-1, mesh.size())
    return {
        "names": list(mesh.mesh_dim_names),
        "shape": list(mesh.shape),
        "groups": sorted(table.tolist()),
    }


def pure_family(mesh: Any) -> dict[str, Any]:
    """A meshlayout Mesh, described like :func:`torch_family`."""
    return {
        "names": list(mesh.names),
        "shape": list(mesh.shape),
        "groups": sorted(mesh.group_table().tolist()),
    }


def _cached(family: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``family`` memoised by object (torchtitan returns one cached mesh per request)."""
    seen: dict[int, tuple[Any, Any]] = {}

    def cached(mesh: Any) -> Any:
        hit = seen.get(id(mesh))
        if hit is None or hit[0] is not mesh:
            hit = seen[id(mesh)] = (mesh, family(mesh))
        return hit[1]

    return cached


def own_groups(mesh: Any) -> list[Any]:
    """This rank's groups of a DeviceMesh: (members of the process group, mesh row)."""
    import torch.distributed as dist

    coord = mesh.get_coordinate()
    out = []
    for d in range(mesh.ndim):
        index = tuple(slice(None) if i == d else c for i, c in enumerate(coord))
        out.append([dist.get_process_group_ranks(mesh.get_group(d)), mesh.mesh[index].tolist()])
    return out


# ---------------------------------------------------------------------- the subprocess


def _titan_kwargs(cfg: dict[str, int], backend: str) -> dict[str, Any]:
    kw: dict[str, Any] = {d: cfg[d] for d in DEGREES}
    return {**kw, "world_size": cfg["world_size"], "spmd_backend": backend}


def _count_creations() -> Callable[[], int]:
    """Count c10d's group-creation helper calls (torch's ``new_group`` and ours use it)."""
    from torch.distributed import distributed_c10d as c10d

    calls = [0]
    real = c10d._new_process_group_helper

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    c10d._new_process_group_helper = counting
    return lambda: calls[0]


def _build(cls: Any, cfg: dict[str, int], backend: str, count: Callable[[], int]) -> Any:
    before = count()
    try:
        pd = cls(**_titan_kwargs(cfg, backend))
    except Exception as exc:
        return {"refused": "construction", "error": _error(exc)}
    try:
        pd.build_mesh()
    except Exception as exc:
        return {"refused": "build_mesh", "error": _error(exc)}
    return pd, count() - before


def _job(job: dict[str, Any], count: Callable[[], int]) -> list[dict[str, Any]]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed import ParallelDims as Titan

    cfg, backend = job["cfg"], job["backend"]
    results = []
    for rank in job["ranks"]:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cfg["world_size"])
        try:
            res: dict[str, Any] = {"rank": rank}
            kinds = [("titan", Titan)]
            if job.get("dropin"):
                from meshlayout.torch._groups import clear_cache
                from meshlayout.torch.torchtitan import ParallelDims as Ours

                clear_cache()
                kinds.append(("ours", Ours))
            for kind, cls in kinds:
                built = _build(cls, cfg, backend, count)
                if isinstance(built, dict):
                    res[kind] = built
                    continue
                pd, calls = built
                answers: dict[str, Any] = {"creation_calls": calls}
                answers["own"] = {
                    name: own_groups(pd.get_optional_mesh(name, include_singleton_axes=True))
                    for name in pd._single_axis_meshes
                }
                if rank == job["ranks"][len(job["ranks"]) // 2]:  # one rank: every answer
                    answers.update(describe(pd, _cached(torch_family)))
                    answers.update(sizes_and_flags(pd))
                    answers["global_names"] = {
                        k: list(m.mesh_dim_names) for k, m in pd._global_meshes.items()
                    }
                    answers["layouts"] = {
                        k: repr(m._layout) for k, m in pd._single_axis_meshes.items()
                    }
                res[kind] = answers
            results.append(res)
        finally:
            dist.destroy_process_group()
    return results


def _main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.CRITICAL)  # torchtitan logs every build_mesh
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    count = _count_creations()
    jobs = json.load(sys.stdin)
    json.dump([_job(job, count) for job in jobs], sys.stdout)


def run_reference(jobs: list[dict[str, Any]], timeout: float = 1200) -> list[list[dict[str, Any]]]:
    """Run the jobs in a fresh interpreter; per job, per rank, the answers."""
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=timeout,  # hang guard
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: list[list[dict[str, Any]]] = json.loads(proc.stdout)
    return out


if __name__ == "__main__":
    _main()
