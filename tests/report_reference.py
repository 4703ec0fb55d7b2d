"""Brute-force expectations for the render reports, independent of Mesh and render.

Built on the numpy references (``parallel_dims_reference``, ``mesh_reference``,
``sharding_reference``): every group is read off an explicit array, ordered by the
position of its first member, and every abridged rank list is computed from the
whole list.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from parallel_dims_reference import VIEW_DIMS, family, locate, reference_views

SHOW = 6  # groups the text lists per view: the first six and the last


def view_groups(
    world: int,
    degrees: Mapping[str, int],
    order: Sequence[str] | None,
    ranks: Any,
    name: str,
) -> list[list[int]]:
    """Every group of a ParallelDims view, rows ordered by the position of their first rank.

    Positions are the ranks of the same view with the default order and ranks.
    """
    k = len(VIEW_DIMS[name])
    positions = family(reference_views(world, degrees)[name], k)
    ranked = family(reference_views(world, degrees, order, ranks)[name], k)
    size = int(np.prod(positions.shape[1:]))
    positions, ranked = positions.reshape(-1, size), ranked.reshape(-1, size)
    return ranked[np.argsort(positions[:, 0], kind="stable")].tolist()  # type: ignore[no-any-return]


def view_rank(
    world: int,
    degrees: Mapping[str, int],
    order: Sequence[str] | None,
    ranks: Any,
    name: str,
    rank: int,
) -> tuple[list[int], list[int]]:
    """(coordinate, group flattened row-major) of ``rank`` in a view."""
    k = len(VIEW_DIMS[name])
    sub, coord = locate(reference_views(world, degrees, order, ranks)[name], k, rank)
    return list(coord), [int(r) for r in sub.reshape(-1)]


def hosts_touched(group: Sequence[int], ranks_per_host: int) -> int:
    return len({int(r) // ranks_per_host for r in group})


def shown_indices(count: int) -> list[int]:
    """The groups a text report lists: all of up to eight, else the first six and the last."""
    return list(range(count)) if count <= SHOW + 2 else [*range(SHOW), count - 1]


def sample_of(group: Sequence[int]) -> dict[str, Any]:
    """What a RankSample of ``group`` must hold: size, first 17, last, common step or None."""
    xs = [int(r) for r in group]
    diffs = {b - a for a, b in itertools.pairwise(xs)}
    step = diffs.pop() if len(diffs) == 1 else None
    return {"size": len(xs), "first": tuple(xs[:17]), "last": xs[-1], "step": step or None}
