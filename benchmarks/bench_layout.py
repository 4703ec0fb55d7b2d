"""Layout algebra: ours vs torch 2.13's ``_MeshLayout`` / ``_FlatLayout`` in one run.

    .venv/bin/python benchmarks/bench_layout.py [--quick]

Prints one table: medians over repeats. "ours cold" clears every lru cache of
:mod:`meshlayout.layout` before each repeat (so no cached result fakes the
number); "ours cached" is the same call repeated with warm caches. "speed-up" is
torch / ours cold.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from meshlayout import layout as ml
from meshlayout.layout import Layout


def clear_caches() -> None:
    ml.clear_caches()


def median_seconds(fn: Callable[[], Any], repeats: int, before: Callable[[], None]) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, calling ``before()`` untimed."""
    times = []
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def nothing() -> None:
    pass


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


Row = tuple[str, str, float, float, float]


def bench_indices(quick: bool) -> list[Row]:
    from torch.distributed._mesh_layout import _FlatLayout

    rows: list[Row] = []
    for k in range(10, 21, 2 if quick else 1):
        # a transposed 2-D layout: it does not coalesce, for us nor for torch
        lo, hi = 2 ** (k // 2), 2 ** (k - k // 2)
        shape, stride = (lo, hi), (1, lo)
        ours = Layout(shape, stride)
        theirs = _FlatLayout(shape, stride)
        reps = 3 if k >= 18 else 7
        cold = median_seconds(ours.indices, 15, clear_caches)
        ours.indices()
        warm = median_seconds(ours.indices, 15, nothing)
        torch_t = median_seconds(theirs.all_ranks_from_zero, reps, nothing)
        rows.append((f"indices() {shape}:{stride}", f"2^{k}", cold, warm, torch_t))
    # worst case for us: 20 modes of size 2 that do not coalesce (bit-reversed order)
    shape20, stride20 = (2,) * 20, tuple(2**i for i in range(20))
    ours20, theirs20 = Layout(shape20, stride20), _FlatLayout(shape20, stride20)
    cold = median_seconds(ours20.indices, 15, clear_caches)
    ours20.indices()
    warm = median_seconds(ours20.indices, 15, nothing)
    torch_t = median_seconds(theirs20.all_ranks_from_zero, 1 if quick else 3, nothing)
    rows.append(("indices() (2,)*20 bit-reversed", "2^20 ", cold, warm, torch_t))
    return rows


def bench_algebra() -> list[Row]:
    from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout

    # pp=2, dp_replicate=2, dp_shard=8, cp=2, tp=8: 512 ranks, tp innermost
    sizes = (2, 2, 8, 2, 8)
    mesh = Layout(sizes)
    fsdp = Layout((8, 2), (16, 8))  # dp_shard x cp, flattened
    dp = Layout((2, 8), (128, 16))  # dp_replicate x dp_shard
    t_mesh = _MeshLayout.from_sizes_strides(sizes)
    t_fsdp = _FlatLayout((8, 2), (16, 8))
    t_dp = _FlatLayout((2, 8), (128, 16))
    t_unflat = _MeshLayout.from_sizes_strides((4, 4))
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("coalesce 5-D mesh (2,2,8,2,8)", mesh.coalesce, t_mesh.collapse),
        ("coalesce dp_shard×cp (8,2):(16,8)", fsdp.coalesce, lambda: _FlatLayout((8, 2), (16, 8))),
        (
            "compose dp (2,8):(128,16) ∘ (4,4)",
            lambda: dp.compose(Layout((4, 4))),
            lambda: t_dp.composition(t_unflat),
        ),
        (
            "complement dp_shard×cp in 512",
            lambda: fsdp.complement(512),
            lambda: t_fsdp.complement(512),
        ),
        ("complement dp in 512", lambda: dp.complement(512), lambda: t_dp.complement(512)),
    ]
    rows: list[Row] = []
    for name, ours, theirs in cases:
        cold = median_seconds(ours, 301, clear_caches)
        ours()
        warm = median_seconds(ours, 301, nothing)
        torch_t = median_seconds(theirs, 301, nothing)
        rows.append((name, "512", cold, warm, torch_t))
    return rows


def render(rows: list[Row]) -> str:
    head = ("operation", "size", "ours cold", "ours cached", "torch 2.13", "speed-up")
    body = [(n, s, fmt(c), fmt(w), fmt(t), f"{t / c:.1f}×") for n, s, c, w, t in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in body)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every other size only")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rows = bench_indices(args.quick) + bench_algebra()
    print(render(rows))
    big = next(r for r in rows if r[1] == "2^20")
    print(
        f"\nindices() of 2^20 elements: ours cold {fmt(big[2])} (target < 30 ms), "
        f"{big[4] / big[2]:.0f}× faster than torch (target ≥ 20×)"
    )


if __name__ == "__main__":
    main()
