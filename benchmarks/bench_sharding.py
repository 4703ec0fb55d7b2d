"""Local shape/offset: meshlayout.sharding vs torch 2.13, in the same run.

    .venv/bin/python benchmarks/bench_sharding.py [--check]

For every case and (up to 8 evenly spaced) ranks of the mesh, torch computes
``compute_local_shape_and_global_offset`` on a real ``DeviceMesh`` (one process,
torch's fake process group re-initialised as each rank), and also its pure core
``_compute_local_shape_and_global_offset`` given the coordinate (a lower bound:
no DeviceMesh lookups). Ours computes ``local_shape`` + ``local_offset``
(``local_runs`` where the piece is not a box) from the rank, with the per-rank
cache cleared before every call ("uncached", includes ``Mesh.coordinate``), and
again warm ("cached"). The speedup is torch public / ours uncached; the last
column counts ranks where torch's (shape, offset) differs from ours, i.e. from
the physical layout (see docs/sharding.md). ``--check`` exits non-zero if a
target is missed (>= 5x everywhere, >= 100x on strided 131,072 rows).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from meshlayout.mesh import Mesh
from meshlayout.sharding import Placement, Replicate, Shard, ShardingSpec, StridedShard

COLS = 1024
CASES: list[tuple[str, tuple[int, ...], list[Placement]]] = [
    ("S(0) S(1)", (4, 8), [Shard(0), Shard(1)]),
    ("S(0) S(0) S(1)", (2, 4, 4), [Shard(0), Shard(0), Shard(1)]),
    ("_S(0,8) S(0)  FSDP/TP", (4, 8), [StridedShard(0, 8), Shard(0)]),
    ("_S(0,2) S(0)  FSDP/TP", (3, 2), [StridedShard(0, 2), Shard(0)]),
    ("_S(0,6) S(0) S(0)", (2, 2, 3), [StridedShard(0, 6), Shard(0), Shard(0)]),
    ("_S(0,4) S(0) S(1)", (2, 4, 4), [StridedShard(0, 4), Shard(0), Shard(1)]),
    ("_S(0,2) _S(0,2)  literal", (2, 2), [StridedShard(0, 2), StridedShard(0, 2)]),
    ("_S(0,2) R  literal", (2, 4), [StridedShard(0, 2), Replicate()]),
]
ROWS = (4096, 131072)


def per_call(fn: Callable[[], object], calls: int, budget: float = 0.3) -> float:
    """Best seconds per call of ``fn`` (which makes ``calls`` calls) over a time budget."""
    best = float("inf")
    spent = 0.0
    rounds = 0
    while rounds < 3 or (spent < budget and rounds < 50):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt / calls)
        spent += dt
        rounds += 1
    return best


def torch_public(
    sizes: tuple[int, ...], ranks: list[int], shape: tuple[int, ...], tpl: list[object]
) -> float:
    """Seconds per call of the public function, averaged over ``ranks``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = 1
    for s in sizes:
        world *= s
    total = 0.0
    for r in ranks:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=world)
        dm = DeviceMesh("cpu", torch.arange(world).view(sizes))
        total += per_call(
            lambda dm=dm: compute_local_shape_and_global_offset(shape, dm, tpl), 1, budget=0.02
        )
    dist.destroy_process_group()
    return total / len(ranks)


def run_case(
    name: str, sizes: tuple[int, ...], pl: list[Placement], rows: int
) -> dict[str, object]:
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh = Mesh(sizes)
    shape = (rows, COLS)
    spec = ShardingSpec(shape, mesh, pl)
    tpl = list(spec.to_torch())
    step = max(1, mesh.size() // 8)
    ranks = list(range(0, mesh.size(), step))
    coords = [list(mesh.coordinate(r) or ()) for r in ranks]

    def theirs() -> None:
        for c in coords:
            _compute_local_shape_and_global_offset(shape, sizes, c, tpl)

    def ours_query(rank: int) -> object:
        if spec.is_box(rank):
            return spec.local_shape(rank), spec.local_offset(rank)
        return spec.local_shape(rank), spec.local_runs(rank)

    def ours_uncached() -> None:
        cache = spec._cache
        for r in ranks:
            cache.clear()
            ours_query(r)

    def ours_cached() -> None:
        for r in ranks:
            ours_query(r)

    t_public = torch_public(sizes, ranks, shape, tpl)
    t_torch = per_call(theirs, len(coords))
    t_ours = per_call(ours_uncached, len(coords))
    t_cached = per_call(ours_cached, len(coords))
    build = per_call(lambda: ShardingSpec(shape, mesh, pl), 1, budget=0.05)
    wrong = 0
    for r, c in zip(ranks, coords):
        t_shape, t_off = _compute_local_shape_and_global_offset(shape, sizes, c, tpl)
        if spec.is_box(r):
            wrong += (spec.local_shape(r), spec.local_offset(r)) != (t_shape, t_off)
        else:
            wrong += 1  # torch reports a (shape, offset) box; the piece is not one
    strided = any(isinstance(p, StridedShard) for p in pl)
    return {
        "name": name,
        "mesh": "x".join(map(str, sizes)),
        "rows": rows,
        "public": t_public * 1e6,
        "torch": t_torch * 1e6,
        "ours": t_ours * 1e6,
        "cached": t_cached * 1e6,
        "build": build * 1e6,
        "speedup": t_public / t_ours,
        "target": 100.0 if strided and rows == 131072 else 5.0,
        "wrong": f"{wrong}/{len(coords)}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    header = (
        "| placements | mesh | rows | torch µs/rank | torch core µs | ours µs (uncached) "
        "| speedup | ours cached µs | spec build µs | torch wrong |"
    )
    print(header)
    print("|" + "---|" * 10)
    missed = []
    for name, sizes, pl in CASES:
        for rows in ROWS:
            r = run_case(name, sizes, pl, rows)
            ok = r["speedup"] >= r["target"]  # type: ignore[operator]
            if not ok:
                missed.append(f"{name} {rows}")
            print(
                f"| `{r['name']}` | {r['mesh']} | {rows:,} | {r['public']:.1f} "
                f"| {r['torch']:.1f} | {r['ours']:.2f} "
                f"| {r['speedup']:.0f}x{'' if ok else ' (MISSED)'} | {r['cached']:.2f} "
                f"| {r['build']:.1f} | {r['wrong']} |",
                flush=True,
            )
    print(f"\ntorch {torch.__version__}; targets: >= 5x everywhere, >= 100x strided 131,072 rows")
    if missed:
        print("missed:", ", ".join(missed))
    return 1 if (missed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
