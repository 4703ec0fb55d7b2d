"""One group of a view at a time: per-group work, never the whole world.

:meth:`Mesh.group_table` lists every group (O(world)). The reports of huge worlds
instead ask for single rows of that table: row ``g`` starts at position
``C(g)``, ``C`` being the complement of the mesh's layout in the rank map (rows
are ordered by first position), and holds ``rank_map[C(g) + L(j)]`` for every
row-major coordinate ``j``. The row of a rank is ``C⁻¹(p - L(coordinate))``.
Each costs O(ndim) per rank shown, whatever the world size.

>>> from meshlayout import Mesh
>>> m = Mesh({"dp": 4, "tp": 2})["dp"]
>>> m.group_table().tolist()[1], group_sample(m, 1).first, group_index(m, 5)
([1, 3, 5, 7], (1, 3, 5, 7), 1)
"""

from __future__ import annotations

import functools

from ..layout import Layout
from ..mesh import Mesh
from ..rank_map import RankMap
from ._fmt import SAMPLE_HEAD, RankSample

__all__ = ["group_index", "group_sample", "rank_map_sample", "shown_group_indices"]

#: Groups a text report lists per view: the first ``SHOW_GROUPS`` and the last.
SHOW_GROUPS = 6


def shown_group_indices(count: int, show: int = SHOW_GROUPS) -> list[int]:
    """The groups a text report lists out of ``count``: all, or the first ``show`` and the last.

    >>> shown_group_indices(8), shown_group_indices(32)
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 31])
    """
    if count <= show + 2:
        return list(range(count))
    return [*range(show), count - 1]


@functools.lru_cache(maxsize=256)
def _complement(layout: Layout, n: int) -> tuple[Layout, Layout]:
    comp = layout.complement(n)
    return comp, comp.left_inverse()


def group_index(mesh: Mesh, rank: int) -> int:
    """Row of :meth:`Mesh.group_table` holding ``rank`` (ValueError if it is not in the mesh)."""
    coord = mesh.coordinate(rank)
    position = mesh.rank_map.position(rank)
    if coord is None or position is None:
        raise ValueError(f"rank {rank} is not in {mesh!r}")
    _, inverse = _complement(mesh.layout, len(mesh.rank_map))
    return inverse(position - mesh.layout(tuple(coord)))


def group_sample(mesh: Mesh, index: int) -> RankSample:
    """Row ``index`` of :meth:`Mesh.group_table` as a :class:`RankSample`.

    O(ndim) per sampled rank when the rank map is a range; an explicit rank map
    (already O(world) in memory) costs O(group size).
    """
    comp, _ = _complement(mesh.layout, len(mesh.rank_map))
    if not 0 <= index < mesh.num_submeshes:
        raise IndexError(f"group {index} out of range: {mesh!r} has {mesh.num_submeshes} groups")
    base = comp(index)
    layout, size, rank_map = mesh.layout, mesh.size(), mesh.rank_map
    rng = rank_map.as_range()
    if rng is None:
        return RankSample.of(rank_map.take(base + layout.indices()).tolist())
    first = tuple(rank_map[base + layout(j)] for j in range(min(size, SAMPLE_HEAD)))
    modes = [m for m in mesh.flatten().axes[0].modes if m[0] > 1]
    step = rng.step * modes[0][1] if size > 1 and len(modes) == 1 else None
    return RankSample(size, first, rank_map[base + layout(size - 1)], step)


def rank_map_sample(rank_map: RankMap) -> RankSample:
    """A rank map as a :class:`RankSample` (O(1) for a range).

    >>> rank_map_sample(RankMap(range(2**40))).last
    1099511627775
    """
    rng = rank_map.as_range()
    if rng is None:
        return RankSample.of(rank_map.to_numpy().tolist())
    n = len(rank_map)
    first = tuple(rank_map[i] for i in range(min(n, SAMPLE_HEAD)))
    return RankSample(n, first, rank_map[n - 1], rng.step if n > 1 else None)
