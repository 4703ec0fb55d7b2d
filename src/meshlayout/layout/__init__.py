"""CuTe-style layouts in the lexicographic (row-major) convention.

A :class:`Layout` is a function from coordinates to integers, written
``shape:stride``. The *last* mode varies fastest, as in numpy and PyTorch, so
the compact layout of shape ``(2, 4)`` is ``(2,4):(4,1)``:

>>> L = Layout((2, 4))
>>> L
(2,4):(4,1)
>>> [L(i) for i in range(L.size())]
[0, 1, 2, 3, 4, 5, 6, 7]
>>> L((1, 2))
6
>>> Layout((2, 4), (1, 2)).indices().tolist()
[0, 2, 4, 6, 1, 3, 5, 7]

The algebra (composition, complement, inverses, divide and product) follows
CUTLASS's CuTe, mirrored to row-major: where CuTe writes ``(tile, rest)`` we
write ``(rest, tile)`` so that each *row* of a divided layout is one tile.
Every precondition is checked; a violated one raises ``ValueError`` naming the
layouts and the rule, never a silently wrong layout:

>>> logical_divide(Layout(24), Layout(4))
(6,4):(4,1)
>>> Layout((2, 3), (6, 1)).compose(Layout(4))
Traceback (most recent call last):
...
ValueError: cannot compose (2,3):(6,1) ∘ 4:1: shape divisibility: 4 elements of stride 1 \
must fill whole modes of (2,3):(6,1) or end inside one, but the mode 3:1 holds 3 \
(and 4 % 3 != 0)
"""

from __future__ import annotations

from ._algebra import logical_divide, logical_product
from ._core import Layout, make_layout

__all__ = ["Layout", "logical_divide", "logical_product", "make_layout"]


def clear_caches() -> None:
    """Empty every cache of the layout algebra (for benchmarks that time cold calls)."""
    from . import _algebra, _core

    for module in (_core, _algebra):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()
