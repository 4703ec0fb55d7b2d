"""Compact text for rank lists, coordinates and runs; aligned plain-text tables.

The one home of rank-list formatting in :mod:`meshlayout.render`: abridged lists
(:func:`ranks_text`, also of a :class:`RankSample`), cell labels
(:func:`range_label`), rank maps (:func:`rank_map_text`) and the holders of a
tensor element (:func:`holders_text`, :func:`held_by_text`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "RankSample",
    "coord_text",
    "held_by_text",
    "holders_text",
    "hosts_text",
    "range_label",
    "rank_map_text",
    "ranks_text",
    "runs_text",
    "table",
]

#: Ranks a :class:`RankSample` keeps from the start of its list: enough for ``ranks_text(.., 16)``.
SAMPLE_HEAD = 17


def hosts_text(crossing: int, total: int, fewest: int, most: int) -> str:
    """Where a view's groups sit, in words: ``crossing`` of ``total`` groups touch more
    than one host, between ``fewest`` and ``most`` hosts each.

    The one wording of ``meshlayout plan``'s hosts column and of
    ``ParallelMeshes.host_report()``.

    >>> hosts_text(0, 16, 1, 1), hosts_text(8, 8, 4, 4), hosts_text(2, 4, 2, 3)
    ('every group in one host', '8/8 groups span 4 hosts', '2/4 groups span 2-3 hosts')
    """
    if crossing == 0:
        return "every group in one host"
    span = f"{most}" if fewest == most else f"{fewest}-{most}"
    return f"{crossing}/{total} groups span {span} hosts"


@dataclass(frozen=True)
class RankSample:
    """A rank list known by its length, first ranks, last rank and common step.

    What :func:`ranks_text` needs, so a group of 2**40 ranks can be shown without
    listing it. ``step`` is the common difference when the list is an arithmetic
    progression (and has at least two ranks), else None.

    >>> RankSample.of(range(0, 4096, 2))
    RankSample(size=2048, first=(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32), \
last=4094, step=2)
    """

    size: int
    first: tuple[int, ...]
    last: int
    step: int | None

    @classmethod
    def of(cls, ranks: Sequence[int]) -> RankSample:
        """The sample of a whole list (O(len))."""
        xs = [int(r) for r in ranks]
        if not xs:
            raise ValueError("a rank list to sample must not be empty")
        step: int | None = xs[1] - xs[0] if len(xs) > 1 else None
        if step == 0 or any(b - a != step for a, b in itertools.pairwise(xs)):
            step = None
        return cls(len(xs), tuple(xs[:SAMPLE_HEAD]), xs[-1], step)


def ranks_text(ranks: Sequence[int] | RankSample, limit: int = 8) -> str:
    """A rank list (or a :class:`RankSample`), abridged: ``[0, 8, .., 56]`` for long progressions.

    >>> ranks_text([0, 1, 2, 3])
    '[0, 1, 2, 3]'
    >>> ranks_text(list(range(0, 64, 8)) + [64])
    '[0, 8, 16, 24, 32, 40, 48, 56, 64]'
    >>> ranks_text(range(0, 4096, 2))
    '[0, 2, .., 4094] (2048 ranks)'
    >>> ranks_text([5, 3, 9, 1, 7, 2, 8, 0, 4, 6, 11])
    '[5, 3, 9, 1, 7, 2, .. +5] (11 ranks)'
    """
    sample = ranks if isinstance(ranks, RankSample) else RankSample.of(ranks)
    n, xs = sample.size, sample.first
    if n <= max(limit + 1, 3):
        if len(xs) < n:
            raise ValueError(f"{sample} keeps {len(xs)} ranks, too few to list {n}")
        return "[" + ", ".join(map(str, xs)) + "]"
    if sample.step is not None:
        return f"[{xs[0]}, {xs[1]}, .., {sample.last}] ({n} ranks)"
    head = ", ".join(map(str, xs[: limit - 2]))
    return f"[{head}, .. +{n - limit + 2}] ({n} ranks)"


def rank_map_text(rng: Sequence[int] | None, ranks: Sequence[int] | RankSample) -> str:
    """A rank map: ``range(START, STOP[, STEP])`` when it is a range, else its ranks, abridged.

    >>> rank_map_text([2048, 2112, 1], []), rank_map_text(None, [3, 1, 2, 0])
    ('range(2048, 2112)', '[3, 1, 2, 0]')
    """
    if rng is None:
        return ranks_text(ranks)
    start, stop, step = rng
    return f"range({start}, {stop}" + (f", {step})" if step != 1 else ")")


def held_by_text(holders: Sequence[int]) -> str:
    """Who holds a tensor element, for a tooltip: ``held by ranks 3, 5``.

    >>> held_by_text([]), held_by_text([3]), held_by_text([3, 5])
    ('held by no rank', 'held by rank 3', 'held by ranks 3, 5')
    """
    if not holders:
        return "held by no rank"
    return f"held by rank{'s' * (len(holders) > 1)} {', '.join(map(str, holders))}"


def holders_text(holders: Sequence[int]) -> str:
    """The ranks holding one tensor element, in a grid cell: ``.``, ``3``, ``3,5``, ``3+2``.

    >>> holders_text([]), holders_text([3, 5]), holders_text([3, 5, 7])
    ('.', '3,5', '3+2')
    """
    if not holders:
        return "."
    if len(holders) <= 2:
        return ",".join(map(str, holders))
    return f"{holders[0]}+{len(holders) - 1}"


def range_label(ranks: Sequence[int]) -> str:
    """Shortest label of a rank set: ``0-7``, ``0-56/8`` (step), or ``first..last``.

    >>> range_label([0, 1, 2, 3]), range_label([4, 12, 20]), range_label([5]), range_label([3, 1])
    ('0-3', '4-20/8', '5', '3,1')
    """
    xs = [int(r) for r in ranks]
    if len(xs) == 1:
        return str(xs[0])
    step = xs[1] - xs[0]
    if len(xs) >= 3 and step > 0 and all(b - a == step for a, b in itertools.pairwise(xs)):
        return f"{xs[0]}-{xs[-1]}" + ("" if step == 1 else f"/{step}")
    if len(xs) == 2:
        return f"{xs[0]},{xs[1]}"
    return f"{xs[0]}..{xs[-1]}"


def coord_text(names: Sequence[str], coord: Sequence[int]) -> str:
    """``pp=0,tp=3``.

    >>> coord_text(("pp", "tp"), (0, 3))
    'pp=0,tp=3'
    """
    return ",".join(f"{n}={c}" for n, c in zip(names, coord))


def runs_text(runs: Sequence[tuple[int, int]]) -> str:
    """Half-open runs: ``[0:2)+[4:5)``; ``-`` when empty.

    >>> runs_text([(0, 2), (4, 5)]), runs_text([])
    ('[0:2)+[4:5)', '-')
    """
    if not runs:
        return "-"
    return "+".join(f"[{a}:{b})" for a, b in runs)


def table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded.

    >>> print(table([["a", "bb", "c"], ["ddd", "e", "f"]]))
    a    bb  c
    ddd  e   f
    """
    if not rows:
        return ""
    ncol = max(len(r) for r in rows)
    widths = [max((len(r[i]) for r in rows if i < len(r)), default=0) for i in range(ncol)]
    lines = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)
