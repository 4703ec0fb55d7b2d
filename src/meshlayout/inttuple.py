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

import numpy as np

IntTuple: TypeAlias = int | tuple["IntTuple", ...]

__all__ = [
    "INT64_MAX",
    "MAX_ELEMENTS",
    "IntTuple",
    "check_elements",
    "check_int",
    "check_int_tuple",
    "congruent",
    "flatten",
    "product",
    "suffix_product",
    "unflatten_like",
]


#: Largest int64: the bound on every rank, position, world size and layout value.
INT64_MAX = 2**63 - 1

#: Most elements one whole-world answer may hold (``Mesh.groups``, ``Mesh.submeshes``,
#: ``Mesh.group_table``, ``Layout.indices``, ``RankMap.to_numpy``): 2**27 int64s, 1 GiB.
#: Above it those calls raise ``ValueError`` instead of exhausting memory; per-rank
#: queries have no such limit.
MAX_ELEMENTS = 1 << 27


def check_elements(count: int, what: str) -> None:
    """``ValueError`` naming ``what`` if an answer of ``count`` elements exceeds :data:`MAX_ELEMENTS`.

    >>> check_elements(2**40, "Mesh.groups('tp')")
    Traceback (most recent call last):
    ...
    ValueError: Mesh.groups('tp') would hold 1099511627776 elements, more than the limit \
MAX_ELEMENTS = 134217728 (meshlayout.inttuple.MAX_ELEMENTS); ask per-rank questions \
(group, submesh, coordinate) instead
    """
    if count > MAX_ELEMENTS:
        raise ValueError(
            f"{what} would hold {count} elements, more than the limit MAX_ELEMENTS = "
            f"{MAX_ELEMENTS} (meshlayout.inttuple.MAX_ELEMENTS); ask per-rank questions "
            "(group, submesh, coordinate) instead"
        )


def is_int(x: object) -> bool:
    """True for a Python or numpy integer (anything :func:`check_int` accepts), not a bool.

    >>> is_int(3), is_int(np.int8(3)), is_int(True), is_int(3.0), is_int("3")
    (True, True, False, False, False)
    """
    if isinstance(x, (bool, np.bool_, np.ndarray)):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    return hasattr(type(x), "__index__")


def check_int(value: object, what: str, *, minimum: int | None = None) -> int:
    """``value`` as a plain Python ``int``; the one integer check of the library.

    Accepts Python ints, numpy integers (any width, ``uint64`` included: the true
    value is kept, never wrapped) and other objects with ``__index__``. Raises
    ``TypeError`` naming ``what`` and the value for bools, floats (``1.5``,
    ``nan``, even ``2.0``), strings and everything else, and ``ValueError`` when
    ``minimum`` is given and the value is smaller. Python ints are unbounded, so
    nothing overflows here; callers that need int64 check the range themselves.

    >>> check_int(np.uint64(2**64 - 1), "rank")
    18446744073709551615
    >>> check_int(True, "dim")
    Traceback (most recent call last):
    ...
    TypeError: dim must be an int, got True of type bool
    >>> check_int(0, "mesh size", minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: mesh size must be >= 1, got 0
    """
    if not is_int(value):
        raise TypeError(f"{what} must be an int, got {value!r} of type {type(value).__name__}")
    try:
        v = operator.index(cast(SupportsIndex, value))
    except TypeError:
        raise TypeError(
            f"{what} must be an int, got {value!r} of type {type(value).__name__}"
        ) from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {v}")
    return v


#: Deepest nesting accepted by :func:`check_int_tuple` (deeper input is a ``ValueError``).
MAX_DEPTH = 64


def check_int_tuple(x: object, what: str) -> IntTuple:
    """Validate ``x`` as an IntTuple and return it with numpy ints made plain.

    Accepts ints, (nested) tuples and lists of ints, and integer numpy arrays
    (``np.array([2, 3])`` reads as ``(2, 3)``). Raises ``TypeError`` naming
    ``what`` for anything else (floats, strings and bools included) and
    ``ValueError`` for nesting deeper than :data:`MAX_DEPTH`.

    >>> check_int_tuple(np.array([[2, 3], [4, 5]]), "shape")
    ((2, 3), (4, 5))
    """
    return _check_int_tuple(x, what, 0)


def _check_int_tuple(x: object, what: str, depth: int) -> IntTuple:
    if is_int(x):
        return operator.index(cast(SupportsIndex, x))
    if depth >= MAX_DEPTH:
        raise ValueError(
            f"{what} is nested more than {MAX_DEPTH} levels deep, the limit "
            f"(meshlayout.inttuple.MAX_DEPTH); a shape is an int or tuples of tuples of ints"
        )
    if isinstance(x, np.ndarray):
        if x.dtype == np.bool_ or not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"{what} must hold ints, got a numpy array of {x.dtype}")
        x = x.tolist()
    if isinstance(x, (tuple, list)):
        return tuple(_check_int_tuple(e, what, depth + 1) for e in x)
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
