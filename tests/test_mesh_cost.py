"""Cost contract of docs/mesh.md#cost: per-rank operations allocate nothing world-sized.

At 2**20 ranks a world-sized int64 array is 8 MB; every operation below must
peak under 1 MB (tracemalloc sees numpy's allocations too).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from meshlayout import Mesh, RankMap

WORLD = 2**20
DEGREES = {"pp": 2, "dp_replicate": 8, "dp_shard": 32, "cp": 16, "tp": 128}
LIMIT = 1 << 20  # bytes
MIDDLE = WORLD // 2 + 12345


def peak_bytes(op: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        op()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def per_rank_ops(mesh: Mesh, rank: int) -> dict[str, Callable[[], object]]:
    sliced = mesh["tp", "dp_replicate", "cp"]
    ops: dict[str, Callable[[], object]] = {
        "slice non-contiguous": lambda: mesh["tp", "dp_replicate", "cp"],
        "flatten": lambda: mesh["dp_replicate", "dp_shard", "cp"].flatten(),
        "flatten all": lambda: mesh.flatten(),
        "unflatten": lambda: mesh.unflatten("dp_shard", (4, 8), ("a", "b")),
        "unflatten flat": lambda: mesh.flatten("w").unflatten("w", (1024, 1024), ("x", "y")),
        "concat": lambda: Mesh.concat([mesh["tp"], mesh["pp", "cp"]]),
        "coordinate": lambda: mesh.coordinate(rank),
        "coordinate of a slice": lambda: sliced.coordinate(rank),
        "in": lambda: rank in sliced,
        "submesh of a small slice": lambda: mesh["cp", "pp"].submesh(rank),
        "submesh of a transposed slice": lambda: sliced.submesh(rank),
        "num_submeshes": lambda: sliced.num_submeshes,
        "repr": lambda: repr(sliced),
        "hash and eq": lambda: hash(sliced) == hash(mesh["tp", "dp_replicate", "cp"]),
    }
    for name in DEGREES:
        ops[f"group {name}"] = lambda name=name: mesh.group(rank, name)  # type: ignore[misc]
        ops[f"local_rank {name}"] = lambda name=name: mesh.local_rank(rank, name)  # type: ignore[misc]
    return ops


@pytest.mark.parametrize("ranks", [None, range(WORLD, 2 * WORLD), range(3, 3 + 5 * WORLD, 5)])
def test_per_rank_operations_allocate_under_1mb_at_2_pow_20(ranks: range | None) -> None:
    assert peak_bytes(lambda: Mesh(DEGREES, ranks=ranks)) < LIMIT
    mesh = Mesh(DEGREES, ranks=ranks)
    rank = mesh.rank_map[MIDDLE]
    peaks = {name: peak_bytes(op) for name, op in per_rank_ops(mesh, rank).items()}
    too_big = {name: peak for name, peak in peaks.items() if peak >= LIMIT}
    assert not too_big, f"world-sized allocations: {too_big}"


def generic_per_rank_ops(mesh: Mesh, rank: int) -> dict[str, Callable[[], object]]:
    """Per-rank queries of any mesh (names not assumed); answers well under 1 MB."""
    ops: dict[str, Callable[[], object]] = {
        "coordinate": lambda: mesh.coordinate(rank),
        "in": lambda: rank in mesh,
        "submesh": lambda: mesh.submesh(rank),
        "num_submeshes": lambda: mesh.num_submeshes,
        "repr": lambda: repr(mesh),
    }
    for name in mesh.names:
        ops[f"group {name}"] = lambda name=name: mesh.group(rank, name)  # type: ignore[misc]
        ops[f"local_rank {name}"] = lambda name=name: mesh.local_rank(rank, name)  # type: ignore[misc]
    return ops


def test_explicit_rank_map_inverse_built_once_then_cheap() -> None:
    perm = np.random.default_rng(0).permutation(WORLD)
    mesh = Mesh(DEGREES, ranks=perm)
    derived = [
        mesh["tp", "pp"],
        mesh["dp_replicate", "dp_shard", "cp"].flatten("x")["x"],
        mesh.unflatten("tp", (8, 16), ("a", "b"))["b", "a", "cp"],
        mesh.flatten("w", dims=("dp_shard", "pp"))["w"],
    ]
    assert all(d.rank_map is mesh.rank_map for d in derived)
    assert all(d.size() * 8 < LIMIT // 4 for d in derived)  # answers are small
    rank = int(perm[MIDDLE])
    mesh.coordinate(rank)  # builds the inverse, once
    inverse = mesh.rank_map._inverse
    assert inverse is not None
    checked = []
    for d in derived:
        peaks = {name: peak_bytes(op) for name, op in generic_per_rank_ops(d, rank).items()}
        assert max(peaks.values()) < LIMIT, (d, peaks)
        assert d.rank_map._inverse is inverse
        checked.append(len(peaks))
    assert checked == [2 * d.ndim + 5 for d in derived]  # every derived mesh was measured


def test_sparse_explicit_rank_map_uses_a_sorted_inverse() -> None:
    ranks = np.random.default_rng(1).choice(10**8, size=4096, replace=False)
    rank_map = RankMap(ranks)
    assert rank_map.position(int(ranks[100])) == 100
    assert isinstance(rank_map._inverse, tuple)  # not a 10**8-entry dense table
    assert rank_map.position(10**8 + 5) is None


def test_groups_and_submeshes_are_vectorised() -> None:
    mesh = Mesh(DEGREES)
    tp = mesh.groups("tp")
    assert tp.shape == (WORLD // 128, 128)
    assert tp[3].tolist() == list(range(384, 512))
    pp = mesh.groups("pp")
    assert pp.shape == (WORLD // 2, 2) and pp[1].tolist() == [1, 1 + WORLD // 2]
    subs = mesh["cp", "tp"].submeshes()
    assert subs.shape == (WORLD // (16 * 128), 16, 128)
    assert subs[0, 1, 0] == 128
