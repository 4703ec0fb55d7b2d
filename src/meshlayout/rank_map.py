"""RankMap: the immutable position -> global rank table shared by related meshes.

Position ``p`` of a mesh holds global rank ``rank_map[p]``. An arithmetic
progression is stored as ``(start, step, length)`` and never materialised; any
other sequence is stored once as a read-only int64 array whose inverse
(rank -> position) is built lazily, the first time it is needed, and shared by
every mesh that holds this object.

>>> RankMap(range(2048, 4096))
RankMap(range(2048, 4096))
>>> RankMap([3, 1, 2, 0]).position(2)
2
>>> RankMap([0, 2, 4, 6])  # arithmetic: stored as a range
RankMap(range(0, 8, 2))
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from .inttuple import INT64_MAX, check_elements, check_int, is_int

__all__ = ["MAX_RANK", "MAX_WORLD", "RankMap"]

IntArray = npt.NDArray[np.int64]

#: Largest global rank: ranks are int64 (numpy arrays, torch tensors, c10d).
MAX_RANK = INT64_MAX
#: Most ranks in one rank map / mesh / ParallelDims world (Python's ``len`` limit too).
MAX_WORLD = INT64_MAX


class RankMap(Sequence[int]):
    """An immutable 1-D sequence of distinct non-negative global ranks."""

    __slots__ = ("_array", "_hash", "_inverse", "_lock", "_max", "_n", "_start", "_step")

    _start: int
    _step: int
    _n: int
    _array: IntArray | None
    _inverse: IntArray | tuple[IntArray, IntArray] | None
    _lock: threading.Lock
    _hash: int
    _max: int

    def __init__(self, ranks: Any) -> None:
        start, step, n, array = _normalise(ranks)
        object.__setattr__(self, "_start", start)
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "_n", n)
        object.__setattr__(self, "_array", array)
        object.__setattr__(self, "_inverse", ranks._inverse if isinstance(ranks, RankMap) else None)
        object.__setattr__(
            self,
            "_max",
            int(array.max()) if array is not None else max(start, start + (n - 1) * step),
        )
        object.__setattr__(self, "_lock", threading.Lock())
        if array is None:
            h = hash(("range", start, step, n))
        else:
            h = hash(("explicit", n, array.tobytes()))
        object.__setattr__(self, "_hash", h)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RankMap is immutable; cannot set {name!r}")

    # ------------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...

    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [int(v) for v in self.to_numpy()[i]]
        i = check_int(i, "a rank map position")
        if not -self._n <= i < self._n:
            raise IndexError(f"position {i} out of range for a rank map of length {self._n}")
        i %= self._n
        if self._array is None:
            return self._start + i * self._step
        return int(self._array[i])

    def __iter__(self) -> Iterator[int]:
        if self._array is None:
            return iter(range(self._start, self._start + self._n * self._step, self._step))
        return iter(self._array.tolist())

    def __contains__(self, rank: object) -> bool:
        if not is_int(rank):
            return False
        return self.position(rank) is not None  # type: ignore[arg-type]

    @property
    def is_range(self) -> bool:
        """True if stored as an arithmetic progression (no per-rank storage)."""
        return self._array is None

    def as_range(self) -> range | None:
        """The equivalent ``range`` if this map is arithmetic, else None."""
        if self._array is None:
            return range(self._start, self._start + self._n * self._step, self._step)
        return None

    def take(self, positions: IntArray) -> IntArray:
        """Vectorised ``rank_map[positions]`` for an int64 array of positions."""
        if self._array is None:
            return self._start + positions * self._step
        return self._array[positions]

    def to_numpy(self) -> IntArray:
        """All ranks as an int64 array (O(len); read-only view when stored explicitly).

        ``ValueError`` above :data:`meshlayout.inttuple.MAX_ELEMENTS` ranks.
        """
        if self._array is None:
            check_elements(self._n, f"{self!r}.to_numpy()")
            return self._start + np.arange(self._n, dtype=np.int64) * self._step
        return self._array

    # ------------------------------------------------------------------ inverse
    def position(self, rank: int) -> int | None:
        """The position holding ``rank``, or None if ``rank`` is not in the map.

        ``TypeError`` naming ``rank`` if it is not an int (``1.5``, ``True``, ...).
        """
        rank = check_int(rank, "rank")
        if self._array is None:
            q, r = divmod(rank - self._start, self._step)
            return q if r == 0 and 0 <= q < self._n else None
        if not 0 <= rank <= self._max:
            return None
        inverse = self._inverse
        if inverse is None:
            inverse = self._build_inverse()
        if isinstance(inverse, np.ndarray):
            if not 0 <= rank < inverse.size:
                return None
            p = int(inverse[rank])
            return p if p >= 0 else None
        sorted_ranks, order = inverse
        k = int(np.searchsorted(sorted_ranks, rank))
        if k < sorted_ranks.size and sorted_ranks[k] == rank:
            return int(order[k])
        return None

    def _build_inverse(self) -> IntArray | tuple[IntArray, IntArray]:
        with self._lock:
            if self._inverse is not None:
                return self._inverse
            assert self._array is not None
            top = self._max + 1
            inverse: IntArray | tuple[IntArray, IntArray]
            if top <= 4 * self._n + 1024:
                dense = np.full(top, -1, dtype=np.int64)
                dense[self._array] = np.arange(self._n, dtype=np.int64)
                inverse = dense
            else:
                order = np.argsort(self._array, kind="stable").astype(np.int64)
                inverse = (self._array[order], order)
            object.__setattr__(self, "_inverse", inverse)
            return inverse

    # ------------------------------------------------------------------ value object
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankMap):
            return NotImplemented
        if self is other:
            return True
        if self._hash != other._hash or self._n != other._n:
            return False
        if self._array is None or other._array is None:
            return (self._array is None and other._array is None) and (
                self._start,
                self._step,
            ) == (other._start, other._step)
        return bool(np.array_equal(self._array, other._array))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        rng = self.as_range()
        return (RankMap, (rng if rng is not None else self._array,))

    def __repr__(self) -> str:
        rng = self.as_range()
        if rng is not None:
            return f"RankMap({rng})"
        return f"RankMap({_abridge(self._array)})"


def _abridge(values: Any, limit: int = 8) -> str:
    vals = [int(v) for v in values[: limit + 1]]
    if len(values) <= limit:
        return "[" + ", ".join(map(str, vals)) + "]"
    return "[" + ", ".join(map(str, vals[:limit])) + f", … ({len(values)} ranks)]"


def _check_distinct(array: IntArray) -> None:
    """ValueError naming the repeated ranks (O(n) counting when ranks are dense)."""
    n = int(array.size)
    top = int(array.max()) + 1
    if top <= 4 * n + 1024:
        counts = np.bincount(array, minlength=top)
        dup = np.flatnonzero(counts > 1)
    else:
        uniq, ucounts = np.unique(array, return_counts=True)
        dup = uniq[ucounts > 1]
    if dup.size:
        raise ValueError(f"ranks must be distinct, but {dup[:8].tolist()} appear more than once")


def _normalise(ranks: Any) -> tuple[int, int, int, IntArray | None]:
    """(start, step, length, explicit array or None) of a rank sequence, validated."""
    if isinstance(ranks, RankMap):
        return ranks._start, ranks._step, ranks._n, ranks._array
    if isinstance(ranks, range):
        return _normalise_range(ranks)
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__len__"):
        raise TypeError(
            f"ranks must be a range, a sequence or an array of ints, got {type(ranks).__name__}"
        )
    array = _as_int64(ranks)
    n = int(array.size)
    if n == 0:
        raise ValueError("a rank map needs at least one rank, got none")
    if n > 1:
        diffs = np.diff(array)
        if diffs[0] != 0 and bool(np.all(diffs == diffs[0])):
            return int(array[0]), int(diffs[0]), n, None
    else:
        return int(array[0]), 1, 1, None
    _check_distinct(array)
    array = array.copy()
    array.setflags(write=False)
    return 0, 0, n, array


def _normalise_range(ranks: range) -> tuple[int, int, int, None]:
    """A range, checked without ``len`` (which overflows past 2**63 - 1 items)."""
    start, stop, step = ranks.start, ranks.stop, ranks.step
    n = max(0, (stop - start + step - (1 if step > 0 else -1)) // step)
    if n == 0:
        raise ValueError(f"a rank map needs at least one rank, got the empty {ranks}")
    if n > MAX_WORLD:
        raise ValueError(f"{ranks} holds {n} ranks, more than MAX_WORLD = {MAX_WORLD} (int64)")
    first, last = start, start + (n - 1) * step
    if min(first, last) < 0:
        raise ValueError(f"ranks must be non-negative, got {ranks}")
    if max(first, last) > MAX_RANK:
        raise ValueError(
            f"ranks must be at most MAX_RANK = {MAX_RANK} (int64), but {ranks} reaches "
            f"{max(first, last)}"
        )
    return first, step if n > 1 else 1, n, None


def _as_int64(ranks: Any) -> IntArray:
    """Flat int64 array of ``ranks``; out-of-range values are named with their true value."""
    try:
        array = np.asarray(ranks)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"ranks must be a regular (not ragged) array of ints: {exc}") from None
    if array.dtype == object:
        values = [check_int(v, "a rank") for v in array.reshape(-1).tolist()]
        bad = sorted({v for v in values if not 0 <= v <= MAX_RANK})
        if bad:
            raise ValueError(f"ranks must be in [0, MAX_RANK = {MAX_RANK}] (int64), got {bad[:8]}")
        return np.asarray(values, dtype=np.int64).reshape(-1)
    if array.dtype == bool or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"ranks must be integers, got an array of {array.dtype}")
    array = array.reshape(-1)
    if array.size and np.issubdtype(array.dtype, np.unsignedinteger):
        big = array[array > MAX_RANK]
        if big.size:
            values = sorted({int(v) for v in big[:8]})
            raise ValueError(f"ranks must be at most MAX_RANK = {MAX_RANK} (int64), got {values}")
    array = array.astype(np.int64)
    if array.size and int(array.min()) < 0:
        raise ValueError(
            f"ranks must be non-negative, got {sorted(set(array[array < 0].tolist()))[:8]}"
        )
    return array
