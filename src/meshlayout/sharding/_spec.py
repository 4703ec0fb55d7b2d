"""``ShardingSpec``: a tensor's global shape, a mesh, and one placement per mesh dim."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..inttuple import check_int
from ..mesh import Mesh
from ._arrays import (
    as_array,
    check_reduce_dtype,
    cut,
    put,
    reduce_group,
    submesh_index,
    zeros_like,
)
from ._literal import literal_runs_at, placement_steps
from ._order import Runs, decode, encode
from ._placements import (
    PLACEMENT_TYPES,
    REDUCE_OPS,
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
)

__all__ = ["MeshLike", "ShardingSpec"]

# Per tensor dim, the steps that split it: (mesh dim, mesh dim size, split factor).
_Plan = tuple[tuple[tuple[int, int, int], ...], ...]
# A rank's piece: runs per dim, shape, and offset (None if the piece is not a box).
_Local = tuple[tuple[Runs, ...], tuple[int, ...], tuple[int, ...] | None]
_CACHE_LIMIT = 1 << 16
# Ops whose partial values are (value on coordinate 0, identity elsewhere) in `shard`.
_IDENTITY = {"sum": 0, "bxor": 0, "product": 1}


@runtime_checkable
class MeshLike(Protocol):
    """The part of :class:`meshlayout.Mesh` that sharding uses."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def ndim(self) -> int: ...

    def coordinate(self, rank: int) -> tuple[int, ...] | None: ...

    def submeshes(self) -> Any: ...

    def group_table(self) -> Any: ...

    def __contains__(self, rank: object) -> bool: ...


@dataclass(frozen=True, init=False, repr=False)
class ShardingSpec:
    """How a tensor of ``global_shape`` is laid out over ``mesh`` (``docs/sharding.md``).

    >>> from meshlayout import Mesh
    >>> mesh = Mesh({"dp": 3, "tp": 2})
    >>> spec = ShardingSpec((7, 4), mesh, [StridedShard(0, 2), Shard(0)])  # FSDP2 over TP
    >>> spec.shard_order()  # TP splits the rows first, then DP
    {0: (1, 0)}
    >>> [spec.local_runs(r)[0] for r in range(6)]
    [((0, 2),), ((4, 5),), ((2, 4),), ((5, 6),), (), ((6, 7),)]
    >>> spec.local_shape(4), spec.local_offset(4)  # rank (2, 0) holds no rows
    ((0, 4), (7, 0))
    """

    global_shape: tuple[int, ...]
    mesh: MeshLike
    _placements: tuple[Placement, ...]
    _decodable: bool
    _order: tuple[tuple[int, ...], ...] = field(compare=False)
    _plan: _Plan = field(compare=False)
    _cache: dict[int, _Local] = field(compare=False)

    def __init__(
        self, global_shape: Sequence[int], mesh: MeshLike, placements: Sequence[Placement]
    ) -> None:
        shape = _check_shape(global_shape)
        if not _is_mesh(mesh):
            raise TypeError(f"mesh must be a meshlayout Mesh, got {type(mesh).__name__}")
        sizes = tuple(int(s) for s in mesh.shape)
        given = _check_placements(placements, sizes, shape)
        steps = placement_steps(given, sizes, len(shape))
        decoded = [decode([(m, sf) for m, _, sf in s], sizes) for s in steps]
        if all(o is not None for o in decoded):
            order = tuple(o or () for o in decoded)
            final = _encode_all(order, given, sizes)
            plan: _Plan = tuple(tuple((m, sizes[m], 1) for m in o) for o in order)
            decodable = True
        else:
            order, final, decodable = (), given, False
            plan = steps
        object.__setattr__(self, "global_shape", shape)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "_placements", final)
        object.__setattr__(self, "_decodable", decodable)
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_cache", {})

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_shard_order(
        cls,
        global_shape: Sequence[int],
        mesh: MeshLike,
        order: Mapping[int, Sequence[int | str]],
        partial: Mapping[int | str, str] | Iterable[int | str] | int | str | None = None,
    ) -> ShardingSpec:
        """The spec whose tensor dim ``d`` is split by ``order[d]``, outermost first.

        Mesh dims are indices or names; ``partial`` names the mesh dims holding a
        pending reduction (a mapping to reduce ops, or dims meaning ``"sum"``).
        Size-1 mesh dims split nothing, so their position in an order is not
        observable: :meth:`shard_order` reports the canonical (torch-decoded) one.

        >>> from meshlayout import Mesh
        >>> mesh = Mesh({"dp": 2, "tp": 2})
        >>> ShardingSpec.from_shard_order((8,), mesh, {0: ("tp", "dp")}).placements()
        (StridedShard(dim=0, split_factor=2), Shard(dim=0))
        """
        shape = _check_shape(global_shape)
        if not _is_mesh(mesh):
            raise TypeError(f"mesh must be a meshlayout Mesh, got {type(mesh).__name__}")
        if not isinstance(order, Mapping):
            raise TypeError(f"order must be a mapping tensor dim -> mesh dims, got {order!r}")
        sizes = tuple(int(s) for s in mesh.shape)
        placements: list[Placement] = [Replicate() for _ in sizes]
        owner: dict[int, str] = {}
        for m, op in _parse_partial(partial, mesh).items():
            placements[m] = Partial(op)
            owner[m] = f"Partial({op!r})"
        orders: list[tuple[int, ...]] = [() for _ in shape]
        key_of: dict[int, object] = {}
        for d_raw, dims in order.items():
            d = _tensor_dim(d_raw, shape, f"order key {d_raw!r}")
            if d in key_of:
                raise ValueError(
                    f"order keys {key_of[d]!r} and {d_raw!r} both name tensor dim {d} of "
                    f"global_shape {shape}; give each tensor dim once"
                )
            key_of[d] = d_raw
            if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
                raise TypeError(f"order[{d_raw!r}] must be a sequence of mesh dims, got {dims!r}")
            ms = tuple(_mesh_dim(x, mesh) for x in dims)
            for m in ms:
                if m in owner:
                    raise ValueError(
                        f"mesh dim {m} ({mesh.names[m]!r}) appears in order[{d_raw!r}] "
                        f"and already in {owner[m]}"
                    )
                owner[m] = f"order[{d_raw!r}]"
            orders[d] = ms
        for d, ms in enumerate(orders):
            for m, sf in encode(ms, sizes).items():
                placements[m] = Shard(d) if sf == 1 else StridedShard(d, sf)
        return cls(shape, mesh, placements)

    @classmethod
    def from_torch(
        cls, global_shape: Sequence[int], mesh: MeshLike, torch_placements: Sequence[Any]
    ) -> ShardingSpec:
        """The spec of ``torch.distributed.tensor`` placements (e.g. ``dtensor.placements``)."""
        return cls(global_shape, mesh, [_from_torch_placement(p) for p in torch_placements])

    # ------------------------------------------------------------------ encodings
    @property
    def decodable(self) -> bool:
        """True if the placements describe a shard order (every piece is then a box)."""
        return self._decodable

    def shard_order(self) -> dict[int, tuple[int, ...]]:
        """``{tensor dim: mesh dims splitting it, outermost first}`` (sharded dims only).

        ValueError for a list torch's planner cannot decode (it has no shard order).
        """
        if not self._decodable:
            raise ValueError(
                f"placements {list(self._placements)} on mesh shape {self.mesh.shape} "
                "cannot be decoded into a shard order (literal _StridedShard meaning)"
            )
        return {d: o for d, o in enumerate(self._order) if o}

    def placements(self) -> tuple[Placement, ...]:
        """torch-compatible placements: ``StridedShard`` exactly where the order needs it."""
        return self._placements

    def to_torch(self) -> tuple[Any, ...]:
        """The placements as ``torch.distributed.tensor`` objects (imports torch)."""
        from torch.distributed.tensor import Partial as TPartial
        from torch.distributed.tensor import Replicate as TReplicate
        from torch.distributed.tensor import Shard as TShard
        from torch.distributed.tensor.placement_types import _StridedShard

        out: list[Any] = []
        for p in self._placements:
            if isinstance(p, Shard):
                out.append(TShard(p.dim))
            elif isinstance(p, StridedShard):
                out.append(_StridedShard(p.dim, split_factor=p.split_factor))
            elif isinstance(p, Replicate):
                out.append(TReplicate())
            else:
                out.append(TPartial(p.reduce_op))
        return tuple(out)

    # ------------------------------------------------------------------ local pieces
    def _local(self, rank: int) -> _Local:
        """(runs, shape, offset or None if not a box) of ``rank``, cached per rank."""
        hit = self._cache.get(rank)
        if hit is not None:
            return hit
        coord = self.mesh.coordinate(rank)
        if coord is None:
            n = len(self.global_shape)
            local: _Local = (((),) * n, (0,) * n, self.global_shape)
        elif self._decodable:
            local = self._nested_at(coord)
        else:
            local = self._literal_at(coord)
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[rank] = local
        return local

    def _nested_at(self, coord: Sequence[int]) -> _Local:
        runs: list[Runs] = []
        shape: list[int] = []
        offset: list[int] = []
        for n, steps in zip(self.global_shape, self._plan):
            start, length = 0, n
            for m, k, _ in steps:  # inlined chunk_bounds: this is the hot path
                c = -(-length // k)
                lo = coord[m] * c
                hi = lo + c
                lo = lo if lo < length else length
                hi = hi if hi < length else length
                start += lo
                length = hi - lo
            runs.append(((start, start + length),) if length else ())
            shape.append(length)
            offset.append(start if length or not steps else n)
        return tuple(runs), tuple(shape), tuple(offset)

    def _literal_at(self, coord: Sequence[int]) -> _Local:
        runs = literal_runs_at(self.global_shape, self._plan, coord)
        shape = tuple(sum(b - a for a, b in r) for r in runs)
        offset = None
        if all(len(r) <= 1 for r in runs):
            offset = tuple(
                r[0][0] if r else (n if steps else 0)
                for r, n, steps in zip(runs, self.global_shape, self._plan)
            )
        return tuple(runs), shape, offset

    def local_runs(self, rank: int) -> tuple[Runs, ...]:
        """Per tensor dim, the global ``(start, stop)`` runs ``rank`` holds, in local order.

        O(tensor ndim × mesh ndim) for decodable specs, cached per rank. Ranks not in
        the mesh hold nothing: ``()`` for every dim.
        """
        return self._local(rank)[0]

    def is_box(self, rank: int) -> bool:
        """True if the piece of ``rank`` is one box: at most one run per tensor dim."""
        return self._local(rank)[2] is not None

    def local_shape(self, rank: int) -> tuple[int, ...]:
        """Shape of ``rank``'s local piece (0 along dims where it holds nothing)."""
        return self._local(rank)[1]

    def local_offset(self, rank: int) -> tuple[int, ...]:
        """First global index of ``rank``'s box, torch's convention.

        ``global_shape[d]`` where the rank holds nothing along a sharded dim (and for
        every dim of a rank outside the mesh). ValueError if the piece is not a box.
        """
        runs, _, offset = self._local(rank)
        if offset is None:
            raise ValueError(
                f"rank {rank} holds runs {runs} of global_shape {self.global_shape} under "
                f"{list(self._placements)}: not a box, no (shape, offset) describes it"
            )
        return offset

    # ------------------------------------------------------------------ reference data path
    def shard(self, array: Any, rank: int) -> Any:
        """``rank``'s local piece of a global numpy or torch ``array`` (a copy).

        Along a ``Partial`` mesh dim, ops ``sum``/``bxor``/``product`` put the value on
        coordinate 0 and the identity elsewhere; other ops put the value everywhere.

        >>> from meshlayout import Mesh
        >>> spec = ShardingSpec((8,), Mesh((2,)), [StridedShard(0, 2)])  # undecodable
        >>> spec.shard(np.arange(8), 0)
        array([0, 1, 4, 5])
        """
        array = as_array(array, "shard: array")
        shape = tuple(int(s) for s in array.shape)
        if shape != self.global_shape:
            raise ValueError(
                f"array of shape {shape} does not match global_shape {self.global_shape}"
            )
        check_reduce_dtype(array, [p.reduce_op for p in self._placements if isinstance(p, Partial)])
        piece = cut(array, self.local_runs(rank))
        coord = self.mesh.coordinate(rank)
        if coord is not None:
            for m, p in enumerate(self._placements):
                if isinstance(p, Partial) and p.reduce_op in _IDENTITY and coord[m] != 0:
                    piece[...] = _IDENTITY[p.reduce_op]
        return piece

    def unshard(self, pieces: Mapping[int, Any]) -> Any:
        """The global array from ``{rank: local piece}`` (the inverse of :meth:`shard`).

        Pieces must cover every element; replicas must agree; along ``Partial``
        mesh dims, every member of a reduction group must be present.

        >>> from meshlayout import Mesh
        >>> spec = ShardingSpec((5,), Mesh((2,)), [Shard(0)])
        >>> spec.unshard({r: spec.shard(np.arange(5), r) for r in (0, 1)})
        array([0, 1, 2, 3, 4])
        """
        if not isinstance(pieces, Mapping):
            raise TypeError(f"pieces must be a mapping rank -> array, got {type(pieces).__name__}")
        if not pieces:
            raise ValueError("unshard needs at least one piece")
        partial = [
            (m, p.reduce_op) for m, p in enumerate(self._placements) if isinstance(p, Partial)
        ]
        pdims = {m for m, _ in partial}
        sub_of = submesh_index(self.mesh) if partial else None
        groups: dict[tuple[Any, ...], dict[tuple[int, ...], tuple[int, Any]]] = {}
        for rank, given in pieces.items():
            piece = as_array(given, f"unshard: the piece of rank {rank!r}")
            check_reduce_dtype(piece, [op for _, op in partial])
            coord = self.mesh.coordinate(rank)
            if coord is None:
                raise ValueError(f"rank {rank} is not in the mesh {self.mesh!r}")
            shape = tuple(int(s) for s in piece.shape)
            if shape != self.local_shape(rank):
                raise ValueError(
                    f"piece of rank {rank} has shape {shape}, expected {self.local_shape(rank)}"
                )
            key = (
                sub_of[rank] if sub_of is not None else rank,
                tuple(c for m, c in enumerate(coord) if m not in pdims),
            )
            groups.setdefault(key, {})[tuple(coord)] = (rank, piece)
        need = int(np.prod([self.mesh.shape[m] for m in pdims], dtype=np.int64))
        out: Any = None
        filled = np.zeros(self.global_shape, dtype=bool)
        for members in groups.values():
            if len(members) != need:
                ranks = sorted(r for r, _ in members.values())
                raise ValueError(
                    f"ranks {ranks} are {len(members)} of the {need} members of a Partial "
                    "reduction group; every member is needed"
                )
            rank, value = reduce_group(members, partial)
            if out is None:
                out = zeros_like(value, self.global_shape)
            put(out, filled, self.local_runs(rank), value, rank)
        if not filled.all():
            missing = int(filled.size - filled.sum())
            raise ValueError(
                f"{missing} of {filled.size} elements of global_shape {self.global_shape} "
                f"are held by none of the given ranks {sorted(pieces)}"
            )
        return out

    def __repr__(self) -> str:
        return (
            f"ShardingSpec(global_shape={self.global_shape}, mesh={self.mesh!r}, "
            f"placements={self._placements})"
        )


# ---------------------------------------------------------------------- validation helpers
def _is_mesh(mesh: object) -> bool:
    """``isinstance(mesh, MeshLike)``; a :class:`~meshlayout.Mesh` skips the protocol's
    attribute scan (tens of µs per spec: a model's specs are built by the thousand)."""
    return type(mesh) is Mesh or isinstance(mesh, MeshLike)


def _check_shape(global_shape: Sequence[int]) -> tuple[int, ...]:
    if isinstance(global_shape, (str, bytes)) or not isinstance(global_shape, Iterable):
        raise TypeError(f"global_shape must be a sequence of ints, got {global_shape!r}")
    shape = tuple(check_int(s, "global_shape entry") for s in global_shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"global_shape {shape} has negative sizes")
    return shape


def _tensor_dim(d: object, shape: tuple[int, ...], what: str) -> int:
    dim = check_int(d, what)
    nd = len(shape)
    if not -nd <= dim < nd:
        raise ValueError(
            f"{what}: tensor dim {dim} out of range for global_shape {shape} (ndim {nd})"
        )
    return dim % nd


def _check_placements(
    placements: object, sizes: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[Placement, ...]:
    if not isinstance(placements, Iterable) or isinstance(placements, (str, bytes)):
        raise TypeError(f"placements must be a sequence of placements, got {placements!r}")
    given: tuple[Any, ...] = tuple(placements)
    for p in given:
        if not isinstance(p, PLACEMENT_TYPES):
            hint = (
                "; use ShardingSpec.from_torch for torch placements"
                if type(p).__module__.startswith("torch")
                else ""
            )
            raise TypeError(f"{p!r} ({type(p).__name__}) is not a placement{hint}")
    if len(given) != len(sizes):
        raise ValueError(
            f"{len(given)} placements {list(given)} for a {len(sizes)}-D mesh of shape {sizes}: "
            "one placement per mesh dim is needed"
        )
    out: list[Placement] = []
    for m, p in enumerate(given):
        if isinstance(p, (Shard, StridedShard)):
            what = f"{p!r} on mesh dim {m} (size {sizes[m]})"
            d = _tensor_dim(p.dim, shape, what)
            p = Shard(d) if isinstance(p, Shard) else StridedShard(d, p.split_factor)
        out.append(p)
    return tuple(out)


def _encode_all(
    order: tuple[tuple[int, ...], ...], given: tuple[Placement, ...], sizes: tuple[int, ...]
) -> tuple[Placement, ...]:
    out = list(given)
    for d, ms in enumerate(order):
        for m, sf in encode(ms, sizes).items():
            out[m] = Shard(d) if sf == 1 else StridedShard(d, sf)
    return tuple(out)


def _mesh_dim(x: int | str, mesh: MeshLike) -> int:
    if isinstance(x, str):
        if x not in mesh.names:
            raise KeyError(f"unknown mesh dim {x!r}; valid names are {mesh.names}")
        return mesh.names.index(x)
    m = check_int(x, "mesh dim")
    if not -mesh.ndim <= m < mesh.ndim:
        raise ValueError(f"mesh dim {m} out of range for a {mesh.ndim}-D mesh {mesh.shape}")
    return m % mesh.ndim


def _parse_partial(
    partial: Mapping[int | str, str] | Iterable[int | str] | int | str | None, mesh: MeshLike
) -> dict[int, str]:
    if partial is None:
        return {}
    if isinstance(partial, Mapping):
        items = list(partial.items())
    elif isinstance(partial, (int, str)):
        items = [(partial, "sum")]
    else:
        items = [(x, "sum") for x in partial]
    out: dict[int, str] = {}
    for x, op in items:
        m = _mesh_dim(x, mesh)
        if m in out:
            raise ValueError(f"mesh dim {m} given twice in partial {partial!r}")
        if op not in REDUCE_OPS:
            raise ValueError(f"partial[{x!r}] = {op!r}: reduce_op must be one of {REDUCE_OPS}")
        out[m] = op
    return out


def _from_torch_placement(p: Any) -> Placement:
    if isinstance(p, PLACEMENT_TYPES):
        return p
    if not type(p).__module__.startswith("torch"):
        raise TypeError(f"{p!r} ({type(p).__name__}) is not a torch placement")
    if hasattr(p, "split_factor"):
        return StridedShard(int(p.dim), int(p.split_factor))
    if p.is_shard():
        return Shard(int(p.dim))
    if p.is_partial():
        return Partial(str(p.reduce_op))
    if p.is_replicate():
        return Replicate()
    raise TypeError(f"cannot convert {p!r} ({type(p).__name__}) to a meshlayout placement")
