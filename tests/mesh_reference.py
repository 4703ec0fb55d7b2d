"""Brute-force model of a mesh family, independent of the layout algebra.

A :class:`ModelMesh` is the family of concrete sub-meshes written out: an int64
array ``family`` of shape ``(num_submeshes, *shape)`` holding *positions*, plus
the names and the flat rank map (position -> global rank). Every operation is
plain numpy (transpose, reshape, lookups), so it can be trusted to judge
:class:`meshlayout.Mesh`:

- slicing keeps the chosen dims, in the chosen order, and turns every value of
  the other dims into a sub-mesh of its own (transpose + reshape);
- flatten and unflatten are reshapes of each sub-mesh;
- concat walks from each base position along the first mesh's dims, then along
  the second mesh's dims (it is valid iff the result partitions the positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


@dataclass
class ModelMesh:
    """The family of sub-meshes as an explicit array of positions."""

    names: tuple[str, ...]
    family: IntArray  # (num_submeshes, *shape) of positions
    ranks: IntArray  # position -> global rank
    _where: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict, repr=False)
    _positions: dict[int, int] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def root(cls, shape: Sequence[int], names: Sequence[str], ranks: IntArray) -> ModelMesh:
        n = int(np.prod(shape))
        family = np.arange(n, dtype=np.int64).reshape((1, *shape))
        return cls(tuple(names), family, np.asarray(ranks, dtype=np.int64).reshape(-1))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.family.shape[1:])

    @property
    def num_submeshes(self) -> int:
        return int(self.family.shape[0])

    def _derive(self, names: Sequence[str], family: IntArray) -> ModelMesh:
        return ModelMesh(tuple(names), np.ascontiguousarray(family), self.ranks)

    # ------------------------------------------------------------------ operations
    def slice(self, idx: Sequence[int]) -> ModelMesh:
        rest = [i for i in range(len(self.names)) if i not in idx]
        perm = [0] + [1 + i for i in rest] + [1 + i for i in idx]
        t = np.transpose(self.family, perm)
        t = t.reshape((-1, *(self.shape[i] for i in idx)))
        return self._derive([self.names[i] for i in idx], t)

    def flatten(self, name: str) -> ModelMesh:
        return self._derive([name], self.family.reshape(self.num_submeshes, -1))

    def flatten_dims(self, idx: Sequence[int], name: str) -> ModelMesh:
        """Merge dims ``idx`` (in that order) into one dim where ``idx[0]`` was."""
        first = idx[0]
        perm = [
            j
            for i in range(len(self.names))
            for j in (idx if i == first else [i])
            if i == first or i not in idx
        ]
        t = np.transpose(self.family, [0] + [1 + i for i in perm])
        merged = int(np.prod([self.shape[i] for i in idx]))
        shape = [
            merged if i == first else self.shape[i]
            for i in range(len(self.names))
            if i == first or i not in idx
        ]
        names = [
            name if i == first else self.names[i]
            for i in range(len(self.names))
            if i == first or i not in idx
        ]
        return self._derive(names, t.reshape((self.num_submeshes, *shape)))

    def unflatten(self, i: int, sizes: Sequence[int], names: Sequence[str]) -> ModelMesh:
        shape = self.shape
        new_shape = (*shape[:i], *sizes, *shape[i + 1 :])
        new_names = (*self.names[:i], *names, *self.names[i + 1 :])
        return self._derive(new_names, self.family.reshape((self.num_submeshes, *new_shape)))

    def concat(self, other: ModelMesh) -> ModelMesh | None:
        """Dims of ``self`` then ``other``; None when the result does not partition."""
        n = self.ranks.size
        base = [
            p
            for p in range(n)
            if not any(self.coordinate_of_position(p)) and not any(other.coordinate_of_position(p))
        ]
        subs = []
        for p0 in base:
            first = self.submesh_positions(p0).reshape(-1)
            rows = [other.submesh_positions(int(q)).reshape(-1) for q in first]
            subs.append(np.stack(rows).reshape(self.shape + other.shape))
        if not subs:
            return None
        family = np.stack(subs)
        if family.size != n or np.unique(family).size != n:
            return None
        return self._derive(self.names + other.names, family)

    # ------------------------------------------------------------------ queries
    def _index(self) -> dict[int, tuple[int, tuple[int, ...]]]:
        if not self._where:
            for f in range(self.num_submeshes):
                for c in np.ndindex(*self.shape):
                    self._where[int(self.family[(f, *c)])] = (f, tuple(int(x) for x in c))
        return self._where

    def coordinate_of_position(self, p: int) -> tuple[int, ...]:
        return self._index()[p][1]

    def submesh_positions(self, p: int) -> IntArray:
        return self.family[self._index()[p][0]]

    def position(self, rank: int) -> int | None:
        if not self._positions:
            self._positions.update((int(r), p) for p, r in enumerate(self.ranks.tolist()))
        return self._positions.get(rank)

    def contains(self, rank: int) -> bool:
        return self.position(rank) is not None

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        p = self.position(rank)
        return None if p is None else self.coordinate_of_position(p)

    def group(self, rank: int, i: int) -> tuple[int, ...]:
        p = self.position(rank)
        assert p is not None
        f, c = self._index()[p]
        index: list[int | slice] = list(c)
        index[i] = slice(None)
        return tuple(int(r) for r in self.ranks[self.family[f][tuple(index)]])

    def submesh(self, rank: int) -> IntArray:
        p = self.position(rank)
        assert p is not None
        return self.ranks[self.submesh_positions(p)]

    def groups(self, i: int) -> IntArray:
        """Every group along dim ``i``, ordered by the position of its first member."""
        moved = np.moveaxis(self.family, 1 + i, -1).reshape(-1, self.shape[i])
        moved = moved[np.argsort(moved[:, 0], kind="stable")]
        return self.ranks[moved]

    def submeshes(self) -> IntArray:
        """Every sub-mesh, ordered by the position of its first element."""
        firsts = self.family.reshape(self.num_submeshes, -1)[:, 0]
        return self.ranks[self.family[np.argsort(firsts, kind="stable")]]

    def hosts_spanned(self, ranks_per_host: int) -> list[int]:
        """Per sub-mesh (ordered as :meth:`submeshes`), the number of distinct hosts."""
        return [
            len({int(r) // ranks_per_host for r in sub.reshape(-1).tolist()})
            for sub in self.submeshes()
        ]

    # ------------------------------------------------------------------ representability
    def unflatten_is_affine(self, i: int, sizes: Sequence[int]) -> bool:
        """Whether splitting dim ``i`` into ``sizes`` gives dims that are layouts.

        True iff, in every sub-mesh, position = base + one offset per new dim, the
        offsets being the same in every sub-mesh and each dim's offsets being the
        values of a flat (shape:stride) layout.
        """
        split = self.unflatten(i, sizes, [f"_u{k}" for k in range(len(sizes))]).family
        k0, k1 = 1 + i, 1 + i + len(sizes)
        moved = np.moveaxis(
            split, list(range(k0, k1)), list(range(split.ndim - len(sizes), split.ndim))
        )
        blocks = moved.reshape(-1, *sizes)  # every (sub-mesh, other coords) -> block of new dims
        rel = blocks - blocks.reshape(blocks.shape[0], -1)[:, :1].reshape((-1,) + (1,) * len(sizes))
        if not np.all(rel == rel[0]):
            return False
        block = rel[0]
        total = np.zeros_like(block)
        for d in range(len(sizes)):
            index = [0] * len(sizes)
            index[d] = slice(None)  # type: ignore[call-overload]
            offsets = block[tuple(index)]
            if not is_layout_sequence(offsets.tolist()):
                return False
            shape = [1] * len(sizes)
            shape[d] = sizes[d]
            total = total + offsets.reshape(shape)
        return bool(np.array_equal(total, block))


def is_layout_sequence(values: Sequence[int]) -> bool:
    """Whether ``values`` are ``L(0), L(1), …`` of some flat row-major layout ``L``."""
    n = len(values)
    if n == 1:
        return values[0] == 0
    if values[0] != 0:
        return False
    for s in range(n, 1, -1):  # size of the fastest mode
        if n % s:
            continue
        d = values[1]
        if d <= 0 and s > 1:
            continue
        vals = np.asarray(values, dtype=np.int64).reshape(-1, s)
        if not np.array_equal(vals, vals[:, :1] + d * np.arange(s)):
            continue
        if is_layout_sequence(vals[:, 0].tolist()):
            return True
    return False
