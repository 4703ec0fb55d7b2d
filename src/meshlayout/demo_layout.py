"""A short tour of the layout algebra on a realistic mesh layout (interim demo)."""

from __future__ import annotations

from .layout import Layout, logical_divide


def run() -> None:
    """Print a 5-D mesh layout and its algebra as readable lines."""
    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    mesh = Layout((2, 2, 4, 2, 8))
    print(f"mesh layout {dict(zip(names, mesh.shape))}: {mesh}")
    print(f"  coalesce        -> {mesh.coalesce()}")
    fsdp = Layout((4, 2), (16, 8))
    print(f"  fsdp = dp_shard x cp: {fsdp}; complement in 256 -> {fsdp.complement(256)}")
    print(f"  unflatten dp_shard 4 -> (2,2): {Layout(4, 16).compose(Layout((2, 2)))}")
    print(f"  logical_divide(256:1, tp=8:1) -> {logical_divide(Layout(256), 8)}")
