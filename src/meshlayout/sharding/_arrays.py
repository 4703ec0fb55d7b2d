"""Reference data path helpers: cut, place and reduce numpy or torch arrays by runs.

torch is imported only when the arrays given are torch tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._order import Runs

__all__ = [
    "as_array",
    "check_reduce_dtype",
    "cut",
    "is_torch",
    "put",
    "reduce_group",
    "submesh_index",
    "zeros_like",
]

_BITWISE = {"band": "bitwise and", "bor": "bitwise or", "bxor": "bitwise xor"}


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def as_array(x: Any, what: str) -> Any:
    """``x`` if it is a numpy array or torch tensor; nested lists/tuples/scalars as numpy.

    ``TypeError`` naming ``what`` and the type for anything else (or for lists of
    non-numbers); ``ValueError`` for ragged nested lists.

    >>> as_array([[1, 2], [3, 4]], "array").shape
    (2, 2)
    """
    if isinstance(x, np.ndarray) or is_torch(x):
        return x
    if isinstance(x, (list, tuple, int, float, complex, np.generic)) and not isinstance(x, bool):
        try:
            out = np.asarray(x)
        except ValueError:
            raise ValueError(
                f"{what} is a ragged nested list; every row needs the same length"
            ) from None
        if out.dtype == object or out.dtype.kind in "USV":
            raise TypeError(f"{what} must hold numbers, got a nested list of {out.dtype}")
        return out
    raise TypeError(
        f"{what} must be a numpy array, a torch tensor or nested lists of numbers, "
        f"got {type(x).__name__}"
    )


def check_reduce_dtype(x: Any, ops: Sequence[str]) -> None:
    """``TypeError`` naming the ops and the dtype when ``ops`` cannot reduce ``x`` exactly.

    ``ops`` are the reduce ops of every ``Partial`` mesh dim of one spec. Refused:
    a bitwise op (``band``/``bor``/``bxor``) on floating or complex data; ``avg`` on
    bool data (a mean of truth values is not a truth value); ``avg`` together with a
    bitwise op (the average is fractional, the bitwise op then has no integers left).
    Every other combination reduces exactly (``avg`` of integers gives floats).

    >>> check_reduce_dtype(np.zeros(2), ["band"])
    Traceback (most recent call last):
    ...
    TypeError: Partial('band') reduces with bitwise and, which needs integer or bool data, got float64
    >>> check_reduce_dtype(np.zeros(2, dtype=np.int64), ["band", "avg"])
    Traceback (most recent call last):
    ...
    TypeError: Partial('band') and Partial('avg') cannot reduce one tensor: the average of int64 data is fractional and bitwise and needs integers
    """
    dtype = x.dtype
    name = str(dtype).removeprefix("torch.")
    if is_torch(x):
        integral = not (dtype.is_floating_point or dtype.is_complex)
        boolean = name == "bool"
    else:
        boolean = dtype == np.bool_
        integral = boolean or np.issubdtype(dtype, np.integer)
    bitwise = [op for op in ops if op in _BITWISE]
    for op in bitwise:
        if not integral:
            raise TypeError(
                f"Partial({op!r}) reduces with {_BITWISE[op]}, which needs integer or bool data, "
                f"got {name}"
            )
    if "avg" in ops and boolean:
        raise TypeError("Partial('avg') averages, which needs numbers, not bool data")
    if "avg" in ops and bitwise:
        raise TypeError(
            f"Partial({bitwise[0]!r}) and Partial('avg') cannot reduce one tensor: the average "
            f"of {name} data is fractional and {_BITWISE[bitwise[0]]} needs integers"
        )


def _index(runs: Runs) -> slice | np.ndarray[Any, np.dtype[np.int64]]:
    if len(runs) <= 1:
        a, b = runs[0] if runs else (0, 0)
        return slice(a, b)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def cut(array: Any, runs: tuple[Runs, ...]) -> Any:
    """A copy of the elements of ``array`` at ``runs`` (one tuple of runs per dim)."""
    x = array
    for d, r in enumerate(runs):
        ix: Any = _index(r)
        if not isinstance(ix, slice) and is_torch(x):
            import torch

            ix = torch.as_tensor(ix)
        x = x[(slice(None),) * d + (ix,)]
    return x.clone() if is_torch(x) else np.array(x, copy=True)


def zeros_like(value: Any, shape: tuple[int, ...]) -> Any:
    if is_torch(value):
        return value.new_zeros(shape)
    return np.zeros(shape, dtype=np.asarray(value).dtype)


def put(
    out: Any, filled: np.ndarray[Any, Any], runs: tuple[Runs, ...], value: Any, rank: int
) -> None:
    idx = [_index(r) for r in runs]
    if all(isinstance(ix, slice) for ix in idx):
        key: Any = tuple(idx)
    else:
        key = np.ix_(*[np.arange(ix.start, ix.stop) if isinstance(ix, slice) else ix for ix in idx])
    seen = filled[key]
    okey = key
    if is_torch(out) and not all(isinstance(ix, slice) for ix in key):
        import torch

        okey = tuple(torch.as_tensor(ix) for ix in key)
    if seen.any():
        old = out[okey]
        mask: Any = seen
        if is_torch(out):
            import torch

            mask = torch.as_tensor(seen)
        if not bool((old[mask] == value[mask]).all()):
            raise ValueError(f"the piece of rank {rank} disagrees with another replica")
    out[okey] = value
    filled[key] = True


def reduce_group(
    members: dict[tuple[int, ...], tuple[int, Any]], partial: list[tuple[int, str]]
) -> tuple[int, Any]:
    """Reduce one Partial group, last partial mesh dim first; returns (some rank, value)."""
    current = {c: v for c, (_, v) in members.items()}
    for m, op in reversed(partial):
        merged: dict[tuple[int, ...], list[Any]] = {}
        for c in sorted(current):
            merged.setdefault((*c[:m], 0, *c[m + 1 :]), []).append(current[c])
        current = {c: _combine(vs, op) for c, vs in merged.items()}
    (value,) = current.values()
    return min(r for r, _ in members.values()), value


def _combine(values: list[Any], op: str) -> Any:
    acc = values[0]
    if op in ("min", "max"):
        if is_torch(acc):
            import torch

            fn: Any = torch.minimum if op == "min" else torch.maximum
        else:
            fn = np.minimum if op == "min" else np.maximum
        for v in values[1:]:
            acc = fn(acc, v)
        return acc
    for v in values[1:]:
        if op in ("sum", "avg"):
            acc = acc + v
        elif op == "product":
            acc = acc * v
        elif op == "band":
            acc = acc & v
        elif op == "bor":
            acc = acc | v
        else:
            acc = acc ^ v
    return acc / len(values) if op == "avg" else acc


def submesh_index(mesh: Any) -> dict[int, int]:
    """``{global rank: index of its sub-mesh}`` from the mesh's group table."""
    table = np.asarray(mesh.group_table())
    return {int(r): g for g, row in enumerate(table.tolist()) for r in row}
