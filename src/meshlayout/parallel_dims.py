"""ParallelDims: one world, several named factorisations of it (layer 3).

Degrees in, named meshes out. Every view is a :class:`~meshlayout.mesh.Mesh`
over one shared rank map, built only by slicing, flattening, unflattening and
concatenating the dense mesh: no rank arithmetic happens here.

>>> pd = ParallelDims(16, pp=2, dp_shard=2, cp=2, tp=2, ep=4)
>>> pd.degrees
{'pp': 2, 'dp_replicate': 1, 'dp_shard': 2, 'cp': 2, 'tp': 2, 'ep': 4, 'etp': 1, 'efsdp': 2}
>>> pd.dense
Mesh(pp=2, dp_replicate=1, dp_shard=2, cp=2, tp=2)
>>> pd.mesh("fsdp").group(0, "fsdp")
(0, 2, 4, 6)
>>> pd.mesh("ep").group(0, "ep")
(0, 1, 2, 3)
>>> pd.sparse.names
('pp', 'dp_replicate', 'efsdp', 'ep', 'etp')

Positions are always in the canonical dense order ``(pp, dp_replicate,
dp_shard, cp, tp)``; ``order`` and ``ranks`` only decide which global rank sits
at each position (the rank map), never the names or shapes of the views.

>>> ParallelDims(8, dp_shard=2, tp=4, order="tp,cp,dp_shard,dp_replicate,pp").mesh("tp").group(0, "tp")
(0, 2, 4, 6)
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from .inttuple import check_elements, check_int
from .mesh import Mesh
from .rank_map import MAX_WORLD, RankMap
from .torchtitan_names import TorchtitanAccessors

__all__ = ["DENSE_DIMS", "SPARSE_DIMS", "VIEWS", "ParallelDims"]

#: The dense dims, in canonical position order (outermost first).
DENSE_DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: The dims of the MoE (sparse) mesh: ``dp_shard*cp*tp`` re-split as ``(efsdp, ep, etp)``.
SPARSE_DIMS: tuple[str, ...] = ("pp", "dp_replicate", "efsdp", "ep", "etp")

#: What each view is for: the collective or the job that uses its groups.
VIEWS: dict[str, str] = {
    "pp": "pipeline stages: point-to-point send/recv of activations and gradients",
    "dp_replicate": "replicated data parallel: gradient all-reduce across replicas (HSDP outer dim)",
    "dp_shard": "sharded data parallel: the data part of FSDP (see fsdp, which adds cp)",
    "cp": "context parallel: sequence shards exchange K/V (ring send/recv or all-gather)",
    "tp": "tensor parallel: activation all-reduce / all-gather / reduce-scatter inside a layer",
    "batch": "data loading: each batch group reads a different slice of the global batch",
    "loss": "loss all-reduce: every rank that holds a different part of the batch (batch x cp)",
    "fsdp": "parameter sharding: FSDP all-gather / reduce-scatter over dp_shard x cp",
    "hsdp": "hybrid sharding: all-reduce over dp_replicate, FSDP over fsdp (2-D)",
    "efsdp": "expert parameter sharding: FSDP all-gather / reduce-scatter of expert weights",
    "ep": "expert parallel: token dispatch / combine all-to-all between expert owners",
    "etp": "expert tensor parallel: tensor parallel inside each expert",
    "ehsdp": "hybrid sharding of experts: all-reduce over dp_replicate, FSDP over efsdp (2-D)",
}


def _positive_int(name: str, value: object, *, allow_minus_one: bool = False) -> int:
    v = check_int(value, name)
    if v == -1 and allow_minus_one:
        return v
    if v < 1:
        hint = " (or -1 to infer it)" if allow_minus_one else ""
        raise ValueError(f"{name} must be >= 1{hint}, got {v}")
    return v


def _prod(values: Sequence[int]) -> int:
    return functools.reduce(operator.mul, values, 1)


def _product_text(names: Sequence[str], degrees: Mapping[str, int]) -> str:
    """``"a*b*c = 2*3*4 = 24"`` for the named degrees."""
    values = [degrees[n] for n in names]
    return f"{'*'.join(names)} = {'*'.join(map(str, values))} = {_prod(values)}"


class ParallelDims(TorchtitanAccessors):
    """Degrees of N-D parallelism over one world, and every named mesh over it.

    ``ParallelDims(world_size, *, pp=1, dp_replicate=1, dp_shard=-1, cp=1, tp=1,
    ep=1, etp=1, order=None, ranks=None)``.

    - ``dp_shard=-1`` is inferred as ``world_size / (pp*dp_replicate*cp*tp)``.
    - The expert region is the dense ``dp_shard*cp*tp`` region re-split as
      ``(efsdp, ep, etp)``, ``etp`` innermost; any ``ep*etp`` dividing it is valid
      (``etp`` need not be 1 or ``tp``, ``ep`` may span cp and tp).
    - ``order`` places the five dense dims in rank space, **outermost first**
      (a sequence of names or a string such as ``"pp,dp_replicate,dp_shard,cp,tp"``
      or ``"pp-dp_replicate-dp_shard-cp-tp"``); default: tp innermost. Megatron
      order strings list the innermost dim first: reverse them.
    - ``ranks``: the global ranks in rank-space order (default
      ``range(world_size)``); the rank at rank-space index ``i`` is ``ranks[i]``.

    Errors show the arithmetic:

    >>> ParallelDims(64, pp=2, dp_shard=3, cp=2, tp=4)
    Traceback (most recent call last):
    ...
    ValueError: the degrees do not multiply to the world size: pp*dp_replicate*dp_shard*cp*tp = 2*1*3*2*4 = 48 != 64
    >>> ParallelDims(8, tp=2, ep=3)
    Traceback (most recent call last):
    ...
    ValueError: ep=3 does not divide dp_shard*cp*tp/etp = 8 (dp_shard*cp*tp = 4*1*2 = 8, etp=1), so experts cannot be laid out as (efsdp, ep, etp)
    """

    __slots__ = ("__dict__", "_degrees", "_order", "_rank_map", "world_size")

    world_size: int
    _degrees: dict[str, int]
    _order: tuple[str, ...]
    _rank_map: RankMap

    def __init__(
        self,
        world_size: int,
        *,
        pp: int = 1,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        ep: int = 1,
        etp: int = 1,
        order: Sequence[str] | str | None = None,
        ranks: Any = None,
    ) -> None:
        world = _positive_int("world_size", world_size)
        if world > MAX_WORLD:
            raise ValueError(
                f"world_size {world} is more than MAX_WORLD = {MAX_WORLD} (ranks are int64)"
            )
        given = {
            "pp": _positive_int("pp", pp),
            "dp_replicate": _positive_int("dp_replicate", dp_replicate),
            "dp_shard": _positive_int("dp_shard", dp_shard, allow_minus_one=True),
            "cp": _positive_int("cp", cp),
            "tp": _positive_int("tp", tp),
            "ep": _positive_int("ep", ep),
            "etp": _positive_int("etp", etp),
        }
        degrees = _infer_dense(world, given)
        degrees["efsdp"] = _infer_efsdp(degrees)
        parsed_order = _parse_order(order, degrees)
        rank_map = _dense_rank_map(world, degrees, parsed_order, ranks)
        self._set_state(world, degrees, parsed_order, rank_map)

    def _set_state(
        self, world: int, degrees: dict[str, int], order: tuple[str, ...], rank_map: RankMap
    ) -> None:
        object.__setattr__(self, "world_size", world)
        object.__setattr__(self, "_degrees", degrees)
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_rank_map", rank_map)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ParallelDims is immutable; cannot set {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The validated state, not the constructor arguments: `ranks` is already
        # folded into the rank map, which pickles compactly (a range stays a range).
        return (_restore, (self.world_size, dict(self._degrees), self._order, self._rank_map))

    # ------------------------------------------------------------------ configuration
    @property
    def degrees(self) -> dict[str, int]:
        """Every degree by name, inferred values (dp_shard, efsdp) filled in (a copy)."""
        return dict(self._degrees)

    @property
    def order(self) -> tuple[str, ...]:
        """Placement of the dense dims in rank space, outermost first."""
        return self._order

    @property
    def rank_map(self) -> RankMap:
        """The one rank map every view shares: position (canonical order) -> global rank."""
        return self._rank_map

    @property
    def rank_order(self) -> tuple[str, ...]:
        """The dims in rank space, outermost first: :attr:`order` (a name MegatronDims shares)."""
        return self._order

    @property
    def view_purposes(self) -> dict[str, str]:
        """What each view's groups are for, in the order of :meth:`views` (:data:`VIEWS`)."""
        return dict(VIEWS)

    def enabled(self, name: str) -> bool:
        """True if the degree or view ``name`` has more than one rank per group.

        >>> pd = ParallelDims(8, dp_shard=2, tp=4)
        >>> pd.enabled("tp"), pd.enabled("cp"), pd.enabled("fsdp"), pd.enabled("efsdp")
        (True, False, True, True)
        """
        if name in self._degrees:
            return self._degrees[name] > 1
        return self.mesh(name).size() > 1

    def __repr__(self) -> str:
        degs = ", ".join(f"{k}={v}" for k, v in self._degrees.items() if k != "efsdp")
        extra = "" if self._order == DENSE_DIMS else f", order={','.join(self._order)!r}"
        ranks = _rank_space_ranks(self.world_size, self._degrees, self._order, self._rank_map)
        if ranks.as_range() != range(self.world_size):
            extra += f", ranks={_ranks_argument(ranks)}"
        return f"ParallelDims({self.world_size}, {degs}{extra})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParallelDims):
            return NotImplemented
        return (self.world_size, self._degrees, self._order, self._rank_map) == (
            other.world_size,
            other._degrees,
            other._order,
            other._rank_map,
        )

    def __hash__(self) -> int:
        return hash((self.world_size, tuple(self._degrees.items()), self._order, self._rank_map))

    # ------------------------------------------------------------------ meshes
    @functools.cached_property
    def dense(self) -> Mesh:
        """The dense mesh ``(pp, dp_replicate, dp_shard, cp, tp)``."""
        # Passing the RankMap object shares it (and its lazily built inverse).
        return Mesh({n: self._degrees[n] for n in DENSE_DIMS}, ranks=self._rank_map)

    @functools.cached_property
    def sparse(self) -> Mesh:
        """The MoE mesh ``(pp, dp_replicate, efsdp, ep, etp)`` over the same ranks."""
        d = self._degrees
        region = self.dense["dp_shard", "cp", "tp"].flatten("expert_region")
        experts = region.unflatten(0, (d["efsdp"], d["ep"], d["etp"]), ("efsdp", "ep", "etp"))
        return Mesh.concat([self.dense["pp", "dp_replicate"], experts])

    @functools.cached_property
    def dataloading(self) -> Mesh:
        """The data-loading mesh ``(pp, batch, cp, tp)``."""
        return Mesh.concat([self.dense["pp"], self.mesh("batch"), self.dense["cp", "tp"]])

    def mesh(self, name_or_names: str | Sequence[str]) -> Mesh:
        """One view by name, or several non-overlapping views side by side.

        >>> pd = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
        >>> pd.mesh(("dp_replicate", "fsdp")) == pd.mesh("hsdp")
        True
        >>> pd.mesh(("batch", "tp")).names
        ('batch', 'tp')
        """
        if isinstance(name_or_names, str):
            return self._view(name_or_names)
        if not isinstance(name_or_names, Sequence):
            raise TypeError(
                f"mesh() takes a view name or a sequence of view names, got {name_or_names!r}; "
                f"valid views are {list(VIEWS)}"
            )
        names = tuple(name_or_names)
        if not names:
            raise ValueError(f"name at least one view; valid views are {list(VIEWS)}")
        meshes = [self._view(n) for n in names]
        if len(names) == 1:
            return meshes[0]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"views {list(names)} name {repeated} more than once")
        try:
            return Mesh.concat(meshes)
        except ValueError as exc:
            raise ValueError(f"views {list(names)} overlap and cannot be combined: {exc}") from None

    def _view(self, name: str) -> Mesh:
        if not isinstance(name, str):
            raise TypeError(f"a view name is a str, got {name!r}; valid views are {list(VIEWS)}")
        builder = _VIEW_BUILDERS.get(name)
        if builder is None:
            raise KeyError(f"unknown view {name!r}; valid views are {list(VIEWS)}")
        cache: dict[str, Mesh] = self.__dict__.setdefault("_views", {})
        mesh = cache.get(name)
        if mesh is None:
            mesh = cache[name] = builder(self)
        return mesh

    def views(self) -> dict[str, Mesh]:
        """Every named view, in the order of :data:`VIEWS`."""
        return {name: self._view(name) for name in VIEWS}


def _restore(
    world: int, degrees: dict[str, int], order: tuple[str, ...], rank_map: RankMap
) -> ParallelDims:
    """Unpickle: rebuild from validated state without re-running the checks."""
    pd = ParallelDims.__new__(ParallelDims)
    pd._set_state(world, degrees, order, rank_map)
    return pd


# ---------------------------------------------------------------------- views


def _dense_dim(name: str) -> Callable[[ParallelDims], Mesh]:
    return lambda pd: pd.dense[name]


def _sparse_dim(name: str) -> Callable[[ParallelDims], Mesh]:
    return lambda pd: pd.sparse[name]


_VIEW_BUILDERS: Mapping[str, Callable[[ParallelDims], Mesh]] = {
    **{n: _dense_dim(n) for n in DENSE_DIMS},
    "batch": lambda pd: pd.dense["dp_replicate", "dp_shard"].flatten("batch"),
    "loss": lambda pd: pd.dense["dp_replicate", "dp_shard", "cp"].flatten("loss"),
    "fsdp": lambda pd: pd.dense["dp_shard", "cp"].flatten("fsdp"),
    "hsdp": lambda pd: Mesh.concat([pd.dense["dp_replicate"], pd.mesh("fsdp")]),
    "efsdp": _sparse_dim("efsdp"),
    "ep": _sparse_dim("ep"),
    "etp": _sparse_dim("etp"),
    "ehsdp": lambda pd: pd.sparse["dp_replicate", "efsdp"],
}
assert set(_VIEW_BUILDERS) == set(VIEWS)


# ---------------------------------------------------------------------- validation


def _infer_dense(world: int, given: dict[str, int]) -> dict[str, int]:
    others = ("pp", "dp_replicate", "cp", "tp")
    degrees = dict(given)
    if degrees["dp_shard"] == -1:
        rest = _prod([degrees[n] for n in others])
        if world % rest != 0:
            raise ValueError(
                f"dp_shard=-1 cannot be inferred: world_size {world} is not divisible by "
                f"{_product_text(others, degrees)}"
            )
        degrees["dp_shard"] = world // rest
    total = _prod([degrees[n] for n in DENSE_DIMS])
    if total != world:
        raise ValueError(
            "the degrees do not multiply to the world size: "
            f"{_product_text(DENSE_DIMS, degrees)} != {world}"
        )
    return degrees


def _infer_efsdp(degrees: Mapping[str, int]) -> int:
    """``dp_shard*cp*tp / (ep*etp)``, or ValueError showing why it is not an integer."""
    region_dims = ("dp_shard", "cp", "tp")
    region = _prod([degrees[n] for n in region_dims])
    ep, etp = degrees["ep"], degrees["etp"]
    if region % etp != 0:
        raise ValueError(
            f"etp={etp} does not divide {_product_text(region_dims, degrees)}, so experts "
            "cannot be laid out as (efsdp, ep, etp)"
        )
    if (region // etp) % ep != 0:
        raise ValueError(
            f"ep={ep} does not divide dp_shard*cp*tp/etp = {region // etp} "
            f"({_product_text(region_dims, degrees)}, etp={etp}), so experts cannot be laid "
            "out as (efsdp, ep, etp)"
        )
    return region // (ep * etp)


_ORDER_SEPARATORS = re.compile(r"[\s,\-]+")


def _parse_order(
    order: Sequence[str] | str | None, degrees: Mapping[str, int] | None = None
) -> tuple[str, ...]:
    """The dense dims outermost first; dims of size 1 (per ``degrees``) may be left out."""
    if order is None:
        return DENSE_DIMS
    if isinstance(order, str):
        parsed: tuple[object, ...] = tuple(p for p in _ORDER_SEPARATORS.split(order) if p)
    elif isinstance(order, (AbstractSet, Mapping)) or not isinstance(order, Sequence):
        raise TypeError(
            "order must be a sequence of dim names or a string like "
            f"'pp,dp_replicate,dp_shard,cp,tp' (outermost first), got {order!r}"
        )
    else:
        parsed = tuple(order)
    names = [p for p in parsed if isinstance(p, str)]
    if len(names) != len(parsed):
        raise TypeError(f"order must contain dim names (str), got {list(parsed)!r}")
    if sorted(names) == sorted(DENSE_DIMS):
        return tuple(names)
    size_one = [n for n in DENSE_DIMS if n not in names and degrees and degrees[n] == 1]
    if degrees is not None and sorted(names + size_one) == sorted(DENSE_DIMS):
        return _with_size_one_dims(names, size_one)
    problems = []
    unknown = [n for n in names if n not in DENSE_DIMS]
    if unknown:
        problems.append(f"unknown {unknown}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        problems.append(f"repeated {repeated}")
    missing = [n for n in DENSE_DIMS if n not in names]
    if missing:
        big = [f"{n}={degrees[n]}" for n in missing if degrees and degrees[n] != 1]
        only = f" (only dims of size 1 may be left out: {', '.join(big)})" if big else ""
        problems.append(f"missing {missing}{only}")
    hint = ""
    if "dp" in names or "ep" in names:
        hint = (
            "; a Megatron order string lists the innermost dim first and uses 'dp' and "
            "'ep': reverse it, write 'dp' as 'dp_replicate,dp_shard' and drop 'ep' "
            "(experts are carved from dp_shard*cp*tp)"
        )
        if set(names) <= {"tp", "cp", "ep", "dp", "pp"}:
            dense = [n for n in reversed(names) if n != "ep"]
            as_ours = ",".join("dp_replicate,dp_shard" if n == "dp" else n for n in dense)
            hint += f", e.g. {'-'.join(names)!r} is {as_ours!r}"
        hint += "; meshlayout.MegatronDims reproduces Megatron's groups exactly, experts too"
    raise ValueError(
        f"order must be a permutation of {list(DENSE_DIMS)} (outermost first), got "
        f"{list(names)}: {', '.join(problems)}{hint}"
    )


def _with_size_one_dims(names: Sequence[str], size_one: Sequence[str]) -> tuple[str, ...]:
    """``names`` with the left-out size-1 dims put back, where they move no rank.

    Each goes right after its nearest predecessor in :data:`DENSE_DIMS` (first
    if none), so an order that keeps the canonical relative order completes to
    :data:`DENSE_DIMS`: ``pp,dp_replicate,dp_shard,tp`` with ``cp=1`` is the default.
    """
    out = list(names)
    for n in size_one:  # canonical order: every predecessor is already placed
        before = DENSE_DIMS[: DENSE_DIMS.index(n)]
        out.insert(max((out.index(b) + 1 for b in before if b in out), default=0), n)
    return tuple(out)


def _dense_rank_map(
    world: int, degrees: dict[str, int], order: tuple[str, ...], ranks: Any
) -> RankMap:
    """Global rank at each canonical position: ``ranks[index of the position in order]``."""
    base = RankMap(range(world) if ranks is None else ranks)
    if len(base) != world:
        raise ValueError(f"ranks has {len(base)} entries but world_size is {world}")
    index = _rank_space_index(world, degrees, order)
    return base if index is None else RankMap(base.take(index))


def _rank_space_index(
    world: int, degrees: Mapping[str, int], order: tuple[str, ...]
) -> np.ndarray[Any, np.dtype[np.int64]] | None:
    """Rank-space index of each canonical position; None when it is the identity."""
    # Only dims of size > 1 move ranks: skip the permutation when those keep their order.
    if [n for n in order if degrees[n] > 1] == [n for n in DENSE_DIMS if degrees[n] > 1]:
        return None
    check_elements(world, f"a ParallelDims world with order {','.join(order)!r}")
    sizes_in_order = [degrees[n] for n in order]
    to_canonical = [order.index(n) for n in DENSE_DIMS]
    index = np.arange(world, dtype=np.int64).reshape(sizes_in_order).transpose(to_canonical)
    flat: np.ndarray[Any, np.dtype[np.int64]] = index.reshape(-1)
    return flat


def _rank_space_ranks(
    world: int, degrees: Mapping[str, int], order: tuple[str, ...], rank_map: RankMap
) -> RankMap:
    """The ``ranks`` argument that rebuilds ``rank_map``: global ranks in rank-space order."""
    index = _rank_space_index(world, degrees, order)
    if index is None:
        return rank_map
    base = np.empty(world, dtype=np.int64)
    base[index] = rank_map.to_numpy()
    return RankMap(base)


#: Longest explicit ``ranks`` list written out in full by ``repr(ParallelDims)``.
REPR_RANKS_LIMIT = 1024


def _ranks_argument(ranks: RankMap) -> str:
    """``ranks`` as constructor text: a range, or a full list up to :data:`REPR_RANKS_LIMIT`."""
    rng = ranks.as_range()
    if rng is not None:
        return str(rng)
    if len(ranks) <= REPR_RANKS_LIMIT:
        return str(list(ranks))
    return repr(ranks)  # abridged (not evaluable): the full list would be unreadable
