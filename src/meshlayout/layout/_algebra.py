"""The layout algebra: composition, complement, inverses, logical divide and product.

Pure functions of :class:`~meshlayout.layout.Layout` values, cached (layouts are
immutable and hashable). Every precondition is checked and a violation raises
``ValueError`` naming the layouts and the rule.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from ..inttuple import IntTuple, suffix_product
from ._core import (
    Layout,
    Mode,
    as_layout,
    coalesce,
    install_algebra,
    make_layout,
    nontrivial_sorted,
    pack,
    require_injective_admissible,
)

__all__ = [
    "complement",
    "compose",
    "left_inverse",
    "logical_divide",
    "logical_product",
    "right_inverse",
]


def compose(a: Layout, other: Layout | int | tuple[Any, ...]) -> Layout:
    """``a ∘ other`` (see :meth:`Layout.compose`): a tuple composes mode by mode."""
    if isinstance(other, tuple):
        return _compose_by_mode(a, other)
    return _compose(a, as_layout(other, "compose"))


def complement(a: Layout, cotarget: int) -> Layout:
    """See :meth:`Layout.complement`; ``cotarget`` already validated."""
    return _complement(a, cotarget)


def right_inverse(a: Layout) -> Layout:
    """See :meth:`Layout.right_inverse`."""
    return _right_inverse(a)


def left_inverse(a: Layout) -> Layout:
    """See :meth:`Layout.left_inverse`."""
    return _left_inverse(a)


# ---------------------------------------------------------------------- composition


def _overlap_problem(b: Layout) -> str | None:
    """Why the non-broadcast modes of ``b`` overlap (None if they do not).

    Sorted by stride, each mode must start at or after the span (size×stride) of the
    previous one, so that the values of different modes add without carries.
    Unlike admissibility, holes are allowed: ``(2,2):(3,1)`` does not overlap.
    """
    modes = sorted((m for m in b.modes if m[0] > 1 and m[1] != 0), key=lambda m: (m[1], m[0]))
    for (s0, d0), (s1, d1) in itertools.pairwise(modes):
        if d1 < s0 * d0:
            return (
                f"the mode {s1}:{d1} starts inside the span {s0 * d0} of the mode {s0}:{d0} "
                f"({d1} < {s0}*{d0})"
            )
    return None


def _compose_by_mode(a: Layout, tilers: tuple[Any, ...]) -> Layout:
    if len(tilers) > len(a):
        raise ValueError(f"cannot compose {a!r} by mode with {len(tilers)} tilers: it has {len(a)}")
    parts = []
    for i in range(len(a)):
        if i < len(tilers) and tilers[i] is not None:
            parts.append(a[i].compose(tilers[i]))
        else:
            parts.append(a[i])
    return make_layout(*parts)


@functools.lru_cache(maxsize=4096)
def _compose(a: Layout, b: Layout) -> Layout:
    if b.cosize() > a.size():
        raise ValueError(
            f"cannot compose {a!r} ∘ {b!r}: domain: {b!r} reaches index {b.cosize() - 1} "
            f"but {a!r} is defined on [0, {a.size()})"
        )
    problem = _overlap_problem(b)
    if problem is not None:
        raise ValueError(
            f"cannot compose {a!r} ∘ {b!r}: the modes of {b!r} overlap "
            f"(they must cover disjoint digit ranges): {problem}"
        )
    a_modes = a.coalesce().modes
    flat_results = [_compose_mode(a, b, a_modes, s, d) for s, d in b.modes]
    it = iter(flat_results)

    def build(shape: IntTuple) -> tuple[IntTuple, IntTuple]:
        if isinstance(shape, int):
            modes = next(it)
            if len(modes) == 1:
                return modes[0]
            return tuple(m[0] for m in modes), tuple(m[1] for m in modes)
        pairs = [build(e) for e in shape]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)

    shape, stride = build(b.shape)
    return Layout(shape, stride)


def _compose_mode(a: Layout, b: Layout, a_modes: tuple[Mode, ...], s: int, d: int) -> list[Mode]:
    """Flat modes (slowest first) of ``a ∘ (s:d)``; ``a_modes`` coalesced, slowest first."""
    if s == 1 or d == 0:
        return [(s, 0)]
    result: list[Mode] = []  # fastest first
    rest_shape, rest_stride = s, d
    for cs, cd in reversed(a_modes[1:]):  # every mode but the slowest, fastest first
        if rest_shape == 1:
            break
        if rest_stride % cs == 0:
            rest_stride //= cs
            continue
        if cs % rest_stride != 0:
            raise ValueError(
                f"cannot compose {a!r} ∘ {b!r}: stride divisibility: the stride {rest_stride} "
                f"left of {s}:{d} neither divides nor is a multiple of the mode {cs}:{cd}"
            )
        available = cs // rest_stride
        if rest_shape > available and rest_shape % available != 0:
            raise ValueError(
                f"cannot compose {a!r} ∘ {b!r}: shape divisibility: {rest_shape} elements of "
                f"stride {rest_stride} must fill whole modes of {a!r} or end inside one, but "
                f"the mode {cs}:{cd} holds {available} (and {rest_shape} % {available} != 0)"
            )
        take = min(available, rest_shape)
        result.append((take, rest_stride * cd))
        rest_shape //= take
        rest_stride = 1
    if rest_shape > 1:
        cs, cd = a_modes[0]
        result.append((rest_shape, rest_stride * cd))
    modes = [m for m in reversed(result) if m[0] > 1]
    return modes or [(1, 0)]


# ---------------------------------------------------------------------- complement, inverses


@functools.lru_cache(maxsize=4096)
def _complement(a: Layout, cotarget: int) -> Layout:
    require_injective_admissible(a, "complement")
    result: list[Mode] = []  # fastest first
    current = 1
    for s, d in nontrivial_sorted(a):
        gap = d // current
        if gap > 1:
            result.append((gap, current))
        current = s * d
    rest = -(-cotarget // current)
    if rest > 1:
        result.append((rest, current))
    return coalesce(Layout(*pack(result[::-1])))


@functools.lru_cache(maxsize=4096)
def _right_inverse(a: Layout) -> Layout:
    flat = a.coalesce()
    shapes = tuple(s for s, _ in flat.modes)
    domain_strides = suffix_product(shapes)
    pairs = sorted((d, s, ds) for (s, d), ds in zip(flat.modes, domain_strides) if s > 1 and d > 0)
    result: list[Mode] = []  # fastest first
    current = 1
    for d, s, ds in pairs:
        if d != current:
            break
        result.append((s, ds))
        current *= s
    return coalesce(Layout(*pack(result[::-1])))


@functools.lru_cache(maxsize=4096)
def _left_inverse(a: Layout) -> Layout:
    require_injective_admissible(a, "left_inverse")
    return make_layout(a.complement(), a).right_inverse()


# ---------------------------------------------------------------------- divide, product


def logical_divide(a: Layout, tiler: Layout | int) -> Layout:
    """Split ``a`` into tiles of ``tiler``: the two modes ``(rest, tile)``, tile last.

    Each row of the result enumerates one tile (one group), so
    ``logical_divide(24:1, 4:1)`` lists the groups ``[0..3], [4..7], …``:

    >>> logical_divide(Layout(24), 4)
    (6,4):(4,1)
    >>> logical_divide(Layout(24), Layout(4, 6))
    (6,4):(1,6)

    Equals ``a ∘ make_layout(complement(tiler, size(a)), tiler)``. The tiles must
    fit ``a`` exactly: a tiler that would pad past ``size(a)`` raises ``ValueError``
    (CuTe would silently evaluate ``a`` outside its domain):

    >>> logical_divide(Layout(6), 4)
    Traceback (most recent call last):
    ...
    ValueError: cannot divide 6:1 by 4:1: the tiles (2,4):(4,1) reach index 7 but 6:1 is \
defined on [0, 6) (the tiler must tile the size of the layout exactly)
    """
    if not isinstance(a, Layout):
        raise TypeError(f"logical_divide expects a Layout first, got {type(a).__name__}")
    b = as_layout(tiler, "logical_divide")
    rest = b.complement(a.size())
    whole = make_layout(rest, b)
    if whole.cosize() > a.size():
        raise ValueError(
            f"cannot divide {a!r} by {b!r}: the tiles {whole!r} reach index "
            f"{whole.cosize() - 1} but {a!r} is defined on [0, {a.size()}) "
            "(the tiler must tile the size of the layout exactly)"
        )
    return make_layout(a.compose(rest), a.compose(b))


def logical_product(a: Layout, tiler: Layout | int) -> Layout:
    """Repeat ``a`` as laid out by ``tiler``: ``(complement(a, size(a)·cosize(tiler)) ∘ tiler, a)``.

    >>> logical_product(Layout(4), 3)
    (3,4):(4,1)
    >>> logical_product(Layout((2, 2), (4, 1)), Layout(2))
    (2,(2,2)):(2,(4,1))
    """
    if not isinstance(a, Layout):
        raise TypeError(f"logical_product expects a Layout first, got {type(a).__name__}")
    b = as_layout(tiler, "logical_product")
    rest = a.complement(a.size() * b.cosize())
    return make_layout(rest.compose(b), a)


install_algebra(
    compose=compose, complement=complement, right_inverse=right_inverse, left_inverse=left_inverse
)
