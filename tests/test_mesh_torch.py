"""Mesh against torch's DeviceMesh (2.13 and 2.14 checked) on every chain torch supports.

torch runs in a subprocess (this file executed as a script), one fake process
group per simulated rank, torn down after each, so no process-group state
leaks into other tests (pytest-xdist workers included). For each chain of
ascending slices, ``_flatten``, ``_unflatten`` and ``_concatenate`` over
identity, offset and permuted rank maps, every rank of the world reports
``get_coordinate``, ``mesh``, ``get_local_rank`` and the members of
``get_group`` for every dim, plus the whole family from ``_layout``; the test
compares them with :class:`meshlayout.Mesh`.

torch (2.13 and 2.14) sorts the ranks of a group, so with a permuted rank map its
``get_local_rank`` disagrees with its own ``get_coordinate``; ours never does. The
assertions about torch's own behaviour hold on the versions of
``tests/torch_versions.py`` and are skipped on others.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from meshlayout import Mesh
from torch_versions import TORCH_IS_KNOWN, describes_torch

pytestmark = pytest.mark.torch

Case = dict[str, Any]


# ---------------------------------------------------------------------- the chains


def random_case(rnd: random.Random, k: int) -> Case:
    """A root mesh inside a world, and a chain of operations torch supports."""
    shape = [rnd.choice((1, 2, 2, 3, 4)) for _ in range(rnd.randint(1, 3))]
    n = math.prod(shape)
    kind = rnd.choice(("identity", "offset", "permuted"))
    world = n if kind == "identity" else n + rnd.randint(1, 4)
    if kind == "identity":
        ranks = list(range(n))
    elif kind == "offset":
        start = world - n
        ranks = list(range(start, start + n))
    else:
        ranks = rnd.sample(range(world), n)
    names = [f"d{i}" for i in range(len(shape))]
    ops: list[list[Any]] = []
    cur = list(names)
    sizes = dict(zip(names, shape))
    for j in range(rnd.randint(1, 3)):
        op = rnd.choice(("slice", "flatten", "unflatten", "concat"))
        if op == "slice":
            keep = sorted(rnd.sample(range(len(cur)), rnd.randint(1, len(cur))))
            cur = [cur[i] for i in keep]
            ops.append(["slice", cur])
        elif op == "flatten":
            name = f"f{k}_{j}"
            ops.append(["flatten", name])
            sizes[name] = math.prod(sizes[c] for c in cur)
            cur = [name]
        elif op == "unflatten":
            dim = rnd.choice(cur)
            size = sizes[dim]
            a = rnd.choice([d for d in range(1, size + 1) if size % d == 0])
            new = [f"u{k}_{j}a", f"u{k}_{j}b"]
            ops.append(["unflatten", dim, [a, size // a], new])
            sizes.update(zip(new, (a, size // a)))
            i = cur.index(dim)
            cur = cur[:i] + new + cur[i + 1 :]
        elif len(cur) >= 2:
            picked = rnd.sample(cur, len(cur))
            cut = rnd.randint(1, len(cur) - 1)
            first = [c for c in cur if c in picked[:cut]]
            second = [c for c in cur if c in picked[cut:]]
            ops.append(["concat", first, second])
            cur = first + second
    return {"shape": shape, "names": names, "ranks": ranks, "world": world, "ops": ops}


def ours(case: Case) -> Mesh | None:
    """Our mesh after the chain, or None if one of our operations refused it."""
    mesh = Mesh(case["shape"], case["names"], ranks=case["ranks"])
    for op in case["ops"]:
        try:
            if op[0] == "slice":
                mesh = mesh[tuple(op[1])]
            elif op[0] == "flatten":
                mesh = mesh.flatten(op[1])
            elif op[0] == "unflatten":
                mesh = mesh.unflatten(op[1], op[2], op[3])
            else:
                mesh = Mesh.concat([mesh[tuple(op[1])], mesh[tuple(op[2])]])
        except ValueError:
            assert op[0] == "unflatten", op  # only a non-affine split may be refused
            return None
    return mesh


CASES = [random_case(random.Random(seed), seed) for seed in range(40)]
PERMUTED_2X2: Case = {
    "shape": [2, 2],
    "names": ["dp", "tp"],
    "ranks": [3, 1, 2, 0],
    "world": 4,
    "ops": [],
}
# (2,3):(6,1) split as (3,2) is not a layout: we raise, torch must not succeed silently
NOT_A_LAYOUT: Case = {
    "shape": [2, 2, 3],
    "names": ["a", "b", "c"],
    "ranks": list(range(12)),
    "world": 12,
    "ops": [["slice", ["a", "c"]], ["flatten", "ac"], ["unflatten", "ac", [3, 2], ["x", "y"]]],
}
FIXED: list[Case] = [
    PERMUTED_2X2,
    {"shape": [2, 2, 4], "names": ["pp", "dp", "tp"], "ranks": list(range(16)), "world": 16,
     "ops": [["slice", ["pp", "tp"]], ["flatten", "pp_tp"], ["unflatten", "pp_tp", [4, 2], ["a", "b"]]]},
    {"shape": [2, 3, 2], "names": ["a", "b", "c"], "ranks": list(range(4, 16)), "world": 18,
     "ops": [["concat", ["c"], ["a", "b"]]]},
    NOT_A_LAYOUT,
    {"shape": [4, 4], "names": ["dp", "tp"], "ranks": list(range(16)), "world": 16,
     "ops": [["unflatten", "dp", [2, 2], ["r", "s"]], ["slice", ["s", "tp"]], ["flatten", "st"]]},
]  # fmt: skip


# ---------------------------------------------------------------------- torch side (subprocess)


def _torch_chain(dm: Any, ops: list[list[Any]]) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    for op in ops:
        if op[0] == "slice":
            dm = dm[tuple(op[1])]
        elif op[0] == "flatten":
            dm = dm._flatten(op[1])
        elif op[0] == "unflatten":
            # by index: torch 2.10's _unflatten refuses every dim *name* it has (its
            # check is inverted); an index means the same on every version
            dim = dm.mesh_dim_names.index(op[1]) if isinstance(op[1], str) else op[1]
            dm = dm._unflatten(dim, tuple(op[2]), tuple(op[3]))
        else:
            dm = DeviceMesh._concatenate([dm[tuple(op[1])], dm[tuple(op[2])]])
    return dm


def _torch_answers(case: Case) -> dict[str, Any]:
    """Everything torch says about ``case``, rank by rank (runs in the subprocess)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    per_rank: list[dict[str, Any]] = []
    family: list[Any] = []
    for rank in range(case["world"]):
        dist.init_process_group("fake", rank=rank, world_size=case["world"], store=FakeStore())
        try:
            mesh = torch.tensor(case["ranks"]).reshape(case["shape"])
            root = DeviceMesh("cpu", mesh, mesh_dim_names=tuple(case["names"]))
            try:
                dm = _torch_chain(root, case["ops"])
            except Exception as exc:  # torch refused the chain on this rank
                per_rank.append({"error": f"{type(exc).__name__}: {exc}"})
                continue
            coord = dm.get_coordinate()
            answer: dict[str, Any] = {
                "shape": list(dm.shape),
                "names": list(dm.mesh_dim_names),
                "coordinate": None if coord is None else list(coord),
            }
            if coord is not None:
                answer["mesh"] = dm.mesh.tolist()
                answer["local_rank"] = [dm.get_local_rank(d) for d in range(dm.ndim)]
                answer["group"] = [
                    dist.get_process_group_ranks(dm.get_group(d)) for d in range(dm.ndim)
                ]
            per_rank.append(answer)
            family = dm._layout.remap_to_tensor(dm._rank_map).tolist()
        finally:
            dist.destroy_process_group()
    return {"per_rank": per_rank, "family": family}


def _main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    cases = json.load(sys.stdin)
    json.dump([_torch_answers(c) for c in cases], sys.stdout)


@pytest.fixture(scope="module")
def torch_answers() -> list[dict[str, Any]]:
    pytest.importorskip("torch")
    cases = FIXED + CASES
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(proc.stdout)
    return answers


# ---------------------------------------------------------------------- comparisons


def _sorted_rows(a: np.ndarray) -> list[list[int]]:
    return sorted(np.asarray(a).reshape(a.shape[0], -1).tolist())


@pytest.mark.parametrize("index", range(len(FIXED) + len(CASES)))
def test_against_torch(torch_answers: list[dict[str, Any]], index: int) -> None:
    case = (FIXED + CASES)[index]
    got = torch_answers[index]
    members = set(case["ranks"])
    errors = {r: a["error"] for r, a in enumerate(got["per_rank"]) if "error" in a}
    mesh = ours(case)
    if mesh is None:
        # We refuse only unflattens that are not layouts (tests/test_mesh_model.py
        # proves that); torch must not have produced a consistent mesh silently.
        assert set(errors) & members or not _torch_is_consistent(got), (case, got)
        return
    # torch cannot even build a slice on a rank outside the root mesh (RuntimeError
    # from DeviceMesh.mesh); members must always succeed.
    assert not set(errors) & members, (case, errors)
    family = np.asarray(got["family"])
    assert _sorted_rows(mesh.submeshes()) == _sorted_rows(family)
    for rank, answer in enumerate(got["per_rank"]):
        if rank in errors:
            assert mesh.coordinate(rank) is None and rank not in mesh
            continue
        assert tuple(answer["shape"]) == mesh.shape
        assert tuple(answer["names"]) == mesh.names
        coord = answer["coordinate"]
        assert mesh.coordinate(rank) == (None if coord is None else tuple(coord)), rank
        assert (rank in mesh) == (coord is not None)
        if coord is None:
            continue
        np.testing.assert_array_equal(mesh.submesh(rank), answer["mesh"])
        for d in range(mesh.ndim):
            group = mesh.group(rank, d)
            assert sorted(group) == sorted(answer["group"][d])
            assert mesh.local_rank(rank, d) == coord[d] == group.index(rank)
            if TORCH_IS_KNOWN:  # torch's local rank: the position in the *sorted* group
                assert answer["local_rank"][d] == sorted(group).index(rank)


def _torch_is_consistent(got: dict[str, Any]) -> bool:
    """Whether torch's answer is a partition of the rank map into equal sub-meshes."""
    family = np.asarray(got["family"])
    return bool(np.unique(family).size == family.size)


@describes_torch
def test_permuted_2x2_torch_disagrees_with_itself_we_do_not(
    torch_answers: list[dict[str, Any]],
) -> None:
    got = torch_answers[FIXED.index(PERMUTED_2X2)]["per_rank"]
    mesh = ours(PERMUTED_2X2)
    assert mesh is not None
    # rank 1 sits at (0, 1) of [[3, 1], [2, 0]]; its tp group is (3, 1)
    assert got[1]["coordinate"] == [0, 1]
    assert got[1]["local_rank"] == [1, 0]  # torch: tp local rank 0, coordinate says 1
    assert mesh.coordinate(1) == (0, 1)
    assert (mesh.local_rank(1, "dp"), mesh.local_rank(1, "tp")) == (0, 1)
    assert mesh.group(1, "tp") == (3, 1)
    disagreeing = [
        r
        for r, a in enumerate(got)
        if a["coordinate"] is not None and a["local_rank"] != a["coordinate"]
    ]
    assert disagreeing == [0, 1, 2, 3]  # every rank of [[3, 1], [2, 0]]


def test_chains_cover_every_operation() -> None:
    kinds = {op[0] for case in CASES for op in case["ops"]}
    assert kinds == {"slice", "flatten", "unflatten", "concat"}
    refused = [c for c in FIXED + CASES if ours(c) is None]
    assert NOT_A_LAYOUT in refused and len(refused) < len(CASES) // 4  # torch: bare AssertionError


if __name__ == "__main__":
    _main()
