"""Mesh: named axes, each a flat layout over one shared, immutable rank map.

A mesh maps coordinates to *positions* through one layout per named dim (its
axis), and positions to global ranks through a :class:`RankMap` shared by every
mesh derived from the same root. It is rank-agnostic: ``mesh["tp"]`` of a
``(pp, dp, tp)`` mesh stands for the whole family of TP groups, the congruent
copies of its layout offset by every offset of the complement.

>>> m = Mesh({"pp": 2, "dp": 2, "tp": 4})
>>> m
Mesh(pp=2, dp=2, tp=4)
>>> m["tp", "pp"]
Mesh(tp=4, pp=2; layout (4,2):(1,8); ranks range(0, 16))
>>> m.group(13, "tp")
(12, 13, 14, 15)
>>> m.coordinate(13)
(1, 1, 1)
>>> m["tp"].num_submeshes
4
>>> m.flatten()
Mesh(pp_dp_tp=16)
>>> m.unflatten("tp", (2, 2), ("tp_out", "tp_in"))
Mesh(pp=2, dp=2, tp_out=2, tp_in=2)

Every per-rank question costs O(ndim + size of the answer); only
:meth:`Mesh.groups` and :meth:`Mesh.submeshes` enumerate the world.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .inttuple import check_elements, check_int, is_int, suffix_product
from .layout import Layout, make_layout
from .layout._core import admissibility
from .rank_map import MAX_RANK, MAX_WORLD, RankMap

__all__ = ["Dim", "Mesh", "check_whole_hosts"]

Dim = int | str
IntArray = npt.NDArray[np.int64]

# One digit of a position along an axis: (size, stride in positions, weight in the coordinate).
_Digit = tuple[int, int, int]


def check_whole_hosts(
    ranks_per_host: int, world_size: int, host_text: str = "", world_text: str = ""
) -> None:
    """Refuse a host size that does not divide the world: ValueError naming both numbers.

    Host ``k`` holds ranks ``[k*n, (k+1)*n)`` and every host holds ``n`` of them (as
    torchrun starts them), so a world that ``n`` does not divide is a mistake in one
    of the numbers, never a partial last host. ``host_text`` / ``world_text`` name
    them in the message (defaults ``ranks_per_host=N``, ``the world of W ranks``).

    >>> check_whole_hosts(8, 16)
    >>> check_whole_hosts(8, 12)
    Traceback (most recent call last):
    ValueError: ranks_per_host=8 does not divide the world of 12 ranks: the last host would hold 4 of 8 ranks (every host holds as many ranks)
    """
    n = check_int(ranks_per_host, "ranks_per_host", minimum=1)
    world = check_int(world_size, "world_size", minimum=1)
    if world % n:
        raise ValueError(
            f"{host_text or f'ranks_per_host={n}'} does not divide "
            f"{world_text or f'the world of {world} ranks'}: the last host would hold "
            f"{world % n} of {n} ranks (every host holds as many ranks)"
        )


class Mesh:
    """Named dims over a shared rank map (see the module docstring).

    ``Mesh(shape, names=None, *, ranks=None)``: ``shape`` is a sequence of
    positive ints or a mapping name -> size; ``names`` default to
    ``("dim0", "dim1", ...)``; ``ranks`` are the global ranks in row-major order
    (a range, a flat sequence, nested lists or an ndarray of ``shape``), default
    ``range(prod(shape))``.

    >>> Mesh((2, 2), ("dp", "tp"), ranks=[[3, 1], [2, 0]]).group(1, "tp")
    (3, 1)
    """

    __slots__ = (
        "__weakref__",
        "_axes",
        "_axis_positions",
        "_digits",
        "_hash",
        "_layout",
        "_names",
        "_rank_map",
        "_shape",
    )

    _names: tuple[str, ...]
    _axes: tuple[Layout, ...]
    _rank_map: RankMap
    _shape: tuple[int, ...]
    _digits: tuple[tuple[_Digit, ...], ...]
    _hash: int
    _axis_positions: list[IntArray | None]  # lazily: positions of each axis (size of the dim)
    _layout: Layout | None  # lazily: make_layout(*axes)

    def __init__(
        self,
        shape: Sequence[int] | Mapping[str, int],
        names: Sequence[str] | None = None,
        *,
        ranks: Any = None,
    ) -> None:
        sizes, dim_names = _parse_shape(shape, names)
        total = math.prod(sizes)
        if total > MAX_WORLD:
            raise ValueError(
                f"a mesh of shape {sizes} has {total} positions, more than "
                f"MAX_WORLD = {MAX_WORLD} (ranks are int64)"
            )
        if ranks is None:
            rank_map = RankMap(range(total))
        elif isinstance(ranks, RankMap):
            rank_map = ranks  # shared as is, with its (lazily built) inverse
            if len(rank_map) != total:
                raise ValueError(
                    f"a mesh of shape {sizes} needs {total} ranks, but {len(rank_map)} were given"
                )
        else:
            _check_rank_shape(ranks, sizes)
            rank_map = RankMap(ranks)
            if len(rank_map) != total:
                raise ValueError(
                    f"a mesh of shape {sizes} needs {total} ranks, but {len(rank_map)} were given"
                )
        axes = _root_axes(sizes)
        self._init(dim_names, axes, rank_map)

    # ------------------------------------------------------------------ construction
    @classmethod
    def _from_parts(
        cls, names: tuple[str, ...], axes: tuple[Layout, ...], rank_map: RankMap
    ) -> Mesh:
        """Build a mesh from canonical axes over ``rank_map``, validating cheaply."""
        mesh = cls.__new__(cls)
        mesh._init(names, tuple(_canonical(a) for a in axes), rank_map)
        return mesh

    def _init(self, names: tuple[str, ...], axes: tuple[Layout, ...], rank_map: RankMap) -> None:
        _check_names(names)
        if len(names) != len(axes):
            raise ValueError(f"{len(names)} names {names} for {len(axes)} axes")
        _check_tiling(names, axes, len(rank_map))  # cached on (axes, n) when valid
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_axes", axes)
        object.__setattr__(self, "_rank_map", rank_map)
        object.__setattr__(self, "_shape", tuple(a.size() for a in axes))
        object.__setattr__(self, "_digits", tuple(_axis_digits(a) for a in axes))
        object.__setattr__(self, "_hash", hash((names, axes, rank_map)))
        object.__setattr__(self, "_axis_positions", [None] * len(axes))
        object.__setattr__(self, "_layout", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Mesh is immutable; cannot set {name!r}")

    # ------------------------------------------------------------------ basic properties
    @property
    def names(self) -> tuple[str, ...]:
        """Dim names, outermost first."""
        return self._names

    @property
    def shape(self) -> tuple[int, ...]:
        """Dim sizes, outermost first."""
        return self._shape

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self._names)

    @property
    def axes(self) -> tuple[Layout, ...]:
        """One canonical (coalesced, flat) layout per dim, from coordinate to position."""
        return self._axes

    @property
    def layout(self) -> Layout:
        """All axes as the top-level modes of one layout: coordinate tuple -> position."""
        if self._layout is None:
            object.__setattr__(self, "_layout", make_layout(*self._axes))
        assert self._layout is not None
        return self._layout

    @property
    def rank_map(self) -> RankMap:
        """The shared position -> global rank table."""
        return self._rank_map

    def size(self, dim: Dim | None = None) -> int:
        """Size of one dim, or of the whole mesh when ``dim`` is None."""
        if dim is None:
            return math.prod(self._shape)
        return self._shape[self.dim_index(dim)]

    @property
    def num_submeshes(self) -> int:
        """How many congruent sub-meshes this mesh stands for (1 for a root mesh)."""
        return len(self._rank_map) // self.size()

    def dim_index(self, dim: Dim) -> int:
        """Index of a dim given by name or (possibly negative) index; KeyError if unknown."""
        if isinstance(dim, str):
            try:
                return self._names.index(dim)
            except ValueError:
                raise KeyError(
                    f"unknown mesh dim {dim!r}; valid names are {list(self._names)}"
                ) from None
        if is_int(dim):
            i = int(dim)
            if -self.ndim <= i < self.ndim:
                return i % self.ndim
            raise KeyError(
                f"mesh dim index {i} out of range for a {self.ndim}-D mesh {list(self._names)}"
            )
        raise TypeError(f"a mesh dim is a name (str) or an index (int), got {dim!r}")

    # ------------------------------------------------------------------ derived meshes
    def __getitem__(self, key: Dim | Sequence[Dim]) -> Mesh:
        """Select dims by name or index, in any order (a transpose), with the same rank map."""
        keys = cast(Sequence[Dim], (key,) if isinstance(key, str) or is_int(key) else key)
        if not isinstance(keys, (tuple, list)):
            raise TypeError(f"a mesh key is a dim or a tuple of dims, got {key!r}")
        if not keys:
            raise ValueError("cannot select zero dims from a mesh; name at least one")
        idx = [self.dim_index(k) for k in keys]
        if len(set(idx)) != len(idx):
            raise ValueError(f"dims {list(keys)} select the same dim twice")
        return Mesh._from_parts(
            tuple(self._names[i] for i in idx), tuple(self._axes[i] for i in idx), self._rank_map
        )

    def flatten(self, name: str | None = None, *, dims: Sequence[Dim] | None = None) -> Mesh:
        """Merge dims row-major into one dim called ``name`` (default ``"a_b_c"``).

        Without ``dims`` every dim is merged. With ``dims`` (names or indices, in the
        order to merge them, slowest first) only those are merged; the merged dim takes
        the place of the first of ``dims`` and the other dims keep their order.

        >>> m = Mesh({"pp": 2, "dp": 2, "cp": 2, "tp": 2})
        >>> m.flatten(dims=("dp", "cp"))
        Mesh(pp=2, dp_cp=4, tp=2)
        >>> m.flatten("fsdp", dims=("cp", "dp")).group(2, "fsdp")
        (0, 4, 2, 6)
        """
        if dims is None:
            chosen = list(range(self.ndim))
        else:
            if isinstance(dims, str) or is_int(dims):
                dims = (cast(Dim, dims),)
            if not isinstance(dims, (tuple, list)) or not dims:
                raise ValueError(f"flatten dims must name at least one mesh dim, got {dims!r}")
            chosen = [self.dim_index(d) for d in dims]
            if len(set(chosen)) != len(chosen):
                raise ValueError(f"flatten dims {list(dims)} name the same dim twice")
        flat_name = "_".join(self._names[i] for i in chosen) if name is None else name
        merged = make_layout(*(self._axes[i] for i in chosen))  # canonicalised below
        first = chosen[0]
        keep = [i for i in range(self.ndim) if i == first or i not in chosen]
        return Mesh._from_parts(
            tuple(flat_name if i == first else self._names[i] for i in keep),
            tuple(merged if i == first else self._axes[i] for i in keep),
            self._rank_map,
        )

    def unflatten(self, dim: Dim, sizes: Sequence[int], names: Sequence[str]) -> Mesh:
        """Split one dim row-major into ``len(sizes)`` dims named ``names``.

        >>> Mesh({"dp": 8}).unflatten("dp", (2, 4), ("rep", "shard")).group(5, "rep")
        (1, 5)
        """
        i = self.dim_index(dim)
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
            raise TypeError(
                f"unflatten sizes must be a sequence of ints, got {sizes!r} of type "
                f"{type(sizes).__name__}; e.g. ({sizes!r},) for one dim"
            )
        sizes_t = tuple(check_int(s, "unflatten size", minimum=1) for s in sizes)
        if isinstance(names, str):
            names_t: tuple[str, ...] = (names,)
        elif isinstance(names, Iterable):
            names_t = tuple(names)
        else:
            raise TypeError(f"unflatten names must be a sequence of str, got {names!r}")
        if len(sizes_t) != len(names_t) or not sizes_t:
            raise ValueError(
                f"unflatten needs one name per size, got sizes {sizes_t} and names {names_t}"
            )
        if math.prod(sizes_t) != self._shape[i]:
            raise ValueError(
                f"cannot unflatten dim {self._names[i]!r} of size {self._shape[i]} into "
                f"{sizes_t}: their product is {math.prod(sizes_t)}"
            )
        try:
            split = self._axes[i].compose(Layout(sizes_t))
        except ValueError as exc:
            raise ValueError(
                f"cannot unflatten dim {self._names[i]!r} (layout {self._axes[i]}) into "
                f"{sizes_t}: its positions do not split that way ({exc})"
            ) from None
        parts = [split[k] for k in range(len(sizes_t))]
        return Mesh._from_parts(
            self._names[:i] + names_t + self._names[i + 1 :],
            self._axes[:i] + tuple(parts) + self._axes[i + 1 :],
            self._rank_map,
        )

    @staticmethod
    def concat(meshes: Iterable[Mesh]) -> Mesh:
        """The dims of several meshes over the same rank map, side by side.

        >>> m = Mesh({"pp": 2, "dp": 2, "tp": 2})
        >>> Mesh.concat([m["pp"], m["tp"]]) == m["pp", "tp"]
        True
        """
        if isinstance(meshes, Mesh) or not isinstance(meshes, Iterable):
            raise TypeError(
                f"Mesh.concat takes a sequence of Mesh objects, got {meshes!r} of type "
                f"{type(meshes).__name__}"
            )
        ms = list(meshes)
        if not ms:
            raise ValueError("Mesh.concat needs at least one mesh")
        for m in ms:
            if not isinstance(m, Mesh):
                raise TypeError(
                    f"Mesh.concat takes Mesh objects, got {m!r} of type {type(m).__name__}"
                )
        rank_map = ms[0]._rank_map
        for m in ms[1:]:
            if m._rank_map != rank_map:
                raise ValueError(
                    f"Mesh.concat needs meshes over the same rank map; {ms[0]!r} and {m!r} differ"
                )
        names = tuple(n for m in ms for n in m._names)
        axes = tuple(a for m in ms for a in m._axes)
        return Mesh._from_parts(names, axes, rank_map)

    # ------------------------------------------------------------------ per-rank queries
    def __contains__(self, rank: object) -> bool:
        return rank in self._rank_map

    def _position(self, rank: int, what: str) -> int:
        p = self._rank_map.position(check_int(rank, f"{what}: rank"))
        if p is None:
            raise ValueError(f"{what}: rank {rank} is not in {self!r}")
        return p

    def _coordinate_of(self, p: int) -> tuple[int, ...]:
        return tuple(sum((p // d) % s * w for s, d, w in digits) for digits in self._digits)

    def _positions_along(self, i: int) -> IntArray:
        """Positions of axis ``i`` from coordinate 0 (read-only; cached, size of the dim)."""
        cached = self._axis_positions[i]
        if cached is None:
            check_elements(self._shape[i], f"a group along {self._names[i]!r} of {self!r}")
            cached = _digit_values(self._digits[i])
            self._axis_positions[i] = cached
        return cached

    def _axis_offset(self, i: int, p: int) -> int:
        """Contribution of dim ``i`` to position ``p`` (its coordinate times the axis)."""
        return sum((p // d) % s * d for s, d, _ in self._digits[i])

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """Coordinate of ``rank`` in its sub-mesh, or None if the rank is not covered."""
        p = self._rank_map.position(check_int(rank, "coordinate: rank"))
        return None if p is None else self._coordinate_of(p)

    def local_rank(self, rank: int, dim: Dim) -> int:
        """Coordinate of ``rank`` along ``dim``; ValueError if the rank is not covered."""
        i = self.dim_index(dim)
        p = self._position(rank, "local_rank")
        return sum((p // d) % s * w for s, d, w in self._digits[i])

    def group(self, rank: int, dim: Dim) -> tuple[int, ...]:
        """Global ranks of ``rank``'s group along ``dim``, in coordinate order."""
        i = self.dim_index(dim)
        p = self._position(rank, "group")
        base = p - self._axis_offset(i, p)
        return tuple(self._rank_map.take(base + self._positions_along(i)).tolist())

    def submesh(self, rank: int) -> IntArray:
        """The concrete sub-mesh containing ``rank``: an ndarray of global ranks of ``shape``."""
        p = self._position(rank, "submesh")
        check_elements(self.size(), f"a sub-mesh of {self!r}")
        base = p - sum(self._axis_offset(i, p) for i in range(self.ndim))
        positions = np.full((1,) * self.ndim, base, dtype=np.int64)
        for i in range(self.ndim):
            along = [1] * self.ndim
            along[i] = self._shape[i]
            positions = positions + self._positions_along(i).reshape(along)
        return self._rank_map.take(positions)

    # ------------------------------------------------------------------ whole-world queries
    def groups(self, dim: Dim) -> IntArray:
        """Every group along ``dim`` in the whole rank map: shape ``(num_groups, size(dim))``.

        O(world); groups are ordered by their first position.
        """
        i = self.dim_index(dim)
        check_elements(len(self._rank_map), f"{self!r}.groups({self._names[i]!r})")
        axis = self._axes[i]
        offsets = axis.complement(len(self._rank_map)).indices()
        positions = offsets[:, None] + axis.indices()[None, :]
        return self._rank_map.take(positions)

    def submeshes(self) -> IntArray:
        """Every sub-mesh of the family: shape ``(num_submeshes, *shape)``. O(world)."""
        check_elements(len(self._rank_map), f"{self!r}.submeshes()")
        lay = self.layout
        offsets = lay.complement(len(self._rank_map)).indices()
        positions = offsets[:, None] + lay.indices()[None, :]
        return self._rank_map.take(positions).reshape((offsets.size, *self._shape))

    def group_table(self) -> IntArray:
        """Every sub-mesh as one row of global ranks: shape ``(num_submeshes, size())``.

        Row ``g`` lists the ranks of sub-mesh ``g`` in row-major coordinate order,
        i.e. ``submeshes().reshape(num_submeshes, -1)``; rows are ordered by their
        first position. The one way to get "every group of a view as a 2-D array".
        O(world).

        >>> Mesh({"dp": 2, "tp": 2})["dp"].group_table().tolist()
        [[0, 2], [1, 3]]
        """
        check_elements(len(self._rank_map), f"{self!r}.group_table()")
        return self.submeshes().reshape(self.num_submeshes, self.size())

    def hosts_spanned(self, ranks_per_host: int) -> IntArray:
        """How many distinct hosts each sub-mesh touches: shape ``(num_submeshes,)``.

        Host of rank ``r`` is ``r // ranks_per_host``; entry ``g`` counts the hosts
        of row ``g`` of :meth:`group_table`. O(world).

        >>> Mesh({"dp": 2, "tp": 4})["dp"].hosts_spanned(4).tolist()
        [2, 2, 2, 2]
        >>> Mesh({"dp": 2, "tp": 4})["tp"].hosts_spanned(4).tolist()
        [1, 1]
        """
        n = check_int(ranks_per_host, "ranks_per_host", minimum=1)
        table = self.group_table()
        if n > MAX_RANK:  # every rank is on host 0 (and n does not fit in int64)
            return np.ones(table.shape[0], dtype=np.int64)
        hosts = np.sort(table // n, axis=1)
        counts: IntArray = 1 + np.count_nonzero(np.diff(hosts, axis=1), axis=1).astype(np.int64)
        return counts

    # ------------------------------------------------------------------ value object
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return (
            self._hash == other._hash
            and self._names == other._names
            and self._axes == other._axes
            and self._rank_map == other._rank_map
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        return (Mesh._from_parts, (self._names, self._axes, self._rank_map))

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self._names, self._shape))
        n = len(self._rank_map)
        compact = self.num_submeshes == 1 and self.layout.coalesce() == Layout(n).coalesce()
        identity = self._rank_map.as_range() == range(n)
        if compact and identity:
            return f"Mesh({dims})"
        if compact:
            return f"Mesh({dims}, ranks={_ranks_repr(self._rank_map)})"
        layout = self._axes[0] if self.ndim == 1 else self.layout
        return f"Mesh({dims}; layout {layout}; ranks {_ranks_repr(self._rank_map)})"


# ---------------------------------------------------------------------- helpers


def _ranks_repr(rank_map: RankMap) -> str:
    rng = rank_map.as_range()
    return str(rng) if rng is not None else repr(rank_map)[len("RankMap(") : -1]


def _canonical(axis: Layout) -> Layout:
    """The flat, coalesced form of an axis (the key for equality and hashing)."""
    return axis.coalesce()


@functools.lru_cache(maxsize=1024)
def _root_axes(sizes: tuple[int, ...]) -> tuple[Layout, ...]:
    """Canonical axes of a compact row-major mesh of ``sizes``."""
    return tuple(_canonical(Layout(s, d)) for s, d in zip(sizes, suffix_product(sizes)))


@functools.lru_cache(maxsize=4096)
def _axis_digits(axis: Layout) -> tuple[_Digit, ...]:
    modes = [m for m in axis.modes if m[0] > 1]
    weights = suffix_product(tuple(s for s, _ in modes))
    return tuple((s, d, w) for (s, d), w in zip(modes, weights))


def _digit_values(digits: tuple[_Digit, ...]) -> IntArray:
    """Row-major values of an axis given by its digits (slowest first)."""
    values = np.zeros(1, dtype=np.int64)
    for s, d, _ in digits:
        values = (values[:, None] + np.arange(0, s * d, d, dtype=np.int64)[None, :]).reshape(-1)
    values.setflags(write=False)
    return values


def _parse_shape(
    shape: Sequence[int] | Mapping[str, int], names: Sequence[str] | None
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    if isinstance(shape, Mapping):
        if names is not None:
            raise ValueError(
                "give names either as the keys of a shape mapping or as names=, not both"
            )
        names = tuple(shape.keys())
        raw = tuple(shape.values())
    elif isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise TypeError(f"mesh shape must be a sequence of ints or a mapping, got {shape!r}")
    else:
        raw = tuple(shape)
    if not raw:
        raise ValueError("a mesh needs at least one dim, got an empty shape")
    bad = [s for s in raw if is_int(s) and int(s) <= 0]
    if bad:
        raise ValueError(f"mesh sizes must be >= 1, got {list(raw)}")
    sizes = tuple(check_int(s, "mesh size", minimum=1) for s in raw)
    if names is None:
        dim_names = tuple(f"dim{i}" for i in range(len(sizes)))
    elif isinstance(names, str):
        dim_names = (names,)
    else:
        dim_names = tuple(names)
    if len(dim_names) != len(sizes):
        raise ValueError(f"{len(dim_names)} names {dim_names} for a {len(sizes)}-D shape {sizes}")
    return sizes, dim_names


def _check_names(names: tuple[str, ...]) -> None:
    for n in names:
        if not isinstance(n, str) or not n.isidentifier():
            raise ValueError(f"mesh dim names must be identifiers, got {n!r} in {list(names)}")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"mesh dim names must be unique; {dup} repeat in {list(names)}")


def _check_rank_shape(ranks: Any, sizes: tuple[int, ...]) -> None:
    if isinstance(ranks, (range, RankMap)):
        return
    if isinstance(ranks, np.ndarray) or (
        isinstance(ranks, (list, tuple)) and ranks and isinstance(ranks[0], (list, tuple))
    ):
        try:
            got = np.shape(np.asarray(ranks))
        except ValueError:
            raise ValueError(
                f"ranks must be a flat sequence or nested lists of shape {sizes}, "
                f"got ragged nested lists"
            ) from None
        if got != sizes and len(got) != 1:
            raise ValueError(f"ranks of shape {got} do not match the mesh shape {sizes}")


def _check_tiling(names: tuple[str, ...], axes: tuple[Layout, ...], n: int) -> None:
    """Axes must not overlap and their family must tile exactly ``n`` positions."""
    if (axes, n) in _TILING_OK:
        return
    _check_tiling_uncached(names, axes, n)
    if len(_TILING_OK) >= 4096:
        _TILING_OK.clear()
    _TILING_OK.add((axes, n))


_TILING_OK: set[tuple[tuple[Layout, ...], int]] = set()  # (axes, n) known to tile


def _check_tiling_uncached(names: tuple[str, ...], axes: tuple[Layout, ...], n: int) -> None:
    problem, span = admissibility(make_layout(*axes))
    if problem is not None:
        raise ValueError(f"the axes {dict(zip(names, map(str, axes)))} overlap: {problem}")
    if n % span != 0:
        raise ValueError(
            f"the axes {dict(zip(names, map(str, axes)))} reach position {span - 1}, so the "
            f"rank map needs a multiple of {span} ranks, but it has {n}"
        )
