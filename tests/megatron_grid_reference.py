"""Megatron-Core's rank groups by brute force, independent of meshlayout's meshes.

Megatron's ``RankGenerator.get_ranks(token)`` (``generate_masked_orthogonal_rank_groups``)
writes each rank as coordinates over the order string's dims, **innermost first**
(``rank = sum(coord[i] * prod(sizes[:i]))``). A group is the ranks that agree on
every dim *not* in the token; its members run the token's innermost dim
fastest, and the groups come in the order of the other dims' coordinates,
innermost fastest. Here every rank is enumerated and the groups are read off
that definition directly (O(world)), for the tests' small worlds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: Order token -> degree name on each grid (None: size 1 there), as Megatron lays them out.
GRID_NAMES: dict[str, dict[str, str | None]] = {
    "dense": {"tp": "tp", "cp": "cp", "ep": None, "dp": "dp", "pp": "pp"},
    "expert": {"tp": "etp", "cp": None, "ep": "ep", "dp": "edp", "pp": "pp"},
}


def token_groups(
    world: int, degrees: Mapping[str, int], order: Sequence[str], grid: str, token: str
) -> list[list[int]]:
    """Megatron's ``get_ranks(token)`` on ``grid``; ``order``: the tokens, innermost first.

    >>> token_groups(8, {"tp": 2, "cp": 2, "dp": 2, "pp": 1}, ["tp", "cp", "dp", "pp"], "dense", "dp-cp")
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    names = GRID_NAMES[grid]
    sizes = [1 if names[t] is None else degrees[str(names[t])] for t in order]
    masked = [t in token.split("-") for t in order]
    groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
    for rank in range(world):
        coords, rest = [], rank
        for size in sizes:
            coords.append(rest % size)
            rest //= size
        inside = tuple(reversed([c for c, m in zip(coords, masked) if m]))  # innermost last
        outside = tuple(reversed([c for c, m in zip(coords, masked) if not m]))
        groups.setdefault(outside, []).append((inside, rank))
    return [[r for _, r in sorted(groups[key])] for key in sorted(groups)]
