"""The :class:`Layout` value object: construction, evaluation, simplification, predicates.

The algebra that builds new layouts from old ones (composition, complement,
inverses, divide, product) lives in :mod:`meshlayout.layout._algebra`; the
methods of :class:`Layout` that need it call the functions it installs (see `install_algebra`).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..inttuple import (
    INT64_MAX,
    IntTuple,
    check_elements,
    check_int,
    check_int_tuple,
    congruent,
    flatten,
    is_int,
    product,
    suffix_product,
    unflatten_like,
)

__all__ = [
    "Layout",
    "Mode",
    "admissibility",
    "as_layout",
    "coalesce",
    "is_injective",
    "make_layout",
    "nontrivial_sorted",
    "pack",
    "require_injective_admissible",
]

Mode = tuple[int, int]  # (size, stride) of one flat mode


def _fmt(t: IntTuple) -> str:
    """``(2,(3,4))``-style text; a 1-tuple keeps its comma so that parsing round-trips."""
    if isinstance(t, int):
        return str(t)
    if len(t) == 1:
        return "(" + _fmt(t[0]) + ",)"
    return "(" + ",".join(_fmt(e) for e in t) + ")"


#: The operations behind :meth:`Layout.compose`, :meth:`Layout.complement`,
#: :meth:`Layout.right_inverse` and :meth:`Layout.left_inverse`, installed by
#: :mod:`._algebra` when it is imported (``meshlayout.layout`` always imports it), so
#: that the algebra depends on this module and never the reverse (no import cycle).
_ALGEBRA: dict[str, Callable[..., Layout]] = {}


def install_algebra(**operations: Callable[..., Layout]) -> None:
    """Register the algebra's functions behind the :class:`Layout` methods of the same names."""
    _ALGEBRA.update(operations)


class Layout:
    """An immutable ``shape:stride`` function from coordinates to integers.

    ``shape`` and ``stride`` are ints or nested tuples of the same structure;
    both are normalised to tuples (``Layout(8).shape == (8,)``). The default
    stride is compact row-major (suffix products of the flattened shape).
    ``==`` and ``hash`` are structural; :meth:`equivalent` compares functions.

    >>> Layout(((2, 3), 4))
    ((2,3),4):((12,4),1)
    >>> Layout((2, 3), (6, 1)).cosize()
    9
    """

    __slots__ = ("_hash", "shape", "stride")

    _hash: int
    shape: tuple[IntTuple, ...]
    stride: tuple[IntTuple, ...]

    def __init__(self, shape: Any, stride: Any = None) -> None:
        sh = check_int_tuple(shape, "Layout shape")
        if isinstance(sh, int):
            sh = (sh,)
        bad = [s for s in flatten(sh) if s <= 0]
        if bad:
            raise ValueError(
                f"Layout shape {_fmt(sh)} has non-positive sizes {bad}; every size must be >= 1"
            )
        if stride is None:
            st: IntTuple = unflatten_like(suffix_product(flatten(sh)), sh)
        else:
            st = check_int_tuple(stride, "Layout stride")
            if isinstance(st, int):
                st = (st,)
            if not congruent(sh, st):
                raise ValueError(
                    f"Layout shape {_fmt(sh)} and stride {_fmt(st)} do not have the same "
                    "structure; give one stride per size, nested the same way"
                )
            neg = [d for d in flatten(st) if d < 0]
            if neg:
                raise ValueError(
                    f"Layout stride {_fmt(st)} has negative entries {neg}; strides must be >= 0"
                )
        assert isinstance(st, tuple)
        object.__setattr__(self, "shape", sh)
        object.__setattr__(self, "stride", st)
        object.__setattr__(self, "_hash", hash((sh, st)))

    # ------------------------------------------------------------------ value object
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Layout is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Layout is immutable; cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self.shape == other.shape and self.stride == other.stride

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (Layout, (self.shape, self.stride))

    def __repr__(self) -> str:
        if len(self.shape) == 1 and isinstance(self.shape[0], int):
            return f"{self.shape[0]}:{self.stride[0]}"
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"

    __str__ = __repr__

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read a layout from its ``repr``, e.g. ``"(2,4):(4,1)"`` or ``"8"``.

        >>> Layout.parse("(2,(3,4)):(12,(4,1))")
        (2,(3,4)):(12,(4,1))
        """
        if not isinstance(text, str):
            raise TypeError(f"Layout.parse expects a str, got {type(text).__name__}")
        parts = text.replace(" ", "").split(":")
        if len(parts) not in (1, 2) or not all(parts):
            raise ValueError(f"cannot parse layout {text!r}; expected 'shape:stride' or 'shape'")
        try:
            values = [ast.literal_eval(p) for p in parts]
            return cls(*values)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError) as exc:
            raise ValueError(f"cannot parse layout {text[:80]!r}: {exc}") from None

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.shape)

    def __getitem__(self, i: int | slice) -> Layout:
        if isinstance(i, slice):
            return Layout(self.shape[i], self.stride[i])
        i = check_int(i, "a Layout mode index")
        if not -len(self) <= i < len(self):
            raise IndexError(f"mode {i} out of range for {self!r} with {len(self)} modes")
        return Layout(self.shape[i], self.stride[i])

    def __iter__(self) -> Iterator[Layout]:
        return (self[i] for i in range(len(self)))

    @property
    def modes(self) -> tuple[Mode, ...]:
        """The flat ``(size, stride)`` pairs, slowest first."""
        return tuple(zip(flatten(self.shape), flatten(self.stride)))

    def size(self) -> int:
        """Number of coordinates: the product of the shape."""
        return product(self.shape)

    def cosize(self) -> int:
        """Largest value plus one: ``L(size - 1) + 1`` for non-negative strides."""
        return sum((s - 1) * d for s, d in self.modes) + 1

    # ------------------------------------------------------------------ evaluation
    def __call__(self, coord: Any) -> int:
        """Evaluate at a linear index (row-major) or a (nested) coordinate tuple."""
        return _eval(self.shape, self.stride, coord, self)

    def indices(self) -> npt.NDArray[np.int64]:
        """All values ``L(i)`` for ``i`` in ``range(size)`` as a read-only int64 array.

        Vectorised: one numpy broadcast per (coalesced) mode, no Python loop per
        element. The array is cached and shared; copy it before writing.
        ``ValueError`` (never a wrapped value or a MemoryError) when a value does not
        fit in int64 or the size exceeds :data:`meshlayout.inttuple.MAX_ELEMENTS`;
        ``L(i)`` stays exact for any single coordinate.

        >>> Layout((4,), (2**62,)).indices()
        Traceback (most recent call last):
        ...
        ValueError: 4:4611686018427387904.indices(): the largest value 13835058055282163712 \
does not fit in int64 (at most 9223372036854775807); evaluate coordinates one by one with L(i)
        """
        top = self.cosize() - 1
        if top > INT64_MAX:
            raise ValueError(
                f"{self!r}.indices(): the largest value {top} does not fit in int64 "
                f"(at most {INT64_MAX}); evaluate coordinates one by one with L(i)"
            )
        check_elements(self.size(), f"{self!r}.indices()")
        return _indices(self.coalesce())

    # ------------------------------------------------------------------ simplification
    def flatten(self) -> Layout:
        """The same function with one level of modes: ``((2,3),4) -> (2,3,4)``."""
        return Layout(flatten(self.shape), flatten(self.stride))

    def coalesce(self) -> Layout:
        """The same function with the fewest flat modes.

        >>> Layout((2, 1, 4), (4, 7, 1)).coalesce()
        8:1
        """
        return coalesce(self)

    def filter(self) -> Layout:
        """Coalesce after dropping stride-0 (broadcast) modes: the image as a layout.

        >>> Layout((2, 3, 4), (0, 4, 1)).filter()
        12:1
        """
        return coalesce(Layout(*pack([(s, d) for s, d in self.modes if d != 0])))

    # ------------------------------------------------------------------ algebra
    def compose(self, other: Layout | int | tuple[Any, ...]) -> Layout:
        """``A ∘ B``: the layout with ``(A∘B)(i) == A(B(i))`` for every ``i``.

        ``other`` may be a Layout, an int ``n`` (meaning ``n:1``) or a tuple of
        tilers applied mode by mode. The result has the structure of ``B``.
        Raises ``ValueError`` when B leaves A's domain, when a stride or shape
        of B does not divide A's modes, or when B's modes overlap.

        >>> Layout((4, 6)).compose(Layout((3, 2), (2, 1)))
        (3,2):(2,1)
        >>> Layout((4, 6)).compose(Layout(4, 6))
        4:6
        """
        return _ALGEBRA["compose"](self, other)

    def __matmul__(self, other: Layout) -> Layout:
        return self.compose(other)

    def complement(self, cotarget: int | None = None) -> Layout:
        """The layout that tiles ``[0, cotarget)`` together with this one.

        Requires an injective, admissible layout (modes sorted by stride, each
        stride divisible by the previous size×stride). The result is sorted
        slowest first, increasing, disjoint from the image of ``self``, and
        ``make_layout(complement, self)`` covers ``[0, cotarget)``.
        Default cotarget: ``cosize()``.

        >>> Layout(4, 1).complement(24)
        6:4
        >>> Layout((2, 2), (8, 2)).complement(32)
        (2,2,2):(16,4,1)
        """
        n = (
            self.cosize()
            if cotarget is None
            else check_int(cotarget, "complement cotarget", minimum=1)
        )
        return _ALGEBRA["complement"](self, n)

    def right_inverse(self) -> Layout:
        """The largest ``R`` with ``self(R(i)) == i`` for every ``i < size(R)``.

        >>> Layout((4, 2), (1, 4)).right_inverse()
        (2,4):(1,2)
        """
        return _ALGEBRA["right_inverse"](self)

    def left_inverse(self) -> Layout:
        """A layout ``L`` with ``L(self(i)) == i`` for every ``i < size(self)``.

        Requires an injective, admissible layout.

        >>> Layout((2, 3), (1, 2)).left_inverse()(Layout((2, 3), (1, 2))(4))
        4
        """
        return _ALGEBRA["left_inverse"](self)

    def is_injective(self) -> bool:
        """No two coordinates map to the same index."""
        return is_injective(self)

    def is_admissible(self) -> bool:
        """Injective with strides that nest: sorted by stride, each divides the next span.

        This is the precondition of :meth:`complement` and :meth:`left_inverse`.
        """
        return admissibility(self)[0] is None

    def equivalent(self, other: Layout) -> bool:
        """Same function: same size and ``self(i) == other(i)`` for every ``i``."""
        if not isinstance(other, Layout):
            raise TypeError(f"equivalent expects a Layout, got {type(other).__name__}")
        if self.size() != other.size():
            return False
        if self.coalesce() == other.coalesce():
            return True
        return bool(np.array_equal(self.indices(), other.indices()))


# ---------------------------------------------------------------------- helpers


def as_layout(x: Layout | int, op: str) -> Layout:
    """``x`` itself, or the compact layout ``x:1`` for an int; TypeError naming ``op`` else."""
    if isinstance(x, Layout):
        return x
    if is_int(x):
        return Layout(check_int(x, op))
    raise TypeError(f"{op} expects a Layout or an int, got {x!r} of type {type(x).__name__}")


def pack(modes: Sequence[Mode]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and stride tuples of flat modes; the empty list is the layout ``1:0``."""
    if not modes:
        return (1,), (0,)
    return tuple(s for s, _ in modes), tuple(d for _, d in modes)


def make_layout(*layouts: Layout) -> Layout:
    """Concatenate layouts as the top-level modes of one layout (first is slowest).

    >>> make_layout(Layout(6, 4), Layout(4, 1))
    (6,4):(4,1)
    >>> make_layout(Layout((2, 3)), Layout(4, 6))
    ((2,3),4):((3,1),6)
    """
    shapes: list[IntTuple] = []
    strides: list[IntTuple] = []
    for lay in layouts:
        if not isinstance(lay, Layout):
            raise TypeError(f"make_layout expects Layouts, got {type(lay).__name__}")
        if len(lay) == 1:
            shapes.append(lay.shape[0])
            strides.append(lay.stride[0])
        else:
            shapes.append(lay.shape)
            strides.append(lay.stride)
    return Layout(tuple(shapes), tuple(strides))


def _eval(shape: IntTuple, stride: IntTuple, coord: Any, top: Layout) -> int:
    if isinstance(coord, (tuple, list)):
        if isinstance(shape, int) or len(coord) != len(shape):
            raise ValueError(
                f"coordinate {coord!r} does not match the modes of {top!r} (shape {_fmt(shape)})"
            )
        assert isinstance(stride, tuple)
        return sum(_eval(s, d, c, top) for s, d, c in zip(shape, stride, coord))
    if not is_int(coord):
        raise TypeError(
            f"a layout coordinate must be an int or a tuple, got {coord!r} of type "
            f"{type(coord).__name__}"
        )
    i = check_int(coord, "a layout coordinate")
    n = product(shape)
    if not 0 <= i < n:
        raise ValueError(f"coordinate {i} out of range [0, {n}) for mode {_fmt(shape)} of {top!r}")
    value = 0
    for s, d in reversed(list(zip(flatten(shape), flatten(stride)))):
        value += (i % s) * d
        i //= s
    return value


@functools.lru_cache(maxsize=16)  # at most 16 arrays: a 2**20-element one is 8 MB
def _indices(layout: Layout) -> npt.NDArray[np.int64]:
    out = _mode_values(layout.modes)
    out.setflags(write=False)
    return out


def _mode_values(modes: tuple[Mode, ...]) -> npt.NDArray[np.int64]:
    """Row-major values of flat modes: the slow half's values outer-plus the fast half's.

    Splitting by size keeps every intermediate array at most ~sqrt(size) long, so the
    only full-size allocation is the final outer sum.
    """
    if not modes:
        return np.zeros(1, dtype=np.int64)
    if len(modes) == 1:
        s, d = modes[0]
        return np.arange(s, dtype=np.int64) * d
    total = product(tuple(s for s, _ in modes))
    acc, cut = 1, 1
    for k, (s, _) in enumerate(modes[:-1], start=1):
        acc *= s
        cut = k
        if acc * acc >= total:
            break
    slow, fast = _mode_values(modes[:cut]), _mode_values(modes[cut:])
    return np.add.outer(slow, fast).reshape(-1)


@functools.lru_cache(maxsize=4096)
def coalesce(layout: Layout) -> Layout:
    out: list[Mode] = []
    for s, d in layout.modes:
        if s == 1:
            continue
        if out and out[-1][1] == s * d:
            out[-1] = (out[-1][0] * s, d)
        else:
            out.append((s, d))
    return Layout(*pack(out))


def nontrivial_sorted(layout: Layout) -> list[Mode]:
    return sorted((m for m in layout.modes if m[0] > 1), key=lambda m: (m[1], m[0]))


def admissibility(layout: Layout) -> tuple[str | None, int]:
    """``(why layout is not admissible or None, span)``: the one admissibility check.

    Admissible: sorted by stride, each non-trivial mode starts at a multiple of the
    span (size × stride) of the smaller ones, so the modes tile without overlap;
    ``span`` is then the size × stride of the largest mode (1 for no mode), the
    extent the layout and its complement tile. Meshes use it to check their axes.

    >>> admissibility(Layout((2, 4), (1, 2)))
    (None, 8)
    >>> admissibility(Layout((2, 2), (1, 1)))[0]
    'sorted by stride, the mode 2:1 does not start at a multiple of the span 2 of the smaller modes (1 % 2 != 0)'
    """
    span = 1
    for s, d in nontrivial_sorted(layout):
        if d == 0:
            return f"the mode {s}:0 repeats every index {s} times (stride 0)", span
        if d % span != 0:
            return (
                f"sorted by stride, the mode {s}:{d} does not start at a multiple of the "
                f"span {span} of the smaller modes ({d} % {span} != 0)"
            ), span
        span = s * d
    return None, span


@functools.lru_cache(maxsize=4096)
def is_injective(layout: Layout) -> bool:
    modes = nontrivial_sorted(layout)
    if any(d == 0 for _, d in modes):
        return False
    reach = 0  # largest value reachable by the smaller modes
    for s, d in modes:
        if d <= reach:
            break
        reach += (s - 1) * d
    else:
        return True
    values = layout.indices()
    return bool(np.unique(values).size == values.size)


def require_injective_admissible(layout: Layout, op: str) -> None:
    if not is_injective(layout):
        raise ValueError(
            f"{op} of {layout!r} is undefined: the layout is not injective "
            "(two coordinates map to the same index)"
        )
    problem = admissibility(layout)[0]
    if problem is not None:
        raise ValueError(
            f"{op} of {layout!r} is undefined: the layout is not admissible: {problem}"
        )
