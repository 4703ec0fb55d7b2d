"""A brute-force numpy reference for ParallelDims, independent of Layout and Mesh.

The world is ``arange(world)`` reshaped to the dense degrees listed in ``order``
(outermost first, row-major), transposed to the canonical dense order
``(pp, dp_replicate, dp_shard, cp, tp)`` and mapped through ``ranks``. Every
view is then a transpose/reshape of that array that puts the view's own dims
last: ``reference_views(...)[name]`` has shape ``(*family, *view_shape)`` where
each index of the leading ``family`` dims is one concrete sub-mesh, whose
entries are global ranks in coordinate order.

>>> ref = reference_views(16, dict(pp=2, dp_replicate=1, dp_shard=2, cp=2, tp=2, ep=4, etp=1))
>>> ref["ep"].reshape(-1, 4).tolist()
[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
>>> ref["fsdp"].reshape(-1, 4)[0].tolist()
[0, 2, 4, 6]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

DENSE = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
IntArray = npt.NDArray[np.int64]

#: Dims of every view (and of the three whole meshes), outermost first.
VIEW_DIMS: dict[str, tuple[str, ...]] = {
    "pp": ("pp",),
    "dp_replicate": ("dp_replicate",),
    "dp_shard": ("dp_shard",),
    "cp": ("cp",),
    "tp": ("tp",),
    "batch": ("batch",),
    "loss": ("loss",),
    "fsdp": ("fsdp",),
    "hsdp": ("dp_replicate", "fsdp"),
    "efsdp": ("efsdp",),
    "ep": ("ep",),
    "etp": ("etp",),
    "ehsdp": ("dp_replicate", "efsdp"),
    "dense": DENSE,
    "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
    "dataloading": ("pp", "batch", "cp", "tp"),
}


def dense_array(
    world: int, degrees: Mapping[str, int], order: Sequence[str] | None = None, ranks: Any = None
) -> IntArray:
    """Global rank at each canonical coordinate ``(pp, dp_replicate, dp_shard, cp, tp)``."""
    order = tuple(order) if order is not None else DENSE
    index = np.arange(world).reshape([degrees[n] for n in order])
    index = index.transpose([order.index(n) for n in DENSE])
    table = np.arange(world) if ranks is None else np.asarray(list(ranks), dtype=np.int64)
    return np.asarray(table[index], dtype=np.int64)


def reference_views(
    world: int, degrees: Mapping[str, int], order: Sequence[str] | None = None, ranks: Any = None
) -> dict[str, IntArray]:
    """Every view as an array ``(*family, *view_shape)`` of global ranks."""
    d = dense_array(world, degrees, order, ranks)
    pp, dr, ds, cp, tp = d.shape
    ep, etp = degrees["ep"], degrees["etp"]
    efsdp = ds * cp * tp // (ep * etp)
    # axes of d: 0 pp, 1 dp_replicate, 2 dp_shard, 3 cp, 4 tp
    sp = d.reshape(pp, dr, efsdp, ep, etp)  # the expert region re-split, row-major
    return {
        "pp": np.moveaxis(d, 0, -1),
        "dp_replicate": np.moveaxis(d, 1, -1),
        "dp_shard": np.moveaxis(d, 2, -1),
        "cp": np.moveaxis(d, 3, -1),
        "tp": np.moveaxis(d, 4, -1),
        "batch": d.transpose(0, 3, 4, 1, 2).reshape(pp, cp, tp, dr * ds),
        "loss": d.transpose(0, 4, 1, 2, 3).reshape(pp, tp, dr * ds * cp),
        "fsdp": d.transpose(0, 1, 4, 2, 3).reshape(pp, dr, tp, ds * cp),
        "hsdp": d.transpose(0, 4, 1, 2, 3).reshape(pp, tp, dr, ds * cp),
        "efsdp": np.moveaxis(sp, 2, -1),
        "ep": np.moveaxis(sp, 3, -1),
        "etp": np.moveaxis(sp, 4, -1),
        "ehsdp": sp.transpose(0, 3, 4, 1, 2),
        "dense": d,
        "sparse": sp,
        "dataloading": d.reshape(pp, dr * ds, cp, tp),
    }


def family(ref: IntArray, ndim: int) -> IntArray:
    """The sub-meshes of a reference view as ``(num_submeshes, *view_shape)``."""
    return ref.reshape((-1, *ref.shape[ref.ndim - ndim :]))


def locate(ref: IntArray, ndim: int, rank: int) -> tuple[IntArray, tuple[int, ...]]:
    """``(sub-mesh, coordinate)`` of ``rank`` in a reference view with ``ndim`` own dims."""
    subs = family(ref, ndim)
    hit = np.argwhere(subs == rank)
    assert hit.shape[0] == 1, f"rank {rank} occurs {hit.shape[0]} times"
    k, *coord = (int(v) for v in hit[0])
    return subs[k], tuple(coord)


def group_along(submesh: IntArray, coord: Sequence[int], dim: int) -> tuple[int, ...]:
    """The ranks of ``submesh`` that differ from ``coord`` only along ``dim``."""
    index: list[Any] = list(coord)
    index[dim] = slice(None)
    return tuple(int(r) for r in submesh[tuple(index)])
