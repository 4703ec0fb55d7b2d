"""Nested integer tuples ("IntTuple"): the shapes and strides of layouts.

An IntTuple is an ``int`` or a tuple of IntTuples, e.g. ``8``, ``(2, 4)`` or
``((2, 3), 4)``. These helpers are pure functions with no knowledge of layouts.

>>> flatten(((2, 3), 4))
(2, 3, 4)
>>> product(((2, 3), 4))
24
>>> suffix_product((2, 3, 4))
(12, 4, 1)
"""

from __future__ import annotations

import operator
from typing import SupportsIndex, TypeAlias, cast

IntTuple: TypeAlias = int | tuple["IntTuple", ...]

__all__ = [
    "IntTuple",
    "check_int_tuple",
    "congruent",
    "flatten",
    "product",
    "suffix_product",
    "unflatten_like",
]


def is_int(x: object) -> bool:
    """True for a Python or numpy integer, but not for ``bool``."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    return hasattr(x, "__index__") and type(x).__module__ == "numpy"


def check_int_tuple(x: object, what: str) -> IntTuple:
    """Validate ``x`` as an IntTuple and return it with numpy ints made plain.

    Raises ``TypeError`` naming ``what`` for anything that is not an int or a
    (nested) tuple/list of ints (floats, strings and bools included).
    """
    if is_int(x):
        return operator.index(cast(SupportsIndex, x))
    if isinstance(x, (tuple, list)):
        return tuple(check_int_tuple(e, what) for e in x)
    raise TypeError(
        f"{what} must be an int or a (nested) tuple of ints, got {x!r} of type {type(x).__name__}"
    )


def flatten(t: IntTuple) -> tuple[int, ...]:
    """All the integers of ``t`` in order, as a flat tuple."""
    if isinstance(t, int):
        return (t,)
    out: list[int] = []
    for e in t:
        out.extend(flatten(e))
    return tuple(out)


def product(t: IntTuple) -> int:
    """Product of all integers in ``t`` (1 for an empty tuple)."""
    result = 1
    for v in flatten(t):
        result *= v
    return result


def suffix_product(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (compact) strides of a flat shape: last mode fastest."""
    strides = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= shape[i]
    return tuple(strides)


def congruent(a: IntTuple, b: IntTuple) -> bool:
    """True if ``a`` and ``b`` have the same nesting structure."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int)
    return len(a) == len(b) and all(congruent(x, y) for x, y in zip(a, b))


def unflatten_like(flat: tuple[int, ...], like: IntTuple) -> IntTuple:
    """Give the flat tuple ``flat`` the nesting structure of ``like``."""
    it = iter(flat)

    def build(t: IntTuple) -> IntTuple:
        if isinstance(t, int):
            return next(it)
        return tuple(build(e) for e in t)

    result = build(like)
    return result
