"""Scale: a 2^20-rank world, every view built and one rank's groups queried in < 5 ms."""

from __future__ import annotations

import gc
import time

from meshlayout import ParallelDims

WORLD = 2**20
DEGREES = dict(pp=16, dp_replicate=8, dp_shard=64, cp=8, tp=16, ep=32, etp=4)
RANK = 777_777


def build_and_query() -> tuple[float, int]:
    """Seconds to build a fresh ParallelDims, all views, and ``RANK``'s groups; ranks seen."""
    start = time.perf_counter()
    pd = ParallelDims(WORLD, **DEGREES)
    seen = 0
    meshes = [*pd.views().values(), pd.dense, pd.sparse, pd.dataloading]
    for mesh in meshes:
        for dim in mesh.names:
            seen += len(mesh.group(RANK, dim))
    elapsed = time.perf_counter() - start
    return elapsed, seen


def test_million_rank_world_under_5ms() -> None:
    build_and_query()  # warm the code paths (imports, first-call caches) outside the timing
    gc.collect()
    # best of 10 fresh objects: robust to a CI machine busy with multi-process tests
    best = min(build_and_query()[0] for _ in range(10))
    assert best < 5e-3, (
        f"2^20-rank ParallelDims: views + one rank's groups took {best * 1e3:.2f} ms"
    )


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
    assert len(pd.mesh("loss").group(RANK, "loss")) == 8 * 64 * 8
    _, seen = build_and_query()
    assert seen > 0
