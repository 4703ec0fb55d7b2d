"""Scale: a 2^20-rank world, every view built and one rank's groups queried.

The cost contract is checked by behaviour, not by seconds (timings live in
``benchmarks/``): the O(world) paths are booby-trapped while the views are built
and queried, the peak allocation stays far below one world-sized array, and the
answers are checked against hand-computed ranks.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from meshlayout import Layout, Mesh, ParallelDims, RankMap

WORLD = 2**20
DEGREES = dict(pp=16, dp_replicate=8, dp_shard=64, cp=8, tp=16, ep=32, etp=4)
RANK = 777_777
# Group size of every dim of every mesh queried, by hand from DEGREES
# (efsdp = dp_shard*cp*tp / (ep*etp) = 8192 / 128 = 64).
EXPECTED_SIZES = {
    "pp": [16], "dp_replicate": [8], "dp_shard": [64], "cp": [8], "tp": [16],
    "batch": [8 * 64], "loss": [8 * 64 * 8], "fsdp": [64 * 8], "hsdp": [8, 64 * 8],
    "efsdp": [64], "ep": [32], "etp": [4], "ehsdp": [8, 64],
    "dense": [16, 8, 64, 8, 16], "sparse": [16, 8, 64, 32, 4], "dataloading": [16, 512, 8, 16],
}  # fmt: skip


def build_and_query() -> dict[str, list[tuple[int, ...]]]:
    """A fresh ParallelDims, every view, and ``RANK``'s group along each dim of each."""
    pd = ParallelDims(WORLD, **DEGREES)
    meshes = {**pd.views(), "dense": pd.dense, "sparse": pd.sparse, "dataloading": pd.dataloading}
    return {name: [m.group(RANK, d) for d in m.names] for name, m in meshes.items()}


def _forbidden(what: str):  # type: ignore[no-untyped-def]
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the O(world) path {what} was used")

    return refuse


def test_million_rank_world_never_touches_the_o_world_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls, name in (
        (Mesh, "groups"),
        (Mesh, "submeshes"),
        (Mesh, "group_table"),
        (RankMap, "to_numpy"),
        (RankMap, "_build_inverse"),
    ):
        monkeypatch.setattr(cls, name, _forbidden(f"{cls.__name__}.{name}"))
    real_indices = Layout.indices

    def small_indices(self: Layout) -> np.ndarray:
        assert self.size() <= 4096, f"Layout.indices of {self} ({self.size()} values)"
        return real_indices(self)

    monkeypatch.setattr(Layout, "indices", small_indices)
    build_and_query()  # warm the caches, then measure a fresh object
    tracemalloc.start()
    try:
        groups = build_and_query()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < WORLD * 8 // 16, f"peak {peak} bytes: a world-sized array is {WORLD * 8}"
    sizes = {name: [len(g) for g in gs] for name, gs in groups.items()}
    assert sizes == EXPECTED_SIZES
    assert all(RANK in g for gs in groups.values() for g in gs)


def test_million_rank_answers_are_right() -> None:
    pd = ParallelDims(WORLD, **DEGREES)
    assert pd.rank_map.is_range  # default order: nothing world-sized is stored
    # RANK = 777777: tp stride 1, cp 16, dp_shard 128, dp_replicate 8192, pp 65536
    pp, rest = divmod(RANK, 65536)
    dr, rest = divmod(rest, 8192)
    ds, rest = divmod(rest, 128)
    cp, tp = divmod(rest, 16)
    assert pd.dense.coordinate(RANK) == (pp, dr, ds, cp, tp)
    assert pd.mesh("tp").group(RANK, "tp") == tuple(range(RANK - tp, RANK - tp + 16))
    assert pd.mesh("pp").group(RANK, "pp") == tuple(RANK % 65536 + 65536 * i for i in range(16))
    region = RANK - (RANK % 8192)  # first rank of this (pp, dp_replicate) expert region
    etp_base = RANK - RANK % 4
    assert pd.mesh("etp").group(RANK, "etp") == tuple(range(etp_base, etp_base + 4))
    ep_index = (RANK % 8192) // 4 % 32
    assert pd.mesh("ep").group(RANK, "ep")[ep_index] == RANK
    efsdp = pd.mesh("efsdp").group(RANK, "efsdp")
    assert len(efsdp) == 8192 // 128 and efsdp[0] == region + RANK % 128
    loss = pd.mesh("loss").group(RANK, "loss")
    # loss = (dp_replicate, dp_shard, cp): every rank with the same pp and tp coordinates
    assert loss == tuple(r for r in range(pp * 65536, (pp + 1) * 65536) if r % 16 == tp)
