"""Mesh against the brute-force model of tests/mesh_reference.py on random chains.

Each chain starts from a root mesh over an identity, offset, stepped, reversed
or permuted rank map and applies random slices (any subset, any order),
flattens, unflattens and concats; every mesh met is then compared with the
model on every query: shape/names, coordinate, local_rank, group, submesh,
groups, submeshes, num_submeshes and ``in`` (for covered and uncovered ranks).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh_reference import ModelMesh, is_layout_sequence
from meshlayout import Mesh, RankMap

SIZES = (1, 2, 2, 3, 4, 4, 6, 8)
RANK_KINDS = ("identity", "offset", "stepped", "reversed", "permuted", "nested", "rankmap")


@dataclass
class Pair:
    mesh: Mesh
    model: ModelMesh


def make_root(rnd: random.Random) -> Pair:
    """A random root mesh (≤ 4 dims, ≤ 192 ranks) and its model."""
    while True:
        shape = [rnd.choice(SIZES) for _ in range(rnd.randint(1, 4))]
        if math.prod(shape) <= 192:
            break
    names = [f"d{i}" for i in range(len(shape))]
    n = math.prod(shape)
    kind = rnd.choice(RANK_KINDS)
    ranks: object
    if kind == "identity":
        ranks, flat = None, np.arange(n)
    elif kind == "offset":
        ranks = range(2048, 2048 + n)
        flat = np.arange(2048, 2048 + n)
    elif kind == "stepped":
        ranks = range(5, 5 + 3 * n, 3)
        flat = np.arange(5, 5 + 3 * n, 3)
    elif kind == "reversed":
        ranks = range(n + 6, 6, -1)
        flat = np.arange(n + 6, 6, -1)
    else:
        flat = np.array(rnd.sample(range(3 * n + 2), n))
        ranks = {
            "permuted": flat.tolist(),
            "nested": flat.reshape(shape).tolist(),
            "rankmap": RankMap(flat),
        }[kind]
    mesh = Mesh(shape, names, ranks=ranks)
    return Pair(mesh, ModelMesh.root(shape, names, flat))


def random_split(size: int, rnd: random.Random) -> tuple[int, ...]:
    """A random ordered factorisation of ``size`` into 2 or 3 factors (1s allowed)."""
    parts = []
    rest = size
    for _ in range(rnd.randint(1, 2)):
        d = rnd.choice([k for k in range(1, rest + 1) if rest % k == 0])
        parts.append(d)
        rest //= d
    parts.append(rest)
    rnd.shuffle(parts)
    return tuple(parts)


def step(pool: list[Pair], rnd: random.Random, k: int) -> Pair | None:
    """Apply one random operation to meshes of the pool; None if it was rejected."""
    cur = pool[-1] if rnd.random() < 0.7 else rnd.choice(pool)
    mesh, model = cur.mesh, cur.model
    op = rnd.choice(("slice", "slice", "flatten", "flatten_dims", "unflatten", "concat"))
    if op == "slice":
        idx = rnd.sample(range(mesh.ndim), rnd.randint(1, mesh.ndim))
        key = tuple(mesh.names[i] if rnd.random() < 0.5 else i for i in idx)
        return Pair(mesh[key], model.slice(idx))
    if op == "flatten":
        name = f"f{k}"
        return Pair(mesh.flatten(name), model.flatten(name))
    if op == "flatten_dims":
        idx = rnd.sample(range(mesh.ndim), rnd.randint(1, mesh.ndim))
        dims = [mesh.names[i] if rnd.random() < 0.5 else i for i in idx]
        name = f"g{k}" if rnd.random() < 0.5 else None
        out = mesh.flatten(name, dims=dims)
        return Pair(
            out,
            model.flatten_dims(idx, "_".join(mesh.names[i] for i in idx) if name is None else name),
        )
    if op == "unflatten":
        i = rnd.randrange(mesh.ndim)
        sizes = random_split(mesh.shape[i], rnd)
        names = tuple(f"u{k}_{j}" for j in range(len(sizes)))
        affine = model.unflatten_is_affine(i, sizes)
        if mesh.shape[i] == 1 or _is_single_mode(mesh, i):
            assert affine, "a dim with one mode must always split"
        try:
            out = mesh.unflatten(mesh.names[i], sizes, names)
        except ValueError as exc:
            assert not affine, f"{mesh!r}.unflatten({i}, {sizes}) raised but is a layout: {exc}"
            assert "unflatten" in str(exc)
            return None
        assert affine, f"{mesh!r}.unflatten({i}, {sizes}) returned a non-layout split"
        return Pair(out, model.unflatten(i, sizes, names))
    other = rnd.choice(pool)
    if set(other.mesh.names) & set(mesh.names):
        return None
    expected = model.concat(other.model)
    try:
        out = Mesh.concat([mesh, other.mesh])
    except ValueError as exc:
        assert expected is None, f"concat of {mesh!r} and {other.mesh!r} raised: {exc}"
        return None
    assert expected is not None, f"concat of overlapping {mesh!r} and {other.mesh!r} accepted"
    return Pair(out, expected)


def _is_single_mode(mesh: Mesh, i: int) -> bool:
    return len([m for m in mesh.axes[i].modes if m[0] > 1]) <= 1


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


def check(pair: Pair, outside: list[int]) -> None:
    """Every query of ``pair.mesh`` agrees with the model."""
    mesh, model = pair.mesh, pair.model
    assert mesh.shape == model.shape
    assert mesh.names == model.names
    assert mesh.ndim == len(model.shape)
    assert mesh.size() == math.prod(model.shape)
    assert mesh.num_submeshes == model.num_submeshes
    assert all(
        mesh.size(i) == mesh.size(n) == s for i, (n, s) in enumerate(zip(mesh.names, mesh.shape))
    )
    for rank in model.ranks.tolist():
        assert rank in mesh
        coord = model.coordinate(rank)
        assert mesh.coordinate(rank) == coord
        for i, name in enumerate(mesh.names):
            assert mesh.local_rank(rank, name) == coord[i]  # type: ignore[index]
            assert mesh.group(rank, i) == model.group(rank, i)
        assert _same(mesh.submesh(rank), model.submesh(rank)), (mesh, rank)
    for i, name in enumerate(mesh.names):
        assert _same(mesh.groups(name), model.groups(i)), (mesh, name)
    assert _same(mesh.submeshes(), model.submeshes()), mesh
    table = mesh.group_table()
    assert _same(table, model.submeshes().reshape(model.num_submeshes, -1)), mesh
    for per_host in (1, 2, 3, 4, 8):
        assert mesh.hosts_spanned(per_host).tolist() == model.hosts_spanned(per_host), mesh
    for rank in outside:
        assert rank not in mesh
        assert mesh.coordinate(rank) is None
        for query, args in (
            (mesh.group, (rank, 0)),
            (mesh.local_rank, (rank, 0)),
            (mesh.submesh, (rank,)),
        ):
            with pytest.raises(ValueError, match=f"rank {rank} "):
                query(*args)  # type: ignore[operator]


def run_chain(rnd: random.Random, length: int) -> int:
    """One random chain; returns how many operations succeeded."""
    pool = [make_root(rnd)]
    done = 0
    for k in range(length):
        out = step(pool, rnd, k)
        if out is not None:
            pool.append(out)
            done += 1
    ranks = set(pool[0].model.ranks.tolist())
    outside = [r for r in (0, 1, 7, 2047, 4096, 10**6) if r not in ranks]
    for pair in pool[-2:] if len(pool) > 1 else pool:
        check(pair, outside)
    return done


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(0, 6))
def test_random_chains_hypothesis(rnd: random.Random, length: int) -> None:
    run_chain(rnd, length)


def test_thousands_of_seeded_chains() -> None:
    rnd = random.Random(20240603)
    ops = sum(run_chain(rnd, rnd.randint(0, 6)) for _ in range(1200))
    assert ops > 2500  # the chains really exercise the operations


def test_model_representability_helper() -> None:
    assert is_layout_sequence([0, 1, 2, 3])
    assert is_layout_sequence([0, 4, 1, 5])  # (2,2):(1,4)
    assert is_layout_sequence([0, 8, 16, 2, 10, 18])  # (2,3):(2,8)
    assert not is_layout_sequence([0, 2, 1, 3, 5, 4])
    assert not is_layout_sequence([0, 3, 1, 4, 2, 5][:5])
    # (3,2):(1,3) split as (2,3) is not affine: its rows are 0 3 1 / 4 2 5
    model = ModelMesh.root([2, 3], ["a", "b"], np.arange(6)).slice([1, 0]).flatten("ba")
    assert not model.unflatten_is_affine(0, (2, 3))
    assert model.unflatten_is_affine(0, (3, 2))
