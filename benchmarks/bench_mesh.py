"""Mesh vs torch 2.13 DeviceMesh: time and memory of every per-rank operation.

Usage: ``python benchmarks/bench_mesh.py [--quick]``

The 5-D mesh (pp, dp_replicate, dp_shard, cp, tp) at 2**10, 2**14, 2**17 (torch
and ours) and 2**20 (ours; torch takes ~40 s per construction there). torch runs
in a subprocess (this script with ``--torch-worker``) as one rank (the middle
one) of a fake process group. For each operation: median wall time and the
tracemalloc peak (for torch this sees the Python heap only, not tensors).

Ours is timed *cold*: every cache of the layout algebra is cleared and every
mesh is fresh before each call, so nothing is amortised; the warm median is
shown too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

Op = tuple[Callable[[], Any], Callable[[Any], object]]  # (untimed setup, timed op)

NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DEGREES = {
    2**10: (2, 2, 4, 2, 32),
    2**14: (2, 4, 8, 4, 64),
    2**17: (2, 8, 16, 8, 64),
    2**20: (2, 8, 32, 16, 128),
}
TORCH_WORLDS = (2**10, 2**14, 2**17)
TORCH_REPEATS = {2**10: 5, 2**14: 3, 2**17: 1}
OPS = (
    "construct",
    "slice (dp_replicate, cp)",
    "flatten (dp_replicate, dp_shard, cp)",
    "unflatten dp_shard -> 2 dims",
    "coordinate of a middle rank",
    "group along every dim",
)


def measure(
    setup: Callable[[], Any], op: Callable[[Any], object], repeats: int
) -> dict[str, float]:
    """Median seconds over ``repeats`` calls and the tracemalloc peak of one more."""
    times = []
    for _ in range(repeats):
        arg = setup()
        start = time.perf_counter()
        op(arg)
        times.append(time.perf_counter() - start)
    arg = setup()
    tracemalloc.start()
    try:
        op(arg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"median": statistics.median(times), "peak": float(peak)}


# ---------------------------------------------------------------------- ours


def _clear_layout_caches() -> None:
    """Forget everything the layout algebra and the mesh module memoised."""
    from meshlayout import layout, mesh

    for module in (layout, mesh):
        for obj in vars(module).values():
            clear = getattr(obj, "cache_clear", None)
            if callable(clear):
                clear()
    getattr(mesh, "_TILING_OK", set()).clear()


def our_ops(world: int) -> dict[str, Op]:
    from meshlayout import Mesh

    degrees = dict(zip(NAMES, DEGREES[world]))
    half = degrees["dp_shard"] // 2
    rank = world // 2 + world // 7

    def fresh() -> Mesh:
        _clear_layout_caches()
        mesh = Mesh(degrees)
        _clear_layout_caches()
        return mesh

    return {
        "construct": (_clear_layout_caches, lambda _: Mesh(degrees)),
        "slice (dp_replicate, cp)": (fresh, lambda m: m["dp_replicate", "cp"]),
        "flatten (dp_replicate, dp_shard, cp)": (
            fresh,
            lambda m: m["dp_replicate", "dp_shard", "cp"].flatten(),
        ),
        "unflatten dp_shard -> 2 dims": (
            fresh,
            lambda m: m.unflatten("dp_shard", (2, half), ("dp_shard_out", "dp_shard_in")),
        ),
        "coordinate of a middle rank": (fresh, lambda m: m.coordinate(rank)),
        "group along every dim": (fresh, lambda m: [m.group(rank, d) for d in NAMES]),
    }


def run_ours(world: int, repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, (setup, op) in our_ops(world).items():
        cold = measure(setup, op, repeats)
        warm_setup = (lambda: None) if name == "construct" else _warm(setup)
        warm = measure(lambda s=warm_setup: s(), op, repeats)  # type: ignore[misc]
        out[name] = {"median": cold["median"], "peak": cold["peak"], "warm": warm["median"]}
    return out


def _warm(setup: Callable[[], Any]) -> Callable[[], Any]:
    mesh = setup()
    return lambda: mesh


# ---------------------------------------------------------------------- torch (subprocess)


def torch_worker(world: int) -> dict[str, dict[str, float]]:
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    warnings.simplefilter("ignore")
    rank = world // 2 + world // 7
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    shape = DEGREES[world]
    half = shape[2] // 2
    repeats = TORCH_REPEATS[world]
    counter = iter(range(10**6))

    def build() -> DeviceMesh:
        return init_device_mesh("cpu", shape, mesh_dim_names=NAMES)

    def build_once() -> Callable[[], DeviceMesh]:
        mesh = build()
        return lambda: mesh

    root = build_once()
    ops: dict[str, Op] = {
        "construct": (lambda: None, lambda _: build()),
        "slice (dp_replicate, cp)": (root, lambda m: m["dp_replicate", "cp"]),
        "flatten (dp_replicate, dp_shard, cp)": (
            build,  # flatten names must be new per root mesh
            lambda m: m["dp_replicate", "dp_shard", "cp"]._flatten(),
        ),
        "unflatten dp_shard -> 2 dims": (
            root,
            lambda m: m._unflatten(
                "dp_shard", (2, half), (f"dps_out{next(counter)}", f"dps_in{next(counter)}")
            ),
        ),
        "coordinate of a middle rank": (
            root,
            lambda m: DeviceMesh._compute_coordinates_from_mesh(m.mesh, rank),
        ),
        "group along every dim": (
            root,
            lambda m: [dist.get_process_group_ranks(m.get_group(d)) for d in NAMES],
        ),
    }
    out = {name: measure(setup, op, repeats) for name, (setup, op) in ops.items()}
    dist.destroy_process_group()
    return out


def run_torch(worlds: tuple[int, ...]) -> dict[int, dict[str, dict[str, float]]]:
    results = {}
    for world in worlds:
        proc = subprocess.run(
            [sys.executable, __file__, "--torch-worker", str(world)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[world] = json.loads(proc.stdout)
    return results


# ---------------------------------------------------------------------- report


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _m(peak: float | None) -> str:
    if peak is None:
        return "—"
    if peak >= 1 << 20:
        return f"{peak / (1 << 20):.1f} MB"
    return f"{peak / 1024:.1f} KB"


def _ratio(r: float) -> str:
    return f"{r:,.0f}×" if r >= 10 else f"{r:.1f}×"


def table(
    ours: dict[int, dict[str, dict[str, float]]], torch: dict[int, dict[str, dict[str, float]]]
) -> str:
    rows = [
        "| world | operation | ours (cold) | ours (warm) | ours peak | torch 2.13 | torch peak | torch / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for world in sorted(ours):
        for op in OPS:
            o = ours[world][op]
            t = torch.get(world, {}).get(op)
            ratio = _ratio(t["median"] / o["median"]) if t else "—"
            rows.append(
                f"| 2^{world.bit_length() - 1} | {op} | {_t(o['median'])} | {_t(o['warm'])} | "
                f"{_m(o['peak'])} | {_t(t['median'] if t else None)} | "
                f"{_m(t['peak'] if t else None)} | {ratio} |"
            )
    return "\n".join(rows)


def check_targets(
    ours: dict[int, dict[str, dict[str, float]]], torch: dict[int, dict[str, dict[str, float]]]
) -> list[str]:
    misses = []
    top = max(ours)
    for op, r in ours[top].items():
        if r["median"] >= 1e-3 or r["peak"] >= 1 << 20:
            misses.append(f"{op} at world {top}: {_t(r['median'])}, {_m(r['peak'])}")
    if 2**17 in torch:
        ratio = torch[2**17]["construct"]["median"] / ours[2**17]["construct"]["median"]
        if ratio < 1000:
            misses.append(f"construction at 2^17 only {ratio:.0f}× faster than torch")
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="torch only at 2^10 and 2^14")
    args = parser.parse_args()
    if args.torch_worker:
        json.dump(torch_worker(args.torch_worker), sys.stdout)
        return
    start = time.perf_counter()
    ours = {world: run_ours(world, repeats=200) for world in DEGREES}
    torch = run_torch(TORCH_WORLDS[:2] if args.quick else TORCH_WORLDS)
    print(table(ours, torch))
    misses = check_targets(ours, torch)
    print(f"\ntargets: {'all met' if not misses else 'MISSED: ' + '; '.join(misses)}")
    print(f"total {time.perf_counter() - start:.0f} s")
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
